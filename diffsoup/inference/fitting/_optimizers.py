"""Optimizers of one start: the objective they see and the interface they implement.

:class:`StartObjective` is a lowered study seen by one optimizer run: the free coordinates of
``theta`` (all of them, or all but those a profile holds fixed), every evaluation counted, and
every failed solve (an experiment whose ``ds.simulate`` status is not success) recorded and
turned into NaN. NaN is what each optimizer is told at a failed trial point, and what each one
steps back from: fides and scipy's TRF reject a step to a point with a non-finite value,
residual or gradient and shrink the trust region (fides ``Optimizer.update_tr_radius``, scipy
``trf_bounds``); L-BFGS-B has no such rule, so it gets a value far above the start's and a zero
gradient, which its line search treats as no sufficient decrease and backtracks from. A failed
trial point never ends a start.

:class:`AbstractOptimizer` is what ``ds.inference.fit`` runs per start; the final
implementations are :class:`TRF` and :class:`LBFGSB` (scipy) here, and ``Fides``
(:mod:`diffsoup.inference.fitting._fides`).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections import Counter, OrderedDict
from typing import Any, Callable, ClassVar, Mapping, NamedTuple

import numpy as np

from ..objective._abstract_lowered import AbstractLoweredStudy
from ._hierarchical import AnalyticParameters, projected_jacobian, residuals_or_none, schur_complement


class Outcome(NamedTuple):
    """What an optimizer run returns.

    Attributes:
        x: the final free coordinates.
        value: the objective there (finite).
        success: the optimizer's convergence flag.
        message: its reason for stopping.
        n_iterations: its iterations.
    """

    x: np.ndarray
    value: float
    success: bool
    message: str
    n_iterations: int


REMEMBERED = 4
"""Evaluations a :class:`StartObjective` keeps, by method and point, for an optimizer that asks again."""
REMEMBERED_OPTIMA = 4096
"""Points whose analytic parameters' optimum a :class:`StartObjective` keeps (a few floats each)."""


class StartObjective:
    """The objective of one optimizer run over the free coordinates of ``theta``.

    Args:
        lowered: the lowered study.
        fixed: theta index -> value (scaled) of coordinates held fixed (a profile's parameter);
            None or empty: every coordinate is free.
        on_evaluation: called after each evaluation of the lowered study (a progress bar).
        analytic: parameters optimized analytically at each evaluation (hierarchical optimization,
            :mod:`diffsoup.inference.fitting._hierarchical`: offsets, scaling factors, noise levels): not
            among the free coordinates; ``theta(x)`` holds their optimum at ``x``. Those in
            ``fixed`` stay fixed.

    Every method takes the free coordinates ``x`` and returns NaN (value, residuals) where a solve
    failed or a number is not finite; derivatives are restricted to the free coordinates.

    Attributes:
        free: theta indices of the free coordinates; lower, upper: their bounds.
        n_evaluations: evaluations of the lowered study so far.
        failures: ``Counter`` of ``(experiment id, status name)`` over the failed evaluations.
        scale, offset: of the lowered study (``value = scale ||r||^2 + offset``).
    """

    def __init__(self, lowered: AbstractLoweredStudy, fixed: Mapping[int, float] | None = None,
                 on_evaluation: Callable[[], None] | None = None, analytic: AnalyticParameters | None = None):  # fmt: skip
        self.lowered = lowered
        k = lowered.problem.n_theta
        fixed = {int(i): float(v) for i, v in (fixed or {}).items()}
        bad = [i for i in fixed if not 0 <= i < k]
        if bad:
            raise ValueError(f"StartObjective: fixed indices {bad} are outside theta (size {k}).")
        self.analytic = analytic.without(fixed) if analytic is not None else None
        profiled = set() if self.analytic is None else set(self.analytic.indices.tolist())
        self.free = np.array([i for i in range(k) if i not in fixed and i not in profiled], dtype=np.int64)
        if self.free.size == 0 and self.analytic is None:
            raise ValueError("StartObjective: every coordinate is fixed; nothing to optimize.")
        self._template = np.asarray(lowered.nominal, dtype=np.float64).copy()
        for i, v in fixed.items():
            self._template[i] = v
        self.lower = np.asarray(lowered.lower, dtype=np.float64)[self.free]
        self.upper = np.asarray(lowered.upper, dtype=np.float64)[self.free]
        self.scale, self.offset = float(lowered.scale), float(lowered.offset)
        self.n_evaluations = 0
        self.failures: Counter = Counter()
        self._on_evaluation = on_evaluation
        # The last few evaluations by (method, point): an optimizer asks again for a point it has
        # evaluated (fides at the start point run_start checked, a continuation at its last end
        # point; scipy's TRF for the Jacobian after the residuals), and gets it without a solve.
        self._recent: OrderedDict = OrderedDict()
        # The analytic parameters' optimum at each point evaluated (theta key -> found), so that the
        # end point's theta, evaluated long before the optimizer stopped, takes no new solve.
        self._inner: OrderedDict = OrderedDict()
        # Noise levels alone: their optimum and the residuals there follow from one evaluation at any
        # spread (NoiseParameters.moved), so value and Gauss-Newton evaluate once, not twice.
        self._noise_alone = self.analytic is not None and self.analytic.affine is None

    def theta(self, x) -> np.ndarray:
        """The full ``theta`` of free coordinates ``x`` (with the analytic optimum of the
        ``analytic`` parameters there; NaN in them where a solve failed on the way)."""
        theta = self._filled(x)
        found = self._profiled(theta)
        if found is None:
            theta[self.analytic.indices] = math.nan
            return theta
        return found[0]

    def _filled(self, x) -> np.ndarray:
        """The template with the free coordinates set to ``x``."""
        theta = self._template.copy()
        theta[self.free] = np.asarray(x, dtype=np.float64)
        return theta

    def _profiled(self, theta: np.ndarray):
        """``(theta with the analytic parameters' optimum, which of them are inside their bounds)``;
        ``(theta, [])`` without analytic parameters; None where a solve failed (kept for the point)."""
        if self.analytic is None:
            return theta, np.zeros(0, dtype=np.int64)
        key = theta[self.free].tobytes()
        if key not in self._inner:
            found = self.analytic.solve(lambda th: residuals_or_none(self.lowered, th), theta)
            self._found(key, None if found is None else (found[0], self.analytic.indices[found[1]]))
        return self._inner[key]

    def _found(self, key: bytes, found) -> None:
        """Record the analytic parameters' optimum ``found`` at the point ``key``."""
        self._inner[key] = found
        if len(self._inner) > REMEMBERED_OPTIMA:
            self._inner.popitem(last=False)

    def _at(self, x):
        """The full theta at ``x`` and the analytic coordinates to project out, or None (a failed
        solve while finding the analytic parameters' optimum: counted as a failed evaluation)."""
        found = self._profiled(self._filled(x))
        if found is None:
            self._failed()
        return found

    def _failed(self) -> bool:
        """Count the evaluation just made; record and report its failed solves."""
        self.n_evaluations += 1
        if self._on_evaluation is not None:
            self._on_evaluation()
        failed = self.lowered.last_failures
        for eid, status in failed.items():
            self.failures[(eid, getattr(status, "name", str(status)))] += 1
        return bool(failed)

    def failure_summary(self) -> tuple:
        """``(experiment id, status name, count)`` of the failed solves met so far."""
        return tuple((eid, name, n) for (eid, name), n in self.failures.items())

    def _noise_moved(self, x, jacobian: bool):
        """Noise levels alone: ``(r*, J* or None)`` at their optimum from one evaluation at ``x``
        with the template's spreads (recorded as the point's inner optimum); None where it failed."""
        theta = self._filled(x)
        key = theta[self.free].tobytes()
        if jacobian:
            r, J = self.lowered.residuals_and_jacobian(theta)
        else:
            r, J = self.lowered.residuals(theta), None
        if self._failed() or not (np.all(np.isfinite(r)) and (J is None or np.all(np.isfinite(J)))):
            self._found(key, None)
            return None
        theta, interior, r, J_moved = self.analytic.noise.moved(theta, r, J)
        self._found(key, (theta, self.analytic.indices[interior]))
        return r, (J_moved if jacobian else None)

    def _remembered(self, method: str, x, evaluate: Callable[[], tuple]) -> tuple:
        """``evaluate()`` at ``x``, or its result from one of the last :data:`REMEMBERED`
        evaluations by ``method`` at the same point (copies: an optimizer may write into them)."""
        key = (method, np.asarray(x, dtype=np.float64).tobytes())
        if key in self._recent:
            self._recent.move_to_end(key)
        else:
            self._recent[key] = evaluate()
            if len(self._recent) > REMEMBERED:
                self._recent.popitem(last=False)
        return tuple(v.copy() if isinstance(v, np.ndarray) else v for v in self._recent[key])

    def value_by(self, method: str, x) -> float:
        """The objective at ``x`` from the evaluation ``method`` (``"value"``, ``"value_and_grad"``,
        ``"gauss_newton"``, ``"value_grad_hessian"`` or ``"residuals_and_jacobian"``): the one an
        optimizer makes itself, so that checking its start point compiles no program it will not
        run, and its own first evaluation there is remembered (NaN where a solve failed).

        Raises:
            ValueError: for another ``method``.
        """
        if method == "value":
            return self.value(x)
        if method in ("value_and_grad", "gauss_newton", "value_grad_hessian"):
            return float(getattr(self, method)(x)[0])
        if method == "residuals_and_jacobian":
            r = self.residuals_and_jacobian(x)[0]
            return float(self.scale * r @ r + self.offset) if np.all(np.isfinite(r)) else math.nan
        raise ValueError(f"value_by: method={method!r} must be one of 'value', 'value_and_grad', 'gauss_newton', "
                         "'value_grad_hessian', 'residuals_and_jacobian'.")  # fmt: skip

    def value(self, x) -> float:
        """The objective (NaN where a solve failed)."""
        if self._noise_alone:
            moved = self._noise_moved(x, jacobian=False)
            return math.nan if moved is None else float(self.scale * moved[0] @ moved[0] + self.offset)
        found = self._at(x)
        if found is None:
            return math.nan
        v = self.lowered.value(found[0])
        return math.nan if self._failed() or not np.isfinite(v) else float(v)

    def value_and_grad(self, x) -> tuple[float, np.ndarray]:
        """The objective and its gradient (NaN where a solve failed or a number is not finite)."""
        return self._remembered("value_and_grad", x, lambda: self._value_and_grad(x))

    def _value_and_grad(self, x) -> tuple[float, np.ndarray]:
        found = self._at(x)
        if found is None:
            return math.nan, np.full(self.free.size, math.nan)
        v, g = self.lowered.value_and_grad(found[0])
        g = np.asarray(g, dtype=np.float64)[self.free]
        if self._failed() or not (np.isfinite(v) and np.all(np.isfinite(g))):
            return math.nan, np.full_like(g, math.nan)
        return float(v), g

    def gauss_newton(self, x) -> tuple[float, np.ndarray, np.ndarray]:
        """Value, gradient and Gauss-Newton Hessian ``2 scale J^T J`` (NaN where a solve failed)."""
        return self._remembered("gauss_newton", x, lambda: self._gauss_newton(x))

    def _gauss_newton(self, x) -> tuple[float, np.ndarray, np.ndarray]:
        if self._noise_alone:
            n = self.free.size
            moved = self._noise_moved(x, jacobian=True)
            if moved is None:
                return math.nan, np.full(n, math.nan), np.full((n, n), math.nan)
            r, J = moved
            interior = self._inner[self._filled(x)[self.free].tobytes()][1]
            v, g, H = self.scale * r @ r + self.offset, 2.0 * self.scale * J.T @ r, 2.0 * self.scale * J.T @ J
            return float(v), g[self.free], schur_complement(H, self.free, interior)
        found = self._at(x)
        if found is None:
            n = self.free.size
            return math.nan, np.full(n, math.nan), np.full((n, n), math.nan)
        v, g, H = self.lowered.gauss_newton(found[0])
        g, H = np.asarray(g)[self.free], schur_complement(np.asarray(H), self.free, found[1])
        if self._failed() or not (np.isfinite(v) and np.all(np.isfinite(g)) and np.all(np.isfinite(H))):
            return math.nan, np.full_like(g, math.nan), np.full_like(H, math.nan)
        return float(v), g, H

    def value_grad_hessian(self, x) -> tuple[float, np.ndarray, np.ndarray]:
        """Value, gradient and the lowered study's Hessian (exact, or central differences of
        gradients, as ``ds.lower(hessian=...)`` chose): two evaluations."""
        return self._remembered("value_grad_hessian", x, lambda: self._value_grad_hessian(x))

    def _value_grad_hessian(self, x) -> tuple[float, np.ndarray, np.ndarray]:
        v, g = self.value_and_grad(x)
        if not np.isfinite(v):
            return v, g, np.full((g.size, g.size), math.nan)
        found = self._at(x)  # cached by value_and_grad's call
        H = schur_complement(np.asarray(self.lowered.hessian(found[0])), self.free, found[1])
        if self._failed() or not np.all(np.isfinite(H)):
            return math.nan, np.full_like(g, math.nan), np.full_like(H, math.nan)
        return v, g, H

    def residuals_and_jacobian(self, x) -> tuple[np.ndarray, np.ndarray]:
        """Residuals and their Jacobian over the free coordinates (all NaN where a solve failed)."""
        return self._remembered("residuals_and_jacobian", x, lambda: self._residuals_and_jacobian(x))

    def _residuals_and_jacobian(self, x) -> tuple[np.ndarray, np.ndarray]:
        found = self._at(x)
        if found is None:
            n = self.lowered.n_residuals
            return np.full(n, math.nan), np.full((n, self.free.size), math.nan)
        r, J = self.lowered.residuals_and_jacobian(found[0])
        r = np.asarray(r, dtype=np.float64)
        J = projected_jacobian(np.asarray(J, dtype=np.float64), self.free, found[1])
        if self._failed() or not (np.all(np.isfinite(r)) and np.all(np.isfinite(J))):
            r, J = np.full_like(r, math.nan), np.full_like(J, math.nan)
        return r, J


class AbstractOptimizer(abc.ABC):
    """A local optimizer of one start within the bounds.

    Implementations are frozen dataclasses of their numerical options; :meth:`minimize` runs one
    start from a point whose objective is finite.

    Attributes:
        name: the method's name in ``fit(method=...)`` and in results.
    """

    name: ClassVar[str]

    @property
    def evaluation(self) -> str:
        """The :class:`StartObjective` method this optimizer evaluates (``"value_and_grad"``,
        ``"gauss_newton"``, ``"value_grad_hessian"`` or ``"residuals_and_jacobian"``): ``run_start``
        checks a start point with it, so that the check compiles no program the run will not use."""
        return "value_and_grad"

    @abc.abstractmethod
    def minimize(self, objective: StartObjective, x0: np.ndarray, f0: float) -> Outcome:
        """Minimize ``objective`` from ``x0`` (free coordinates, within the bounds) whose objective
        ``f0`` is finite, within ``objective.lower``/``upper``."""

    def with_max_evaluations(self, n: int | None) -> "AbstractOptimizer":
        """The same optimizer with at most ``n`` evaluations (None: its own default)."""
        return self if n is None else dataclasses.replace(self, max_evaluations=int(n))  # type: ignore[type-var]


@dataclasses.dataclass(frozen=True)
class TRF(AbstractOptimizer):
    """scipy's trust region reflective least squares (``least_squares(method="trf")``) on the
    residuals and their Jacobian by forward sensitivities (one evaluation per trial point).

    Attributes:
        ftol, xtol, gtol: scipy's tolerances.
        max_evaluations: most residual evaluations (None: scipy's ``100 n``).
        x_scale: scipy's ``x_scale`` (``"jac"``: the inverse norms of the Jacobian's columns,
            updated each iteration; ``1.0``: theta's own units).
    """

    name: ClassVar[str] = "trf"
    ftol: float = 1e-8
    xtol: float = 1e-8
    gtol: float = 1e-8
    max_evaluations: int | None = None
    x_scale: Any = 1.0

    @property
    def evaluation(self) -> str:
        return "residuals_and_jacobian"

    def minimize(self, objective: StartObjective, x0: np.ndarray, f0: float) -> Outcome:
        from scipy.optimize import least_squares

        res = least_squares(lambda x: objective.residuals_and_jacobian(x)[0], x0,
                            jac=lambda x: objective.residuals_and_jacobian(x)[1],
                            bounds=(objective.lower, objective.upper), method="trf", ftol=self.ftol,
                            xtol=self.xtol, gtol=self.gtol, max_nfev=self.max_evaluations,
                            x_scale=self.x_scale)  # fmt: skip
        value = objective.scale * 2.0 * float(res.cost) + objective.offset
        return Outcome(np.asarray(res.x), value, bool(res.success), str(res.message), int(res.njev or 0))


@dataclasses.dataclass(frozen=True)
class LBFGSB(AbstractOptimizer):
    """scipy's L-BFGS-B (``minimize(method="L-BFGS-B")``) on the value and its exact gradient.

    A trial point whose solve failed gets a value far above the start's and a zero gradient; the
    line search backtracks from it, but its cubic model then takes tiny steps, whose small
    reductions can meet the ``ftol`` test far from the optimum. So a run that met failed solves
    is restarted from where it stopped (fresh curvature memory), ``restarts`` times at most, while
    restarting still lowers the objective.

    Attributes:
        ftol, gtol: scipy's ``ftol`` and ``pgtol``.
        max_evaluations: most value-and-gradient evaluations (None: scipy's 15000), over restarts.
        restarts: most restarts after runs that met failed solves.
    """

    name: ClassVar[str] = "lbfgsb"
    ftol: float = 1e-8
    gtol: float = 1e-8
    max_evaluations: int | None = None
    restarts: int = 5

    def minimize(self, objective: StartObjective, x0: np.ndarray, f0: float) -> Outcome:
        from scipy.optimize import minimize

        penalty = 1e10 * (1.0 + abs(f0))

        def fg(x):
            v, g = objective.value_and_grad(x)
            return (v, g) if np.isfinite(v) else (penalty, np.zeros_like(x))

        bounds = list(zip(objective.lower, objective.upper))
        x, f, iterations, spent = np.asarray(x0, dtype=np.float64), float(f0), 0, objective.n_evaluations
        success, message = False, "evaluation budget spent"
        for _ in range(1 + int(self.restarts)):
            options: dict = {"ftol": self.ftol, "gtol": self.gtol}
            if self.max_evaluations is not None:
                left = int(self.max_evaluations) - (objective.n_evaluations - spent)
                if left < 1:
                    break
                options["maxfun"] = left
            failures_before = sum(objective.failures.values())
            res = minimize(fg, x, jac=True, method="L-BFGS-B", bounds=bounds, options=options)
            iterations += int(res.nit)
            improved = float(res.fun) < f - self.ftol * max(1.0, abs(f))
            if improved or message == "evaluation budget spent":  # the run that placed x says how it ended
                success, message = bool(res.success), str(res.message)
            if float(res.fun) <= f:
                x, f = np.asarray(res.x, dtype=np.float64), float(res.fun)
            if sum(objective.failures.values()) == failures_before or not improved:
                break
        return Outcome(x, f, success, message, iterations)
