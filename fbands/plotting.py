"""Pictures of bands (matplotlib, imported on use)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from fbands._optional import require

#: Fixed intervals drawn for comparison: PPO's clip and DAPO's Clip-Higher.
BASELINES = {"clip [0.8, 1.2]": (0.8, 1.2), "clip-higher [0.8, 1.28]": (0.8, 1.28)}


def plot_bands(divs, delta: float, output: str | Path, *, p_min: float = 1e-4) -> Path:
    """Draw the bands of ``divs`` against ``p`` (log axis) and save a PNG.

    Left: the ratio band ``[lower, upper]``; right: the probability change it allows,
    ``(r - 1) p``.  Fixed clipping and Clip-Higher are drawn for comparison.

    Parameters
    ----------
    divs : sequence of str
        Divergence names.
    delta : float
        The radius.
    output : path
        Where to write the PNG.
    p_min : float
        Left end of the p axis.

    Returns
    -------
    Path
        ``output``.
    """
    matplotlib = require("matplotlib", "fbands.plotting")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import fbands

    p = np.logspace(np.log10(p_min), np.log10(0.999), 400)
    fig, (ax_r, ax_dp) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for color, name in zip(colors, divs, strict=False):
        lo, hi = fbands.bounds(p, delta, name, backend="numpy")
        label = f"{fbands.get(name).name} (delta={delta:g})"
        ax_r.fill_between(p, lo, np.minimum(hi, 1 / p), color=color, alpha=0.15)
        ax_r.plot(p, hi, color=color, label=label)
        ax_r.plot(p, lo, color=color)
        ax_dp.plot(p, (hi - 1) * p, color=color, label=label)
        ax_dp.plot(p, (lo - 1) * p, color=color)
    for (label, (a, b)), style in zip(BASELINES.items(), ("--", ":"), strict=True):
        ax_r.hlines([a, b], p[0], p[-1], colors="k", linestyles=style, label=label)
        ax_dp.plot(p, (b - 1) * p, "k" + style, label=label)
        ax_dp.plot(p, (a - 1) * p, "k" + style)
    ax_r.set(xscale="log", yscale="log", xlabel="old probability p", ylabel="ratio r",
             title="band of ratios")
    ax_dp.set(xscale="log", xlabel="old probability p", ylabel="(r - 1) p",
              title="allowed change of probability")
    ax_r.plot(p, 1 / p, color="0.6", lw=0.8, label="r = 1/p")
    ax_r.set_ylim(0.05, 1e3)
    ax_dp.set_ylim(-0.3, 0.3)
    for ax in (ax_r, ax_dp):
        ax.grid(True, which="both", alpha=0.3)
    ax_dp.legend(fontsize=8, loc="upper left")
    return _save(fig, output, dpi=120, tight=False)


def _save(fig, output: str | Path, *, tight: bool = True, rect=None, dpi=None) -> Path:
    """Lay out, write and close ``fig``; returns ``output`` as a Path."""
    import matplotlib.pyplot as plt

    if tight:
        fig.tight_layout(**({"rect": rect} if rect else {}))
    output = Path(output)
    fig.savefig(output, **({"dpi": dpi} if dpi else {}))
    plt.close(fig)
    return output


def _pyplot():
    matplotlib = require("matplotlib", "fbands.plotting")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_gain(
    divs, delta: float, output: str | Path, *, eps: float = 0.2,
    eps_high: float | None = 0.28, p_min: float = 1e-4, match_p: float | None = None,
) -> Path:
    """The probability a token may gain, ``p (r_hi - 1)``, against its old probability ``p``.

    PPO's clip lets a token gain at most ``eps p`` (a line of slope 1 on log axes); a band of
    radius ``delta`` lets it gain an amount that does not vanish with ``p`` for divergences with
    a finite ``f'(inf)``, and that shrinks like ``sqrt(p)`` for the others. The dotted line
    ``1 - p`` is the most any token can gain (all the mass).

    Parameters
    ----------
    divs : sequence of str
        Divergence names.
    delta : float
        The radius of the bands.
    output : path
        Where to write the PNG.
    eps, eps_high : float
        PPO's clip range and Clip-Higher's upper one (None: not drawn), for comparison.
    p_min : float
        Left end of the p axis.
    match_p : float, optional
        Instead of ``delta``, give each band the radius of
        :func:`fbands.calibrate_delta` ``(eps, match_p, div)``: its curve then crosses
        PPO's line at ``p = match_p`` (``fbands plot --compare-clip EPS --match-p P``).

    Returns
    -------
    Path
        ``output``.
    """
    plt = _pyplot()
    import fbands

    p = np.logspace(np.log10(p_min), np.log10(0.999), 300)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    for name in divs:
        radius = delta if match_p is None else fbands.calibrate_delta(eps, match_p, name,
                                                                      unreachable="raise")
        _, hi = fbands.bounds(p, radius, name, backend="numpy")
        ax.plot(p, p * (hi - 1), lw=1.8,
                label=f"band {fbands.get(name).name}, delta = {radius:.3g}")
    ax.plot(p, eps * p, "k--", lw=1.6, label=f"PPO clip: eps p, eps = {eps:g}")
    if eps_high is not None:
        ax.plot(p, eps_high * p, "k:", lw=1.4, label=f"Clip-Higher: {eps_high:g} p")
    if match_p is not None:
        ax.axvline(match_p, color="0.5", lw=0.8, ls=":", label=f"matched at p = {match_p:g}")
    ax.plot(p, 1 - p, color="0.6", lw=0.9, ls="-.", label="1 - p (all the mass)")
    ax.set(xscale="log", yscale="log", xlabel="old probability p",
           ylabel="allowed gain  p (r_hi - 1)",
           title="how much probability a token may gain in one update")
    ax.set_xlim(p[0], 1)
    ax.set_ylim(eps * p[0] / 2, 1.0)
    ax.grid(True, which="major", lw=0.4, alpha=0.6)
    ax.legend(fontsize=7.5, loc="lower right")
    return _save(fig, output)


def plot_two_point(output: str | Path, *, p: float = 0.2, r: float = 2.5, n: int = 8,
                   seed: int = 3) -> Path:
    """The two-point reduction as bars: an old distribution, and the cheapest new one.

    The sampled token (first bar) moves from ``p`` to ``r p``; every other token is scaled by
    the same factor ``c = (1 - r p) / (1 - p)``, which is the distribution of least
    f-divergence among those giving the token ratio ``r``, for every f.

    Returns
    -------
    Path
        ``output``.
    """
    plt = _pyplot()
    rng = np.random.default_rng(seed)
    rest = rng.dirichlet(np.full(n - 1, 1.5)) * (1 - p)
    old = np.concatenate([[p], rest])
    c = (1 - r * p) / (1 - p)
    new = np.concatenate([[r * p], c * rest])
    x = np.arange(n)
    fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=110)
    ax.bar(x - 0.2, old, width=0.4, color="0.65", label="old policy q")
    colors = ["tab:blue"] + ["tab:orange"] * (n - 1)
    ax.bar(x + 0.2, new, width=0.4, color=colors, label="new policy pi_r")
    ax.annotate(f"sampled token a:\np = {p:g} -> r p = {r * p:g}", (0.2, r * p),
                xytext=(1.0, r * p * 0.9), fontsize=8,
                arrowprops={"arrowstyle": "->", "lw": 0.8})
    ax.text(n / 2, max(old.max(), new.max()) * 0.62, f"every other token\nscaled by c = {c:.3g}",
            ha="left", va="bottom", fontsize=8)
    ax.set_xticks(x, ["a"] + [f"x{i}" for i in range(1, n)])
    ax.set_ylabel("probability")
    ax.set_title("two-point reduction: the cheapest way to give token a the ratio r")
    ax.legend(fontsize=8, loc="upper right")
    return _save(fig, output)


def plot_saturation_map(divs, output: str | Path, *, p_min: float = 1e-3,
                        delta_range: tuple[float, float] = (1e-3, 1.0)) -> Path:
    """Where each edge saturates, over the plane of old probability ``p`` and radius ``delta``.

    One panel per divergence; the colours mark the lower edge at 0 (the token may vanish), the
    upper edge at ``1/p`` (the token may take all the mass), both, or neither.

    Returns
    -------
    Path
        ``output``.
    """
    plt = _pyplot()
    from matplotlib.colors import ListedColormap

    import fbands

    z = np.linspace(np.log(p_min / (1 - p_min)), -np.log(p_min / (1 - p_min)), 240)
    p = 1 / (1 + np.exp(-z))  # evenly spaced in logit(p): both ends are visible
    d = np.logspace(np.log10(delta_range[0]), np.log10(delta_range[1]), 200)
    pp, dd = np.meshgrid(p, d)
    cmap = ListedColormap(["white", "tab:red", "tab:blue", "tab:purple"])
    n = len(divs)
    cols = 2 if n > 1 else 1
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.4, 2.6 * rows + 0.4), dpi=110,
                             squeeze=False, sharex=True, sharey=True)
    for ax, name in zip(axes.flat, divs, strict=False):
        lo, hi = fbands.bounds(pp, dd, name, backend="numpy")
        code = (lo == 0).astype(int) + 2 * (hi >= 1 / pp * (1 - 1e-12)).astype(int)
        ax.pcolormesh(p, d, code, cmap=cmap, vmin=-0.5, vmax=3.5, shading="auto")
        ax.set(xscale="logit", yscale="log", title=fbands.get(name).name)
        ax.grid(True, lw=0.3, alpha=0.5)
    for ax in axes[-1]:
        ax.set_xlabel("old probability p")
    for ax in axes[:, 0]:
        ax.set_ylabel("radius delta")
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(i), ec="0.5") for i in range(4)]
    fig.legend(handles, ["no edge saturates", "lower edge = 0", "upper edge = 1/p", "both"],
               loc="lower center", ncol=4, fontsize=7.5, frameon=False)
    return _save(fig, output, rect=(0, 0.06, 1, 1))


def plot_rstar(divs, output: str | Path, *, deltas=None) -> Path:
    """``r*``, the limit of the lower edge as ``p -> 1``, against the radius, per divergence.

    Divergences with an infinite ``f'(inf)`` (``chi2``, ``reverse_kl``) have ``r* = 1`` for
    every radius: a confident token cannot be lowered at all.

    Returns
    -------
    Path
        ``output``.
    """
    plt = _pyplot()
    import fbands

    deltas = np.logspace(-3, 0.5, 120) if deltas is None else np.asarray(deltas, float)
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=110)
    styles = ["-", "--", "-.", ":"]
    for i, name in enumerate(divs):
        lo, _ = fbands.bounds(np.ones_like(deltas), deltas, name, backend="numpy")
        ax.plot(deltas, lo, lw=1.6, ls=styles[i % len(styles)], label=fbands.get(name).name)
    ax.set(xscale="log", xlabel="radius delta", ylabel="r* = lim lower edge (p -> 1)",
           title="how far a confident token's ratio may fall")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(True, lw=0.4, alpha=0.6)
    ax.legend(fontsize=8, loc="lower left")
    return _save(fig, output)


def plot_soft_clip(output: str | Path, *, lower: float = 0.8, upper: float = 1.5,
                   k: float = 1.0, width: float = 0.25) -> Path:
    """The ratio the loss sees, ``s(r)``, for the hard clip and every soft form of
    :func:`fbands.losses.soft_clip` (:data:`fbands.losses.SOFT_FORMS`, BandPO's with their
    default parameters), on one band ``[lower, upper]`` (left), and their slopes ``ds/dr``
    (right): the gradient a token keeps, relative to an unclipped one (negative beyond an
    edge for the rollback forms).

    Parameters
    ----------
    output : path
        Where to write the PNG.
    lower, upper : float
        The band (``0 <= lower < 1 < upper``); a lopsided one shows how ``tanh1`` moves
        ``s(1)`` away from 1.
    k, width : float
        ``soft_k`` of ``tanh2`` and ``soft_width`` of ``smooth3``.

    Returns
    -------
    Path
        ``output``.
    """
    plt = _pyplot()
    import torch

    from fbands.losses import SOFT_FORMS, soft_clip

    r = torch.linspace(0.3, 2.5, 600, dtype=torch.float64)
    lr = torch.log(r).requires_grad_()
    lo = torch.full_like(r, math.log(lower))
    hi = torch.full_like(r, math.log(upper))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10.0, 4.2), dpi=110)
    hard = torch.clamp(r, lower, upper)
    ax.plot(r, hard, "k--", lw=1.4, label="hard clip")
    ax2.plot(r, ((r > lower) & (r < upper)).double(), "k--", lw=1.4, label="hard clip")
    styles = ("-", "--", "-.", ":")
    for i, form in enumerate(SOFT_FORMS):
        s = soft_clip(lr, lo, hi, form, k=k, width=width)
        (ds_dlr,) = torch.autograd.grad(s.sum(), lr)
        style = {"lw": 1.3, "ls": styles[i // 4 % len(styles)] if i >= 3 else "-"}
        ax.plot(r, s.detach(), label=form, **style)
        ax2.plot(r, (ds_dlr / r).detach(), label=form, **style)
    for a in (ax, ax2):
        for edge in (lower, upper):
            a.axvline(edge, color="0.6", lw=0.8, ls=":")
        a.set_xlabel("ratio r")
        a.grid(True, lw=0.4, alpha=0.6)
    ax.plot(r, r, color="0.7", lw=0.8, label="r")
    ax.set(ylabel="s(r)", title=f"clipped ratio, band [{lower:g}, {upper:g}]")
    ax2.set(ylabel="ds/dr", title="slope (gradient kept)")
    ax.legend(fontsize=6.5, loc="upper left", ncol=2)
    return _save(fig, output)
