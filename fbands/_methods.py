"""The table of loss methods: one row per method of :class:`fbands.losses.LossConfig`.

Every part of the package that treats methods differently reads this table, never a list
of names of its own: the configuration's checks (:mod:`fbands.losses.config`), the band of
:func:`fbands.losses.precompute_band`, the per-token term of :func:`fbands.losses.policy_loss`
(:data:`fbands.losses.terms.TERMS`, by ``form``), the preset names (:mod:`fbands._presets`)
and verl's loss modes (:data:`fbands.integrations.verl.LOSS_MODES`).  Adding a method is one
row here, plus a term function when its ``form`` is new.  Nothing here imports torch (the
divergence registry's messages read the presets).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FORMS", "BANDS", "Method", "TABLE", "by_name"]

#: The per-token forms: ``clip`` is PPO's :math:`\max(-A r, -A\,\mathrm{clip}(r, lo, hi))`,
#: ``mask`` drops tokens past the band and weights the rest by a truncated stop-gradient
#: ratio (DPPO), ``weight`` clips the stop-gradient ratio and keeps every gradient (CISPO).
FORMS = ("clip", "mask", "weight")
#: Where the band comes from: the fixed interval :math:`[1 - \epsilon_l, 1 + \epsilon_h]`,
#: an f-divergence of radius :math:`\delta`, or DCPO's closed form.
BANDS = ("fixed", "divergence", "dcpo")


@dataclass(frozen=True)
class Method:
    """One loss method.

    ``form`` and ``band`` are one of :data:`FORMS` and :data:`BANDS`; ``with_fixed``: the
    band is united with the fixed clip (TRGPPO); ``soft``: a soft clip may replace the hard
    one; ``edge_gradient``: a clipped token keeps a bounded gradient (GPPO);
    ``preset_prefix``: the presets ``<prefix><div>`` of a divergence band; ``verl_mode``:
    the ``loss_mode`` that verl runs it under (besides ``fbands``, which runs any).
    """

    name: str
    form: str
    band: str
    with_fixed: bool = False
    soft: bool = False
    edge_gradient: bool = False
    preset_prefix: str | None = None
    verl_mode: str | None = None

    def __post_init__(self) -> None:
        if self.form not in FORMS or self.band not in BANDS:
            raise ValueError(f"method {self.name!r}: form {self.form!r} or band {self.band!r} "
                             "unknown")
        if self.soft and self.form != "clip":
            raise ValueError(f"method {self.name!r}: a soft clip replaces a clip form only")

    @property
    def dual_clip(self) -> bool:
        """Whether a dual clip applies (the clip form only)."""
        return self.form == "clip"


TABLE = (
    Method("clip", "clip", "fixed", soft=True),
    Method("clip_higher", "clip", "fixed", soft=True),
    Method("dual_clip", "clip", "fixed", soft=True),
    Method("dcpo", "clip", "dcpo", soft=True),
    Method("trgppo", "clip", "divergence", with_fixed=True, soft=True),
    Method("cispo", "weight", "fixed"),
    Method("band_clip", "clip", "divergence", soft=True, preset_prefix="band-",
           verl_mode="band"),
    Method("band_mask", "mask", "divergence", preset_prefix="band-mask-",
           verl_mode="band_mask"),
    Method("band_gppo", "clip", "divergence", edge_gradient=True, preset_prefix="band-gppo-",
           verl_mode="band_gppo"),
)

_BY_NAME = {m.name: m for m in TABLE}


def by_name(name: str) -> Method | None:
    """The row of method ``name``, or None."""
    return _BY_NAME.get(name) if isinstance(name, str) else None
