"""The registry: conventions, derived facts, closed forms checked against sympy, register()."""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
import sympy as sp

import fbands
from fbands import divergences, symbolic
from fbands.errors import DivergenceError

from .. import reference as ref

u = symbolic.U


def test_builtin_generators_follow_the_documented_conventions():
    expected = {
        "kl": u - 1 - sp.log(u),
        "reverse_kl": u * sp.log(u) - u + 1,
        "tv": sp.Abs(u - 1) / 2,
        "chi2": (u - 1) ** 2,
        "neyman_chi2": (u - 1) ** 2 / u,
        "hellinger": (sp.sqrt(u) - 1) ** 2,
        "js": (u * sp.log(u) - (1 + u) * sp.log((1 + u) / 2)) / 2,
    }
    assert set(expected) <= set(fbands.available())
    for name, f in expected.items():
        assert sp.simplify(fbands.get(name).f - f) == 0, name
    a = sp.Rational(3, 2)
    alpha = fbands.get("alpha", a=1.5).f
    assert sp.simplify(alpha - (u**a - 1 - a * (u - 1)) / (a * (a - 1))) == 0


@pytest.mark.parametrize(
    "a, same_as, factor",
    [(0, "kl", 1), (1, "reverse_kl", 1), (2, "chi2", sp.Rational(1, 2)),
     (0.5, "hellinger", 2), (-1, "neyman_chi2", sp.Rational(1, 2))],
)
def test_alpha_family_special_cases(a, same_as, factor):
    f = fbands.get("alpha", a=a).f
    assert sp.simplify(f - factor * fbands.get(same_as).f) == 0


@pytest.mark.parametrize("name", list(ref.GENERATORS))
def test_derived_constants_match_independent_limits(name):
    d = fbands.get(name)
    f = ref.GENERATORS[name]
    with mp.workdps(40):
        f0 = ref._at_zero(f) if name in ("kl", "neyman_chi2") else f(mp.mpf(0))
        assert d.f0 == pytest.approx(float(f0)) if mp.isfinite(f0) else math.isinf(d.f0)
        slope = ref.fprime_inf(name)
        if slope == mp.inf:
            assert math.isinf(d.fprime_inf)
        else:
            assert d.fprime_inf == pytest.approx(float(slope), rel=1e-12)
        if name != "tv":  # tv has a kink at 1
            assert d.curvature == pytest.approx(float(mp.diff(f, 1, 2)), rel=1e-12)
    assert fbands.get("tv").curvature == math.inf


def test_closed_forms_exist_where_promised():
    for name in ("tv", "chi2", "neyman_chi2", "hellinger"):
        assert fbands.get(name).has_closed_form, name
    for a in (2, 0.5, -1):
        assert fbands.get("alpha", a=a).has_closed_form
    for name in ("kl", "reverse_kl", "js"):
        assert not fbands.get(name).has_closed_form, name


@pytest.mark.parametrize("name", ["tv", "chi2", "neyman_chi2", "hellinger", "alpha(a=2)",
                                  "alpha(a=-1)", "alpha(a=1/2)"])
@pytest.mark.parametrize("p, delta", [(0.3, 0.05), (0.02, 0.2), (0.9, 0.001), (1e-6, 0.5)])
def test_closed_form_edges_agree_with_sympy(name, p, delta):
    """sympy's own 50-digit root finder on the unsquared equation g(p, r) = delta, for the
    numpy solver and for numba's closed-form pass (an array with one delta, which uses the
    lower edge's forms in r and in 1 - r, and no table)."""
    d = fbands.get(name)
    P, D, r = sp.Rational(p), sp.Rational(delta), sp.Symbol("r", positive=True)
    g = P * d.f.subs(u, r) + (1 - P) * d.f.subs(u, (1 - r * P) / (1 - P))
    lo, hi = fbands.bounds(p, delta, name, backend="numpy")
    for edge, top in ((hi, 1 / P), (lo, sp.Integer(0))):
        if edge in (0.0, float(1 / P)):
            continue  # saturated
        e = sp.Float(edge, 50)
        bracket = (e * (1 - sp.Float("1e-8")), e * (1 + sp.Float("1e-8")))
        root = sp.nsolve(g - D, r, bracket, solver="anderson", prec=50)
        assert edge == pytest.approx(float(root), rel=1e-12), (edge, top)
    pytest.importorskip("numba")
    n_lo, n_hi = fbands.bounds(np.array([p]), delta, name, backend="numba")
    assert n_lo[0] == pytest.approx(lo, rel=1e-13) and n_hi[0] == pytest.approx(hi, rel=1e-13)
    squared = d.derivation.upper.squared or d.derivation.lower.squared
    assert d.closed_form_edges == (not squared)


def test_generated_code_is_free_of_cancellation_near_one():
    """F(s) = f(e^s) near s = 0 has an error of order eps |s|, not eps: no O(1) terms cancel.

    That is what the band needs (the error of g relative to delta stays near eps), and what
    a naive form such as ``2 e^s - 4 e^(s/2) + 2`` for alpha(1/2) misses by ten orders.
    """
    s = np.array([1e-9, -1e-7, 1e-4])
    for name in list(ref.GENERATORS) + ["alpha(a=1/2)", "alpha(a=3)"]:
        F = fbands.get(name).kernels(np)[0]
        f = ref.TABLE.get(name) or ref.alpha(0.5 if "1/2" in name else 3)
        with mp.workdps(50):
            exact = [f(mp.exp(mp.mpf(x))) for x in s]
        err = np.abs(F(s) - np.array([float(v) for v in exact]))
        assert np.all(err <= 8 * np.finfo(float).eps * np.abs(s) * (1 + np.abs(s))), name


def test_register_from_a_string_works_on_the_numpy_backend():
    d = fbands.register("test_triangle", "(u - 1)**2 / (u + 1)", overwrite=True)
    assert "test_triangle" in fbands.available()
    lo, hi = fbands.bounds(0.2, 0.05, "test_triangle", backend="numpy")
    f = ref.TABLE["triangular"]
    r_lo, r_hi = ref.edges(f, 0.2, 0.05)
    assert lo == pytest.approx(float(r_lo), rel=1e-12)
    assert hi == pytest.approx(float(r_hi), rel=1e-12)
    assert d.f0 == 1.0 and d.fprime_inf == 1.0


def test_register_a_family_with_a_parameter():
    fbands.register("test_power", "(u**b - 1 - b*(u - 1)) / (b*(b - 1))", params=("b",),
                    overwrite=True)
    member = fbands.get("test_power", b=3)
    assert sp.simplify(member.f - fbands.get("alpha", a=3).f) == 0
    assert fbands.get("test_power(b=3)") is member


@pytest.mark.parametrize(
    "f, message",
    [
        ("(u - 2)**2", r"f\(1\) must be 0"),
        ("-(u - 1)**2", "not convex"),
        ("log(u)", "not convex"),
        ("sin(u - 1)", "unknown name 'sin'"),  # not in the grammar's functions
        ("(u - 1)**2 + v", "unknown name 'v'"),
        ("(u - 1", "cannot parse"),
        ("(u - 1)**3", "not convex"),
        ("0*u", "strictly convex"),
    ],
)
def test_register_rejects_invalid_generators(f, message):
    with pytest.raises(fbands.DivergenceError, match=message):
        fbands.register("test_bad", f, overwrite=True)


def test_register_protects_existing_names():
    with pytest.raises(fbands.DivergenceError, match="exists"):
        fbands.register("kl", "(u - 1)**2")
    with pytest.raises(fbands.DivergenceError, match="invalid divergence name"):
        fbands.register("bad name", "(u - 1)**2")


def test_lookup_errors():
    with pytest.raises(fbands.DivergenceError, match="available:"):
        fbands.get("nope")
    with pytest.raises(fbands.DivergenceError, match="missing"):
        fbands.get("alpha")
    with pytest.raises(fbands.DivergenceError, match="takes no parameters"):
        fbands.get("kl", a=1)
    assert fbands.get("KL") is fbands.get("kullback_leibler") is fbands.get("kl")


# --- a name that is no divergence: the names, the closest one, a preset's divergence -----------


@pytest.mark.parametrize("spec", ["no-such-divergence", "kll", "nope_2", "x-y-z"])
def test_an_unknown_name_lists_the_available_ones(spec):
    with pytest.raises(fbands.DivergenceError) as err:
        fbands.bounds(0.5, 0.05, div=spec)
    message = str(err.value)
    assert message.startswith(f"unknown divergence {spec!r}")
    assert "available: " + ", ".join(fbands.available()) in message
    assert "position" not in message  # not a parse error of a malformed spec


@pytest.mark.parametrize("spec, close", [("kll", "kl"), ("tv2", "tv"), ("reverse-kl", "reverse_kl"),
                                         ("hellinger2", "hellinger"), ("jensen-shannon", "js")])
def test_an_unknown_name_suggests_the_closest(spec, close):
    with pytest.raises(fbands.DivergenceError, match=f"did you mean '{close}'"):
        fbands.get(spec)


def test_no_suggestion_when_nothing_is_close():
    with pytest.raises(fbands.DivergenceError) as err:
        fbands.get("no-such-divergence")
    assert "did you mean" not in str(err.value)


@pytest.mark.parametrize("spec, div", [("band-kl", "kl"), ("band-mask-tv", "tv"),
                                       ("band-gppo-chi2", "chi2"),
                                       ("band-reverse-kl", "reverse_kl"),
                                       ("band-alpha(a=0.5)", "alpha(a=1/2)"), ("trgppo", "kl")])
def test_a_loss_preset_says_which_divergence_it_means(spec, div):
    with pytest.raises(fbands.DivergenceError) as err:
        fbands.bounds(0.5, 0.05, div=spec)
    assert str(err.value) == f"{spec!r} is a loss preset (fbands.losses.preset); its " \
                             f"divergence is {div!r}"


def test_a_preset_without_a_band_or_with_an_unknown_divergence():
    with pytest.raises(fbands.DivergenceError, match="'clip' is a loss preset .* no band"):
        fbands.get("clip")
    with pytest.raises(fbands.DivergenceError, match="'band-nope' looks like a loss preset .*"
                                                     "unknown divergence 'nope'; available"):
        fbands.get("band-nope")
    with pytest.raises(fbands.DivergenceError, match="did you mean 'kl'"):
        fbands.get("band-kll")


def test_malformed_specs_keep_their_parse_errors():
    for spec, fragment in [("kl tv", "position 3"), ("alpha(a=", "position"),
                           ("u**2", "position"), ("alpha(a=1e400)", "out of range")]:
        with pytest.raises(fbands.DivergenceError, match=fragment):
            fbands.get(spec)


def test_every_loss_preset_is_named_in_the_message():
    """fbands.get and fbands.losses.preset read one table (fbands/_presets.py)."""
    from fbands import _presets

    for name, fields in _presets.PRESETS.items():
        with pytest.raises(fbands.DivergenceError, match=f"'{name}' is a loss preset") as err:
            fbands.get(name)
        assert ("no band" in str(err.value)) == ("div" not in fields), name
    pytest.importorskip("torch")  # (the losses need it)
    from fbands.losses import preset

    for name in ("band-kl", "band-mask-tv", "band-gppo-reverse-kl", "band-alpha(a=0.5)"):
        (div,) = divergences._preset_divergence(name)
        assert preset(name).div == div, name


def test_an_overwritten_name_means_the_new_generator_everywhere():
    """issue 27, F7: a family's members, an alias of the same spelling and a name with
    capitals all follow what was registered last."""
    fbands.register("fam", "b*(u-1)**2", params=("b",))
    chi2 = fbands.bounds(0.3, 0.05, "fam(b=1)", backend="numpy")
    assert chi2 == fbands.bounds(0.3, 0.05, "chi2", backend="numpy")
    fbands.register("fam", "b*(u-1-log(u))", params=("b",), overwrite=True)
    assert fbands.get("fam", b=1).f == fbands.get("kl").f
    assert fbands.bounds(0.3, 0.05, "fam(b=1)", backend="numpy") == \
        fbands.bounds(0.3, 0.05, "kl", backend="numpy")
    assert fbands.get("pearson").name == "chi2"  # an alias of chi2 ...
    fbands.register("pearson", "u - 1 - log(u)", overwrite=True)
    assert fbands.get("pearson").f == fbands.get("kl").f  # ... until the name is taken
    assert fbands.get("chi2").name == "chi2"
    mine = fbands.register("MyDiv", "(u - 1)**2 / (u + 3)")
    assert "MyDiv" in fbands.available() and fbands.get("MyDiv") is mine
    assert fbands.get("KL") is fbands.get("kl")  # built-ins in any case, as before


def test_a_sympy_generator_meets_the_limits_of_a_string():
    """issue 27, F14: a sympy object was checked for its nodes only, so a sum of hundreds
    of terms or a 60-deep nesting went on to sympy's derivations for minutes."""
    import time

    u = sp.Symbol("u")
    terms = [(u ** sp.Rational(k, 7) - 1 - sp.Rational(k, 7) * (u - 1))
             / (sp.Rational(k, 7) * (sp.Rational(k, 7) - 1)) for k in range(8, 400)]
    deep = u
    for _ in range(60):
        deep = sp.cosh(sp.Add(deep, -1, evaluate=False), evaluate=False)
    start = time.perf_counter()
    with pytest.raises(fbands.DivergenceError, match="longer than 500 characters"):
        fbands.register("many_terms", sp.Add(*terms))
    with pytest.raises(fbands.DivergenceError, match="more than 40 deep"):
        fbands.register("deep", deep - sp.cosh(0))
    assert time.perf_counter() - start < 10
    assert fbands.register("fine", (u - 1) ** 2 / (u + 1)).name == "fine"


def test_names_that_could_not_be_used_are_refused_at_registration():
    with pytest.raises(fbands.DivergenceError, match="u is the variable"):
        fbands.register("shadow", "(u - 1)**2 * a", params=("u",))
    with pytest.raises(fbands.DivergenceError, match="at most 100 characters"):
        fbands.register("x" * 10_000, "(u - 1)**2")
    long = fbands.register("y" * 100, "(u - 1)**2 / (u + 1)")
    assert fbands.get("y" * 100) is long


def test_registering_the_same_divergence_again_returns_it():
    """A notebook cell run twice registers the same generator again: that gives the
    registered divergence, while another generator or description under the name raises."""
    first = fbands.register("twice", "(u - 1)**2 / (u + 1)", description="a cell")
    again = fbands.register("twice", "(u-1)**2/(u+1)", description="a cell")
    assert again is first
    assert fbands.bounds(0.1, 0.05, "twice") == fbands.bounds(0.1, 0.05, first)
    for f, description in (("(u - 1)**2 / (u + 2)", "a cell"), ("(u - 1)**2 / (u + 1)", "x")):
        with pytest.raises(DivergenceError, match="'twice' exists with another generator"):
            fbands.register("twice", f, description=description)
    with pytest.raises(DivergenceError, match="exists"):
        fbands.register("kl", "(u - 1)**2")  # a built-in name keeps its generator
    family = "(u**a - 1 - a*(u - 1)) / (a*(a - 1))"
    fbands.register("fam_twice", family, params=("a",))
    fbands.register("fam_twice", family, params=("a",))
    with pytest.raises(DivergenceError, match="exists"):
        fbands.register("fam_twice", family, params=("a",), description="other")
