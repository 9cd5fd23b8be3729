"""The figures of :mod:`diffsoup.plots` (matplotlib's Agg backend: no screen needed)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..integrate import Status


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)  # off-screen; keeps a backend the user already chose
    import matplotlib.pyplot as plt

    return plt


def plot_fits(study: Any, predictions: Mapping[str, dict], path: Any, *, observables: Mapping | None = None,
              max_panels: int = 16, title: str | None = None) -> Path:  # fmt: skip
    """Each experiment's observables (lines: the model; dots: the data), one panel per experiment.

    Args:
        study: the ``ds.Study`` (its experiments' data).
        predictions: ``InferenceProblem.predict(theta, points=...)``: id -> times, observables,
            status and, when computed, a smooth ``curve``.
        path: the PNG file.
        observables: experiment id -> observable names (``StudyFile.observables``) for the legend.
        max_panels: most experiments drawn (the first ones, in study order); the title says so.
        title: the figure's title.

    Returns:
        The PNG's path.
    """
    plt = _pyplot()
    exps = list(study.experiments)
    shown = exps[:max_panels]
    cols = min(4, len(shown))
    rows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.6 * rows), squeeze=False, sharex=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, e in zip(axes.flat, shown):
        p = predictions[e.id]
        names = list((observables or {}).get(e.id, [])) or [f"y{j}" for j in range(e.data.shape[1])]
        for j in range(e.data.shape[1]):
            c = colors[j % len(colors)]
            if "curve" in p:
                ax.plot(p["curve_times"], p["curve"][:, j], color=c, lw=1.4, label=names[j])
            else:
                ax.plot(p["times"], p["observables"][:, j], color=c, lw=1.4, label=names[j])
            ax.plot(e.times, e.data[:, j], "o", color=c, ms=3.5, mfc="white")
        status = "" if int(p["status"]) == 0 else f" (solve failed: {_status_name(p['status'])})"
        ax.set_title(f"{e.id}{status}", fontsize=9, color="black" if not status else "red")
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", fontsize=8, frameon=False)
    more = f" (first {len(shown)} of {len(exps)} experiments)" if len(exps) > len(shown) else ""
    fig.suptitle((title or "model (lines) against data (dots)") + more, fontsize=10)
    fig.supxlabel("time", fontsize=9)
    fig.tight_layout(rect=(0, 0, 0.93, 0.97))
    return _save(fig, path, plt)


def _status_name(code: Any) -> str:
    try:
        return Status(int(code)).name
    except ValueError:
        return f"status {int(code)}"


# Starts within this of the best objective reached the same optimum (to the objective's noise).
SAME_OPTIMUM = 0.1


def plot_waterfall(objectives: Sequence[float], path: Any, *, title: str | None = None) -> Path:
    """The multistart waterfall: the starts' final objectives, sorted, relative to the best.

    Starts within 0.1 of the best (the same optimum, to the objective's noise) are drawn filled;
    failed starts (infinite objective) are counted in the title. The axis is logarithmic in
    ``objective - best + 1`` when the objectives span a decade or more, else linear in
    ``objective - best`` (when every start agrees a log axis would read 10^0 at every tick).

    Returns:
        The PNG's path.
    """
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    plt = _pyplot()
    values = np.asarray(objectives, dtype=np.float64)
    finite = np.sort(values[np.isfinite(values)])
    failed = int(values.size - finite.size)
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ylabel = "objective - best"
    if finite.size:
        gap = finite - finite[0]
        best = gap <= SAME_OPTIMUM
        logarithmic = gap[-1] >= 9.0  # objective - best + 1 spans at least a decade
        y = gap + 1.0 if logarithmic else gap
        x = np.arange(1, finite.size + 1)
        ax.plot(x, y, color="0.6", lw=1)
        ax.plot(x[best], y[best], "o", color="tab:blue", label=f"{int(best.sum())} at the best optimum")
        if not best.all():
            ax.plot(x[~best], y[~best], "o", color="tab:blue", mfc="white", label="other optima")
        if logarithmic:
            ax.set_yscale("log")
            ylabel = "objective - best + 1"
        else:
            formatter = ScalarFormatter(useOffset=False)
            formatter.set_powerlimits((-3, 4))
            ax.yaxis.set_major_formatter(formatter)
            top = max(float(gap[-1]), SAME_OPTIMUM)  # starts that agree sit on 0, on a readable scale
            ax.set_ylim(-0.1 * top, 1.15 * top)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(0.5, x.size + 0.5)
        ax.legend(fontsize=8, frameon=False)
        ylabel += f"\n(best = {finite[0]:.8g})"
    ax.set_xlabel("start, sorted by final objective")
    ax.set_ylabel(ylabel)
    extra = f"; {failed} failed" if failed else ""
    ax.set_title((title or "multistart waterfall") + f" ({values.size} starts{extra})", fontsize=10)
    fig.tight_layout()
    return _save(fig, path, plt)


def plot_estimates(names: Sequence[str], estimates: Sequence[float], standard_errors: Sequence[float], path: Any, *,
                   lower: Sequence[float] | None = None, upper: Sequence[float] | None = None,
                   truth: Sequence[float] | None = None, scale_label: str = "scaled value",
                   title: str | None = None) -> Path:  # fmt: skip
    """Parameter estimates with 95% intervals (± 1.96 standard errors), bounds shaded, and the
    true values when known; all in the optimizer's (scaled) coordinates.

    Returns:
        The PNG's path.
    """
    plt = _pyplot()
    names = list(names)
    # no bar for a withheld (None) or unbounded (inf) standard error
    est = np.asarray(estimates, float)
    se = np.asarray([v if v is not None and np.isfinite(v) else np.nan for v in standard_errors], float)
    y = np.arange(len(names))[::-1]
    fig, ax = plt.subplots(figsize=(6.0, 0.45 * len(names) + 1.4))
    if lower is not None and upper is not None:
        for yi, lo, hi in zip(y, lower, upper):
            if np.isfinite(lo) and np.isfinite(hi):
                ax.plot([lo, hi], [yi, yi], color="0.88", lw=9, solid_capstyle="butt", zorder=0)
    ax.errorbar(est, y, xerr=1.96 * se, fmt="o", color="tab:blue", capsize=3, label="estimate ± 1.96 SE")
    if truth is not None:
        ax.plot(np.asarray(truth, float), y, "x", color="tab:red", ms=8, label="true value")
    ax.set_yticks(y, names, fontsize=8)
    ax.set_xlabel(scale_label)
    ax.legend(fontsize=8, frameon=False, loc="best")
    ax.set_title(title or "parameter estimates (grey: bounds)", fontsize=10)
    fig.tight_layout()
    return _save(fig, path, plt)


def _save(fig: Any, path: Any, plt: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
