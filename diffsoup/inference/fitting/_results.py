"""The results of a fit: :class:`StartResult` (one start) and :class:`FitResult` (a multistart
fit: the best start, every start, the distinct optima a batched fit found)."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from ..objective._abstract_lowered import AbstractLoweredStudy

# Starts within this of the best objective reached the same optimum (PEtab benchmarks' 1e-3 criterion).
CONVERGED = 1e-3
# An eigenvalue of the Fisher information below this times its largest is zero: J's singular values
# carry the solver's relative error (rtol ~1e-8), so below 1e-6 of the largest (1e-12 in their
# squares) a direction is not determined by the data (Boehm's k_exp_homo: 4e-15 of the largest).
SINGULAR_RTOL = 1e-12
# A parameter with more than this share of its unit vector in those directions is not identifiable
# at the point: its variance is unbounded (the pseudo-inverse would report it as nearly zero).
NULL_SHARE = 1e-6


@dataclasses.dataclass(frozen=True)
class StartResult:
    """One start of a multistart fit.

    Attributes:
        x0, x: start and end point (theta, scaled); ``x0`` is the point the optimizer started from
            (a replacement draw when the drawn point failed to solve).
        objective: the objective at ``x`` (inf if the start failed).
        success: the optimizer's success flag.
        message: its convergence reason (or why the start failed).
        n_evaluations: evaluations of the lowered study (each trial point's value, residuals and
            Jacobian, or Gauss-Newton blocks, as the method asks; the start point's check included).
        n_iterations: optimizer iterations.
        seconds: wall time.
        failures: ``(experiment id, status name, count)`` of failed solves met during the start.
        resampled: how many drawn start points failed to solve and were replaced.
        stalled: the optimizer never moved from ``x0`` and ended far from the best start
            (:meth:`FitResult.from_starts` marks it; ``success`` is then False).
    """

    x0: np.ndarray
    x: np.ndarray
    objective: float
    success: bool
    message: str
    n_evaluations: int
    n_iterations: int
    seconds: float
    failures: tuple
    resampled: int = 0
    stalled: bool = False

    @property
    def finished(self) -> bool:
        """Whether the start ended at a finite objective after moving (not failed, not stalled)."""
        return bool(np.isfinite(self.objective)) and not self.stalled


def _finite_end_points(starts: tuple) -> tuple:
    """``starts`` with no NaN in a stored end point: a non-finite coordinate of ``x`` takes the
    start point's value, and the start is failed (objective ``inf``: its value belongs to no stored
    point), its message saying so."""
    kept = []
    for r in starts:
        x = np.asarray(r.x, dtype=np.float64)
        bad = ~np.isfinite(x)
        if bad.any() and np.shape(r.x0) == x.shape:
            r = dataclasses.replace(r, x=np.where(bad, np.asarray(r.x0, dtype=np.float64), x), success=False,
                                    objective=math.inf,
                                    message=f"{r.message} (non-finite end point: the start point's values kept "
                                            f"in {int(bad.sum())} coordinates)")  # fmt: skip
        kept.append(r)
    return tuple(kept)


def _mark_stalled(starts: tuple, best: float, fixed: np.ndarray) -> tuple:
    """``starts`` with those that never moved (their optimized coordinates, outside ``fixed``,
    equal to the start point's to 1e-12) and ended more than :data:`CONVERGED` above ``best``
    marked failed (``stalled``): an optimizer that could not leave a penalized or flat start
    point has not finished, however finite its objective."""
    marked = []
    for r in starts:
        x0, x = np.asarray(r.x0, dtype=np.float64), np.asarray(r.x, dtype=np.float64)
        keep = (~fixed if fixed.size == x.size else np.ones(x.size, dtype=bool)) if x.shape == x0.shape else None
        still = keep is not None and np.allclose(x[keep], x0[keep], rtol=0.0, atol=1e-12)
        if still and np.isfinite(r.objective) and r.objective > best + CONVERGED and not r.stalled:
            r = dataclasses.replace(r, success=False, stalled=True,
                                    message=f"never moved from its start point (objective {r.objective:.6g}, "
                                            f"the best start's {best:.6g}); was: {r.message}")  # fmt: skip
        marked.append(r)
    return tuple(marked)


@dataclasses.dataclass(frozen=True)
class FitResult:
    """The outcome of :func:`fit`.

    Attributes:
        parameters: best estimates by theta name, linear scale.
        theta: best point, scaled coordinates.
        objective: best objective value.
        standard_errors: by theta name, in the scaled coordinates, from the Gauss-Newton Hessian
            at the best point (``cov = (J^T J)^+`` of the noise-weighted residuals); ``inf`` for a
            parameter that is not identifiable there (:func:`standard_errors`).
        covariance: that ``cov`` (the pseudo-inverse: over the directions the data determine).
        starts: every :class:`StartResult`, in start order.
        best: index of the best start.
        method: the method's name (``"fides"``, ``"trf"``, ``"lbfgsb"``).
        seconds: total wall time; n_evaluations: total objective evaluations.
        theta_names: order of ``theta``.
        window_starts: multiple-shooting experiments' fitted window starts, id -> ``(W-1, n)``
            (linear scale; empty for single shooting).
        analytic: the names of the parameters optimized analytically at each evaluation
            (``fit(hierarchical=...)``; by default the noise levels that qualify), empty if none.
            (``"batched"``: in the polish only.)
        optima: ``"batched"``: the distinct end points (``Optimum``: objective, theta, the starts
            that ended there, whether polished), best first; empty for the other methods.
    """

    parameters: dict
    theta: np.ndarray
    objective: float
    standard_errors: dict
    covariance: np.ndarray
    starts: tuple
    best: int
    method: str
    seconds: float
    n_evaluations: int
    theta_names: tuple
    window_starts: dict = dataclasses.field(default_factory=dict)
    analytic: tuple = ()
    optima: tuple = ()

    @property
    def message(self) -> str:
        """Convergence reason of the best start."""
        return self.starts[self.best].message

    @property
    def waterfall(self) -> np.ndarray:
        """The starts' final objectives, sorted ascending (failed starts, ``inf``, last): the
        multistart waterfall (``ds.plots.plot_waterfall`` draws it)."""
        return np.sort(np.array([s.objective for s in self.starts], dtype=np.float64))

    def converged(self, tolerance: float = CONVERGED, best: float | None = None) -> np.ndarray:
        """Which starts ended within ``tolerance`` of ``best`` (default: this fit's best objective;
        give the best value known, e.g. a published optimum), as a boolean array in start order."""
        reference = self.objective if best is None else float(best)
        values = np.array([s.objective for s in self.starts], dtype=np.float64)
        return np.isfinite(values) & (values <= reference + float(tolerance))

    @classmethod
    def from_starts(cls, lowered: AbstractLoweredStudy, starts, *, method: str, seconds: float,
                    analytic: Sequence[str] = ()) -> "FitResult":  # fmt: skip
        """The result of finished starts (e.g. those of a campaign): the best one, with standard
        errors from the Gauss-Newton Hessian of ``lowered`` at its point (``analytic``: the names
        optimized analytically, recorded as given).

        Raises:
            RuntimeError: if every start failed.
        """
        starts = _finite_end_points(tuple(starts))
        prob = lowered.problem
        finite = [i for i, r in enumerate(starts) if np.isfinite(r.objective)]
        if not finite:
            reasons = "; ".join(r.message for r in starts[:3])
            raise RuntimeError(f"fit: every start failed ({reasons}).")
        best = min(finite, key=lambda i: starts[i].objective)
        analytic_mask = np.isin(np.asarray(prob.theta_names, dtype=object), list(analytic))
        starts = _mark_stalled(starts, starts[best].objective, analytic_mask)
        theta = np.asarray(starts[best].x, dtype=np.float64)
        _, _, H = lowered.gauss_newton(theta)
        cov, se = standard_errors(H / (2.0 * lowered.scale))
        return cls(
            parameters=prob.parameter_values(theta),
            theta=theta,
            objective=starts[best].objective,
            standard_errors=dict(zip(prob.theta_names, map(float, se))),
            covariance=cov,
            starts=starts,
            best=best,
            method=method,
            seconds=seconds,
            n_evaluations=sum(r.n_evaluations for r in starts),
            theta_names=prob.theta_names,
            window_starts=prob.window_values(theta) if hasattr(prob, "window_values") else {},
            analytic=tuple(analytic),
        )


def standard_errors(information: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(covariance, standard errors)`` from a Fisher information matrix ``J^T J``.

    The covariance is the pseudo-inverse over the eigenvectors whose eigenvalue is above
    :data:`SINGULAR_RTOL` times the largest. Along the others the data determine nothing, and the
    pseudo-inverse's zero there would read as a precise estimate; so a parameter whose unit
    vector has more than :data:`NULL_SHARE` of its square in them gets an ``inf`` standard error
    (not identifiable at this point: a profile shows how far it can move).
    """
    F = np.asarray(information, dtype=np.float64)
    w, V = np.linalg.eigh(0.5 * (F + F.T))
    largest = float(np.max(np.abs(w))) if w.size else 0.0
    kept = w > SINGULAR_RTOL * largest  # all False when every eigenvalue is zero
    cov = (V[:, kept] / w[kept]) @ V[:, kept].T
    se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    null_share = np.sum(V[:, ~kept] ** 2, axis=1)
    return cov, np.where(null_share > NULL_SHARE, np.inf, se)
