r"""What a policy loss is: :class:`LossConfig`, its validation, the presets and the soft options.

The methods fall into families, the columns of the table of methods
(:mod:`fbands._methods`) that decide what the rest of the package does with them:

* the *clip form* (``clip``, ``clip_higher``, ``dual_clip``, ``dcpo``, ``trgppo``,
  ``band_clip``, ``band_gppo``): :math:`\max(-A r, -A\,\mathrm{clip}(r, r_{lo}, r_{hi}))`,
  the only ones that take a dual clip, and all but ``band_gppo`` a soft clip;
* the *radius* methods (``trgppo`` and the ``band_*`` methods): their band comes from an
  f-divergence of radius :math:`\delta` (:attr:`LossConfig.uses_radius`);
* the *fixed band* methods (``clip``, ``clip_higher``, ``dual_clip``, ``cispo``):
  :math:`[1 - \epsilon_l, 1 + \epsilon_h]`; ``dcpo`` has a closed form of its own.

Nothing here needs torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fbands import _checks, _methods, _presets
from fbands.divergences import get
from fbands.errors import LossError

#: The method names, in the order of the table of methods (:mod:`fbands._methods`).
METHODS = tuple(m.name for m in _methods.TABLE)
AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
#: The soft clips of ``LossConfig.soft`` (see :func:`fbands.losses.soft_clip`): fbands' three
#: and the seven of BandPO's code that differ from them, under BandPO's names.
SOFT_FORMS = (
    "tanh1",
    "tanh2",
    "smooth3",
    "3seg",
    "3seg_control_converge",
    "3seg_control_reach",
    "rollback",
    "rollback_activate",
    "rollback_plus",
    "rollback_activate_plus",
)
#: BandPO's names of forms that fbands has under another name (``hard``: no soft clip).
SOFT_ALIASES = {"1seg": "tanh1", "2seg": "tanh2", "hard": None}
#: The parameter fields of the soft forms: field -> (the forms that use it, its range).
SOFT_PARAMS = {
    "soft_k": (("tanh2",), {"low": 0.0, "low_open": True}),
    "soft_width": (("smooth3",), {"low": 0.0, "low_open": True}),
    "soft_rho": (("3seg", "3seg_control_converge", "3seg_control_reach"),
                 {"low": 0.0, "high": 1.0, "low_open": True}),
    "soft_g": (("3seg_control_converge", "3seg_control_reach"),
               {"low": 0.0, "high": 20.0, "low_open": True}),
    "soft_alpha": (("rollback", "rollback_activate", "rollback_plus", "rollback_activate_plus"),
                   {"low": 0.0, "low_open": True}),
    "soft_gamma": (("rollback_plus", "rollback_activate_plus"), {"low": 0.0, "low_open": True}),
    "soft_alpha_in": (("rollback_activate", "rollback_activate_plus"),
                      {"low": 0.0, "low_open": True}),
}

# The methods of the PPO form max(-A r, -A clip(r, lower, upper)), which take a dual clip.
_CLIP_FORM = tuple(m.name for m in _methods.TABLE if m.dual_clip)
# The methods a soft clip applies to.
_SOFT = tuple(m.name for m in _methods.TABLE if m.soft)

# The dual-clip constant c of method "dual_clip" when LossConfig.dual_clip_c is None.
_DEFAULT_DUAL_CLIP_C = 3.0


@dataclass(frozen=True)
class LossConfig:
    r"""Which policy loss to compute, and its constants.

    Parameters
    ----------
    method : str
        One of :data:`METHODS`.
    div : str
        Divergence of the band (``band_*`` methods and ``trgppo``), any name that
        :func:`fbands.log_bounds` accepts: ``"kl"``, ``"tv"``, ``"chi2"``, ...; or several
        joined by ``&`` (``"kl&reverse_kl"``): the band where every one of their trust
        regions of radius ``delta`` holds, the intersection of their bands (:attr:`divs`).
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
        Replace the hard clip of the clip-form methods (all but ``band_gppo``) by a soft
        clip ``s(r)``, one of :data:`SOFT_FORMS` (see :func:`soft_clip`); the term
        becomes :math:`\max(-A r, -A\,s(r))`.  None (default): the hard clip.  BandPO's
        names ``1seg``, ``2seg`` and ``hard`` are read as ``tanh1``, ``tanh2`` and None
        (:data:`SOFT_ALIASES`).
    soft_k : float
        ``soft="tanh2"``: the slope of ``s`` at ``r = 1`` (``> 0``).
    soft_width : float
        ``soft="smooth3"``: the room ``s`` saturates into beyond an edge, as a fraction of
        the edge's distance from 1 (``> 0``).
    soft_rho : float
        The ``3seg*`` forms: the joins sit at ``rho + (1 - rho) b`` for each edge ``b``
        (``0 < rho <= 1``; BandPO's ``rho``, default 0.1).
    soft_g : float
        ``3seg_control_*``: the tanh's argument at the join (``0 < g <= 20``; BandPO's
        ``g``, default 1).
    soft_alpha : float
        The rollback forms: the depth of the pull-back beyond an edge (``> 0``; BandPO's
        ``alpha``, default 0.05).
    soft_gamma : float
        ``rollback_plus`` and ``rollback_activate_plus``: the steepness of the pull-back
        (``> 0``; BandPO's ``gamma``, default 0.2).
    soft_alpha_in : float
        ``rollback_activate*``: the curvature of the middle segment (``> 0``; BandPO's
        ``alpha_in``, default 2).

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
    soft_rho: float = 0.1
    soft_g: float = 1.0
    soft_alpha: float = 0.05
    soft_gamma: float = 0.2
    soft_alpha_in: float = 2.0

    @property
    def uses_radius(self) -> bool:
        r"""Whether the band is an f-divergence trust region of radius :math:`\delta`.

        True for ``trgppo`` and the ``band_*`` methods, whose band
        :func:`fbands.log_bounds` computes from ``div`` and ``delta``; False for the fixed
        clips and ``dcpo``, which ignore both.  Only a loss with a radius has one to
        schedule (:mod:`fbands.schedules`) or to log.

        Examples
        --------
        >>> LossConfig(method="band_mask").uses_radius, LossConfig(method="dcpo").uses_radius
        (True, False)
        """
        return self.row.band == "divergence"

    @property
    def row(self) -> _methods.Method:
        """The method's row of the table of methods (:mod:`fbands._methods`)."""
        return _methods.by_name(self.method)

    @property
    def divs(self) -> tuple[str, ...]:
        """The divergences whose bands :attr:`div` intersects (one for a plain name).

        Examples
        --------
        >>> LossConfig(div="kl & reverse_kl").divs
        ('kl', 'reverse_kl')
        """
        return split_divs(self.div)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise LossError(f"unknown method {self.method!r}; expected one of {', '.join(METHODS)}")
        if self.agg not in AGG_MODES:
            raise LossError(f"unknown agg {self.agg!r}; expected one of {', '.join(AGG_MODES)}")
        if not isinstance(self.relax, bool):
            raise LossError(f"relax must be True or False, got {self.relax!r}")
        if not isinstance(self.div, str) or not self.div:
            raise LossError(f"div must be a divergence name, got {self.div!r}")
        if self.uses_radius:
            # An unknown or malformed divergence fails here, not at the first batch.  The
            # string is parsed by fbands.get, never evaluated as code.
            checked_divs(self.div)
        _check_number("delta", self.delta, low=0.0, low_open=True)
        _check_number("eps_low", self.eps_low, low=0.0, high=1.0)
        _check_number("eps_high", self.eps_high, low=0.0)
        _check_number("truncation", self.truncation, low=0.0, low_open=True)
        _check_number("gppo_beta", self.gppo_beta, low=0.0)
        if self.gppo_beta_low is not None:
            _check_number("gppo_beta_low", self.gppo_beta_low, low=0.0)
        if self.upper_bound_max is not None:
            _check_number("upper_bound_max", self.upper_bound_max, low=1.0)
        if isinstance(self.soft, str) and self.soft in SOFT_ALIASES:
            object.__setattr__(self, "soft", SOFT_ALIASES[self.soft])
        if self.soft is not None:
            if self.soft not in SOFT_FORMS:
                raise LossError(f"unknown soft {self.soft!r}; expected one of "
                                f"{', '.join(SOFT_FORMS)} or None")
            if self.method not in _SOFT:
                raise LossError(f"soft={self.soft!r} applies to the clip-form methods "
                                f"{', '.join(_SOFT)}, not {self.method!r}")
        for name, (_, rule) in SOFT_PARAMS.items():
            _check_number(name, getattr(self, name), **rule)
        if self.dual_clip_c is not None:
            _check_number("dual_clip_c", self.dual_clip_c, low=1.0, low_open=True)
            if self.method not in _CLIP_FORM:
                raise LossError(
                    f"dual_clip_c={self.dual_clip_c!r} has no meaning for method "
                    f"{self.method!r}; it applies to {', '.join(_CLIP_FORM)}"
                )


def split_divs(div: str) -> tuple[str, ...]:
    """The names joined by ``&`` in ``div``, stripped; an empty one is an error."""
    names = tuple(part.strip() for part in div.split("&"))
    if not all(names):
        raise LossError(f"div={div!r}: an empty divergence name around '&'")
    return names


def checked_divs(div: str) -> tuple[str, ...]:
    """:func:`split_divs`, each name looked up by :func:`fbands.get` (which parses it, never
    evaluates it): an unknown or malformed one raises :class:`fbands.DivergenceError`."""
    names = split_divs(div)
    for name in names:
        get(name)
    return names


def _check_number(name, value, **rule) -> None:
    """Raise :class:`LossError` unless ``value`` keeps the rule (:func:`fbands._checks.number`:
    a finite real, not a bool, in the range given by ``low`` / ``high``)."""
    _checks.number(name, value, LossError, **rule)


def dual_clip_bound(cfg: LossConfig) -> float | None:
    """The dual-clip constant :math:`c` in force: ``cfg.dual_clip_c``, else 3 for the
    ``dual_clip`` method, else None (no dual clip)."""
    if cfg.dual_clip_c is None and cfg.method == "dual_clip":
        return _DEFAULT_DUAL_CLIP_C
    return cfg.dual_clip_c


# --------------------------------------------------------------------------------------
# presets

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
    (``band-reverse-kl``).  Names joined by ``&`` intersect their bands: ``band-kl&reverse-kl``
    is the symmetric KL band, which neither direction of the KL may leave.

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
    fields = _presets.fields(name)
    if fields is None:
        known = ", ".join([*_presets.PRESETS, "band-<div>", "band-mask-<div>",
                           "band-gppo-<div>"])
        raise LossError(f"unknown preset {name!r}; expected one of {known}")
    known_fields = {f.name for f in dataclasses.fields(LossConfig)}
    unknown = sorted(set(overrides) - known_fields)
    if unknown:
        raise LossError(f"unknown LossConfig field(s) {', '.join(unknown)} in preset({name!r})")
    fields.update(overrides)
    return LossConfig(**fields)


def soft_options(soft=None, soft_k=None, soft_width=None, *, prefix: str = "",
                 **params) -> dict:
    """The :class:`LossConfig` fields of a soft clip chosen by a trainer's options.

    The trainers (``fbands train``, TRL, verl) expose ``soft`` and the parameter fields of
    :data:`SOFT_PARAMS` (``soft_k``, ``soft_width``, ``soft_rho``, ``soft_g``,
    ``soft_alpha``, ``soft_gamma``, ``soft_alpha_in``) with ``None`` meaning "not given";
    this reads them the same way everywhere.  ``soft`` is ``None`` or ``""`` (the hard
    clip), one of :data:`SOFT_FORMS` or an alias of :data:`SOFT_ALIASES` (BandPO's
    ``1seg``, ``2seg``, ``hard``); a parameter may only be given with a form that uses it
    (a value the chosen form ignores is a mistake, not a no-op).  Values left ``None`` keep
    :class:`LossConfig`'s defaults.  ``prefix`` is put before each name in the messages
    (``"band_"``, ``"policy_loss."``).

    Raises
    ------
    LossError
        For an unknown form or parameter, or a parameter given for a form without it.

    Examples
    --------
    >>> soft_options("tanh2", soft_k=2.0)
    {'soft': 'tanh2', 'soft_k': 2.0}
    >>> soft_options("", None, None)
    {'soft': None}
    >>> soft_options("3seg", soft_rho=0.2)
    {'soft': '3seg', 'soft_rho': 0.2}
    >>> soft_options("tanh1", soft_width=0.5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fbands.errors.LossError: soft_width=0.5 applies to soft='smooth3' only, not soft='tanh1'
    """
    if soft == "":
        soft = None
    if isinstance(soft, str) and soft in SOFT_ALIASES:
        soft = SOFT_ALIASES[soft]
    if soft is not None and soft not in SOFT_FORMS:
        raise LossError(f"{prefix}soft={soft!r}: expected one of {', '.join(SOFT_FORMS)} "
                        f"(or BandPO's {', '.join(SOFT_ALIASES)}), or none for the hard clip")
    unknown = sorted(set(params) - set(SOFT_PARAMS))
    if unknown:
        raise LossError(f"unknown soft-clip parameter(s) {', '.join(unknown)}")
    given = {"soft_k": soft_k, "soft_width": soft_width, **params}
    fields = {"soft": soft}
    for name, (forms, _) in SOFT_PARAMS.items():
        value = given.get(name)
        if value is None:
            continue
        if soft not in forms:
            which = repr(forms[0]) if len(forms) == 1 else "one of " + ", ".join(forms)
            only = " only" if len(forms) == 1 else ""
            raise LossError(f"{prefix}{name}={value!r} applies to {prefix}soft={which}{only}, "
                            f"not {prefix}soft={soft!r}")
        fields[name] = value
    return fields
