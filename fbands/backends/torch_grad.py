"""Derivatives of the band edges for torch autograd: :class:`ImplicitEdges`.

The torch backend (:mod:`fbands.backends.torch_backend`) computes the edges; when ``p`` or a
``delta`` tensor requires grad, :func:`fbands.backends.torch_backend.with_grad` wraps that
call in :class:`ImplicitEdges`, whose backward pass differentiates the band equation
implicitly (the derivation is in the docs' numerics page, "Derivatives of the edges").  This
module takes the torch namespace and the bound kernels from its caller, and imports nothing
of the backend's.
"""

from __future__ import annotations

import math

import torch

from fbands import symbolic
from fbands._band_function import LP_TINY, BandFunction, Inputs, TinyUpper, log1mexp
from fbands._inputs import Request, TensorInputs, work_dtype
from fbands._state import STATE
from fbands.divergences import functions

__all__ = ["LOG_C_CANCEL", "ImplicitEdges"]


class ImplicitEdges(torch.autograd.Function):
    r"""The band edges with their derivatives in ``p`` (or ``log p``) and ``delta``.

    Forward is the ordinary solve.  Backward solves the log-edges ``s`` again in float64
    (so low-precision edges do not spoil their own derivatives) and differentiates
    ``g(p, s) = p F(s) + q F(s_c) = delta`` implicitly, with ``g_s`` the solver's slope and

    .. math::

        g_p = F(s) - F(s_c) + f'(c)\,\frac{1 - r}{q}, \qquad c = \frac{1 - r p}{q},

    so ``ds/dp = -g_p / g_s`` and ``ds/d\delta = 1 / g_s``.  Saturated edges: ``s = -log p``
    (``ds/dp = -1/p``) and ``r = 0`` (zero).  Ratios get ``dr = r ds``; log-probability
    input gets ``d/d log p = p d/dp``, except where ``log p < LP_TINY`` (``p`` may underflow)
    or the plain formula overflows: there the equations of the tails of f that the solver
    itself uses give ``ds/d log p`` and ``ds/d delta`` directly (:func:`_tail_derivatives`),
    and ``ds/dp`` is that over ``p``.  At ``p = 1`` the lower edge's derivatives are those
    of the limit equation (:func:`_lower_at_one`).
    """

    @staticmethod
    def forward(ctx, p, delta, div, radius, how):
        # radius: delta as given (a float takes the same path as without autograd); how:
        # (solve, log_edges, logp, log, namespace, kernels), see torch_backend.with_grad
        ctx.div, ctx.how = div, how
        ctx.save_for_backward(p, delta)
        radius = radius.detach() if isinstance(radius, torch.Tensor) else radius
        with torch.no_grad():
            return how[0](p.detach(), radius)

    @staticmethod
    def backward(ctx, grad_lo, grad_hi):
        p, delta = ctx.saved_tensors
        div, (_, log_edges, logp, log, namespace, kernels) = ctx.div, ctx.how
        work = work_dtype(p.device)
        with torch.no_grad():
            x, d = torch.broadcast_tensors(p.detach().to(work), delta.detach().to(work))
            s_lo, s_hi = log_edges(x, d)
            inputs = TensorInputs(x, d, Request(logp=logp, invalid="nan", check=False)).inputs
            fun = BandFunction(div, namespace(work), inputs, kernels=kernels(div, work))
            grad_x = torch.zeros_like(x)
            grad_d = torch.zeros_like(d)
            for grad, s, lower in ((grad_lo, s_lo, True), (grad_hi, s_hi, False)):
                if grad is None:
                    continue
                ds_dp, ds_dlp, ds_dd = _edge_derivatives(fun, inputs, s, lower=lower)
                g = grad.to(work) * (1.0 if log else torch.exp(s))  # d out / ds
                grad_x += _times(g, ds_dlp if logp else ds_dp)
                grad_d += _times(g, ds_dd)
        grad_p = grad_x.to(p.dtype).sum_to_size(p.shape) if ctx.needs_input_grad[0] else None
        grad_delta = (grad_d.to(delta.dtype).sum_to_size(delta.shape)
                      if ctx.needs_input_grad[1] else None)
        return grad_p, grad_delta, None, None, None


def _times(g, ds):
    # g * ds, with 0 * inf = 0: an unused edge's infinite derivative adds nothing.
    return torch.where(g == 0, 0.0, g * ds)


def _edge_derivatives(fun: BandFunction, x: Inputs, s, *, lower: bool):
    """``(ds/dp, ds/d log p, ds/d delta)`` of one log-edge (see :class:`ImplicitEdges`).

    The derivative in ``log p`` is not taken as ``p ds/dp`` where ``p`` underflows (or
    where the generator's own forms overflow): there the tails of f give it (see
    :func:`_tail_derivatives`), finite wherever the edge is.
    """
    ds_dp, ds_dd = _inner_derivatives(fun, x, s)
    ds_dlp = ds_dp * x.p
    # Where the solver took the tails of f (log p < LP_TINY), or where the plain formula
    # overflowed (a generated F or F' of size r**3 at r ~ 1e103), the tails give the
    # derivatives, in log p first.
    tail = _tail_derivatives(fun, x, s, lower=lower)
    if tail is not None:
        use = (x.lp < LP_TINY) | ~(torch.isfinite(ds_dp) & torch.isfinite(ds_dd))
        use = use & torch.isfinite(s) & (s != -x.lp)  # (saturated edges keep theirs)
        t_dlp, t_dd = tail
        ds_dlp = torch.where(use, t_dlp, ds_dlp)
        ds_dp = torch.where(use, t_dlp / x.p, ds_dp)
        ds_dd = torch.where(use, t_dd, ds_dd)
    if not lower:
        return ds_dp, ds_dlp, ds_dd
    one = x.p == 1.0
    at_one_dp, at_one_dd = _lower_at_one(fun, x, s)
    return (torch.where(one, at_one_dp, ds_dp), torch.where(one, at_one_dp, ds_dlp),
            torch.where(one, at_one_dd, ds_dd))


def _tail_derivatives(fun: BandFunction, x: Inputs, s, *, lower: bool):
    r"""``(ds/d log p, ds/d delta)`` from the equations the solver uses below ``LP_TINY``,
    or None where f has no such tail.

    Upper edge (:class:`fbands._band_function.TinyUpper`): in ``w = log(p r)`` the
    equation is ``G = T(w, log p) + F(log(1 - e^w)) = delta`` with
    ``T = e^{k w + (1 - k) log p} (A (w - log p)^m + B)``, whose partial derivative in
    ``log p`` is ``T - T_w`` (for m = 0 and 1 alike).  With ``G_w = T_w - X``,
    ``X = e^{w - s_c} F'(s_c)``, and ``s = w - log p``:
    ``ds/d log p = -(T - T_w) / G_w - 1 = -(T - X) / G_w`` (no cancellation: ``T > 0`` and
    ``X < 0``) and ``ds/d delta = 1 / G_w``.

    Lower edge (:func:`fbands._band_function._lower_tail`, f infinite at 0):
    ``s = (log(delta / A) - log p) / k`` gives ``-1/k`` and ``1 / (k delta)``;
    ``s = -delta / (-A p)`` (``m = 1``, ``k = 0``) gives ``-s`` and ``s / delta``.
    """
    d = fun.div.derivation
    if lower:
        if d.tail0 is None:
            return None
        A, k, m, _ = d.tail0
        if m == 0 and k < 0:
            return torch.full_like(s, -1.0 / k), 1.0 / (k * x.delta) + 0.0 * s
        if m == 1 and k == 0 and A < 0:
            s_in = torch.where(torch.isfinite(s), s, 0.0)
            return -s_in, s_in / x.delta
        return None
    if d.tail_inf is None or not d.tail_inf[0] > 0:
        return None
    tiny = TinyUpper(fun.div, fun.xp, x, (fun.F, fun.dF, fun.closed))
    w = torch.clamp(torch.where(torch.isfinite(s), s + x.lp, -1.0), max=0.0)
    sc = log1mexp(fun.xp, w)  # log(1 - v)
    safe = torch.where(sc == -math.inf, 0.0, sc)
    T, dT = tiny._T(w)
    X = torch.exp(w - safe) * fun.dF(safe)
    g_w = dT - X
    return -(T - X) / g_w, 1.0 / g_w


def _lower_at_one(fun: BandFunction, x: Inputs, s):
    r"""``(ds/dp, ds/d delta)`` of the lower edge at ``p = 1``, one-sided (from ``p < 1``).

    There ``q`` is floored, so the general formula is meaningless.  Its limit: with
    ``A = f'(inf)`` and ``K = lim (f(c) - A (c - 1))`` as ``c -> inf``,
    ``g_p -> f(r) - K - A r + A = delta - K`` and ``g_s -> r (f'(r) - A)``.  ``K = -inf``
    (kl, hellinger) or ``A = inf`` (chi2: the edge is 1 and opens like a power of ``q``)
    give ``+inf``; a lower edge at ``r = 0`` stays there (zero).  ``ds/d delta`` is
    ``1 / g_s`` of that limit equation (:class:`fbands._band_function.AtOne`), 0 where
    ``A = inf`` (the edge stays at 1).
    """
    A = fun.div.fprime_inf
    inside = (s > -math.inf) & (s < 0.0)
    if math.isinf(A):  # the edge stays at 1: no radius moves it
        return torch.where(inside | (s == 0.0), math.inf, 0.0) + 0.0 * s, 0.0 * s
    s_in = torch.where(inside, s, torch.zeros_like(s) - 0.5)
    g_s = fun.dF(s_in) - torch.exp(s_in) * A  # the slope of AtOne's equation
    ds_dd = torch.where(inside, 1.0 / g_s, 0.0)
    K = fun.div.offset_at_inf
    if math.isinf(K):
        return torch.where(inside | (s == 0.0), math.inf, 0.0) + 0.0 * s, ds_dd
    return torch.where(inside, -(x.delta - K) / g_s, 0.0), ds_dd


#: log of the other token's ratio ``c`` above which ``g_p`` is taken from the intercept (its
#: plain form loses about ``eps c`` relatively: 1e-12 at ``c = 1e4``).
LOG_C_CANCEL = math.log(1e4)
_INTERCEPTS = STATE.memo("torch intercepts", "each divergence's tangent intercept bound to "
                        "torch, by (divergence key, dtype)", max_entries=256)


def _intercept(div, xp, dtype: torch.dtype):
    r"""The tangent's intercept ``T`` (:attr:`fbands.Divergence.intercept_source`) bound to
    torch, or None.  Where ``c`` is large, ``g_p = f(r) - f(c) + f'(c) (c - r)`` is a
    difference of two terms of size ``f'(inf) c`` (``c ~ (1 - r) / q`` for ``p`` next to 1);
    written as ``f(r) - T(c) - r f'(c)`` it has none."""

    def bind():
        src = div.intercept_source
        return None if src is None else symbolic.bind(src, functions(xp))

    return _INTERCEPTS.get_or_make((div.key, dtype), bind)


def _inner_derivatives(fun: BandFunction, x: Inputs, s):
    top = s == -x.lp
    zero = s == -math.inf
    inside = ~(top | zero) & torch.isfinite(s)
    s_in = torch.where(inside, s, torch.zeros_like(s) - 0.5)
    _, g_s = fun.value_and_slope(s_in)
    sc = fun.s_c(s_in)
    r = torch.exp(s_in)
    fprime_c = fun.dF(sc) * torch.exp(-sc)  # f'(c) = F'(s_c) / c
    g_p = fun.F(s_in) - fun.F(sc) + fprime_c * (1.0 - r) / x.q
    intercept = _intercept(fun.div, fun.xp, s.dtype)
    if intercept is not None:  # f(c) - f'(c) (c - r) = T(c) + r f'(c): no cancellation
        far = sc > LOG_C_CANCEL
        sc_far = torch.where(far, sc, LOG_C_CANCEL + 1.0 + 0.0 * sc)
        g_far = fun.F(s_in) - intercept(sc_far) - torch.exp(s_in - sc_far) * fun.dF(sc_far)
        g_p = torch.where(far, g_far, g_p)
    ds_dp = torch.where(inside, -g_p / g_s, torch.where(top, -1.0 / x.p, 0.0))
    ds_dd = torch.where(inside, 1.0 / g_s, 0.0)
    return ds_dp, ds_dd
