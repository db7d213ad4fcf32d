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


def test_bounds_computes_edges_and_logs_on_the_chosen_backend(capsys, monkeypatch):
    import fbands.bands as bands

    used = []
    for name in ("bounds", "log_bounds"):
        real = getattr(bands, name)

        def spy(*args, real=real, name=name, **kwargs):
            used.append((name, args[3] if len(args) > 3 else kwargs.get("backend", "auto")))
            return real(*args, **kwargs)

        monkeypatch.setattr(fbands, name, spy)
    assert main(["bounds", "--backend", "numba", "--format", "csv", "0.2", "0.7"]) == 0
    assert used == [("bounds", "numba"), ("log_bounds", "numba")]
    rows = [line.split(",") for line in capsys.readouterr().out.splitlines()[1:]]
    lo, hi = fbands.log_bounds(np.array([0.2, 0.7]), 0.05, "kl", backend="numpy")
    np.testing.assert_allclose([float(r[5]) for r in rows], lo, rtol=1e-13)
    np.testing.assert_allclose([float(r[6]) for r in rows], hi, rtol=1e-13)


def test_plot_writes_a_png(tmp_path):
    out = tmp_path / "band.png"
    assert main(["plot", "--div", "kl,tv,chi2", "--delta", "0.05", "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- errors: one line, exit code 2, never a traceback; payloads never run (issue 19) ---------
PAYLOAD = "alpha(a=(__import__('os').system('touch {marker}') or 2))"


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("fbands: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_bounds_input_errors_are_one_line(capsys):
    cases = [
        (["bounds", "2.0"], "2.0"),
        (["bounds", "0.5", "--delta", "nan"], "delta"),
        (["bounds", "0.5", "--div", "nope"], "nope"),
        (["bounds", "0.5", "--backend", "nope"], "nope"),
        (["bounds", "0.5", "--logp"], "0.5"),
        (["bounds", "0.5", "--div", "alpha(a=1e400)"], "1e400"),
    ]
    for argv, fragment in cases:
        assert main(argv) == 2, argv
        assert fragment in one_line_error(capsys), argv


def test_plot_input_errors_are_one_line(tmp_path, capsys):
    out = tmp_path / "band.png"
    for div in ("nope", ",", "kl,nope"):
        assert main(["plot", "--div", div, "-o", str(out)]) == 2, div
        one_line_error(capsys)
    assert not out.exists()
    assert main(["plot", "--div", "tv", "-o", str(tmp_path / "no" / "such" / "x.png")]) == 1
    assert "x.png" in one_line_error(capsys)


def test_divergence_payloads_do_not_run_from_the_command_line(tmp_path, capsys):
    marker = tmp_path / "PWNED"
    payloads = [PAYLOAD.format(marker=marker), f"__import__('os').system('touch {marker}')"]
    for spec in payloads:
        assert main(["bounds", "0.5", "--div", spec]) == 2
        one_line_error(capsys)
        assert main(["plot", "--div", spec, "-o", str(tmp_path / "p.png")]) == 2
        one_line_error(capsys)
    assert not marker.exists()
