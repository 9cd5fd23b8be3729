"""``ds.inference.fit``: multistart fits of a lowered study, one local optimizer per start.

Methods (``fit(method=...)``: a name, or an optimizer object with its options):

- ``"fides"`` (:class:`~diffsoup.inference.Fides`, the default): fides' interior trust-region
  reflective optimizer with the Gauss-Newton Hessian of the noise-weighted residuals (forward
  sensitivities), or the exact / differenced Hessian, or BFGS / SR1 updates;
- ``"trf"`` (:class:`~diffsoup.inference.TRF`): ``scipy.optimize.least_squares`` (trust region
  reflective) on the residuals and their Jacobian;
- ``"lbfgsb"`` (:class:`~diffsoup.inference.LBFGSB`): ``scipy.optimize.minimize(method="L-BFGS-B")``
  on the value and its exact gradient;
- ``"batched"`` (:class:`~diffsoup.inference.BatchedTrustRegion`): many starts advanced together as
  the lanes of one program per iteration (trust region reflective least squares), the best distinct
  end points then finished by fides (:mod:`diffsoup.inference.fitting._batched_fit`).

Starts are the points of a scrambled Sobol' sequence within the bounds in the parameters' scaled coordinates
(:mod:`diffsoup.inference.fitting._starts`). A failed solve during a fit (an experiment whose
``ds.simulate`` status is not success) is recorded (experiment id, status) in the start's
``failures``; at a trial point it makes the optimizer step back (NaN, see
:mod:`diffsoup.inference.fitting._optimizers`), never ends the start. A drawn start whose own point fails
is replaced by a fresh draw (``resample_failed_starts`` times at most); a start point given by the
caller that fails is recorded as a failed start and not optimized.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Sequence

import numpy as np

from ..objective._abstract_lowered import AbstractLoweredStudy
from ._batched_trust_region import BatchedTrustRegion
from ._fides import Fides
from ._hierarchical import AnalyticParameters
from ..objective._lower import lower
from ._batched_fit import batched_fit
from ._optimizers import LBFGSB, TRF, AbstractOptimizer
from ._results import CONVERGED as CONVERGED
from ._results import FitResult as FitResult
from ._results import StartResult as StartResult
from ._run_start import run_start as run_start
from ..objective._problem import InferenceProblem
from ._starts import replacement_point, start_points
from ..study._study import Study

METHODS = ("fides", "trf", "lbfgsb", "batched")
DEFAULT_METHOD = "fides"


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
             "lbfgsb": {"ftol": "ftol", "gtol": "gtol"},
             "batched": {"ftol": "ftol", "xtol": "xtol", "gtol": "gtol"}}[method]  # fmt: skip
    options = {names[k]: float(v) for k, v in given.items() if k in names}
    if max_nfev is not None:
        options["max_evaluations"] = int(max_nfev)
    return {"fides": Fides, "trf": TRF, "lbfgsb": LBFGSB, "batched": BatchedTrustRegion}[method](**options)


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
            least squares on residuals and forward-sensitivity Jacobians), ``"lbfgsb"`` (value
            and gradient) or ``"batched"`` (the starts as lanes of one program, then fides on the
            best distinct ends); or an optimizer object, e.g. ``ds.inference.Fides(hessian="bfgs")``
            or ``ds.inference.BatchedTrustRegion(lanes=32)``.
        starts: number of starts, the first points of the scrambled Sobol' sequence within the
            bounds (:func:`~diffsoup.inference.fitting._starts.start_points`), or an array ``(s, n_theta)``
            of start points (scaled). Window starts of multiple-shooting experiments (and any
            other coordinate without finite bounds) are not sampled: every start takes their
            prepared values (``low.nominal``); an array ``(s, n_parameters)`` is completed with them.
        seed: seed of the Sobol' sequence (and of the replacements of failed start points).
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
    batched = isinstance(optimizer, BatchedTrustRegion)
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
    if batched:

        return batched_fit(low, optimizer, points, replaceable, seed=seed, first_drawn=int(x0 is not None),
                           attempts=int(resample_failed_starts), progress=progress, analytic=analytic)  # fmt: skip
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
