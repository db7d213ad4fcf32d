"""Sphinx extension that draws the modules of fbands and their imports, at build time.

At ``builder-inited`` it reads the import graph from the sources (``scripts/import_graph.py``,
the same functions that ``tests/project/test_architecture.py`` checks) and writes, under
``docs/_generated/``:

* ``module_graph.svg``: one box per module, in columns by depth in the import graph (the
  modules that import nothing of fbands on the left, the trainer and the plug-ins on the
  right), coloured by package, with an arrow from each module to every module that imports
  it.  ``fbands.rl``, ``fbands.integrations`` and ``fbands._jit`` are drawn as one box each;
  ``fbands/__init__``, ``__main__`` and the command line are left out.
* ``module_graph.md``: the figure with its caption, which names any import cycle (a cycle is
  drawn in red, and the build goes on).

The SVG is written by hand (no graphviz: the docs build offline).  The functions are
importable without Sphinx.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from xml.sax.saxutils import escape

DOCS = Path(__file__).resolve().parent.parent
ROOT = DOCS.parent
GENERATED = DOCS / "_generated"

sys.path.insert(0, str(ROOT / "scripts"))

import import_graph  # noqa: E402

#: Modules left out of the picture: the package's front door and the command line.
EXCLUDED = ("fbands", "fbands.__main__", "fbands.cli", "fbands._cli_core")
#: Packages drawn as one box each (their modules would crowd the page).
COLLAPSED = ("fbands.rl", "fbands.integrations", "fbands._jit")
#: Package of each group (the second part of a module's name); everything else is "core".
GROUPS = {
    "backends": "backends",
    "_jit": "backends",
    "tables": "tables",
    "losses": "losses",
    "rl": "rl",
    "integrations": "integrations",
}
#: (fill, stroke) of the boxes of each group, in the order of the legend.
COLOURS = {
    "core": ("#dbe8f5", "#3f74ad"),
    "backends": ("#fde3cb", "#cc7a29"),
    "tables": ("#fbf1b8", "#a8901c"),
    "losses": ("#d9efd3", "#4c9342"),
    "rl": ("#e7ddf4", "#8159b8"),
    "integrations": ("#f6d6e5", "#b94f7c"),
}
CYCLE_COLOUR = "#d0312d"

# Geometry, in SVG user units (pixels at 100 %).
_FONT = 12  # module name
_SMALL = 10  # package line, column heads, legend
_CHAR = 0.63  # width of a character in em (generous: the boxes must hold their text)
_PAD_X, _BOX_H, _GAP_Y, _GAP_X = 10, 36, 12, 48
_MARGIN, _TOP = 16, 64


def box_of(module: str) -> str:
    """The box that shows ``module``: its collapsed package, or the module itself."""
    for package in COLLAPSED:
        if module == package or module.startswith(package + "."):
            return package
    return module


def group_of(box: str) -> str:
    """The colour group of a box (``"core"`` for the modules directly under ``fbands``)."""
    parts = box.split(".")
    return GROUPS.get(parts[1], "core") if len(parts) > 1 else "core"


def picture_graph(graph: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """The graph as drawn: :data:`EXCLUDED` left out, :data:`COLLAPSED` packages merged,
    imports of names that are no module of the checkout (generated ones) dropped."""
    out: dict[str, set[str]] = {}
    for module, deps in graph.items():
        if module in EXCLUDED:
            continue
        box = box_of(module)
        out.setdefault(box, set()).update(
            box_of(d) for d in deps if d in graph and d not in EXCLUDED and box_of(d) != box
        )
    return out


def _label(box: str, packages: frozenset[str] = frozenset()) -> tuple[str, str]:
    """(package line, name line) written in a box: ``("backends", "numba_backend")``, or
    ``("package", "rl")`` for a package (its ``__init__``, or all of it when collapsed)."""
    name = box.removeprefix("fbands.")
    if box in COLLAPSED or box in packages:
        return "package", name
    package, _, last = name.rpartition(".")
    return package, last


def _width(text: str, size: int) -> float:
    return len(text) * size * _CHAR


def _columns(graph: Mapping[str, set[str]], depth: Mapping[str, int]) -> list[list[str]]:
    """The boxes of each depth, ordered to keep arrows short: by group and name first, then
    a few sweeps that move each box towards the mean row of the boxes it is joined to."""
    columns: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for box in sorted(depth, key=lambda b: (list(COLOURS).index(group_of(b)), b)):
        columns[depth[box]].append(box)
    users: dict[str, set[str]] = {b: set() for b in graph}
    for box, deps in graph.items():
        for d in deps:
            users[d].add(box)
    for sweep in range(6):
        row = {b: (i + 0.5) / len(col) for col in columns for i, b in enumerate(col)}
        order = range(len(columns)) if sweep % 2 == 0 else range(len(columns) - 1, -1, -1)
        for c in order:
            joined = {b: [row[n] for n in (graph[b] | users[b]) if depth[n] != c]
                      for b in columns[c]}
            columns[c].sort(key=lambda b: sum(joined[b]) / len(joined[b]) if joined[b]
                            else row[b])
            row.update({b: (i + 0.5) / len(columns[c]) for i, b in enumerate(columns[c])})
    return columns


def _spread(n: int, top: float) -> list[float]:
    """``n`` points down the middle 70 % of a box side that starts at ``top``."""
    return [top + _BOX_H * (0.15 + 0.7 * (i + 0.5) / n) for i in range(n)]


def render_svg(graph: Mapping[str, set[str]], packages: Iterable[str] = ()) -> str:
    """The SVG of :func:`picture_graph`'s ``graph`` (see the module doc); ``packages`` names
    the boxes that are packages."""
    packages = frozenset(packages)
    depth = import_graph.depths(graph)
    in_cycle = {m for c in import_graph.cycles(graph) for m in c}
    columns = _columns(graph, depth)
    # box geometry: x, y, width (one width per column, the widest label of the column)
    pos: dict[str, tuple[float, float, float]] = {}
    height = max((len(c) for c in columns), default=0) * (_BOX_H + _GAP_Y) - _GAP_Y
    x = _MARGIN
    for col in columns:
        labels = [_label(b, packages) for b in col]
        w = max(max(_width(name, _FONT), _width(pkg, _SMALL)) for pkg, name in labels)
        w += 2 * _PAD_X
        y0 = _TOP + (height - (len(col) * (_BOX_H + _GAP_Y) - _GAP_Y)) / 2
        for i, box in enumerate(col):
            pos[box] = (x, y0 + i * (_BOX_H + _GAP_Y), w)
        x += w + _GAP_X
    groups = [g for g in COLOURS if any(group_of(b) == g for b in graph)]
    note = "arrow: from a module to the modules that import it"
    status = (f"{len(in_cycle)} modules in an import cycle (red)" if in_cycle
              else "no import cycle")
    footer = (f"{len(graph)} boxes, {sum(len(d) for d in graph.values())} imports, {status}; "
              "drawn from the sources by docs/_ext/fbands_graph.py")
    legend_w = sum(35 + _width(g, _SMALL + 1) for g in groups) + 8 + _width(note, _SMALL + 1)
    total_w = _MARGIN + max(x - _GAP_X - _MARGIN, legend_w, _width(footer, _SMALL + 1)) + _MARGIN
    total_h = _TOP + height + _MARGIN + 22

    # arrows: from a module to each module that imports it; their ends are spread down the
    # sides of the boxes in the order of the box at the other end
    arrows = [(dep, box) for box, deps in graph.items() for dep in deps]
    outs: dict[str, list] = {b: [] for b in graph}
    ins: dict[str, list] = {b: [] for b in graph}
    for a in arrows:
        outs[a[0]].append(a)
        ins[a[1]].append(a)
    start, end = {}, {}
    for box in graph:
        bx, by, bw = pos[box]
        for a, y in zip(sorted(outs[box], key=lambda a: pos[a[1]][1]),
                        _spread(len(outs[box]), by), strict=True):
            start[a] = (bx + bw, y)
        for a, y in zip(sorted(ins[box], key=lambda a: pos[a[0]][1]),
                        _spread(len(ins[box]), by), strict=True):
            same = depth[a[0]] == depth[box]  # inside a cycle: enter from the right too
            end[a] = (bx + bw if same else bx, y)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w:.0f}" '
        f'height="{total_h:.0f}" viewBox="0 0 {total_w:.0f} {total_h:.0f}" role="img" '
        'font-family="DejaVu Sans, Verdana, Helvetica, Arial, sans-serif">',
        "<title>The modules of fbands and their imports</title>",
        "<defs>",
        '<marker id="head" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" '
        'markerHeight="7" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#777"/></marker>',
        f'<marker id="head-cycle" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" '
        f'markerHeight="7" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="{CYCLE_COLOUR}"/>'
        "</marker>",
        "</defs>",
        f'<rect width="{total_w:.0f}" height="{total_h:.0f}" fill="#ffffff"/>',
    ]
    # legend, then one head per column
    lx = _MARGIN
    for group in groups:
        fill, stroke = COLOURS[group]
        out.append(f'<rect x="{lx}" y="{_MARGIN}" width="14" height="12" rx="2" '
                   f'fill="{fill}" stroke="{stroke}"/>')
        out.append(f'<text x="{lx + 19}" y="{_MARGIN + 10}" font-size="{_SMALL + 1}" '
                   f'fill="#333">{group}</text>')
        lx += 19 + _width(group, _SMALL + 1) + 16
    out.append(f'<text x="{lx + 8}" y="{_MARGIN + 10}" font-size="{_SMALL + 1}" fill="#555">'
               f"{note}</text>")
    for i, col in enumerate(columns):
        cx, _, cw = pos[col[0]]
        out.append(f'<text x="{cx + cw / 2:.1f}" y="{_TOP - 12}" font-size="{_SMALL}" '
                   f'fill="#777" text-anchor="middle">depth {i}</text>')
    # arrows below the boxes
    for a in sorted(arrows, key=lambda a: (a[0] in in_cycle and a[1] in in_cycle, a)):
        (x1, y1), (x2, y2) = start[a], end[a]
        cyclic = depth[a[0]] == depth[a[1]]
        if cyclic:  # both ends on the right side of one column: bulge to the right
            bulge = min(14 + 0.3 * abs(y2 - y1), 0.9 * _GAP_X)  # within the gap
            path = f"M{x1:.1f},{y1:.1f} C{x1 + bulge:.1f},{y1:.1f} {x2 + bulge:.1f},{y2:.1f} "
        else:
            dx = (x2 - x1) / 2
            path = f"M{x1:.1f},{y1:.1f} C{x1 + dx:.1f},{y1:.1f} {x2 - dx:.1f},{y2:.1f} "
        path += f"{x2:.1f},{y2:.1f}"
        colour, width, head = ((CYCLE_COLOUR, 1.6, "head-cycle") if cyclic
                               else ("#8a8a8a", 0.9, "head"))
        out.append(f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="{width}" '
                   f'stroke-opacity="{0.9 if cyclic else 0.6}" marker-end="url(#{head})">'
                   f"<title>{escape(a[1])} imports {escape(a[0])}</title></path>")
    # boxes on top
    for box, (bx, by, bw) in pos.items():
        fill, stroke = COLOURS[group_of(box)]
        package, name = _label(box, packages)
        cyc = box in in_cycle
        tip = (f"{box}: imports {len(graph[box])}, imported by {len(ins[box])}"
               + (" (in an import cycle)" if cyc else ""))
        out.append(f"<g><title>{escape(tip)}</title>")
        out.append(f'<rect x="{bx:.1f}" y="{by:.1f}" width="{bw:.1f}" height="{_BOX_H}" rx="5" '
                   f'fill="{fill}" stroke="{CYCLE_COLOUR if cyc else stroke}" '
                   f'stroke-width="{2.2 if cyc else 1.2}"/>')
        if package:
            out.append(f'<text x="{bx + _PAD_X:.1f}" y="{by + 13:.1f}" font-size="{_SMALL}" '
                       f'fill="#555">{escape(package)}</text>')
            out.append(f'<text x="{bx + _PAD_X:.1f}" y="{by + 28:.1f}" font-size="{_FONT}" '
                       f'fill="#111">{escape(name)}</text>')
        else:
            out.append(f'<text x="{bx + _PAD_X:.1f}" y="{by + _BOX_H / 2 + 4:.1f}" '
                       f'font-size="{_FONT}" fill="#111">{escape(name)}</text>')
        out.append("</g>")
    out.append(f'<text x="{_MARGIN}" y="{total_h - _MARGIN + 4:.0f}" font-size="{_SMALL + 1}" '
               f'fill="{CYCLE_COLOUR if in_cycle else "#555"}">{escape(footer)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def caption(graph: Mapping[str, set[str]]) -> str:
    """The figure's caption: what is drawn, and the import cycles if there are any."""
    found = import_graph.cycles(graph)
    text = (
        f"The modules of fbands ({len(graph)} boxes) by depth in the import graph, drawn from the "
        "sources when these pages were built: a box's depth is 0 when it imports nothing of "
        "fbands, else one more than the deepest module it imports; an arrow runs from a "
        "module to each module that imports it.  `fbands.rl`, `fbands.integrations` and "
        "`fbands._jit` are one box each; the command line is left out."
    )
    if not found:
        return text + "  There is no import cycle."
    names = "; ".join(", ".join(f"`{m}`" for m in c) for c in found)
    return (text + f"  **This checkout has {len(found)} import cycle(s)**, drawn in red "
            f"(its modules share one column): {names}.")


def write_module_graph(outdir: Path = GENERATED, root: Path = ROOT) -> Path:
    """Write ``module_graph.svg`` and the figure that shows it, ``module_graph.md``; return
    the SVG's path."""
    graph = picture_graph(import_graph.import_graph(root))
    packages = [m for m, path in import_graph.find_modules(root).items()
                if path.name == "__init__.py"]
    outdir.mkdir(parents=True, exist_ok=True)
    svg = outdir / "module_graph.svg"
    _write_if_changed(svg, render_svg(graph, packages))
    rel = svg.relative_to(DOCS).as_posix() if svg.is_relative_to(DOCS) else svg.name
    _write_if_changed(outdir / "module_graph.md", (
        f"```{{figure}} /{rel}\n"
        ":alt: the modules of fbands as boxes in columns by import depth, with an arrow from "
        "each module to the modules that import it\n"
        ":width: 100%\n\n"
        f"{caption(graph)}\n"
        "```\n"
    ))
    return svg


def _write_if_changed(path: Path, text: str) -> None:
    """Write ``text`` unless the file already holds it (keeps Sphinx's incremental build)."""
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


# ----------------------------------------------------------------------------- Sphinx hook

#: The page that includes ``module_graph.md`` (read again on every build: Sphinx does not see
#: an included file change).
PAGE = "theory/implementation"


def generate(app=None) -> None:
    write_module_graph()


def always_outdated(app, env, added, changed, removed) -> list[str]:
    return [PAGE] if PAGE in env.found_docs else []


def setup(app):
    app.connect("builder-inited", generate)
    app.connect("env-get-outdated", always_outdated)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
