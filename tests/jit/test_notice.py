"""The notice of slow first-time work: numba compiling fbands' kernels, once per machine."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

numba = pytest.importorskip("numba")

import fbands  # noqa: E402
from fbands._jit import loader  # noqa: E402  (registers the compile listener)

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, env: dict | None = None, timeout: float = 300):
    environ = {k: v for k, v in os.environ.items() if k != "FBANDS_QUIET"}
    environ.update(env or {})
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, cwd=ROOT, env=environ, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done


def test_a_notice_reaches_a_plain_user_and_can_be_silenced():
    out = _python("""
        import contextlib, io, json, logging, os
        from fbands._notice import LOGGER, notice

        def seen():
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                notice("compiling something")
            return err.getvalue()

        got = {"plain": seen()}
        os.environ["FBANDS_QUIET"] = "1"
        got["quiet"] = seen()
        del os.environ["FBANDS_QUIET"]
        LOGGER.setLevel(logging.WARNING)
        got["warning level"] = seen()
        LOGGER.setLevel(logging.NOTSET)
        err = io.StringIO()
        logging.basicConfig(stream=err, level=logging.INFO)
        notice("compiling something")
        got["logging set up"] = err.getvalue()
        print(json.dumps(got))
    """).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got == {"plain": "fbands: compiling something\n", "quiet": "", "warning level": "",
                   "logging set up": "INFO:fbands:compiling something\n"}


def _jitted(module: str):
    def f(x):
        return x + 1.0

    f.__module__ = module
    return numba.njit(f)


@pytest.fixture
def listener():
    """A fresh compile listener in place of the process's (which may have spoken already)."""
    from numba.core import event

    fresh = loader._CompileListener()
    event.unregister("numba:compile", loader.LISTENER)
    event.register("numba:compile", fresh)
    try:
        yield fresh
    finally:
        event.unregister("numba:compile", fresh)
        event.register("numba:compile", loader.LISTENER)


def test_a_compile_of_fbands_code_gives_one_notice_per_process(listener, caplog):
    caplog.set_level(logging.INFO, logger="fbands")
    _jitted("fbands._jit.table_kernels")(1.0)
    _jitted("fbands._jit.table_kernels")(2.0)  # the same kernels again: no second notice
    _jitted("someone_else")(1.0)  # not fbands' code: none
    notes = [r.getMessage() for r in caplog.records if r.name == "fbands"]
    assert notes == ["compiling the numba kernels of the band tables, once per machine (later "
                     "runs load them from the disk cache): this may take a minute"]
    assert listener.depth == 0


def test_the_notice_names_the_divergence():
    kl = fbands.get("kl")
    package = loader._package_name(kl, loader.package_files(kl))
    assert "of divergence 'kl'," in loader.compile_notice(f"{package}.scalar")
    assert loader.compile_notice("someone_else") is None


@pytest.mark.slow
def test_the_first_process_of_a_machine_says_it_compiles_the_next_is_silent(tmp_path):
    env = {"FBANDS_CACHE_DIR": str(tmp_path / "fbands"), "NUMBA_CACHE_DIR": str(tmp_path / "nb")}
    code = """
        import numpy as np, fbands
        fbands.bounds(np.array([0.01, 0.5]), np.full(2, 0.05), "kl", backend="numba")
    """  # (a radius per element: the divergence's own kernels, not only the tables')
    first = _python(code, env).stderr.strip().splitlines()
    assert len(first) == 1 and first[0].startswith("fbands: compiling the numba kernels of "
                                                   "divergence 'kl', once per machine"), first
    assert _python(code, env).stderr == ""
