"""The import graph of fbands, read from the sources with :mod:`ast` (fbands is not imported).

Every ``fbands/**/*.py`` is parsed and every import of an fbands module is collected, at
module level and inside functions alike:

* ``import fbands.x.y`` and ``from fbands.x.y import name`` are edges to ``fbands.x.y``;
* ``from fbands.x import y`` is an edge to ``fbands.x.y`` when that is a module, else to
  ``fbands.x``;
* relative imports are resolved against the importing module (``from .y import f`` in
  ``fbands/x/z.py`` is an edge to ``fbands.x.y``);
* ``importlib.import_module("fbands.x")`` with a literal name counts as an import too;
* imports under ``if TYPE_CHECKING:`` are left out (they never run), and so is the implicit
  import of a package's ``__init__`` that importing one of its submodules makes.

The graph maps each module to the set of fbands modules it imports.  A cycle is a strongly
connected component of more than one module.  Run as a script it prints the cycles (and,
with ``--edges``, every edge) and exits with status 1 when there is one::

    python scripts/import_graph.py [--edges] [--root PATH]

``tests/project/test_architecture.py`` and the docs' picture of the modules
(``docs/_ext/fbands_graph.py``) use the same functions.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "fbands"


def module_name(path: Path, root: Path = ROOT) -> str:
    """The dotted name of the module at ``path`` (``fbands/rl/__init__.py`` is ``fbands.rl``).

    Example
    -------
    >>> module_name(ROOT / "fbands" / "rl" / "tasks.py")
    'fbands.rl.tasks'
    >>> module_name(ROOT / "fbands" / "backends" / "__init__.py")
    'fbands.backends'
    """
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def find_modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """``{module name: source file}`` for every ``.py`` file under ``root/package``.

    When a package and a module of the same name both exist (``x/__init__.py`` and ``x.py``),
    the package wins, as it does for Python's import system.
    """
    modules: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        name = module_name(path, root)
        if name not in modules or path.name == "__init__.py":
            modules[name] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    """Whether an ``if`` test is ``TYPE_CHECKING`` (bare or as ``typing.TYPE_CHECKING``)."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (its ``else`` is kept)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(reversed(node.orelse))
        else:
            stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _in_package(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of ``from <level dots><target> import ...`` written in ``module``."""
    if level == 0:
        return target or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    if level - 1 >= len(parts):
        raise ValueError(f"{module}: relative import beyond the top-level package")
    base = parts[: len(parts) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def imports_of(
    path: Path, module: str, modules: Mapping[str, Path], package: str = PACKAGE
) -> set[str]:
    """The fbands modules that the source file ``path`` (the module ``module``) imports.

    ``modules`` holds the known module names (see :func:`find_modules`): it tells
    ``from fbands.x import y`` with a submodule ``y`` from one with a function ``y``.  A
    module's imports of itself are left out.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in _nodes(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if _in_package(a.name, package))
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            if not _in_package(base, package):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and _in_package(node.args[0].value, package)
        ):
            found.add(node.args[0].value)
    found.discard(module)
    return found


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    """``{module: set of the fbands modules it imports}`` for every module of ``package``.

    Every module is a key, also one that imports nothing of fbands (its set is empty).
    """
    modules = find_modules(root, package)
    return {name: imports_of(path, name, modules, package) for name, path in modules.items()}


def components(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` (Tarjan's algorithm, no recursion).

    Each component is a sorted list; a component is listed after every component it imports
    (the order runs from the modules that import nothing towards the ones that import most).
    Names that appear only as an import (no key of their own) are nodes too.
    """
    nodes = sorted(set(graph) | {d for deps in graph.values() for d in deps})
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    out.append(sorted(component))
    return out


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: its strongly connected components of more than one
    module, each sorted, the list sorted by first member.

    Example
    -------
    >>> cycles({"a": {"b"}, "b": {"a", "c"}, "c": set()})
    [['a', 'b']]
    """
    return sorted(c for c in components(graph) if len(c) > 1)


def depths(graph: Mapping[str, set[str]]) -> dict[str, int]:
    """The depth of each module: 0 when it imports nothing of fbands, else one more than the
    deepest module it imports.  The modules of a cycle share one depth (the cycle counts as
    one node).

    Example
    -------
    >>> depths({"a": set(), "b": {"a"}, "c": {"a", "b"}})
    {'a': 0, 'b': 1, 'c': 2}
    """
    depth: dict[str, int] = {}
    for component in components(graph):  # every import comes before its importers
        members = set(component)
        deps = {d for m in component for d in graph.get(m, ())} - members
        level = 1 + max((depth[d] for d in deps), default=-1)
        depth.update(dict.fromkeys(component, level))
    return {name: depth[name] for name in sorted(depth)}


def edges(graph: Mapping[str, set[str]]) -> list[tuple[str, str]]:
    """Every ``(importer, imported)`` pair of ``graph``, sorted."""
    return sorted((m, d) for m, deps in graph.items() for d in deps)


def main(argv: list[str] | None = None) -> int:
    """Print the cycles (and, with ``--edges``, the edges); 1 when there is a cycle, else 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", action="store_true", help="also print every edge")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="the checkout holding the fbands folder (default: this one)")
    args = parser.parse_args(argv)
    graph = import_graph(args.root)
    if args.edges:
        for importer, imported in edges(graph):
            print(f"{importer} -> {imported}")
    found = cycles(graph)
    n_edges = sum(len(d) for d in graph.values())
    print(f"{len(graph)} modules, {n_edges} imports, {len(found)} import cycle(s)")
    for i, cycle in enumerate(found, 1):
        print(f"cycle {i}: {', '.join(cycle)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
