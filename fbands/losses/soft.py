r"""The soft clip: smooth (or rolled-back) replacements ``s(r)`` of ``clip(r, r_lo, r_hi)``.

:func:`soft_clip` takes log-ratios and log-edges, as the hard clip of
:mod:`fbands.losses.terms` does, and returns ``s`` (a ratio).  The forms and their equations
are listed in its docstring and in the "Choosing delta" guide; BandPO's names ``1seg``,
``2seg`` and ``hard`` are aliases of ``tanh1``, ``tanh2`` and the hard clip
(:data:`fbands.losses.config.SOFT_ALIASES`).

Every tanh piece is evaluated in a form that does not cancel: a piece that starts at a
point ``e`` with slope 1 is written ``e + d * phi(x) / (...)`` with ``d`` the distance from
``e``, ``x = d / scale`` and ``phi(x) = tanh(x) / x`` (or ``(1 - e^-x) / x``), the scale
given by its logarithm.  An edge that overflows (a rare token's ``r_hi``) makes ``x`` tend
to 0 and ``s`` tend to ``r``, which is what such a band asks for; a scale below
:math:`e^{-20}` counts as :math:`e^{-20}` (a hard clip, to float precision).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fbands.errors import LossError
from fbands.losses.config import SOFT_ALIASES, SOFT_FORMS

# Ratios are exponentiated from log r <= MAX_LOG_RATIO (r <= 5.5e34), which keeps every
# product finite in float32.  Only a token whose old probability is below ~1e-35 can reach it.
MAX_LOG_RATIO = 80.0
# Floor of a log-scale: 1 / scale stays finite, so no 0 * inf reaches a gradient.
_MIN_LOG_SCALE = -20.0
# Cap of log(alpha_high) of the rollback forms: alpha_high stays finite in float32.
_MAX_LOG_ALPHA = 80.0
# BandPO's floor on r_lo in alpha_high = alpha (r_hi / r_lo)^2 of ``rollback``.
_ROLLBACK_LO_FLOOR = 1e-12
# ``3seg_control_reach``: growth factor and largest number of growths of g, tolerance on T.
_REACH_GROWTH, _REACH_MAX_STEPS, _REACH_TOL = 1.5, 60, 1e-7


def _inv_scale(log_scale: Tensor) -> Tensor:
    return torch.exp(-log_scale.clamp(min=_MIN_LOG_SCALE))


def _phi_tanh(x: Tensor) -> Tensor:
    """``tanh(x) / x``, 1 at 0, smooth for every finite ``x``."""
    small = x.abs() < 1e-4
    safe = torch.where(small, torch.ones_like(x), x)
    return torch.where(small, 1 - x * x / 3, torch.tanh(safe) / safe)


def _phi_exp(w: Tensor) -> Tensor:
    """``(1 - exp(-w)) / w`` for ``w >= 0``, 1 at 0."""
    small = w < 1e-4
    safe = torch.where(small, torch.ones_like(w), w)
    return torch.where(small, 1 - w / 2 + w * w / 6, -torch.expm1(-safe) / safe)


def _saturate(d: Tensor, log_scale: Tensor, k: float) -> Tensor:
    """``scale * tanh(k d / scale)`` as ``k d phi(k d / scale)``."""
    kd = k * d
    return kd * _phi_tanh(kd * _inv_scale(log_scale))


class _Edges:
    """The band in the forms the pieces need: ``r``, ``lo``, ``hi`` and the logs of
    ``eps_lo = 1 - lo`` and ``eps_hi = hi - 1``."""

    def __init__(self, logratio, log_lo, log_hi):
        self.lr = logratio.clamp(max=MAX_LOG_RATIO)
        self.r = torch.exp(self.lr)
        self.log_lo = log_lo
        self.log_hi = log_hi.clamp(max=MAX_LOG_RATIO)
        self.lo = torch.exp(log_lo)
        self.hi = torch.exp(self.log_hi)
        self.log_eps_hi = torch.log(torch.expm1(self.log_hi))  # -inf at hi = 1
        self.log_eps_lo = torch.log(-torch.expm1(log_lo))  # 0 at lo = 0


def _tanh1(e: _Edges, p: dict) -> Tensor:
    m, h = (e.lo + e.hi) / 2, (e.hi - e.lo) / 2
    return m + _saturate(e.r - m, torch.log(h), 1.0)


def _tanh2(e: _Edges, p: dict) -> Tensor:
    log_scale = torch.where(e.lr >= 0, e.log_eps_hi, e.log_eps_lo)
    return 1 + _saturate(torch.expm1(e.lr), log_scale, p["k"])


def _smooth3(e: _Edges, p: dict) -> Tensor:
    lw = math.log(p["width"])
    up = e.hi + _saturate(e.r - e.hi, lw + e.log_eps_hi, 1.0)
    down = e.lo + _saturate(e.r - e.lo, lw + e.log_eps_lo, 1.0)
    return torch.where(e.lr > e.log_hi, up, torch.where(e.lr < e.log_lo, down, e.r))


def _joins(e: _Edges, rho: float) -> tuple[Tensor, Tensor]:
    """BandPO's split points ``e_hi = rho + (1 - rho) r_hi``, ``e_lo = rho + (1 - rho) r_lo``."""
    t = 1 - rho
    return 1 + t * torch.exp(e.log_eps_hi), 1 - t * torch.exp(e.log_eps_lo)


def _tanh3(e: _Edges, p: dict) -> Tensor:
    # s = 1 +- eps tanh(atanh(t) + |r - e_b| / (eps q)), t = 1 - rho, q = 1 - t^2,
    # rewritten as e_b +- d phi(x) / (1 + t tanh x) with x = d / (eps q).
    rho = p["rho"]
    t, log_q = 1 - rho, math.log(rho * (2 - rho))
    e_hi, e_lo = _joins(e, rho)
    d_up = (e.r - e_hi).clamp(min=0)
    x_up = d_up * _inv_scale(e.log_eps_hi + log_q)
    up = e_hi + d_up * _phi_tanh(x_up) / (1 + t * torch.tanh(x_up))
    d_dn = (e_lo - e.r).clamp(min=0)
    x_dn = d_dn * _inv_scale(e.log_eps_lo + log_q)
    down = e_lo - d_dn * _phi_tanh(x_dn) / (1 + t * torch.tanh(x_dn))
    return torch.where(e.r > e_hi, up, torch.where(e.r < e_lo, down, e.r))


def _converge_upper(e: _Edges, e_hi: Tensor, rho: float, g: float) -> Tensor:
    # s = r_hi - D (1 + E) / (1 + E exp((1 + E) x / (D E))), D = r_hi - e_hi, E = e^{2g},
    # rewritten as e_hi + x (1 + 1/E) phi_exp(w) / (1 + e^{-w} / E), w = x (1 + 1/E) / D.
    inv_e = math.exp(-2 * g)
    x = (e.r - e_hi).clamp(min=0)
    w = x * (1 + inv_e) * _inv_scale(math.log(rho) + e.log_eps_hi)
    up = e_hi + x * (1 + inv_e) * _phi_exp(w) / (1 + torch.exp(-w) * inv_e)
    return torch.where(e.r > e_hi, up, e.r)


def _converge(e: _Edges, p: dict) -> Tensor:
    # Lower piece: s = r_lo + a (1 + tanh(g + b (r - e_lo))), a = D (1 + E) / (2E),
    # b = (1 + E) / (2D), D = e_lo - r_lo; written as e_lo - D (1 - e^{-v}) / (1 + e^{2g - v})
    # with v = (1 + E) (e_lo - r) / D.
    rho, g = p["rho"], p["g"]
    e_hi, e_lo = _joins(e, rho)
    s = _converge_upper(e, e_hi, rho, g)
    x = (e_lo - e.r).clamp(min=0)
    log_d = math.log(rho) + e.log_eps_lo
    v = x * (1 + math.exp(2 * g)) * _inv_scale(log_d)
    down = e_lo - torch.exp(log_d) * (-torch.expm1(-v)) / (1 + torch.exp(2 * g - v))
    return torch.where(e.r < e_lo, down, s)


@torch.no_grad()
def _reach_g(e_lo: Tensor, log_d: Tensor, g0: float) -> Tensor:
    """BandPO's ``g`` of ``3seg_control_reach``: ``g0 * 1.5**k`` for the least ``k <= 60``
    with ``T(g) = coth(g) - S / g > -1 + 1e-7``, ``S = e_lo / (e_lo - r_lo)``.

    ``g (coth g + 1)`` lies in ``[max(1 + g, 2g), 2g + 1]``, so the least such ``g`` is
    within a factor 3 of ``(S - 1) / 2``: start one growth below that and take a few."""
    s = (e_lo.double() / torch.exp(log_d.double().clamp(min=_MIN_LOG_SCALE)))
    guess = ((s - 1) / 2).clamp(min=1e-300) / g0
    k = (torch.floor(torch.log(guess) / math.log(_REACH_GROWTH)) - 1)
    k = k.clamp(0, _REACH_MAX_STEPS)
    for _ in range(6):
        g = g0 * _REACH_GROWTH ** k
        fails = (1 / torch.tanh(g) - s / g) <= -1 + _REACH_TOL
        k = k + (fails & (k < _REACH_MAX_STEPS)).double()
    return g0 * _REACH_GROWTH ** k


def _reach(e: _Edges, p: dict) -> Tensor:
    # Lower piece through (0, r_lo) and (e_lo, e_lo) with slope 1 there:
    # s = a tanh(b (r - c)) + d, a = e_lo / (g (1 - T^2)), b = g / e_lo, u = atanh(T),
    # c = e_lo - u / b, d = e_lo - a T; written as e_lo - x phi(y) / (1 - T tanh y),
    # x = e_lo - r, y = g x / e_lo.
    rho = p["rho"]
    e_hi, e_lo = _joins(e, rho)
    s = _converge_upper(e, e_hi, rho, p["g"])
    log_d = math.log(rho) + e.log_eps_lo
    g = _reach_g(e_lo, log_d, p["g"]).to(e.r.dtype)
    big_t = 1 / torch.tanh(g) - e_lo / (g * torch.exp(log_d.clamp(min=_MIN_LOG_SCALE)))
    x = (e_lo - e.r).clamp(min=0)
    y = g * x / e_lo
    down = e_lo - x * _phi_tanh(y) / (1 - big_t * torch.tanh(y))
    return torch.where(e.r < e_lo, down, s)


def _rollback_middle(e: _Edges, p: dict, activate: bool) -> Tensor:
    if not activate:
        return e.r
    # s = 1 + (eps / tanh a) tanh(a (r - 1) / eps), eps the side's distance to 1.
    a = p["alpha_in"]
    log_scale = torch.where(e.lr > 0, e.log_eps_hi, e.log_eps_lo)
    return 1 + _saturate(torch.expm1(e.lr), log_scale, a) / math.tanh(a)


def _rollback(e: _Edges, p: dict, activate: bool = False) -> Tensor:
    # Beyond an edge b: s = b - alpha_b (tanh(r - 1) - tanh(b - 1)), alpha_lo = alpha,
    # alpha_hi = alpha (r_hi / r_lo)^2; the difference of tanh as tanh(r - b)(1 - ...).
    log_a = math.log(p["alpha"])
    log_lo = e.log_lo.clamp(min=math.log(_ROLLBACK_LO_FLOOR))
    a_hi = torch.exp((log_a + 2 * (e.log_hi - log_lo)).clamp(max=_MAX_LOG_ALPHA))
    t1 = torch.tanh(e.r - 1)
    up = e.hi - a_hi * torch.tanh(e.r - e.hi) * (1 - t1 * torch.tanh(e.hi - 1))
    down = e.lo - p["alpha"] * torch.tanh(e.r - e.lo) * (1 - t1 * torch.tanh(e.lo - 1))
    mid = _rollback_middle(e, p, activate)
    return torch.where(e.lr > e.log_hi, up, torch.where(e.lr < e.log_lo, down, mid))


def _rollback_plus(e: _Edges, p: dict, activate: bool = False) -> Tensor:
    # Beyond an edge b: s = b - alpha_b tanh(gamma (r - b)), alpha_lo = alpha,
    # alpha_hi = alpha eps_hi / eps_lo.
    log_a = math.log(p["alpha"])
    log_ratio = (e.log_eps_hi.clamp(min=_MIN_LOG_SCALE)
                 - e.log_eps_lo.clamp(min=_MIN_LOG_SCALE))
    a_hi = torch.exp((log_a + log_ratio).clamp(max=_MAX_LOG_ALPHA))
    gamma = p["gamma"]
    up = e.hi - a_hi * torch.tanh(gamma * (e.r - e.hi))
    down = e.lo - p["alpha"] * torch.tanh(gamma * (e.r - e.lo))
    mid = _rollback_middle(e, p, activate)
    return torch.where(e.lr > e.log_hi, up, torch.where(e.lr < e.log_lo, down, mid))


_FORMS = {
    "tanh1": _tanh1,
    "tanh2": _tanh2,
    "smooth3": _smooth3,
    "3seg": _tanh3,
    "3seg_control_converge": _converge,
    "3seg_control_reach": _reach,
    "rollback": _rollback,
    "rollback_activate": lambda e, p: _rollback(e, p, activate=True),
    "rollback_plus": _rollback_plus,
    "rollback_activate_plus": lambda e, p: _rollback_plus(e, p, activate=True),
}
assert tuple(_FORMS) == SOFT_FORMS


def soft_clip(logratio: Tensor, log_lo: Tensor, log_hi: Tensor, form: str, *,
              k: float = 1.0, width: float = 0.25, rho: float = 0.1, g: float = 1.0,
              alpha: float = 0.05, gamma: float = 0.2, alpha_in: float = 2.0) -> Tensor:
    r"""The function ``s(r)`` that ``LossConfig.soft`` puts in place of
    ``clip(r, r_lo, r_hi)``, from log-ratios and log-edges.

    With :math:`\epsilon_h = r_{hi} - 1`, :math:`\epsilon_l = 1 - r_{lo}`:

    ``tanh1`` (alias ``1seg``): :math:`s = m + h\tanh((r - m)/h)`, :math:`m, h` the band's
    centre and half-width.  ``tanh2`` (alias ``2seg``): :math:`s = 1 + \epsilon
    \tanh(k(r - 1)/\epsilon)`, :math:`\epsilon = \epsilon_h` above 1 and :math:`\epsilon_l`
    below.  ``smooth3``: the identity in the band, :math:`b + w\tanh((r - b)/w)` beyond an
    edge :math:`b`, :math:`w = \text{width}\,|b - 1|`.

    The three-segment forms of BandPO are the identity between the joins
    :math:`e_h = 1 + (1-\rho)\epsilon_h` and :math:`e_l = 1 - (1-\rho)\epsilon_l`, and a tanh
    beyond them with value and slope 1 continuous at the join:

    * ``3seg``: :math:`s = 1 \pm \epsilon \tanh(\operatorname{atanh}(1-\rho) +
      |r - e|/(\epsilon\rho(2-\rho)))`, saturating at the edge;
    * ``3seg_control_converge``: above, :math:`s = r_{hi} - a(1 - \tanh(g + b(r - e_h)))`,
      :math:`a = D(1+E)/2`, :math:`b = (1+E)/(2DE)`, :math:`D = \rho\epsilon_h`,
      :math:`E = e^{2g}`; below, :math:`s = r_{lo} + a'(1 + \tanh(g + b'(r - e_l)))`,
      :math:`a' = D'(1+E)/(2E)`, :math:`b' = (1+E)/(2D')`, :math:`D' = \rho\epsilon_l`
      (BandPO's lower piece takes the same sign of :math:`g` as the upper one, so its slope
      rises above 1 just below :math:`e_l` for :math:`g > 0`); ``3seg`` is this form with
      :math:`g = \operatorname{atanh}(1 - \rho)`;
    * ``3seg_control_reach``: the same upper piece; below, :math:`s = a\tanh(b(r - c)) + d`
      with :math:`T = \coth g - e_l/(g D')`, :math:`a = e_l/(g(1 - T^2))`, :math:`b = g/e_l`,
      :math:`c = e_l - \operatorname{atanh}(T)/b`, :math:`d = e_l - aT`, so that
      :math:`s(0) = r_{lo}`; :math:`g` is grown by factors 1.5 (at most 60) until
      :math:`T > -1 + 10^{-7}`.

    The rollback forms keep the identity inside the band (or, ``*_activate*``, the curve
    :math:`1 + (\epsilon/\tanh a_{in})\tanh(a_{in}(r - 1)/\epsilon)`, which meets the edges),
    and beyond an edge :math:`b` *decrease*, so that the loss pulls the ratio back:

    * ``rollback``, ``rollback_activate``: :math:`s = b - \alpha_b(\tanh(r - 1) -
      \tanh(b - 1))`, :math:`\alpha_l = \alpha`, :math:`\alpha_h = \alpha (r_{hi}/r_{lo})^2`
      (:math:`r_{lo}` floored at :math:`10^{-12}`);
    * ``rollback_plus``, ``rollback_activate_plus``: :math:`s = b - \alpha_b
      \tanh(\gamma(r - b))`, :math:`\alpha_l = \alpha`, :math:`\alpha_h = \alpha
      \epsilon_h/\epsilon_l`.

    Their value is continuous at the edges, their slope is not.  :math:`\alpha_h` is capped
    at :math:`e^{80}`.  ``hard`` (or None) is the hard clip itself.

    Parameters
    ----------
    logratio, log_lo, log_hi : Tensor
        :math:`\log r` (with gradient) and the band's log-edges, broadcasting together.
    form : str
        One of :data:`fbands.losses.SOFT_FORMS`, or an alias (``1seg``, ``2seg``,
        ``hard``).
    k, width, rho, g, alpha, gamma, alpha_in : float
        The forms' parameters (defaults: fbands' for ``tanh2`` and ``smooth3``, BandPO's
        for the others).

    Returns
    -------
    Tensor
        ``s``, a ratio, of the broadcast shape.

    Examples
    --------
    >>> import math, torch
    >>> lr = torch.log(torch.tensor([1.0, 1.1, 2.0], dtype=torch.float64))
    >>> lo = torch.full((3,), math.log(0.8), dtype=torch.float64)
    >>> hi = torch.full((3,), math.log(1.2), dtype=torch.float64)
    >>> [round(v, 6) for v in soft_clip(lr, lo, hi, "3seg").tolist()]
    [1.0, 1.1, 1.2]
    """
    if form in SOFT_ALIASES:
        form = SOFT_ALIASES[form]
    if form is None:
        lr = torch.maximum(torch.minimum(logratio, log_hi), log_lo)
        return torch.exp(lr.clamp(max=MAX_LOG_RATIO))
    if form not in _FORMS:
        raise LossError(f"unknown soft form {form!r}; expected one of {', '.join(SOFT_FORMS)}")
    params = {"k": k, "width": width, "rho": rho, "g": g, "alpha": alpha, "gamma": gamma,
              "alpha_in": alpha_in}
    return _FORMS[form](_Edges(logratio, log_lo, log_hi), params)
