"""One start of a fit: check that its point solves (replacing a drawn point that does not), then
run the optimizer from it (:func:`run_start`, shared by ``fit``, the batched fit's polish, the
multistart tasks and the profiles)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..objective._abstract_lowered import AbstractLoweredStudy
from ._hierarchical import AnalyticParameters
from ._optimizers import AbstractOptimizer, StartObjective
from ._results import StartResult


def run_start(lowered: AbstractLoweredStudy, optimizer: AbstractOptimizer, x0: Any, *, fixed: dict | None = None,
              replace=None, attempts: int = 0, on_evaluation=None,
              analytic: AnalyticParameters | None = None) -> StartResult:  # fmt: skip
    """One start: check that the start point solves (replacing it by ``replace(attempt)`` up to
    ``attempts`` times if not), then run ``optimizer`` from it.

    Args:
        lowered: the lowered study.
        optimizer: an :class:`AbstractOptimizer`.
        x0: the start point, full theta (scaled).
        fixed: theta index -> value of coordinates held fixed (profiles); the others are optimized.
        replace: ``attempt -> theta`` giving a replacement start point.
        attempts: most replacements.
        on_evaluation: called after each evaluation.
        analytic: parameters optimized analytically at each evaluation (``fit(hierarchical=...)``).

    Returns:
        The :class:`StartResult` (``x0``/``x`` full theta).
    """
    start = time.perf_counter()
    objective = StartObjective(lowered, fixed, on_evaluation, analytic)
    theta0 = np.clip(np.asarray(x0, dtype=np.float64), lowered.lower, lowered.upper)
    # The start point is checked by the optimizer's own evaluation: no program compiled for the
    # check alone, and the optimizer's first evaluation, at the same point, is the remembered one.
    check = optimizer.evaluation if objective.free.size else "value"
    f0 = objective.value_by(check, theta0[objective.free])
    resampled = 0
    while not np.isfinite(f0) and resampled < attempts:
        resampled += 1
        theta0 = np.asarray(replace(resampled), dtype=np.float64)
        f0 = objective.value_by(check, theta0[objective.free])
    if not np.isfinite(f0):
        return StartResult(theta0, theta0, float("inf"), False, "a solve failed at the start point",
                           objective.n_evaluations, 0, time.perf_counter() - start, objective.failure_summary(),
                           resampled)  # fmt: skip
    if objective.free.size == 0:  # a profile whose other parameters are all optimized analytically
        theta, note = _finite_theta(objective, theta0[objective.free], theta0)
        return StartResult(theta0, theta, float(f0), not note, "the other parameters were optimized analytically"
                           + note, objective.n_evaluations, 0, time.perf_counter() - start,
                           objective.failure_summary(), resampled)  # fmt: skip
    out = optimizer.minimize(objective, theta0[objective.free], f0)
    if not out.value <= f0:  # an optimizer may end above its start (L-BFGS-B on a penalized point), or at
        out = out._replace(x=theta0[objective.free], value=f0)  # NaN: keep the start, whose value is finite
    theta, note = _finite_theta(objective, out.x, theta0)
    return StartResult(theta0, theta, float(out.value), out.success and not note, out.message + note,
                       objective.n_evaluations, out.n_iterations, time.perf_counter() - start,
                       objective.failure_summary(), resampled)  # fmt: skip


def _finite_theta(objective: StartObjective, x: np.ndarray, theta0: np.ndarray) -> tuple[np.ndarray, str]:
    """The full theta of the end point ``x`` and ``""``; where the analytic parameters could not be
    found there (NaN: a solve failed on the way), those coordinates keep ``theta0``'s finite values
    and the note says so, so that no stored end point holds a NaN."""
    theta = np.asarray(objective.theta(x), dtype=np.float64)
    bad = ~np.isfinite(theta)
    if not bad.any():
        return theta, ""
    theta = np.where(bad, theta0, theta)
    names = getattr(objective.lowered, "theta_names", ())
    which = ", ".join(str(names[i]) for i in np.flatnonzero(bad)) if len(names) == theta.size else f"{bad.sum()}"
    return theta, f" (the analytic values of {which} were not found at the end point: the start point's are kept)"
