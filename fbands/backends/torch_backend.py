"""torch backend: the shared solver (:mod:`fbands._solver`) on tensors, on any device.

The band of every element is computed by the same code as the numpy backend, bound to torch
functions through a small adapter namespace (:class:`TorchNamespace`).  What differs is how
the work is scheduled:

* **No host synchronisation.**  Root finding runs a fixed number of Newton steps
  (:data:`FIXED_ITER`, ``fixed_iter`` of :func:`fbands._solver.newton_edge`) instead of
  stopping when the data says so, and nothing on the hot path calls ``.item()``, ``.any()``
  or ``bool()`` on a tensor.  With ``check=False`` the whole computation is a fixed graph of
  elementwise kernels: it runs under ``torch.compile`` and inside a CUDA graph.  With
  ``check=True`` (the default) the input is validated first, which costs one
  synchronisation (the test ``bad.any()``) to be able to raise.
* **Precision.**  The work is done in float64 (float32 on devices without float64, such as
  Apple's MPS) and the result is cast back to the input's dtype once, so bfloat16 and
  float16 inputs get correctly rounded edges.
* **No autograd graph unless asked.**  The edges are computed under :func:`torch.no_grad`;
  they are constants for the policy loss.  When ``p`` or a ``delta`` tensor requires
  grad (and grad mode is on), the edges carry gradients by the implicit function theorem
  (:class:`ImplicitEdges`): for an edge inside the simplex ``g(p, r) = delta`` gives
  ``dr/dp = -g_p / g_r`` and ``dr/d delta = 1 / g_r``; a saturated edge is ``1 / p`` or
  ``0``.  Nothing is stored for it but the inputs, and the backward pass is a handful of
  elementwise kernels.
* **Device and shape.**  The result lives on ``p``'s device with the broadcast shape of
  ``p`` and ``delta``; ``delta`` may be a float, an array or a per-token tensor.
* **Tables on the device.**  A validated call (``check=True``, the default) with one
  Python-number ``delta`` reads the numba backend's interpolation tables with torch
  operations on the tensor's device (:func:`_table_edges`): a few dozen elementwise
  kernels instead of a Newton iteration, and the validation's one synchronisation also
  counts the few elements the table leaves, which the fixed-count solver then finishes.
  ``check=False`` keeps the sync-free solver.  Set :data:`USE_TABLES` to False to turn
  the tables off.
* **CPU tensors** are handed to the numba backend (:mod:`fbands.backends.numba_backend`)
  through a zero-copy numpy view (bf16 and fp16 through a float64 copy) when numba is
  installed and the call is not being traced by ``torch.compile``: on a CPU its table path
  is much faster than a fixed-count Newton iteration in elementwise torch kernels, and
  both agree to 1e-12.  Set :data:`CPU_KERNEL` to ``"torch"`` to keep CPU tensors on the
  torch solver.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fbands._optional import raise_missing

try:
    import torch
except ModuleNotFoundError as exc:
    raise_missing(exc, "the torch backend")

from fbands._solver import LP_CLOSED, BandFunction, Inputs, solve
from fbands.bands import invalid_masks, raise_invalid
from fbands.errors import BandError

__all__ = [
    "CPU_KERNEL", "FIXED_ITER", "ImplicitEdges", "TorchNamespace", "compute_dtype", "log_edges",
    "edges",
]

#: Newton steps per edge for divergences without a closed form.  Enough for every built-in
#: divergence to reach full float64 accuracy from the solver's initial guess for p in
#: [1e-12, 1 - 1e-9] and delta in [1e-4, 1] (the slowest, kl, needs about 45).
FIXED_ITER = 60


class TorchNamespace:
    """The functions the solver and the generated kernels call, for tensors of one dtype.

    torch's ``where``, ``minimum`` and ``maximum`` do not accept every mix of tensors and
    Python numbers that numpy does; the adapters here fill that gap without creating tensors
    from host data (a Python number becomes a ``full_like`` on the device), so they cost no
    transfer and no synchronisation.
    """

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        # Instance attributes, so that ``vars(namespace)`` (what Divergence.kernels reads)
        # lists every binding.
        self.exp, self.expm1, self.log, self.log1p = torch.exp, torch.expm1, torch.log, torch.log1p
        self.sqrt, self.sinh, self.cosh, self.sign = torch.sqrt, torch.sinh, torch.cosh, torch.sign
        self.abs, self.isfinite = torch.abs, torch.isfinite
        self.where, self.minimum, self.maximum = self._where, self._minimum, self._maximum

    def _where(self, cond, a, b):
        if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
            a = torch.full_like(cond, a, dtype=self.dtype)
        return torch.where(cond, a, b)

    def _minimum(self, a, b):
        if not isinstance(b, torch.Tensor):
            return torch.clamp(a, max=b)
        if not isinstance(a, torch.Tensor):
            return torch.clamp(b, max=a)
        return torch.minimum(a, b)

    def _maximum(self, a, b):
        if not isinstance(b, torch.Tensor):
            return torch.clamp(a, min=b)
        if not isinstance(a, torch.Tensor):
            return torch.clamp(b, min=a)
        return torch.maximum(a, b)


#: Which solver CPU tensors use: ``"numba"`` (when importable and not under torch.compile)
#: or ``"torch"``.
CPU_KERNEL = "numba"

_NAMESPACES: dict[torch.dtype, TorchNamespace] = {}


def _namespace(dtype: torch.dtype) -> TorchNamespace:
    # One object per dtype, kept alive: Divergence.kernels caches its bindings by identity.
    if dtype not in _NAMESPACES:
        _NAMESPACES[dtype] = TorchNamespace(dtype)
    return _NAMESPACES[dtype]


def compute_dtype(device: torch.device) -> torch.dtype:
    """float64, or float32 on devices without float64 arithmetic (MPS)."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


def _prepare(p: Any, delta: Any, *, logp: bool, invalid: str, check: bool):
    """Validate and broadcast; returns the tensors the solver and :func:`_finish` need."""
    if isinstance(p, torch.Tensor):
        kind = "tensor"
        t = p.detach()
    else:
        kind = "float" if isinstance(p, (int, float)) and not isinstance(p, bool) else "array"
        t = torch.as_tensor(np.asarray(p))
    if t.dtype == torch.bool or t.is_complex():
        raise BandError(f"p must be real numbers, got dtype {t.dtype}")
    out_dtype = t.dtype if t.is_floating_point() else torch.float64
    device = t.device
    work = compute_dtype(device)
    x = t.to(work)
    if isinstance(delta, torch.Tensor):
        d = delta.detach().to(device=device, dtype=work)
    elif isinstance(delta, (int, float)) and not isinstance(delta, bool):
        d = torch.full_like(x, float(delta))  # a fill on the device, not a host copy
    else:
        try:
            d = torch.as_tensor(np.asarray(delta, dtype=np.float64)).to(device=device,
                                                                       dtype=work)
        except (TypeError, ValueError) as err:
            raise BandError(f"delta must be a number or an array of numbers: {err}") from err
    try:
        x, d = torch.broadcast_tensors(x, d)
    except RuntimeError as err:
        raise BandError(
            f"delta of shape {tuple(d.shape)} does not broadcast against p of shape "
            f"{tuple(x.shape)}"
        ) from err

    bad = None
    if check or invalid == "nan":
        bad_p, bad_d = invalid_masks(x, d, logp, torch.isnan, torch.isinf)
        bad = bad_p | bad_d
        if check and invalid == "raise" and bool(bad.any()):  # the one (documented) sync
            raise_invalid(*(t.cpu().numpy() for t in (bad_p, x, bad_d, d)), logp)
        x = torch.where(bad, -math.log(2.0) if logp else 0.5, x)
        d = torch.where(bad, 1.0, d)
    if logp:
        lp = x
        pp = torch.exp(lp)
        q = -torch.expm1(lp)
    else:
        pp = x
        lp = torch.log(x)
        q = 1.0 - x
    q = torch.clamp(q, min=1e-300 if work == torch.float64 else 1e-38)
    lq = torch.log(q)
    return kind, out_dtype, Inputs(lp, lq, pp, q, d), bad


def _finish(kind, out_dtype, x: Inputs, bad, lo, hi, *, log: bool):
    zero = x.lp == -math.inf  # logp = -inf: the p -> 0 limit [0, inf)
    lo = torch.where(zero, -math.inf, lo)
    hi = torch.where(zero, math.inf, hi)
    if not log:
        top = hi == -x.lp
        lo = torch.exp(lo)
        hi = torch.where(top, 1.0 / x.p, torch.exp(hi))
    if bad is not None:
        lo = torch.where(bad, math.nan, lo)
        hi = torch.where(bad, math.nan, hi)
    lo, hi = lo.to(out_dtype), hi.to(out_dtype)
    if kind == "tensor":
        return lo, hi
    if kind == "float":
        return float(lo), float(hi)
    return lo.numpy(), hi.numpy()


def _kernels(div, dtype: torch.dtype):
    """``div.kernels`` bound to torch, kept on the divergence itself.

    Plain attribute and dict lookups are all that ``torch.compile`` has to trace once the
    kernels exist; the first call for a divergence derives them with sympy, which dynamo
    cannot trace (call once eagerly before compiling with ``fullgraph=True``).
    """
    table = div.__dict__.get("_torch_kernels")
    if table is None:
        table = div.__dict__.setdefault("_torch_kernels", {})
    found = table.get(dtype)
    if found is None:
        found = table[dtype] = div.kernels(_namespace(dtype))
    return found


def solve_log_edges(div, x: Inputs, *, fixed_iter: int | None = None, tiny=True, at_one=True):
    """``(log lower, log upper)`` for prepared inputs, with no host synchronisation.

    ``tiny`` and ``at_one`` say whether the inputs may hold ``log p < LP_CLOSED`` or
    ``p == 1`` (see :func:`fbands._solver.solve`); True is always right, False saves work.
    """
    dtype = x.lp.dtype
    return solve(
        div, _namespace(dtype), x, kernels=_kernels(div, dtype),
        fixed_iter=FIXED_ITER if fixed_iter is None else fixed_iter, tiny=tiny, at_one=at_one,
    )


def _numba_for_cpu(p, delta):
    """The numba backend module when it should take this call, else None."""
    if CPU_KERNEL != "numba" or not isinstance(p, torch.Tensor) or p.device.type != "cpu":
        return None
    if not p.is_floating_point():
        return None
    if isinstance(delta, torch.Tensor) and delta.device.type != "cpu":
        return None
    if torch.compiler.is_compiling():
        return None
    try:
        from fbands.backends import numba_backend
    except ImportError:
        return None
    return numba_backend


def _run_numba(module, div, p, delta, *, logp, invalid, check, log):
    # float32 and float64 as a view (no copy); bf16 and fp16, which numpy lacks, in float64,
    # so that the edges are rounded to them once
    native = p.dtype in (torch.float32, torch.float64)
    x = (p.detach() if native else p.detach().to(torch.float64)).numpy()
    if isinstance(delta, torch.Tensor):
        delta = delta.detach().to(torch.float64).numpy()
    fn = module.log_edges if log else module.edges
    lo, hi = fn(div, x, delta, logp=logp, invalid=invalid, check=check)
    lo, hi = torch.from_numpy(np.asarray(lo)), torch.from_numpy(np.asarray(hi))
    return (lo, hi) if native else (lo.to(p.dtype), hi.to(p.dtype))


def _run(div, p, delta, *, logp, invalid, check, log):
    if torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (p, delta)
    ):
        if not isinstance(p, torch.Tensor):
            raise BandError("gradients need p as a tensor (delta alone requires grad)")
        if not isinstance(delta, torch.Tensor):  # float64: the radius is not rounded to p's dtype
            delta = torch.tensor(float(delta), dtype=torch.float64, device=p.device)
        options = dict(logp=logp, invalid=invalid, check=check, log=log)
        return ImplicitEdges.apply(p, delta, div, options)
    return _solve(div, p, delta, logp=logp, invalid=invalid, check=check, log=log)


class ImplicitEdges(torch.autograd.Function):
    r"""The band edges with their derivatives in ``p`` (or ``log p``) and ``delta``.

    Forward is the ordinary solve.  Backward solves the log-edges ``s`` again in float64
    (so low-precision edges do not spoil their own derivatives) and differentiates
    ``g(p, s) = p F(s) + q F(s_c) = delta`` implicitly, with ``g_s`` the solver's slope and

    .. math::

        g_p = F(s) - F(s_c) + f'(c)\,\frac{1 - r}{q}, \qquad c = \frac{1 - r p}{q},

    so ``ds/dp = -g_p / g_s`` and ``ds/d\delta = 1 / g_s``.  Saturated edges: ``s = -log p``
    (``ds/dp = -1/p``) and ``r = 0`` (zero).  Ratios get ``dr = r ds``; log-probability
    input gets ``d/d log p = p d/dp``.
    """

    @staticmethod
    def forward(ctx, p, delta, div, options):
        ctx.div, ctx.options = div, options
        ctx.save_for_backward(p, delta)
        return _solve(div, p.detach(), delta.detach(), **options)

    @staticmethod
    def backward(ctx, grad_lo, grad_hi):
        p, delta = ctx.saved_tensors
        div, opt = ctx.div, ctx.options
        work = compute_dtype(p.device)
        with torch.no_grad():
            x, d = torch.broadcast_tensors(p.detach().to(work), delta.detach().to(work))
            s_lo, s_hi = _solve(div, x, d, logp=opt["logp"], invalid="nan", check=False,
                                log=True)
            _, _, inputs, _ = _prepare(x, d, logp=opt["logp"], invalid="nan", check=False)
            fun = BandFunction(div, _namespace(work), inputs, kernels=_kernels(div, work))
            grad_x = torch.zeros_like(x)
            grad_d = torch.zeros_like(d)
            for grad, s in ((grad_lo, s_lo), (grad_hi, s_hi)):
                if grad is None:
                    continue
                ds_dp, ds_dd = _edge_derivatives(fun, inputs, s)
                g = grad.to(work) * (1.0 if opt["log"] else torch.exp(s))  # d out / ds
                grad_x += g * (ds_dp * inputs.p if opt["logp"] else ds_dp)
                grad_d += g * ds_dd
        grad_p = grad_x.to(p.dtype).sum_to_size(p.shape) if ctx.needs_input_grad[0] else None
        grad_delta = (grad_d.to(delta.dtype).sum_to_size(delta.shape)
                      if ctx.needs_input_grad[1] else None)
        return grad_p, grad_delta, None, None


def _edge_derivatives(fun: BandFunction, x: Inputs, s):
    """``(ds/dp, ds/d delta)`` of one log-edge (see :class:`ImplicitEdges`)."""
    top = s == -x.lp
    zero = s == -math.inf
    inside = ~(top | zero) & torch.isfinite(s)
    s_in = torch.where(inside, s, torch.zeros_like(s) - 0.5)
    _, g_s = fun.value_and_slope(s_in)
    sc = fun.s_c(s_in)
    r = torch.exp(s_in)
    fprime_c = fun.dF(sc) * torch.exp(-sc)  # f'(c) = F'(s_c) / c
    g_p = fun.F(s_in) - fun.F(sc) + fprime_c * (1.0 - r) / x.q
    ds_dp = torch.where(inside, -g_p / g_s, torch.where(top, -1.0 / x.p, 0.0))
    ds_dd = torch.where(inside, 1.0 / g_s, 0.0)
    return ds_dp, ds_dd


def _solve(div, p, delta, *, logp, invalid, check, log):
    module = _numba_for_cpu(p, delta)
    if module is not None:
        return _run_numba(module, div, p, delta, logp=logp, invalid=invalid, check=check,
                          log=log)
    if check and USE_TABLES:
        out = _table_solve(div, p, delta, logp=logp, invalid=invalid, log=log)
        if out is not None:
            return out
    with torch.no_grad():
        kind, out_dtype, x, bad = _prepare(p, delta, logp=logp, invalid=invalid, check=check)
        if check:  # validation synchronised already: look at the data to skip unused paths
            tiny, at_one = bool((x.lp < LP_CLOSED).any()), bool((x.lp == 0).any())
        else:
            tiny = at_one = True
        lo, hi = solve_log_edges(div, x, tiny=tiny, at_one=at_one)
        return _finish(kind, out_dtype, x, bad, lo, hi, log=log)


# ----------------------------------------------------------------------------- tables


#: Whether validated calls (``check=True``) with one scalar delta use the numba backend's
#: interpolation tables, evaluated by torch on the tensor's device.
USE_TABLES = True


def _table_solve(div, p, delta, *, logp, invalid, log):
    """The table path on the device, or None where it does not apply.

    It applies to tensors with a float64-capable device and a Python-number ``delta``, when
    numba is there to build the tables (:func:`fbands.backends.numba_backend.tables`, cached
    per divergence and delta; copied to each device once).  Every element is read from the
    table (:func:`_table_edges`, elementwise kernels with no synchronisation); then one
    synchronisation, the one validation costs anyway, counts the invalid elements (to
    raise) and those the table leaves, which are solved by the fixed-count solver on their
    own.
    """
    if (
        not isinstance(p, torch.Tensor)
        or not p.is_floating_point()
        or isinstance(delta, bool)
        or not isinstance(delta, (int, float))
        or compute_dtype(p.device) != torch.float64
        or torch.compiler.is_compiling()
    ):
        return None
    d = float(delta)
    if not (d > 0 and math.isfinite(d)):
        return None  # the general path raises or gives nan
    try:
        from fbands.backends import numba_backend
    except ImportError:
        return None
    layout = "float64" if p.dtype == torch.float64 else "float32"
    tab = numba_backend.tables(div, d, layout)[bool(log)]
    with torch.no_grad():
        x = p.detach().reshape(-1).to(torch.float64)
        at_one = numba_backend.lower_at_one(div, d, log)
        lo, hi, more = _table_edges(tab, x, at_one, logp=logp, log=log)
        bad_p, bad_d = invalid_masks(x, x.new_tensor(d), logp, torch.isnan, torch.isinf)
        n_bad, n_more = torch.stack((bad_p.sum(), more.sum())).tolist()  # the one sync
        if n_bad and invalid == "raise":  # indices of p's own shape in the message
            raise_invalid(bad_p.reshape(p.shape).cpu().numpy(), x.reshape(p.shape).cpu().numpy(),
                          bad_d.cpu().numpy(), np.float64(d), logp)
        if n_more:
            idx = torch.nonzero_static(more, size=n_more).reshape(-1)
            kind, _, sub, bad = _prepare(x[idx], d, logp=logp, invalid="nan", check=False)
            s_lo, s_hi = solve_log_edges(div, sub)
            s_lo, s_hi = _finish(kind, torch.float64, sub, bad, s_lo, s_hi, log=log)
            lo[idx], hi[idx] = s_lo, s_hi
        return lo.to(p.dtype).reshape(p.shape), hi.to(p.dtype).reshape(p.shape)


def _device_table(tab, device):
    found = tab.__dict__.setdefault("_torch", {}).get(device)
    if found is None:
        found = tab._torch[device] = tuple(
            torch.from_numpy(a).to(device) for a in (tab.coef, tab.row_code.astype(np.int64),
                                                      tab.cells_info)
        )
    return found


def _table_edges(tab, x, at_one: float, *, logp: bool, log: bool):
    """``(lower, upper, more)`` of float64 ``x`` from a numba table, in torch operations.

    The same reading of the table as the numba kernel (``table_row`` and ``horner`` in
    :mod:`fbands.backends._numba_template`): the cell from the bits of
    ``z = min(p, 1 - p)``, the coordinate from the remaining mantissa bits, two Horner
    chains, ``1 / p`` (or ``-log p``) where the upper edge is saturated, and the limit
    ``(at_one, 1)`` at ``p == 1``.  ``more`` marks the elements to solve exactly: rows
    marked so, invalid input, ``log p`` below ``LP_CLOSED``.
    """
    from fbands.backends import numba_backend as nb

    coef, row_code, cells_info = _device_table(tab, x.device)
    ln2 = math.log(2.0)
    if logp:
        valid = x <= 0
        lp = torch.where(valid, x, -1.0)
        high = lp > -ln2
        p = torch.exp(lp)
        z = torch.where(high, -torch.expm1(lp.clamp(min=-ln2)), p).clamp(min=1e-300)
        top = 0.0 - lp if log else 1.0 / p  # (0.0 - : log 1 gives +0.0)
        one, special = lp == 0, lp < LP_CLOSED
    else:
        valid = (x > 0) & (x <= 1)
        v = torch.where(valid, x, 0.5)
        high = v > 0.5
        z = torch.where(high, 1.0 - v, v)
        top = 0.0 - torch.log(v) if log else 1.0 / v
        one, special = v == 1, v < math.exp(LP_CLOSED)
    kbits = tab.kbits
    cells = 1 << kbits
    bits = z.view(torch.int64)
    b = 1022 - (bits >> 52)
    nb_side = torch.where(high, nb.NB_HI, nb.NB_LO)
    j = (bits >> (52 - kbits)) & (cells - 1)
    cell = torch.where(b < nb_side, b * cells + j, nb_side * cells)
    cell = cell + torch.where(high, nb.NB_LO * cells + 1, 0)
    info = cells_info[cell]
    sh = info & 15
    rest = 52 - kbits - sh
    unit = torch.ones_like(sh)
    row = (info >> 4) + ((bits >> rest) & ((unit << sh) - 1))
    scale = ((1023 - rest) << 52).view(torch.float64)  # 2^-rest
    u = 2.0 * ((bits & ((unit << rest) - 1)).to(torch.float64) * scale) - 1.0
    k = row * nb.ROW
    lo, hi = coef[k], coef[k + 1]
    for i in range(1, nb.DEG + 1):
        lo = lo * u + coef[k + 2 * i]
        hi = hi * u + coef[k + 2 * i + 1]
    code = row_code[row]
    hi = torch.where(((code & nb.ROW_TOP) != 0) | one, top, hi)
    lo = torch.where(one, at_one, lo)
    more = (((code & nb.ROW_EXACT) != 0) & ~one) | special | ~valid
    return lo, hi, more


def log_edges(div, p, delta, *, logp, invalid, check):
    """``(log lower, log upper)`` of the band (see :func:`fbands.log_bounds`)."""
    return _run(div, p, delta, logp=logp, invalid=invalid, check=check, log=True)


def edges(div, p, delta, *, logp, invalid, check):
    """``(lower, upper)`` of the band (see :func:`fbands.bounds`)."""
    return _run(div, p, delta, logp=logp, invalid=invalid, check=check, log=False)
