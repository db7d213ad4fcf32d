"""Checks of the shape of fbands: its import graph, the size of its modules, its sources.

The import graph is read from the sources by ``scripts/import_graph.py`` (fbands is not
imported), the same functions that draw the picture of the modules in the docs
(``docs/_ext/fbands_graph.py``).  The rules:

* no import cycle among the modules of fbands;
* nothing below the dispatch (``fbands.backends``, ``fbands.tables``, ``fbands._jit``)
  imports ``fbands.bands`` or ``fbands._dispatch``: the dispatch calls the kernels, never the
  other way round;
* every ``fbands/**/*.py`` has fewer than 500 lines;
* no source file of fbands reads source code with ``inspect.getsource``, and no string but
  the generated leaves holds Python statements.
"""

from __future__ import annotations

import ast
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import fbands_graph  # noqa: E402
import import_graph  # noqa: E402

MAX_LINES = 500


def _sources() -> dict[str, str]:
    """``{path from the root: text}`` of every ``fbands/**/*.py``."""
    return {
        path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted((ROOT / "fbands").rglob("*.py"))
    }


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph.import_graph(ROOT)


# ----------------------------------------------------------------------------- the rules


def test_no_import_cycle(graph):
    assert import_graph.cycles(graph) == []


#: The packages below the dispatch: they carry out a plan, and never call back.
BELOW_DISPATCH = ("fbands.backends", "fbands.tables", "fbands._jit")


def test_nothing_below_the_dispatch_imports_it(graph):
    back = {m: sorted(deps & {"fbands.bands", "fbands._dispatch"}) for m, deps in graph.items()
            if m.startswith(BELOW_DISPATCH)}
    assert not {m: d for m, d in back.items() if d}


#: The numba room: everything that exists for numba.
NUMBA_ROOM = "fbands._jit"


def test_numba_lives_in_one_room(graph):
    # no module outside the room imports one inside it (the dispatch reaches the numba
    # backend by its name, as every backend), and none imports numba itself
    inside = {m: sorted(d for d in deps if d.startswith(NUMBA_ROOM)) for m, deps in graph.items()
              if not m.startswith(NUMBA_ROOM)}
    assert not {m: d for m, d in inside.items() if d}
    numba_users = [path for path, text in _sources().items()
                   if re.search(r"^\s*(import numba|from numba\b)", text, re.M)
                   and not path.startswith("fbands/_jit/")]
    assert not numba_users


def test_modules_are_short():
    long = {path: len(text.splitlines()) for path, text in _sources().items()
            if len(text.splitlines()) >= MAX_LINES}
    assert not long, f"modules of {MAX_LINES} lines or more: {long}"


def test_no_source_reading():
    assert not [path for path, text in _sources().items() if "inspect.getsource" in text]


#: The only modules that write Python source: the leaves of a divergence (its sympy
#: expressions as functions, and its constants), for numba and for array namespaces.
WRITES_CODE = {"fbands/_jit/codegen.py", "fbands/symbolic.py"}
_CODE_LINE = re.compile(r"^\s*(def|class|for|while|if|elif|else|try|with|return|import)\b")


def test_no_code_in_strings():
    """No string of fbands but the generated leaves holds Python statements: control
    flow lives in modules, where the linter, coverage and the reader see it.  (Docstrings
    are prose and examples, and are skipped.)"""
    found = []
    for path, text in _sources().items():
        if path in WRITES_CODE:
            continue
        tree = ast.parse(text)
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                  ast.AsyncFunctionDef))
                and n.body and isinstance(n.body[0], ast.Expr)
                and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in docs and "\n" in node.value
                    and any(_CODE_LINE.match(line) for line in node.value.splitlines())):
                found.append(f"{path}:{node.lineno}")
    assert not found, found


#: Module-level containers that a module writes to, and are not caches: the divergence
#: registry (what a user registered: kept for the life of the process, on purpose).
PROCESS_DATA = {("fbands/divergences.py", n)
                for n in ("_REGISTRY", "_FAMILIES", "_REGISTRY_MEMBERS", "_ALIASES")}
_MUTATORS = {"append", "add", "update", "setdefault", "pop", "popitem", "clear", "extend",
             "insert", "remove", "discard", "__setitem__"}
_CACHE_DECORATORS = {"cache", "lru_cache", "cached"}


def _module_containers(tree: ast.Module) -> set[str]:
    """Names bound at module level to a dict, list or set (literal, call or comprehension)."""
    names = set()
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, ast.AnnAssign) and node.value else [])
        value = getattr(node, "value", None)
        mutable = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp,
                                     ast.SetComp)) or (
            isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and value.func.id in {"dict", "list", "set", "OrderedDict", "defaultdict"})
        names |= {t.id for t in targets if mutable and isinstance(t, ast.Name)}
    return names


def _written(tree: ast.Module, names: set[str]) -> set[str]:
    """Those of ``names`` that the module writes into (item assignment or deletion, or a
    mutating method) anywhere."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.value, ast.Name):
            name = node.value.id
            if name in names and (
                    isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del))
                    or isinstance(node, ast.Attribute) and node.attr in _MUTATORS):
                out.add(name)
    return out


def test_every_cache_belongs_to_the_process_state():
    """No hidden state: a module keeps what it remembers between calls in a memo of
    :data:`fbands._state.STATE` (which clears them all), never in a container of its own
    or a ``functools`` cache."""
    found = []
    for path, text in _sources().items():
        tree = ast.parse(text)
        found += [f"{path}: {name}" for name in sorted(_written(tree, _module_containers(tree)))
                  if (path, name) not in PROCESS_DATA]
        for node in ast.walk(tree):
            for dec in getattr(node, "decorator_list", ()):
                target = dec.func if isinstance(dec, ast.Call) else dec
                name = getattr(target, "attr", getattr(target, "id", None))
                if name in _CACHE_DECORATORS:
                    found.append(f"{path}:{node.lineno} @{name}")
    assert not found, found


def test_the_state_rule_sees_a_hidden_cache():
    tree = ast.parse("import functools\n_SEEN = {}\nRULES = {'a': 1}\n"
                     "def f(k):\n    _SEEN[k] = 1\n    return RULES['a']\n")
    assert _written(tree, _module_containers(tree)) == {"_SEEN"}


def test_graph_covers_every_module(graph):
    modules = set(import_graph.find_modules(ROOT))
    assert set(graph) == modules
    assert {"fbands", "fbands.bands", "fbands.rl.tasks", "fbands.rl.train"} <= modules
    assert "fbands.rl.tasks" in graph["fbands.rl.config"]


# ----------------------------------------------------------------------------- the tool


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


#: a small package with every kind of import the tool reads, and one cycle (sub.c, sub.d)
TOY = {
    "fbands/__init__.py": "from fbands.a import f\n",
    "fbands/a.py": (
        "from typing import TYPE_CHECKING\n"
        "import numpy as np\n"
        "if TYPE_CHECKING:\n"
        "    from fbands import b\n"
        "def f():\n"
        "    import fbands.sub.c\n"
    ),
    "fbands/b.py": "import typing as _typing\nif _typing.TYPE_CHECKING:\n    import fbands.a\n",
    "fbands/sub/__init__.py": "",
    "fbands/sub/c.py": (
        "import importlib\n"
        "from ..b import g\n"
        "from . import d\n"
        "from fbands.sub import NAME\n"
        "def load():\n"
        "    return importlib.import_module('fbands.b')\n"
    ),
    "fbands/sub/d.py": "from fbands.sub.c import load\nfrom .d import itself\n",
}


def test_tool_reads_every_kind_of_import(tmp_path):
    root = _tree(tmp_path, TOY)
    assert import_graph.import_graph(root) == {
        "fbands": {"fbands.a"},
        "fbands.a": {"fbands.sub.c"},  # inside a function; TYPE_CHECKING left out
        "fbands.b": set(),
        "fbands.sub": set(),
        # relative, a submodule by from-import, a name of the package, import_module
        "fbands.sub.c": {"fbands.b", "fbands.sub.d", "fbands.sub"},
        # the implicit import of fbands.sub, and the import of itself, are no edges
        "fbands.sub.d": {"fbands.sub.c"},
    }
    graph = import_graph.import_graph(root)
    assert import_graph.cycles(graph) == [["fbands.sub.c", "fbands.sub.d"]]
    assert import_graph.depths(graph) == {
        "fbands": 3, "fbands.a": 2, "fbands.b": 0, "fbands.sub": 0,
        "fbands.sub.c": 1, "fbands.sub.d": 1,
    }


def test_cli_exit_status(tmp_path, capsys):
    root = _tree(tmp_path / "cyclic", TOY)
    assert import_graph.main(["--root", str(root), "--edges"]) == 1
    out = capsys.readouterr().out
    assert "fbands.sub.d -> fbands.sub.c" in out
    assert "cycle 1: fbands.sub.c, fbands.sub.d" in out
    acyclic = _tree(tmp_path / "acyclic", {**TOY, "fbands/sub/d.py": "x = 1\n"})
    assert import_graph.main(["--root", str(acyclic)]) == 0
    assert "0 import cycle(s)" in capsys.readouterr().out


# ----------------------------------------------------------------------------- the picture


def _boxes(svg: Path) -> dict[str, float]:
    """``{box name: x}`` read back from the SVG (each box is a group titled by its name)."""
    ns = {"s": "http://www.w3.org/2000/svg"}
    out = {}
    for g in ET.parse(svg).getroot().iterfind("s:g", ns):
        name = g.find("s:title", ns).text.split(":")[0]
        out[name] = float(g.find("s:rect", ns).get("x"))
    return out


def test_picture_draws_every_module_by_depth(tmp_path):
    svg = fbands_graph.write_module_graph(tmp_path, ROOT)
    graph = fbands_graph.picture_graph(import_graph.import_graph(ROOT))
    boxes = _boxes(svg)
    assert set(boxes) == set(graph)
    assert {"fbands.rl", "fbands.integrations", "fbands.bands"} <= set(boxes)
    assert not {"fbands", "fbands.cli", "fbands.__main__", "fbands.rl.train"} & set(boxes)
    depth = import_graph.depths(graph)
    for box, deps in graph.items():
        for dep in deps:  # an imported module is left of its importer (or in its cycle)
            assert boxes[dep] < boxes[box] or depth[dep] == depth[box], (box, dep)
    figure = (tmp_path / "module_graph.md").read_text(encoding="utf-8")
    assert figure.splitlines()[0] == "```{figure} /module_graph.svg"
    assert ("There is no import cycle" in figure) == (not import_graph.cycles(graph))


def test_picture_names_a_cycle(tmp_path):
    root = _tree(tmp_path / "src", TOY)
    fbands_graph.write_module_graph(tmp_path / "out", root)
    figure = (tmp_path / "out" / "module_graph.md").read_text(encoding="utf-8")
    assert "1 import cycle(s)" in figure and "`fbands.sub.c`, `fbands.sub.d`" in figure
    svg = (tmp_path / "out" / "module_graph.svg").read_text(encoding="utf-8")
    assert fbands_graph.CYCLE_COLOUR in svg


# ----------------------------------------------------------------------------- the backends


def test_every_backend_offers_one_run_and_the_dispatch_calls_nothing_else():
    """The backend interface (:mod:`fbands._paths`): each backend module has ``run(plan,
    div, p, delta, request)``, and the dispatch calls a backend module through it and the
    few questions the interface names, never a path's own function."""
    import importlib
    import inspect

    pytest.importorskip("torch")
    pytest.importorskip("cvxpy")
    from fbands._dispatch import BACKENDS

    for name, module in BACKENDS.items():
        run = importlib.import_module(module).run
        assert list(inspect.signature(run).parameters) == ["plan", "div", "p", "delta",
                                                          "request"], name
    tree = ast.parse((ROOT / "fbands" / "_dispatch.py").read_text(encoding="utf-8"))

    def is_backend(node) -> bool:  # backend_module(...)
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "backend_module")

    held = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
            and is_backend(node.value) for t in node.targets if isinstance(t, ast.Name)}
    asked = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
             and (is_backend(node.value)
                  or isinstance(node.value, ast.Name) and node.value.id in held)}
    assert held and asked == {"run", "is_ready", "wants_grad", "with_grad"}


# ----------------------------------------------------------------------------- the tests


#: Test folders that are not a sub-package: the top-level modules of fbands (``core``) and
#: the project around the package (docs, examples, packaging, benchmarks, this file).
TEST_FOLDERS = {"core": "fbands/*.py", "project": "docs, examples, packaging, benchmarks"}


def test_the_tests_mirror_the_package():
    """A module's tests sit in the folder of its sub-package (``tests/losses/`` for
    ``fbands/losses/``; ``tests/jit/`` for ``fbands/_jit/``), those of a top-level module in
    ``tests/core/``; no test file lies loose in ``tests/``."""
    tests = ROOT / "tests"
    assert not list(tests.glob("test_*.py"))
    packages = {p.parent.name.lstrip("_") for p in (ROOT / "fbands").glob("*/__init__.py")}
    folders = {p.parent.name for p in tests.glob("*/test_*.py")}
    assert folders <= packages | set(TEST_FOLDERS), folders - packages - set(TEST_FOLDERS)
    assert all((tests / f / "__init__.py").is_file() for f in folders)
