"""The same input gives the same bits, whatever ran before (issue 27, part 1).

A radius's tables are built cell by cell on its first call and completed on its second,
stored on disk, and read back by later processes; none of that may change an answer.
Compared bitwise: a first call, a second call, four threads at once on a process that holds
nothing in memory, torch CPU tensors, and (slow) a cold and a warm process.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import fbands

pytest.importorskip("fbands._jit.backend")
from fbands.tables.cache import TABLES  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
#: KL (no closed form: root finding), TV (closed forms) and the user divergence of
#: tests/_user.py, registered under the same name in the child process below.
DIVERGENCES = ("kl", "tv", "triangular")
DELTA = 0.0517  # a radius no other test uses


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """Nothing in memory, an empty cache directory."""
    monkeypatch.setenv("FBANDS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(TABLES, "_sets", type(TABLES._sets)())
    monkeypatch.setattr(TABLES, "_derived", {})
    return tmp_path / "cache"


def _inputs(dtype: str) -> np.ndarray:
    """Probabilities over every binade from 1e-9 and up to 1 - 1e-9 (most cells, and the
    rows that read an exponential), as in the issue's reproducer."""
    rng = np.random.default_rng(0)
    p = np.concatenate((rng.uniform(1e-6, 1.0, 20_000),
                        np.exp(rng.uniform(np.log(1e-9), 0.0, 20_000)),
                        1.0 - np.exp(rng.uniform(np.log(1e-9), np.log(0.5), 5_000))))
    return p.astype(dtype)


def _calls(div: str, dtype: str):
    """The calls compared: ratios of p, and log-edges of log p."""
    p = _inputs(dtype)
    lp = np.log(p)
    return {"bounds": lambda: fbands.bounds(p, DELTA, div, backend="numba"),
            "log_bounds": lambda: fbands.log_bounds(lp, DELTA, div, backend="numba",
                                                    logp=True)}


def _digest(edges) -> str:
    h = hashlib.sha256()
    for e in edges:
        e = np.ascontiguousarray(np.asarray(e))
        h.update(str(e.dtype).encode())
        h.update(e.tobytes())
    return h.hexdigest()


def _same(a, b) -> bool:
    return all(x.dtype == y.dtype and x.tobytes() == y.tobytes()
               for x, y in zip(map(np.asarray, a), map(np.asarray, b), strict=True))


def _at_once(call, n: int = 4):
    """``call()`` from ``n`` threads released together."""
    barrier, out = threading.Barrier(n), [None] * n

    def run(i):
        barrier.wait()
        out[i] = call()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("div", DIVERGENCES)
def test_every_call_gives_the_same_bits(fresh, div, dtype, user_divergence):
    for name, call in _calls(div, dtype).items():
        TABLES.clear()
        first = call()  # a radius new to the process: the cells its data reaches (tables)
        assert _same(first, call()), name  # it comes back: complete tables, stored on disk
        assert _same(first, call()), name
        TABLES.clear()  # a new process's memory, with the tables on disk
        for got in _at_once(call):
            assert _same(first, got), name
        TABLES.clear()
        for got in _at_once(call):  # four first calls at once, then four second ones
            assert _same(first, got), name
        for got in _at_once(call):
            assert _same(first, got), name


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_torch_cpu_tensors_give_the_same_bits_every_call(fresh, dtype):
    torch = pytest.importorskip("torch")
    p = torch.from_numpy(_inputs(dtype))
    lp = torch.log(p)
    for call in (lambda: fbands.bounds(p, DELTA, "kl", backend="torch"),
                 lambda: fbands.log_bounds(lp, DELTA, "kl", backend="torch", logp=True),
                 lambda: fbands.bounds(p, DELTA, "tv", backend="torch")):  # (closed forms)
        TABLES.clear()
        first = [t.numpy().copy() for t in call()]
        for _ in range(2):
            assert _same(first, [t.numpy() for t in call()])
        TABLES.clear()
        for got in _at_once(call):
            assert _same(first, [t.numpy() for t in got])


_CHILD = """
import hashlib, json, sys
import numpy as np
sys.path.insert(0, {root!r})
import fbands
from tests.core import test_same_bits as t
from tests._user import TRIANGULAR
from fbands import divergences
divergences._REGISTRY["triangular"] = TRIANGULAR
out = {{}}
for div in t.DIVERGENCES:
    for dtype in ("float32", "float64"):
        for name, call in t._calls(div, dtype).items():
            out[f"{{div}} {{dtype}} {{name}}"] = [t._digest(call()), t._digest(call())]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_a_cold_and_a_warm_process_give_the_bits_of_this_one(fresh, user_divergence):
    """A process with an empty cache (compiling, building and storing) and one that reads
    what the first stored give, call for call, the bits this process computes."""
    env = {**os.environ, "FBANDS_CACHE_DIR": str(fresh)}
    runs = []
    for _ in ("cold", "warm"):
        proc = subprocess.run([sys.executable, "-c", _CHILD.format(root=str(ROOT))],
                              cwd=ROOT, env=env, capture_output=True, text=True, check=True)
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    for div in DIVERGENCES:
        for dtype in ("float32", "float64"):
            for name, call in _calls(div, dtype).items():
                TABLES.clear()
                here = _digest(call())
                for run in runs:
                    assert run[f"{div} {dtype} {name}"] == [here, here], (div, dtype, name)


def _bits_of_paths(div: str, dtype: str):
    p = _inputs(dtype)
    out = {"numpy": fbands.log_bounds(p, DELTA, div, backend="numpy"),
           "numba": fbands.log_bounds(p, DELTA, div, backend="numba")}
    torch = pytest.importorskip("torch")
    out["torch"] = tuple(t.numpy() for t in fbands.log_bounds(torch.from_numpy(p), DELTA, div))
    return p, out


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("div", DIVERGENCES)
def test_an_element_s_bits_depend_on_its_path_alone(div, dtype, user_divergence):
    """Issue 42, P17, the contract as stated: in each path an element gives the same bits
    alone as in any batch; the numba passes and the torch tables give numpy's edges to
    1e-12 (float64) or one ulp (float32), not its bits, so ``auto``, which picks a path by
    size, can give a token other bits in a large batch than alone."""
    p, out = _bits_of_paths(div, dtype)
    rng = np.random.default_rng(5)
    for i in rng.choice(p.size, 40, replace=False):
        for backend in ("numpy", "numba"):
            alone = fbands.log_bounds(p[i : i + 1], DELTA, div, backend=backend)
            assert _same(alone, tuple(e[i : i + 1] for e in out[backend])), (backend, i)
    eps = np.finfo(dtype).eps
    for backend in ("numba", "torch"):
        for got, want in zip(out[backend], out["numpy"], strict=True):
            finite = np.isfinite(want)
            assert (np.isfinite(got) == finite).all(), backend
            g, w = got[finite].astype(np.float64), want[finite].astype(np.float64)
            if dtype == "float32":
                bar = np.spacing(np.abs(w).astype(np.float32)).astype(np.float64)
            else:
                bar = 1e-12 * np.abs(w) + 4 * eps * np.maximum(np.abs(w), 1.0)
            assert (np.abs(g - w) <= bar).all(), (backend, np.max(np.abs(g - w) - bar))
