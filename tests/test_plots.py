"""The figures of ``ds.plots``: readable when every start agrees, statuses by name."""

from __future__ import annotations

import types

import numpy as np
import pytest

from diffsoup.plots import _figures


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plot functions draw, kept instead of saved."""
    figures = []

    def keep(fig, path, plt):
        fig.canvas.draw()
        figures.append(fig)
        return path

    monkeypatch.setattr(_figures, "_save", keep)
    yield figures
    import matplotlib.pyplot as plt

    for fig in figures:
        plt.close(fig)


def visible_tick_labels(ax):
    low, high = sorted(ax.get_ylim())
    return [t.get_text() for t, v in zip(ax.get_yticklabels(), ax.get_yticks()) if low <= v <= high]


def test_waterfall_is_readable_when_every_start_agrees(drawn):
    # Four starts at the same optimum, to 1e-9: a log axis of objective - best + 1 labels every tick 10^0.
    _figures.plot_waterfall([-2291.7912, -2291.7912 + 1e-9, -2291.7912 + 3e-10, -2291.7912], "w.png")
    ax = drawn[-1].axes[0]
    labels = visible_tick_labels(ax)
    assert len(labels) >= 3 and len(set(labels)) == len(labels), labels
    assert ax.get_yscale() == "linear"
    assert "-2291.7912" in ax.get_ylabel()  # the best objective itself is shown once
    points = ax.lines[1].get_ydata()
    assert np.all(np.abs(points) < 1e-8)  # objective - best, not shifted by an offset


def test_waterfall_spanning_decades_is_logarithmic(drawn):
    _figures.plot_waterfall([10.0, 10.01, 60.0, 5000.0, np.inf], "w.png", title="t")
    ax = drawn[-1].axes[0]
    assert ax.get_yscale() == "log"
    labels = visible_tick_labels(ax)
    assert len(set(labels)) == len(labels) >= 3, labels
    assert "1 failed" in ax.get_title()


def test_fits_panels_name_the_status_of_a_failed_solve(drawn):
    exps = [types.SimpleNamespace(id=f"e{i}", times=np.array([1.0, 2.0]), data=np.array([[1.0], [2.0]]))
            for i in range(2)]  # fmt: skip
    predictions = {"e0": {"times": np.array([1.0, 2.0]), "observables": np.array([[1.0], [2.0]]), "status": 0},
                   "e1": {"times": np.array([1.0, 2.0]), "observables": np.full((2, 1), np.nan), "status": 1}}  # fmt: skip
    _figures.plot_fits(types.SimpleNamespace(experiments=exps), predictions, "f.png")
    titles = [ax.get_title() for ax in drawn[-1].axes]
    assert titles[0] == "e0" and titles[1] == "e1 (solve failed: MAX_STEPS)"
