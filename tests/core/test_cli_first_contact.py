"""The command line at first contact: every mistake is one line that names the fix, exit 2.

The walk runs every sub-command in a subprocess where the extras are missing (the
``import`` of each raises ``ModuleNotFoundError``, as in ``pip install fbands``), numba too.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import fbands
from fbands.cli import main

ROOT = Path(__file__).resolve().parents[2]
#: what a core-only install lacks (numba is core, but blocked too: its absence is handled)
MISSING = ("torch", "matplotlib", "cvxpy", "scipy", "numba", "transformers", "tokenizers",
           "tqdm", "trl", "verl")

_WALK = """
    import contextlib, io, json, sys, traceback
    for name in {missing!r}:
        sys.modules[name] = None  # `import name` raises ModuleNotFoundError
    from fbands.cli import main
    results = []
    for argv in {cases!r}:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code
            except BaseException:
                code, err = "raised", io.StringIO(traceback.format_exc())
        results.append([argv, code, out.getvalue(), err.getvalue()])
    print(json.dumps(results))
"""


def _walk(cases: list[list[str]], tmp_path: Path) -> list:
    code = textwrap.dedent(_WALK.format(missing=MISSING, cases=cases))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_command_in_a_core_only_install(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5, "accuracy": 0.5}\n')
    t = str(tmp_path)
    needs = {  # argv -> the extra its message must name
        ("bounds", "--backend", "cvxpy", "0.1"): "cvxpy",
        ("bounds", "--backend", "torch", "0.1"): "torch",
        ("plot", "-o", f"{t}/b.png"): "plot",
        ("plot", "--compare-clip", "0.2", "-o", f"{t}/g.png"): "plot",
        ("train", "--steps", "1", "--run-dir", f"{t}/t"): "rl",
        ("demo", "--steps", "1", "--out", f"{t}/d"): "rl",
        ("compare", str(run), "--out", f"{t}/c.png"): "plot",
    }
    wrong = [  # a bad argument or value, per command
        ["divergences", "--bogus"], ["bounds"], ["bounds", "--format", "xml", "0.1"],
        ["bounds", "--delta", "x", "0.1"], ["bounds", "2.0"], ["bounds", "--div", "band-kl", "0.1"],
        ["bounds", "--backend", "numba", "0.1"], ["plot", "--delta", "x"],
        ["plot", "-o", f"{t}/b.xyz"], ["plot", "--div", "nope", "-o", f"{t}/b.png"],
        ["train", "--steps", "x"], ["demo", "--steps", "0"], ["demo", "--steps", "-3"],
        ["compare"], ["compare", f"{t}/no-run"], ["nope"], [],
    ]
    works = [["divergences", "--no-derive"], ["bounds", "0.1", "0.5"], ["--version"]]
    cases = [list(a) for a in needs] + wrong + works
    results = _walk(cases, tmp_path)
    for argv, code, _out, err in results:
        if argv in works:
            assert code == 0 and err == "", (argv, code, err)
            continue
        assert code == 2, (argv, code, err)
        assert "Traceback" not in err, (argv, err)
        assert err.startswith("fbands: error: ") and err.count("\n") == 1, (argv, err)
        extra = needs.get(tuple(argv))
        if extra is not None:
            assert err.rstrip().endswith(f'pip install "fbands[{extra}]"'), (argv, err)
    by_argv = {tuple(a): (out, err) for a, _, out, err in results}
    assert by_argv[("--version",)][0] == f"fbands {fbands.__version__}\n"
    assert by_argv[("bounds", "--backend", "numba", "0.1")][1].rstrip().endswith(
        "pip install numba")
    assert "see: fbands demo --help" in by_argv[("demo", "--steps", "0")][1]
    assert "'kl'" in by_argv[("bounds", "--div", "band-kl", "0.1")][1]
    assert not list(tmp_path.glob("*.png")) and not (tmp_path / "t").exists()


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"fbands {fbands.__version__}\n"


def _bounds_out(capsys, fmt: str, *args: str) -> str:
    assert main(["bounds", "--div", "tv", "--delta", "0.5", "--format", fmt, *args]) == 0
    return capsys.readouterr().out


def test_bounds_csv_and_json_give_the_exact_floats(capsys):
    p = [0.01, 0.3, 1e-9]
    lo, hi = fbands.bounds(np.array(p), 0.5, "tv", "numpy")
    llo, lhi = fbands.log_bounds(np.array(p), 0.5, "tv", "numpy")
    want = [list(map(float, row)) for row in zip(p, lo, hi, llo, lhi, strict=True)]
    rows = list(csv.DictReader(io.StringIO(_bounds_out(capsys, "csv", *map(str, p)))))
    keys = ("p", "lower", "upper", "log_lower", "log_upper")
    assert [[float(r[k]) for k in keys] for r in rows] == want  # bit for bit; -inf too
    assert {r["div"] for r in rows} == {"tv"} and {r["delta"] for r in rows} == {"0.5"}
    got = json.loads(_bounds_out(capsys, "json", *map(str, p)))
    assert got["div"] == "tv" and got["delta"] == 0.5
    assert [[r[k] for k in keys] for r in got["rows"]] == [
        [x if np.isfinite(x) else None for x in row] for row in want]


def test_bounds_table_is_the_default_with_one_number_format(capsys):
    args = ["--div", "kl", "0.01", "1e-9", "0.999"]
    assert main(["bounds", *args]) == 0
    default = capsys.readouterr().out
    assert main(["bounds", "--format", "table", *args]) == 0
    assert capsys.readouterr().out == default
    lines = default.strip().splitlines()
    assert lines[0] == "div=kl  delta=0.05" and lines[1].split()[:3] == ["p", "lower", "upper"]
    lo, hi = fbands.bounds(np.array([0.01, 1e-9, 0.999]), 0.05, "kl", "numpy")
    for line, a, b in zip(lines[2:], lo, hi, strict=True):
        cells = line.split()
        assert cells[1] == f"{a:.10g}" and cells[2] == f"{b:.10g}"
    assert "10 significant digits" in " ".join(_help(capsys, "bounds").split())


def _help(capsys, command: str) -> str:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return capsys.readouterr().out


def test_plot_help_shows_the_div_default(capsys):
    assert "(default: kl,tv,chi2)" in _help(capsys, "plot")


def test_plot_prints_the_path_it_wrote(tmp_path, capsys):
    assert main(["plot", "--div", "tv", "-o", str(tmp_path / "figure")]) == 0
    written = tmp_path / "figure.png"
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().err.strip() == f"wrote {written}"


def test_argument_errors_are_one_line(capsys):
    for argv in (["demo", "--steps", "0"], ["bounds", "--format", "xml", "0.5"],
                 ["plot", "-o", "x.nope"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("fbands: error: ") and err.count("\n") == 1, err
        assert f"(see: fbands {argv[0]} --help)" in err


_BAD_TRAIN_OPTIONS = """
import sys
from fbands.cli import main
code = main(["train", "--lr", "-1", "--run-dir", {run!r}])
print(code, sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""


def test_a_bad_train_option_is_reported_before_torch_loads(tmp_path):
    """A mistake in an option took seconds to report (torch and transformers loaded first);
    it is now found before either is imported, and nothing is written."""
    pytest.importorskip("torch")
    run = tmp_path / "run"
    out = subprocess.run([sys.executable, "-c", _BAD_TRAIN_OPTIONS.format(run=str(run))],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split("\n")[-2] == "2 []", out.stdout + out.stderr
    assert out.stderr.strip() == "fbands: error: lr=-1.0: must be a finite number > 0"
    assert not run.exists()


def test_div_takes_a_generator_as_well_as_a_name(capsys, tmp_path):
    """``fbands bounds --div "(u-1)**2/(u+1)"`` was refused ("a divergence spec starts with a
    name"); a generator is now read by the grammar and registered for the command."""
    expression = "(u-1)**2/(u+1)"
    assert main(["bounds", "--div", expression, "--format", "json", "0.01", "0.3"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["div"] == expression
    reference = fbands.register("cli_twin", expression)
    lo, hi = fbands.bounds(np.array([0.01, 0.3]), 0.05, reference, "numpy")
    assert [r["upper"] for r in got["rows"]] == hi.tolist()
    assert [r["lower"] for r in got["rows"]] == lo.tolist()
    for text, message in (("kll", "unknown divergence 'kll'"),
                          ("alpha(b=2)", "alpha takes parameters"),
                          ("(u-1)**3", "as a generator f(u): f: f is not convex"),
                          ("__import__('os')", "unexpected character"),
                          ("u.__class__", "as a generator f(u)")):
        assert main(["bounds", "--div", text, "0.1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("fbands: error: ") and message in err and err.count("\n") == 1
