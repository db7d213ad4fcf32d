"""numba's cache files fail soft (fbands/_jit/disk_cache.py; issue 27, F12 and F13).

A damaged, truncated, garbled or unreadable ``.nbi`` / ``.nbc`` file costs one compile, and
the call after it loads again; a cache on a full disk (here: a file size limit) costs
nothing but the storing, and leaves no temporary file behind.  Each case runs in fresh
processes on a cache directory of its own, so these tests are slow.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

_CALL = """
import numpy as np, fbands
{setup}
lo, hi = fbands.bounds(np.array([0.1, 0.5, 0.999]), np.full(3, 0.05), {div!r},
                       backend="numba")  # (a radius per element: the divergence's kernels)
print(repr(lo.tolist()), repr(hi.tolist()))
"""


def _run(cache: Path, div: str = "kl", setup: str = "", limit_bytes: int | None = None):
    env = {**os.environ, "FBANDS_CACHE_DIR": str(cache)}

    def limit():  # a file size limit: writes past it fail with EFBIG (SIGXFSZ is ignored)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    proc = subprocess.run([sys.executable, "-c", _CALL.format(setup=setup, div=div)],
                          cwd=ROOT, env=env, capture_output=True, text=True,
                          preexec_fn=limit if limit_bytes else None)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def _numba_files(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "numba").rglob("*") if p.suffix in (".nbi", ".nbc"))


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A cache that holds KL's compiled kernels, and the answer they give."""
    cache = tmp_path_factory.mktemp("warm") / "cache"
    answer = _run(cache)
    assert _numba_files(cache)
    return cache, answer


def _truncate(path: Path):
    path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 2)])


def _zero(path: Path):
    path.write_bytes(b"\0" * path.stat().st_size)


def _garble(path: Path):
    data = bytearray(path.read_bytes())
    rng = np.random.default_rng(len(data))
    for i in rng.integers(0, len(data), 1 + len(data) // 50):
        data[i] ^= 0xA5
    path.write_bytes(bytes(data))


def _unreadable(path: Path):
    path.chmod(0)


DAMAGE = {"truncated": _truncate, "zeroed": _zero, "garbled": _garble, "empty":
          lambda p: p.write_bytes(b""), "unreadable": _unreadable}


@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_numba_cache_files_cost_a_compile_not_a_call(warm, tmp_path, how):
    if how == "unreadable" and os.geteuid() == 0:
        pytest.skip("root reads a file of mode 000")
    cache, answer = warm
    mine = tmp_path / "cache"
    shutil.copytree(cache, mine)
    files = _numba_files(mine)
    for path in files:
        DAMAGE[how](path)
    try:
        assert _run(mine) == answer  # compiles afresh, and stores over the damaged files
        assert _run(mine) == answer  # loads what the call before stored
        for path in _numba_files(mine):
            assert os.access(path, os.R_OK)
    finally:
        for path in files:
            if path.exists():
                path.chmod(0o600)


def test_a_cache_that_cannot_be_written_costs_nothing_but_the_storing(tmp_path):
    cache = tmp_path / "cache"
    setup = 'fbands.register("fsize_limited", "(u - 1)**2 / (u + 2)")'
    free = _run(tmp_path / "free", "fsize_limited", setup)
    # a limit that the package's sources (copied beside the leaves) pass, and the machine
    # code does not
    limit = max(p.stat().st_size for p in (ROOT / "fbands" / "_jit").glob("*.py")) + 8192
    assert _run(cache, "fsize_limited", setup, limit_bytes=limit) == free
    left = [p for p in cache.rglob("*") if ".tmp" in p.name]
    assert not left
