"""No host synchronisation on a training step's loss path (issue 40), checked on the CPU.

:class:`tests._sync.SyncDetector` records every aten op and flags those that make the host
wait for a CUDA device.  The loss paths run here on CPU tensors with ``check=False``, what
an accelerator gets by default (``check=None`` checks only CPU tensors), so that they take
the code path a GPU caller takes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fbands import losses as fl
from fbands.losses import aggregate as _aggregate
from fbands.losses import band as _band
from fbands.losses import checks as _checks
from fbands.losses import policy as _policy

from .._sync import SyncDetector


# --- the detector itself -------------------------------------------------------------------
@pytest.mark.parametrize("read", [
    pytest.param(lambda t: t[0].item(), id="item"),
    pytest.param(lambda t: bool(t[0]), id="bool"),
    pytest.param(lambda t: int(t[1]), id="int"),
    pytest.param(lambda t: float(t.sum()), id="float"),
    pytest.param(lambda t: t[t > 1], id="mask-index"),
    pytest.param(lambda t: t.clone().__setitem__(t > 1, 0.0), id="mask-assign"),
    pytest.param(lambda t: t.nonzero(), id="nonzero"),
    pytest.param(lambda t: torch.where(t > 1), id="where-one-arg"),
    pytest.param(lambda t: t.masked_select(t > 1), id="masked_select"),
    pytest.param(lambda t: t.unique(), id="unique"),
    pytest.param(lambda t: t.tolist(), id="tolist"),
    pytest.param(lambda t: t.numpy(), id="numpy"),
    pytest.param(lambda t: np.asarray(t), id="asarray"),
    pytest.param(lambda t: t.cpu(), id="cpu"),
    pytest.param(lambda t: torch.repeat_interleave(t, t.long()), id="repeat_interleave"),
    pytest.param(lambda t: (t > 1).any().item(), id="any-item"),
    pytest.param(lambda t: torch.equal(t, t), id="equal"),
])
def test_detector_flags_host_reads(read):
    t = torch.arange(4.0)
    with SyncDetector() as det:
        read(t)
    assert len(det.syncs) == 1, det.report()
    assert not det.syncs[0].in_fbands  # called from this file


def test_detector_passes_elementwise_and_static_ops():
    t = torch.arange(6.0).reshape(2, 3).requires_grad_()
    with SyncDetector() as det:
        y = torch.where(t > 1, t.exp(), torch.zeros_like(t)).clamp(max=3.0)
        z = y.sum(-1).log1p().amax() + torch.nonzero_static(t.detach() > 1, size=4).sum()
        z = z + torch.repeat_interleave(t.detach()[0], torch.tensor(2), output_size=6).sum()
        z = z + t.detach()[torch.tensor([0, 1])].sum() + t.detach()[:, 1:].sum()
        z.backward()
    assert det.syncs == [], det.report()
    assert det.op_count > 10
    assert det.counts()["aten.nonzero_static.default"] == 1


def test_detector_flags_uploads_and_restores_methods():
    before = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy", "cpu")}
    with SyncDetector() as det:
        torch.tensor([1.0, 2.0])
        torch.tensor(3.0)  # a 0-dim host scalar is not an upload (a CUDA op takes it as is)
    assert len(det.uploads) == 1 and det.syncs == []
    assert {name: getattr(torch.Tensor, name) for name in before} == before
    torch.arange(3.0).tolist()  # outside: not recorded
    assert det.syncs == []


def test_detector_names_the_fbands_caller():
    from fbands.losses.checks import validate

    t = torch.tensor([0.5, -1.0])
    with SyncDetector() as det:
        validate([(t > 1, t, "must be <= 1")])  # passes: one reduction read on the host
    assert len(det.syncs) == 1 and det.syncs[0].in_fbands
    assert "checks.py" in det.syncs[0].where and "validate" in det.syncs[0].where


def test_detector_on_a_meta_tensor_flags_no_copy():
    t = torch.ones(3, device="meta")
    with SyncDetector() as det:
        (t * 2).exp().to(torch.float64)
    assert det.syncs == [] and det.op_count == 3


# --- the accelerator's defaults, on the CPU -------------------------------------------------
def _resolve_as_on_a_device(check, *tensors):
    """``check=None`` resolved as for CUDA tensors (False); explicit values as given."""
    return False if check is None else _checks.resolve_check(check, *tensors)


@pytest.fixture
def accelerator(monkeypatch):
    """Run the losses' accelerator branches on CPU tensors: ``check=None`` means no check
    (``fbands.losses.checks.resolve_check`` for a CUDA tensor), and the band of a masked
    batch goes through ``fbands.log_bounds`` whole (``band._on_host`` is False for a CUDA
    tensor) instead of through numpy."""
    for module in (_band, _policy, _aggregate):
        monkeypatch.setattr(module, "resolve_check", _resolve_as_on_a_device)
    monkeypatch.setattr(_band, "_on_host", lambda x: False)


def _batch(seed=0, rows=4, cols=16):
    g = torch.Generator().manual_seed(seed)
    old = torch.log(torch.rand(rows, cols, generator=g) * 0.9 + 0.02)
    new = (old + 0.3 * torch.randn(rows, cols, generator=g)).clamp(max=0).requires_grad_()
    adv = torch.randn(rows, 1, generator=g)
    mask = torch.ones(rows, cols)
    mask[1, 10:] = 0
    mask[2, 3:] = 0
    return old, new, adv, mask


#: The presets of the brief, and the aten ops of policy_loss (forward, then with backward)
#: measured on torch 2.13: a bound with some room, so that a change that adds work shows.
LOSS_CONFIGS = {
    "clip": (fl.preset("clip"), 150, 173),
    "band-kl": (fl.preset("band-kl"), 150, 173),
    "band-mask-tv": (fl.preset("band-mask-tv"), 152, 166),
    "dcpo": (fl.preset("dcpo"), 152, 175),
    "cispo": (fl.preset("cispo"), 144, 156),
    "band-gppo-kl": (fl.preset("band-gppo-kl"), 156, 187),
    "soft-3seg": (fl.preset("band-kl", soft="3seg"), 221, 354),
}


def test_precompute_band_checks_by_default_only_on_the_cpu():
    old, _, _, mask = _batch()
    with SyncDetector() as det:
        fl.precompute_band(old, fl.preset("clip"), mask=mask)
    assert [f.where.split(":")[0].endswith("checks.py") for f in det.syncs] == [True]
    meta = torch.empty(4, 16, device="meta")  # a stand-in for a GPU: no values to check
    for name in ("clip", "dcpo"):  # check=True was the default and raised here
        band = fl.precompute_band(meta, fl.preset(name), mask=torch.ones_like(meta))
        assert band.log_upper.is_meta and band.log_upper.shape == (4, 16)
    with pytest.raises(fl.LossError, match="meta"):
        fl.precompute_band(meta, fl.preset("clip"), check=True)


@pytest.mark.parametrize("name", ["clip", "dcpo", "cispo", "dual-clip"])
def test_precompute_band_of_a_closed_form_has_no_sync(accelerator, name):
    old, _, _, mask = _batch()
    with SyncDetector() as det:
        band = fl.precompute_band(old, fl.preset(name), mask=mask)
    assert det.syncs == [] and det.uploads == [], det.report()
    want = fl.precompute_band(old, fl.preset(name), mask=mask, check=True)
    torch.testing.assert_close(band, want, rtol=0, atol=0)


@pytest.mark.parametrize("name", list(LOSS_CONFIGS))
def test_policy_loss_has_no_sync(name):
    cfg, forward_ops, all_ops = LOSS_CONFIGS[name]
    old, new, adv, mask = _batch()
    band = fl.precompute_band(old, cfg, mask=mask)
    with SyncDetector() as det:
        loss, metrics = fl.policy_loss(old, new, adv, mask, cfg, band=band, check=False)
        forward = det.op_count
        loss.backward()
    assert det.syncs == [] and det.uploads == [], det.report()
    assert forward <= forward_ops * 1.25 and det.op_count <= all_ops * 1.25, det.counts()
    assert new.grad.abs().sum() > 0 and set(metrics) == set(fl.METRIC_KEYS)
    # the CPU default checks the inputs: one host read, the only difference
    new.grad = None
    with SyncDetector() as checked:
        again, _ = fl.policy_loss(old, new, adv, mask, cfg, band=band)
    assert [f.op for f in checked.syncs] == ["aten._local_scalar_dense.default"]
    assert torch.equal(again, loss)


# --- verl: the band once per old_log_prob tensor, no sync per micro-batch ------------------
def _verl_loss(name="band"):
    pytest.importorskip("verl")
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    from ..integrations.test_verl import BAND_OVERRIDES, verl_actor

    overrides = {"band": BAND_OVERRIDES,  # tv, 0.1: a divergence band
                 "dcpo": (BAND_OVERRIDES[0], "actor_rollout_ref.actor.policy_loss.loss_mode=fbands",
                          "+actor_rollout_ref.actor.policy_loss.preset=dcpo")}[name]
    config = verl_actor(*overrides)
    fn = get_policy_loss_fn(config.policy_loss.loss_mode)

    def call(old, new, adv, mask):
        return fn(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask,
                  loss_agg_mode="token-mean", config=config, rollout_is_weights=None)

    return call


@pytest.mark.parametrize("name", ["band", "dcpo"])
def test_verl_micro_batch_call_reads_the_host_once(accelerator, name):
    """verl wants its metrics as Python numbers: one transfer, fbands' only wait besides
    the band's own (a divergence band's table read on a CPU tensor: see the log_bounds
    test below; verl hands each micro-batch over as a new tensor, so the band is computed
    on every call)."""
    call = _verl_loss(name)
    old, new, adv, mask = _batch()
    for _ in range(2):  # a radius's first two calls build its tables and copy them over
        call(old, new, adv, mask)
    new.grad = None
    with SyncDetector() as det:
        loss, metrics = call(old, new, adv, mask)
        loss.backward()
    band_read = [("Tensor.tolist", "_settle")] if name == "band" else []
    assert [(f.op, f.where.rsplit(" ", 1)[-1]) for f in det.fbands_syncs()] == [
        *band_read, ("Tensor.tolist", "verl_metrics")], det.report()
    assert det.uploads == [], det.report()
    assert all(isinstance(v, float) for v in metrics.values())


def test_verl_clip_counts_build_their_constant_once():
    from fbands.integrations._verl_extras import clip_counts

    old, new, adv, mask = _batch()
    band = fl.precompute_band(old, fl.preset("clip"), mask=mask)
    clip_counts(old, new, adv, mask, band)
    with SyncDetector() as det:
        counts = clip_counts(old, new, adv, mask, band)
    assert det.syncs == [] and det.uploads == [], det.report()
    assert counts["tokens_count"].item() == mask.sum().item()


# --- the trainer's diagnostics --------------------------------------------------------------
def test_update_stats_do_not_sync():
    from fbands.rl import diagnostics as dg

    old, new, adv, mask = _batch()
    dg.update_stats(old, new, mask, torch.tensor(0.1))  # builds its constant once
    with SyncDetector() as det:
        stats = dg.update_stats(old, new, mask, torch.tensor(0.1))
    assert det.syncs == [] and det.uploads == [], det.report()
    ratio = torch.exp(new.detach() - old)[mask > 0]
    want = torch.quantile(ratio, torch.tensor([0.05, 0.5, 0.95]))
    torch.testing.assert_close(stats[:3], want)


def test_diagnostics_that_return_numbers_read_the_host_once():
    from fbands.rl import diagnostics as dg

    old, new, adv, mask = _batch(rows=8)
    new = new.detach()
    dg.logp_change_by_bin(old, new, adv[:, 0], mask)
    for fn, args in ((dg.logp_change_by_bin, (old, new, adv[:, 0], mask)),
                     (dg.tail_change_per_prompt, (old, new, adv[:, 0], mask, 2))):
        with SyncDetector() as det:
            fn(*args)
        assert len(det.syncs) == 1 and det.uploads == [], (fn.__name__, det.report())


# --- fbands.log_bounds on the device path ---------------------------------------------------
def _log_bounds_device_path():
    """Sync findings and aten ops of a warm ``log_bounds(logp=True, check=False)`` call on a
    float32 tensor, along the path a CUDA tensor takes (device-table, eager)."""
    import fbands
    from fbands._dispatch import DEVICE_TABLE, plan
    from fbands.divergences import get

    x = _batch(rows=8, cols=64)[0]
    chosen = plan(get("kl"), x, 0.05, logp=True, log=True)
    assert (chosen.backend, chosen.path, chosen.sync) == ("torch", DEVICE_TABLE, True)
    for _ in range(2):  # the radius's tables are built or loaded by the first calls
        fbands.log_bounds(x, 0.05, "kl", logp=True, check=False)
    with SyncDetector() as det:
        lo, hi = fbands.log_bounds(x, 0.05, "kl", logp=True, check=False)
    assert lo.shape == x.shape and bool((lo < 0).all() and (hi > 0).all())
    return det


def test_log_bounds_device_path_on_a_cpu_tensor():
    """A CPU tensor reads the tables (the numpy backend's bits): one wait, in the table
    pass, and no upload once the radius's tables are in place.  The path of a GPU tensor,
    the grid, has none and is a graph of at most 20 ops (``tests/tables/test_grid.py``)."""
    det = _log_bounds_device_path()
    assert len(det.syncs) <= 1 and det.uploads == [], det.report()
    assert all(f.in_fbands for f in det.syncs)


# --- TRL: the per-micro-batch loss ----------------------------------------------------------
@pytest.fixture(scope="module")
def trl_call(tmp_path_factory):
    """A band trainer (kl) and a generation batch with its band, as TRL's loop holds it."""
    pytest.importorskip("trl")
    from fbands.integrations._trl_loss import LOWER, UPPER

    from ..integrations.test_trl import fake_batch, make_trainer

    trainer = make_trainer(tmp_path_factory.mktemp("trl"))
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    inputs = fake_batch(trainer)
    band = fl.precompute_band(inputs["old_per_token_logps"], trainer._band_step_config,
                              mask=inputs["completion_mask"])
    inputs[LOWER], inputs[UPPER] = band
    return trainer, inputs


def _trl_step(trainer, inputs) -> SyncDetector:
    trainer.model.zero_grad()
    with SyncDetector() as det:
        trainer.compute_loss(trainer.model, inputs).backward()
    return det


#: Where fbands' part of TRL's loss reads the host: TRL's metrics, as TRL's own loss does.
TRL_METRIC_READS = ("_log_band_metrics",)


def test_trl_loss_path_has_no_sync(accelerator, trl_call):
    det = _trl_step(*trl_call)
    assert det.uploads == [], det.report()
    # every wait of fbands' code is a metric read; the loss itself (policy_loss) has none
    assert {f.where.rsplit(" ", 1)[-1] for f in det.fbands_syncs()} <= set(TRL_METRIC_READS)
    assert not [f for f in det.syncs if "/fbands/losses/" in f.where], det.report()


def test_trl_micro_batch_reads_the_host_once(accelerator, trl_call):
    """TRL's metrics and the band's, reduced over the processes on the device and read in
    one transfer (they were 7 reads, and 4 more in TRL's nanmin / nanmax)."""
    det = _trl_step(*trl_call)
    assert [(f.op, f.where.rsplit(" ", 1)[-1]) for f in det.fbands_syncs()] == [
        ("Tensor.tolist", "_log_band_metrics")], det.report()
    assert not [f for f in det.syncs if "nanm" in f.where], det.report()
