r"""The per-token loss of :class:`fbands.integrations.trl.BandGRPOTrainer`, and its metrics.

:class:`BandLoss` is the part of the trainer that replaces TRL's loss through
``compute_loss``, the method TRL documents for changing the objective (TRL's own
``compute_loss`` only calls its private ``_compute_loss``, which the band trainer never
reaches): the
policy term is :func:`fbands.losses.policy_loss` in ``token-sum`` mode with per-token
weights :math:`W_t` that carry TRL's normalisation (:meth:`BandLoss._normalisation_weights`)
and TRL's per-token factors (off-policy mask, top-entropy mask, vLLM's importance-sampling
ratio), so that the loss is :math:`\sum_t W_t \ell_t` exactly where TRL's is
:math:`\sum_t W_t \ell^{\text{TRL}}_t`.  The KL penalty, the entropy bonus and the MoE
auxiliary loss are added as TRL adds them.  The band travels with the generation batch
under the keys :data:`LOWER` and :data:`UPPER` (computed once per batch by the trainer).

It is a mixin of TRL's :class:`~trl.GRPOTrainer`, and reads the state that
:class:`~fbands.integrations.trl.BandGRPOTrainer` sets up (``band_config``,
``band_radius``, ``_band_step_config``, ``_band_gate``) besides TRL's own
options and accelerator.  With ``band_gate_div`` set, the mismatch gate
(:func:`fbands.losses.mismatch_gate`) of vLLM's log-probs against the trainer's is one more
per-token factor of :math:`W_t`.
"""

from __future__ import annotations

import math

import torch

from fbands import losses as fl
from fbands.losses.terms import side_masks

#: Keys of the generation batch that hold the precomputed band.
LOWER, UPPER = "fbands_log_lower", "fbands_log_upper"

#: Multimodal inputs that TRL forwards to the model when present.
FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


class BandLoss:
    """TRL's loss with the band's policy term (a mixin of ``GRPOTrainer``)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The loss of one micro-batch (TRL's ``compute_loss`` signature; the token count
        comes with ``inputs``, as TRL's own loss reads it)."""
        if return_outputs:
            raise ValueError("BandGRPOTrainer does not return outputs (nor does GRPOTrainer)")
        return self._band_loss(model, inputs)

    def _band_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        completion_mask = inputs["completion_mask"]
        mask = completion_mask
        if "tool_mask" in inputs:  # tool outputs inside a completion are not trained on
            mask = completion_mask * inputs["tool_mask"]
        logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            torch.cat([prompt_ids, completion_ids], dim=1),
            torch.cat([inputs["prompt_mask"], completion_mask], dim=1),
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{k: inputs.get(k) for k in FORWARD_KEYS},
        )  # (B, T) each
        mask = mask.to(logps.dtype)  # (B, T)
        advantages = inputs["advantages"]
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1)  # (B, 1)
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old  # aligned steps: every ratio is 1
        if LOWER in inputs:
            band = fl.Band(inputs[LOWER], inputs[UPPER])
        else:
            band = fl.precompute_band(old, self._band_step_config, mask=mask)

        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        norm = self._normalisation_weights(mask, inputs, mode, accumulation)  # (B, T)
        # Per-token factors TRL applies to the policy term, in TRL's order.
        weights = norm
        if self.off_policy_mask_threshold is not None:
            weights = weights * self.get_off_policy_mask(
                advantages=advantages,
                per_token_logps=logps,
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", old),
                mask=mask,
                off_policy_threshold=self.off_policy_mask_threshold,
            )
        entropy_mask = None
        if self.top_entropy_quantile < 1.0:
            entropy_mask = self.get_high_entropy_mask(
                entropies, mask, 1 - self.top_entropy_quantile
            )
            weights = weights * entropy_mask
        if self.use_vllm and self.vllm_importance_sampling_correction:
            weights = weights * inputs["importance_sampling_ratio"]
        gate = self._mismatch_gate(inputs, old, mask)
        if gate is not None:
            weights = weights * gate
        # token-sum with weights = TRL's normalisation of the weighted per-token loss.
        loss, band_metrics = fl.policy_loss(
            old, logps, advantages, weights, self._band_step_config, band=band
        )
        if self.beta != 0.0:
            log_ref_ratio = inputs["ref_per_token_logps"] - logps
            per_token_kl = torch.expm1(log_ref_ratio) - log_ref_ratio  # k3 estimator
            if self.args.use_bias_correction_kl:
                per_token_kl = per_token_kl * torch.exp(logps - old)
            loss = loss + self.beta * (per_token_kl * norm).sum()

        if self._entropy_bonus_enabled:
            policy_loss = loss.detach() * (1.0 if self.loss_type == "dapo" else accumulation)
            effective = mask if entropy_mask is None else mask * entropy_mask
            mean_entropy = (entropies * effective).sum() / effective.sum().clamp(min=1.0)
            loss = loss - self.entropy_coef * mean_entropy / accumulation
            self._metrics[mode]["policy_loss"].append(
                self.accelerator.gather(policy_loss).nanmean().item()
            )
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            self._metrics[mode]["aux_loss"].append(
                self.accelerator.gather_for_metrics(aux_loss).mean().item()
            )

        self._log_band_metrics(mode, logps - old, advantages, mask, band, entropies, band_metrics,
                               per_token_kl if self.beta != 0.0 else None, gate)
        return loss

    def _mismatch_gate(self, inputs, old, mask):
        """The mismatch gate's weights of the micro-batch (``band_gate_*``), or None.  vLLM
        gives a NaN log-prob for a token it could not score; such a token is neither gated
        nor reweighted (TRL leaves it out of its importance sampling correction too)."""
        gate = self._band_gate
        if gate is None:
            return None
        sampling = inputs.get("sampling_per_token_logps")
        if sampling is None:
            raise RuntimeError("band_gate_div is set, but the batch holds no "
                               "sampling_per_token_logps: the rollout engine returned no "
                               "log-probs (vLLM does; a custom rollout_func must)")
        sampling = torch.where(sampling.isnan(), old, sampling)
        return fl.mismatch_gate(old, sampling, gate["div"], gate["delta"], mode=gate["mode"],
                                mask=mask)

    def _normalisation_weights(self, mask, inputs, mode, accumulation):
        r"""Per-token weights :math:`W` of TRL's normalisation for ``loss_type``.

        TRL's loss is :math:`\sum_t W_t \ell_t` with, for ``B`` sequences of
        :math:`n_b` tokens, ``G`` accumulation steps and ``L = max_completion_length``:
        ``grpo`` :math:`1 / (n_b B G)`, ``bnpo`` :math:`1 / (G \sum_b n_b)`,
        ``dr_grpo`` :math:`1 / (B L G)` and ``dapo`` one over the active tokens of the
        accumulation window (from TRL's ``num_items_in_batch``).
        """
        batch = mask.size(0)
        if self.loss_type == "grpo":
            return mask / mask.sum(-1, keepdim=True).clamp(min=1.0) / (batch * accumulation)
        if self.loss_type == "bnpo":
            return mask / (mask.sum().clamp(min=1.0) * accumulation)
        if self.loss_type == "dr_grpo":
            return mask / (batch * self.max_completion_length * accumulation)
        # dapo: num_items_in_batch counts the whole generation batch of every process.
        normaliser = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        if mode == "train":
            normaliser = normaliser * accumulation / self.args.steps_per_generation
        return mask / normaliser

    def _log_band_metrics(self, mode, logratio, advantages, mask, band, entropies, band_metrics,
                          per_token_kl=None, gate=None):
        """TRL's metrics of a micro-batch (reduced over the processes as TRL reduces them)
        and the band's, read from the device in one transfer."""
        m = self._metrics[mode]
        # TRL's clip_ratio/* keys, measured against the band instead of 1 -+ epsilon.
        upper, lower = side_masks(logratio, advantages, band.log_lower, band.log_upper)
        low, high = lower.float(), upper.float()
        means = {"entropy": entropies, "clip_ratio/low_mean": low,
                 "clip_ratio/high_mean": high, "clip_ratio/region_mean": torch.maximum(low, high)}
        if per_token_kl is not None:
            means["kl"] = per_token_kl
        if gate is not None:
            means["band/gate_weight"] = gate
        # masked means over every process's tokens: the sums, reduced, then divided
        sums = torch.stack([(x.float() * mask).sum() for x in means.values()]
                           + [mask.sum().float()])
        sums = self.accelerator.reduce(sums, reduction="sum")
        # the smallest and largest per-sequence shares over all processes (a sequence
        # without tokens gives NaN and is skipped, as TRL's nanmin / nanmax skip it)
        tokens = mask.sum(-1)
        shares = torch.stack([_nan_to((low * mask).sum(-1) / tokens, math.inf).min(),
                              _nan_to((high * mask).sum(-1) / tokens, -math.inf).max()])
        shares = self.accelerator.gather(shares.unsqueeze(0))  # (processes, 2)
        extremes = torch.stack([shares[:, 0].min(), shares[:, 1].max()])
        extremes = torch.where(extremes.isinf(), torch.nan, extremes)  # no token anywhere
        names = list(band_metrics)
        values = torch.stack([band_metrics[k].detach().float().reshape(()) for k in names])
        values = self.accelerator.gather(values.unsqueeze(0)).mean(0)
        read = torch.cat([sums[:-1] / sums[-1].clamp(min=1.0), extremes, values]).tolist()
        for name, value in zip([*means, "clip_ratio/low_min", "clip_ratio/high_max",
                                *(f"band/{n}" for n in names)], read, strict=True):
            m[name].append(value)
        values = read[len(means) + 2:]
        radius = self.band_radius
        if mode == "train" and radius is not None:
            # The last of the num_iterations passes over the generation batch (self._step
            # counts micro-batches and is incremented after this call).
            a = self.args
            passes = (self._step % (a.steps_per_generation * a.num_iterations)) // (
                a.steps_per_generation)
            if passes == a.num_iterations - 1:
                radius.pending_kl.append(values[names.index("approx_kl_k3")])
        if self.band_config.uses_radius:
            m["band/delta"].append(self._band_step_config.delta)


def _nan_to(x: torch.Tensor, value: float) -> torch.Tensor:
    """``x`` with its NaNs replaced by ``value`` (no host read, unlike TRL's nanmin)."""
    return torch.where(x.isnan(), value, x)
