"""The docs' code runs as pasted (issue 26): the README's quick tour and every python block of
docs/tutorial.md, top to bottom in one namespace, and the verl guide's Hydra overrides of a
divergence with parentheses."""

from __future__ import annotations

import doctest
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# A fenced block: ```python (code) or ```{doctest} (a ">>>" session, as Sphinx runs it).
FENCE = re.compile(r"^```(python|\{doctest\})\n(.*?)^```", re.S | re.M)
# Blocks that cannot run here, by a piece of their text -> why.  Each entry must match a
# block (so that a skip cannot outlive its block); none today.
SKIPS: dict[str, str] = {
    # "device=\"cuda\"": "needs a GPU",
    # "from_pretrained(": "downloads a model from the network",
}


def blocks(text: str) -> list[tuple[str, str, int]]:
    """``(kind, code, line)`` of each python or doctest block of ``text``, in order."""
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start(2)) + 1)
            for m in FENCE.finditer(text)]


def section(path: Path, heading: str) -> str:
    """The text of ``heading``'s section (up to the next heading of its level)."""
    text = path.read_text()
    start = text.index(heading + "\n")
    end = text.find("\n" + heading.split(" ")[0] + " ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def run_blocks(found, name: str, namespace: dict) -> int:
    """Execute the blocks in order in ``namespace``; a doctest block's output must match.
    Returns how many ran."""
    ran = 0
    for kind, code, line in found:
        reason = next((why for key, why in SKIPS.items() if key in code), None)
        if reason is not None:
            continue
        if kind == "python":
            exec(compile("\n" * (line - 1) + code, name, "exec"), namespace)
        else:
            report: list[str] = []
            test = doctest.DocTestParser().get_doctest(code, namespace, name, name, line - 1)
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
            runner.run(test, out=report.append, clear_globs=False)
            assert runner.failures == 0, "".join(report)
            namespace.update(test.globs)  # (a DocTest works on a copy of its globals)
        ran += 1
    return ran


def test_skips_name_existing_blocks():
    texts = (ROOT / "README.md").read_text() + (ROOT / "docs" / "tutorial.md").read_text()
    for key in SKIPS:
        assert key in texts, f"SKIPS entry {key!r} matches no block"


def test_readme_quick_tour_runs_as_pasted(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("cvxpy")  # reference_band; the README says so
    monkeypatch.chdir(tmp_path)
    tour = section(ROOT / "README.md", "## Quick tour")
    assert '".[torch,cvxpy]"' in tour  # the extras it needs are named
    found = blocks(tour)
    assert [kind for kind, _, _ in found] == ["python", "python"]
    namespace: dict = {}
    assert run_blocks(found, "README.md", namespace) == 2
    assert namespace["loss"].ndim == 0 and namespace["logp"].grad is not None
    assert "triangular" in namespace["fbands"].available()


def test_tutorial_python_blocks_run_as_pasted(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    text = (ROOT / "docs" / "tutorial.md").read_text()
    found = blocks(text)
    assert len(found) >= 4  # three doctest sessions in step 2, the plot of step 3
    assert run_blocks(found, "docs/tutorial.md", {}) == len(found)
    assert (tmp_path / "band.png").exists() and (tmp_path / "gain.png").exists()


def test_tutorial_installs_torch_before_it_is_used():
    text = (ROOT / "docs" / "tutorial.md").read_text()
    install = text[text.index("## 1. Install"):text.index("## 2.")]
    first = install.index("```bash")
    assert re.search(r'pip install "(fbands|\.)\[[^"]*torch', install[first:]), install
    assert text.index("import torch") > text.index("## 2.")


def test_trl_guide_preset_block_runs(tmp_path, monkeypatch, capsys):
    pytest.importorskip("trl")
    monkeypatch.chdir(tmp_path)
    found = blocks(section(ROOT / "docs" / "guides" / "trl.md", "## One name per loss"))
    assert len(found) == 1
    run_blocks(found, "docs/guides/trl.md", {})
    assert capsys.readouterr().out.split()[-3:] == ["kl", "0.1", "0.28"]


def test_verl_guide_alpha_override_composes_through_hydra():
    """Every override of the verl guide with parentheses is quoted for Hydra inside quotes for
    the shell, and composes (unquoted, Hydra fails: ``Unknown function 'alpha'``)."""
    pytest.importorskip("verl")
    import fbands
    from fbands.integrations import verl as fv

    from ..integrations.test_verl import BAND_OVERRIDES, verl_actor

    guide = (ROOT / "docs" / "guides" / "verl.md").read_text()
    quoted = re.findall(r'`("\+actor_rollout_ref[^`]*\(.*?)`', guide)
    assert len(quoted) >= 2
    for text in quoted:
        (override,) = shlex.split(text)  # what the shell hands to Hydra
        value = override.split("=", 1)[1]
        assert value.startswith("'") and value.endswith("'"), text
    assert not re.search(r"[+.]div=alpha\(", guide)  # an unquoted alpha member

    div = "\"+actor_rollout_ref.actor.policy_loss.div='alpha(0.5)'\""
    assert div in guide
    actor = verl_actor(*BAND_OVERRIDES[:2], *shlex.split(div))
    cfg = fv.loss_config(actor.policy_loss, actor)
    assert cfg.div == "alpha(0.5)"
    assert fbands.get(cfg.div).name == fbands.get("alpha(a=0.5)").name == "alpha(a=1/2)"

    preset = "\"+actor_rollout_ref.actor.policy_loss.preset='band-alpha(a=0.5)'\""
    assert preset in guide
    actor = verl_actor(BAND_OVERRIDES[0], "actor_rollout_ref.actor.policy_loss.loss_mode=fbands",
                       *shlex.split(preset))
    cfg = fv.loss_config(actor.policy_loss, actor)
    assert (cfg.method, cfg.delta, fbands.get(cfg.div).name) == ("band_clip", 0.05,
                                                                  "alpha(a=1/2)")


def test_the_readme_shows_the_demo_table_of_a_committed_run():
    """issue 26, item 6: the README's demo table is the command's own output, verbatim, from
    the run kept in benchmarks/results/demo.txt, with the columns the demo prints."""
    from fbands.rl.compare import format_table

    kept = (ROOT / "benchmarks" / "results" / "demo.txt").read_text().rstrip("\n")
    assert kept in (ROOT / "README.md").read_text()
    header = format_table(["clip"], [{k: 0.0 for k in _summary_keys()}]).splitlines()[0]
    assert kept.splitlines()[0] == header


def _summary_keys():
    from fbands.rl.compare import summarize

    row = {"step": 1, "reward": 0.5, "accuracy": 0.5, "p_correct": 0.5, "entropy": 0.5,
           "band/tail_clipfrac_upper": 0.1, "tokens_per_s": 100.0}
    return list(summarize([row]))
