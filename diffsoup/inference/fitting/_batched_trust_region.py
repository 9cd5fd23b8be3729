"""``BatchedTrustRegion``: many starts of a least-squares fit advanced together, as the lanes of one
program per iteration.

Each iteration evaluates the residuals and their Jacobian at every lane's trial point at once (one
call of ``evaluate``: for a lowered study, its chunk programs vmapped over the points,
``AbstractLoweredStudy.residuals_and_jacobians``), then advances every lane by one iteration of the
trust region reflective method in one jitted program (:func:`lane_step` of
:mod:`diffsoup.inference.fitting._trust_region_reflective`, vmapped over the lanes): acceptance, radius,
convergence tests and the next trial point, lane by lane, on the device. The host only reads the
lanes' statuses: a lane whose start has ended (converged, budget spent, failed) is recorded and,
with ``refill``, given the next start, so that the program keeps its lanes busy until fewer starts
remain than lanes. A lane with nothing to do is parked at a point that solved (its own end point,
or another lane's), and its results are ignored.

A lane's numbers depend only on its own start: the lanes' iterations are independent, vmapped, and
a lane whose solve fails (non-finite residuals) rejects that step and cuts its radius
(``FAILED_SOLVES`` after ``max_failed_in_a_row`` such trials in a row) without touching the others.

As a method of ``ds.inference.fit`` (``method="batched"`` or ``method=BatchedTrustRegion(...)``)
the starts run this way and the best distinct end points are then finished by another optimizer
(``polish``, fides by default: :mod:`diffsoup.inference.fitting._batched_fit`). Run by
``fit``'s per-start path (``run_start``, profiles), :meth:`BatchedTrustRegion.minimize` runs one
start in one lane.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Callable, ClassVar, NamedTuple

import jax
import numpy as np

from ._optimizers import AbstractOptimizer, Outcome, StartObjective
from ._trust_region_reflective import LaneState, LaneStatus, empty_lanes, lane_step


# The batched phase's evaluations per start when the best ends are polished. Lanes that have not
# ended by then creep along flat valleys (the trust-region-reflective step has no subspace to turn
# along one), which fides' polish crosses faster; and on a GPU the last lanes hold the whole program.
# From the same starts on a 2-core CPU, against scipy's 100 n_theta: Fujita (20 starts) the same best
# end (69.93) for 3,984 evaluations against 9,852 (574 against 1,058 CPU s); Boehm (40) the same
# 138.222 at 4 of 4 budgets tried (75 to 300), 2,681-4,761 evaluations against 5,903; Bruno (40) no
# start needs more than 64 (26 converged either way).
EXPLORE_EVALUATIONS = 100

# The lanes of a program when none are given (``BatchedTrustRegion.lanes``). On a GPU the lanes of a
# program cost little more than one (an iteration is a chain of kernels whose latency every lane
# shares): one H200 fitted Bruno at 7.6 converged starts per second with 512 lanes and 15.1 with
# 1,000 (benchmarks/bench_fits.py), where 16 lanes would leave the device nearly idle. On a CPU the
# lanes' evaluations run one after the other, and 16 keep the refill's bookkeeping small.
GPU_LANES = 1024
CPU_LANES = 16

# The lanes' step budget per experiment solve when none is given (``BatchedTrustRegion.max_steps``):
# this many times the most steps an experiment takes at the problem's nominal point, at least
# EXPLORE_STEPS_FLOOR, at most the study's own ``max_steps``. On a GPU the lanes run in lock-step, so
# an evaluation takes as many steps as its slowest lane: of 300 Fujita start points (scrambled
# Sobol', seed 0) the median needed 152 steps, the 99th percentile 2,156 and the slowest 9,695 (224
# at the nominal point), so with 1,000 lanes nearly every iteration would run the study's 10,000.
# Of those start points 0.3 % need more than 10x the nominal point's steps (Brannmark, Boehm, Weber
# and Bruno: none), and a trial point that does fails as a failed solve does: its lane's radius
# shrinks, or its start point is replaced.
EXPLORE_STEPS_FACTOR = 10
EXPLORE_STEPS_FLOOR = 1_000

# The options that act after the lanes, on the host (:meth:`BatchedTrustRegion.lane_settings`).
POLISH_FIELDS = ("polish", "polish_unfinished", "polish_method")


@dataclasses.dataclass(frozen=True)
class BatchedTrustRegion(AbstractOptimizer):
    """Many starts as lanes of one program per iteration, each lane a trust region reflective
    least-squares run (scipy's ``least_squares(method="trf")`` step, see
    :mod:`diffsoup.inference.fitting._trust_region_reflective`).

    Attributes:
        lanes: starts advanced together (the program's lane count; fewer if fewer starts). None:
            :data:`GPU_LANES` (1,024) where the lowered study runs on a GPU, :data:`CPU_LANES`
            (16) elsewhere (:meth:`lanes_on`).
        refill: give a lane whose start ended the next start at once (True), or wait until every
            lane's start has ended and fill them all (False: batches of ``lanes`` starts).
        max_evaluations: most evaluations per start (its start point's included); None:
            :data:`EXPLORE_EVALUATIONS` (100) when the best ends are polished (``polish > 0``: the
            batched phase explores, the polish finishes), else scipy's ``100 n_theta``.
        ftol, xtol, gtol: scipy's tolerances (on ``0.5 ||r||^2``, the step, the scaled gradient).
        stall_rtol, stall_window: a start ends as ``STALLED`` when its cost fell by at most
            ``stall_rtol`` times the cost over the last ``stall_window`` evaluations (0: never;
            see :mod:`diffsoup.inference.fitting._trust_region_reflective`).
        initial_radius: the first trust-region radius in the scaled variables; None: scipy's rule
            (``||x0 / v^1/2||``, the start's size in the Coleman-Li scaling).
        max_failed_in_a_row: a start ends as ``FAILED_SOLVES`` after this many trial points in a
            row that failed to solve.
        max_steps: in ``fit``, the lanes' step budget per experiment solve: a trial point that
            needs more fails (its lane's radius shrinks; a start point is replaced, as one whose
            solve fails). None: :data:`EXPLORE_STEPS_FACTOR` (10) times the most steps of an
            experiment at the problem's nominal point, at least :data:`EXPLORE_STEPS_FLOOR`
            (1,000), at most the study's ``SolverOptions.max_steps``: on a GPU the lanes run in
            lock-step, so one lane's steps are every lane's. The polish and a start run alone
            (``minimize``) keep the study's budget.
        polish: in ``fit``, how many of the best distinct end points are finished by
            ``polish_method`` (0: none).
        polish_unfinished: with ``polish``, up to this many more distinct end points finished,
            the best of those whose start did not converge in the lanes (its evaluations spent, or
            its solves failing) at an objective below every converged end's: where the batched
            phase finished none of the best basins, the order of its unfinished ends says little
            about where they lead (Weber: the 20 best of 48 ends were budget-bound; fides from
            ranks 4 to 11 reached the reference twice, from the 3 best never). None of them where a
            converged end is the best (Boehm, Bruno).
        polish_method: the optimizer that finishes them (None: ``ds.inference.Fides()``, with
            ``fit``'s analytic parameters).

    Raises:
        ValueError: for a non-positive count or a negative tolerance.
    """

    name: ClassVar[str] = "batched"
    lanes: int | None = None
    refill: bool = True
    max_evaluations: int | None = None
    ftol: float = 1e-8
    xtol: float = 1e-8
    gtol: float = 1e-8
    stall_rtol: float = 1e-6
    stall_window: int = 10
    initial_radius: float | None = None
    max_failed_in_a_row: int = 20
    max_steps: int | None = None
    polish: int = 3
    polish_unfinished: int = 8
    polish_method: Any = None

    def __post_init__(self):
        counts = ("max_failed_in_a_row", "stall_window")
        optional = tuple(f for f in ("lanes", "max_evaluations", "max_steps") if getattr(self, f) is not None)
        for field in counts + optional:
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"BatchedTrustRegion: {field}={value!r} must be a positive integer.")
        for field in ("polish", "polish_unfinished"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"BatchedTrustRegion: {field}={value!r} must be a non-negative integer (0: none).")
        for field in ("ftol", "xtol", "gtol", "stall_rtol"):
            if not float(getattr(self, field)) >= 0:
                raise ValueError(f"BatchedTrustRegion: {field}={getattr(self, field)!r} must be non-negative.")
        if self.initial_radius is not None and not float(self.initial_radius) > 0:
            raise ValueError(f"BatchedTrustRegion: initial_radius={self.initial_radius!r} must be positive (or None).")
        if self.polish_method is not None and not isinstance(self.polish_method, AbstractOptimizer):
            raise TypeError("BatchedTrustRegion: polish_method must be an optimizer object such as "
                            f"ds.inference.Fides(), not {type(self.polish_method).__name__}.")  # fmt: skip

    def lane_settings(self) -> str:
        """The options the lanes run with, as text: a multistart campaign records it with every
        block, and a rerun whose lane settings differ conflicts. The polish's options are left out
        (the host polishes after every block: a rerun with another ``polish`` keeps the blocks),
        except, without a ``max_evaluations``, whether there is a polish: it sets the budget
        (:meth:`budget`)."""
        kept = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.name not in POLISH_FIELDS]
        if self.max_evaluations is None:
            kept.append(f"polished={self.polish > 0}")
        return f"{type(self).__name__}({', '.join(kept)})"

    def lanes_on(self, platform: str) -> int:
        """The lanes of a program on ``platform`` (a JAX platform name: ``"gpu"``, ``"cpu"``):
        ``lanes`` where given, else :data:`GPU_LANES` on a GPU and :data:`CPU_LANES` elsewhere."""
        if self.lanes is not None:
            return int(self.lanes)
        return GPU_LANES if platform == "gpu" else CPU_LANES

    def budget(self, k: int) -> int:
        """Most evaluations per start for ``k`` free coordinates."""
        if self.max_evaluations is not None:
            return int(self.max_evaluations)
        return EXPLORE_EVALUATIONS if self.polish else 100 * int(k)

    def options(self, k: int) -> tuple:
        """The numbers :func:`lane_step` is compiled with."""
        return (float(self.ftol), float(self.xtol), float(self.gtol), self.budget(k), int(self.max_failed_in_a_row),
                float(self.initial_radius or 0.0), float(self.stall_rtol), int(self.stall_window))  # fmt: skip

    @property
    def evaluation(self) -> str:
        return "residuals_and_jacobian"  # one lane's evaluation, alone (minimize)

    def minimize(self, objective: StartObjective, x0: np.ndarray, f0: float) -> Outcome:
        """One start alone in one lane (``fit``'s per-start path; ``run_start``)."""

        def evaluate(points, active):
            r, J = objective.residuals_and_jacobian(points[0])
            return r[None], J[None], np.array([bool(np.all(np.isfinite(r)))])

        # Alone, nothing polishes after it: the budget of an unpolished run (scipy's).
        run = run_lanes(dataclasses.replace(self, lanes=1, polish=0), evaluate, np.asarray(x0, float)[None],
                        objective.lower, objective.upper)  # fmt: skip
        end = run.results[0]
        value = 2.0 * objective.scale * end.cost + objective.offset
        return Outcome(end.x, float(value), end.status.converged, end.message, end.accepted)


class LaneResult(NamedTuple):
    """How one start ended.

    Attributes:
        start: its index; x0: the point it started from (a replacement when the drawn one failed).
        x: its end point; cost: ``0.5 ||r||^2`` there (inf if the start failed).
        status: the :class:`LaneStatus` that ended it; message: in words.
        evaluations: evaluations of its points (replaced start points' included); accepted: steps
            taken; failed: evaluations that failed to solve; resampled: replaced start points.
        seconds: wall time from its lane being filled to its end (lanes share that time).
        lane: the lane that ran it.
    """

    start: int
    x0: np.ndarray
    x: np.ndarray
    cost: float
    status: LaneStatus
    message: str
    evaluations: int
    accepted: int
    failed: int
    resampled: int
    seconds: float
    lane: int


class LanesRun(NamedTuple):
    """The outcome of :func:`run_lanes`: every start's :class:`LaneResult` (start order), and per
    iteration the number of lanes holding a start (``active``) and the starts ended so far."""

    results: tuple
    active: tuple
    ended: tuple


MESSAGES = {
    LaneStatus.GTOL: "batched: the scaled gradient is below gtol",
    LaneStatus.FTOL: "batched: the cost changed by less than ftol",
    LaneStatus.XTOL: "batched: the step is below xtol",
    LaneStatus.MAX_EVALUATIONS: "batched: the evaluation budget is spent",
    LaneStatus.FAILED_START: "a solve failed at the start point",
    LaneStatus.FAILED_SOLVES: "batched: trial points failed to solve too many times in a row",
    LaneStatus.STALLED: "batched: the cost fell by less than stall_rtol over stall_window evaluations",
}


@functools.lru_cache(maxsize=32)
def _step_program(options: tuple):
    """The jitted iteration of every lane: :func:`lane_step` vmapped over the lanes."""
    def step(state, r, J, solved, lower, upper):
        return jax.vmap(lambda lane, r_, J_, s_: lane_step(lane, r_, J_, s_, lower, upper, options))(state, r, J, solved)

    return jax.jit(step)


def run_lanes(optimizer: BatchedTrustRegion, evaluate: Callable, starts: Any, lower: Any, upper: Any, *,
              replace: Callable[[int, int], np.ndarray] | None = None, attempts: Any = 0,
              on_iteration: Callable[[int, int, float], None] | None = None) -> LanesRun:  # fmt: skip
    """Run every start of ``starts`` to its end, ``optimizer.lanes`` at a time.

    Args:
        optimizer: the options.
        evaluate: ``(points (L, k), active (L,) bool) -> (residuals (L, m), Jacobians (L, m, k),
            solved (L,) bool)`` at every lane's point at once (``solved`` False where a solve
            failed); the points of lanes that ``active`` marks False (holding no start) are not
            read and may be skipped.
        starts: ``(N, k)`` start points within ``[lower, upper]``.
        lower, upper: ``(k,)`` bounds (infinite allowed).
        replace: ``(start, attempt) -> point``: a replacement for a start point that fails to
            solve (attempt 1, 2, ...); attempts: most replacements (one number, or one per start).
        on_iteration: called after each iteration with ``(starts ended, starts in all, lowest
            cost so far)``.

    Returns:
        A :class:`LanesRun`.
    """
    starts = np.atleast_2d(np.asarray(starts, dtype=np.float64))
    N, k = starts.shape
    lower, upper = np.asarray(lower, np.float64), np.asarray(upper, np.float64)
    attempts = np.broadcast_to(np.asarray(attempts, dtype=np.int64), (N,))
    L = max(1, min(optimizer.lanes_on(jax.default_backend()), N))
    step = _step_program(optimizer.options(k))
    state = empty_lanes(L, k)
    owner = np.full(L, -1, dtype=np.int64)
    began, x0s, tried = np.zeros(L), starts.copy(), np.zeros(N, dtype=np.int64)
    results: list = [None] * N
    active_log, ended_log = [], []
    next_start, best, park = 0, math.inf, None

    def load(lane: int, point: np.ndarray, fresh: bool) -> None:
        for name, value in (("x", point), ("trial", point), ("cost", 0.0), ("g", 0.0), ("H", 0.0), ("radius", 1.0),
                            ("alpha", 0.0), ("predicted", 0.0), ("step_norm", 0.0), ("step_h_norm", 0.0),
                            ("failed_in_a_row", 0), ("window_cost", 0.0), ("window_start", 0)):  # fmt: skip
            getattr(state, name)[lane] = value
        state.status[lane] = int(LaneStatus.STARTING)
        if fresh:
            state.evaluations[lane] = state.accepted[lane] = state.failed[lane] = 0

    while True:
        idle = owner < 0
        if next_start < N and (optimizer.refill or idle.all()):
            for lane in np.flatnonzero(idle):
                if next_start == N:
                    break
                load(int(lane), starts[next_start], fresh=True)
                owner[lane], began[lane] = next_start, time.perf_counter()
                next_start += 1
        busy = owner >= 0
        if not busy.any():
            break
        active_log.append(int(busy.sum()))
        # Lanes without a start sit at a point that solved (their results are ignored).
        trial = state.trial.copy()
        if park is not None:
            trial[~busy] = park
        r, J, solved = evaluate(trial, busy)
        new = step(state, np.asarray(r, np.float64), np.asarray(J, np.float64), np.asarray(solved, bool), lower, upper)
        state = LaneState(*(np.array(a) for a in jax.device_get(new)))
        running = np.flatnonzero(busy & (state.status == int(LaneStatus.RUNNING)))
        if park is None and running.size:
            park = state.x[running[0]].copy()
        # Only the lanes whose start ended need the host (a loop over every lane cost ~2 us each).
        for lane in np.flatnonzero(busy & (state.status >= int(LaneStatus.GTOL))):
            status = LaneStatus(int(state.status[lane]))
            i = int(owner[lane])
            if status == LaneStatus.FAILED_START and tried[i] < attempts[i] and replace is not None:
                tried[i] += 1
                x0s[i] = np.asarray(replace(i, int(tried[i])), dtype=np.float64)
                load(int(lane), x0s[i], fresh=False)
                continue
            failed = status == LaneStatus.FAILED_START
            cost = math.inf if failed else float(state.cost[lane])
            best = min(best, cost)
            results[i] = LaneResult(i, x0s[i].copy(), (x0s[i] if failed else state.x[lane]).copy(), cost, status,
                                    MESSAGES[status], int(state.evaluations[lane]), int(state.accepted[lane]),
                                    int(state.failed[lane]), int(tried[i]), time.perf_counter() - began[lane],
                                    int(lane))  # fmt: skip
            owner[lane] = -1
            state.status[lane] = int(LaneStatus.EMPTY)
            state.trial[lane] = state.x[lane] if not failed else (park if park is not None else state.trial[lane])
        ended_log.append(sum(r is not None for r in results))
        if on_iteration is not None:
            on_iteration(ended_log[-1], N, best)
    return LanesRun(tuple(results), tuple(active_log), tuple(ended_log))
