"""No call waits on a compile it did not ask for (issue 42, first contact).

``backend="auto"`` sends a large array to numba only once the kernels of its divergence and
dtype were compiled ahead (``fbands.precompile`` / ``fbands compile``); before that the numpy
solver answers at once.  Each process below starts on an empty cache, so what it compiles
is what a new machine would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fbands
from fbands.errors import BandError, DivergenceError

ROOT = Path(__file__).resolve().parents[2]

#: Prints, as JSON: the plan of a 2^17-element call, how many numba compiles it started,
#: its result's hash and that of the same call on the backend named in argv[1].
CALL = """
import hashlib, json, sys
import numpy as np
from numba.core import event
import fbands
from fbands._dispatch import plan

compiles = []
class Count(event.Listener):
    def on_start(self, ev): compiles.append(1)
    def on_end(self, ev): pass
event.register("numba:compile", Count())

rng = np.random.default_rng(1)
x = np.clip(np.exp(-rng.exponential(1.5, 1 << 17) ** 2), 1e-8, 1.0)
chosen = plan(fbands.get("kl"), x, 0.05, logp=False, log=False)
digest = lambda edges: hashlib.sha256(np.stack(edges).tobytes()).hexdigest()
auto = digest(fbands.bounds(x, 0.05))
n = len(compiles)
other = digest(fbands.bounds(x, 0.05, backend=sys.argv[1]))
print(json.dumps({"backend": chosen.backend, "compiles": n, "auto": auto, "other": other}))
"""


def _run(args, cache: Path, timeout: float = 600):
    env = {k: v for k, v in os.environ.items() if k != "FBANDS_QUIET"}
    env["FBANDS_CACHE_DIR"] = str(cache)
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.slow
def test_auto_compiles_nothing_until_the_kernels_are_compiled_ahead(tmp_path):
    cache = tmp_path / "cache"
    before = _run(["-c", CALL, "numpy"], cache)
    got = json.loads(before.stdout)
    assert got["backend"] == "numpy" and got["compiles"] == 0
    assert got["auto"] == got["other"]  # the numpy solver's bits
    assert "compiling" not in before.stderr

    ahead = _run(["-m", "fbands", "compile", "--div", "kl", "--dtype", "float64"], cache)
    assert ahead.stdout.startswith("kl  float64  ready (")
    assert "precompile 1/1: the numba kernels of 'kl' for float64 arrays" in ahead.stderr

    after = _run(["-c", CALL, "numba"], cache)
    got = json.loads(after.stdout)
    assert got["backend"] == "numba" and got["compiles"] == 0, after.stderr
    assert got["auto"] == got["other"]  # the numba backend's bits
    assert "compiling" not in after.stderr
    # float32 was not compiled ahead: still the numpy solver
    code = ("import numpy as np, fbands; from fbands._dispatch import plan; "
            "print(plan(fbands.get('kl'), np.full(1 << 17, 0.5, np.float32), 0.05, "
            "logp=False, log=False).backend)")
    assert _run(["-c", code], cache).stdout.strip() == "numpy"


def test_precompile_refuses_what_it_cannot_compile():
    with pytest.raises(BandError, match="'float16' is not one of"):
        fbands.precompile("kl", "float16")
    with pytest.raises(DivergenceError, match="unknown divergence"):
        fbands.precompile("kll")


def test_fbands_compile_refuses_a_generator_and_says_why(capsys):
    from fbands.cli import main

    assert main(["compile", "--div", "(u-1)**2/(u+1)"]) == 2
    err = capsys.readouterr().err
    assert "fbands.precompile(name) after fbands.register(name, ...)" in err
    with pytest.raises(SystemExit):
        main(["compile", "--dtype", "float16"])


def test_precompile_marks_every_pair_ready(monkeypatch):
    """Each (divergence, dtype) pair is compiled by the backend and reported, in order."""
    from fbands._jit import backend

    seen = []
    monkeypatch.setattr(backend, "precompile", lambda div, t: seen.append((div.name, t)))
    done = fbands.precompile(["kl", "alpha(a=0.5)"])
    assert seen == [("kl", "float32"), ("kl", "float64"),
                    ("alpha(a=1/2)", "float32"), ("alpha(a=1/2)", "float64")]
    assert [(d, t) for d, t, _ in done] == seen
    assert all(np.isfinite(s) and s >= 0 for _, _, s in done)
    seen.clear()
    fbands.precompile()  # every divergence registered by name
    assert {d for d, _ in seen} >= {"kl", "tv", "chi2", "js"}
    assert not any(d == "alpha" for d, _ in seen)


def test_the_cli_compile_help_names_the_defaults():
    done = subprocess.run([sys.executable, "-m", "fbands", "compile", "--help"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0
    assert "every built-in" in " ".join(done.stdout.split())

