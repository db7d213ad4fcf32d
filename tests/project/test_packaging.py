"""Packaging: what ``import fbands`` loads, the errors of missing extras, and the built wheel
and sdist installed into a fresh virtual environment outside the tree.

The wheel tests (slow) share one build and one environment: first the core alone (what
``pip install fbands`` brings), then the same environment with the ``torch`` extra added.
Every check runs in a subprocess of that environment from a directory outside the source
tree, so nothing there can import the checkout by accident.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

import fbands

ROOT = Path(__file__).resolve().parents[2]
CORE = {"numpy", "sympy", "mpmath", "numba"}
HEAVY = ("torch", "cvxpy", "matplotlib", "scipy")
#: The CPU build these machines keep on disk; never let pip choose a torch here.
TORCH = os.environ.get("FBANDS_TEST_TORCH", "torch==2.13.0")


def _run(cmd: list[str], timeout: float = 900, **kwargs) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    if done.returncode != 0:
        raise AssertionError(f"{cmd} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _pip(python: Path, *args: str) -> str:
    # --no-compile: byte-compiling sympy's thousands of modules is most of an install's time.
    return _run([str(python), "-m", "pip", "--disable-pip-version-check", "install", "-q",
                 "--no-compile", *args])


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """The sdist, and the wheel built from it (``python -m build``: so that the sdist is
    complete enough to build a working wheel)."""
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)])
    (wheel,), (sdist,) = out.glob("*.whl"), out.glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


@pytest.fixture(scope="module")
def env(tmp_path_factory, dists) -> dict:
    """A plain virtual environment (no system site-packages) with the wheel and its core
    dependencies, and a working directory outside the source tree."""
    base = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", str(base / "env")])
    python = base / "env" / "bin" / "python"
    _pip(python, str(dists["wheel"]))
    work = base / "work"
    work.mkdir()
    return {"python": python, "work": work, "wheel": dists["wheel"], "torch": False}


def _check(env: dict, code: str, **extra_env: str) -> dict:
    """Run ``code`` (which prints one JSON line last) in the environment; return it parsed."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "FBANDS"))}
    environ.update({"FBANDS_CACHE_DIR": str(env["work"] / "cache"), **extra_env})
    out = _run([str(env["python"]), "-c", textwrap.dedent(code)], cwd=env["work"], env=environ)
    return json.loads(out.strip().splitlines()[-1])


def _blocked(code: str, *blocked: str) -> dict:
    """Run ``code`` in this interpreter as if ``blocked`` packages were not installed."""
    prelude = f"import sys\nfor name in {blocked!r}:\n    sys.modules[name] = None\n"
    out = _run([sys.executable, "-c", prelude + textwrap.dedent(code)], cwd=ROOT)
    return json.loads(out.strip().splitlines()[-1])


#: Tries each optional part; prints {part: [exception type, message] or None}.
_TRY_EXTRAS = """
    import json, fbands, numpy as np
    tries = {
        "torch": lambda: fbands.bounds(np.array([0.01, 0.5]), 0.05, backend="torch"),
        "cvxpy": lambda: fbands.reference_band([0.2, 0.3, 0.5], 0, 0.05, "kl"),
        "losses": lambda: __import__("fbands.losses"),
        "plot": lambda: __import__("fbands.plotting").plotting.plot_bands(["kl"], 0.05,
                                                                            "x.png"),
    }
    out = {}
    for key, call in tries.items():
        try:
            call()
            out[key] = None
        except ImportError as exc:
            out[key] = [type(exc).__name__, str(exc)]
    print(json.dumps(out))
"""


def _assert_names_extras(got: dict) -> None:
    for key, extra in (("torch", "torch"), ("cvxpy", "cvxpy"), ("losses", "torch"),
                       ("plot", "plot")):
        assert got[key] is not None, key
        name, message = got[key]
        assert name == "MissingDependencyError"
        assert f'pip install "fbands[{extra}]"' in message, message


# -- in this environment (fast) -----------------------------------------------------------------


def test_import_fbands_loads_no_optional_package():
    got = _blocked("""
        import json, sys
        import fbands
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in
                                ("torch", "cvxpy", "matplotlib", "scipy", "numba"))))
    """)
    assert got == []


def test_missing_extras_raise_an_error_that_names_them():
    _assert_names_extras(_blocked(_TRY_EXTRAS, "torch", "cvxpy", "matplotlib"))


def test_without_numba_auto_takes_numpy_and_an_explicit_numba_says_so():
    got = _blocked("""
        import json, fbands, numpy as np
        lo, hi = fbands.bounds(np.array([0.01, 0.5]), 0.05)
        try:
            fbands.bounds(np.array([0.01, 0.5]), 0.05, backend="numba")
            err = None
        except ImportError as exc:
            err = str(exc)
        print(json.dumps({"band": [*lo, *hi], "err": err}))
    """, "numba")
    want = fbands.bounds(np.array([0.01, 0.5]), 0.05, backend="numpy")
    assert got["band"] == [*want[0], *want[1]]
    assert got["err"].endswith("pip install numba"), got["err"]


def test_a_broken_optional_package_is_not_reported_as_missing():
    # torch present but one of its own imports missing: the original error, unchanged
    got = _blocked("""
        import json
        from fbands._optional import raise_missing
        try:
            raise_missing(ModuleNotFoundError("No module named 'typing_extensions'",
                                              name="typing_extensions"), "the torch backend")
        except ImportError as exc:
            print(json.dumps([type(exc).__name__, str(exc)]))
    """)
    assert got == ["ModuleNotFoundError", "No module named 'typing_extensions'"]


# -- the wheel (slow) ---------------------------------------------------------------------------


def _installed(env: dict) -> set[str]:
    out = _run([str(env["python"]), "-m", "pip", "list", "--format=json"])
    return {re.sub(r"[-_.]+", "-", p["name"].lower()) for p in json.loads(out)}


# -- the artefacts ------------------------------------------------------------------------------


def _package_sources() -> set[str]:
    return {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "fbands").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")
    }


@pytest.mark.slow
def test_wheel_holds_every_module_and_the_core_metadata(dists):
    names = set(zipfile.ZipFile(dists["wheel"]).namelist())
    missing = _package_sources() - names
    assert not missing, f"not in the wheel: {sorted(missing)}"
    assert "fbands/_jit/scalar.py" in names  # copied beside each divergence's leaves
    (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    meta = zipfile.ZipFile(dists["wheel"]).read(meta_name).decode()
    assert re.search(r"^Version: (.+)$", meta, re.M).group(1) == fbands.__version__
    requires = re.findall(r"^Requires-Dist: (.+)$", meta, re.M)
    core = {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in requires if "extra" not in r}
    assert core == CORE
    extras = set(re.findall(r"^Provides-Extra: (.+)$", meta, re.M))
    assert {"torch", "cvxpy", "plot", "rl", "verl", "trl", "docs", "dev", "all"} <= extras
    (license_file,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    assert b"Apache License" in zipfile.ZipFile(dists["wheel"]).read(license_file)


@pytest.mark.slow
def test_sdist_holds_the_sources(dists):
    with tarfile.open(dists["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md"} <= names
    missing = _package_sources() - names
    assert not missing, f"not in the sdist: {sorted(missing)}"


# -- the core alone -----------------------------------------------------------------------------


@pytest.mark.slow
def test_core_installs_nothing_heavy(env):
    installed = _installed(env)
    assert CORE <= installed
    assert not installed & set(HEAVY), sorted(installed & set(HEAVY))


@pytest.mark.slow
def test_import_loads_no_optional_package_and_not_the_checkout(env):
    got = _check(env, """
        import json, sys
        import fbands
        print(json.dumps({"file": fbands.__file__, "version": fbands.__version__,
                          "loaded": sorted(m for m in sys.modules if m.split(".")[0] in
                                           ("torch", "cvxpy", "matplotlib", "scipy", "numba"))}))
    """)
    assert not Path(got["file"]).is_relative_to(ROOT)
    assert got["version"] == fbands.__version__
    assert got["loaded"] == []  # numba too: it loads with the first numba call


#: The band edges of KL, checked in mpmath: g(p, r) = p f(r) + (1 - p) f((1 - r p) / (1 - p))
#: equals delta at both edges (f(u) = u - 1 - log u), independent of the package's solvers.
_EDGES = """
    import json, mpmath, numpy as np, fbands
    p = np.array([1e-3, 0.01, 0.5, 0.9])  # (below ~1e-5 the lower edge underflows to 0)
    mpmath.mp.dps = 40
    f = lambda u: u - 1 - mpmath.log(u)
    def gap(pi, r):
        pi, r = mpmath.mpf(pi), mpmath.mpf(r)
        return float(abs(pi * f(r) + (1 - pi) * f((1 - r * pi) / (1 - pi)) - mpmath.mpf("0.05")))
    out = {}
    for backend in BACKENDS:
        lo, hi = fbands.bounds(p, 0.05, "kl", backend=backend)
        out[backend] = max(gap(pi, r) for pi, r in zip([*p, *p], [*lo, *hi]))
    print(json.dumps(out))
"""


@pytest.mark.slow
def test_numpy_and_numba_backends_answer(env):
    got = _check(env, "BACKENDS = ('numpy', 'numba')" + textwrap.dedent(_EDGES))
    assert got["numpy"] < 1e-13 and got["numba"] < 1e-13, got


@pytest.mark.slow
def test_compile_cache_is_reused_and_unwritable_falls_back(env, tmp_path):
    code = """
        import json, numpy as np, numba, fbands
        from fbands._jit import loader
        lo, hi = fbands.bounds(np.array([0.01, 0.5]), np.array([0.05, 0.05]), "tv",
                               backend="numba")
        mod = loader.kernels(fbands.get("tv"))
        jitted = numba.core.dispatcher.Dispatcher
        stats = [d.stats for d in vars(mod).values() if isinstance(d, jitted)]
        print(json.dumps({"band": [*lo, *hi], "hits": sum(len(s.cache_hits) for s in stats),
                          "misses": sum(len(s.cache_misses) for s in stats)}))
    """
    # tv: both edges in closed form, |delta| / p away from 1 (delta = 0.05)
    want = [1 - 0.05 / 0.01, 1 - 0.05 / 0.5, 1 + 0.05 / 0.01, 1 + 0.05 / 0.5]
    cache = tmp_path / "cache"
    cold = _check(env, code, FBANDS_CACHE_DIR=str(cache))
    files = [p for p in cache.rglob("*") if p.is_file()]
    assert files, "nothing was written to the cache directory"
    warm = _check(env, code, FBANDS_CACHE_DIR=str(cache))
    assert cold["misses"] > 0 and warm["hits"] > 0 and warm["misses"] == 0, (cold, warm)
    # A cache directory that cannot be created (its parent is a file: unwritable even for
    # root) costs a compile, never an error or a wrong answer.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    fallback = _check(env, code, FBANDS_CACHE_DIR=str(blocker / "cache"))
    for got in (cold, warm, fallback):
        assert got["band"] == pytest.approx([max(w, 0.0) for w in want], rel=1e-13)


@pytest.mark.slow
def test_missing_extras_name_the_extra(env):
    _assert_names_extras(_check(env, _TRY_EXTRAS))


# -- with the torch extra -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch_env(env) -> dict:
    """The same environment with ``fbands[torch]`` (the CPU build :data:`TORCH`, never one
    that pip picks)."""
    if not env["torch"]:
        _pip(env["python"], f"{env['wheel']}[torch]", TORCH)
        env["torch"] = True
    return env


@pytest.mark.slow
def test_torch_backend_and_losses(torch_env):
    got = _check(torch_env, """
        import json, sys, numpy as np, fbands
        import_only = sorted(m for m in ("torch", "cvxpy", "matplotlib") if m in sys.modules)
        import torch
        from fbands.losses import policy_loss, precompute_band, preset
        p = np.array([1e-4, 0.01, 0.5, 0.9])
        ref = fbands.bounds(p, 0.05, "kl", backend="numpy")
        lo, hi = fbands.bounds(torch.tensor(p), 0.05, "kl")
        cfg = preset("band-kl", delta=0.05)
        logp_old = torch.log(torch.tensor([[0.01, 0.5, 0.9]], dtype=torch.float64))
        logp = (logp_old + torch.tensor([[2.5, 0.1, -0.05]], dtype=torch.float64)).requires_grad_()
        adv = torch.tensor([[1.0, 1.0, -1.0]], dtype=torch.float64)
        mask = torch.ones_like(adv)
        loss, metrics = policy_loss(logp_old, logp, adv, mask, cfg, precompute_band(logp_old, cfg))
        loss.backward()
        print(json.dumps({
            "import_only": import_only, "type": type(lo).__name__,
            "err": float(max(np.abs(lo.numpy() / ref[0] - 1).max(),
                             np.abs(hi.numpy() / ref[1] - 1).max())),
            "loss": float(loss), "grad": logp.grad[0].tolist()}))
    """)
    assert got["import_only"] == []
    assert got["type"] == "Tensor" and got["err"] < 1e-12
    assert abs(got["loss"]) < 10 and all(abs(g) < 10 for g in got["grad"])
    # the first token's ratio exp(2.5) is far above its band's upper edge: clipped, no gradient
    assert got["grad"][0] == 0.0 and got["grad"][1] != 0.0


@pytest.mark.slow
def test_an_extra_is_added_by_name_to_an_installed_fbands(torch_env):
    """What the install page says: fbands is not on PyPI, but once installed (here from the
    wheel) ``pip install "fbands[EXTRA]"`` adds an extra by name, as the error messages
    suggest; pip reads the extras from the installed copy."""
    _pip(torch_env["python"], "fbands[plot]", TORCH)
    got = _check(torch_env, """
        import json, fbands.plotting, matplotlib
        fbands.plotting.plot_bands(["kl"], 0.05, "band.png")
        print(json.dumps({"fbands": fbands.__version__}))
    """)
    assert got["fbands"] == fbands.__version__ and (torch_env["work"] / "band.png").exists()


def test_the_install_page_names_the_wheel_it_builds():
    """The install page's wheel command names this version's file."""
    text = (ROOT / "docs" / "install.md").read_text()
    assert f"dist/fbands-{fbands.__version__}-py3-none-any.whl" in text


@pytest.mark.parametrize("extra, package", [("trl", "trl"), ("verl", "verl")])
def test_version_check_covers_the_ends_of_each_plugin_range(extra, package):
    """scripts/check_versions.sh tests the oldest and newest release the extra allows."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.version import Version

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"][extra]
    (spec,) = [Requirement(r).specifier for r in extras if Requirement(r).name == package]
    script = (ROOT / "scripts" / "check_versions.sh").read_text()
    oldest, newest = (Version(re.search(rf"^{package.upper()}_{end}=(\S+)", script, re.M)[1])
                      for end in ("OLDEST", "NEWEST"))
    assert oldest in spec and newest in spec
    floors = [Version(s.version) for s in spec if s.operator == ">="]
    assert floors == [oldest], "the floor of the range is the oldest release tested"


def test_the_torch_floor_has_what_the_code_calls():
    """torch.nonzero_static has a CUDA kernel from torch 2.6 only: with a lower floor the
    sync-free device path raised NotImplementedError on 2.3-2.5 (issue 40)."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    (spec,) = [s for s in extras["torch"] if s.startswith("torch")]
    floor = tuple(int(x) for x in re.match(r"torch>=(\d+)\.(\d+)", spec).groups())
    sources = "".join(p.read_text() for p in (ROOT / "fbands").rglob("*.py"))
    if "nonzero_static" in sources:
        assert floor >= (2, 6), spec
