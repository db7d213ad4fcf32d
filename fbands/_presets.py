"""The loss presets' names: one table for :func:`fbands.losses.preset` and for the
messages of :func:`fbands.get` (which must not import torch, so it cannot import the
losses)."""

from __future__ import annotations

from fbands import _methods

__all__ = ["PRESETS", "BAND_PREFIXES", "fields"]

#: The presets that are not ``band-<div>``: their :class:`~fbands.losses.LossConfig` fields.
PRESETS = {
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
#: Prefix of a band preset's name -> its method (the table of methods' ``preset_prefix``),
#: longest first (``band-mask-tv`` is ``band-mask-`` + tv).
BAND_PREFIXES = tuple(sorted(((m.preset_prefix, m.name) for m in _methods.TABLE
                              if m.preset_prefix), key=lambda pm: -len(pm[0])))


def fields(name: str) -> dict | None:
    """The fields of preset ``name`` (a new dict), or None when it names no preset.  In a
    band preset's divergence a dash stands for an underscore (``band-reverse-kl``); a
    family's parameters keep theirs (``band-alpha(a=-1)``).  Several divergences joined by
    ``&`` intersect their bands (``band-kl&reverse-kl``)."""
    if name in PRESETS:
        return dict(PRESETS[name])
    for prefix, method in BAND_PREFIXES:
        if name.startswith(prefix) and len(name) > len(prefix):
            return {"method": method, "div": "&".join(map(_div, name[len(prefix):].split("&"))),
                    "delta": 0.05}
    return None


def _div(part: str) -> str:
    """One divergence of a preset's name, its dashes before any parameters read as
    underscores."""
    head, paren, params = part.partition("(")
    return head.replace("-", "_") + paren + params
