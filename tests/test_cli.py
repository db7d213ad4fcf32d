from __future__ import annotations

import numpy as np

import fbands
from fbands.cli import main


def test_divergences_lists_the_registry(capsys):
    assert main(["divergences"]) == 0
    out = capsys.readouterr().out
    for name in ("kl", "reverse_kl", "tv", "chi2", "neyman_chi2", "hellinger", "js", "alpha"):
        assert name in out
    assert "yes" in out and "no" in out  # closed form or not


def test_bounds_prints_a_table(capsys):
    assert main(["bounds", "--div", "kl", "--delta", "0.05", "0.01", "0.1", "0.5"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 5
    row = lines[2].split()
    lo, hi = fbands.bounds(0.01, 0.05, "kl")
    assert float(row[1]) == np.float64(f"{lo:.10g}") and float(row[2]) == float(f"{hi:.10g}")


def test_plot_writes_a_png(tmp_path):
    out = tmp_path / "band.png"
    assert main(["plot", "--div", "kl,tv,chi2", "--delta", "0.05", "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
