"""The one door: :func:`bounds` and :func:`log_bounds`.

Both hand the call to :func:`fbands._dispatch.compute`, which decides how it is computed
(:func:`fbands._dispatch.plan`, one decision table) and calls the backend's
implementation; the input contract itself (validation, broadcasting, error messages) is
:mod:`fbands._inputs`.  The result has the input's type, shape and dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, TypeAlias, overload

import numpy as np

from fbands._dispatch import BACKENDS, PATHS, compute
from fbands.divergences import Divergence

if TYPE_CHECKING:
    import torch

#: What ``p`` and ``delta`` may be: a Python number, a sequence of them or a numpy array
#: (arrays come back), or a torch tensor.
Values: TypeAlias = "float | Sequence[float] | np.ndarray | torch.Tensor"
Backend: TypeAlias = Literal["auto", "numpy", "numba", "torch", "cvxpy"]
Invalid: TypeAlias = Literal["raise", "nan"]

__all__ = ["bounds", "log_bounds", "precompile", "BACKENDS", "PATHS"]


@overload
def log_bounds(p: float, delta: float, div: str | Divergence = ..., backend: Backend = ...,
               *, logp: bool = ..., invalid: Invalid = ...,
               check: bool = ...) -> tuple[float, float]: ...
@overload
def log_bounds(p: torch.Tensor, delta: Values, div: str | Divergence = ..., backend: Backend = ...,
               *, logp: bool = ..., invalid: Invalid = ...,
               check: bool = ...) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def log_bounds(p: Values, delta: Values, div: str | Divergence = ..., backend: Backend = ...,
               *, logp: bool = ..., invalid: Invalid = ...,
               check: bool = ...) -> tuple[np.ndarray, np.ndarray]: ...


def log_bounds(
    p: Values,
    delta: Values,
    div: str | Divergence = "kl",
    backend: Backend = "auto",
    *,
    logp: bool = False,
    invalid: Invalid = "raise",
    check: bool = True,
) -> tuple:
    r"""Log-edges ``(log lower, log upper)`` of the band of ratios allowed by ``D_f <= delta``.

    The same as :func:`bounds` in log space: exact where ``lower`` underflows (``log lower``
    stays finite while the ratio is below the smallest float) and where ``upper`` overflows
    (for ``p`` below ``1e-308``, or below ``1e-38`` in float32).  ``log lower = -inf`` means
    the lower edge is saturated at ratio 0.

    Examples
    --------
    >>> import numpy as np, fbands
    >>> lo, hi = fbands.log_bounds(np.array([-1e4, -50.0]), 0.05, "kl", logp=True)
    >>> (hi + [-1e4, -50.0]).round(6).tolist()   # log(p r): v = p r = 1 - exp(-delta)
    [-3.020628, -3.020628]
    """
    return compute("log_edges", div, p, delta, backend, logp=logp, invalid=invalid, check=check)


@overload
def bounds(p: float, delta: float, div: str | Divergence = ..., backend: Backend = ...,
         *, logp: bool = ..., invalid: Invalid = ...,
         check: bool = ...) -> tuple[float, float]: ...
@overload
def bounds(p: torch.Tensor, delta: Values, div: str | Divergence = ..., backend: Backend = ...,
         *, logp: bool = ..., invalid: Invalid = ...,
         check: bool = ...) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def bounds(p: Values, delta: Values, div: str | Divergence = ..., backend: Backend = ...,
         *, logp: bool = ..., invalid: Invalid = ...,
         check: bool = ...) -> tuple[np.ndarray, np.ndarray]: ...


def bounds(
    p: Values,
    delta: Values,
    div: str | Divergence = "kl",
    backend: Backend = "auto",
    *,
    logp: bool = False,
    invalid: Invalid = "raise",
    check: bool = True,
) -> tuple:
    r"""The band ``[lower, upper]`` of ratios ``r = pi(a) / p`` inside an f-divergence ball.

    For a token whose old probability is ``p``, ``r`` is allowed when some new distribution
    ``pi`` with ``pi(a) = r p`` satisfies ``D_f(pi || pi_old) <= delta``.  By the two-point
    reduction that holds iff

    .. math::

        g_f(p, r) = p\,f(r) + (1 - p)\,f\!\left(\frac{1 - r p}{1 - p}\right) \le \delta,
        \qquad 0 \le r \le 1/p,

    and the band is the interval between the two roots of ``g_f(p, r) = delta`` (clamped to
    ``0`` and ``1/p`` when the ball reaches them).

    Parameters
    ----------
    p : float, numpy.ndarray or torch.Tensor
        Old probabilities in ``(0, 1]``, or log-probabilities in ``[-inf, 0]`` with
        ``logp=True`` (``-inf`` gives the ``p -> 0`` limit ``[0, inf)``).
    delta : float or array-like
        Radius ``> 0``; broadcasts against ``p``.
    div : str or Divergence
        A name from :func:`fbands.available` (``"kl"``, ``"tv"``, ``"alpha(a=0.5)"`` ...).
    backend : {"auto", "numpy", "numba", "torch", "cvxpy"}
        ``auto`` takes torch for tensors, numba for arrays of 65536 elements or more
        once its kernels for the divergence and dtype were compiled ahead
        (:func:`precompile`, once per machine), and numpy for the rest: it never waits
        on a compile.  ``numba`` compiles what it needs on its first call of a
        divergence and dtype (announced, up to a minute, once per machine).  Within a
        backend an element gets the same bits alone as in any batch; numpy, numba and
        torch agree to 1e-12 relative in float64, not bit for bit, so pass a backend
        where bits must not move.  ``cvxpy`` is the
        independent reference (convex programs): each edge it returns is certified to
        1e-5 relative, and an edge it cannot certify is nan, with a ``RuntimeWarning``.
    logp : bool
        ``p`` holds log-probabilities.
    invalid : {"raise", "nan"}
        What an invalid element (nan, out-of-range ``p`` or ``delta``) does: raise
        :class:`fbands.BandError`, or give ``nan`` for both edges in its place.
    check : bool
        Validate the input.  ``False`` skips the checks (and, on torch, the host
        synchronisation they cost); invalid elements then give unspecified values.  It
        never changes how the band is computed (:func:`fbands._dispatch.plan` decides that).  On a
        GPU with one scalar ``delta``, an eager call synchronises once anyway, to solve
        the few elements the tables leave on the host; traced by ``torch.compile`` or
        captured in a CUDA graph it does not, and solves them on the device through a
        buffer of static size; in the rare call that needs more, those beyond it are nan
        (see :func:`fbands.backends.torch_backend.capacity`).

    Returns
    -------
    (lower, upper)
        Of ``p``'s type, shape and dtype (Python floats for a Python float).  Computed in
        float64 and rounded once.  Constants for autograd, unless ``p`` (or a ``delta``
        tensor) is a tensor that requires grad: then the edges are differentiable in ``p``
        and ``delta`` (implicit function theorem, see
        :class:`fbands.backends.torch_backend.ImplicitEdges`).

    Raises
    ------
    BandError
        For invalid input (the message names the argument, the index and the value).
    DivergenceError
        For an unknown divergence (the message lists the available ones).

    Examples
    --------
    >>> import fbands
    >>> lo, hi = fbands.bounds(0.5, 0.05, div="tv")     # closed form 1 -+ delta / p
    >>> round(lo, 12), round(hi, 12)
    (0.9, 1.1)
    >>> lo, hi = fbands.bounds(0.01, 0.05, div="kl")    # a rare token may grow a lot more
    >>> round(lo, 4), round(hi, 4)
    (0.0025, 7.8098)
    """
    return compute("edges", div, p, delta, backend, logp=logp, invalid=invalid, check=check)


#: The dtypes of the arrays that the numba backend compiles kernels for.
DTYPES = ("float32", "float64")


def precompile(divs: str | Divergence | Sequence[str | Divergence] | None = None,
               dtypes: str | Sequence[str] = DTYPES) -> list[tuple[str, str, float]]:
    """Compile the numba backend's kernels ahead, once per machine (for a cluster image, or
    before a timed run), so that no later call waits on a compile.

    ``divs``: divergences (names or objects; default: every registered divergence that is
    not a family); ``dtypes``: of the arrays to serve, ``"float32"`` and/or ``"float64"``.
    Each pair is compiled, or loaded from the disk cache when an earlier process compiled
    it, and recorded there: from then on ``backend="auto"`` sends arrays of 65536 elements
    or more of that divergence and dtype to numba (before, the numpy solver answers them).
    Each pair is announced as it starts (:mod:`fbands._notice`).  Returns
    ``(divergence, dtype, seconds)`` for each pair.

    >>> import fbands
    >>> fbands.precompile(["kl", "tv"], "float32")  # doctest: +SKIP
    [('kl', 'float32', 31.2), ('tv', 'float32', 6.5)]
    """
    import time

    from fbands import _notice
    from fbands._dispatch import backend_module
    from fbands.divergences import available, get
    from fbands.errors import BandError

    if divs is None:
        divs = available(families=False)
    elif isinstance(divs, (str, Divergence)):
        divs = [divs]
    dtypes = [dtypes] if isinstance(dtypes, str) else list(dtypes)
    for t in dtypes:
        if t not in DTYPES:
            raise BandError(f"dtypes: {t!r} is not one of {list(DTYPES)}")
    found = [get(d) for d in divs]
    backend = backend_module("numba")
    done = []
    for k, (div, t) in enumerate(((d, t) for d in found for t in dtypes), 1):
        _notice.notice(f"precompile {k}/{len(found) * len(dtypes)}: the numba kernels of "
                       f"{div.name!r} for {t} arrays")
        start = time.perf_counter()
        backend.precompile(div, t)
        done.append((div.name, t, time.perf_counter() - start))
    return done
