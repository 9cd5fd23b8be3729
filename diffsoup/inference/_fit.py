"""``ds.inference.fit``: multistart fits with scipy's optimizers on a lowered study.

``method="trf"``: ``scipy.optimize.least_squares`` (trust region reflective, with the bounds) on the
residuals and their Jacobian by forward sensitivities (one ``residuals_and_jacobian`` evaluation per
trial point, the Jacobian kept for the ``jac`` call at the same point).
``method="lbfgsb"``: ``scipy.optimize.minimize(method="L-BFGS-B")`` on the value and its exact
gradient. Starts are Latin hypercube samples within the bounds (``scipy.stats.qmc``), in the
parameters' scaled coordinates.

A failed solve during a fit (an experiment whose ``ds.simulate`` status is not success) is recorded
(experiment id, status) in the start's ``failures`` and the optimizer is told the point is bad in a
form it accepts: ``least_squares`` rejects non-finite residuals, so each residual of a failed
experiment is replaced by ``failure_residual`` (1e4 by default: a cost far above any the fit has
seen when residuals are noise-scaled) and its Jacobian rows by zeros, so that the trust region step
to that point is rejected and the radius shrinks; L-BFGS-B gets a large finite value
(``1e10 (1 + |f0|)``) and a zero gradient, which its line search treats as no sufficient decrease
and backtracks from. A start whose own point fails is recorded as failed and not optimized.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from ._abstract_lowered import AbstractLoweredStudy
from ._lower import lower
from ._problem import InferenceProblem
from ._study import Study

METHODS = ("trf", "lbfgsb")


@dataclasses.dataclass(frozen=True)
class StartResult:
    """One start of a multistart fit.

    Attributes:
        x0, x: start and end point (theta, scaled).
        objective: the objective at ``x`` (inf if the start failed).
        success: the optimizer's success flag.
        message: its convergence reason (or why the start failed).
        n_evaluations: objective evaluations (residuals+Jacobian for ``"trf"``, value+gradient for ``"lbfgsb"``).
        n_iterations: optimizer iterations (Jacobian evaluations for ``"trf"``).
        seconds: wall time.
        failures: ``(experiment id, status name, count)`` of failed solves met during the start.
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


@dataclasses.dataclass(frozen=True)
class FitResult:
    """The outcome of :func:`fit`.

    Attributes:
        parameters: best estimates by theta name, linear scale.
        theta: best point, scaled coordinates.
        objective: best objective value.
        standard_errors: by theta name, in the scaled coordinates, from the Gauss-Newton Hessian
            at the best point (``cov = (J^T J)^+`` of the noise-weighted residuals).
        covariance: that ``cov``.
        starts: every :class:`StartResult`, in start order.
        best: index of the best start.
        method: ``"trf"`` or ``"lbfgsb"``.
        seconds: total wall time; n_evaluations: total objective evaluations.
        theta_names: order of ``theta``.
        window_starts: multiple-shooting experiments' fitted window starts, id -> ``(W-1, n)``
            (linear scale; empty for single shooting).
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

    @property
    def message(self) -> str:
        """Convergence reason of the best start."""
        return self.starts[self.best].message

    @classmethod
    def from_starts(cls, lowered: AbstractLoweredStudy, starts, *, method: str, seconds: float) -> "FitResult":
        """The result of finished starts (e.g. those of a campaign): the best one, with standard
        errors from the Gauss-Newton Hessian of ``lowered`` at its point.

        Raises:
            RuntimeError: if every start failed.
        """
        starts = tuple(starts)
        prob = lowered.problem
        finite = [i for i, r in enumerate(starts) if np.isfinite(r.objective)]
        if not finite:
            reasons = "; ".join(r.message for r in starts[:3])
            raise RuntimeError(f"fit: every start failed ({reasons}).")
        best = min(finite, key=lambda i: starts[i].objective)
        theta = np.asarray(starts[best].x, dtype=np.float64)
        _, _, H = lowered.gauss_newton(theta)
        cov = np.linalg.pinv(H / (2.0 * lowered.scale), hermitian=True)
        se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
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
        )


def latin_hypercube(lower, upper, n: int, seed: int) -> np.ndarray:
    """``n`` Latin hypercube points within ``[lower, upper]`` (scipy.stats.qmc)."""
    from scipy.stats import qmc

    lower, upper = np.asarray(lower, float), np.asarray(upper, float)
    sample = qmc.LatinHypercube(d=lower.size, seed=np.random.default_rng(seed)).random(n)
    return lower + sample * (upper - lower)


def start_points(lowered: AbstractLoweredStudy, n: int, seed: int) -> np.ndarray:
    """``n`` start points ``(n, n_theta)`` (scaled) of a multistart: Latin hypercube samples of the
    coordinates with finite bounds, the prepared values (``lowered.nominal``) for the others
    (window starts)."""
    lo, hi = np.asarray(lowered.lower, float), np.asarray(lowered.upper, float)
    points = np.repeat(np.asarray(lowered.nominal, float)[None], n, axis=0)
    sampled = np.isfinite(lo) & np.isfinite(hi)
    if n and np.any(sampled):
        points[:, sampled] = latin_hypercube(lo[sampled], hi[sampled], n, seed)
    return points


def fit(
    target: AbstractLoweredStudy | InferenceProblem | Study,
    *,
    method: str = "trf",
    starts: int | Any = 4,
    seed: int = 0,
    x0: Any = None,
    max_nfev: int | None = None,
    ftol: float = 1e-8,
    xtol: float = 1e-8,
    gtol: float = 1e-8,
    failure_residual: float = 1e4,
    progress: bool = False,
) -> FitResult:
    """Fit the estimated parameters of a study: multistart, scipy's TRF or L-BFGS-B.

    Args:
        target: a lowered study (``ds.lower``'s, or the one ``ds.distributed.run`` yields: any
            ``AbstractLoweredStudy``), or an inference problem / study (lowered with defaults).
        method: ``"trf"`` (least squares on residuals and forward-sensitivity Jacobians, bounded)
            or ``"lbfgsb"`` (value and gradient, bounded).
        starts: number of Latin hypercube starts within the bounds, or an array ``(s, n_theta)``
            of start points (scaled). Window starts of multiple-shooting experiments (and any
            other coordinate without finite bounds) are not sampled: every start takes their
            prepared values (``low.nominal``); an array ``(s, n_parameters)`` is completed with them.
        seed: seed of the Latin hypercube.
        x0: an extra first start: theta (scaled; the parameters alone are completed with the prepared
            window starts) or a mapping of linear values by name.
        max_nfev: most evaluations per start (None: scipy's default).
        ftol, xtol, gtol: scipy's tolerances (``ftol``/``gtol`` map to L-BFGS-B's ``ftol``/``pgtol``).
        failure_residual: residual value put in place of a failed experiment's residuals (TRF).
        progress: show a progress bar over the starts on stderr (evaluations, best objective).

    Returns:
        A :class:`FitResult`.

    Raises:
        ValueError: for an unknown method, starts of the wrong shape or outside the bounds.
        RuntimeError: if every start failed.
    """
    from scipy.optimize import least_squares, minimize

    if method not in METHODS:
        raise ValueError(f"fit: method={method!r} must be one of {METHODS}.")
    low = target if isinstance(target, AbstractLoweredStudy) else lower(target)
    prob = low.problem
    k = prob.n_theta
    lo, hi = np.asarray(low.lower, float), np.asarray(low.upper, float)
    n_par = getattr(prob, "n_parameters", k)
    nominal = np.asarray(low.nominal, float)

    def complete(x):
        return np.concatenate([x, np.broadcast_to(nominal[n_par:], x.shape[:-1] + (k - n_par,))], axis=-1)

    if isinstance(starts, (int, np.integer)) and not isinstance(starts, bool):
        if starts < 0 or (starts == 0 and x0 is None):
            raise ValueError(f"fit: starts={starts!r} must be a positive count (or give x0).")
        points = start_points(low, int(starts), seed)
    else:
        points = np.atleast_2d(np.asarray(starts, dtype=np.float64))
        if points.shape[1:] == (n_par,) and n_par < k:
            points = complete(points)
        if points.shape[1:] != (k,):
            raise ValueError(f"fit: starts has shape {points.shape}; expected (s, {k}) for {list(prob.theta_names)}.")
    if x0 is not None:
        first = prob.theta_of(x0) if isinstance(x0, dict) else np.asarray(x0, dtype=np.float64)
        if first.shape == (n_par,) and n_par < k:
            first = complete(first)
        if first.shape != (k,):
            raise ValueError(f"fit: x0 has shape {first.shape}; expected ({k},) or ({n_par},) (the parameters).")
        points = np.vstack([first[None], points])
    if np.any(points < lo) or np.any(points > hi):
        raise ValueError("fit: a start point lies outside the bounds [lower, upper] (scaled coordinates).")
    t_all = time.perf_counter()
    bar = _Progress(len(points), method, progress)
    try:
        results = []
        for p in points:
            run = _fit_trf if method == "trf" else _fit_lbfgsb
            results.append(run(low, p, lo, hi, max_nfev, ftol, xtol, gtol, failure_residual, least_squares, minimize,
                               bar.evaluated))  # fmt: skip
            bar.finished(results[-1])
    finally:
        bar.close()
    return FitResult.from_starts(low, results, method=method, seconds=time.perf_counter() - t_all)


class _Progress:
    """A progress bar over the starts of a fit (tqdm, on stderr), its postfix the evaluations and
    the best objective so far."""

    def __init__(self, total: int, method: str, enabled: bool):
        self.bar = None
        self.evaluations, self.best = 0, float("inf")
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=f"fit ({method})", unit="start", dynamic_ncols=True)

    def evaluated(self) -> None:
        self.evaluations += 1
        if self.bar is not None and self.evaluations % 5 == 0:
            self.bar.set_postfix(evaluations=self.evaluations, best=f"{self.best:.6g}", refresh=True)

    def finished(self, result: "StartResult") -> None:
        if np.isfinite(result.objective):
            self.best = min(self.best, result.objective)
        if self.bar is not None:
            self.bar.set_postfix(evaluations=self.evaluations, best=f"{self.best:.6g}", refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _Failures:
    def __init__(self):
        self.counts: dict = {}

    def add(self, failures: dict):
        for eid, status in failures.items():
            key = (eid, status.name)
            self.counts[key] = self.counts.get(key, 0) + 1

    def summary(self) -> tuple:
        return tuple((eid, name, n) for (eid, name), n in self.counts.items())


def _fit_trf(low, x0, lo, hi, max_nfev, ftol, xtol, gtol, failure_residual, least_squares, _minimize, on_eval):
    start = time.perf_counter()
    fails = _Failures()
    cache: dict = {}
    n_eval = [0]

    def evaluate(x):
        key = np.asarray(x, dtype=np.float64).tobytes()
        if key not in cache:
            r, J = low.residuals_and_jacobian(x)
            n_eval[0] += 1
            on_eval()
            failed = dict(low.last_failures)
            if failed:
                fails.add(failed)
                for eid in failed:
                    sl = low.residual_slices[eid]
                    r[sl] = failure_residual
                    J[sl] = 0.0
            bad = ~np.isfinite(r)
            if np.any(bad):  # defensive: nothing non-finite reaches scipy
                r[bad] = failure_residual
                J[bad] = 0.0
            cache.clear()
            cache[key] = (r, J, bool(failed))
        return cache[key]

    x0 = np.clip(x0, lo, hi)
    if evaluate(x0)[2]:
        return StartResult(x0, x0, float("inf"), False, "a solve failed at the start point", n_eval[0], 0,
                           time.perf_counter() - start, fails.summary())  # fmt: skip
    res = least_squares(lambda x: evaluate(x)[0], x0, jac=lambda x: evaluate(x)[1], bounds=(lo, hi), method="trf",
                        ftol=ftol, xtol=xtol, gtol=gtol, max_nfev=max_nfev, x_scale=1.0)  # fmt: skip
    objective = low.scale * 2.0 * float(res.cost) + low.offset
    return StartResult(x0, np.asarray(res.x), objective, bool(res.success), str(res.message), n_eval[0],
                       int(res.njev or 0), time.perf_counter() - start, fails.summary())  # fmt: skip


def _fit_lbfgsb(low, x0, lo, hi, max_nfev, ftol, _xtol, gtol, _failure_residual, _least_squares, minimize, on_eval):
    start = time.perf_counter()
    fails = _Failures()
    n_eval = [0]
    penalty = [None]

    def fg(x):
        v, g = low.value_and_grad(x)
        n_eval[0] += 1
        on_eval()
        failed = dict(low.last_failures)
        if failed or not (np.isfinite(v) and np.all(np.isfinite(g))):
            fails.add(failed)
            return penalty[0] if penalty[0] is not None else float("inf"), np.zeros_like(x)
        return v, g

    x0 = np.clip(x0, lo, hi)
    f0, _ = fg(x0)
    if not np.isfinite(f0):
        return StartResult(x0, x0, float("inf"), False, "a solve failed at the start point", n_eval[0], 0,
                           time.perf_counter() - start, fails.summary())  # fmt: skip
    penalty[0] = 1e10 * (1.0 + abs(f0))
    options = {"ftol": ftol, "gtol": gtol}
    if max_nfev is not None:
        options["maxfun"] = int(max_nfev)
    res = minimize(fg, x0, jac=True, method="L-BFGS-B", bounds=list(zip(lo, hi)), options=options)
    return StartResult(x0, np.asarray(res.x), float(res.fun), bool(res.success), str(res.message), n_eval[0],
                       int(res.nit), time.perf_counter() - start, fails.summary())  # fmt: skip
