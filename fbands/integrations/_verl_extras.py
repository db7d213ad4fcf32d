"""Parts of the verl plug-in that do not import verl: BandPO's option names, and the metrics.

BandPO's fork of verl reads its loss options from the actor section under its own names;
:data:`BANDPO_ALIASES` maps those that the plug-in accepts in ``policy_loss`` to fbands'
field (see the verl guide's porting table).

verl (0.9.1) wraps every metric a policy loss returns as a *mean* over the micro-batches of
a mini-batch (and over the data-parallel ranks).  That is right for a fraction, not for a
count: :func:`clip_counts` therefore reports each count multiplied by the number of
micro-batches times ranks, ``global_batch_size / (sequences in this micro-batch)``, so that
verl's mean comes out as the sum over the mini-batch, as BandPO's own aggregation gives.
With a fixed micro-batch size this is exact; with verl's dynamic batch size (micro-batches
of unequal size) it is the count per sequence times the mini-batch's sequences.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from fbands._constants import device_constant
from fbands.errors import ConfigError
from fbands.integrations._options import as_bool
from fbands.losses.terms import side_masks

#: BandPO's name of a ``policy_loss`` option -> fbands' field.
BANDPO_ALIASES = {
    "does_relax_high_p_bound": "relax",
    "band_radius_delta": "delta",
    "soft_clip_methods": "soft",
}
#: Upper edges of BandPO's five old-probability buckets: [0, 0.2), ..., [0.8, 1].
BUCKET_EDGES = (0.2, 0.4, 0.6, 0.8)
_LOG_BUCKET_EDGES = tuple(math.log(e) for e in BUCKET_EDGES)


def resolve_aliases(get: Callable[[str], Any], defaults: Mapping[str, Any],
                    error: type[Exception]) -> dict[str, Any]:
    """fbands' values of the aliased fields: ``{field: value}`` for each alias that is set.

    ``get(name)`` reads the ``policy_loss`` section (None when absent).  An alias set
    beside its fbands field to another value is an ``error``.  BandPO's
    ``soft_clip_methods`` counts only with ``use_soft_clip=True`` (its default form is
    then ``3seg``), as in BandPO's code.
    """
    out = {}
    use_soft = get("use_soft_clip")
    for alias, name in BANDPO_ALIASES.items():
        value = get(alias)
        if name == "soft" and (use_soft is not None or value is not None):
            if use_soft is None:
                raise error("policy_loss.soft_clip_methods is ignored by BandPO without "
                            "use_soft_clip=true; set both, or use policy_loss.soft")
            try:  # (read as relax is: 1 is not true, "false" is not true)
                use_soft = as_bool("policy_loss.use_soft_clip", use_soft)
            except ConfigError as err:
                raise error(str(err)) from None
            if not use_soft and value is not None:
                raise error("policy_loss.soft_clip_methods is ignored by BandPO without "
                            "use_soft_clip=true; set both, or use policy_loss.soft")
            value = (value or "3seg") if use_soft else "hard"
        if value is None:
            continue
        own = get(name)
        if own is not None and own != defaults[name] and own != value:
            raise error(f"policy_loss.{alias}={value!r} (BandPO's name of {name}) "
                        f"contradicts policy_loss.{name}={own!r}")
        out[name] = value
    return out


@torch.no_grad()
def clip_counts(old_log_prob, log_prob, advantages, response_mask, band,
                global_batch_size=None) -> dict[str, torch.Tensor]:
    """Token counts of one micro-batch, scaled so that verl's mean over micro-batches is
    their sum (module docstring); 0-dim tensors, no host sync.

    ``tokens_count`` (tokens of the mask), ``clipped_upper_count`` /
    ``clipped_lower_count`` (fbands' clipped tokens: beyond the edge on the side where the
    PPO form stops the gradient, :func:`fbands.losses.terms.side_masks`),
    ``beyond_upper_count`` / ``beyond_lower_count`` (BandPO's ``clipped_up_count`` /
    ``clipped_down_count``: ratio above the upper / below the lower edge, whatever the
    advantage), and the last two again per bucket of old probability
    (``bin{b}_beyond_upper_count``, ``bin{b}_beyond_lower_count``, ``b = 0..4``, buckets
    :data:`BUCKET_EDGES`).
    """
    valid = response_mask > 0
    logr = log_prob.detach() - old_log_prob
    adv = advantages if advantages.dim() == logr.dim() else advantages[:, None]
    upper, lower = side_masks(logr, adv, band.log_lower, band.log_upper)
    above = valid & (logr > band.log_upper)
    below = valid & (logr < band.log_lower)
    edges = device_constant(_LOG_BUCKET_EDGES, old_log_prob.dtype, old_log_prob.device)
    bucket = torch.bucketize(old_log_prob.detach(), edges)
    counts = {"tokens_count": valid, "clipped_upper_count": valid & upper,
              "clipped_lower_count": valid & lower, "beyond_upper_count": above,
              "beyond_lower_count": below}
    for b in range(len(BUCKET_EDGES) + 1):
        counts[f"bin{b}_beyond_upper_count"] = above & (bucket == b)
        counts[f"bin{b}_beyond_lower_count"] = below & (bucket == b)
    rows = max(int(old_log_prob.shape[0]), 1)
    scale = 1.0 if global_batch_size is None else float(global_batch_size) / rows
    return {k: m.sum().to(torch.float64) * scale for k, m in counts.items()}


def verl_metrics(raw: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Name the fbands metrics the way verl's dashboards expect, as Python floats (one
    host transfer); ``raw`` holds fbands' metrics and :func:`clip_counts`' counts."""
    names = {
        "actor/pg_clipfrac": "clipfrac",
        "actor/ppo_kl": "approx_kl_k1",
        "actor/pg_clipfrac_lower": "clipfrac_lower",
    }
    keys = list(names) + [f"actor/band/{k}" for k in raw]
    sources = list(names.values()) + list(raw)
    values = torch.stack([raw[k].detach().double().reshape(()) for k in sources]).tolist()
    return dict(zip(keys, values, strict=True))


def guard_bypass_mode(helper, loss_modes, error: type[Exception]) -> None:
    """Make verl's rollout-correction *bypass mode* refuse a band loss (idempotent).

    verl's v0 trainer, with ``algorithm.rollout_correction.bypass_mode=true``, calls
    ``helper.apply_bypass_mode`` (``helper`` is ``verl.trainer.ppo.rollout_corr_helper``)
    before each actor update, which sets ``policy_loss.loss_mode="bypass_mode"``: verl's own
    loss then replaces whatever loss was configured, a band included, without a word.  The
    wrapper raises ``error`` instead when the configured mode is one of ``loss_modes``, and
    passes any other mode to verl's function unchanged.
    """
    original = helper.apply_bypass_mode
    if getattr(original, "fbands_guard", False):
        return

    def apply_bypass_mode(batch, rollout_corr_config=None, policy_loss_config=None):
        mode = None if policy_loss_config is None else policy_loss_config.get("loss_mode")
        if mode in loss_modes:
            raise error(f"algorithm.rollout_correction.bypass_mode=true replaces the policy "
                        f"loss {mode!r} by verl's own 'bypass_mode' loss, so the band would "
                        "not be trained with: set bypass_mode=false (verl's importance "
                        "weights, rollout_is=..., work with the band), or choose a verl loss")
        return original(batch, rollout_corr_config, policy_loss_config)

    apply_bypass_mode.fbands_guard = True
    apply_bypass_mode.__doc__ = original.__doc__
    helper.apply_bypass_mode = apply_bypass_mode
