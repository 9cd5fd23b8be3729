"""The profile-likelihood figure of :mod:`diffsoup.plots` (matplotlib's Agg backend)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ._figures import _pyplot, _save


def plot_profiles(result: Any, path: Any, *, title: str | None = None, max_panels: int = 24) -> Path:
    """Each parameter's profile: the rise of the objective above the optimum against the
    parameter (the optimizer's coordinates), the chi-square threshold (dashed), the confidence
    interval shaded, the estimate marked; a side whose profile did not cross the threshold (a
    bound, or the step budget ran out) says so.

    Args:
        result: a ``ds.inference.ProfileResult`` (``ds.inference.profile``).
        path: the PNG file.
        title: the figure's title.
        max_panels: most parameters drawn (the first, in theta order); the title says so.

    Returns:
        The PNG's path.
    """
    plt = _pyplot()
    profiles = list(result.profiles.values())
    shown = profiles[:max_panels]
    cols = min(4, max(1, len(shown)))
    rows = max(1, math.ceil(len(shown) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 2.6 * rows), squeeze=False)
    delta = float(result.delta)
    for ax, p in zip(axes.flat, shown):
        rise = np.asarray(p.objectives) - p.optimum
        ax.axvspan(p.lower, p.upper, color="tab:blue", alpha=0.12, lw=0)
        ax.plot(p.values, rise, "-", color="tab:blue", lw=1.3)
        ax.plot(p.values, rise, "o", color="tab:blue", ms=2.5)
        ax.axhline(delta, color="0.35", ls="--", lw=1)
        ax.axvline(p.estimate, color="tab:red", lw=1)
        top = max(2.0 * delta, float(np.max(rise)) if rise.size else delta)
        ax.set_ylim(-0.05 * top, 1.1 * min(top, 4.0 * delta))
        scale = result.scales.get(p.name, "lin")
        ax.set_xlabel(p.name if scale == "lin" else f"{scale}({p.name})", fontsize=8)
        opened = [side for side, flag in (("lower", p.lower_open), ("upper", p.upper_open)) if flag]
        if opened:
            ax.set_title("open: " + ", ".join(opened), fontsize=8, color="tab:orange")
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    fig.supylabel("objective - optimum", fontsize=9)
    more = f" (first {len(shown)} of {len(profiles)})" if len(profiles) > len(shown) else ""
    head = title or "profile likelihoods"
    fig.suptitle(f"{head}: {100 * result.confidence:g}% threshold (dashed), intervals shaded{more}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    return _save(fig, path, plt)
