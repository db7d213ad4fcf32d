"""Checks of the shape of fbands: its import graph, the size of its modules, its sources.

The import graph is read from the sources by ``scripts/import_graph.py`` (fbands is not
imported), the same functions that draw the picture of the modules in the docs
(``docs/_ext/fbands_graph.py``).  The rules:

* no import cycle among the modules of fbands;
* no module of ``fbands.backends`` imports ``fbands.bands`` (the dispatch calls the kernels,
  never the other way round);
* every ``fbands/**/*.py`` has fewer than 500 lines;
* no source file of fbands reads source code with ``inspect.getsource``.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import fbands_graph  # noqa: E402
import import_graph  # noqa: E402

# Known violations of the rules, tolerated while code is being moved.  Issue 25 is to empty
# every one of these lists.  A check fails on a violation that is not listed, and also on a
# listed one that no longer occurs: remove an entry as soon as its violation is gone.

#: import cycles (the modules of each, as a strongly connected component), e.g.
#: ``frozenset({"fbands.bands", "fbands.divergences"})``
KNOWN_CYCLES: set[frozenset[str]] = set()
#: modules of fbands.backends that import fbands.bands
KNOWN_BACKENDS_IMPORTING_BANDS: set[str] = set()
#: source files of 500 lines or more (paths from the repository root)
KNOWN_LONG_MODULES = {
    "fbands/_solver.py",
    "fbands/divergences.py",
}
#: source files that contain ``inspect.getsource``
KNOWN_GETSOURCE: set[str] = set()

MAX_LINES = 500


def _sources() -> dict[str, str]:
    """``{path from the root: text}`` of every ``fbands/**/*.py``."""
    return {
        path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted((ROOT / "fbands").rglob("*.py"))
    }


def _same_as_listed(found: set, known: set, listing: str, what: str) -> None:
    """Fail on a violation missing from ``listing`` or listed but gone."""
    def names(items: set) -> list[str]:
        return sorted(", ".join(sorted(i)) if isinstance(i, frozenset) else i for i in items)

    new, gone = found - known, known - found
    assert not new, f"{what} not in {listing} (fix them; do not list them): {names(new)}"
    assert not gone, (f"{listing} lists {what} that no longer occur; remove them from the "
                      f"list: {names(gone)}")


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph.import_graph(ROOT)


# ----------------------------------------------------------------------------- the rules


def test_no_import_cycle(graph):
    found = {frozenset(c) for c in import_graph.cycles(graph)}
    _same_as_listed(found, KNOWN_CYCLES, "KNOWN_CYCLES", "import cycles")


def test_backends_do_not_import_bands(graph):
    found = {m for m, deps in graph.items()
             if (m == "fbands.backends" or m.startswith("fbands.backends."))
             and "fbands.bands" in deps}
    _same_as_listed(found, KNOWN_BACKENDS_IMPORTING_BANDS, "KNOWN_BACKENDS_IMPORTING_BANDS",
                    "backend modules importing fbands.bands")


def test_modules_are_short():
    found = {path for path, text in _sources().items() if len(text.splitlines()) >= MAX_LINES}
    _same_as_listed(found, KNOWN_LONG_MODULES, "KNOWN_LONG_MODULES",
                    f"modules of {MAX_LINES} lines or more")


def test_no_source_reading():
    found = {path for path, text in _sources().items() if "inspect.getsource" in text}
    _same_as_listed(found, KNOWN_GETSOURCE, "KNOWN_GETSOURCE",
                    "files that contain inspect.getsource")


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
