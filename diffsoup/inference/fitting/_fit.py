"""``ds.inference.fit``: multistart fits of a lowered study, one local optimizer per start.

Methods (``fit(method=...)``: a name, or an optimizer object with its options):

- ``"fides"`` (:class:`~diffsoup.inference.Fides`, the default): fides' interior trust-region
  reflective optimizer with the Gauss-Newton Hessian of the noise-weighted residuals (forward
  sensitivities), or the exact / differenced Hessian, or BFGS / SR1 updates;
- ``"trf"`` (:class:`~diffsoup.inference.TRF`): ``scipy.optimize.least_squares`` (trust region
  reflective) on the residuals and their Jacobian;
- ``"lbfgsb"`` (:class:`~diffsoup.inference.LBFGSB`): ``scipy.optimize.minimize(method="L-BFGS-B")``
  on the value and its exact gradient.

Starts are Latin hypercube samples within the bounds in the parameters' scaled coordinates
(:mod:`diffsoup.inference.fitting._starts`). A failed solve during a fit (an experiment whose
``ds.simulate`` status is not success) is recorded (experiment id, status) in the start's
``failures``; at a trial point it makes the optimizer step back (NaN, see
:mod:`diffsoup.inference.fitting._optimizers`), never ends the start. A drawn start whose own point fails
is replaced by a fresh draw (``resample_failed_starts`` times at most); a start point given by the
caller that fails is recorded as a failed start and not optimized.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any, Sequence

import numpy as np

from ..objective._abstract_lowered import AbstractLoweredStudy
from ._fides import Fides
from ._hierarchical import AnalyticParameters
from ..objective._lower import lower
from ._optimizers import LBFGSB, TRF, AbstractOptimizer, StartObjective
from ..objective._problem import InferenceProblem
from ._starts import replacement_point, start_points
from ..study._study import Study

METHODS = ("fides", "trf", "lbfgsb")
DEFAULT_METHOD = "fides"
# Starts within this of the best objective reached the same optimum (PEtab benchmarks' 1e-3 criterion).
CONVERGED = 1e-3


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
        method: the method's name (``"fides"``, ``"trf"``, ``"lbfgsb"``).
        seconds: total wall time; n_evaluations: total objective evaluations.
        theta_names: order of ``theta``.
        window_starts: multiple-shooting experiments' fitted window starts, id -> ``(W-1, n)``
            (linear scale; empty for single shooting).
        analytic: the names of the parameters optimized analytically at each evaluation
            (``fit(hierarchical=...)``; by default the noise levels that qualify), empty if none.
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
            analytic=tuple(analytic),
        )


def optimizer_of(method: str | AbstractOptimizer = DEFAULT_METHOD, *, max_nfev: int | None = None,
                 ftol: float | None = None, xtol: float | None = None, gtol: float | None = None) -> AbstractOptimizer:  # fmt: skip
    """The optimizer of ``fit(method=...)``: a name with the scipy-style tolerances mapped onto
    its options (fides: ``ftol`` -> ``frtol``, ``gtol`` -> ``gatol``, ``xtol`` -> ``xtol``), or an
    optimizer object as given (it carries its own options).

    Raises:
        ValueError: for an unknown name, or tolerances given with an optimizer object.
        TypeError: for anything else.
    """
    given = {k: v for k, v in (("max_nfev", max_nfev), ("ftol", ftol), ("xtol", xtol), ("gtol", gtol)) if v is not None}
    if isinstance(method, AbstractOptimizer):
        given.pop("max_nfev", None)
        if given:
            raise ValueError(f"fit: {sorted(given)} apply to a method given by name; set them on the {type(method).__name__} "
                             "object instead.")  # fmt: skip
        return method.with_max_evaluations(max_nfev)
    if not isinstance(method, str):
        raise TypeError(f"fit: method must be a name {METHODS} or an optimizer object (ds.inference.Fides(...)), "
                        f"not {type(method).__name__}.")  # fmt: skip
    if method not in METHODS:
        raise ValueError(f"fit: method={method!r} must be one of {METHODS} (or an optimizer object).")
    names = {"fides": {"ftol": "frtol", "gtol": "gatol", "xtol": "xtol"}, "trf": {"ftol": "ftol", "xtol": "xtol", "gtol": "gtol"},
             "lbfgsb": {"ftol": "ftol", "gtol": "gtol"}}[method]  # fmt: skip
    options = {names[k]: float(v) for k, v in given.items() if k in names}
    if max_nfev is not None:
        options["max_evaluations"] = int(max_nfev)
    return {"fides": Fides, "trf": TRF, "lbfgsb": LBFGSB}[method](**options)


def fit(
    target: AbstractLoweredStudy | InferenceProblem | Study,
    *,
    method: str | AbstractOptimizer = DEFAULT_METHOD,
    starts: int | Any = 4,
    seed: int = 0,
    x0: Any = None,
    max_nfev: int | None = None,
    ftol: float | None = None,
    xtol: float | None = None,
    gtol: float | None = None,
    failure_residual: float | None = None,
    resample_failed_starts: int = 10,
    progress: bool = False,
    hierarchical: bool | Sequence[str] | None = None,
) -> FitResult:
    """Fit the estimated parameters of a study: multistart, one local optimizer per start.

    Args:
        target: a lowered study (``ds.lower``'s, or the one ``ds.distributed.run`` yields: any
            ``AbstractLoweredStudy``), or an inference problem / study (lowered with defaults).
        method: ``"fides"`` (default: fides with the Gauss-Newton Hessian), ``"trf"`` (scipy's
            least squares on residuals and forward-sensitivity Jacobians) or ``"lbfgsb"`` (value
            and gradient); or an optimizer object, e.g. ``ds.inference.Fides(hessian="bfgs")``.
        starts: number of Latin hypercube starts within the bounds, or an array ``(s, n_theta)``
            of start points (scaled). Window starts of multiple-shooting experiments (and any
            other coordinate without finite bounds) are not sampled: every start takes their
            prepared values (``low.nominal``); an array ``(s, n_parameters)`` is completed with them.
        seed: seed of the Latin hypercube (and of the replacements of failed start points).
        x0: an extra first start: theta (scaled; the parameters alone are completed with the prepared
            window starts) or a mapping of linear values by name.
        max_nfev: most evaluations per start (None: the method's default; fides 1000 iterations).
        ftol, xtol, gtol: tolerances of a method given by name (None: its defaults); for fides
            they set ``frtol``, ``xtol`` and ``gatol``.
        failure_residual: no longer used (a failed trial point is now NaN, which every method
            steps back from); giving it warns.
        resample_failed_starts: most replacements of a drawn start point whose solve fails (0:
            none; the start is then recorded as failed). Given start points are never replaced.
        progress: show a progress bar over the starts on stderr (evaluations, best objective).
        hierarchical: optimize offsets and scaling factors of observables (the residuals are
            affine in them) and noise levels (spreads of Gaussian or log-normal noise)
            analytically at every evaluation, so that the optimizer moves only the others
            (:mod:`diffsoup.inference.fitting._hierarchical`): True takes every estimated parameter that
            qualifies (checked by evaluating the residuals at the nominal point); a sequence
            names them (each must qualify); None (default) takes the noise levels that qualify
            (measured: more starts reach the optimum on Boehm and Brannmark, at the cost of a
            plain evaluation); False none. Their start values are ignored; the results hold
            their optimum.

    Returns:
        A :class:`FitResult`.

    Raises:
        ValueError: for an unknown method, starts of the wrong shape or outside the bounds, or
            ``hierarchical`` names a parameter the residuals are not affine in.
        RuntimeError: if every start failed.
    """
    optimizer = optimizer_of(method, max_nfev=max_nfev, ftol=ftol, xtol=xtol, gtol=gtol)
    if failure_residual is not None:
        warnings.warn("fit: failure_residual is no longer used; a failed trial point is NaN, which every method steps "
                      "back from.", DeprecationWarning, stacklevel=2)  # fmt: skip
    if isinstance(resample_failed_starts, bool) or int(resample_failed_starts) < 0:
        raise ValueError(f"fit: resample_failed_starts={resample_failed_starts!r} must be a non-negative integer.")
    low = target if isinstance(target, AbstractLoweredStudy) else lower(target)
    analytic = AnalyticParameters.find(low, hierarchical) if hierarchical is None or hierarchical else None
    prob = low.problem
    k = prob.n_theta
    lo, hi = np.asarray(low.lower, float), np.asarray(low.upper, float)
    n_par = getattr(prob, "n_parameters", k)
    nominal = np.asarray(low.nominal, float)

    def complete(x):
        return np.concatenate([x, np.broadcast_to(nominal[n_par:], x.shape[:-1] + (k - n_par,))], axis=-1)

    drawn = isinstance(starts, (int, np.integer)) and not isinstance(starts, bool)
    if drawn:
        if starts < 0 or (starts == 0 and x0 is None):
            raise ValueError(f"fit: starts={starts!r} must be a positive count (or give x0).")
        points = start_points(low, int(starts), seed)
    else:
        points = np.atleast_2d(np.asarray(starts, dtype=np.float64))
        if points.shape[1:] == (n_par,) and n_par < k:
            points = complete(points)
        if points.shape[1:] != (k,):
            raise ValueError(f"fit: starts has shape {points.shape}; expected (s, {k}) for {list(prob.theta_names)}.")
    replaceable = [drawn] * len(points)
    if x0 is not None:
        first = prob.theta_of(x0) if isinstance(x0, dict) else np.asarray(x0, dtype=np.float64)
        if first.shape == (n_par,) and n_par < k:
            first = complete(first)
        if first.shape != (k,):
            raise ValueError(f"fit: x0 has shape {first.shape}; expected ({k},) or ({n_par},) (the parameters).")
        points = np.vstack([first[None], points])
        replaceable = [False] + replaceable
    if np.any(points < lo) or np.any(points > hi):
        raise ValueError("fit: a start point lies outside the bounds [lower, upper] (scaled coordinates).")
    t_all = time.perf_counter()
    bar = _Progress(len(points), optimizer.name, progress)
    try:
        results = []
        for i, (p, may_replace) in enumerate(zip(points, replaceable)):
            attempts = int(resample_failed_starts) if may_replace else 0
            drawn_index = i - (x0 is not None)  # the draw's own index, the same with or without x0
            replace = (lambda j, d=drawn_index: replacement_point(low, seed, d, j))
            results.append(run_start(low, optimizer, p, replace=replace, attempts=attempts,
                                     on_evaluation=bar.evaluated, analytic=analytic))  # fmt: skip
            bar.finished(results[-1])
    finally:
        bar.close()
    return FitResult.from_starts(low, results, method=optimizer.name, seconds=time.perf_counter() - t_all,
                                 analytic=analytic.names if analytic is not None else ())  # fmt: skip


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
    f0 = objective.value(theta0[objective.free])
    resampled = 0
    while not np.isfinite(f0) and resampled < attempts:
        resampled += 1
        theta0 = np.asarray(replace(resampled), dtype=np.float64)
        f0 = objective.value(theta0[objective.free])
    if not np.isfinite(f0):
        return StartResult(theta0, theta0, float("inf"), False, "a solve failed at the start point",
                           objective.n_evaluations, 0, time.perf_counter() - start, objective.failure_summary(),
                           resampled)  # fmt: skip
    if objective.free.size == 0:  # a profile whose other parameters are all optimized analytically
        return StartResult(theta0, objective.theta(theta0[objective.free]), float(f0), True,
                           "the other parameters were optimized analytically", objective.n_evaluations, 0,
                           time.perf_counter() - start, objective.failure_summary(), resampled)  # fmt: skip
    out = optimizer.minimize(objective, theta0[objective.free], f0)
    if out.value > f0:  # an optimizer may end above its start (L-BFGS-B on a penalized point): keep the start
        out = out._replace(x=theta0[objective.free], value=f0)
    return StartResult(theta0, objective.theta(out.x), float(out.value), out.success, out.message,
                       objective.n_evaluations, out.n_iterations, time.perf_counter() - start,
                       objective.failure_summary(), resampled)  # fmt: skip


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
