"""Sphinx extension that writes the generated parts of the fbands documentation.

At ``builder-inited`` (before any page is read) it writes, under ``docs/_generated/``:

* ``catalogue.md`` and ``catalogue/*.png``: one section per registered divergence, built from
  the registry itself (:func:`fbands.available`, :func:`fbands.get`), with ``f`` printed by
  sympy, its constants, whether the band has a closed form, the ``p -> 1`` limit ``r*`` and a
  plot of the band;
* ``benchmarks.md``: every table under ``benchmarks/results/*.md`` and every figure next to
  them, with the command that produced them;
* ``guides_toc.md`` and ``api_toc.md``: the toctrees of the guides and of the API reference,
  listing only the pages that exist (other parts of the project ship some of them).

The catalogue takes a few seconds (sympy derivations and one band evaluation per curve), so it
is cached: it is rebuilt only when the sources of ``fbands`` or of this file change.

The functions are importable without Sphinx, so that ``tests/project/test_docs.py`` can check them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import re
import shutil
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent
ROOT = DOCS.parent
GENERATED = DOCS / "_generated"

#: Order of the guides in the toctree; guides not listed here follow alphabetically.
GUIDE_ORDER = ("own_loss", "trainer", "verl", "trl", "metrics", "custom_divergence")

#: API pages: (document, module that must be importable for the page to be built).
API_PAGES = (
    ("core", "fbands"),
    ("losses", "fbands.losses"),
    ("rl", "fbands.rl"),
    ("integrations", "fbands.integrations"),
)

#: Packages whose public submodules are documented one by one (see :func:`write_api_modules`).
API_PACKAGES = ("fbands.rl", "fbands.integrations")

#: Members of parametrised families shown in the catalogue.
FAMILY_MEMBERS = {"alpha": ({"a": -1}, {"a": 0.5}, {"a": 2}, {"a": 3})}

#: Divergences of the front page's figure (allowed gain against p), of the saturation map and
#: of the r* plot.
GAIN_DIVS = ("kl", "tv", "chi2", "hellinger", "reverse_kl")
SATURATION_DIVS = ("tv", "chi2", "hellinger", "reverse_kl")
RSTAR_DIVS = ("kl", "reverse_kl", "tv", "chi2", "neyman_chi2", "hellinger", "js")

#: Radii drawn in the band plots and used for the r* column.
PLOT_DELTAS = (0.01, 0.05, 0.2)
RSTAR_DELTAS = (0.05, 0.2)


# ----------------------------------------------------------------------------- helpers


def module_exists(name: str) -> bool:
    """True when ``name`` can be found (its parent packages are imported to find out)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def third_party_imports(package: Path = ROOT / "fbands") -> list[str]:
    """The top-level names of the modules that ``package``'s modules import at module level
    and that are neither the standard library's nor fbands': what ``autodoc`` must mock when
    an extra is not installed (``omegaconf`` comes with verl, say)."""
    import ast
    import sys

    found = set()
    for path in sorted(package.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return sorted(found - set(sys.stdlib_module_names) - {"fbands", "__future__"})


def _write_if_changed(path: Path, text: str) -> None:
    """Write ``text`` unless the file already holds it (keeps Sphinx's incremental build)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def _fmt(x: float) -> str:
    if math.isinf(x):
        return r"$+\infty$" if x > 0 else r"$-\infty$"
    if math.isnan(x):
        return "—"
    return f"{x:.6g}"


def sources_digest() -> str:
    """Hash of everything the catalogue depends on: the fbands sources and this file."""
    h = hashlib.sha256()
    for path in sorted((ROOT / "fbands").rglob("*.py")) + [Path(__file__).resolve()]:
        h.update(str(path.relative_to(ROOT)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


# ----------------------------------------------------------------------------- catalogue


def catalogue_entries() -> list[tuple[str, object, list]]:
    """``(name, divergence or None, members)`` for every registered name.

    A plain divergence gives ``(name, div, [])``; a family (a name that needs parameters) gives
    ``(name, None, [member, ...])`` with the members of :data:`FAMILY_MEMBERS`.
    """
    import fbands

    entries = []
    for name in fbands.available():
        try:
            entries.append((name, fbands.get(name), []))
        except ValueError:  # a family: fbands.get needs its parameters
            members = [fbands.get(name, **kw) for kw in FAMILY_MEMBERS.get(name, ())]
            entries.append((name, None, members))
    return entries


def family_template(name: str):
    """The generator of a family as a sympy expression, or None if it cannot be found."""
    try:
        from fbands import divergences
    except ImportError:
        return None
    families = getattr(divergences, "_FAMILIES", {})
    entry = families.get(name)
    return entry[0] if entry else None


def rstar_value(div, delta: float) -> float:
    """``r* = lim_{p -> 1} lower(p, delta)``: the registry's value, else the band at p = 1."""
    try:
        return float(div.lower_limit_at_one(delta))
    except (AttributeError, ValueError, RuntimeError):
        import fbands

        return float(fbands.bounds(1.0, delta, div.name)[0])


def symbolic_rstar(div):
    """``r*`` as a sympy expression in ``delta``, or None when it is not cheap to get.

    Solves ``f(r) + (1 - r) f'(inf) = delta`` for ``r`` in the two shapes that sympy solves
    instantly: an equation linear in ``log r``, or a polynomial of degree <= 4 in
    ``sqrt(r)`` after clearing denominators.  The candidate root is accepted only if it agrees
    with the numerical limit (:func:`rstar_value`) at two radii.
    """
    import sympy as sp

    if math.isinf(div.fprime_inf):
        return sp.Integer(1)
    r = sp.Symbol("r", positive=True)
    w = sp.Symbol("w", positive=True)
    delta = sp.Symbol("delta", positive=True)
    u = next(s for s in div.f.free_symbols if s.name == "u")
    f = div.f.subs(u, r)
    # On 0 < r < 1 each |x| has the sign that x has at r = 1/2 (|r - 1| is 1 - r).
    f = f.replace(lambda e: isinstance(e, sp.Abs), _abs_on_unit_interval(r))
    h = f + (1 - r) * sp.nsimplify(div.fprime_inf) - delta
    candidates = []
    slope = sp.simplify(sp.diff(h, r) * r)
    if not slope.has(r) and slope != 0:  # h = A log r + B
        b = sp.simplify(h - slope * sp.log(r))
        if not b.has(r):
            candidates = [sp.exp(-b / slope)]
    if not candidates and not h.has(sp.log, sp.exp, sp.Abs):
        num = sp.numer(sp.together(h.subs(r, w**2)))
        try:
            poly = sp.Poly(sp.expand(num), w)
        except sp.PolynomialError:
            poly = None
        if poly is not None and poly.degree() <= 4:
            candidates = [s**2 for s in sp.solve(poly.as_expr(), w)]
    for cand in candidates:
        ok = True
        for d in RSTAR_DELTAS:
            value = complex(cand.subs(delta, d).evalf())
            if abs(value.imag) > 1e-12 or abs(value.real - rstar_value(div, d)) > 1e-9:
                ok = False
                break
        if ok:
            return sp.simplify(cand)
    return None


def _abs_on_unit_interval(r):
    import sympy as sp

    def replace(e):
        value = e.args[0].subs(r, sp.Rational(1, 2))
        if value.is_number and value.is_negative:
            return -e.args[0]
        if value.is_number and value.is_nonnegative:
            return e.args[0]
        return e

    return replace


def closed_form_text(div) -> str:
    """How the edges are computed, in words."""
    d = div.derivation
    parts = []
    for edge, cf, var in (("upper", d.upper, "r - 1"), ("lower", d.lower, "r")):
        if cf is None:
            parts.append(f"{edge}: root finding")
        else:
            degree = "linear" if cf.coeffs[0] == 0 else "quadratic"
            extra = ", squared: roots checked against g" if cf.squared else ""
            parts.append(f"{edge}: {degree} in ${var}${extra}")
    return "; ".join(parts)


#: Probabilities of the runnable example in each catalogue section.
EXAMPLE_P = (0.9, 0.1, 0.001)


def reference_edges(div, p: float, delta: float, digits: int = 30) -> tuple[float, float]:
    """Band edges by bisection in ``digits``-digit mpmath arithmetic, without fbands' solver.

    Only ``f`` itself is taken from the divergence (turned into an mpmath function by sympy);
    ``g(p, r) = p f(r) + (1 - p) f((1 - r p) / (1 - p))`` is bisected on ``[1, 1/p]`` for the
    upper edge and in ``log r`` below 0 for the lower edge, after the saturation tests.
    """
    import mpmath as mp
    import sympy as sp

    u = next(s for s in div.f.free_symbols if s.name == "u")
    f_mp = sp.lambdify(u, div.f, "mpmath")
    with mp.workdps(digits):
        p_, d_ = mp.mpf(p), mp.mpf(delta)
        f0 = mp.inf if math.isinf(div.f0) else mp.mpf(div.f0)

        def f(x):
            return f0 if x == 0 else mp.re(f_mp(x))

        def g(r):
            return p_ * f(r) + (1 - p_) * f((1 - r * p_) / (1 - p_))

        top = 1 / p_
        if g(top) <= d_:
            upper = top
        else:
            lo, hi = mp.mpf(1), top
            for _ in range(4 * digits):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if g(mid) <= d_ else (lo, mid)
            upper = (lo + hi) / 2
        if g(mp.mpf(0)) <= d_:
            lower = mp.mpf(0)
        else:
            lo, hi = mp.mpf(-1), mp.mpf(0)
            while g(mp.exp(lo)) <= d_:
                lo *= 2
            for _ in range(4 * digits + 20):
                mid = (lo + hi) / 2
                lo, hi = (lo, mid) if g(mp.exp(mid)) <= d_ else (mid, hi)
            lower = mp.exp((lo + hi) / 2)
        return float(lower), float(upper)


def example_lines(div, delta: float = 0.05) -> list[str]:
    """A doctest for a catalogue section, its expected output from :func:`reference_edges`."""
    edges = [reference_edges(div, p, delta) for p in EXAMPLE_P]
    lows = " ".join(f"{lo:.6g}" for lo, _ in edges)
    highs = " ".join(f"{hi:.6g}" for _, hi in edges)
    return [
        "```{doctest}",
        f">>> lo, hi = fbands.bounds(np.array({list(EXAMPLE_P)}), {delta}, {div.name!r})",
        '>>> print(" ".join(f"{x:.6g}" for x in lo))',
        lows,
        '>>> print(" ".join(f"{x:.6g}" for x in hi))',
        highs,
        "```",
    ]


def band_plot(div, path: Path) -> None:
    """Plot the band of ``div`` against ``p`` for the radii :data:`PLOT_DELTAS`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    import fbands

    p = np.logspace(-4, 0, 161)[:-1]
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    ax.fill_between(p, 1 - 0.2, 1 + 0.2, color="0.88", label="PPO clip, eps = 0.2")
    ax.plot(p, 1 / p, color="0.5", lw=1, ls="--", label="1/p (feasible limit)")
    colors = ("tab:blue", "tab:orange", "tab:green")
    for delta, color in zip(PLOT_DELTAS, colors, strict=True):
        lo, hi = fbands.bounds(p, delta, div.name)
        ax.plot(p, hi, color=color, lw=1.8, label=f"delta = {delta:g}")
        pos = lo > 0
        ax.plot(p[pos], lo[pos], color=color, lw=1.8, ls="-.")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(1e-3, 1e3)
    ax.set_xlim(p[0], 1)
    ax.set_xlabel("old probability p")
    ax.set_ylabel("ratio edge  (upper solid, lower dash-dot)")
    ax.set_title(f"band of {div.name}")
    ax.grid(True, which="major", lw=0.4, alpha=0.6)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()


def _label(name: str) -> str:
    return "catalogue-" + _slug(name)


def _table_tex(expr) -> str:
    """LaTeX of ``expr`` for a table cell: a literal ``|`` would end the cell."""
    import sympy as sp

    return sp.latex(expr).replace("|", r"\vert ")


def _divergence_section(div, heading: str, figdir: Path) -> list[str]:
    import sympy as sp

    rstar = symbolic_rstar(div)
    rstar_tex = sp.latex(rstar) if rstar is not None else None
    numeric = ", ".join(
        f"{_fmt(rstar_value(div, d))} at $\\delta = {d:g}$" for d in RSTAR_DELTAS
    )
    slug = _slug(div.name)
    band_plot(div, figdir / f"{slug}.png")
    lines = [
        f"{heading} `{div.name}`",
        "",
        div.description + "." if div.description else "",
        "",
        "$$",
        f"f(u) = {sp.latex(div.f)}",
        "$$",
        "",
        f"* $f(0) = $ {_fmt(div.f0)}, $f'(\\infty) = $ {_fmt(div.fprime_inf)}, "
        f"$f''(1) = $ {_fmt(div.curvature)}"
        + (" (a kink at 1)" if math.isinf(div.curvature) else ""),
        f"* edges: {closed_form_text(div)}",
        "* saturation: "
        + (
            "never ($f(0) = \\infty$)"
            if math.isinf(div.f0)
            else "possible, tested by evaluating $g$ at $r = 0$ and $r = 1/p$"
        ),
        "* $r^\\ast = \\lim_{p\\to 1} r_{\\text{lo}}$: "
        + (f"${rstar_tex}$; " if rstar_tex is not None else "")
        + numeric,
        "",
        f"![band of {div.name}](/_generated/catalogue/{slug}.png)",
        "",
        f"The band at $\\delta = 0.05$ for $p$ = {', '.join(map(str, EXAMPLE_P))}; the expected "
        "output was computed independently of the solver, by 30-digit bisection of "
        "$g_f(p, r) = \\delta$ (the build runs this example as a doctest):",
        "",
        *example_lines(div),
        "",
    ]
    return lines


def write_catalogue(outdir: Path = GENERATED) -> Path:
    """Write ``catalogue.md`` (and its figures) into ``outdir``; return the page's path."""
    import sympy as sp

    figdir = outdir / "catalogue"
    if figdir.exists():
        shutil.rmtree(figdir)
    figdir.mkdir(parents=True)
    entries = catalogue_entries()

    table = [
        "| name | $f(u)$ | closed form | $f(0)$ | $f'(\\infty)$ | "
        f"$r^\\ast$ at $\\delta = {RSTAR_DELTAS[0]:g}$ |",
        "|---|---|---|---|---|---|",
    ]
    sections: list[str] = []
    for name, div, members in entries:
        rows = [div] if div is not None else members
        for d in rows:
            table.append(
                f"| {{ref}}`{d.name} <{_label(d.name)}>` | ${_table_tex(d.f)}$ | "
                f"{'yes' if d.has_closed_form else 'no'} | {_fmt(d.f0)} | "
                f"{_fmt(d.fprime_inf)} | {_fmt(rstar_value(d, RSTAR_DELTAS[0]))} |"
            )
        if div is not None:
            sections += [f"({_label(div.name)})=", *_divergence_section(div, "##", figdir)]
        else:
            template = family_template(name)
            sections += [f"## Family `{name}`", ""]
            if template is not None:
                sections += ["$$", f"f(u) = {sp.latex(template)}", "$$", ""]
            sections += [
                f"A family: `fbands.get(\"{name}\", ...)` takes its parameters. "
                "The members below are drawn as examples.",
                "",
            ]
            for m in members:
                sections += [f"({_label(m.name)})=", *_divergence_section(m, "###", figdir)]

    overview: list[str] = []
    plain = [name for name, div, _ in entries if div is not None]
    if module_exists("fbands.plotting") and plain:
        from fbands.plotting import plot_bands

        plot_bands(plain, RSTAR_DELTAS[0], figdir / "all.png")
        overview = [
            f"All the divergences above at $\\delta = {RSTAR_DELTAS[0]:g}$, next to the fixed "
            "intervals of PPO and Clip-Higher (drawn by {func}`fbands.plotting.plot_bands`, "
            "the same as `fbands plot`):",
            "",
            "![all divergences](/_generated/catalogue/all.png)",
            "",
        ]
    text = "\n".join(
        [
            "<!-- generated by docs/_ext/fbands_docs.py from the fbands registry; do not edit -->",
            "",
            "## Summary",
            "",
            *table,
            "",
            *overview,
            *sections,
        ]
    )
    page = outdir / "catalogue.md"
    _write_if_changed(page, text + "\n")
    return page


# ----------------------------------------------------------------------------- theory figures


def _dcpo_edges(p, eps_low: float = 0.16, eps_high: float = 0.2, cap: float = 10.0):
    """DCPO's clip bounds, as written in docs/theory/related.md."""
    import numpy as np

    lower = 0.5 + 0.5 * np.sqrt(np.maximum(0.0, 1.0 - 4.0 * eps_low / p))
    upper = np.minimum(0.5 + 0.5 * np.sqrt(1.0 + 4.0 * eps_high / p), cap)
    return lower, upper


def write_theory_figures(outdir: Path = GENERATED) -> list[Path]:
    """Figures of the theory pages: the band as a sub-level set of g, and the related methods."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    import fbands

    figdir = outdir / "theory"
    figdir.mkdir(parents=True, exist_ok=True)
    paths = []

    # g_f(p, r) for kl at several p: the band is where the curve is below delta.
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    delta = 0.05
    for p, color in ((0.5, "tab:blue"), (0.1, "tab:orange"), (0.02, "tab:green")):
        r = np.linspace(1e-3, min(1 / p, 6.0), 600)[:-1]
        c = (1 - r * p) / (1 - p)
        g = -p * np.log(r) - (1 - p) * np.log(c)
        ax.plot(r, g, color=color, lw=1.8, label=f"p = {p:g}")
        lo, hi = fbands.bounds(p, delta, "kl")
        ax.plot([lo, hi], [delta, delta], "o", color=color, ms=5)
    ax.axhline(delta, color="0.3", lw=1, ls="--", label=f"delta = {delta:g}")
    ax.set_ylim(0, 0.3)
    ax.set_xlim(0, 6)
    ax.set_xlabel("ratio r")
    ax.set_ylabel("g(p, r) for kl")
    ax.set_title("the band is the sub-level set {g <= delta}; dots: its edges")
    ax.legend(fontsize=8)
    ax.grid(True, lw=0.4, alpha=0.6)
    fig.tight_layout()
    paths.append(figdir / "g_function.png")
    fig.savefig(paths[-1])
    plt.close(fig)

    # The intervals of the related methods against p.
    p = np.logspace(-4, 0, 161)[:-1]
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=100)
    lo, hi = fbands.bounds(p, delta, "kl")
    dlo, dhi = _dcpo_edges(p)
    curves = [  # (label, lower, upper, colour, style, width)
        ("BandPO band-kl 0.05", lo, hi, "tab:blue", "-", 3.5),
        ("PPO clip [0.8, 1.2]", np.full_like(p, 0.8), np.full_like(p, 1.2), "0.3", ":", 1.6),
        ("Clip-Higher [0.8, 1.28]", np.full_like(p, 0.8), np.full_like(p, 1.28), "tab:purple",
         ":", 1.6),
        ("DCPO (0.16, 0.2, cap 10)", dlo, dhi, "tab:red", "--", 1.6),
        ("TRGPPO (kl 0.05 united with PPO)", np.minimum(lo, 0.8), np.maximum(hi, 1.2),
         "tab:orange", "-.", 1.4),
    ]
    for label, low, high, color, style, width in curves:
        alpha = 0.45 if width > 2 else 1.0
        ax.plot(p, high, color=color, ls=style, lw=width, alpha=alpha, label=label)
        pos = low > 0
        ax.plot(p[pos], low[pos], color=color, ls=style, lw=width, alpha=alpha)
    ax.plot(p, 1 / p, color="0.6", lw=1, ls="--", label="1/p (feasible limit)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(1e-2, 1e2)
    ax.set_xlim(p[0], 1)
    ax.set_xlabel("old probability p")
    ax.set_ylabel("ratio interval [lower, upper]")
    ax.legend(fontsize=7, loc="lower left")
    ax.grid(True, lw=0.4, alpha=0.6)
    fig.tight_layout()
    paths.append(figdir / "related_methods.png")
    fig.savefig(paths[-1])
    plt.close(fig)

    # The figures drawn by fbands.plotting (the front page's, and those of band.md/limits.md).
    from fbands import plotting

    paths.append(plotting.plot_gain(GAIN_DIVS, 0.05, figdir / "gain.png"))
    paths.append(plotting.plot_two_point(figdir / "two_point.png"))
    paths.append(plotting.plot_saturation_map(SATURATION_DIVS, figdir / "saturation.png"))
    paths.append(plotting.plot_rstar(RSTAR_DIVS, figdir / "rstar.png"))
    paths.append(plotting.plot_soft_clip(figdir / "soft_clip.png", lower=0.8, upper=1.5))
    return paths


# ----------------------------------------------------------------------------- benchmarks

_HEADING = re.compile(r"^(#{1,5})(\s)", re.MULTILINE)
_IMAGE = re.compile(r"(!\[[^\]]*\]\()([^)\s]+)(\))")
_FIGURE_SUFFIXES = (".png", ".svg", ".jpg", ".jpeg")


def write_benchmarks(results: Path | None = None, outdir: Path = GENERATED) -> Path:
    """Write ``benchmarks.md`` from ``benchmarks/results``; return the page's path.

    Each ``*.md`` file becomes a section (its title a level-2 heading, its other headings one
    level down, its relative image links pointed at the copies made here); figures that no
    table links to are shown after the tables.
    """
    results = results if results is not None else ROOT / "benchmarks" / "results"
    figdir = outdir / "benchmarks"
    if figdir.exists():
        shutil.rmtree(figdir)
    tables = sorted(results.glob("*.md")) if results.is_dir() else []
    figures = (
        sorted(p for p in results.iterdir() if p.suffix.lower() in _FIGURE_SUFFIXES)
        if results.is_dir()
        else []
    )
    lines = [
        "<!-- generated by docs/_ext/fbands_docs.py from benchmarks/results; do not edit -->",
        "",
    ]
    if not tables and not figures:
        lines += [
            "No results are in `benchmarks/results/` in this checkout. `make bench` runs the "
            "benchmarks and writes them there; the next documentation build shows them.",
        ]
    for fig in figures:
        figdir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(fig, figdir / fig.name)
    linked: set[str] = set()

    def relink(match: re.Match) -> str:
        target = match.group(2)
        if "://" in target or target.startswith("/"):
            return match.group(0)
        name = Path(target).name
        if (figdir / name).exists():
            linked.add(name)
            return f"{match.group(1)}/_generated/benchmarks/{name}{match.group(3)}"
        return match.group(0)

    for table in tables:
        body = table.read_text(encoding="utf-8")
        first = re.search(r"^#\s+(.+)$", body, re.MULTILINE)
        title = first.group(1).strip() if first else table.stem.replace("_", " ")
        if first:
            body = body[: first.start()] + body[first.end() :]
        body = _HEADING.sub(lambda m: "#" + m.group(1) + m.group(2), body)
        body = _IMAGE.sub(relink, body)
        source = f"*From `benchmarks/results/{table.name}`.*"
        lines += [f"## {title}", "", source, "", body.strip(), ""]
    unlinked = [f for f in figures if f.name not in linked]
    if unlinked:
        lines += ["## Figures", ""]
        for fig in unlinked:
            lines += [f"![{fig.stem}](/_generated/benchmarks/{fig.name})", ""]
    page = outdir / "benchmarks.md"
    _write_if_changed(page, "\n".join(lines) + "\n")
    return page


# ----------------------------------------------------------------------------- toctrees


def existing_guides() -> list[str]:
    """Guide documents present in ``docs/guides``, in :data:`GUIDE_ORDER` first."""
    found = {p.stem for p in (DOCS / "guides").glob("*.md")} | {
        p.stem for p in (DOCS / "guides").glob("*.rst")
    }
    found.discard("index")
    ordered = [g for g in GUIDE_ORDER if g in found]
    return ordered + sorted(found - set(ordered))


def api_pages() -> list[tuple[str, bool]]:
    """``(document, built)`` for every API page: built when its module can be imported."""
    return [(doc, module_exists(module)) for doc, module in API_PAGES]


def public_submodules(package: str) -> list[str]:
    """Public submodules of ``package`` (files and sub-packages not starting with ``_``)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return []
    names = set()
    for location in spec.submodule_search_locations:
        for path in Path(location).iterdir():
            if path.name.startswith("_"):
                continue
            if path.suffix == ".py" or (path.is_dir() and (path / "__init__.py").exists()):
                names.add(path.stem)
    return [f"{package}.{n}" for n in sorted(names)]


def write_toctrees(outdir: Path = GENERATED) -> None:
    """Write the toctrees of the guides and of the API pages that exist."""
    guides = existing_guides()
    _write_if_changed(
        outdir / "guides_toc.md",
        "```{toctree}\n:maxdepth: 1\n\n" + "\n".join(guides) + "\n```\n",
    )
    built = [doc for doc, ok in api_pages() if ok]
    _write_if_changed(
        outdir / "api_toc.md",
        "```{toctree}\n:maxdepth: 2\n\n" + "\n".join(built) + "\n```\n",
    )


def write_api_modules(outdir: Path = GENERATED) -> None:
    """For each package of :data:`API_PACKAGES`, an rst fragment documenting its submodules.

    The package itself is shown by its docstring only, so that names it re-exports are not
    documented twice.
    """
    for package in API_PACKAGES:
        lines = []
        if module_exists(package):
            lines += [f".. automodule:: {package}", ""]
            for sub in public_submodules(package):
                lines += [
                    sub,
                    "-" * len(sub),
                    "",
                    f".. automodule:: {sub}",
                    "   :members:",
                    "",
                ]
        name = package.split(".")[-1]
        _write_if_changed(outdir / f"api_{name}.rst", "\n".join(lines) + "\n")


#: Where the figure of ``fbands demo`` is looked for (the first that exists is shown).
DEMO_FIGURES = ("docs/_static/demo.png", "benchmarks/results/demo.png")


def write_demo_figure(outdir: Path = GENERATED) -> None:
    """The demo's figure for the trainer guide, or how to make it when none is committed."""
    for rel in DEMO_FIGURES:
        if (ROOT / rel).is_file():
            target = outdir / "demo" / Path(rel).name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, target)
            text = (
                f"![clip versus band-kl on the tail task](/_generated/demo/{target.name})\n\n"
                f"*The figure committed as `{rel}`, made by `fbands demo`.*\n"
            )
            break
    else:
        text = (
            "No figure of the demo is committed in this checkout. `fbands demo` writes it to "
            "`runs/demo/compare.png`; copied to "
            f"`{DEMO_FIGURES[0]}` and committed, it appears here.\n"
        )
    _write_if_changed(outdir / "demo_figure.md", text)


def excluded_documents() -> list[str]:
    """Source files to exclude because the module they document does not exist."""
    return [f"api/{doc}.rst" for doc, ok in api_pages() if not ok]


# ----------------------------------------------------------------------------- Sphinx hook


def generate(app=None) -> None:
    """Write every generated file (the catalogue only when its inputs changed)."""
    GENERATED.mkdir(exist_ok=True)
    write_toctrees()
    write_api_modules()
    write_benchmarks()
    write_demo_figure()
    stamp = GENERATED / "catalogue.stamp"
    digest = sources_digest()
    page = GENERATED / "catalogue.md"
    if not (page.exists() and stamp.exists() and stamp.read_text() == digest):
        write_catalogue()
        write_theory_figures()
        stamp.write_text(digest)


def module_namespace_for_doctests(app, what, name, obj, options, lines) -> None:
    """Run a module's docstring examples in that module's namespace.

    ``pytest --doctest-modules`` gives each docstring example the globals of its module, so
    examples may use the module's names without importing them.  Sphinx's doctest builder
    does not; this prepends a hidden ``testsetup`` to each fbands module docstring that loads
    the module's public and private names (not its dunders) into the examples' namespace.
    """
    if what != "module" or not (name == "fbands" or name.startswith("fbands.")):
        return
    lines[:0] = [
        ".. testsetup::",
        "",
        "   import importlib as _importlib",
        f"   _module = _importlib.import_module({name!r})",
        "   globals().update(",
        "       {k: v for k, v in vars(_module).items() if not k.startswith('__')}",
        "   )",
        "",
    ]


#: Pages that include generated files: Sphinx does not see those files change, so an
#: incremental build reads these pages again every time.
INCLUDING_PAGES = ("index", "catalogue", "benchmarks", "guides/index", "guides/trainer",
                   "api/index")


def always_outdated(app, env, added, changed, removed) -> list[str]:
    return [doc for doc in INCLUDING_PAGES if doc in env.found_docs]


def setup(app):
    app.connect("builder-inited", generate)
    app.connect("env-get-outdated", always_outdated)
    app.connect("autodoc-process-docstring", module_namespace_for_doctests)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
