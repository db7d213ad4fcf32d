"""The public API is typed (``py.typed``): a type checker sees what ``bounds`` returns for
each kind of input, and refuses a backend that does not exist (issue 42, first contact)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

USER_CODE = """
import numpy as np
import torch
import fbands

a = fbands.bounds(0.1, 0.05)
b = fbands.bounds(np.array([0.1]), 0.05, "kl", backend="numba")
c = fbands.log_bounds(torch.tensor([-1.0]), 0.05, logp=True)
d = fbands.bounds(0.1, [0.05, 0.1])
reveal_type(a)
reveal_type(b)
reveal_type(c)
reveal_type(d)
fbands.bounds(0.1, 0.05, backend="jax")
"""


def test_the_package_is_marked_typed():
    assert (ROOT / "fbands" / "py.typed").is_file()
    assert '"py.typed"' in (ROOT / "pyproject.toml").read_text()


@pytest.mark.slow
def test_a_type_checker_sees_the_result_types(tmp_path):
    pytest.importorskip("mypy")
    (tmp_path / "use.py").write_text(USER_CODE)
    out = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary",
                          "--follow-imports=silent", "--ignore-missing-imports",
                          "--cache-dir", str(tmp_path / "cache"), "use.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         # (an editable install is an import hook that mypy cannot follow)
                         env={**os.environ, "MYPYPATH": str(ROOT)})
    revealed = re.findall(r'use\.py:(\d+): note: Revealed type is "(.*)"', out.stdout)
    kinds = [("float" if t.replace("builtins.", "") == "tuple[float, float]" else
              "tensor" if "Tensor" in t else "ndarray" if "ndarray" in t else t)
             for _, t in revealed]
    assert kinds == ["float", "ndarray", "tensor", "ndarray"], out.stdout
    assert re.search(r'use\.py:14: error: No overload variant of "bounds"', out.stdout), \
        out.stdout
