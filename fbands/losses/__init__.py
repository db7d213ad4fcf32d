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

from fbands._optional import raise_missing

try:
    import torch  # noqa: F401  (every module of the package needs it)
except ModuleNotFoundError as exc:
    raise_missing(exc, "fbands.losses")

from fbands.errors import LossError
from fbands.losses import config as _config
from fbands.losses import metrics as _metrics_module
from fbands.losses.aggregate import agg_loss
from fbands.losses.band import Band, dcpo_log_bounds, precompute_band
from fbands.losses.checks import LOGP_TOLERANCE as LOGP_TOLERANCE  # public, not in __all__
from fbands.losses.config import SOFT_ALIASES as SOFT_ALIASES  # public, not in __all__
from fbands.losses.config import SOFT_PARAMS as SOFT_PARAMS  # public, not in __all__
from fbands.losses.config import LossConfig, preset, soft_options
from fbands.losses.gate import GATE_MODES as GATE_MODES  # public, not in __all__
from fbands.losses.gate import mismatch_gate
from fbands.losses.metrics import TAIL_PROB as TAIL_PROB  # public, not in __all__
from fbands.losses.policy import policy_loss
from fbands.losses.soft import soft_clip

# The modules, by job: config (LossConfig, its validation, the presets, the soft options),
# checks (the input checks), band (precompute_band, DCPO's closed form), terms (the per-token
# term of each method), soft (the soft clip), aggregate (agg_loss), metrics (the diagnostics),
# policy (policy_loss, which calls all of them) and gate (mismatch_gate, the rollout engine's
# trust region).

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
    "mismatch_gate",
    "policy_loss",
    "precompute_band",
    "preset",
    "soft_clip",
    "soft_options",
]

# The constants are defined where they are used; they are bound here with their
# documentation (Sphinx reads a constant's ``#:`` comment in the module that documents it).

#: The methods of :class:`LossConfig` (the table above).
METHODS = _config.METHODS
#: The aggregations over the response mask (see :func:`agg_loss`).
AGG_MODES = _config.AGG_MODES
#: The keys of the metrics of :func:`policy_loss`, in order.
METRIC_KEYS = _metrics_module.METRIC_KEYS
#: The soft clips of ``LossConfig.soft`` (see :func:`soft_clip`).
SOFT_FORMS = _config.SOFT_FORMS
