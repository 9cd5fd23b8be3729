"""``fit(method="batched")``: the starts as lanes of one program per iteration, then the best
distinct end points finished by fides.

1. **Batched phase.** Every start runs :class:`~diffsoup.inference.BatchedTrustRegion` (trust region
   reflective least squares) with ``lanes`` starts at a time: each iteration evaluates the residuals
   and Jacobians of all lanes' trial points in one program
   (``AbstractLoweredStudy.residuals_and_jacobians``) and advances every lane in one jitted step
   (:func:`~diffsoup.inference.fitting._batched_trust_region.run_lanes`). With ``fit``'s default
   analytic parameters, noise levels alone, the lanes see the objective fides sees: the noise
   levels' optimum is found in closed form from each point's residuals, on the device, and the
   lanes move the other coordinates (:mod:`~diffsoup.inference.fitting._lane_noise`). With offsets
   or scaling factors analytic as well (``hierarchical=True``) or none (``False``), the lanes move
   every coordinate of theta (the noise levels' own residuals, :mod:`diffsoup.inference._terms`,
   keep the problem a least-squares one) and only the polish optimizes them analytically.
2. **Distinct optima.** The end points are clustered (:func:`distinct_optima`): two ends belong to
   one optimum when their objectives differ by at most ``CONVERGED`` (1e-3, the PEtab benchmarks'
   criterion) and their coordinates by at most ``SAME_POINT`` of each bounded coordinate's range
   (``SAME_POINT`` in theta's units where a bound is infinite).
3. **Polish.** The best end point of each of the ``polish`` best optima of distinct objectives (an
   optimum within ``CONVERGED`` of one already polished, elsewhere in a flat valley, is skipped: on
   Bruno three of 354.8693 were polished before), and of up to ``polish_unfinished`` more whose
   start did not converge in the lanes, below every converged end (:func:`polish_heads`), is
   finished, all of them at the same time (one thread each: a polish's single-point programs leave
   the rest of the machine idle), by ``polish_method`` (fides with the Gauss-Newton Hessian by
   default, through ``fit``'s per-start path ``run_start``, with ``fit``'s analytic parameters: by
   default the noise levels). That start's result becomes the polished one (its evaluations,
   iterations and time added, its message extended); the other starts keep their batched end state,
   and the final end states are clustered again into ``optima``. A start counts as having reached an
   optimum by its own end state only: an unpolished start that stopped in the basin of the best
   optimum (the batched phase stops early on stalls, ``stall_rtol``) but more than 1e-3 above it is
   not counted there.

The phases are separate functions: :func:`run_block` (step 1 on a block of starts: ``fit`` runs
all its starts as one block, ``multistart(method="batched")`` each block as a campaign task, on a
worker) and :func:`polish_ends` (steps 2 and 3, on the host, over every block's end states);
:func:`batched_result` makes the ``FitResult`` of both.

The result is a :class:`~diffsoup.inference.FitResult` whose ``starts`` hold every start's end
state, and whose ``optima`` list the distinct optima (:class:`Optimum`: objective, point, the starts
that ended there), best first.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import time
from typing import Any, NamedTuple, Sequence

import jax
import numpy as np

from ..objective._abstract_lowered import AbstractLoweredStudy
from ..objective._lowered_study import LoweredStudy
from ._batched_trust_region import EXPLORE_STEPS_FACTOR, EXPLORE_STEPS_FLOOR, BatchedTrustRegion, run_lanes
from ._fides import Fides
from ._lane_noise import LaneNoise
from ._results import CONVERGED, FitResult, StartResult
from ._run_start import run_start
from ._starts import replacement_point

# Polishes run at once (:func:`polish_points`), each taking about one CPU core: one thread per core,
# and at least this many (a small machine's threads share its cores; the 11 polishes a budget-bound
# problem gets by default then run in two rounds at most).
POLISH_THREADS = 8
SAME_POINT = 1e-2  # ends closer than this share of each coordinate's range (and within CONVERGED) are one optimum


@dataclasses.dataclass(frozen=True)
class Optimum:
    """A distinct end point of a multistart fit and the starts that ended there.

    Attributes:
        objective: the best objective of its starts (after the polish, where polished).
        theta: the point of that objective (scaled).
        starts: indices of the starts that ended at it (within ``CONVERGED`` in objective and
            ``SAME_POINT`` in coordinates of its best start's batched end).
        polished: whether its best start was finished by the polish method.
    """

    objective: float
    theta: np.ndarray
    starts: tuple
    polished: bool = False

    @property
    def count(self) -> int:
        """How many starts ended at it."""
        return len(self.starts)


def distinct_optima(objectives: Sequence[float], points: np.ndarray, lower: np.ndarray, upper: np.ndarray, *,
                    tolerance: float = CONVERGED, same_point: float = SAME_POINT) -> list[list[int]]:  # fmt: skip
    """The finite ends grouped into distinct optima, best first: each end (in order of objective)
    joins the first group whose best end is within ``tolerance`` in objective and within
    ``same_point`` of the range (``same_point`` itself for an unbounded coordinate) in every
    coordinate; otherwise it starts a group. Returns the groups' start indices, best first."""
    objectives = np.asarray(objectives, dtype=np.float64)
    points = np.asarray(points, dtype=np.float64)
    width = np.where(np.isfinite(upper - lower), np.asarray(upper) - np.asarray(lower), 1.0)
    groups: list[list[int]] = []
    for i in sorted(np.flatnonzero(np.isfinite(objectives)).tolist(), key=lambda j: (objectives[j], j)):
        for group in groups:
            head = group[0]
            if (objectives[i] - objectives[head] <= tolerance
                    and np.all(np.abs(points[i] - points[head]) <= same_point * width)):  # fmt: skip
                group.append(i)
                break
        else:
            groups.append([i])
    return groups


class Block(NamedTuple):
    """The end states of a block of starts (:func:`run_block`).

    Attributes:
        starts: one :class:`StartResult` per start, in the block's order.
        statuses: the :class:`~diffsoup.inference.LaneStatus` name that ended each start.
    """

    starts: list
    statuses: tuple


def run_block(low: AbstractLoweredStudy, optimizer: BatchedTrustRegion, points: np.ndarray, replaceable: Sequence[bool],
              *, seed: int, first: int = 0, first_drawn: int = 0, attempts: int = 0, progress: bool = False,
              analytic: Any = None) -> Block:  # fmt: skip
    """The batched phase alone: every start of ``points`` run to its end, ``optimizer.lanes`` at a
    time (None: as many as :meth:`BatchedTrustRegion.lanes_on` gives for ``low``'s platform; no
    polish). ``fit`` runs all its starts as one block; a multistart campaign
    (``multistart(method="batched")``) runs each block of starts as a task, on a worker.

    Args:
        low: the lowered study.
        optimizer: the options.
        points: ``(N, n_theta)`` start points (scaled, within the bounds).
        replaceable: per start, whether a start point that fails to solve is replaced (drawn ones).
        seed: of the replacements.
        first: the index in the start stream of ``points[0]`` (a block's first start).
        first_drawn: index among ``points`` of the first drawn start (1 after an ``x0``), so that
            start ``first + i - first_drawn`` of the stream gets the replacements of its own index.
        attempts: most replacements of a drawn start point.
        progress: a progress bar (tqdm) over the iterations: starts ended, best objective,
            iterations and seconds per iteration.
        analytic: ``fit``'s analytic parameters: noise levels alone are optimized in closed form
            in the lanes (:class:`~diffsoup.inference.fitting._lane_noise.LaneNoise`), which then
            move the other coordinates; otherwise (none, or offsets and scaling factors too) the
            lanes move every coordinate.

    Returns:
        A :class:`Block`: one :class:`StartResult` per start, in the order of ``points`` (a start
        point that failed to solve ends with objective ``inf`` at its start point), and the
        :class:`~diffsoup.inference.LaneStatus` name that ended each.
    """
    optimizer = dataclasses.replace(optimizer, lanes=optimizer.lanes_on(lowered_platform(low)))
    scale, offset = float(low.scale), float(low.offset)
    max_steps = lane_step_budget(low, optimizer, len(points))
    noise = LaneNoise.of(low, analytic)
    moves = np.arange(low.problem.n_theta) if noise is None else noise.free  # the coordinates the lanes move

    def evaluate(x, active):
        thetas = x if noise is None else noise.thetas(x)
        r, J, failures = low.residuals_and_jacobians(thetas, active, max_steps=max_steps)
        if noise is not None:
            _, r, J = noise.moved(thetas, r, J)
        return r, J, np.array([not f for f in failures])

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(points), desc="fit (batched)", unit="start", dynamic_ncols=True)

    iterations, began = 0, time.perf_counter()

    def on_iteration(ended: int, total: int, best_cost: float) -> None:
        nonlocal iterations
        iterations += 1
        if bar is not None:  # iterations and their pace: where a lock-step program's time goes
            bar.update(ended - bar.n)
            bar.set_postfix(best=f"{2.0 * scale * best_cost + offset:.6g}", iterations=iterations,
                            s_per_iteration=f"{(time.perf_counter() - began) / iterations:.3g}", refresh=True)  # fmt: skip

    try:
        run = run_lanes(optimizer, evaluate, np.asarray(points, dtype=np.float64)[:, moves], low.lower[moves],
                        low.upper[moves], replace=lambda i, j: replacement_point(low, seed, first + i - first_drawn, j)[moves],
                        attempts=[attempts if r else 0 for r in replaceable], on_iteration=on_iteration)  # fmt: skip
    finally:
        if bar is not None:
            bar.close()
    x0s = np.stack([e.x0 for e in run.results])
    ends = np.stack([e.x for e in run.results])
    notes = [""] * len(ends)
    if noise is not None:  # full points: the start point as drawn, the end with its noise levels' optimum
        x0s = np.array([points[i] if not e.resampled else replacement_point(low, seed, first + i - first_drawn, e.resampled)
                        for i, e in enumerate(run.results)], dtype=np.float64)  # fmt: skip
        ended = np.array([math.isfinite(e.cost) for e in run.results])
        at_optimum, solved = noise.optimum(low, ends[ended], min(int(optimizer.lanes), len(points)))
        ends = noise.thetas(ends)
        ends[ended] = at_optimum
        for i in np.flatnonzero(ended)[~solved]:
            notes[i] = " (its end point did not solve again: its noise levels are the nominal ones)"
    starts = [StartResult(x0s[i], ends[i], 2.0 * scale * e.cost + offset if math.isfinite(e.cost) else math.inf,
                          e.status.converged, e.message + (f" ({e.failed} trial points failed to solve)" if e.failed else "")
                          + notes[i], e.evaluations, e.accepted, e.seconds, (), e.resampled)
              for i, e in enumerate(run.results)]  # fmt: skip
    return Block(starts, tuple(e.status.name for e in run.results))


def lowered_platform(low: AbstractLoweredStudy) -> str:
    """The JAX platform a lowered study's programs run on by default (``"gpu"``, ``"cpu"``): a
    ``LoweredStudy``'s placement, else (a study evaluated elsewhere, through Dask) JAX's default
    backend here."""
    platform = getattr(low, "platform", None)
    return platform if isinstance(platform, str) else jax.default_backend()


def lane_step_budget(low: AbstractLoweredStudy, optimizer: BatchedTrustRegion, starts: int = 1) -> int | None:
    """The lanes' step budget per experiment solve (``BatchedTrustRegion.max_steps``; None: the
    study's own): the one given, else :data:`EXPLORE_STEPS_FACTOR` times the most steps of an
    experiment at the nominal point, within ``[EXPLORE_STEPS_FLOOR, SolverOptions.max_steps]``.
    None where the nominal point does not solve, or the study is not a ``LoweredStudy`` (its points
    are not lanes of one program). The nominal point is evaluated as the one wanted lane of the
    program the lanes will run (``min(optimizer.lanes, starts)`` of them, as :func:`run_lanes`
    has), which compiles no program for this alone."""
    if optimizer.max_steps is not None:
        return int(optimizer.max_steps)
    if not isinstance(low, LoweredStudy):
        return None
    study_budget = int(low.problem.solver.max_steps)
    lanes = max(1, min(int(optimizer.lanes or 1), int(starts)))
    low.residuals_and_jacobians(np.tile(np.asarray(low.nominal, dtype=np.float64), (lanes, 1)),
                                np.arange(lanes) == 0)  # fmt: skip
    steps = low.steps[list(low.experiment_indices)]
    if low.last_failures or steps.size == 0 or np.any(steps < 0):
        return None
    budget = max(EXPLORE_STEPS_FLOOR, EXPLORE_STEPS_FACTOR * int(steps.max()))
    return budget if budget < study_budget else None


def polish_ends(low: AbstractLoweredStudy, optimizer: BatchedTrustRegion, starts: Sequence[StartResult], *,
                analytic: Any = None, progress: bool = False) -> tuple[list[StartResult], tuple[Optimum, ...]]:  # fmt: skip
    """Steps 2 and 3 of the module's docstring: the batched end states clustered into distinct
    optima, the best end of each of the ``optimizer.polish`` best ones (of distinct objectives, and
    of up to ``optimizer.polish_unfinished`` unconverged ones more: :func:`polish_heads`) finished
    by ``optimizer.polish_method`` (fides by default, with ``analytic``), and the final end states
    clustered again. The polishes run at the same time, one thread each
    (:func:`polish_points`); ``progress``: a progress bar over them.

    Returns:
        ``(starts, optima)``: every start's end state (the polished ones replaced, in the order
        given) and the distinct optima of those, best first.
    """
    starts = list(starts)
    ends = np.stack([s.x for s in starts])
    groups = distinct_optima([s.objective for s in starts], ends, low.lower, low.upper)
    polisher = optimizer.polish_method if optimizer.polish_method is not None else Fides()
    heads = polish_heads(starts, groups, optimizer.polish, optimizer.polish_unfinished)
    polished = polish_points(low, polisher, [starts[i].x for i in heads], analytic=analytic, progress=progress)
    for i, end in zip(heads, polished):
        head = starts[i]
        better = bool(np.isfinite(end.objective) and end.objective <= head.objective)
        starts[i] = dataclasses.replace(
            head, x=end.x if better else head.x, objective=end.objective if better else head.objective,
            success=end.success if better else head.success,
            message=f"{head.message}; polished by {polisher.name}: {end.message}",
            n_evaluations=head.n_evaluations + end.n_evaluations, n_iterations=head.n_iterations + end.n_iterations,
            seconds=head.seconds + end.seconds, failures=end.failures)  # fmt: skip
    # The distinct optima of the final end states (polished ends may have met).
    final = distinct_optima([s.objective for s in starts], np.stack([s.x for s in starts]), low.lower, low.upper)
    optima = tuple(Optimum(float(starts[g[0]].objective), np.asarray(starts[g[0]].x), tuple(g), g[0] in heads)
                   for g in final)  # fmt: skip
    return starts, optima


def polish_heads(starts: Sequence[StartResult], groups: Sequence[Sequence[int]], polish: int,
                 unfinished: int) -> list[int]:  # fmt: skip
    """The starts to polish, given the batched end states and their distinct optima (``groups``,
    best first, as :func:`distinct_optima` gives them): the best end of each of the ``polish`` best
    optima, then (where ``polish > 0``) of up to ``unfinished`` more whose best end did not
    converge in the lanes (``success`` False: its evaluations spent, or its solves failing) and lies
    below every converged end. An optimum within ``CONVERGED`` in objective of one already chosen
    (the same objective elsewhere in a flat valley) is skipped: polished once.

    Returns:
        The chosen starts' indices, best first.
    """
    below = min((s.objective for s in starts if s.success and math.isfinite(s.objective)), default=math.inf)
    heads, levels, extra = [], [], 0
    for group in groups:
        head = starts[group[0]]
        if len(heads) >= polish and (polish == 0 or extra == unfinished or head.objective >= below):
            break
        if any(abs(head.objective - level) <= CONVERGED for level in levels):
            continue
        extra += len(heads) >= polish  # below every converged end: a start that did not converge
        levels.append(head.objective)
        heads.append(group[0])
    return heads


def polish_points(low: AbstractLoweredStudy, polisher: Any, points: Sequence[np.ndarray], *, analytic: Any = None,
                  progress: bool = False, threads: int | None = None) -> list[StartResult]:  # fmt: skip
    """``run_start(low, polisher, x)`` from each of ``points``, at most ``threads`` at a time (None:
    one per CPU core, at least :data:`POLISH_THREADS`).

    A polish is one start after another of single-point evaluations, each a short program that
    leaves most of the machine idle (one CPU core; on a GPU machine the host's CPU, see
    ``ds.lower(device="auto")``), so the polishes run in threads: the compiled programs release
    the interpreter lock while they run. Each polish's numbers are its own (its own
    ``StartObjective``, the same compiled programs), so the results equal one after the other's.

    Returns:
        One :class:`StartResult` per point, in their order.
    """
    if not points:
        return []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(points), desc=f"polish ({getattr(polisher, 'name', 'optimizer')})", unit="optimum",
                   dynamic_ncols=True)  # fmt: skip
    try:
        if threads is None:
            threads = max(POLISH_THREADS, os.cpu_count() or 1)
        with concurrent.futures.ThreadPoolExecutor(max(1, min(int(threads), len(points))),
                                                   thread_name_prefix="diffsoup-polish") as pool:  # fmt: skip
            futures = [pool.submit(run_start, low, polisher, x, analytic=analytic) for x in points]
            for done in concurrent.futures.as_completed(futures):
                if bar is not None:
                    bar.update(1)
                    end = done.result()
                    bar.set_postfix(objective=f"{end.objective:.6g}", refresh=True)
            return [f.result() for f in futures]
    finally:
        if bar is not None:
            bar.close()


def batched_result(low: AbstractLoweredStudy, optimizer: BatchedTrustRegion, starts: Sequence[StartResult], *,
                   seconds: float, analytic: Any = None, progress: bool = False) -> FitResult:  # fmt: skip
    """The :class:`FitResult` of batched end states: :func:`polish_ends` (``progress``: its bar),
    then the best start's result with ``optima``.

    Raises:
        RuntimeError: if every start failed.
    """
    t0 = time.perf_counter()
    starts, optima = polish_ends(low, optimizer, starts, analytic=analytic, progress=progress)
    in_lanes = LaneNoise.of(low, analytic) is not None
    result = FitResult.from_starts(low, starts, method=optimizer.name, seconds=seconds + time.perf_counter() - t0,
                                   analytic=analytic.names if analytic is not None and (optimizer.polish or in_lanes)
                                   else ())  # fmt: skip
    return dataclasses.replace(result, optima=optima)


def batched_fit(low: AbstractLoweredStudy, optimizer: BatchedTrustRegion, points: np.ndarray, replaceable: Sequence[bool],
                *, seed: int, first_drawn: int, attempts: int, progress: bool, analytic: Any = None):  # fmt: skip
    """``fit``'s path for :class:`BatchedTrustRegion` (see the module's docstring): every start as
    one block (:func:`run_block`), then :func:`batched_result`.

    Args:
        low: the lowered study.
        optimizer: the options.
        points: ``(N, n_theta)`` start points (scaled, within the bounds).
        replaceable: per start, whether a start point that fails to solve is replaced (drawn ones).
        seed: of the replacements; first_drawn: index of the first drawn start among ``points``
            (1 after an ``x0``), so that a draw's replacements do not depend on ``x0``.
        attempts: most replacements of a drawn start point.
        progress: a progress bar (tqdm) over the iterations: starts ended, best objective.
        analytic: ``fit``'s analytic parameters, for the lanes (:func:`run_block`) and the polish.

    Returns:
        A ``FitResult`` with ``optima``.
    """
    began = time.perf_counter()
    starts = run_block(low, optimizer, points, replaceable, seed=seed, first_drawn=first_drawn, attempts=attempts,
                       progress=progress, analytic=analytic).starts  # fmt: skip
    return batched_result(low, optimizer, starts, seconds=time.perf_counter() - began, analytic=analytic,
                          progress=progress)
