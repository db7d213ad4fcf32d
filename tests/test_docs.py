"""Tests of the documentation: its generators, and the claims its theory pages make.

The generators live in ``docs/_ext/fbands_docs.py`` (a Sphinx extension, importable without
Sphinx).  The numerical claims checked here are the ones stated in ``docs/theory/*.md`` that
the pages' own doctests do not already execute.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import sympy as sp

import fbands

DOCS = Path(__file__).resolve().parent.parent / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import fbands_docs  # noqa: E402

# ----------------------------------------------------------------------------- generators


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory):
    out = tmp_path_factory.mktemp("generated")
    page = fbands_docs.write_catalogue(out)
    return out, page.read_text(encoding="utf-8")


@pytest.mark.slow  # the catalogue: a page and a plot per divergence
def test_catalogue_covers_the_whole_registry(catalogue):
    out, text = catalogue
    for name, div, members in fbands_docs.catalogue_entries():
        shown = [div] if div is not None else members
        assert shown, f"{name} has nothing to show"
        for d in shown:
            label = fbands_docs._label(d.name)
            assert f"({label})=" in text, f"no section for {d.name}"
            assert f"<{label}>" in text, f"no summary row for {d.name}"
            png = out / "catalogue" / f"{fbands_docs._slug(d.name)}.png"
            assert png.is_file() and png.stat().st_size > 1000, f"no plot for {d.name}"
    assert len(fbands_docs.catalogue_entries()) == len(fbands.available())


@pytest.mark.slow  # the catalogue: a page and a plot per divergence
def test_catalogue_shows_the_symbolic_limits(catalogue):
    _, text = catalogue
    kl = text.split("(catalogue-kl)=")[1].split("(catalogue-")[0]
    assert r"e^{- \delta}" in kl
    tv = text.split("(catalogue-tv)=")[1].split("(catalogue-")[0]
    assert r"1 - \delta" in tv


def test_symbolic_rstar_agrees_with_the_band_at_p_one():
    delta = sp.Symbol("delta", positive=True)
    for name in ("kl", "tv", "hellinger", "chi2"):
        div = fbands.get(name)
        expr = fbands_docs.symbolic_rstar(div)
        assert expr is not None, name
        lo, _ = fbands.bounds(1.0, 0.1, name)
        assert float(expr.subs(delta, 0.1)) == pytest.approx(lo, rel=1e-9, abs=1e-12), name


def test_theory_figures_are_written(tmp_path):
    paths = fbands_docs.write_theory_figures(tmp_path)
    assert [p.name for p in paths] == [
        "g_function.png", "related_methods.png", "gain.png", "two_point.png", "saturation.png",
        "rstar.png",
    ]
    pages = "".join(
        (DOCS / page).read_text()
        for page in ("index.md", "theory/band.md", "theory/related.md", "theory/limits.md",
                     "theory/closed_forms.md")
    )
    for path in paths:
        assert path.is_file() and path.stat().st_size > 1000
        assert f"/_generated/theory/{path.name}" in pages, f"{path.name} is shown nowhere"


def test_docstring_examples_get_their_module_namespace():
    lines = ["Docstring."]
    fbands_docs.module_namespace_for_doctests(None, "module", "fbands.bands", None, {}, lines)
    assert lines[0] == ".. testsetup::" and lines[-1] == "Docstring."
    setup = "\n".join(line[3:] for line in lines[2:-2])
    namespace: dict = {}
    exec(setup, namespace)  # what the doctest builder runs before the examples
    assert namespace["NumpyInputs"] is fbands.bands.NumpyInputs
    other = ["Doc."]
    fbands_docs.module_namespace_for_doctests(None, "function", "fbands.bounds", None, {}, other)
    fbands_docs.module_namespace_for_doctests(None, "module", "numpy", None, {}, other)
    assert other == ["Doc."]


def test_benchmarks_page_includes_tables_and_figures(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "speed.md").write_text(
        "# Speed\n\nSome text.\n\n## Per backend\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
        "![plot](speed.png)\n",
        encoding="utf-8",
    )
    (results / "speed.png").write_bytes(b"\x89PNG fake")
    (results / "extra.png").write_bytes(b"\x89PNG fake")
    out = tmp_path / "generated"
    text = fbands_docs.write_benchmarks(results, out).read_text(encoding="utf-8")
    # The title becomes a level-2 section, and "## Per backend" its level-3 subsection.
    assert "## Speed" in text and "\n### Per backend" in text
    assert "| 1 | 2 |" in text
    assert "](/_generated/benchmarks/speed.png)" in text
    assert "## Figures" in text and "/_generated/benchmarks/extra.png" in text
    assert (out / "benchmarks" / "speed.png").is_file()


def test_benchmarks_page_without_results_says_how_to_make_them(tmp_path):
    text = fbands_docs.write_benchmarks(tmp_path / "missing", tmp_path / "g").read_text()
    assert "make bench" in text


def test_toctrees_list_only_existing_pages(tmp_path):
    fbands_docs.write_toctrees(tmp_path)
    guides = (tmp_path / "guides_toc.md").read_text().split("\n")
    for guide in ("own_loss", "trainer", "custom_divergence"):
        assert guide in guides
        assert (DOCS / "guides" / f"{guide}.md").is_file()
    listed = [g for g in guides if g and not g.startswith((":", "`"))]
    order = [g for g in fbands_docs.GUIDE_ORDER if g in listed]
    assert listed[: len(order)] == order
    api = (tmp_path / "api_toc.md").read_text()
    assert "core" in api
    for doc, built in fbands_docs.api_pages():
        assert (doc in api.split("\n")) == built
        assert (DOCS / "api" / f"{doc}.rst").is_file()


def test_every_public_core_name_is_in_the_api_reference():
    core = (DOCS / "api" / "core.rst").read_text()
    public = [n for n in dir(fbands) if not n.startswith("_") and n[0].isalpha()]
    public = [n for n in public if not isinstance(getattr(fbands, n), type(sys))]
    for name in public:
        assert f":: {name}" in core, f"fbands.{name} is missing from docs/api/core.rst"


# ----------------------------------------------------------------------------- the theory

U = sp.Symbol("u", positive=True)
A = sp.Symbol("a", real=True)
ALPHA = (U**A - 1 - A * (U - 1)) / (A * (A - 1))


@pytest.mark.parametrize(
    ("a", "expected"),
    [
        (0, U - 1 - sp.log(U)),  # kl
        (1, U * sp.log(U) - U + 1),  # reverse_kl
        (2, (U - 1) ** 2 / 2),  # chi2 / 2
        (sp.Rational(1, 2), 2 * (sp.sqrt(U) - 1) ** 2),  # 2 hellinger
        (-1, (U - 1) ** 2 / (2 * U)),  # neyman_chi2 / 2
    ],
)
def test_alpha_special_cases(a, expected):
    """docs/theory/divergences.md: the table of special members of the alpha family."""
    member = sp.limit(ALPHA, A, a)
    assert sp.simplify(member - expected) == 0


RSTAR = {  # docs/theory/limits.md, "The values of r*"
    "kl": lambda d: math.exp(-d),
    "reverse_kl": lambda d: 1.0,
    "tv": lambda d: max(1 - d, 0.0),
    "chi2": lambda d: 1.0,
    "neyman_chi2": lambda d: 1 / (1 + d),
    "hellinger": lambda d: (1 - d / 2) ** 2 if d < 2 else 0.0,
    "alpha(a=-1)": lambda d: 1 / (1 + 2 * d),
    "alpha(a=0.3)": lambda d: (1 - 0.3 * 0.7 * d) ** (1 / 0.3),
    "alpha(a=2)": lambda d: 1.0,
}


@pytest.mark.parametrize("name", sorted(RSTAR))
@pytest.mark.parametrize("delta", [0.05, 0.5])
def test_lower_edge_at_p_one_is_rstar(name, delta):
    lo, hi = fbands.bounds(1.0, delta, name)
    assert lo == pytest.approx(RSTAR[name](delta), rel=1e-9, abs=1e-12)
    assert hi == pytest.approx(1.0)


def test_js_rstar_solves_its_equation():
    d = 0.1
    lo, _ = fbands.bounds(1.0, d, "js")
    h = 0.5 * (lo * math.log(lo) - (1 + lo) * math.log(1 + lo)) + math.log(2)
    assert h == pytest.approx(d, rel=1e-9)


def _names():
    return [n for n in fbands.available() if n != "alpha"] + ["alpha(a=0.5)", "alpha(a=3)"]


@pytest.mark.parametrize("name", _names())
def test_mirror_identity(name):
    """docs/theory/band.md: p r_hi(p) + (1 - p) r_lo(1 - p) = 1."""
    p = np.array([1e-3, 0.05, 0.3, 0.5, 0.8])
    for delta in (0.01, 0.2):
        _, hi = fbands.bounds(p, delta, name)
        lo, _ = fbands.bounds(1 - p, delta, name)
        np.testing.assert_allclose(p * hi + (1 - p) * lo, 1.0, rtol=1e-9)


@pytest.mark.parametrize("name", ["kl", "tv", "neyman_chi2", "hellinger"])
def test_mass_limit_at_p_zero(name):
    """docs/theory/limits.md: p r_hi(p) -> 1 - r* as p -> 0 when f'(inf) is finite."""
    delta = 0.05
    p = 1e-14  # hellinger converges like sqrt(p), the others faster
    _, hi = fbands.bounds(p, delta, name)
    assert p * hi == pytest.approx(1 - RSTAR[name](delta), rel=1e-5)


def test_chi2_upper_edge_grows_like_sqrt_delta_over_p():
    p = np.array([1e-8, 1e-10])
    _, hi = fbands.bounds(p, 0.05, "chi2")
    np.testing.assert_allclose(hi, 1 + np.sqrt(0.05 * (1 - p) / p), rtol=1e-12)


@pytest.mark.parametrize(
    ("name", "lower_below", "upper_above"),
    [  # docs/theory/closed_forms.md, "Saturation thresholds at a glance", delta = 0.1
        ("reverse_kl", 1 - math.exp(-0.1), math.exp(-0.1)),
        ("tv", 0.1, 1 - 0.1),
        ("chi2", 0.1 / 1.1, 1 / 1.1),
        ("hellinger", 0.1 * (1 - 0.1 / 4), (1 - 0.1 / 2) ** 2),
        ("alpha(a=0.5)", 1 - (1 - 0.5 * 0.5 * 0.1) ** 2, (1 - 0.5 * 0.5 * 0.1) ** 2),
    ],
)
def test_saturation_thresholds(name, lower_below, upper_above):
    delta = 0.1
    eps = 1e-6
    p = np.array([lower_below * (1 - eps), lower_below * (1 + eps)])
    lo, _ = fbands.bounds(p, delta, name)
    assert lo[0] == 0 and lo[1] > 0
    p = np.array([upper_above * (1 - eps), upper_above * (1 + eps)])
    _, hi = fbands.bounds(p, delta, name)
    assert hi[0] < 1 / p[0] and hi[1] == pytest.approx(1 / p[1], rel=1e-12)


@pytest.mark.parametrize("name", ["kl", "neyman_chi2", "alpha(a=-1)"])
def test_infinite_f0_never_saturates(name):
    p = np.array([1e-6, 0.5, 1 - 1e-6])
    log_lo, _ = fbands.log_bounds(p, 5.0, name)
    assert np.all(np.isfinite(log_lo))
    # The upper gap 1/p - r_hi is about ((1 - p) / p) exp(-delta / (1 - p)) for kl: it is
    # representable only for moderate delta / (1 - p).
    p = np.array([0.1, 0.5])
    _, log_hi = fbands.log_bounds(p, 0.5, name)
    assert np.all(log_hi < -np.log(p))


@pytest.mark.parametrize("name", ["kl", "reverse_kl", "hellinger", "js", "alpha(a=3)"])
def test_small_radius_band(name):
    """docs/theory/limits.md: r = 1 -+ sqrt(2 delta (1 - p) / (f''(1) p)) + O(delta)."""
    delta, p = 1e-8, 0.3
    lo, hi = fbands.bounds(p, delta, name)
    w = math.sqrt(2 * delta * (1 - p) / (fbands.get(name).curvature * p))
    assert hi - 1 == pytest.approx(w, rel=1e-3)
    assert 1 - lo == pytest.approx(w, rel=1e-3)


def test_kl_log_lower_edge_for_rare_tokens():
    """docs/theory/limits.md: log r_lo = -(delta + (1 - p) log c) / p ~ -delta/p - 1."""
    p, delta = 1e-6, 0.05
    log_lo, _ = fbands.log_bounds(p, delta, "kl")
    c = (1 - math.exp(log_lo) * p) / (1 - p)
    assert log_lo == pytest.approx(-(delta + (1 - p) * math.log(c)) / p, rel=1e-12)
    assert log_lo == pytest.approx(-delta / p - 1, rel=1e-9)


def test_ppo_clip_is_the_tv_band_of_radius_eps_p():
    """docs/theory/related.md: [1 - eps, 1 + eps] is the tv band of radius eps p."""
    p = np.array([0.01, 0.3, 0.7])
    lo, hi = fbands.bounds(p, 0.2 * p, "tv")
    np.testing.assert_allclose(lo, 0.8, rtol=1e-12)
    np.testing.assert_allclose(hi, 1.2, rtol=1e-12)
