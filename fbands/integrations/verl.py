"""verl plug-in: band policy losses for verl's PPO/GRPO actor.

Importing this module registers four policy losses in verl's registry
(``verl.trainer.ppo.core_algos.register_policy_loss``):

=============  ====================================================================
``loss_mode``  what it computes (:mod:`fbands.losses`)
=============  ====================================================================
``band``       BandPO's band clip: ``max(-A r, -A clip(r, lower, upper))``
``band_mask``  the DPPO-style band mask: tokens outside the band lose their gradient
``band_gppo``  band clip whose clipped tokens keep a scaled gradient
``fbands``     any method of :data:`fbands.losses.METHODS`, chosen by
               ``policy_loss.method`` (baselines such as ``dcpo`` included)
=============  ====================================================================

The band's parameters travel through verl's own configuration: point
``actor_rollout_ref.actor.policy_loss._target_`` at :class:`BandPolicyLossConfig`
and add its fields with Hydra's ``+`` prefix::

    actor_rollout_ref.actor.policy_loss._target_=fbands.integrations.verl.BandPolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=band
    +actor_rollout_ref.actor.policy_loss.div=kl
    +actor_rollout_ref.actor.policy_loss.delta=0.05

or name it by a preset of :func:`fbands.losses.preset` (as ``fbands train --loss``):
``loss_mode=fbands`` and ``+...policy_loss.preset=band-kl`` (``clip-higher``, ``dcpo``, ...;
see :class:`BandPolicyLossConfig` for the fields that win over a preset).

verl's Ray workers build the actor configuration with ``hydra.utils.instantiate``, which
imports this module to find :class:`BandPolicyLossConfig`; that import registers the losses,
so the overrides above are enough inside every worker.  The ``verl.plugins`` entry point of
the fbands distribution (loaded on ``import verl``) and verl's environment variable
``VERL_USE_EXTERNAL_MODULES=fbands.integrations.verl`` load the plug-in too.

verl calls a policy loss without the global step, so a decaying radius
(``+...policy_loss.delta_schedule=cosine:0.1:0.02:1000``, :func:`fbands.parse_schedule`) needs
fbands' trainer, which passes it: ``trainer.v1.trainer_mode=fbands_sync``
(:mod:`fbands.integrations.verl_trainer`).  The radius used is logged as ``actor/band/delta``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from verl.trainer.ppo import rollout_corr_helper
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, agg_loss, register_policy_loss
from verl.workers.config import ActorConfig, PolicyLossConfig

import fbands
from fbands import _methods
from fbands import losses as fl
from fbands._state import STATE
from fbands.errors import ConfigError
from fbands.integrations._names import merge, mode_fields
from fbands.integrations._options import as_bool, as_float, as_str
from fbands.integrations._verl_extras import (
    clip_counts,
    guard_bypass_mode,
    resolve_aliases,
    verl_metrics,
)
from fbands.integrations._verl_step import schedule_for, scheduled

__all__ = [
    "ENTRY_POINT",
    "LOSS_MODES",
    "BandPolicyLossConfig",
    "VerlBandError",
    "loss_config",
    "aggregation_weights",
    "compute_policy_loss",
    "register",
]

#: verl ``loss_mode`` name -> :data:`fbands.losses.METHODS` entry (the table of methods'
#: ``verl_mode``; ``None``: read ``policy_loss.method``).
LOSS_MODES: dict[str, str | None] = {
    **{m.verl_mode: m.name for m in _methods.TABLE if m.verl_mode},
    "fbands": None,
}


#: The entry point (group, name, value) under which verl discovers this plug-in; the
#: fbands distribution declares it in pyproject.toml.
ENTRY_POINT = ("verl.plugins", "fbands", "fbands.integrations.verl")

logger = logging.getLogger(__name__)
_ACTOR = ActorConfig.__dataclass_fields__  # verl's defaults of the clip ratios
_LOGGED = STATE.memo("verl logged", "the loss configurations this worker logged")


class VerlBandError(ConfigError):
    """A verl configuration that the band losses cannot use (a :class:`fbands.ConfigError`)."""


@dataclass
class BandPolicyLossConfig(PolicyLossConfig):
    """verl's ``policy_loss`` section with the band's parameters.

    It extends :class:`verl.workers.config.PolicyLossConfig`, so verl's own fields
    (``loss_mode``, ``rollout_correction``, ...) keep their meaning. The clip ratios
    ``clip_ratio_low`` / ``clip_ratio_high`` and the dual-clip constant
    ``clip_ratio_c`` stay where verl keeps them, in the actor section.

    Parameters
    ----------
    loss_mode : str
        The registered loss: ``"band"``, ``"band_mask"``, ``"band_gppo"`` or
        ``"fbands"`` (see the module docstring).
    preset : str or None
        A preset of :func:`fbands.losses.preset` (``"band-kl"``, ``"clip-higher"``, ``"dcpo"``,
        ...), meaning what ``fbands train --loss`` means, with ``loss_mode="fbands"`` (or the
        band mode of its method).  Fields set beside it win: ``div``, ``delta``,
        ``dual_clip_c``, ``upper_bound_max`` when not None, the actor's ``clip_ratio*`` when
        any differs from verl's default 0.2.
    method : str
        Used by ``loss_mode="fbands"`` only: any entry of :data:`fbands.losses.METHODS` (the
        method alone, with the actor's clip ratios; a ``preset`` sets it too).
    div, delta : str or None, float or None
        Divergence (``fbands.available()``) and radius of the trust region, ``D_f <= delta``;
        unset: the preset's, else ``"kl"`` and 0.05.
    delta_schedule : str or None
        A step schedule of the radius from ``delta`` (:func:`fbands.parse_schedule`), evaluated
        at the steps completed; it needs ``trainer.v1.trainer_mode=fbands_sync``.
    relax : bool
        Widen the band to at least the fixed clip ``[1 - clip_ratio_low, 1 + clip_ratio_high]``.
    upper_bound_max : float or None
        Cap on the upper ratio edge (the published BandPO code uses 10 or 100).
    dual_clip_c : float or None
        Dual clip for ``A < 0`` (clip-form methods): also bound the loss by ``-c A``.
        verl's ``vanilla`` loss always does this with ``c = clip_ratio_c`` (3.0); set
        ``dual_clip_c=${actor_rollout_ref.actor.clip_ratio_c}`` to do the same.
    truncation : float
        The cap ``C`` on the stop-gradient ratio of ``band_mask``.
    soft : str or None
        ``None`` (default): the hard clip.  A form of :data:`fbands.losses.SOFT_FORMS`
        (``tanh1``, ``tanh2``, ``smooth3`` and BandPO's ``3seg``, ``rollback``, ...) or
        BandPO's alias ``1seg``, ``2seg``, ``hard``: the soft clip of
        :func:`fbands.losses.soft_clip` in its place (clip-form methods: ``band``, and
        ``fbands`` with a clip-form ``method``).
    soft_k, soft_width : float or None
        ``soft="tanh2"`` only: its slope at ``r = 1`` (unset: 1); ``soft="smooth3"`` only: the
        room beyond an edge, as a fraction of the edge's distance from 1 (unset: 0.25).
    soft_rho, soft_g, soft_alpha, soft_gamma, soft_alpha_in : float or None
        BandPO's forms' parameters, each only with a form that uses it (unset: BandPO's
        defaults 0.1, 1, 0.05, 0.2, 2; :data:`fbands.losses.config.SOFT_PARAMS`).
    does_relax_high_p_bound, band_radius_delta, use_soft_clip, soft_clip_methods
        BandPO's names of ``relax``, ``delta`` and ``soft`` (``soft_clip_methods`` counts
        with ``use_soft_clip=true`` only, and defaults to ``3seg`` then, as in BandPO).

    Raises
    ------
    VerlBandError
        If ``loss_mode`` is not a band loss, ``preset`` is unknown or disagrees with it,
        ``soft`` is not a known form, or ``soft_k`` / ``soft_width`` is given without it.
    fbands.ConfigError
        For a value of the wrong type (``delta=True``) or beyond float range (``10**400``).
    fbands.DivergenceError, fbands.losses.LossError
        For an unknown divergence or an invalid option (all three are ValueErrors).

    Examples
    --------
    >>> from fbands.integrations.verl import BandPolicyLossConfig, loss_config
    >>> cfg = BandPolicyLossConfig(loss_mode="band", div="tv", delta=0.1)
    >>> loss_config(cfg).method, loss_config(cfg).div, loss_config(cfg).delta
    ('band_clip', 'tv', 0.1)
    """

    loss_mode: str = "band"
    preset: str | None = None
    method: str = "band_clip"
    div: str | None = None
    delta: float | None = None
    delta_schedule: str | None = None
    relax: bool = False
    upper_bound_max: float | None = None
    dual_clip_c: float | None = None
    truncation: float = 10.0
    soft: str | None = None
    soft_k: float | None = None
    soft_width: float | None = None
    soft_rho: float | None = None
    soft_g: float | None = None
    soft_alpha: float | None = None
    soft_gamma: float | None = None
    soft_alpha_in: float | None = None
    does_relax_high_p_bound: bool | None = None
    band_radius_delta: float | None = None
    use_soft_clip: bool | None = None
    soft_clip_methods: str | None = None

    def __post_init__(self) -> None:
        if self.loss_mode not in LOSS_MODES:
            raise VerlBandError(
                f"policy_loss.loss_mode={self.loss_mode!r} is not a band loss; "
                f"use one of {sorted(LOSS_MODES)} with BandPolicyLossConfig"
            )
        # Checking the divergence and building the LossConfig once here reports a bad
        # value when the config is built, not inside the first step of every worker.  The
        # divergence string is parsed by fbands.get (never evaluated as code).
        if self.div is not None:
            fbands.get(as_str("policy_loss.div", self.div))
        cfg = loss_config(self)
        if self.delta_schedule:
            schedule_for(cfg, as_str("policy_loss.delta_schedule", self.delta_schedule),
                         VerlBandError)


def _get(section: Any, key: str, default: Any) -> Any:
    """Read ``key`` from a dataclass config, a DictConfig (where ``???`` is an error, not the
    default) or a dict."""
    if isinstance(section, DictConfig) and OmegaConf.is_missing(section, key):
        raise VerlBandError(f"{key} is '???' (mandatory, never set): give it a value")
    if isinstance(section, Mapping) or hasattr(section, "get"):
        value = section.get(key, default)
    else:
        value = getattr(section, key, default)
    return default if value is None and default is not None else value


def loss_config(
    policy_loss: Any,
    actor: Any = None,
    *,
    loss_mode: str | None = None,
) -> fl.LossConfig:
    """Translate verl's configuration into an :class:`fbands.losses.LossConfig`.

    Parameters
    ----------
    policy_loss : BandPolicyLossConfig, DictConfig or mapping
        The ``actor.policy_loss`` section. Band fields it lacks (a plain verl
        ``PolicyLossConfig``) take the defaults of :class:`BandPolicyLossConfig`.
    actor : ActorConfig, DictConfig, mapping or None
        The actor section, for ``clip_ratio``, ``clip_ratio_low`` and
        ``clip_ratio_high`` (verl's default 0.2 when absent).
    loss_mode : str or None
        The registered name; defaults to ``policy_loss.loss_mode``.

    Returns
    -------
    fbands.losses.LossConfig
        Its ``agg`` is ``"token-sum"``: verl's aggregation is applied by
        :func:`compute_policy_loss` through per-token weights.

    Raises
    ------
    VerlBandError
        If the loss mode is not one of :data:`LOSS_MODES`, or the soft-clip options do
        not fit (:func:`fbands.losses.soft_options`).
    fbands.ConfigError
        If a value has the wrong type: numbers may come as text (``"5e-2"``), ``relax``
        as ``true``/``false`` text, but a bool is not a number and ``"false"`` is never
        true.
    fbands.losses.LossError
        If a band parameter is invalid (an unknown method, ``delta <= 0``, ...).

    Examples
    --------
    >>> from fbands.integrations.verl import loss_config
    >>> cfg = loss_config({"loss_mode": "band_mask", "div": "tv", "delta": 0.2})
    >>> cfg.method, cfg.div, cfg.delta, cfg.eps_high
    ('band_mask', 'tv', 0.2, 0.2)
    """
    fields = BandPolicyLossConfig.__dataclass_fields__
    mode = loss_mode if loss_mode is not None else _get(policy_loss, "loss_mode", "band")
    if mode not in LOSS_MODES:
        raise VerlBandError(f"loss_mode={mode!r} is not a band loss; known: {sorted(LOSS_MODES)}")
    named = mode_fields(_get(policy_loss, "preset", None), _get(policy_loss, "method", None),
                        mode, LOSS_MODES[mode], VerlBandError)

    aliased = resolve_aliases(lambda key: _get(policy_loss, key, None),
                              {k: fields[k].default for k in ("relax", "delta", "soft")},
                              VerlBandError)

    def band(key: str) -> Any:
        return aliased.get(key, _get(policy_loss, key, fields[key].default))

    def number(key: str) -> float | None:
        return as_float(f"policy_loss.{key}", band(key), optional=fields[key].default is None)

    actor = {} if actor is None else actor
    clip_ratio = _get(actor, "clip_ratio", 0.2)
    widths_given = any(_get(actor, k, None) not in (None, _ACTOR[k].default)
                       for k in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"))
    soft = band("soft")
    if soft is not None and not isinstance(soft, str):
        raise VerlBandError(f"policy_loss.soft={soft!r} must be a string")
    try:
        soft = fl.soft_options(soft, number("soft_k"), number("soft_width"),
                               prefix="policy_loss.",
                               **{k: number(k) for k in fl.SOFT_PARAMS
                                  if k not in ("soft_k", "soft_width")})
    except fl.LossError as err:
        raise VerlBandError(str(err)) from err
    div = band("div")
    chosen = merge(
        named,
        {"div": None if div is None else as_str("policy_loss.div", div),
         "delta": number("delta"), "dual_clip_c": number("dual_clip_c"),
         "upper_bound_max": number("upper_bound_max")},
        {"eps_low": as_float("actor.clip_ratio_low", _get(actor, "clip_ratio_low", clip_ratio)),
         "eps_high": as_float("actor.clip_ratio_high",
                              _get(actor, "clip_ratio_high", clip_ratio))},
        widths_given,
    )
    return fl.LossConfig(
        **chosen,
        relax=as_bool("policy_loss.relax", band("relax")),
        truncation=number("truncation"),
        agg="token-sum",
        **soft,
    )


def aggregation_weights(
    response_mask: torch.Tensor, loss_agg_mode: str, dtype: torch.dtype, **batch_info: Any
) -> torch.Tensor:
    r"""Per-token weights :math:`W` with ``agg_loss(X) == (W * X).sum()`` for every ``X``.

    verl's ``agg_loss`` is linear in the loss matrix, so its weights are its gradient,
    read off once with autograd. This keeps verl's exact semantics (global token and
    sequence counts, ``dp_size`` scaling, fully masked rows) for every mode.

    Parameters
    ----------
    response_mask : torch.Tensor
        ``(batch, response_length)`` mask.
    loss_agg_mode : str
        verl's aggregation mode.
    dtype : torch.dtype
        Floating dtype of the result.
    **batch_info
        verl's ``global_batch_info`` (``dp_size``, ``batch_num_tokens``,
        ``global_batch_size``, ``loss_scale_factor``).

    Returns
    -------
    torch.Tensor
        ``(batch, response_length)`` weights, zero outside the mask.

    Examples
    --------
    >>> import torch
    >>> from fbands.integrations.verl import aggregation_weights
    >>> mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    >>> aggregation_weights(mask, "seq-mean-token-mean", torch.float64)
    tensor([[0.2500, 0.2500, 0.0000],
            [0.5000, 0.0000, 0.0000]], dtype=torch.float64)
    """
    with torch.enable_grad():
        probe = torch.zeros(response_mask.shape, dtype=dtype, device=response_mask.device)
        probe.requires_grad_(True)
        total = agg_loss(
            loss_mat=probe, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **batch_info
        )
        (weights,) = torch.autograd.grad(total, probe)
    return weights


def compute_policy_loss(
    loss_mode: str,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    r"""A band policy loss with verl's calling convention.

    With :math:`\ell_t` the per-token loss of :func:`fbands.losses.policy_loss`,
    :math:`w_t` verl's rollout-correction weights and :math:`W_t` the weights of
    verl's ``agg_loss`` for this mode and ``config.global_batch_info``
    (:func:`aggregation_weights`), the loss is

    .. math::

        \mathcal{L} = \sum_t W_t\, w_t\, \ell_t
        = \texttt{agg\_loss}(w \odot \ell,\ \text{mask},\ \text{mode},
        \ \texttt{**global\_batch\_info}),

    computed by :func:`fbands.losses.policy_loss` in ``token-sum`` mode with the mask
    :math:`W w`.  Only the metrics (Python numbers for verl) wait for the device.  The band
    is computed on each call: verl 0.9 hands every micro-batch of every epoch over as a new
    tensor (once per mini-batch would need it before verl splits the batch).

    Parameters
    ----------
    loss_mode : str
        One of :data:`LOSS_MODES`.
    old_log_prob, log_prob, advantages, response_mask : torch.Tensor
        ``(batch, response_length)`` tensors as verl passes them; ``log_prob``
        carries the gradient.
    loss_agg_mode : str
        verl's aggregation mode.
    config : ActorConfig or DictConfig
        The actor configuration (band parameters in ``config.policy_loss``).
    rollout_is_weights : torch.Tensor or None
        verl's importance weights between the rollout engine and the actor, one per
        token (no gradient).

    Returns
    -------
    loss : torch.Tensor
        A 0-dim tensor with gradient.
    metrics : dict[str, float]
        ``actor/pg_clipfrac`` (ratio clipped at either edge), ``actor/ppo_kl`` (k1
        estimate of KL(old || new), verl's definition), ``actor/pg_clipfrac_lower``
        (clipped at the lower edge) and every fbands metric as ``actor/band/<name>``,
        over the tokens with a non-zero weight, the radius as ``actor/band/delta``
        (methods with a divergence band), and token counts ``actor/band/*_count``
        (:func:`fbands.integrations._verl_extras.clip_counts`), scaled so that verl's mean
        over micro-batches gives their sum over the mini-batch. They reach the host in one
        transfer.

    Raises
    ------
    VerlBandError
        If ``config`` is None or has no ``policy_loss`` section (verl's on-policy
        distillation calls a policy loss with its own config, which has none).
    """
    if config is None:
        raise VerlBandError("the band losses need verl's actor config (config=None given)")
    section = _get(config, "policy_loss", None)
    if section is None:  # verl's on-policy distillation passes its DistillationLossConfig
        raise VerlBandError(f"loss_mode={loss_mode!r} got a {type(config).__name__} without a "
                            "policy_loss section, so none of the band's options: verl's "
                            "distillation calls losses that way; give its policy_loss_mode a "
                            "verl loss (vanilla), not a band")
    cfg = loss_config(section, config, loss_mode=loss_mode)
    if cfg not in _LOGGED:  # once per configuration and worker process
        _LOGGED.put(cfg, True)
        logger.info("fbands band loss %r: %s", loss_mode, cfg)
    cfg = scheduled(cfg, _get(section, "delta_schedule", None), VerlBandError)
    batch_info = dict(_get(config, "global_batch_info", None) or {})
    dtype = torch.promote_types(log_prob.dtype, torch.float32)
    weights = aggregation_weights(response_mask, loss_agg_mode, dtype, **batch_info)
    if rollout_is_weights is not None:
        weights = weights * rollout_is_weights.detach()
    band = fl.precompute_band(old_log_prob, cfg, mask=response_mask)
    loss, raw = fl.policy_loss(old_log_prob, log_prob, advantages, weights, cfg, band=band)
    raw = {**raw, **clip_counts(old_log_prob, log_prob, advantages, response_mask, band,
                                batch_info.get("global_batch_size"))}
    metrics = verl_metrics(raw)
    if cfg.uses_radius:
        metrics["actor/band/delta"] = cfg.delta
    return loss, metrics


def _make_loss(loss_mode: str):
    # verl passes the arguments by these names
    def band_policy_loss(old_log_prob, log_prob, advantages, response_mask,
                         loss_agg_mode="token-mean", config=None, rollout_is_weights=None):
        return compute_policy_loss(loss_mode, old_log_prob, log_prob, advantages, response_mask,
                                   loss_agg_mode, config, rollout_is_weights)

    band_policy_loss.__name__ = f"fbands_{loss_mode}_policy_loss"
    band_policy_loss.__qualname__ = band_policy_loss.__name__
    band_policy_loss.__doc__ = f"verl policy loss ``{loss_mode}``: :func:`compute_policy_loss`."
    return band_policy_loss


_LOSS_FNS = {mode: _make_loss(mode) for mode in LOSS_MODES}


def register() -> list[str]:
    """Register the band losses with verl (idempotent; what importing the module does, and
    the ``verl.plugins`` entry point names this module); make verl's rollout-correction
    bypass mode refuse them (:func:`~fbands.integrations._verl_extras.guard_bypass_mode`).

    Returns
    -------
    list of str
        The registered ``loss_mode`` names.

    Examples
    --------
    >>> from verl.trainer.ppo.core_algos import get_policy_loss_fn
    >>> from fbands.integrations.verl import register
    >>> register()
    ['band', 'band_mask', 'band_gppo', 'fbands']
    >>> get_policy_loss_fn("band").__name__
    'fbands_band_policy_loss'
    """
    for mode, fn in _LOSS_FNS.items():
        if POLICY_LOSS_REGISTRY.get(mode) is not fn:
            register_policy_loss(mode)(fn)
    guard_bypass_mode(rollout_corr_helper, LOSS_MODES, VerlBandError)
    return list(_LOSS_FNS)


register()
