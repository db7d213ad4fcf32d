r"""Policy losses for PPO/GRPO-style training, with fixed clips and probability-aware bands.

Every loss here takes the same four tensors, in verl's order,

* ``logp_old``: log-probabilities of the sampled tokens under the behaviour policy, ``(B, T)``;
* ``logp``: the same under the policy being trained (carries the gradient), ``(B, T)``;
* ``advantages``: ``(B, T)``, or one value per sequence, ``(B,)`` or ``(B, 1)``;
* ``mask``: the response mask, ``(B, T)``, 1 (or ``True``) on tokens that count,

and a :class:`LossConfig` that names the method and its constants.  It returns a 0-dim loss
(with gradient) and a dict of 0-dim detached metric tensors.  On an accelerator the loss
never syncs with the host; the f-divergence band (:func:`precompute_band`, once per
batch) synchronises once when called eagerly, to solve on the host the few tokens its
tables leave, and not at all when compiled or captured in a CUDA graph.  On the CPU, where
it is free, the inputs are validated first (the ``check`` argument: a positive
"log-probability", a nan or crossed band edge, a negative mask raise
:class:`fbands.LossError`; unchecked, they give a nan loss).

With :math:`\log r = \text{logp} - \text{logp\_old}` and :math:`r = e^{\log r}`, every
method is a per-token term aggregated over the mask (:func:`agg_loss`):

=============== ===========================================================================
method          per-token loss
=============== ===========================================================================
``clip``        :math:`\max(-A r,\, -A\,\mathrm{clip}(r, 1-\epsilon_l, 1+\epsilon_h))` (PPO)
``clip_higher`` the same with :math:`\epsilon_h > \epsilon_l` (DAPO's Clip-Higher)
``dual_clip``   PPO clip, and for :math:`A < 0` also at most :math:`-cA` (:math:`c = 3`)
``dcpo``        PPO clip with DCPO's bounds :math:`\tfrac12 + \tfrac12\sqrt{1 \mp 4\epsilon/p}`
``trgppo``      PPO clip with the union of the KL band and :math:`[1-\epsilon_l, 1+\epsilon_h]`
``cispo``       :math:`-\,\mathrm{sg}(\mathrm{clip}(r, 1-\epsilon_l, 1+\epsilon_h))\, A \log\pi`
``band_clip``   PPO clip with the band :math:`[r_{lo}(p), r_{hi}(p)]` of an f-divergence
``band_mask``   :math:`-A\,\mathrm{sg}(\min(r, C)) \log\pi`, zero for tokens past the band
``band_gppo``   band clip in the forward pass; clipped tokens keep a bounded gradient
=============== ===========================================================================

(:math:`p = \pi_{old}(a)`, :math:`\mathrm{sg}` is stop-gradient.)  All comparisons are made
between :math:`\log r` and the log of the band edges, so nothing overflows when
:math:`p` is tiny and :math:`r_{hi} \approx \delta / p` is huge; the edges are computed once
per batch by :func:`precompute_band` and reused across PPO epochs.  Inputs in bfloat16 or
float16 are computed in float32 (float64 stays float64); the gradient returns in the input's
dtype, so prefer bfloat16 to float16, whose largest value (65504) a tail token's gradient
:math:`A r` can exceed.

Example
-------
>>> import torch
>>> from fbands.losses import LossConfig, policy_loss
>>> logp_old = torch.log(torch.tensor([[0.5, 0.1, 0.9]]))
>>> logp = (logp_old + torch.tensor([[0.5, 0.0, -0.5]])).requires_grad_()
>>> loss, metrics = policy_loss(logp_old, logp, torch.tensor([1.0]), torch.ones(1, 3),
...                             LossConfig(method="clip"))
>>> round(loss.item(), 4), round(metrics["clipfrac"].item(), 4)
(-0.9355, 0.3333)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from fbands._optional import raise_missing

try:
    import torch
    from torch import Tensor
except ModuleNotFoundError as exc:
    raise_missing(exc, "fbands.losses")

from fbands.errors import LossError

__all__ = [
    "AGG_MODES",
    "METHODS",
    "METRIC_KEYS",
    "Band",
    "LossConfig",
    "LossError",
    "SOFT_FORMS",
    "agg_loss",
    "dcpo_log_bounds",
    "policy_loss",
    "precompute_band",
    "preset",
    "soft_clip",
    "soft_options",
]

METHODS = (
    "clip",
    "clip_higher",
    "dual_clip",
    "dcpo",
    "trgppo",
    "cispo",
    "band_clip",
    "band_mask",
    "band_gppo",
)
AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
METRIC_KEYS = (
    "clipfrac",
    "clipfrac_upper",
    "clipfrac_lower",
    "tail_clipfrac_upper",
    "dual_clipfrac",
    "truncfrac",
    "band_width",
    "approx_kl_k1",
    "approx_kl_k3",
    "ratio_mean",
    "ratio_max",
    "ratio_min",
)

# Methods whose per-token term is the PPO form max(-A r, -A clip(r, lower, upper)).
_CLIP_FORM = ("clip", "clip_higher", "dual_clip", "dcpo", "trgppo", "band_clip", "band_gppo")
# Methods whose band comes from fbands.log_bounds.
_DIVERGENCE_BAND = ("trgppo", "band_clip", "band_mask", "band_gppo")
# Methods whose band is the fixed interval [1 - eps_low, 1 + eps_high].
_FIXED_BAND = ("clip", "clip_higher", "dual_clip", "cispo")

#: The smooth saturations of ``LossConfig.soft`` (see :func:`soft_clip`).
SOFT_FORMS = ("tanh1", "tanh2", "smooth3")

_DEFAULT_DUAL_CLIP_C = 3.0
# Old probability below which a token counts as a tail token in "tail_clipfrac_upper".
TAIL_PROB = 0.1
# Ratios are exponentiated from log r <= _MAX_LOG_RATIO (r <= 5.5e34), which keeps every
# product finite in float32.  Only a token whose old probability is below ~1e-35 can reach it.
_MAX_LOG_RATIO = 80.0
# Stand-in old log-probability at masked-out positions (padding may hold -inf or garbage).
_PAD_LOGP = math.log(0.5)
# Largest log-probability accepted (and read as 0): a float32 log-softmax can round a
# near-certain token to +1e-7, while anything above this is not a log-probability at all
# (negative log-likelihoods passed by mistake are the usual cause).
LOGP_TOLERANCE = 1e-3


@dataclass(frozen=True)
class LossConfig:
    r"""Which policy loss to compute, and its constants.

    Parameters
    ----------
    method : str
        One of :data:`METHODS`.
    div : str
        Divergence of the band (``band_*`` methods and ``trgppo``), any name that
        :func:`fbands.log_bounds` accepts: ``"kl"``, ``"tv"``, ``"chi2"``, ...
    delta : float
        Trust-region radius :math:`\delta > 0` of the band.
    eps_low, eps_high : float
        Fixed clip :math:`[1 - \epsilon_l, 1 + \epsilon_h]` of ``clip``, ``clip_higher``,
        ``dual_clip``, ``trgppo``, ``cispo`` and of ``relax``; DCPO's :math:`\epsilon`.
        ``eps_low`` lies in [0, 1]; ``eps_low = 1`` means no lower clip.
    dual_clip_c : float or None
        Dual clip: for :math:`A < 0` the ratio is also capped at :math:`c > 1`.  Applies to
        every clip-form method; ``dual_clip`` uses 3 when it is None.
    relax : bool
        Widen the band to contain the fixed clip: lower :math:`\le 1 - \epsilon_l`, upper
        :math:`\ge 1 + \epsilon_h` (the "relax" option of the BandPO code).
    upper_bound_max : float or None
        Cap (:math:`\ge 1`) on the upper edge, applied last.
    truncation : float
        :math:`C` of ``band_mask``: the stop-gradient importance weight is
        :math:`\min(r, C)`.
    gppo_beta : float
        ``band_gppo``: scale of the gradient a token clipped at the upper edge keeps.
    gppo_beta_low : float or None
        ``band_gppo``: the same at the lower edge; None means ``gppo_beta``.
    agg : str
        Aggregation over tokens, one of :data:`AGG_MODES` (see :func:`agg_loss`).
    soft : str or None
        Replace the hard clip of the clip-form methods (all but ``band_gppo``) by a smooth
        saturation ``s(r)``, one of :data:`SOFT_FORMS` (see :func:`soft_clip`); the term
        becomes :math:`\max(-A r, -A\,s(r))`.  None (default): the hard clip.
    soft_k : float
        ``soft="tanh2"``: the slope of ``s`` at ``r = 1`` (``> 0``).
    soft_width : float
        ``soft="smooth3"``: the room ``s`` saturates into beyond an edge, as a fraction of
        the edge's distance from 1 (``> 0``).

    Raises
    ------
    LossError
        For an unknown method or aggregation, or a value out of range or of the wrong
        type (a bool is not a number); the message names the field.
    fbands.DivergenceError
        For a ``div`` that :func:`fbands.get` does not accept (methods with a
        divergence band only).

    Examples
    --------
    >>> LossConfig(method="clip_higher", eps_high=0.28).eps_high
    0.28
    >>> LossConfig(method="ppo")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fbands.errors.LossError: unknown method 'ppo'; expected one of clip, clip_higher, ...
    """

    method: str = "band_clip"
    div: str = "kl"
    delta: float = 0.05
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip_c: float | None = None
    relax: bool = False
    upper_bound_max: float | None = None
    truncation: float = 10.0
    gppo_beta: float = 1.0
    gppo_beta_low: float | None = None
    agg: str = "token-mean"
    soft: str | None = None
    soft_k: float = 1.0
    soft_width: float = 0.25

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise LossError(f"unknown method {self.method!r}; expected one of {', '.join(METHODS)}")
        if self.agg not in AGG_MODES:
            raise LossError(f"unknown agg {self.agg!r}; expected one of {', '.join(AGG_MODES)}")
        if not isinstance(self.relax, bool):
            raise LossError(f"relax must be True or False, got {self.relax!r}")
        if not isinstance(self.div, str) or not self.div:
            raise LossError(f"div must be a divergence name, got {self.div!r}")
        if self.method in _DIVERGENCE_BAND:
            import fbands  # at call time: the package's __init__ may import this module

            # An unknown or malformed divergence fails here, not at the first batch.  The
            # string is parsed by fbands.get, never evaluated as code.
            fbands.get(self.div)
        _check_number("delta", self.delta, low=0.0, low_open=True)
        _check_number("eps_low", self.eps_low, low=0.0, high=1.0)
        _check_number("eps_high", self.eps_high, low=0.0)
        _check_number("truncation", self.truncation, low=0.0, low_open=True)
        _check_number("gppo_beta", self.gppo_beta, low=0.0)
        if self.gppo_beta_low is not None:
            _check_number("gppo_beta_low", self.gppo_beta_low, low=0.0)
        if self.upper_bound_max is not None:
            _check_number("upper_bound_max", self.upper_bound_max, low=1.0)
        if self.soft is not None:
            if self.soft not in SOFT_FORMS:
                raise LossError(f"unknown soft {self.soft!r}; expected one of "
                                f"{', '.join(SOFT_FORMS)} or None")
            if self.method not in _CLIP_FORM or self.method == "band_gppo":
                raise LossError(f"soft={self.soft!r} applies to the clip-form methods "
                                f"{', '.join(m for m in _CLIP_FORM if m != 'band_gppo')}, "
                                f"not {self.method!r}")
        _check_number("soft_k", self.soft_k, low=0.0, low_open=True)
        _check_number("soft_width", self.soft_width, low=0.0, low_open=True)
        if self.dual_clip_c is not None:
            _check_number("dual_clip_c", self.dual_clip_c, low=1.0, low_open=True)
            if self.method not in _CLIP_FORM:
                raise LossError(
                    f"dual_clip_c={self.dual_clip_c!r} has no meaning for method "
                    f"{self.method!r}; it applies to {', '.join(_CLIP_FORM)}"
                )


def _check_number(name, value, *, low=None, high=None, low_open=False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        lo = "-inf" if low is None else f"{low:g}"
        left = "(" if low_open or low is None else "["
        right = ")" if high is None else "]"
        hi = "inf" if high is None else f"{high:g}"
        raise LossError(f"{name} must be a finite number in {left}{lo}, {hi}{right}, got {value!r}")


class Band(NamedTuple):
    """Log-edges of the allowed ratio interval of each token, shaped like ``logp_old``.

    ``log_lower`` may be ``-inf`` (the lower edge saturates at ratio 0); ``log_upper`` is
    finite for a finite ``logp_old``.  Neither carries a gradient.
    """

    log_lower: Tensor
    log_upper: Tensor


# --------------------------------------------------------------------------------------
# dtypes and input checks


def _compute_dtype(*tensors: Tensor) -> torch.dtype:
    """float32, or float64 when an input is float64: half precision is never computed in."""
    if any(t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def _edge_dtype(device: torch.device) -> torch.dtype:
    """Precision for computing band edges: float64 where the device has it."""
    return torch.float32 if device.type == "mps" else torch.float64


def _as_tensor(name: str, x) -> Tensor:
    if not isinstance(x, Tensor):
        raise LossError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided:
        raise LossError(f"{name} must be a dense tensor, got layout {x.layout}")
    if x.is_complex():
        raise LossError(f"{name} must hold real numbers, got dtype {x.dtype}")
    return x


def _resolve_check(check, *tensors: Tensor) -> bool:
    """``check`` as a bool: ``None`` means "when every tensor is on the CPU" (free there)."""
    if check is None:
        return all(t.device.type == "cpu" for t in tensors)
    if not isinstance(check, bool):
        raise LossError(f"check must be True, False or None, got {check!r}")
    if check and any(t.device.type == "meta" for t in tensors):
        raise LossError("check=True reads the values, which meta tensors do not have; "
                        "pass check=False")
    return check


# A value check: (mask of bad elements, the values to quote, what the values must be).
_Check = tuple[Tensor, Tensor, str]


def _validate(checks: list[_Check]) -> None:
    """Raise :class:`LossError` naming the first bad element of the first failing check.

    All checks are reduced together, so that inputs that pass cost one host
    synchronisation; only the error path reads more.
    """
    if not checks:
        return
    if not bool(torch.stack([bad.any() for bad, _, _ in checks]).any()):
        return
    for bad, values, rule in checks:
        if not bool(bad.any()):
            continue
        count = int(bad.sum())
        index = tuple(int(i) for i in torch.nonzero(bad)[0])
        value = values[index].item() if values.dim() else values.item()
        if values.is_floating_point() and values.dtype != torch.float64:
            value = float(f"{value:.8g}")  # 2.3, not float32's 2.299999952316284
        where = f" at index {index}" if index else ""
        more = f" ({count} elements)" if count > 1 else ""
        raise LossError(f"{rule}; got {value!r}{where}{more}")


def _any_bad(checks: list[_Check]) -> Tensor | None:
    """0-dim bool tensor: does any check fail?  No host synchronisation."""
    if not checks:
        return None
    return torch.stack([bad.any() for bad, _, _ in checks]).any()


def _logp_checks(name: str, x: Tensor, valid: Tensor | None, *, nan: bool) -> list[_Check]:
    """Elements (where ``valid``) above :data:`LOGP_TOLERANCE`, and NaN ones when ``nan``."""
    x = x.detach()
    found = [(x > LOGP_TOLERANCE, f"{name} must hold log-probabilities (<= 0), not positive "
                                  "values (were negative log-likelihoods passed?)")]
    if nan:
        found.append((torch.isnan(x), f"{name} must not be nan on the tokens of the mask"))
    return [(bad if valid is None else bad & valid, x, rule) for bad, rule in found]


def _band_checks(log_lo: Tensor, log_hi: Tensor, valid: Tensor) -> list[_Check]:
    """Band edges (where ``valid``) must not be nan, nor crossed."""
    return [
        (valid & torch.isnan(log_lo), log_lo, "band.log_lower must not be nan"),
        (valid & torch.isnan(log_hi), log_hi, "band.log_upper must not be nan"),
        (valid & (log_lo > log_hi), log_lo, "band.log_lower must not exceed band.log_upper"),
    ]


def _mask_checks(mask: Tensor) -> list[_Check]:
    """A mask is bool, or numbers that are finite and >= 0 (0/1 or weights)."""
    if mask.dtype == torch.bool:
        return []
    bad = mask < 0
    if mask.is_floating_point():
        bad = bad | ~torch.isfinite(mask)
    return [(bad, mask, "mask must be 0/1, bool or finite non-negative weights")]


def _check_inputs(logp_old, logp, advantages, mask):
    logp_old = _as_tensor("logp_old", logp_old)
    logp = _as_tensor("logp", logp)
    advantages = _as_tensor("advantages", advantages)
    mask = _as_tensor("mask", mask)
    if logp_old.dim() < 1:
        raise LossError("logp_old must have at least one dimension (tokens)")
    for name, t in (("logp", logp), ("mask", mask)):
        if t.shape != logp_old.shape:
            raise LossError(
                f"{name} has shape {tuple(t.shape)}, expected logp_old's {tuple(logp_old.shape)}"
            )
    if not logp_old.is_floating_point() or not logp.is_floating_point():
        raise LossError(f"log-probabilities must be floating point, got {logp.dtype}")
    given = tuple(advantages.shape)
    if advantages.dim() == logp_old.dim() - 1:
        advantages = advantages.unsqueeze(-1)  # one advantage per sequence
    _check_broadcast("advantages", given, advantages.shape, logp_old.shape)
    return logp_old, logp, advantages, mask


def _check_broadcast(name: str, given: tuple, shape, target) -> None:
    """Raise unless ``shape`` broadcasts to exactly ``target`` (``given``: as passed in)."""
    try:
        result = torch.broadcast_shapes(shape, target)
    except RuntimeError:
        result = None
    if result != target:
        raise LossError(f"{name} of shape {given} do not broadcast against {tuple(target)}")


# --------------------------------------------------------------------------------------
# bands


def _fixed_log_edges(cfg: LossConfig) -> tuple[float, float]:
    """log(1 - eps_low) (``-inf`` at eps_low = 1) and log(1 + eps_high)."""
    log_lo = -math.inf if cfg.eps_low >= 1.0 else math.log1p(-cfg.eps_low)
    return log_lo, math.log1p(cfg.eps_high)


def dcpo_log_bounds(logp_old: Tensor, eps_low: float, eps_high: float) -> Band:
    r"""Log-edges of DCPO's probability-dependent clip.

    With :math:`p = e^{\text{logp\_old}}`, DCPO (arXiv 2509.02333) clips the ratio to

    .. math::

        \tfrac12 + \tfrac12 \sqrt{\max(0,\, 1 - 4\epsilon_l / p)}
        \;\le\; r \;\le\;
        \tfrac12 + \tfrac12 \sqrt{1 + 4\epsilon_h / p},

    so the lower edge never drops below 1/2 (where the root is imaginary the radicand is
    clamped at 0, as in the reference code).  Both edges are evaluated without cancellation:
    with :math:`t = 4\epsilon/p`,

    .. math::

        \log r_{lo} = \log1p\!\left(-\frac{t/2}{1 + \sqrt{1 - t}}\right),\qquad
        \log r_{hi} = \log1p\!\left(\frac{t/2}{1 + \sqrt{1 + t}}\right)\ (t < 1),

    and for :math:`t \ge 1` the upper edge is :math:`\mathrm{softplus}(s) - \log 2` with
    :math:`s = \tfrac12\,\mathrm{softplus}(\log t)`, exact even when :math:`t` overflows.

    Parameters
    ----------
    logp_old : Tensor
        Old log-probabilities (no gradient is taken).
    eps_low, eps_high : float
        DCPO's :math:`\epsilon_l, \epsilon_h \ge 0`.

    Returns
    -------
    Band
        Log-edges in float64 (float32 on devices without float64), shaped like ``logp_old``.

    Examples
    --------
    >>> import torch
    >>> band = dcpo_log_bounds(torch.log(torch.tensor([0.8, 0.1])), 0.16, 0.2)
    >>> [round(r, 6) for r in band.log_lower.exp().tolist()]  # 1/2 + sqrt(0.2)/2, 1/2
    [0.723607, 0.5]
    >>> [round(r, 6) for r in band.log_upper.exp().tolist()]  # 1/2 + sqrt(2)/2, 1/2 + 3/2
    [1.207107, 2.0]
    """
    x = logp_old.detach().to(_edge_dtype(logp_old.device))
    log2 = math.log(2.0)
    if eps_low > 0:
        log_t = math.log(4.0 * eps_low) - x
        t = torch.exp(torch.clamp(log_t, max=0.0))  # t >= 1 means the root is imaginary
        log_lo = torch.log1p(-0.5 * t / (1.0 + torch.sqrt(1.0 - t)))
    else:
        log_lo = torch.zeros_like(x)
    if eps_high > 0:
        log_t = math.log(4.0 * eps_high) - x
        t = torch.exp(torch.clamp(log_t, max=0.0))
        small = torch.log1p(0.5 * t / (1.0 + torch.sqrt(1.0 + t)))
        large = torch.nn.functional.softplus(0.5 * torch.nn.functional.softplus(log_t)) - log2
        log_hi = torch.where(log_t < 0, small, large)
    else:
        log_hi = torch.zeros_like(x)
    return Band(log_lo, log_hi)


def precompute_band(
    logp_old: Tensor, cfg: LossConfig | None = None, *, mask=None, check: bool | None = True
) -> Band:
    r"""The band of every token, from the old log-probabilities; compute once per batch.

    The band depends only on :math:`p = \pi_{old}(a)` and the configuration, so a trainer
    computes it once after the rollout and passes it to :func:`policy_loss` in every PPO
    epoch.  Every method has one: fixed clips give constant edges, ``dcpo`` its closed form
    (:func:`dcpo_log_bounds`), the ``band_*`` methods and ``trgppo`` the f-divergence band of
    :func:`fbands.log_bounds`.  Then, for any method, ``relax`` widens the band to contain
    :math:`[1 - \epsilon_l, 1 + \epsilon_h]` (``trgppo`` always does) and ``upper_bound_max``
    caps the upper edge.

    Parameters
    ----------
    logp_old : Tensor
        Old log-probabilities of the sampled tokens, any shape (no gradient is taken).
    cfg : LossConfig, optional
        The loss configuration (default ``LossConfig()``: band clip, KL, delta 0.05).
    mask : Tensor, optional
        Response mask; positions where it is 0 get a harmless stand-in probability, so that
        padding holding ``-inf`` or garbage never reaches the band solver.
    check : bool or None
        Validate ``logp_old`` on the tokens of the mask: a value above
        :data:`LOGP_TOLERANCE` (not a log-probability; values in ``(0, 1e-3]`` count as 0)
        or a nan raises :class:`fbands.LossError`.  The check costs one host
        synchronisation on a GPU; ``False`` skips it (for CUDA graphs), and such a token
        then gets nan edges, which make :func:`policy_loss` nan.  ``None``: check when
        ``logp_old`` is on the CPU, where it costs nothing.

    Returns
    -------
    Band
        ``(log_lower, log_upper)``, shaped like ``logp_old``, in float32 (float64 when
        ``logp_old`` is float64), on its device.

    Examples
    --------
    >>> import torch
    >>> band = precompute_band(torch.log(torch.tensor([0.5, 0.01])), LossConfig(method="clip"))
    >>> band.log_lower.exp(), band.log_upper.exp()
    (tensor([0.8000, 0.8000]), tensor([1.2000, 1.2000]))
    """
    cfg = LossConfig() if cfg is None else cfg
    if not isinstance(cfg, LossConfig):
        raise LossError(f"cfg must be a LossConfig, got {type(cfg).__name__}")
    logp_old = _as_tensor("logp_old", logp_old)
    check = _resolve_check(check, logp_old)
    out_dtype = _compute_dtype(logp_old)
    with torch.no_grad():
        x = logp_old.detach().to(out_dtype)
        valid = None
        if mask is not None:
            mask = _as_tensor("mask", mask)
            if mask.shape != x.shape:
                raise LossError(
                    f"mask has shape {tuple(mask.shape)}, expected logp_old's {tuple(x.shape)}"
                )
            valid = mask != 0
            x = torch.where(valid, x, torch.full_like(x, _PAD_LOGP))
        checks = _logp_checks("logp_old", x, valid, nan=True)
        bad = None
        if check:
            _validate(checks)
        else:  # bad tokens get nan edges; the solver sees a harmless stand-in
            bad = checks[0][0] | checks[1][0]
            x = torch.where(bad, torch.full_like(x, _PAD_LOGP), x)
        x = x.clamp(max=0.0)  # a log-softmax may round a near-certain token to +1e-7
        fixed_lo, fixed_hi = _fixed_log_edges(cfg)
        if cfg.method in _DIVERGENCE_BAND:
            log_lo, log_hi = _divergence_band(x, valid, cfg)
        elif cfg.method == "dcpo":
            log_lo, log_hi = dcpo_log_bounds(x, cfg.eps_low, cfg.eps_high)
        else:  # _FIXED_BAND
            log_lo = torch.full_like(x, fixed_lo)
            log_hi = torch.full_like(x, fixed_hi)
        log_lo, log_hi = log_lo.to(out_dtype), log_hi.to(out_dtype)
        if cfg.relax or cfg.method == "trgppo":
            log_lo = torch.clamp(log_lo, max=fixed_lo)
            log_hi = torch.clamp(log_hi, min=fixed_hi)
        if cfg.upper_bound_max is not None:
            log_hi = torch.clamp(log_hi, max=math.log(cfg.upper_bound_max))
        if bad is not None:
            nan = torch.full_like(log_lo, math.nan)
            log_lo, log_hi = torch.where(bad, nan, log_lo), torch.where(bad, nan, log_hi)
    return Band(log_lo, log_hi)


def _on_host(x: Tensor) -> bool:
    """Whether ``x`` lies in host memory, where numpy can index it without a copy."""
    return x.device.type == "cpu"


def _divergence_band(x: Tensor, valid: Tensor | None, cfg: LossConfig) -> tuple[Tensor, Tensor]:
    """:func:`fbands.log_bounds` of the valid log-probabilities ``x`` (padding already
    replaced by :data:`_PAD_LOGP`).

    On the CPU only the tokens of the mask are solved (trainers hand over padded
    ``(batch, length)`` tensors, often several times more padding than tokens); padding
    takes the band of the stand-in, solved once with them.  On an accelerator the whole
    tensor goes through: picking the tokens would cost a host synchronisation (their
    count), more than the device table pass spends on the padding.
    """
    import fbands  # at call time: the package's __init__ may import this module

    # x is valid now (checked, or bad tokens replaced): no second check, no sync.
    if valid is None or not _on_host(x):
        return fbands.log_bounds(x, cfg.delta, cfg.div, logp=True, check=False)
    flat = x.reshape(-1).numpy()  # (numpy's indexing is several times faster than torch's)
    idx = np.flatnonzero(valid.reshape(-1).numpy())
    kept = np.concatenate((flat[idx], np.array([_PAD_LOGP], flat.dtype)))  # (tokens + 1,)
    lo, hi = (e.numpy() for e in fbands.log_bounds(torch.from_numpy(kept), cfg.delta, cfg.div,
                                                   logp=True, check=False))
    out_lo, out_hi = np.full_like(flat, lo[-1]), np.full_like(flat, hi[-1])
    out_lo[idx], out_hi[idx] = lo[:-1], hi[:-1]
    log_lo, log_hi = torch.from_numpy(out_lo).view(x.shape), torch.from_numpy(out_hi).view(x.shape)
    return log_lo, log_hi


# --------------------------------------------------------------------------------------
# aggregation


def agg_loss(
    values: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    *,
    num_tokens=None,
    num_seqs=None,
    loss_scale_factor=None,
    check: bool | None = None,
) -> Tensor:
    r"""Aggregate per-token values over a response mask into a 0-dim tensor (verl's modes).

    With :math:`v_{it}` the values, :math:`m_{it}` the mask, :math:`s_i = \sum_t m_{it}
    v_{it}`, :math:`n_i = \sum_t m_{it}` and :math:`B` sequences:

    .. math::

        \text{token-mean} = \frac{\sum_i s_i}{\sum_i n_i},\quad
        \text{token-sum} = \sum_i s_i,\quad
        \text{seq-mean-token-mean} = \frac1B \sum_i \frac{s_i}{n_i},

    .. math::

        \text{seq-mean-token-sum} = \frac1B \sum_i s_i,\quad
        \text{seq-mean-token-sum-norm} = \frac1B \sum_i \frac{s_i}{L}
        \ (L = T \text{ by default; Dr. GRPO}).

    :math:`B` counts the rows with at least one token (fully masked rows are left out, as in
    verl 0.9.1's ``agg_loss``); a batch with no tokens gives 0 instead of NaN.  Masked-out
    values never leak in, even if they are ``inf`` or ``nan``.

    Parameters
    ----------
    values : Tensor
        Per-token values ``(B, T)`` (any shape ``(..., T)`` for the token modes); integer
        or bool values are aggregated in float32.
    mask : Tensor
        Same shape; 0/1, bool, or finite non-negative weights.
    mode : str
        One of :data:`AGG_MODES`.
    num_tokens : float or Tensor, optional
        Denominator of ``token-mean`` in place of :math:`\sum n_i`, e.g. the token count of
        the whole mini-batch when it is split into micro-batches.  Finite and > 0.
    num_seqs : float or Tensor, optional
        :math:`B` of the ``seq-mean-*`` modes, in place of the local row count.  Finite
        and > 0.
    loss_scale_factor : float, optional
        :math:`L` of ``seq-mean-token-sum-norm`` (default: ``T``, the padded length).
        Finite and > 0.
    check : bool or None
        Validate the tensor inputs (a negative or non-finite mask entry, a denominator
        tensor that is not finite and > 0) at the cost of one host synchronisation on a
        GPU.  ``None`` (default) checks when the tensors are on the CPU, where that costs
        nothing; unchecked, such an input makes the result nan.  Python-number
        denominators are always checked.

    Returns
    -------
    Tensor
        0-dim, in ``values``' dtype (float32 for integer values).

    Raises
    ------
    LossError
        For a bad mode, shape, mask or denominator; the message names the argument.

    Examples
    --------
    >>> import torch
    >>> v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    >>> m = torch.tensor([[1, 1, 1], [1, 0, 0]])
    >>> [round(agg_loss(v, m, mode).item(), 4) for mode in AGG_MODES]
    [2.5, 10.0, 3.0, 5.0, 1.6667]
    """
    values, mask = _agg_inputs(values, mask, mode)
    checks = _mask_checks(mask) + _denominator_checks(num_tokens, num_seqs, loss_scale_factor)
    if _resolve_check(check, values, mask):
        _validate(checks)
        checks = []
    out = _aggregate(values, mask, mode, num_tokens, num_seqs, loss_scale_factor)
    return _poison(out, _any_bad(checks))


def _agg_inputs(values, mask, mode: str) -> tuple[Tensor, Tensor]:
    """Type and shape checks of :func:`agg_loss`'s tensors; integer values become float32."""
    values = _as_tensor("values", values)
    mask = _as_tensor("mask", mask)
    if mode not in AGG_MODES:
        raise LossError(f"unknown agg mode {mode!r}; expected one of {', '.join(AGG_MODES)}")
    if values.shape != mask.shape:
        raise LossError(
            f"values of shape {tuple(values.shape)} and mask of shape {tuple(mask.shape)} differ"
        )
    if values.dim() < 1:
        raise LossError("values must have a token dimension")
    if not values.is_floating_point():  # integer or bool values: averaged in float32
        values = values.to(torch.float32)
    return values, mask


def _denominator_checks(num_tokens, num_seqs, loss_scale_factor) -> list[_Check]:
    """Each given denominator must be a finite number > 0.

    Python numbers are checked here (free); tensors give a check for :func:`_validate`.
    """
    checks = []
    for name, value in (("num_tokens", num_tokens), ("num_seqs", num_seqs),
                        ("loss_scale_factor", loss_scale_factor)):
        if value is None:
            continue
        rule = f"{name} must be a finite number > 0"
        if isinstance(value, Tensor):
            value = _as_tensor(name, value)
            if value.numel() != 1 or value.dtype == torch.bool:
                raise LossError(f"{rule}, got a tensor of shape {tuple(value.shape)} and "
                                f"dtype {value.dtype}")
            bad = value <= 0
            if value.is_floating_point():
                bad = bad | ~torch.isfinite(value)
            checks.append((bad.reshape(()), value.reshape(()), rule))
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise LossError(f"{rule}, got {value!r}")
        elif not (math.isfinite(value) and value > 0):
            raise LossError(f"{rule}, got {value!r}")
    return checks


def _poison(out: Tensor, bad: Tensor | None) -> Tensor:
    """``out``, or nan where ``bad`` (an unchecked invalid input): never a plausible value."""
    if bad is None:
        return out
    return torch.where(bad, torch.full_like(out, math.nan), out)


def _aggregate(values, mask, mode, num_tokens, num_seqs, loss_scale_factor) -> Tensor:
    """The formulas of :func:`agg_loss`, on checked inputs."""
    weight = mask.to(values.dtype)
    # where(), not a product, so that inf/nan at masked positions cannot leak in.
    masked = torch.where(mask != 0, values * weight, torch.zeros_like(values))
    tiny = torch.finfo(values.dtype).tiny
    if mode == "token-sum":
        return masked.sum()
    if mode == "token-mean":
        denom = weight.sum().clamp(min=tiny) if num_tokens is None else num_tokens
        return masked.sum() / denom
    seq_sum = masked.sum(dim=-1)  # (B,)
    if mode == "seq-mean-token-mean":
        per_seq = seq_sum / weight.sum(dim=-1).clamp(min=tiny)
    elif mode == "seq-mean-token-sum":
        per_seq = seq_sum
    else:  # seq-mean-token-sum-norm
        scale = max(values.shape[-1], 1) if loss_scale_factor is None else loss_scale_factor
        per_seq = seq_sum / scale
    if num_seqs is None:  # rows with no token at all are left out, as verl 0.9.1 does
        num_seqs = (weight.sum(dim=-1) > 0).sum().clamp(min=1)
    return per_seq.sum() / num_seqs


# --------------------------------------------------------------------------------------
# the losses


def _masked_mean(x: Tensor, weight: Tensor) -> Tensor:
    return (x * weight).sum() / weight.sum().clamp(min=1.0)


def _clip_form(logratio, adv, log_lo, log_hi, cfg):
    """PPO-form term -A exp(eff), with eff the log-ratio clipped on the advantage's side.

    For A >= 0, max(-A r, -A clip(r, lo, hi)) = -A min(r, hi); for A < 0 it is
    -A max(r, lo), and dual clip also caps that at -A c: in log space eff is log r clamped
    from one side, and a clamped token has no gradient (band_gppo gives it one back).
    """
    upper = (adv > 0) & (logratio > log_hi)
    lower = (adv < 0) & (logratio < log_lo)
    c = cfg.dual_clip_c
    if c is None and cfg.method == "dual_clip":
        c = _DEFAULT_DUAL_CLIP_C
    if c is not None:
        log_c = math.log(c)
        dual = (adv < 0) & (logratio > log_c)
    else:
        log_c = math.inf
        dual = torch.zeros_like(upper)
    if cfg.method == "band_gppo":
        # Straight-through: the value is the clipped one, exp(edge); the gradient is
        # beta * edge * A * grad(log pi), the surrogate's own gradient at the edge.
        moving = logratio - logratio.detach()  # 0 in value, d log r in gradient
        beta_low = cfg.gppo_beta if cfg.gppo_beta_low is None else cfg.gppo_beta_low
        hi_val = log_hi + cfg.gppo_beta * moving
        lo_val = log_lo + beta_low * moving
    else:
        hi_val, lo_val = log_hi, log_lo
    eff = torch.where(upper, hi_val, logratio)
    eff = torch.where(lower, lo_val, eff)
    eff = torch.where(dual, torch.full_like(logratio, log_c), eff)
    per_token = -adv * torch.exp(eff.clamp(max=_MAX_LOG_RATIO))
    return per_token, upper, lower, dual, torch.zeros_like(upper)


def _saturate(d: Tensor, log_scale: Tensor, k: float) -> Tensor:
    """``scale * tanh(k d / scale)``, written as ``k d phi(k d / scale)`` with
    ``phi(x) = tanh(x) / x``: finite and smooth for any finite ``d`` even when ``scale``
    (given by its log) overflows, and exact as ``x -> 0`` (``phi = 1 - x^2 / 3``)."""
    kd = k * d
    # A scale below e^-20 (an edge at ~1, eps = 0) acts as a hard clip; the floor keeps
    # 1 / scale finite, so that no 0 * inf reaches the value or the gradient.
    x = kd * torch.exp(-log_scale.clamp(min=-20.0))
    small = x.abs() < 1e-4
    x_safe = torch.where(small, torch.ones_like(x), x)
    phi = torch.where(small, 1 - x * x / 3, torch.tanh(x_safe) / x_safe)
    return kd * phi


def soft_clip(logratio: Tensor, log_lo: Tensor, log_hi: Tensor, form: str, *,
              k: float = 1.0, width: float = 0.25) -> Tensor:
    r"""The smooth saturation ``s(r)`` that ``LossConfig.soft`` puts in place of
    ``clip(r, r_lo, r_hi)``, from log-ratios and log-edges.

    ``tanh1`` (one segment, centred on the band): :math:`s = m + h	anh((r - m)/h)` with
    :math:`m = (r_{lo} + r_{hi})/2`, :math:`h = (r_{hi} - r_{lo})/2`.  Its slope at ``m``
    is 1, it tends to the edges, and it is not 1 at ``r = 1`` for a band that is not
    symmetric about 1 (a tail token's).

    ``tanh2`` (two segments joined at ``r = 1``): :math:`s = 1 + e	anh(k (r - 1)/e)` with
    :math:`e = r_{hi} - 1` for ``r >= 1`` and :math:`e = 1 - r_{lo}` below.  ``s(1) = 1``,
    slope ``k`` there, tends to the edges.

    ``smooth3`` (three segments): the identity inside the band, and beyond an edge ``b``
    :math:`s = b + w	anh((r - b)/w)` with :math:`w = 	ext{width}\cdot|b - 1|`: value and
    slope continuous at the edges, saturating at ``b +- w``.

    Ratios and edges are exponentiated from at most :math:`\log r = 80` (as the hard clip
    does), and each tanh is evaluated as ``k d tanh(x)/x`` with its scale given in log
    space, so that an edge that overflows the dtype gives a finite ``s`` (close to ``r``:
    such a band does not restrain the token).
    """
    lr = logratio.clamp(max=_MAX_LOG_RATIO)
    r = torch.exp(lr)
    hi_c = log_hi.clamp(max=_MAX_LOG_RATIO)
    if form == "tanh2":
        log_e_hi = torch.log(torch.expm1(hi_c))  # log(r_hi - 1)
        log_e_lo = torch.log(-torch.expm1(log_lo))  # log(1 - r_lo), 0 at r_lo = 0
        above = lr >= 0
        d = torch.expm1(lr)
        return 1 + _saturate(d, torch.where(above, log_e_hi, log_e_lo), k)
    if form == "tanh1":
        lo, hi = torch.exp(log_lo), torch.exp(hi_c)
        m, h = (lo + hi) / 2, (hi - lo) / 2
        return m + _saturate(r - m, torch.log(h), 1.0)
    if form == "smooth3":
        lo, hi = torch.exp(log_lo), torch.exp(hi_c)
        log_w_hi = math.log(width) + torch.log(torch.expm1(hi_c))
        log_w_lo = math.log(width) + torch.log(-torch.expm1(log_lo))
        up = hi + _saturate(r - hi, log_w_hi, 1.0)
        down = lo + _saturate(r - lo, log_w_lo, 1.0)
        return torch.where(logratio > log_hi, up, torch.where(logratio < log_lo, down, r))
    raise LossError(f"unknown soft form {form!r}; expected one of {', '.join(SOFT_FORMS)}")


def _soft_clip_form(logratio, adv, log_lo, log_hi, cfg):
    """PPO form with ``clip`` replaced by :func:`soft_clip`: ``max(-A r, -A s(r))``, i.e.
    ``-A min(r, s)`` for A >= 0 and ``-A max(r, s)`` (then capped by dual clip) for A < 0.
    The clip fractions count the tokens beyond the edge on the advantage's side."""
    upper = (adv > 0) & (logratio > log_hi)
    lower = (adv < 0) & (logratio < log_lo)
    r = torch.exp(logratio.clamp(max=_MAX_LOG_RATIO))
    s = soft_clip(logratio, log_lo, log_hi, cfg.soft, k=cfg.soft_k, width=cfg.soft_width)
    v = torch.where(adv >= 0, torch.minimum(r, s), torch.maximum(r, s))
    c = cfg.dual_clip_c
    if c is None and cfg.method == "dual_clip":
        c = _DEFAULT_DUAL_CLIP_C
    if c is not None:
        dual = (adv < 0) & (v > c)
        v = torch.where(dual, torch.full_like(v, c), v)
    else:
        dual = torch.zeros_like(upper)
    return -adv * v, upper, lower, dual, torch.zeros_like(upper)


def soft_options(soft=None, soft_k=None, soft_width=None, *, prefix: str = "") -> dict:
    """The :class:`LossConfig` fields of a soft clip chosen by a trainer's options.

    The trainers (``fbands train``, TRL, verl) expose ``soft``, ``soft_k`` and
    ``soft_width`` with ``None`` meaning "not given"; this reads them the same way
    everywhere.  ``soft`` is ``None`` or ``""`` (the hard clip) or one of
    :data:`SOFT_FORMS`; ``soft_k`` may only be given with ``tanh2`` and ``soft_width`` only
    with ``smooth3`` (a value the chosen form ignores is a mistake, not a no-op).  Values
    left ``None`` keep :class:`LossConfig`'s defaults.  ``prefix`` is put before each name
    in the messages (``"band_"``, ``"policy_loss."``).

    Raises
    ------
    LossError
        For an unknown form, or ``soft_k`` / ``soft_width`` given for a form without it.

    Examples
    --------
    >>> soft_options("tanh2", soft_k=2.0)
    {'soft': 'tanh2', 'soft_k': 2.0}
    >>> soft_options("", None, None)
    {'soft': None}
    >>> soft_options("tanh1", soft_width=0.5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fbands.errors.LossError: soft_width=0.5 applies to soft='smooth3' only, not soft='tanh1'
    """
    if soft == "":
        soft = None
    if soft is not None and soft not in SOFT_FORMS:
        raise LossError(f"{prefix}soft={soft!r}: expected one of {', '.join(SOFT_FORMS)}, "
                        "or none for the hard clip")
    fields = {"soft": soft}
    for name, value, form in (("soft_k", soft_k, "tanh2"), ("soft_width", soft_width, "smooth3")):
        if value is None:
            continue
        if soft != form:
            raise LossError(f"{prefix}{name}={value!r} applies to {prefix}soft={form!r} only, "
                            f"not {prefix}soft={soft!r}")
        fields[name] = value
    return fields


def _band_mask(logratio, logp, adv, log_lo, log_hi, cfg):
    """DPPO form: -A sg(min(r, C)) log pi, dropped where the token left its band."""
    upper = (adv > 0) & (logratio > log_hi)
    lower = (adv < 0) & (logratio < log_lo)
    keep = ~(upper | lower)
    log_c = math.log(cfg.truncation)
    weight = torch.exp(logratio.detach().clamp(max=min(log_c, _MAX_LOG_RATIO)))
    per_token = torch.where(keep, -adv * weight * logp, torch.zeros_like(logp))
    trunc = keep & (logratio > log_c)
    return per_token, upper, lower, torch.zeros_like(upper), trunc


def _cispo(logratio, logp, adv, log_lo, log_hi):
    """CISPO: -sg(clip(r, lo, hi)) A log pi; every token keeps its gradient."""
    upper = logratio > log_hi
    lower = logratio < log_lo
    clipped = torch.minimum(torch.maximum(logratio.detach(), log_lo), log_hi)
    weight = torch.exp(clipped.clamp(max=_MAX_LOG_RATIO))
    per_token = -adv * weight * logp
    none = torch.zeros_like(upper)
    return per_token, upper, lower, none, none


def policy_loss(
    logp_old: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: LossConfig | None = None,
    band: Band | None = None,
    *,
    weights: Tensor | None = None,
    num_tokens=None,
    num_seqs=None,
    loss_scale_factor=None,
    check: bool | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    r"""Policy loss of any method in :data:`METHODS`, aggregated over the response mask.

    With :math:`\log r = \text{logp} - \text{logp\_old}` and the band
    :math:`[r_{lo}, r_{hi}]` of :func:`precompute_band`, the clip-form methods (``clip``,
    ``clip_higher``, ``dual_clip``, ``dcpo``, ``trgppo``, ``band_clip``) use

    .. math::

        \ell_t = \max\bigl(-A r,\; -A\,\mathrm{clip}(r, r_{lo}, r_{hi})\bigr),
        \qquad\text{and for } A < 0 \text{ with dual clip: } \min(\ell_t, -cA),

    computed as :math:`-A e^{u}` with :math:`u = \min(\log r, \log r_{hi})` for
    :math:`A \ge 0` and :math:`u = \max(\log r, \log r_{lo})` (then :math:`\min(u, \log c)`)
    for :math:`A < 0`: the same value, and no ratio beyond the edge is ever exponentiated.
    ``band_gppo`` has the same value, but a token clipped at edge :math:`b` keeps the
    gradient :math:`-\beta\, b\, A\, \nabla \log\pi` (straight-through:
    :math:`u = \mathrm{sg}(\log b) + \beta(\log r - \mathrm{sg}(\log r))`) instead of none.
    ``band_mask`` and ``cispo`` use an importance weight under stop-gradient,

    .. math::

        \ell_t^{\text{mask}} = -A\,\mathrm{sg}(\min(r, C))\log\pi \cdot
        [\text{not } (A > 0,\ r > r_{hi}) \text{ and not } (A < 0,\ r < r_{lo})],
        \qquad
        \ell_t^{\text{cispo}} = -A\,\mathrm{sg}(\mathrm{clip}(r, r_{lo}, r_{hi}))\log\pi .

    Parameters
    ----------
    logp_old : Tensor
        ``(B, T)`` behaviour-policy log-probabilities of the sampled tokens.
    logp : Tensor
        ``(B, T)`` current-policy log-probabilities (with gradient); bf16/fp16 are computed
        in float32, and the gradient flows back in ``logp``'s dtype.
    advantages : Tensor
        ``(B, T)``, ``(B,)`` or ``(B, 1)``; treated as constants.
    mask : Tensor
        ``(B, T)`` response mask (bool or 0/1).  Masked positions may hold anything.
    cfg : LossConfig, optional
        Method and constants (default ``LossConfig()``).
    band : Band, optional
        From :func:`precompute_band` for this ``logp_old`` and ``cfg``; computed here when
        None.
    weights : Tensor, optional
        Per-token multipliers of the loss terms, broadcasting against ``(B, T)`` and treated
        as constants, e.g. verl's rollout importance-sampling weights.
    num_tokens, num_seqs, loss_scale_factor : optional
        Passed to :func:`agg_loss` (global denominators for micro-batching).
    check : bool or None
        Validate the values on the tokens of the mask: ``logp_old`` and ``logp`` are
        log-probabilities (nothing above :data:`LOGP_TOLERANCE`), the band's edges are
        not nan and not crossed, the mask is finite and non-negative, a denominator
        tensor is finite and > 0; a failure raises :class:`fbands.LossError`.  This costs
        one host synchronisation on a GPU (two when ``band`` is None: the band's own
        check).  ``None`` (default): check when the tensors are on the CPU, where it is
        free, and skip on an accelerator, keeping the hot path free of syncs; unchecked,
        an invalid input makes the loss nan (never a plausible value).  A nan in
        ``logp``, ``advantages`` or ``weights`` on a token of the mask is not an error: it
        gives a nan loss, which a trainer's non-finite check catches (a nan in
        ``logp_old`` too when ``band`` is given; :func:`precompute_band` rejects it).

    Returns
    -------
    loss : Tensor
        0-dim, float32 (float64 for float64 input), with gradient.  An empty batch,
        ``(0, T)`` or ``(B, 0)``, gives 0 (with a zero gradient) and zero metrics.
    metrics : dict of str to Tensor
        0-dim detached tensors (no host sync), keys :data:`METRIC_KEYS`, all over the mask:
        ``clipfrac_upper`` / ``clipfrac_lower``: fraction of tokens whose gradient the upper
        / lower edge changed (for ``cispo``: whose weight was clipped); ``clipfrac`` their
        sum; ``tail_clipfrac_upper``: ``clipfrac_upper`` among the tokens with
        :math:`p < 0.1` and :math:`A > 0`; ``dual_clipfrac``: tokens capped by dual clip;
        ``truncfrac``: ``band_mask`` tokens whose weight hit :math:`C`; ``band_width``: mean
        :math:`r_{hi} - r_{lo}`; ``approx_kl_k1`` / ``approx_kl_k3``: mean of
        :math:`-\log r` / :math:`r - 1 - \log r` (estimates of
        :math:`\mathrm{KL}(\pi_{old} \| \pi)`); ``ratio_mean`` / ``ratio_max`` /
        ``ratio_min``.

    Raises
    ------
    LossError
        For a bad configuration, shape, type or (checked) value; the message names the
        argument, and for values the first bad index and value.

    Examples
    --------
    >>> import torch
    >>> logp_old = torch.log(torch.tensor([[0.5, 0.1]]))
    >>> logp = (logp_old + torch.tensor([[0.4, -0.4]])).requires_grad_()
    >>> cfg = LossConfig(method="dual_clip", agg="token-sum")
    >>> loss, m = policy_loss(logp_old, logp, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), cfg)
    >>> loss.backward()
    >>> round(loss.item(), 4), logp.grad
    (-0.4, tensor([[0., 0.]]))
    >>> m["clipfrac_upper"].item(), m["clipfrac_lower"].item()
    (0.5, 0.5)
    """
    cfg = LossConfig() if cfg is None else cfg
    if not isinstance(cfg, LossConfig):
        raise LossError(f"cfg must be a LossConfig, got {type(cfg).__name__}")
    logp_old, logp, advantages, mask = _check_inputs(logp_old, logp, advantages, mask)
    check = _resolve_check(check, logp_old, logp, mask)
    dtype = _compute_dtype(logp_old, logp)
    valid = mask != 0
    if band is None:
        band = precompute_band(logp_old, cfg, mask=mask, check=check)
    elif not isinstance(band, tuple) or len(band) != 2:
        raise LossError(f"band must be a Band (log_lower, log_upper), got {type(band).__name__}")
    log_lo, log_hi = (_as_tensor(f"band.{name}", edge).detach().to(dtype)
                      for name, edge in zip(Band._fields, band, strict=True))
    if log_lo.shape != logp_old.shape or log_hi.shape != logp_old.shape:
        raise LossError(
            f"band edges of shape {tuple(log_lo.shape)} / {tuple(log_hi.shape)} do not match "
            f"logp_old's {tuple(logp_old.shape)}"
        )
    checks = [
        *_logp_checks("logp_old", logp_old, valid, nan=False),
        *_logp_checks("logp", logp, valid, nan=False),
        *_band_checks(log_lo, log_hi, valid),
        *_mask_checks(mask),
        *_denominator_checks(num_tokens, num_seqs, loss_scale_factor),
    ]
    if check:
        _validate(checks)
        checks = []

    # Masked positions are replaced before any arithmetic: padding may hold -inf or nan,
    # and a nan anywhere in the graph would poison the gradient even where it is masked.
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    logp_c = torch.where(valid, logp.to(dtype), zero)  # (B, T), gradient flows to logp
    logp_old_c = torch.where(valid, logp_old.detach().to(dtype), zero)
    adv = torch.where(valid, advantages.detach().to(dtype), zero)  # broadcasts to (B, T)
    log_lo = torch.where(valid, log_lo, torch.full_like(log_lo, -math.inf))
    log_hi = torch.where(valid, log_hi, torch.full_like(log_hi, math.inf))
    logratio = logp_c - logp_old_c  # (B, T)

    if cfg.method == "band_mask":
        terms = _band_mask(logratio, logp_c, adv, log_lo, log_hi, cfg)
    elif cfg.method == "cispo":
        terms = _cispo(logratio, logp_c, adv, log_lo, log_hi)
    elif cfg.soft is not None:
        terms = _soft_clip_form(logratio, adv, log_lo, log_hi, cfg)
    else:
        terms = _clip_form(logratio, adv, log_lo, log_hi, cfg)
    per_token, upper, lower, dual, trunc = terms  # (B, T) loss and four (B, T) bool masks
    if weights is not None:
        weights = _as_tensor("weights", weights)
        _check_broadcast("weights", tuple(weights.shape), weights.shape, per_token.shape)
        per_token = per_token * torch.where(valid, weights.detach().to(dtype), zero)
    loss = _aggregate(per_token, mask, cfg.agg, num_tokens, num_seqs, loss_scale_factor)
    loss = _poison(loss, _any_bad(checks))  # unchecked invalid input: nan, never plausible
    metrics = _metrics(logratio, logp_old_c, adv, valid, log_lo, log_hi, upper, lower, dual, trunc)
    return loss, metrics


def _metrics(logratio, logp_old, adv, valid, log_lo, log_hi, upper, lower, dual, trunc):
    """Per-batch diagnostics, all 0-dim detached tensors; no host sync."""
    with torch.no_grad():
        w = valid.to(logratio.dtype)
        lr = logratio.detach().clamp(max=_MAX_LOG_RATIO)
        ratio = torch.exp(lr)
        f = logratio.dtype
        clip_up = _masked_mean(upper.to(f), w)
        clip_lo = _masked_mean(lower.to(f), w)
        tail = w * ((logp_old < math.log(TAIL_PROB)) & (adv > 0)).to(f)
        width = torch.exp(log_hi.clamp(max=_MAX_LOG_RATIO)) - torch.exp(log_lo)
        width = torch.where(valid, width, torch.zeros_like(width))
        any_valid = valid.any()
        zero = torch.zeros((), dtype=f, device=logratio.device)
        big = torch.finfo(f).max
        if ratio.numel():
            ratio_max = torch.where(valid, ratio, torch.full_like(ratio, -big)).amax()
            ratio_min = torch.where(valid, ratio, torch.full_like(ratio, big)).amin()
        else:  # an empty batch, (0, T) or (B, 0)
            ratio_max = ratio_min = zero
        return {
            "clipfrac": clip_up + clip_lo,
            "clipfrac_upper": clip_up,
            "clipfrac_lower": clip_lo,
            "tail_clipfrac_upper": _masked_mean(upper.to(f), tail),
            "dual_clipfrac": _masked_mean(dual.to(f), w),
            "truncfrac": _masked_mean(trunc.to(f), w),
            "band_width": _masked_mean(width, w),
            "approx_kl_k1": _masked_mean(-lr, w),
            "approx_kl_k3": _masked_mean(torch.expm1(lr) - lr, w),
            "ratio_mean": _masked_mean(ratio, w),
            "ratio_max": torch.where(any_valid, ratio_max, zero),
            "ratio_min": torch.where(any_valid, ratio_min, zero),
        }


# --------------------------------------------------------------------------------------
# presets

_PRESETS = {
    "clip": {"method": "clip", "eps_low": 0.2, "eps_high": 0.2},
    "clip-higher": {"method": "clip_higher", "eps_low": 0.2, "eps_high": 0.28},
    "dual-clip": {"method": "dual_clip", "eps_low": 0.2, "eps_high": 0.2, "dual_clip_c": 3.0},
    "dcpo": {
        "method": "dcpo",
        "eps_low": 0.16,
        "eps_high": 0.2,
        "upper_bound_max": 10.0,
        "dual_clip_c": 3.0,
    },
    "trgppo": {"method": "trgppo", "div": "kl", "delta": 0.05, "eps_low": 0.2, "eps_high": 0.2},
    "cispo": {"method": "cispo", "eps_low": 1.0, "eps_high": 0.28},
}
_BAND_PREFIXES = (("band-mask-", "band_mask"), ("band-gppo-", "band_gppo"), ("band-", "band_clip"))


def preset(name: str, **overrides) -> LossConfig:
    """A named configuration, as used by the trainer's command line and the docs.

    ============================ ===============================================================
    name                         configuration
    ============================ ===============================================================
    ``clip``                     PPO clip, eps 0.2
    ``clip-higher``              Clip-Higher (DAPO), eps_low 0.2, eps_high 0.28
    ``dual-clip``                PPO clip, eps 0.2, dual clip c = 3
    ``dcpo``                     DCPO bounds with eps_low 0.16, eps_high 0.2, upper capped at
                                 10 and dual clip c = 3 (the settings of the DCPO code)
    ``trgppo``                   KL band (delta 0.05) united with the clip [0.8, 1.2]
    ``cispo``                    CISPO, weight clipped above at 1.28, no lower clip
    ``band-<div>``               band clip (BandPO) of divergence ``<div>``, delta 0.05
    ``band-mask-<div>``          band mask (DPPO form), delta 0.05, truncation C = 10
    ``band-gppo-<div>``          band clip with gradient-preserving clipped tokens, delta 0.05
    ============================ ===============================================================

    ``<div>`` is any name :func:`fbands.log_bounds` accepts, parameters included
    (``band-alpha(a=0.5)``); in the name a dash may stand for an underscore
    (``band-reverse-kl``).

    Parameters
    ----------
    name : str
        The preset's name.
    **overrides
        Fields of :class:`LossConfig` to change, e.g. ``delta=0.1``.

    Returns
    -------
    LossConfig

    Examples
    --------
    >>> cfg = preset("band-kl", delta=0.1)
    >>> cfg.method, cfg.div, cfg.delta
    ('band_clip', 'kl', 0.1)
    >>> preset("band-mask-tv").method, preset("clip-higher").eps_high
    ('band_mask', 0.28)
    """
    if not isinstance(name, str):
        raise LossError(f"preset name must be a string, got {name!r}")
    if name in _PRESETS:
        fields = dict(_PRESETS[name])
    else:
        fields = None
        for prefix, method in _BAND_PREFIXES:
            if name.startswith(prefix) and len(name) > len(prefix):
                div = name[len(prefix) :]
                head, paren, params = div.partition("(")  # "alpha(a=-1)" keeps its minus
                div = head.replace("-", "_") + paren + params
                fields = {"method": method, "div": div, "delta": 0.05}
                break
        if fields is None:
            known = ", ".join([*_PRESETS, "band-<div>", "band-mask-<div>", "band-gppo-<div>"])
            raise LossError(f"unknown preset {name!r}; expected one of {known}")
    known_fields = {f.name for f in dataclasses.fields(LossConfig)}
    unknown = sorted(set(overrides) - known_fields)
    if unknown:
        raise LossError(f"unknown LossConfig field(s) {', '.join(unknown)} in preset({name!r})")
    fields.update(overrides)
    return LossConfig(**fields)
