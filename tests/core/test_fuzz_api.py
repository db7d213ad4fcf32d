"""Hypothesis fuzzing of the losses, the command line and the trainer's configuration.

The contract under test (issue 19): every call gives a correct result, nan where the
documentation says so, or one of the library's own errors (:mod:`fbands.errors`) whose
message names the bad argument; never another exception type and never a hang.  A hang
is caught by an alarm (:func:`tests._timing.time_limit`, :data:`LIMIT_S` per example) rather than by
hypothesis' deadline, whose timings are unreliable on a loaded machine; the solvers are
warmed up once first, so that no example pays for a first compilation.  Inputs are small
so that the whole file runs in well under a minute.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import fbands  # noqa: E402
from fbands.cli import LIBRARY_ERRORS, main  # noqa: E402
from fbands.errors import ConfigError, LossError  # noqa: E402
from fbands.losses import (  # noqa: E402
    AGG_MODES,
    LOGP_TOLERANCE,
    Band,
    agg_loss,
    policy_loss,
    precompute_band,
    preset,
)
from tests._timing import time_limit  # noqa: E402

FUZZ = settings(deadline=None, max_examples=40,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
#: seconds one example may take: far above any normal call, far below a hang
LIMIT_S = 30


CONFIGS = [preset(name) for name in ("clip", "dual-clip", "dcpo", "trgppo", "cispo",
                                     "band-kl", "band-mask-tv", "band-gppo-chi2")]

# every float, the awkward ones often
ANY_FLOAT = st.one_of(
    st.sampled_from([0.0, -0.0, 1e-4, 2e-3, 2.3, 50.0, -1e-30, -80.0, -1e4, math.inf, -math.inf,
                     math.nan]),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
)
LOGP = st.floats(-30.0, 0.0, width=32)  # valid log-probabilities
MASK_VALUE = st.sampled_from([0.0, 1.0, 1.0, 1.0, 0.5, 2.0, -1.0, math.nan, math.inf])


@st.composite
def shapes(draw):
    return (draw(st.integers(0, 3)), draw(st.integers(0, 4)))


def tensor(draw, shape, elements, dtype=torch.float32):
    values = draw(st.lists(elements, min_size=math.prod(shape), max_size=math.prod(shape)))
    return torch.tensor(values, dtype=dtype).reshape(shape)


def names_an_argument(err: Exception, names) -> bool:
    text = str(err)
    return "\n" not in text.strip() and any(name in text for name in names)


def invalid_loss_input(logp_old, logp, mask, band) -> bool:
    """The issue's definition, written out independently of fbands.losses."""
    valid = mask != 0
    bad = (mask < 0) | mask.isnan() | mask.isinf()
    bad |= valid & ((logp_old > LOGP_TOLERANCE) | (logp > LOGP_TOLERANCE))
    if band is not None:
        lo, hi = band
        bad |= valid & (lo.isnan() | hi.isnan() | (lo > hi))
    return bool(bad.any())


@pytest.fixture(scope="module", autouse=True)
def _warm():
    """First calls (kernel compilation, sympy derivation) before any timed example."""
    for cfg in CONFIGS:
        precompute_band(torch.full((1, 2), -1.0), cfg)
    for div in ("kl", "tv", "chi2", "alpha(a=0.5)"):
        for backend in ("numpy", "torch"):
            fbands.bounds(torch.tensor([0.5]) if backend == "torch" else 0.5, 0.05, div,
                          backend)


# --------------------------------------------------------------------------------------
# losses


@FUZZ
@given(data=st.data(), shape=shapes(), cfg=st.sampled_from(CONFIGS),
       check=st.sampled_from([None, True, False]), with_band=st.booleans())
def test_policy_loss_any_input(data, shape, cfg, check, with_band):
    logp_old = tensor(data.draw, shape, ANY_FLOAT)
    logp = tensor(data.draw, shape, ANY_FLOAT).requires_grad_()
    adv = tensor(data.draw, shape[:1], ANY_FLOAT)
    mask = tensor(data.draw, shape, MASK_VALUE)
    band = None
    if with_band:
        band = Band(tensor(data.draw, shape, ANY_FLOAT), tensor(data.draw, shape, ANY_FLOAT))
    names = ("logp_old", "logp", "mask", "band", "advantages")
    try:
        with time_limit(LIMIT_S):
            loss, metrics = policy_loss(logp_old, logp, adv, mask, cfg, band, check=check)
    except LossError as err:
        assert names_an_argument(err, names), err
        return
    assert loss.dim() == 0 and loss.requires_grad
    if invalid_loss_input(logp_old, logp, mask, band):
        assert check is False, "a checked invalid input must raise"
        assert loss.isnan(), "an unchecked invalid input must give nan, not a plausible loss"


@FUZZ
@given(data=st.data(), shape=shapes(), cfg=st.sampled_from(CONFIGS),
       mask_kind=st.sampled_from(["ones", "bool", "random"]))
def test_policy_loss_valid_input_is_finite(data, shape, cfg, mask_kind):
    logp_old = tensor(data.draw, shape, LOGP, torch.float64)
    logp = tensor(data.draw, shape, LOGP, torch.float64).requires_grad_()
    adv = tensor(data.draw, shape[:1], st.floats(-10, 10), torch.float64)
    mask = {"ones": torch.ones(shape), "bool": torch.ones(shape, dtype=torch.bool),
            "random": tensor(data.draw, shape, st.sampled_from([0.0, 1.0]))}[mask_kind]
    with time_limit(LIMIT_S):
        loss, metrics = policy_loss(logp_old, logp, adv, mask, cfg)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert all(torch.isfinite(v) for v in metrics.values())
    unchecked, _ = policy_loss(logp_old, logp, adv, mask, cfg, check=False)
    assert torch.equal(loss, unchecked)  # validation never changes a value


@FUZZ
@given(data=st.data(), shape=shapes(), cfg=st.sampled_from(CONFIGS),
       check=st.sampled_from([True, False]))
def test_precompute_band_any_input(data, shape, cfg, check):
    logp_old = tensor(data.draw, shape, ANY_FLOAT)
    mask = tensor(data.draw, shape, st.sampled_from([0.0, 1.0]))
    try:
        with time_limit(LIMIT_S):
            lo, hi = precompute_band(logp_old, cfg, mask=mask, check=check)
    except LossError as err:
        assert names_an_argument(err, ("logp_old",)), err
        return
    valid = mask != 0
    bad = valid & (logp_old.isnan() | (logp_old > LOGP_TOLERANCE))
    assert not (check and bool(bad.any()))
    assert bool((lo[bad].isnan() & hi[bad].isnan()).all())  # unchecked: nan edges
    good = valid & ~bad
    assert not bool((lo[good].isnan() | hi[good].isnan()).any())
    assert bool((lo[good] <= hi[good]).all())


DENOMINATOR = st.one_of(
    st.none(), st.sampled_from([0, -1, 0.0, math.nan, math.inf, True, "3", [2]]),
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 10),
    st.builds(torch.tensor, st.floats(allow_nan=True, allow_infinity=True)),
)


@FUZZ
@given(data=st.data(), shape=shapes(), mode=st.sampled_from(AGG_MODES),
       num_tokens=DENOMINATOR, num_seqs=DENOMINATOR, scale=DENOMINATOR,
       dtype=st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bool]),
       check=st.sampled_from([None, False]))
def test_agg_loss_any_input(data, shape, mode, num_tokens, num_seqs, scale, dtype, check):
    values = tensor(data.draw, shape, st.floats(-1e3, 1e3)).to(dtype)
    mask = tensor(data.draw, shape, MASK_VALUE)
    names = ("num_tokens", "num_seqs", "loss_scale_factor", "mask")
    try:
        with time_limit(LIMIT_S):
            out = agg_loss(values, mask, mode, num_tokens=num_tokens, num_seqs=num_seqs,
                           loss_scale_factor=scale, check=check)
    except LossError as err:
        assert names_an_argument(err, names), err
        return
    assert out.dim() == 0 and out.is_floating_point()
    bad_mask = bool(((mask < 0) | ~mask.isfinite()).any())
    bad_tensor = any(isinstance(d, torch.Tensor) and not (d.isfinite() and d > 0)
                     for d in (num_tokens, num_seqs, scale))
    if bad_mask or bad_tensor:
        assert check is False and out.isnan()
    elif num_tokens is None and num_seqs is None and scale is None:
        assert torch.isfinite(out)


# --------------------------------------------------------------------------------------
# command line (in process)


def run_cli(argv):
    """``(exit code, stderr)`` of ``fbands argv``; argparse's own exit counts as a code."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), \
            time_limit(LIMIT_S):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: a malformed command line
            code = exc.code
    return code, err.getvalue()


NUMBER_TEXT = st.one_of(st.sampled_from(["0.5", "1", "2", "0", "-1", "nan", "inf", "1e-300",
                                         "1e400", "0x1p-3", "abc", ""]),
                        st.floats(allow_nan=True, allow_infinity=True).map(repr))
DIV_TEXT = st.one_of(
    st.sampled_from(["kl", "tv", "chi2", "alpha(a=0.5)", "alpha(a=2)", "alpha(a=-1)",
                     "alpha(a=1e6)", "alpha(a=)", "alpha", "nope", "kl,tv", ",", "(", "u**2",
                     "__import__('os').getcwd()", "alpha(a=(1 or 2))", "alpha(a=[1])"]),
    st.text(alphabet="klatvchi2()=.,-+*/ ^_eu0123456789", max_size=20),
)


def check_exit(code, err):
    assert code in (0, 2), (code, err)
    if code == 2 and err.startswith("fbands: error: "):
        assert err.count("\n") == 1, err  # one line, no traceback
    elif code == 2:
        assert "usage:" in err, err  # argparse's own message
    assert "Traceback" not in err, err


@FUZZ
@given(p=st.lists(NUMBER_TEXT, min_size=1, max_size=3), delta=NUMBER_TEXT, div=DIV_TEXT,
       logp=st.booleans(), backend=st.sampled_from(["numpy", "torch", "nope"]))
def test_cli_bounds_any_input(p, delta, div, logp, backend):
    argv = ["bounds", "--delta", delta, "--div", div, "--backend", backend,
            *(["--logp"] if logp else []), "--", *p]
    check_exit(*run_cli(argv))


@settings(FUZZ, max_examples=10)
@given(div=DIV_TEXT, delta=NUMBER_TEXT)
def test_cli_plot_any_input(div, delta, tmp_path_factory):
    assume(div.strip(", ") not in ("kl", "tv", "chi2"))  # a real plot takes seconds
    out = tmp_path_factory.mktemp("plot") / "p.png"
    check_exit(*run_cli(["plot", "--div", div, "--delta", delta, "-o", str(out)]))


ANY_WORD = NUMBER_TEXT | DIV_TEXT | st.text(max_size=10)


@FUZZ
@given(words=st.lists(st.sampled_from(["--no-derive", "--derive", "-x"]) | ANY_WORD,
                      max_size=3))
def test_cli_divergences_any_arguments(words):
    check_exit(*run_cli(["divergences", *words]))


@FUZZ
@given(options=st.lists(st.tuples(
    st.sampled_from(["--steps", "--model", "--seed", "--seeds", "--out"]), ANY_WORD),
    max_size=3),
    flags=st.lists(st.sampled_from(["--no-progress", "--force", "--nope"]), max_size=2))
def test_cli_demo_any_arguments(options, flags, tmp_path_factory):
    """demo with any options, its trainings replaced by the validation of their configs
    (a valid command line reaches them, and only then: two per seed)."""
    pytest.importorskip("transformers")
    import fbands.rl.compare as rl_compare
    import fbands.rl.train as rl_train

    base = tmp_path_factory.mktemp("demo")
    argv = ["demo", "--out", str(base / "runs"), *[x for pair in options for x in pair], *flags]
    seen = []
    with mock.patch.object(rl_train, "train", lambda cfg: seen.append(cfg.validate())), \
            mock.patch.object(rl_compare, "compare_seeds", lambda *args: "table"), \
            contextlib.chdir(base):
        code, err = run_cli(argv)
    check_exit(code, err)
    assert (code == 0) == (len(seen) == 2 * len({cfg.seed for cfg in seen}) > 0)


METRIC_LINE = st.one_of(
    st.dictionaries(st.sampled_from(["step", "reward", "accuracy", "entropy", "delta", "x"]),
                    JSON_VALUE_LEAF := st.one_of(
                        st.none(), st.booleans(), st.integers(-5, 10**20),
                        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4)),
                    max_size=5).map(lambda d: json.dumps(d, allow_nan=True)),
    st.text(max_size=12),
)


@settings(FUZZ, max_examples=15)
@given(runs=st.lists(st.lists(METRIC_LINE, max_size=4), min_size=1, max_size=2),
       target=NUMBER_TEXT, suffix=st.sampled_from([".png", ".txt", "", ".svg"]))
def test_cli_compare_any_metrics(runs, target, suffix, tmp_path_factory):
    """compare over run folders whose metrics.jsonl holds any lines."""
    pytest.importorskip("matplotlib")
    base = tmp_path_factory.mktemp("compare")
    dirs = []
    for i, lines in enumerate(runs):
        run = base / f"run{i}"
        run.mkdir()
        (run / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
        dirs.append(str(run))
    check_exit(*run_cli(["compare", *dirs, "--target", target, "--out",
                         str(base / f"c{suffix}")]))


# --------------------------------------------------------------------------------------
# trainer configuration

JSON_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=5,
)


def field_values():
    from fbands.rl.config import TrainConfig

    names = [f.name for f in dataclasses.fields(TrainConfig)]
    return st.dictionaries(st.sampled_from([*names, "stepz"]), JSON_VALUE | DIV_TEXT.map(
        lambda d: f"band-{d}"), max_size=4)


@FUZZ
@given(data=st.data())
def test_train_config_any_values(data, tmp_path_factory):
    pytest.importorskip("transformers")
    from fbands.rl.config import TrainConfig

    fields = data.draw(field_values())
    fields.setdefault("run_dir", str(tmp_path_factory.mktemp("run") / "r"))
    try:
        with time_limit(LIMIT_S):
            cfg = TrainConfig.from_dict(fields).validate()
    except ConfigError as err:
        text = str(err)
        assert "\n" not in text.strip() and ("=" in text or "option" in text), text
        return
    assert json.loads(json.dumps(cfg.to_dict())) == cfg.to_dict()  # config.json round-trips


@FUZZ
@given(text=st.text(max_size=60) | st.sampled_from(['{"steps": 3', "steps = ", "[1]", "{}",
                                                    '{"loss": "band-("}', "loss = 3"]),
       suffix=st.sampled_from([".json", ".toml"]))
def test_config_file_any_text(text, suffix, tmp_path_factory):
    pytest.importorskip("transformers")
    from fbands.rl.config import TrainConfig

    path = tmp_path_factory.mktemp("cfg") / f"c{suffix}"
    path.write_text(text, encoding="utf-8")
    try:
        with time_limit(LIMIT_S):
            TrainConfig.from_file(path).validate()
    except ConfigError as err:
        assert "\n" not in str(err).strip(), err


@FUZZ
@given(options=st.lists(st.tuples(
    st.sampled_from(["--steps", "--lr", "--loss", "--delta", "--eps-low", "--agg", "--task",
                     "--group-size", "--minibatches", "--cache-dir", "--device", "--model"]),
    NUMBER_TEXT | DIV_TEXT | DIV_TEXT.map(lambda d: f"band-{d}")), max_size=4))
def test_cli_train_any_options(options, tmp_path_factory):
    pytest.importorskip("transformers")
    import fbands.rl.train as rl_train

    run_dir = tmp_path_factory.mktemp("train") / "r"
    argv = ["train", "--run-dir", str(run_dir), *[x for pair in options for x in pair]]
    seen = []
    with mock.patch.object(rl_train, "train", lambda cfg, resume=False: seen.append(cfg) or {}):
        code, err = run_cli(argv)
    check_exit(code, err)
    assert (code == 0) == bool(seen)  # a valid configuration reached train(), only then


def test_library_errors_are_the_four_and_a_missing_extra():
    from fbands._optional import MissingDependencyError

    assert set(LIBRARY_ERRORS) == {fbands.BandError, fbands.DivergenceError, fbands.LossError,
                                   fbands.ConfigError, MissingDependencyError}
    assert all(issubclass(e, ValueError) for e in LIBRARY_ERRORS if e is not
               MissingDependencyError)
