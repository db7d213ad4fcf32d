r"""Radius schedules: a delta that changes over training.

Two kinds of schedule share one interface, ``schedule(step) -> float`` (the radius to use
at a global optimiser step) and ``schedule.update(kl)`` (called after each update with the
KL measured on it; a no-op for the fixed ones):

* :class:`DeltaSchedule`: a fixed function of the step, from ``start`` to ``end`` over
  ``total_steps`` (``constant``, ``linear``, ``cosine``, ``poly``, ``hold_linear``,
  ``restarts``);
* :class:`AdaptiveDelta`: a radius steered by the measured KL towards a target, like PPO's
  adaptive KL coefficient.

:func:`parse_schedule` reads either from a short string (the trainer's ``--delta-schedule``
and config files), with a fixed grammar; nothing in it is evaluated as code.

With ``t = clamp((step - hold_steps) / (total_steps - hold_steps), 0, 1)`` (``hold_steps``
is 0 except for ``hold_linear``):

=============== ==================================================================
kind            delta(step)
=============== ==================================================================
``constant``    ``start``
``linear``      ``start + (end - start) t``
``cosine``      ``end + (start - end) (1 + cos(pi t)) / 2``
``poly``        ``end + (start - end) (1 - t)**power``
``hold_linear`` ``start`` for ``step < hold_steps``, then ``linear``
``restarts``    warm restarts (SGDR, as in BandPO's code), below
=============== ==================================================================

Steps past ``total_steps`` give ``end``.

``restarts`` cuts the progress ``t = step / total_steps`` into periods of lengths
``T0, T0 m, T0 m^2, ...`` (``m = T_mult`` when ``mode="expanding"``, 1 when ``"fixed"``),
the last one cut short at ``t = 1``.  In period ``i`` (``i = 0, 1, ...``), at phase
``u`` in [0, 1) of it: ``shape="cosine"`` gives ``end + (start - end) (1 + cos(pi u)) / 2``,
restarting at ``start`` with each period; ``shape="constant"`` gives ``start`` throughout.
With ``decay``, the cosine's amplitude is multiplied by ``gamma**i``, and the constant
shape steps from ``start`` (period 0) to ``end`` (the last period, ``K - 1`` of ``K``)
as ``start + (end - start) i / (K - 1)``.
"""

from __future__ import annotations

import bisect
import math
import operator
import re
from dataclasses import dataclass

from fbands import _checks
from fbands.errors import ConfigError

KINDS = ("constant", "linear", "cosine", "poly", "hold_linear", "restarts")
#: ``restarts``: how the period grows, and the shape within a period.
RESTART_MODES = ("expanding", "fixed")
RESTART_SHAPES = ("cosine", "constant")
#: ``restarts``: the most periods a schedule may have (t0 = 1e-300 would need 1e300).
MAX_PERIODS = 100_000


def _between(value: float, a: float, b: float) -> float:
    """``value`` clamped to the radii ``a``, ``b`` (rounding may step an ulp past them)."""
    return min(max(value, min(a, b)), max(a, b))


def _positive(name: str, value) -> float:
    return _checks.positive(name, value, ConfigError)


def _count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise ConfigError(f"{name} must be an integer, got {value!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class DeltaSchedule:
    """A radius that is a fixed function of the global step (table in the module docstring).

    Parameters
    ----------
    kind : {"constant", "linear", "cosine", "poly", "hold_linear"}
    start : float
        The radius at step 0 (``> 0``).
    end : float, optional
        The radius from ``total_steps`` on (``> 0``; may exceed ``start``).  Defaults to
        ``start`` (required to equal it for ``constant``).
    total_steps : int
        The step at which ``end`` is reached (``>= 1``; ignored by ``constant``).
    hold_steps : int
        ``hold_linear`` only: steps during which ``start`` is held (``< total_steps``).
    power : float
        ``poly`` only: the exponent (``> 0``; 1 is ``linear``).
    t0, t_mult : float
        ``restarts`` only: the first period as a fraction of ``total_steps`` (``0 < t0``,
        BandPO's ``T0``, default 0.15) and the growth of the periods (``> 0``, BandPO's
        ``T_mult``, default 2; used by ``mode="expanding"``).
    mode : {"expanding", "fixed"}
        ``restarts`` only: periods that grow by ``t_mult``, or all of length ``t0``.
    shape : {"cosine", "constant"}
        ``restarts`` only: the value within a period.
    decay : bool
        ``restarts`` only: shrink the restarts (see the module docstring).
    gamma : float
        ``restarts`` with ``decay`` and the cosine shape: the amplitude's factor per period
        (``> 0``, default 0.8).

    Examples
    --------
    >>> from fbands.schedules import DeltaSchedule
    >>> s = DeltaSchedule("cosine", start=0.1, end=0.02, total_steps=100)
    >>> s(0), round(s(50), 12), s(100), s(10_000)
    (0.1, 0.06, 0.02, 0.02)
    >>> r = DeltaSchedule("restarts", start=0.2, end=0.02, total_steps=100, t0=0.25,
    ...                   mode="fixed")
    >>> r(0), round(r(25), 12), round(r(30), 6)
    (0.2, 0.2, 0.182812)
    """

    kind: str
    start: float
    end: float | None = None
    total_steps: int = 1
    hold_steps: int = 0
    power: float = 1.0
    t0: float = 0.15
    t_mult: float = 2.0
    mode: str = "expanding"
    shape: str = "cosine"
    decay: bool = False
    gamma: float = 0.8

    adaptive = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ConfigError(f"schedule kind must be one of {', '.join(KINDS)}; "
                              f"got {self.kind!r}")
        start = _positive("start", self.start)
        end = start if self.end is None else _positive("end", self.end)
        if self.kind == "constant" and end != start:
            raise ConfigError(f"a constant schedule has end = start; got start={start!r}, "
                              f"end={end!r} (use 'linear' or another kind)")
        total = _count("total_steps", self.total_steps, 1)
        hold = _count("hold_steps", self.hold_steps, 0)
        if hold and self.kind != "hold_linear":
            raise ConfigError(f"hold_steps is for kind 'hold_linear', not {self.kind!r}")
        if hold >= total and self.kind == "hold_linear":
            raise ConfigError(f"hold_steps ({hold}) must be < total_steps ({total})")
        power = _positive("power", self.power)
        if power != 1.0 and self.kind != "poly":
            raise ConfigError(f"power is for kind 'poly', not {self.kind!r}")
        for name, value in (("start", start), ("end", end), ("total_steps", total),
                            ("hold_steps", hold), ("power", power)):
            object.__setattr__(self, name, value)
        self._check_restarts()

    def _check_restarts(self) -> None:
        defaults = {f: type(self).__dataclass_fields__[f].default
                    for f in ("t0", "t_mult", "mode", "shape", "decay", "gamma")}
        if self.kind != "restarts":
            changed = [f for f, d in defaults.items() if getattr(self, f) != d]
            if changed:
                raise ConfigError(f"{', '.join(changed)} is for kind 'restarts', not "
                                  f"{self.kind!r}")
            return
        object.__setattr__(self, "t0", _positive("t0", self.t0))
        object.__setattr__(self, "t_mult", _positive("t_mult", self.t_mult))
        object.__setattr__(self, "gamma", _positive("gamma", self.gamma))
        if self.mode not in RESTART_MODES:
            raise ConfigError(f"mode must be one of {', '.join(RESTART_MODES)}; "
                              f"got {self.mode!r}")
        if self.shape not in RESTART_SHAPES:
            raise ConfigError(f"shape must be one of {', '.join(RESTART_SHAPES)}; "
                              f"got {self.shape!r}")
        if not isinstance(self.decay, bool):
            raise ConfigError(f"decay must be True or False, got {self.decay!r}")
        if self.decay and self.gamma > 1.0:
            raise ConfigError(f"gamma must be <= 1 (decay shrinks the restarts), got "
                              f"{self.gamma!r}")
        periods = self._cover()
        if periods is None:
            growth = "t0 or t_mult" if self.mode == "expanding" else "t0"
            raise ConfigError(
                f"restarts: t0={self.t0!r}, t_mult={self.t_mult!r} ({self.mode}) need more "
                f"than {MAX_PERIODS} periods to cover total_steps (periods that shrink "
                f"geometrically may never reach it); raise {growth}")
        object.__setattr__(self, "_periods", periods)

    def _cover(self) -> tuple[list[float], list[float]] | None:
        """``(starts, lengths)`` of the periods, in units of progress, covering [0, 1]; None
        when more than :data:`MAX_PERIODS` would be needed (or they never cover it)."""
        growth = self.t_mult if self.mode == "expanding" else 1.0
        begins, lengths, begin, length = [], [], 0.0, self.t0
        while begin < 1.0 - 1e-12:
            if len(begins) == MAX_PERIODS or not length > 0.0:
                return None
            begins.append(begin)
            lengths.append(min(length, 1.0 - begin))
            begin += lengths[-1]
            length *= growth
        return begins, lengths

    def _restarts(self, t: float) -> float:
        begins, lengths = self._periods
        i = max(bisect.bisect_right(begins, t) - 1, 0)
        a, b = self.start, self.end
        if self.shape == "constant":
            if self.decay and len(begins) >= 2:
                return _between(a + (b - a) * (i / (len(begins) - 1)), a, b)
            return a
        # (a - b times a weight in [0, 1]: a - b times 2 overflows for a radius near the
        # largest float)
        amplitude = (a - b) * (self.gamma ** i if self.decay else 1.0)
        weight = (1 + math.cos(math.pi * min((t - begins[i]) / lengths[i], 1.0))) / 2
        return _between(b + amplitude * weight, a, b)

    def __call__(self, step: int) -> float:
        """The radius at ``step`` (an integer ``>= 0``)."""
        step = _count("step", step, 0)
        if self.kind == "constant":
            return self.start
        # (a step past total_steps is total_steps: 10**400 / 1000 is no float)
        step = min(step, self.total_steps)
        t = min(max((step - self.hold_steps) / (self.total_steps - self.hold_steps), 0.0), 1.0)
        if self.kind == "restarts":
            return self._restarts(t)
        if t == 1.0:
            return self.end
        a, b = self.start, self.end
        if self.kind in ("linear", "hold_linear"):
            return a + (b - a) * t
        if self.kind == "cosine":
            return _between(b + (a - b) * ((1 + math.cos(math.pi * t)) / 2), a, b)
        return b + (a - b) * (1 - t) ** self.power  # poly

    def update(self, kl: float) -> float:
        """No-op (the interface of :class:`AdaptiveDelta`); returns ``start``."""
        return self.start

    def __str__(self) -> str:
        """The :func:`parse_schedule` string of this schedule."""
        if self.kind == "constant":
            return f"constant:{self.start!r}"
        text = f"{self.kind}:{self.start!r}:{self.end!r}:{self.total_steps}"
        if self.kind == "poly":
            return f"{text}:{self.power!r}"
        if self.kind == "hold_linear":
            return f"{text}:{self.hold_steps}"
        if self.kind == "restarts":
            decay = f":decay:{self.gamma!r}" if self.decay else ""
            return (f"{text}:{self.t0!r}:{self.t_mult!r}:{self.mode}:{self.shape}{decay}")
        return text


class AdaptiveDelta:
    r"""A radius steered towards a target KL, updated after each optimiser step.

    The rule (PPO's adaptive-KL idea, applied to the radius instead of a penalty
    coefficient, as a bounded proportional step in log space): after an update whose
    measured KL is ``kl``, with :math:`e = \log(\mathrm{kl} / \mathrm{target\_kl})`,

    * :math:`|e| \le \log(\mathrm{tolerance})` (the dead zone): ``delta`` is kept;
    * otherwise :math:`\delta \leftarrow \delta \exp(-\mathrm{clip}(\mathrm{gain}\cdot e,
      -\log \mathrm{factor}, \log \mathrm{factor}))`: a KL twice the target divides
      ``delta`` by :math:`2^{\mathrm{gain}}`, and no update moves it by more than
      ``factor``;

    and ``delta`` is clamped to ``[low, high]``.  A measured KL of 0 or below (every ratio
    1) counts as far below the target: ``delta`` grows by ``factor``.

    The KL is whatever estimate the caller measures between the policy that sampled a
    batch and the policy after the update (``fbands train`` uses the k3 estimate
    ``r - 1 - log r`` averaged over the batch's tokens, measured once all of the step's
    updates are done).  It is not bounded by ``delta``: the band stops a token's gradient
    only beyond its edge and on its advantage's side, while shared parameters move every
    token.  Choose the target within the range of KLs that fixed radii give (the
    "Choosing delta" guide).

    Parameters
    ----------
    target_kl : float
        The KL to aim for (``> 0``).
    start : float
        The first radius (``> 0``).
    low, high : float, optional
        Bounds of the radius (defaults ``start / 10`` and ``start * 10``); ``low <= start
        <= high``.
    gain : float
        Proportional gain on the log error (``> 0``, default 1).
    factor : float
        Largest change of ``delta`` in one update (``> 1``, default 2).
    tolerance : float
        Half-width of the dead zone, as a ratio (``> 1``, default 1.5): the KL may lie in
        ``[target_kl / tolerance, tolerance * target_kl]`` without a change.

    Examples
    --------
    >>> from fbands.schedules import AdaptiveDelta
    >>> a = AdaptiveDelta(target_kl=0.01, start=0.05)
    >>> round(a.update(0.02), 12)    # twice the target: halved
    0.025
    >>> round(a.update(0.012), 12)   # inside the dead zone: kept
    0.025
    >>> round(a.update(0.0), 12)     # no change at all: the largest step up, x2
    0.05
    >>> a(123)                       # the current radius, whatever the step
    0.05
    """

    adaptive = True

    def __init__(self, target_kl: float, start: float, low: float | None = None,
                 high: float | None = None, *, gain: float = 1.0, factor: float = 2.0,
                 tolerance: float = 1.5):
        self.target_kl = _positive("target_kl", target_kl)
        start = _positive("start", start)
        self.low = start / 10 if low is None else _positive("low", low)
        self.high = start * 10 if high is None else _positive("high", high)
        if not self.low <= start <= self.high:
            raise ConfigError(f"need low <= start <= high; got low={self.low!r}, "
                              f"start={start!r}, high={self.high!r}")
        self.gain = _positive("gain", gain)
        self.factor = _positive("factor", factor)
        self.tolerance = _positive("tolerance", tolerance)
        if self.factor <= 1 or self.tolerance <= 1:
            raise ConfigError(f"factor and tolerance must be > 1; got factor={factor!r}, "
                              f"tolerance={tolerance!r}")
        self.start = start
        self.delta = start

    def __call__(self, step: int) -> float:
        """The current radius (the step is checked but does not matter)."""
        _count("step", step, 0)
        return self.delta

    def update(self, kl: float) -> float:
        """Apply the rule to a measured KL; returns the new radius."""
        kl = _checks.number("the measured KL", kl, ConfigError)
        if kl > self.target_kl * self.tolerance or kl < self.target_kl / self.tolerance:
            err = math.log(max(kl, 1e-300) / self.target_kl)  # kl <= 0: far below
            step = min(max(self.gain * err, -math.log(self.factor)), math.log(self.factor))
            self.delta *= math.exp(-step)
        self.delta = min(max(self.delta, self.low), self.high)
        return self.delta

    def state_dict(self) -> dict:
        """The state to save in a checkpoint (the current radius)."""
        return {"delta": self.delta}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s radius (clamped to the bounds)."""
        self.delta = min(max(_positive("delta", state["delta"]), self.low), self.high)

    def __str__(self) -> str:
        return f"adaptive:{self.target_kl!r}:{self.start!r}:{self.low!r}:{self.high!r}"

    def __repr__(self) -> str:
        return (f"AdaptiveDelta(target_kl={self.target_kl!r}, start={self.start!r}, "
                f"low={self.low!r}, high={self.high!r}, gain={self.gain!r}, "
                f"factor={self.factor!r}, tolerance={self.tolerance!r}, delta={self.delta!r})")


_NUMBER = r"[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?"
_NUMBER_RE = re.compile(f"(?:{_NUMBER})")
_INT_RE = re.compile(r"[0-9]+")
#: Fields after the kind: (names, how many are required), each a number or an integer.
_GRAMMAR = {
    "constant": (("start",), 1),
    "linear": (("start", "end", "total_steps"), 3),
    "cosine": (("start", "end", "total_steps"), 3),
    "poly": (("start", "end", "total_steps", "power"), 3),
    "hold_linear": (("start", "end", "total_steps", "hold_steps"), 4),
    "restarts": (("start", "end", "total_steps", "t0", "t_mult", "mode", "shape", "decay",
                  "gamma"), 3),
    "adaptive": (("target_kl", "start", "low", "high"), 1),
}
_INTEGERS = ("total_steps", "hold_steps")
#: Fields that are words, and the words they take.
_WORDS = {"mode": RESTART_MODES, "shape": RESTART_SHAPES, "decay": ("decay", "nodecay")}
_USAGE = ("a number (constant), constant:START, linear|cosine:START:END:STEPS, "
          "poly:START:END:STEPS[:POWER], hold_linear:START:END:STEPS:HOLD, "
          "restarts:START:END:STEPS[:T0[:T_MULT[:expanding|fixed[:cosine|constant"
          "[:decay|nodecay[:GAMMA]]]]]], "
          "or adaptive:TARGET_KL[:START[:LOW:HIGH]]")


#: the most digits of a step count (a 5000-digit one would not even convert to an int)
_MAX_DIGITS = 18


def _field(text: str, name: str, field: str):
    """The number of field ``name``, or a :class:`ConfigError` that states its real rule
    (``total_steps`` an integer >= 1, ``hold_steps`` >= 0, every other field > 0)."""
    if name in _INTEGERS:
        least = 1 if name == "total_steps" else 0
        if not _INT_RE.fullmatch(field) or len(field.lstrip("0")) > _MAX_DIGITS:
            raise ConfigError(f"delta schedule {_short(text)!r}: {name} must be an integer "
                              f">= {least} of at most {_MAX_DIGITS} digits, got "
                              f"{_short(field)!r}")
        if int(field) < least:
            raise ConfigError(f"delta schedule {_short(text)!r}: {name} must be an integer "
                              f">= {least}, got {field!r}")
        return int(field)
    if not _NUMBER_RE.fullmatch(field):
        try:  # a number the grammar does not take (-1, inf, nan): say the rule it breaks
            float(field)
        except ValueError:
            rule = "must be a number"
        else:
            rule = "must be a finite number > 0"
        raise ConfigError(f"delta schedule {_short(text)!r}: {name} {rule}, got "
                          f"{_short(field)!r}")
    broken = _checks.violation(float(field), low=0.0, low_open=True)  # (400 digits: inf)
    if broken is not None:
        raise ConfigError(f"delta schedule {_short(text)!r}: {name} {broken}, got "
                          f"{_short(field)!r}")
    return float(field)


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_schedule(text: str, *, start: float | None = None):
    """A :class:`DeltaSchedule` or :class:`AdaptiveDelta` from its string.

    Grammar (fields separated by ``:``, numbers in plain decimal or ``1e-3`` notation, step
    counts as integers)::

        0.05                           constant 0.05
        constant:0.05
        linear:0.1:0.02:1000           start, end, total_steps
        cosine:0.1:0.02:1000
        poly:0.1:0.02:1000:2           ... and power (default 1)
        hold_linear:0.1:0.02:1000:200  ... and hold_steps
        restarts:0.2:0.02:1000         warm restarts, BandPO's defaults (T0 0.15, T_mult 2,
                                       expanding, cosine, no decay)
        restarts:0.2:0.02:1000:0.25:1:fixed:constant:decay   ... all of them
        restarts:0.2:0.02:1000:0.15:2:expanding:cosine:decay:0.5
        adaptive:0.01                  target KL; start from ``start``
        adaptive:0.01:0.05:0.005:0.5   target KL, start, low, high

    ``start`` is the radius used by ``adaptive`` when the string gives none (the trainer
    passes its preset's delta).

    Raises
    ------
    ConfigError
        For anything else, with the grammar in the message.
    """
    if not isinstance(text, str):
        raise ConfigError(f"a delta schedule must be a string, got {type(text).__name__}")
    parts = text.strip().split(":")
    if len(parts) == 1 and _NUMBER_RE.fullmatch(parts[0]):
        parts = ["constant", parts[0]]
    kind, fields = parts[0].strip(), [p.strip() for p in parts[1:]]
    if kind not in _GRAMMAR:
        raise ConfigError(f"unknown delta schedule {text!r}; expected {_USAGE}")
    names, required = _GRAMMAR[kind]
    if not required <= len(fields) <= len(names) or (kind == "adaptive" and len(fields) == 3):
        raise ConfigError(f"delta schedule {text!r} has {len(fields)} field(s) after "
                          f"{kind!r}; expected {_USAGE}")
    values = {}
    for name, field in zip(names, fields, strict=False):
        if name in _WORDS:
            if field not in _WORDS[name]:
                raise ConfigError(f"delta schedule {text!r}: {name} must be one of "
                                  f"{', '.join(_WORDS[name])}, got {field!r}")
            values[name] = field == "decay" if name == "decay" else field
            continue
        values[name] = _field(text, name, field)
    if kind == "adaptive":
        if "start" not in values:
            if start is None:
                raise ConfigError(f"delta schedule {text!r} needs a starting radius: "
                                  "adaptive:TARGET_KL:START, or a delta to start from")
            values["start"] = start
        return AdaptiveDelta(**values)
    return DeltaSchedule(kind, **values)
