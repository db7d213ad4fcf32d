"""TRL plug-in: GRPO training with band policy losses.

:class:`BandGRPOConfig` is TRL's :class:`~trl.GRPOConfig` with the band's options, and
:class:`BandGRPOTrainer` is TRL's :class:`~trl.GRPOTrainer` whose per-token policy loss
comes from :mod:`fbands.losses`. Everything around the per-token loss is TRL's:

- the normalisation chosen by ``loss_type`` (``"dapo"`` by default, also ``"grpo"``,
  ``"bnpo"`` and ``"dr_grpo"``) and the gradient-accumulation scaling;
- vLLM's importance-sampling correction (``vllm_importance_sampling_correction``), the
  off-policy sequence mask, the top-entropy token mask, the KL penalty (``beta``), a
  constant entropy bonus and the MoE auxiliary loss;
- the logged metrics ``entropy``, ``kl`` and ``clip_ratio/*`` (now measured against
  the band), plus the band's own metrics under ``band/<name>`` and the radius in use,
  ``band/delta``.

``band_delta_schedule`` decays the radius over training (:func:`fbands.parse_schedule`:
``"cosine:0.1:0.02:1000"``, ...), indexed by TRL's ``state.global_step`` (optimizer
steps) at the time each generation batch is scored; its band serves every pass over it.
An ``adaptive:TARGET_KL`` schedule (:class:`fbands.AdaptiveDelta`) is updated when the next
generation batch is scored, from the KL measured on the previous one: the mean, over the
micro-batches of its last pass, of the loss's own k3 estimate ``r - 1 - log r`` (logged as
``band/approx_kl_k3``, the same number on every process); the update is logged as
``band/measured_kl`` and ``band/delta_next``. The radius and the KL waiting to update it are
kept by a :class:`BandRadiusCallback`, saved in each checkpoint's ``trainer_state.json`` as
transformers saves any stateful callback, and read back by ``train(resume_from_checkpoint=...)``.

The band depends only on the old log-probabilities, so it is computed once per
generation batch and reused by all ``num_iterations`` passes over it.

A band only acts on ratios that differ from 1, that is when the batch is reused by
more than one optimizer step: with ``num_iterations=1`` and
``steps_per_generation == gradient_accumulation_steps`` (TRL's default) every ratio is
exactly 1 and the trainer warns with :class:`BandInactiveWarning`.

Example
-------
A complete script (a small model from the Hugging Face hub)::

    from datasets import Dataset
    from fbands.integrations.trl import BandGRPOConfig, BandGRPOTrainer

    def reward_len(completions, **kwargs):
        return [-abs(20 - len(c)) / 20 for c in completions]

    args = BandGRPOConfig(
        output_dir="band-grpo", num_iterations=2, num_generations=8,
        band_div="kl", band_delta=0.05,
    )
    trainer = BandGRPOTrainer(
        model="Qwen/Qwen2.5-0.5B-Instruct", reward_funcs=reward_len, args=args,
        train_dataset=Dataset.from_dict({"prompt": ["Write a haiku."] * 64}),
    )
    trainer.train()
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from dataclasses import dataclass, field

from trl import GRPOConfig, GRPOTrainer

import fbands
from fbands import losses as fl
from fbands.integrations._names import merge, named_fields
from fbands.integrations._options import as_bool, as_float, as_str, radius_schedule
from fbands.integrations._trl_loss import LOWER, UPPER, BandLoss
from fbands.integrations._trl_radius import BandRadiusCallback, TRLBandError
from fbands.losses.gate import gate_options

__all__ = [
    "SUPPORTED_LOSS_TYPES",
    "BandGRPOConfig",
    "BandGRPOTrainer",
    "BandInactiveWarning",
    "BandRadiusCallback",
    "TRLBandError",
]

#: TRL loss types whose normalisation the band trainer keeps.
SUPPORTED_LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo")

logger = logging.getLogger(__name__)


class BandInactiveWarning(UserWarning):
    """The configuration makes every probability ratio 1, so the band never acts."""


@dataclass
class BandGRPOConfig(GRPOConfig):
    """TRL's GRPOConfig with the options of a band loss.

    TRL's ``epsilon`` / ``epsilon_high`` are the fixed-clip widths used by the
    clip-style baselines and by ``band_relax``. Every other TRL option keeps its
    meaning, except those that replace the policy loss, which are rejected.

    Parameters
    ----------
    band_method : str
        The loss: a preset of :func:`fbands.losses.preset` (``"band-kl"``, ``"band-mask-tv"``,
        ``"clip-higher"``, ``"dcpo"``, ..., the names of ``fbands train --loss``, with the
        same meaning), or, as an alias, an entry of :data:`fbands.losses.METHODS`
        (``"band_clip"``, the default, is BandPO; a name that is both, such as ``"dcpo"``,
        means the preset).  Options set explicitly win over the preset's values: a
        ``band_*`` option that is not None, and TRL's clip widths when ``epsilon`` or
        ``epsilon_high`` differs from TRL's default (0.2 / unset); otherwise the preset's
        widths apply.
    band_div : str or None
        Divergence of the trust region (``fbands.available()``); unset: the preset's,
        else ``"kl"``.
    band_delta : float or None
        Radius of the trust region; unset: the preset's, else 0.05.
    band_relax : bool
        Widen the band to at least ``[1 - epsilon, 1 + epsilon_high]``.
    band_upper_bound_max : float or None
        Cap on the upper ratio edge.
    band_dual_clip_c : float or None
        Dual clip for negative advantages (e.g. 3.0).
    band_truncation : float
        Cap on the stop-gradient ratio of ``band_mask``.
    band_delta_schedule : str
        ``""`` (default) keeps ``band_delta``; otherwise a :func:`fbands.parse_schedule`
        string of a step schedule (``linear``, ``cosine``, ``poly``, ``hold_linear``) over
        ``state.global_step``, or ``adaptive:TARGET_KL[:START[:LOW:HIGH]]`` (starts from
        ``band_delta``), steered by the KL measured on each generation batch (see the
        module docstring).
    band_soft : str or None
        ``None`` (default): the hard clip.  A form of :data:`fbands.losses.SOFT_FORMS`
        (``"tanh1"``, ``"tanh2"``, ``"smooth3"``, BandPO's ``"3seg"``, ``"rollback"``, ...)
        or one of BandPO's aliases ``"1seg"``, ``"2seg"``, ``"hard"``: the soft clip of
        :func:`fbands.losses.soft_clip` in place of the hard one (clip-form methods, not
        ``band_mask``, ``band_gppo`` or ``cispo``).
    band_soft_k : float or None
        ``band_soft="tanh2"`` only: its slope at ``r = 1`` (unset: 1).
    band_soft_width : float or None
        ``band_soft="smooth3"`` only: the room beyond an edge, as a fraction of the
        edge's distance from 1 (unset: 0.25).
    band_soft_rho, band_soft_g, band_soft_alpha, band_soft_gamma, band_soft_alpha_in : float
        The parameters of BandPO's forms (``rho``, ``g``, ``alpha``, ``gamma``,
        ``alpha_in``; unset: BandPO's defaults 0.1, 1, 0.05, 0.2, 2), each only with a form
        that uses it (:data:`fbands.losses.config.SOFT_PARAMS`).

    Raises
    ------
    TRLBandError
        For options whose loss a band cannot replace: a ``loss_type`` outside
        :data:`SUPPORTED_LOSS_TYPES`, sequence-level importance sampling, TRL's
        two-sided ``delta`` (use ``band_dual_clip_c``), the adaptive entropy bonus and
        TRL's fused Liger loss (``use_liger_loss``, which older TRL versions have); a
        ``band_method`` that names neither a preset nor a method; an unknown
        ``band_soft``, or ``band_soft_k`` / ``band_soft_width`` given for a form that has no
        such parameter.
    fbands.ConfigError
        For a band option of the wrong type (``band_delta=True``, ``band_relax="maybe"``;
        the text ``"false"`` reads as False) or beyond float range (``band_delta=10**400``).
    fbands.DivergenceError, fbands.losses.LossError
        For an unknown divergence or an invalid band option (all are ValueErrors).

    Examples
    --------
    >>> from fbands.integrations.trl import BandGRPOConfig
    >>> args = BandGRPOConfig(output_dir="/tmp/out", band_div="tv", band_delta=0.1,
    ...                       report_to="none", use_cpu=True)
    >>> cfg = args.band_loss_config()
    >>> cfg.method, cfg.div, cfg.delta
    ('band_clip', 'tv', 0.1)
    """

    band_method: str = field(
        default="band_clip",
        metadata={"help": "The loss: a preset of fbands.losses.preset (band-kl, band-mask-tv, "
                          "clip-higher, dcpo, ...) or a method of fbands.losses.METHODS."},
    )
    band_div: str | None = field(
        default=None, metadata={"help": "Divergence of the band (unset: the preset's, or kl)."}
    )
    band_delta: float | None = field(
        default=None, metadata={"help": "Radius of the trust region (unset: the preset's, or "
                                        "0.05)."}
    )
    band_relax: bool = field(
        default=False, metadata={"help": "Band at least as wide as the fixed clip."}
    )
    band_upper_bound_max: float | None = field(
        default=None, metadata={"help": "Cap on the upper ratio edge."}
    )
    band_dual_clip_c: float | None = field(
        default=None, metadata={"help": "Dual-clip constant for negative advantages."}
    )
    band_truncation: float = field(
        default=10.0, metadata={"help": "Truncation cap C of the band mask."}
    )
    band_delta_schedule: str = field(
        default="",
        metadata={"help": "Radius over optimizer steps, e.g. 'cosine:0.1:0.02:1000' "
                          "(fbands.parse_schedule); '' keeps band_delta."},
    )
    band_soft: str | None = field(
        default=None,
        metadata={"help": "Soft clip in place of the hard one: tanh1, tanh2, smooth3 or one "
                          "of BandPO's forms (3seg, rollback, ...; fbands.losses.SOFT_FORMS); "
                          "unset: the hard clip."},
    )
    band_soft_k: float | None = field(
        default=None, metadata={"help": "band_soft=tanh2: slope at r = 1 (unset: 1)."}
    )
    band_soft_width: float | None = field(
        default=None,
        metadata={"help": "band_soft=smooth3: room beyond an edge, as a fraction of its "
                          "distance from 1 (unset: 0.25)."},
    )
    band_soft_rho: float | None = field(
        default=None, metadata={"help": "band_soft=3seg*: joins at rho + (1 - rho) edge (0.1)."}
    )
    band_soft_g: float | None = field(
        default=None, metadata={"help": "band_soft=3seg_control_*: tanh argument at the join (1)."}
    )
    band_soft_alpha: float | None = field(
        default=None, metadata={"help": "band_soft=rollback*: depth of the pull-back (0.05)."}
    )
    band_soft_gamma: float | None = field(
        default=None, metadata={"help": "band_soft=rollback*_plus: steepness (0.2)."}
    )
    band_soft_alpha_in: float | None = field(
        default=None, metadata={"help": "band_soft=rollback_activate*: middle curvature (2)."}
    )

    band_gate_div: str | None = field(
        default=None,
        metadata={"help": "Mismatch gate (fbands.losses.mismatch_gate): the divergence (or "
                          "several joined by '&') within which the trainer's log-probs must "
                          "agree with vLLM's; unset: no gate. Needs use_vllm=True."},
    )
    band_gate_delta: float = field(
        default=0.01, metadata={"help": "Radius of the mismatch gate."}
    )
    band_gate_mode: str = field(
        default="mask",
        metadata={"help": "mask: drop a token outside the gate's band; cap: weight it by "
                          "its vLLM-to-trainer ratio clamped into the band (TRL's "
                          "vllm_importance_sampling_correction must then be off)."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_trl_options()
        self.band_gate()
        # An unknown divergence fails here, not at step 1; fbands.get parses the string
        # (never evaluates it).  A bad delta, method or type fails in band_loss_config.
        if self.band_div is not None:
            fbands.get(as_str("band_div", self.band_div))
        self.band_loss_config()
        self.band_schedule()

    def band_gate(self) -> dict | None:
        """The :func:`fbands.losses.mismatch_gate` arguments of the ``band_gate_*`` options,
        or None for no gate.

        Raises
        ------
        TRLBandError
            For a bad gate option, a gate without vLLM (nothing else gives the rollout
            engine's log-probs), or ``band_gate_mode="cap"`` beside TRL's own importance
            sampling correction (the capped ratio is that correction: both would apply it
            twice).
        """
        try:
            gate = gate_options(self.band_gate_div,
                                as_float("band_gate_delta", self.band_gate_delta),
                                self.band_gate_mode, prefix="band_")
        except fl.LossError as err:
            raise TRLBandError(str(err)) from err
        if gate is not None and not self.use_vllm:
            raise TRLBandError("band_gate_div is set, but use_vllm=False: the gate compares "
                               "the rollout engine's log-probs with the trainer's, and TRL has "
                               "them from vLLM only (without vLLM the trainer samples itself)")
        if (gate is not None and gate["mode"] == "cap"
                and self.vllm_importance_sampling_correction):
            raise TRLBandError("band_gate_mode='cap' weights each token by its capped "
                               "vLLM-to-trainer ratio, which is an importance sampling "
                               "correction: set vllm_importance_sampling_correction=False, or "
                               "use band_gate_mode='mask' beside it")
        return gate

    def _check_trl_options(self) -> None:
        """Refuse the TRL options whose loss would replace or bypass the band's."""
        if getattr(self, "use_liger_loss", False):  # (TRL < 1.0; absent from TRL 1.16)
            raise TRLBandError("use_liger_loss=True: TRL's fused Liger GRPO loss computes its "
                               "own clipped loss and would bypass the band; leave it off")
        if self.loss_type not in SUPPORTED_LOSS_TYPES:
            raise TRLBandError(
                f"loss_type={self.loss_type!r} has its own policy loss; a band keeps the "
                f"normalisation of {SUPPORTED_LOSS_TYPES} (choose the loss with band_method)"
            )
        if self.importance_sampling_level != "token":
            raise TRLBandError(
                f"importance_sampling_level={self.importance_sampling_level!r}: the band is a "
                "per-token trust region, use 'token'"
            )
        if self.delta is not None:
            raise TRLBandError(
                f"delta={self.delta!r} is TRL's two-sided clip; with a band use band_dual_clip_c"
            )
        if self.use_adaptive_entropy:
            raise TRLBandError("use_adaptive_entropy=True is not supported with a band loss")

    def band_schedule(self):
        """The :class:`fbands.DeltaSchedule` of ``band_delta_schedule``, or None."""
        text = self.band_delta_schedule
        if not isinstance(text, str):
            raise TRLBandError(f"band_delta_schedule={text!r}: must be a string ('' keeps "
                               "band_delta)")
        if not text:
            return None
        return radius_schedule("band_delta_schedule", text, self.band_loss_config(),
                               TRLBandError, method=f"band_method={self.band_method!r}")

    def band_loss_config(self) -> fl.LossConfig:
        """The :class:`fbands.losses.LossConfig` these options describe.

        Returns
        -------
        fbands.losses.LossConfig
            With ``agg="token-sum"``: the trainer folds TRL's normalisation into
            per-token weights.
        """
        eps_high = self.epsilon_high if self.epsilon_high is not None else self.epsilon
        named = named_fields(self.band_method, "band_method", TRLBandError)
        widths_given = (self.epsilon_high is not None
                        or self.epsilon != GRPOConfig.__dataclass_fields__["epsilon"].default)
        fields = merge(
            named,
            {"div": None if self.band_div is None else as_str("band_div", self.band_div),
             "delta": as_float("band_delta", self.band_delta, optional=True),
             "dual_clip_c": as_float("band_dual_clip_c", self.band_dual_clip_c, optional=True),
             "upper_bound_max": as_float("band_upper_bound_max", self.band_upper_bound_max,
                                         optional=True)},
            {"eps_low": as_float("epsilon", self.epsilon),
             "eps_high": as_float("epsilon_high", eps_high)},
            widths_given,
        )
        soft = self.band_soft
        if soft is not None and not isinstance(soft, str):
            raise TRLBandError(f"band_soft={soft!r} must be a string")
        try:
            soft = fl.soft_options(
                soft,
                as_float("band_soft_k", self.band_soft_k, optional=True),
                as_float("band_soft_width", self.band_soft_width, optional=True),
                prefix="band_",
                **{name: as_float(f"band_{name}", getattr(self, f"band_{name}"), optional=True)
                   for name in fl.SOFT_PARAMS if name not in ("soft_k", "soft_width")},
            )
        except fl.LossError as err:
            raise TRLBandError(str(err)) from err
        return fl.LossConfig(
            **fields,
            relax=as_bool("band_relax", self.band_relax),
            truncation=as_float("band_truncation", self.band_truncation),
            agg="token-sum",
            **soft,
        )


class BandGRPOTrainer(BandLoss, GRPOTrainer):
    """TRL's GRPOTrainer with a band policy loss from :mod:`fbands.losses`.

    Takes the same arguments as :class:`trl.GRPOTrainer`; ``args`` must be a
    :class:`BandGRPOConfig`.

    What of TRL it relies on: the loss goes through ``compute_loss``, the method TRL
    documents for changing the objective; the config through :class:`BandGRPOConfig`, a
    subclass of TRL's; an adaptive radius's state through a :class:`BandRadiusCallback`.
    One private method is overridden, because no public hook does its job, and a test
    (``tests/integrations/test_trl.py``, *the TRL surface*) fails when TRL changes it:
    ``_generate_and_score_completions``, where the band is computed once per generation
    batch, from the old log-probabilities that TRL computes there, and travels with the
    batch through TRL's shuffling and splitting; a scheduled radius moves at that point,
    where an adaptive one reads the last pass's KL.

    The loss also calls TRL's helpers ``_get_per_token_logps_and_entropies``,
    ``get_off_policy_mask`` and ``get_high_entropy_mask``, as TRL's own loss does.

    Raises
    ------
    TRLBandError
        If ``args`` is not a :class:`BandGRPOConfig`.

    Warns
    -----
    BandInactiveWarning
        When every probability ratio is 1 (no reuse of a generation batch).
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        a = self.args
        if not isinstance(a, BandGRPOConfig):
            raise TRLBandError(
                f"BandGRPOTrainer needs args=BandGRPOConfig(...), got {type(a).__name__}"
            )
        self.band_config = a.band_loss_config()
        schedule = a.band_schedule()
        self._band_steps = None if schedule is None or schedule.adaptive else schedule
        if schedule is not None and schedule.adaptive:
            self.add_callback(BandRadiusCallback(str(schedule)))
        self._band_step_config = self.band_config  # of the latest generation batch
        self._band_gate = a.band_gate()  # mismatch_gate's arguments, or None
        logger.info("fbands band loss: %s", self.band_config)
        generate_every = a.steps_per_generation * a.num_iterations
        if a.gradient_accumulation_steps % generate_every == 0:
            warnings.warn(
                f"num_iterations={a.num_iterations}, steps_per_generation="
                f"{a.steps_per_generation}, gradient_accumulation_steps="
                f"{a.gradient_accumulation_steps}: every generation batch is used by one "
                "optimizer step only, so every probability ratio is 1 and the band never "
                "clips. Set num_iterations > 1 (or steps_per_generation > "
                "gradient_accumulation_steps) for the band to act.",
                BandInactiveWarning,
                stacklevel=2,
            )

    @property
    def band_radius(self) -> BandRadiusCallback | None:
        """The callback that holds an adaptive radius (None for any other radius)."""
        # (looked up each time: transformers replaces a stateful callback it restores)
        return next((cb for cb in self.callback_handler.callbacks
                     if isinstance(cb, BandRadiusCallback)), None)

    @property
    def band_schedule(self):
        """The radius schedule in use (:func:`fbands.parse_schedule`), or None."""
        radius = self.band_radius
        return self._band_steps if radius is None else radius.schedule

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        radius = self.band_radius
        if self.model.training and radius is not None and radius.pending_kl:
            # the previous batch's KL steers the radius
            measured = sum(radius.pending_kl) / len(radius.pending_kl)
            radius.pending_kl = []
            following = radius.schedule.update(measured)
            self._metrics["train"]["band/measured_kl"].append(measured)
            self._metrics["train"]["band/delta_next"].append(following)
        if self.band_schedule is not None:
            self._band_step_config = dataclasses.replace(
                self.band_config, delta=self.band_schedule(self.state.global_step))
        old = output.get("old_per_token_logps")
        if old is not None:
            # Once per generation batch; the slices travel with the batch through
            # TRL's shuffling and splitting and serve every num_iterations pass.
            band = fl.precompute_band(old, self._band_step_config,
                                      mask=output["completion_mask"])
            output[LOWER], output[UPPER] = band.log_lower, band.log_upper
        return output
