"""benchmarks/gpu_check.py: it runs on the lent GPU machine's own packages, and, shrunk
(``--tiny``), on a CPU, where it goes through every section's code."""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
#: what the GPU machine has: its python3's standard library and these packages
ALLOWED = set(sys.stdlib_module_names) | {"numpy", "torch", "sympy", "numba", "transformers",
                                          "fbands"}
SECTIONS = {"accuracy", "syncs", "sync_free", "throughput", "loss_step", "compiled"}


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of its code (absolute imports)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def _module_file(name: str) -> Path | None:
    """The file of the fbands module ``name`` in this checkout (None: not a module, e.g. a
    function imported from one)."""
    path = ROOT.joinpath(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def test_the_script_imports_only_what_the_gpu_machine_has():
    names = _imports(SCRIPT)
    outside = sorted(n for n in names if n.split(".")[0] not in ALLOWED)
    assert outside == [], f"gpu_check.py imports {outside}, which the GPU machine lacks"
    assert not any(n.split(".")[0] in ("tests", "benchmarks") for n in names)


def test_the_files_the_script_imports_travel_with_the_tree():
    """Every fbands module it names exists here and is not ignored by git (a run on the
    device machine carries the working tree without its ignored files)."""
    modules = sorted(n for n in _imports(SCRIPT) if n.split(".")[0] == "fbands")
    files = [f for f in map(_module_file, modules) if f is not None]
    assert {"fbands/__init__.py", "fbands/_dispatch.py", "fbands/losses/__init__.py"} <= {
        str(f.relative_to(ROOT)) for f in files}
    if shutil.which("git") and (ROOT / ".git").exists():
        for f in files + [SCRIPT]:
            ignored = subprocess.run(["git", "check-ignore", "-q", str(f)], cwd=ROOT)
            assert ignored.returncode == 1, f"{f} is ignored by git"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_model_has_smollm2_135m_shape(gpu_check):
    """134,515,008 parameters: embeddings 49152 x 576 (tied to the output layer) and 30
    layers of attention (9 query heads, 3 key/value heads of 64) and MLP 1536."""
    pytest.importorskip("transformers")
    model, shape = gpu_check.build_model("meta", tiny=False)
    assert shape["num_hidden_layers"] == 30 and shape["hidden_size"] == 576
    assert sum(t.numel() for t in model.parameters()) == 134_515_008
    assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compare_counts_ulps_and_differences(gpu_check, dtype):
    dt = getattr(torch, dtype)
    ref = np.array([1.0, 0.5, 1e-30, np.inf, -2.0, np.nan])
    got = torch.tensor(ref).to(dt)
    got[1] = torch.nextafter(got[1], torch.tensor(1.0, dtype=dt))  # one ulp up
    got[4] = torch.nextafter(torch.nextafter(got[4], torch.tensor(0.0, dtype=dt)),
                             torch.tensor(0.0, dtype=dt))  # two ulps towards 0
    out = gpu_check.compare(got, ref, torch.tensor(ref).to(dt))
    assert out["max_ulp"] == 2 and out["differ_from_ref"] == 2 and out["differ_from_cpu"] == 2
    eps = torch.finfo(dt).eps
    assert out["max_rel_err"] == pytest.approx(eps, rel=1e-6)


@pytest.mark.slow
def test_the_script_runs_shrunk_on_a_cpu(tmp_path):
    """``--tiny`` end to end in a plain environment: exit 0, at most 8 files, every section
    present with values that make sense."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR", "FBANDS_CACHE_DIR")
           if k in os.environ}
    env["PYTHONPATH"] = "."
    out = tmp_path / "gc"
    done = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == ["gpu_check.json", "gpu_check.log", "gpu_check.md"]
    report = json.loads((out / "gpu_check.json").read_text())
    s = report["sections"]
    assert set(s) == SECTIONS
    for name, section in s.items():
        assert "error" not in section and "skipped" not in section, (name, section)
    cuda = report["environment"]["device"] != "cpu"

    acc = s["accuracy"]
    # divergences x calls x dtypes x paths, and the grid for log_bounds of float32 and bf16
    assert len(acc["rows"]) == 8 * 2 * 3 * 2 + 8 * 2
    assert {r["div"] for r in acc["rows"]} == set(
        ["kl", "reverse_kl", "tv", "chi2", "neyman_chi2", "hellinger", "js", "alpha(a=0.5)"])
    assert {r["path"] for r in acc["rows"]} == {"device-grid", "device-closed", "device-table",
                                                "device-solver"}
    for r in acc["rows"]:
        assert r["ok"], r
        if r["dtype"] == "float64":
            assert r["max_rel_err"] <= (1e-11 if cuda else 1e-12), r
        else:  # a few ulps of the correctly rounded edge
            assert r["max_ulp"] <= 4, r
            assert r["max_rel_err"] <= 4 * torch.finfo(getattr(torch, r["dtype"])).eps, r
        if acc["cpu_reference_is_same_device"]:
            assert r["differ_from_cpu"] == 0, r

    syncs = {r["case"]: r for r in s["syncs"]["rows"]}
    assert len(syncs) == 12
    for case, r in syncs.items():
        if case.startswith("sync-free") or case.startswith("policy_loss"):
            assert r["waiting_ops"] == 0 and r["required_on_cuda"] == 0, r
        if cuda and r["required_on_cuda"] is not None:
            assert r["cuda_sync_warnings"] <= r["required_on_cuda"], r

    caps = {r["capacity"]: r for r in s["sync_free"]["small_capacity"]}
    assert caps[64]["nan_edges"] > 0 and caps["default"]["nan_edges"] == 0
    assert all(r["ok"] for r in caps.values())

    rows = s["throughput"]["rows"]
    assert {(r["div"], r["call"]) for r in rows} == {
        (d, c) for d in ("kl", "tv") for c in ("bounds", "log_bounds")}
    for r in rows:
        for key in ("copy_ns_per_token", "eager_ns_per_token", "eager_copy_over_band"):
            assert 0 < r[key] < math.inf, r

    step = s["loss_step"]
    assert step["parameters"] > 0 and step["response_tokens"] > 0
    for pattern in ("per_batch", "verl"):
        r = step[pattern]
        assert 0 < r["clip_s"] < 60 and 0 < r["band_kl_s"] < 60, r
        assert 0 < r["band_over_clip"] < math.inf
    assert step["precompute_band_s"] > 0

    compiled = s["compiled"]["rows"]
    assert compiled
    for r in compiled:
        assert r["result"] == "compiled" or r["result"].startswith("did not compile"), r
        if r["result"] == "compiled":
            assert r["compiled_ns_per_token"] > 0 and r["max_rel_diff_to_eager"] <= 1e-5

    md = (out / "gpu_check.md").read_text()
    for heading in ("## Accuracy", "## Host synchronisations", "## Sync-free path",
                    "## Band throughput", "## Training step"):
        assert heading in md
    assert "done in" in (out / "gpu_check.log").read_text()
