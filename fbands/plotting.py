"""Pictures of bands (matplotlib, imported on use)."""

from __future__ import annotations

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
    output = Path(output)
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return output
