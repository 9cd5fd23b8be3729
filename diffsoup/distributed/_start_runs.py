"""``ds.inference.multistart``: a multistart fit as a campaign, one ``checkpointed_map`` task per start.

The start points are the Latin hypercube of ``fit`` (a function of ``(starts, seed)`` alone), so a
rerun with the same ledger finds the same tasks, keeps the starts already finished and runs the
others; the best start is then the fit (``FitResult.from_starts``: standard errors from the
Gauss-Newton Hessian there). The numerical part (``run_start``: one start, with the replacement of
a start point that fails to solve) lives in ``diffsoup.inference``; this driver is re-exported
there lazily, as ``checkpointed_map`` is.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..inference import AbstractLoweredStudy, FitResult, StartResult
from ..inference.fitting._fit import DEFAULT_METHOD, optimizer_of, run_start
from ..inference.fitting._hierarchical import AnalyticParameters
from ..inference.fitting._optimizers import AbstractOptimizer
from ..inference.fitting._starts import replacement_point, start_points
from ._campaign import checkpointed_map

_LOWERED: dict[str, AbstractLoweredStudy] = {}
# The analytic parameters of the lowered study a process's tasks last used, found once per study
# and choice: [lowered, choice, AnalyticParameters or None].
_ANALYTIC: list = [None, None, None]


def _choice_key(choice: Any) -> Any:
    """A hashable form of a ``hierarchical`` choice (None, a boolean or names)."""
    return tuple(choice) if isinstance(choice, (list, tuple)) else choice


def analytic_once(lowered: AbstractLoweredStudy, choice: bool | Sequence[str] | None) -> AnalyticParameters | None:
    """``AnalyticParameters.find(lowered, choice)`` (None for False or no names), found once per
    process for the last lowered study and choice: the tasks of a campaign, one start each, share
    it (a driver running them in its own process hands over what it found: :func:`remember_analytic`)."""
    key = _choice_key(choice)
    if _ANALYTIC[0] is not lowered or _ANALYTIC[1] != key:
        found = AnalyticParameters.find(lowered, choice) if choice is None or choice else None
        remember_analytic(lowered, choice, found)
    return _ANALYTIC[2]


def remember_analytic(lowered: AbstractLoweredStudy, choice: bool | Sequence[str] | None,
                      found: AnalyticParameters | None) -> None:  # fmt: skip
    """Record ``found`` as what :func:`analytic_once` gives for ``(lowered, choice)``."""
    _ANALYTIC[:] = [lowered, _choice_key(choice), found]


class StartTask:
    """A campaign task: one start of a multistart fit (the item carries its point and index).

    Args:
        lowered: the lowered study, or a picklable zero-argument factory returning one (built
            once per worker process).
        optimizer: the optimizer of each start.
        seed, resample_failed_starts: as for ``fit`` (replacements of a failing start point).
        analytic: the names of the parameters optimized analytically at each evaluation (as the
            driver found them; empty for none).
    """

    def __init__(self, lowered: AbstractLoweredStudy | Callable[[], AbstractLoweredStudy], optimizer: AbstractOptimizer,
                 seed: int, resample_failed_starts: int, analytic: Sequence[str] = ()):  # fmt: skip
        self.lowered, self.optimizer = lowered, optimizer
        self.seed, self.resample = int(seed), int(resample_failed_starts)
        self.analytic = tuple(analytic)

    def _study(self) -> AbstractLoweredStudy:
        if isinstance(self.lowered, AbstractLoweredStudy):
            return self.lowered
        key = repr(self.lowered)
        if key not in _LOWERED:
            _LOWERED.clear()
            _LOWERED[key] = self.lowered()
        return _LOWERED[key]

    def __call__(self, item: dict) -> dict:
        low = self._study()
        index = int(item["index"])
        analytic = analytic_once(low, self.analytic)
        s = run_start(low, self.optimizer, np.asarray(item["x0"], dtype=np.float64),
                      replace=lambda j: replacement_point(low, self.seed, index, j), attempts=self.resample,
                      analytic=analytic)  # fmt: skip
        return {"x0": s.x0, "x": s.x, "objective": s.objective if np.isfinite(s.objective) else None,
                "success": s.success, "message": s.message, "n_evaluations": s.n_evaluations,
                "n_iterations": s.n_iterations, "seconds": s.seconds, "failures": [list(f) for f in s.failures],
                "resampled": s.resampled}  # fmt: skip


def start_of(record: dict) -> StartResult:
    """The :class:`StartResult` of a task's JSON result."""
    objective = float("inf") if record["objective"] is None else float(record["objective"])
    return StartResult(np.asarray(record["x0"], dtype=np.float64), np.asarray(record["x"], dtype=np.float64), objective,
                       bool(record["success"]), str(record["message"]), int(record["n_evaluations"]),
                       int(record["n_iterations"]), float(record["seconds"]), tuple(tuple(f) for f in record["failures"]),
                       int(record.get("resampled", 0)))  # fmt: skip


def multistart(
    lowered: AbstractLoweredStudy | Callable[[], AbstractLoweredStudy],
    *,
    starts: int = 20,
    seed: int = 0,
    method: str | AbstractOptimizer = DEFAULT_METHOD,
    max_nfev: int | None = None,
    resample_failed_starts: int = 10,
    hierarchical: bool | Sequence[str] | None = None,
    ledger_path: str | os.PathLike | None = None,
    resume: bool = True,
    on_conflict: str = "error",
    execution: str = "serial",
    progress: bool = False,
    **campaign_options: Any,
) -> FitResult:
    """A multistart fit whose starts are campaign tasks (resumable from ``ledger_path``).

    Args:
        lowered: the lowered study, or a picklable factory ``() -> lowered study`` for
            ``execution="dask"`` (each worker builds its own once).
        starts, seed, method, max_nfev, resample_failed_starts, hierarchical: as for
            ``ds.inference.fit`` (by default the noise levels that qualify are optimized
            analytically; the parameters found are part of each task, so a rerun with another
            choice is a ledger conflict).
        ledger_path: the JSON ledger; None runs the starts with a throw-away ledger.
        resume, on_conflict, execution, progress, campaign_options: as for ``checkpointed_map``.

    Returns:
        The :class:`~diffsoup.inference.FitResult` of the finished starts.

    Raises:
        ValueError: for a start count below 1.
        RuntimeError: if every start failed.
    """
    if isinstance(starts, bool) or int(starts) < 1:
        raise ValueError(f"multistart: starts={starts!r} must be a positive count.")
    optimizer = optimizer_of(method, max_nfev=max_nfev)
    low = lowered if isinstance(lowered, AbstractLoweredStudy) else lowered()
    points = start_points(low, int(starts), int(seed))
    found = AnalyticParameters.find(low, hierarchical) if hierarchical is None or hierarchical else None
    analytic = list(found.names) if found is not None else []
    remember_analytic(low, analytic, found)  # tasks run in this process on low find nothing again
    # Tasks without analytic parameters carry no such entry, as before there were any: earlier ledgers resume.
    items = [{"task_id": f"start-{i:04d}", "index": i, "x0": [float(v) for v in p], "optimizer": repr(optimizer),
              **({"analytic": analytic} if analytic else {})} for i, p in enumerate(points)]  # fmt: skip
    task = StartTask(lowered, optimizer, seed, resample_failed_starts, analytic)
    kwargs = dict(resume=resume, on_conflict=on_conflict, execution=execution, progress=progress, **campaign_options)
    t0 = time.perf_counter()
    if ledger_path is None:
        with tempfile.TemporaryDirectory(prefix="diffsoup-starts-") as tmp:
            campaign = checkpointed_map(task, items, ledger_path=os.path.join(tmp, "starts.json"), **kwargs)
    else:
        campaign = checkpointed_map(task, items, ledger_path=ledger_path, **kwargs)
    finished = [start_of(campaign.results[item["task_id"]]) for item in items if item["task_id"] in campaign.results]
    if not finished:
        errors = "; ".join(str(r.error) for r in list(campaign.failures.values())[:3])
        raise RuntimeError(f"multistart: every start failed ({errors}).")
    return FitResult.from_starts(low, finished, method=optimizer.name, seconds=time.perf_counter() - t0,
                                 analytic=analytic)  # fmt: skip
