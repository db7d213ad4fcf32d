"""One name per loss: the plug-ins read the names of :func:`fbands.losses.preset`.

A preset (``band-kl``, ``band-mask-tv``, ``clip-higher``, ``dcpo``, ...; the table of
:mod:`fbands._presets`) names the same loss in ``fbands train --loss``, in TRL's
``band_method`` and in verl's ``policy_loss.preset``.  The rule that merges a preset with
the trainer's own options is the same in both plug-ins (:func:`merge`):

- a band option set explicitly (not left unset, ``None``) wins over the preset;
- the clip widths belong to the trainer (TRL's ``epsilon`` / ``epsilon_high``, verl's
  ``clip_ratio*``) and always have a value: when they are all at the trainer's defaults
  the preset's widths apply, otherwise the trainer's, read as the trainer reads them.

Nothing here imports TRL, verl or torch.
"""

from __future__ import annotations

from fbands import _presets
from fbands.integrations._options import as_str
from fbands.losses.config import METHODS

#: The clip widths of :class:`fbands.losses.LossConfig` that a trainer owns.
WIDTHS = ("eps_low", "eps_high")


def preset_names() -> str:
    """The preset names as a message lists them."""
    return ", ".join([*_presets.PRESETS, "band-<div>", "band-mask-<div>", "band-gppo-<div>"])


def preset_fields(name, option: str, error: type[Exception]) -> dict:
    """The :class:`~fbands.losses.LossConfig` fields of preset ``name`` (a new dict), or
    ``error`` naming ``option`` when ``name`` is not a preset.

    >>> preset_fields("band-tv", "preset", ValueError)
    {'method': 'band_clip', 'div': 'tv', 'delta': 0.05}
    """
    found = _presets.fields(name) if isinstance(name, str) else None
    if found is None:
        raise error(f"{option}={name!r} is not a preset of fbands.losses.preset; expected one "
                    f"of {preset_names()}")
    return found


def named_fields(name, option: str, error: type[Exception]) -> dict:
    """The fields that ``name`` gives: a preset's (a name that is both a preset and a method,
    ``clip``, ``trgppo``, ``dcpo`` and ``cispo``, means the preset, as in ``fbands train
    --loss``), else ``{"method": name}`` for a method of :data:`fbands.losses.METHODS` (the
    old spellings: ``band_clip``, ``band_mask``, ``clip_higher``, ...).

    >>> named_fields("band-kl", "band_method", ValueError)["method"]
    'band_clip'
    >>> named_fields("band_mask", "band_method", ValueError)
    {'method': 'band_mask'}
    """
    if isinstance(name, str):
        found = _presets.fields(name)
        if found is not None:
            return found
        if name in METHODS:
            return {"method": name}
    raise error(f"{option}={name!r} names no loss; expected a preset ({preset_names()}) or a "
                f"method of fbands.losses.METHODS ({', '.join(METHODS)})")


def mode_fields(preset, method, mode: str, runs: str | None,
                error: type[Exception]) -> dict:
    """verl's choice: the fields of ``policy_loss.preset``, or without one ``{"method": ...}``
    of the loss mode (``runs``; None for ``loss_mode=fbands``, which reads
    ``policy_loss.method``).  A ``policy_loss.method`` (other than the default
    ``band_clip``) must be the one the mode runs, and a preset must agree with both."""
    if method is not None:
        as_str("policy_loss.method", method)
    if runs is not None and method not in (None, "band_clip", runs):  # (band_clip: the default)
        raise error(f"policy_loss.method={method!r} has no effect with loss_mode={mode!r}, "
                    f"which runs {runs!r}; use loss_mode=fbands to choose the method")
    if preset is None:
        return {"method": runs if runs is not None else
                "band_clip" if method is None else method}
    named = preset_fields(preset, "policy_loss.preset", error)
    if runs is not None and runs != named["method"]:
        raise error(f"policy_loss.preset={preset!r} is method {named['method']!r}, but "
                    f"loss_mode={mode!r} runs {runs!r}; use loss_mode=fbands")
    if runs is None and method not in (None, "band_clip", named["method"]):
        raise error(f"policy_loss.method={method!r} contradicts policy_loss.preset="
                    f"{preset!r} (method {named['method']!r}); set one of them")
    return named


def merge(named: dict, explicit: dict, widths: dict, widths_given: bool) -> dict:
    """``named``'s fields, then the trainer's clip ``widths`` (when ``widths_given``, or for
    each width ``named`` leaves out), then every ``explicit`` field that is not None.

    >>> merge({"method": "clip_higher", "eps_low": 0.2, "eps_high": 0.28}, {"delta": None},
    ...       {"eps_low": 0.2, "eps_high": 0.2}, widths_given=False)
    {'method': 'clip_higher', 'eps_low': 0.2, 'eps_high': 0.28}
    """
    out = dict(named)
    for key in WIDTHS:
        if widths_given or key not in out:
            out[key] = widths[key]
    out.update({k: v for k, v in explicit.items() if v is not None})
    return out
