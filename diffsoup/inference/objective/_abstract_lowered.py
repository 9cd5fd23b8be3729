"""The interface of a lowered study: what ``ds.inference.fit``, ``FitResult`` and the workflows use.

An :class:`AbstractLoweredStudy` evaluates the objective of an inference problem over a set of its
experiments (all of them, or a subset). Its one evaluation hook, :meth:`~AbstractLoweredStudy.compute`,
returns a typed part (``diffsoup.inference.objective._parts``); :meth:`~AbstractLoweredStudy.evaluate` records
the part's failures and step counts, and the public methods (``value``, ``value_and_grad``,
``residuals``, ``residuals_and_jacobian``, ``gauss_newton``, ``hessian``) turn it into numbers with
the objective's ``scale`` and ``offset``. The local implementation is ``LoweredStudy`` (chunks of
experiments on this process's devices); ``ds.distributed.run`` yields a ``DistributedStudy`` that
wraps one and combines the parts its shards return.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._parts import EVALUATION_MODES, AbstractPart
from ._problem import InferenceProblem
from ._terms import member_array


def experiment_indices(problem: InferenceProblem, experiments: Sequence[Any] | None) -> tuple[int, ...]:
    """Study indices (sorted) of ``experiments``: indices into ``problem.study.experiments`` or
    experiment ids; None for all.

    Raises:
        ValueError: for none, an unknown id, an index out of range, or one named twice.
        TypeError: for something neither an index nor an id.
    """
    study = problem.study
    exps = study.experiments
    if experiments is None:
        return tuple(range(len(exps)))
    if isinstance(experiments, (str, bytes)) or not isinstance(experiments, Sequence | np.ndarray):
        raise TypeError(f"experiments must be a sequence of study indices or experiment ids, not {experiments!r}.")
    out = []
    for x in experiments:
        if isinstance(x, str):
            i = study.index_of(x)
            if i is None:
                raise ValueError(f"experiments: {x!r} is not an experiment id of the study.")
            out.append(i)
        elif isinstance(x, (int, np.integer)) and not isinstance(x, bool):
            if not 0 <= int(x) < len(exps):
                raise ValueError(f"experiments: index {int(x)} is out of range for a study of {len(exps)} experiments.")
            out.append(int(x))
        else:
            raise TypeError(f"experiments: {x!r} is neither a study index nor an experiment id.")
    if not out:
        raise ValueError("experiments: give at least one experiment.")
    if len(set(out)) != len(out):
        raise ValueError("experiments: an experiment is named twice.")
    return tuple(sorted(out))


def _offset_of(problem: InferenceProblem, members: tuple[int, ...]) -> float:
    """``problem.offset`` restricted to the experiments ``members`` (every noise model, per-column,
    per-cell and function spreads included: :meth:`InferenceProblem.offset_of`)."""
    if len(members) == len(problem.study.experiments):
        return float(problem.offset)
    return float(problem.offset_of(members))


class ResidualSlices(Mapping):
    """Experiment id -> its slice of a lowered study's residuals (in study order), computed from
    the experiments' residual counts when asked for (no object per experiment)."""

    def __init__(self, study: Any, indices: Sequence[int], size: np.ndarray):
        self._study = study
        self._indices = np.asarray(indices, dtype=np.int64)
        self._ends = np.cumsum(size[self._indices])
        self._position = None  # study index -> position among indices, built on first lookup
        self.total = int(self._ends[-1]) if self._ends.size else 0

    def _slice(self, position: int) -> slice:
        start = int(self._ends[position - 1]) if position else 0
        return slice(start, int(self._ends[position]))

    def __getitem__(self, experiment_id: str) -> slice:
        i = self._study.index_of(experiment_id) if isinstance(experiment_id, str) else None
        if i is None:
            raise KeyError(experiment_id)
        if self._position is None:
            self._position = {int(j): p for p, j in enumerate(self._indices.tolist())}
        if i not in self._position:
            raise KeyError(experiment_id)
        return self._slice(self._position[i])

    def __iter__(self):
        ids = self._study.ids
        return (ids[i] for i in self._indices.tolist())

    def __len__(self) -> int:
        return int(self._indices.size)


class AbstractLoweredStudy(abc.ABC):
    """An inference problem's objective over a set of its experiments, evaluated somewhere.

    ``theta`` is the vector of estimated parameters on their scales, in ``theta_names`` order.
    Every evaluation returns numpy values; an experiment whose solve failed makes the value (and
    its residuals) NaN and is listed in ``last_failures``.

    Implementations provide :meth:`compute` (one evaluation, as a part) and :meth:`compile`.

    Attributes:
        problem: the :class:`InferenceProblem`.
        theta_names, lower, upper, nominal: of the problem.
        experiment_indices: the study indices (sorted) of the experiments this study evaluates.
        scale, offset: ``value = scale * ||residuals||^2 + offset`` (offset of these experiments).
        residual_slices: experiment id -> its slice of :meth:`residuals`; n_residuals: their total.
        last_failures: experiment id -> ``ds.Status`` of the last evaluation's failed solves.
        steps: accepted steps per experiment (study order) at its last evaluation (-1 before any,
            and for experiments this study does not evaluate).
    """

    def __init__(self, problem: InferenceProblem, experiments: Sequence[Any] | None = None):
        if not isinstance(problem, InferenceProblem):
            raise TypeError(f"a lowered study needs an InferenceProblem, not {type(problem).__name__}.")
        self.problem = problem
        self.theta_names = problem.theta_names
        self.lower, self.upper, self.nominal = problem.lower, problem.upper, problem.nominal
        self.scale = problem.scale
        self.experiment_indices = experiment_indices(problem, experiments)
        self.offset = _offset_of(problem, self.experiment_indices)
        E = len(problem.study.experiments)
        size = np.zeros(E, dtype=np.int64)
        for g in problem.groups:
            size[member_array(g.members)] = g.n_residuals
        self.residual_slices = ResidualSlices(problem.study, self.experiment_indices, size)
        self.n_residuals = self.residual_slices.total
        self.steps = np.full(E, -1, dtype=np.int64)
        self.last_failures: dict = {}

    @property
    def experiment_ids(self) -> tuple[str, ...]:
        """Ids of the experiments this study evaluates (study order)."""
        ids = self.problem.study.ids
        return tuple(ids[i] for i in self.experiment_indices)

    # -- what an implementation provides -------------------------------------------------------
    @abc.abstractmethod
    def compute(self, mode: str, theta: np.ndarray) -> AbstractPart:
        """The part of ``mode`` (one of ``EVALUATION_MODES``) at ``theta``, without recording it;
        :meth:`evaluate` checks its arguments, calls this and records the part."""

    @abc.abstractmethod
    def compile(self, modes: Sequence[str] = ("value", "value_and_grad", "jacobian")) -> "AbstractLoweredStudy":
        """Compile the programs of ``modes`` now (otherwise on first use); returns the study."""

    # -- evaluation -----------------------------------------------------------------------------
    def _theta(self, theta) -> np.ndarray:
        theta = np.asarray(theta, dtype=np.float64)
        if theta.shape != (self.problem.n_theta,):
            raise ValueError(f"theta has shape {theta.shape}; expected ({self.problem.n_theta},) for {list(self.theta_names)}.")
        return theta

    def evaluate(self, mode: str, theta: Any) -> AbstractPart:
        """One evaluation as a part (the sums and rows that combine over disjoint experiments);
        ``last_failures`` and ``steps`` record it.

        Args:
            mode: ``"value"``, ``"value_and_grad"``, ``"residuals"``, ``"jacobian"``,
                ``"gauss_newton"`` or ``"hessian"``.
            theta: the estimated parameters (scaled), shape ``(n_theta,)``.

        Raises:
            ValueError: for an unknown mode or a theta of the wrong shape.
        """
        if mode not in EVALUATION_MODES:
            raise ValueError(f"evaluate: unknown mode {mode!r}; modes are {EVALUATION_MODES}.")
        part = self.compute(mode, self._theta(theta))
        self._record(part.failures, part.steps)
        return part

    def _record(self, failures: Mapping[str, Any], steps: Mapping[int, int]) -> None:
        """Keep an evaluation's failed solves (``last_failures``) and its experiments' steps."""
        self.last_failures = dict(failures)
        for i, n in steps.items():
            self.steps[i] = n

    def value(self, theta) -> float:
        """The objective at ``theta`` (NaN if a solve failed)."""
        return float(self.evaluate("value", theta).value)

    def value_and_grad(self, theta) -> tuple[float, np.ndarray]:
        """The objective and its gradient at ``theta`` (exact derivatives of the discrete solves: forward
        sensitivities or the checkpointed adjoint, as the implementation chose; ``ds.lower``'s
        ``gradient=``)."""
        part = self.evaluate("value_and_grad", theta)
        return float(part.value), np.asarray(part.grad)

    def _stacked(self, rows) -> np.ndarray:
        return np.concatenate([np.asarray(rows[i]) for i in self.experiment_indices], axis=0)

    def residuals(self, theta) -> np.ndarray:
        """Residuals of the experiments in study order (``residual_slices`` maps each experiment to
        its part)."""
        return self._stacked(self.evaluate("residuals", theta).residuals)

    def residuals_and_jacobian(self, theta) -> tuple[np.ndarray, np.ndarray]:
        """Residuals and their Jacobian ``(n_residuals, n_theta)`` by forward sensitivities."""
        part = self.evaluate("jacobian", theta)
        return self._stacked(part.residuals), self._stacked(part.jacobian)

    def residuals_and_jacobians(self, thetas, active=None, *, max_steps: int | None = None,
                                ) -> tuple[np.ndarray, np.ndarray, tuple]:  # fmt: skip
        """Residuals ``(s, n_residuals)`` and Jacobians ``(s, n_residuals, n_theta)`` at ``s`` points
        ``thetas`` ``(s, n_theta)`` at once, and each point's failed solves (experiment id ->
        ``ds.Status``; a point with any has NaN residuals). ``active`` (``(s,)`` bool, default all)
        marks the points wanted: the others may be skipped (NaN residuals) or evaluated.
        ``max_steps``: the solves' step budget for these points instead of the study's
        ``SolverOptions.max_steps`` (a solve that needs more fails with ``MAX_STEPS``).
        This one evaluates the wanted points one by one; ``LoweredStudy`` runs them as lanes of
        one program (``BatchedTrustRegion``'s evaluation). ``last_failures`` and ``steps`` are
        those of the last point evaluated.

        Raises:
            ValueError: for ``max_steps`` here (only ``LoweredStudy`` takes another step budget
                per call).
        """
        if max_steps is not None:
            raise ValueError(f"residuals_and_jacobians: max_steps={max_steps!r} needs the points as lanes of one "
                             f"program (a LoweredStudy from ds.lower), not a {type(self).__name__}; leave it None "
                             "to use the study's SolverOptions.max_steps.")  # fmt: skip
        thetas = np.atleast_2d(np.asarray(thetas, dtype=np.float64))
        active = np.ones(len(thetas), dtype=bool) if active is None else np.asarray(active, dtype=bool)
        rs, Js, failures = [], [], []
        for theta, on in zip(thetas, active):
            if not on:
                rs.append(np.full(self.n_residuals, np.nan))
                Js.append(np.zeros((self.n_residuals, self.problem.n_theta)))
                failures.append({})
                continue
            r, J = self.residuals_and_jacobian(theta)
            if self.last_failures:
                r = np.full_like(r, np.nan)
            rs.append(r)
            Js.append(J)
            failures.append(dict(self.last_failures))
        return np.stack(rs), np.stack(Js), tuple(failures)

    def gauss_newton(self, theta) -> tuple[float, np.ndarray, np.ndarray]:
        """Value, gradient and Gauss-Newton Hessian ``2 scale J^T J`` from the residual Jacobian
        (the products are formed where the experiments are evaluated; only ``(n_theta, n_theta)``
        travels)."""
        part = self.evaluate("gauss_newton", theta)
        c = 2.0 * self.scale
        return float(self.scale * part.sum_sq + self.offset), c * np.asarray(part.jtr), c * np.asarray(part.jtj)

    def hessian(self, theta) -> np.ndarray:
        """The Hessian of the objective, symmetrised: exact (forward over reverse) or central
        differences of gradients, as the implementation chose."""
        H = np.asarray(self.evaluate("hessian", theta).hessian)
        return 0.5 * (H + H.T)
