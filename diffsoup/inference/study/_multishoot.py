"""``ds.inference.Multishoot``: multiple shooting, an experiment's time span cut into windows.

Each window ``w >= 1`` starts from a state of its own, ``s_w``, which the fit estimates beside the
model parameters; window 0 starts from the experiment's ``y0``. A window is solved from its start
time to its end time (the next window's start), and measurements in ``(b_w, b_{w+1}]`` (window 0:
``[b_0, b_1]``) are predicted by it. Continuity enters as ``n`` extra residuals per interior
boundary, ``continuity_weight * (y_w(b_{w+1}) - s_{w+1}) / state_scale``, so at the optimum (where
those vanish, to the weight's pull) the trajectory is continuous. Windows cut the long-time
dependence on the parameters that makes single shooting of oscillators stall in local minima
(Bock 1981; Peifer & Timmer 2007, IET Syst. Biol. 1:78).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import numpy as np

INITS = ("auto", "data", "simulate")


@dataclasses.dataclass(frozen=True)
class Multishoot:
    """Multiple shooting of an experiment.

    Args:
        windows: the number of windows of equal length between ``t0`` and the last measurement
            time (at least 2), or None when ``boundaries`` are given.
        boundaries: the interior window start times (strictly increasing, strictly between the
            experiment's ``t0`` and its last measurement time), or None when ``windows`` is given.
        continuity_weight: the weight of the continuity residuals (positive); larger values hold
            the windows together more tightly. The data residuals are divided by the noise
            sigma, so a weight of the order of ``1/sigma`` (in ``state_scale`` units) or more makes
            a mismatch cost as much as a misfit of the data; a weight far below that leaves the
            optimum measurably discontinuous.
        state_scale: divides each state's continuity mismatch (a positive scalar or one value per
            state), so that states of different magnitude weigh alike.
        init: how window starts are first guessed: ``"simulate"`` (solve at the given parameter
            values), ``"data"`` (interpolate the data; needs every state observed, i.e.
            ``observables=None``), or ``"auto"`` (data for the states that are observed, a
            solve for the rest).
        lower, upper: bounds of every window start (linear scale); infinite by default.

    Raises:
        ValueError: naming the field, for both or neither of ``windows``/``boundaries``, fewer
            than 2 windows, unordered boundaries, a non-positive weight or scale, an unknown
            ``init``, or ``lower >= upper``.
    """

    windows: int | None = None
    boundaries: Any = None
    continuity_weight: float = 10.0
    state_scale: Any = 1.0
    init: str = "auto"
    lower: float = -math.inf
    upper: float = math.inf

    def __post_init__(self):
        if (self.windows is None) == (self.boundaries is None):
            raise ValueError(
                "Multishoot: give exactly one of windows= (a count) or boundaries= (interior start times)."
            )
        if self.windows is not None:
            if isinstance(self.windows, bool) or not isinstance(self.windows, (int, np.integer)) or self.windows < 2:
                raise ValueError(
                    f"Multishoot: windows={self.windows!r} must be an integer >= 2 (1 window is single shooting)."
                )
            object.__setattr__(self, "windows", int(self.windows))
        else:
            b = np.asarray(self.boundaries, dtype=np.float64).reshape(-1)
            if b.size == 0 or not np.all(np.isfinite(b)) or np.any(np.diff(b) <= 0):
                raise ValueError(
                    f"Multishoot: boundaries={self.boundaries!r} must be a non-empty, finite, strictly increasing "
                    "sequence of interior window start times."
                )
            object.__setattr__(self, "boundaries", tuple(float(x) for x in b))
        w = float(self.continuity_weight)
        if not (w > 0 and math.isfinite(w)):
            raise ValueError(f"Multishoot: continuity_weight={self.continuity_weight!r} must be positive and finite.")
        object.__setattr__(self, "continuity_weight", w)
        s = np.asarray(self.state_scale, dtype=np.float64)
        if s.ndim > 1 or not np.all(np.isfinite(s)) or np.any(s <= 0):
            raise ValueError(
                f"Multishoot: state_scale={self.state_scale!r} must be positive: a scalar or one value per state."
            )
        object.__setattr__(self, "state_scale", float(s) if s.ndim == 0 else tuple(float(x) for x in s))
        if self.init not in INITS:
            raise ValueError(f"Multishoot: init={self.init!r} must be one of {INITS}.")
        if not float(self.lower) < float(self.upper):
            raise ValueError(f"Multishoot: lower={self.lower!r} must be below upper={self.upper!r}.")

    @property
    def n_windows(self) -> int:
        """The number of windows."""
        return self.windows if self.windows is not None else len(self.boundaries) + 1

    def apply(self, experiment):
        """The experiment with this trajectory (a copy; the original is unchanged).

        Raises:
            ValueError: if the windows do not fit the experiment's time span.
        """
        return experiment.with_trajectory(self)

    def edges(self, experiment) -> np.ndarray:
        """All window edges ``(b_0 = t0, ..., b_W = last measurement time)`` of ``experiment``.

        Raises:
            ValueError: naming the experiment, for boundaries outside ``(t0, t_last)`` or a window
                with no time span.
        """
        t0, t1 = float(experiment.t0), float(experiment.times[-1])
        where = f"Experiment {experiment.id!r}: Multishoot"
        if not t1 > t0:
            raise ValueError(f"{where}: the measurements span no time after t0={t0}; multiple shooting needs a span.")
        if self.windows is not None:
            return np.linspace(t0, t1, self.windows + 1)
        b = np.asarray(self.boundaries)
        if b[0] <= t0 or b[-1] >= t1:
            raise ValueError(
                f"{where}: boundaries {list(self.boundaries)} must lie strictly between t0={t0} and the last "
                f"measurement time {t1}."
            )
        return np.concatenate([[t0], b, [t1]])

    def scales(self, n_states: int) -> np.ndarray:
        """Per-state divisor of the continuity residuals.

        Raises:
            ValueError: if ``state_scale`` has the wrong length.
        """
        s = np.asarray(self.state_scale, dtype=np.float64)
        if s.ndim == 1 and s.shape != (n_states,):
            raise ValueError(f"Multishoot: state_scale has {s.size} values; the model has {n_states} states.")
        return np.broadcast_to(s, (n_states,)).copy()


def window_layout(experiment, trajectory: Multishoot):
    """Per measurement: its window and position; per window: its output times (last = its end).

    Returns:
        ``(edges (W+1,), window_of (m,), position (m,), window_times (W, M+1))`` where ``M`` is the
        most measurements in a window; each row of ``window_times`` is padded with the window's
        end time, which is always its last entry.
    """
    edges = trajectory.edges(experiment)
    W = edges.size - 1
    times = experiment.times
    # window w holds (b_w, b_{w+1}]; window 0 also holds b_0.
    window_of = np.clip(np.searchsorted(edges, times, side="left") - 1, 0, W - 1)
    counts = np.bincount(window_of, minlength=W)
    M = int(counts.max())
    wt = np.repeat(edges[1:, None], M + 1, axis=1)
    position = np.zeros(times.size, dtype=np.int64)
    for w in range(W):
        idx = np.nonzero(window_of == w)[0]
        wt[w, : idx.size] = times[idx]
        position[idx] = np.arange(idx.size)
    return edges, window_of.astype(np.int64), position, wt


def trajectory_signature(trajectory) -> tuple:
    """What makes experiments share a vmapped group: the number of windows (None: single shooting)."""
    return (None,) if trajectory is None else (trajectory.n_windows,)


def with_trajectory(experiment, trajectory):
    """A copy of ``experiment`` carrying ``trajectory`` (None: single shooting)."""
    if trajectory is not None and not isinstance(trajectory, Multishoot):
        raise TypeError(
            f"Experiment {experiment.id!r}: trajectory must be a ds.inference.Multishoot or None (single shooting), "
            f"not {type(trajectory).__name__}."
        )
    if trajectory is not None:
        unsupported = [name for name, used in (
            ("+inf (steady-state) times", bool(np.any(np.isinf(experiment.times)))),
            ("preequilibration", getattr(experiment, "preequilibration", None) is not None),
            ("resets", bool(getattr(experiment, "resets", ()))),
            ("discontinuities", callable(getattr(experiment, "discontinuities", ())) or bool(
                getattr(experiment, "discontinuities", ()))),
        ) if used]  # fmt: skip
        if unsupported:
            raise ValueError(
                f"Experiment {experiment.id!r}: multiple shooting (Multishoot) does not support {', '.join(unsupported)} "
                "yet; solve this experiment with single shooting (trajectory=None)."
            )
        trajectory.edges(experiment)
    out = copy.copy(experiment)
    out.trajectory = trajectory
    return out
