"""``ds.inference.multistart``: a multistart fit as a campaign, one ``checkpointed_map`` task per start.

The start points are those of ``fit`` (a scrambled Sobol' stream: start ``i`` depends on
``(seed, i)`` alone, whatever the number of starts), so a rerun with the same ledger finds the same
tasks (``start-0000``, ``start-0001``, ...), keeps the starts already finished and runs the others
(a rerun with more starts keeps the first ones and runs the new ones); the best start is then the fit
(``FitResult.from_starts``: standard errors from the Gauss-Newton Hessian there). The numerical part
(``run_start``: one start, with the replacement of a start point that fails to solve) lives in
``diffsoup.inference``; this driver is re-exported there lazily, as ``checkpointed_map`` is.

It is the one multistart campaign: ``diffsoup campaign`` (``workflows.campaign_study``) runs its
starts through :func:`plan_starts`, :func:`run_starts` and :func:`starts_of` too, with a study
file's factory and its own entries in the items (``tags``). Tasks lower their study once per
process, through the process's cache (:mod:`._lowered_cache`).

With the batched optimizer (``method="batched"`` or a ``BatchedTrustRegion``) a task is a block of
starts instead (``block-0000``, ...: :mod:`._start_blocks`), run as the lanes of one program per
iteration on its worker; the host gathers every block's end states and polishes the best distinct
optima with fides (:func:`fit_of`).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..inference import AbstractLoweredStudy, FitResult, StartResult
from ..inference.fitting._batched_fit import lowered_platform, polish_ends
from ..inference.fitting._batched_trust_region import BatchedTrustRegion
from ..inference.fitting._fit import DEFAULT_METHOD, optimizer_of
from ..inference.fitting._run_start import run_start
from ..inference.fitting._hierarchical import AnalyticParameters
from ..inference.fitting._optimizers import AbstractOptimizer
from ..inference.fitting._starts import replacement_point, start_points
from ..store import LedgerConflictError
from ._analytic_memo import analytic_once, remember_analytic
from ._campaign import checkpointed_map
from ._lowered_cache import fingerprint_of, lowered_from
from ._start_blocks import (
    BLOCK_KEYS,
    BlockTask,
    block_items,
    block_starts,
    check_starts_per_block,
    conflict_detail,
    recorded_blocks,
)
from ._tasks import CampaignResult
from ..inference import window_solves
from ..inference.fitting._batched_fit import batched_result

# What an item of a start holds besides its tags.
ITEM_KEYS = ("task_id", "index", "x0", "optimizer", "analytic")


def start_task_id(index: int) -> str:
    """The ``task_id`` of start ``index``: ``start-0000``, ``start-0001``, ..."""
    return f"start-{index:04d}"


class StartTask:
    """A campaign task: one start of a multistart fit (the item carries its point and index).

    Args:
        lowered: the lowered study, or a picklable zero-argument factory returning one (lowered
            once per worker process, in the process's cache under the factory's fingerprint).
        optimizer: the optimizer of each start.
        seed, resample_failed_starts: as for ``fit`` (replacements of a failing start point).
        analytic: the names of the parameters optimized analytically at each evaluation (as the
            driver found them; empty for none).

    Its result (JSON) holds the :class:`StartResult`'s fields and where it ran: ``window_solves``
    (window-start solves this task did), ``built_here`` (whether it lowered the study), ``host``,
    ``pid`` and ``slurm_job``.
    """

    def __init__(self, lowered: AbstractLoweredStudy | Callable[[], AbstractLoweredStudy], optimizer: AbstractOptimizer,
                 seed: int, resample_failed_starts: int, analytic: Sequence[str] = ()):  # fmt: skip
        self.lowered, self.optimizer = lowered, optimizer
        self.seed, self.resample = int(seed), int(resample_failed_starts)
        self.analytic = tuple(analytic)
        # Computed here, where the task is made: the workers get it with the task.
        self.fingerprint = None if isinstance(lowered, AbstractLoweredStudy) else fingerprint_of(lowered)

    def __call__(self, item: Mapping[str, Any]) -> dict:
        solves_before = window_solves()
        low, built = lowered_from(self.lowered, self.fingerprint)
        index = int(item["index"])
        analytic = analytic_once(low, self.analytic)
        s = run_start(low, self.optimizer, np.asarray(item["x0"], dtype=np.float64),
                      replace=lambda j: replacement_point(low, self.seed, index, j), attempts=self.resample,
                      analytic=analytic)  # fmt: skip
        return {"x0": s.x0, "x": s.x, "objective": s.objective if np.isfinite(s.objective) else None,
                "success": s.success, "message": s.message, "n_evaluations": s.n_evaluations,
                "n_iterations": s.n_iterations, "seconds": s.seconds, "failures": [list(f) for f in s.failures],
                "resampled": s.resampled, "window_solves": window_solves() - solves_before, "built_here": built,
                "host": os.uname().nodename, "pid": os.getpid(), "slurm_job": os.environ.get("SLURM_JOB_ID")}  # fmt: skip


def start_of(record: Mapping[str, Any]) -> StartResult:
    """The :class:`StartResult` of a task's JSON result."""
    objective = float("inf") if record["objective"] is None else float(record["objective"])
    return StartResult(np.asarray(record["x0"], dtype=np.float64), np.asarray(record["x"], dtype=np.float64), objective,
                       bool(record["success"]), str(record["message"]), int(record["n_evaluations"]),
                       int(record["n_iterations"]), float(record["seconds"]), tuple(tuple(f) for f in record["failures"]),
                       int(record.get("resampled", 0)))  # fmt: skip


@dataclasses.dataclass(frozen=True)
class StartPlan:
    """A multistart campaign before it runs: its items, its task, and what the driver found.

    Attributes:
        lowered: the driver's lowered study (the factory's, from this process's cache).
        items: one item per start, in start order; for the batched optimizer one per block of
            starts (:mod:`._start_blocks`).
        task: the :class:`StartTask`, or the :class:`~._start_blocks.BlockTask`.
        optimizer: the optimizer of each start.
        analytic: the names of the parameters optimized analytically (empty for none; for the
            batched optimizer, in the polish only).
        found: those parameters as found (``AnalyticParameters``, or None).
    """

    lowered: AbstractLoweredStudy
    items: list[dict]
    task: StartTask | BlockTask
    optimizer: AbstractOptimizer
    analytic: tuple[str, ...]
    found: AnalyticParameters | None = None

    @property
    def blocks(self) -> bool:
        """Whether the tasks are blocks of starts (the batched optimizer)."""
        return isinstance(self.task, BlockTask)


def plan_starts(lowered: AbstractLoweredStudy | Callable[[], AbstractLoweredStudy], *, starts: int, seed: int,
                method: str | AbstractOptimizer, max_nfev: int | None, resample_failed_starts: int,
                hierarchical: bool | Sequence[str] | None, tags: Mapping[str, Any] | None = None,
                starts_per_block: int | None = None, ledger_path: str | os.PathLike | None = None,
                platform: str | None = None) -> StartPlan:  # fmt: skip
    """The items and task of a multistart campaign (arguments as for :func:`multistart`; for blocks
    of starts, ``ledger_path``'s accepted blocks keep their ranges as the starts grow; ``platform``:
    the JAX platform the blocks run on, which sizes them where neither ``starts_per_block`` nor the
    optimizer's ``lanes`` does; None: the study's as lowered in this process).

    Raises:
        ValueError: for a start count below 1, tags that would replace an item's own entries, or
            ``starts_per_block`` that is not a positive count or is given for another optimizer.
    """
    if isinstance(starts, bool) or int(starts) < 1:
        raise ValueError(f"multistart: starts={starts!r} must be a positive count.")
    optimizer = optimizer_of(method, max_nfev=max_nfev)
    batched = isinstance(optimizer, BatchedTrustRegion)
    if starts_per_block is not None and not batched:
        raise ValueError(f"multistart: starts_per_block={starts_per_block!r} applies to method='batched' (blocks of starts "
                         f"as lanes), not to {optimizer.name!r}, whose tasks are one start each.")  # fmt: skip
    tags = dict(tags or {})
    own = BLOCK_KEYS if batched else ITEM_KEYS
    taken = sorted(set(tags) & set(own))
    if taken:
        raise ValueError(f"multistart: tags {taken} are entries every {'block' if batched else 'start'}'s item has "
                         f"already ({list(own)}); give the tags other names.")  # fmt: skip
    task = BlockTask(lowered, optimizer) if batched else StartTask(lowered, optimizer, seed, resample_failed_starts)
    low, _ = lowered_from(lowered, task.fingerprint)  # a factory's study is the tasks' in this process
    found = AnalyticParameters.find(low, hierarchical) if hierarchical is None or hierarchical else None
    analytic = list(found.names) if found is not None else []
    remember_analytic(low, analytic, found)  # tasks run in this process on low find nothing again
    task.analytic = tuple(analytic)
    if batched:  # the lanes optimize noise levels analytically, the polish every analytic parameter
        per_block = check_starts_per_block(starts_per_block, optimizer, platform or lowered_platform(low))
        recorded = recorded_blocks(ledger_path, seed=int(seed), starts_per_block=per_block, optimizer=optimizer)
        items = block_items(low, optimizer, starts=int(starts), seed=int(seed), starts_per_block=per_block,
                            resample_failed_starts=int(resample_failed_starts), tags=tags, recorded=recorded,
                            analytic=analytic)  # fmt: skip
        return StartPlan(low, items, task, optimizer, tuple(analytic), found)
    points = start_points(low, int(starts), int(seed))
    # Tasks without analytic parameters carry no such entry, as before there were any: earlier ledgers resume.
    items = [{"task_id": start_task_id(i), "index": i, "x0": [float(v) for v in p], "optimizer": repr(optimizer),
              **({"analytic": analytic} if analytic else {}), **tags} for i, p in enumerate(points)]  # fmt: skip
    return StartPlan(low, items, task, optimizer, tuple(analytic), found)


def run_starts(plan: StartPlan, ledger_path: str | os.PathLike | None, **campaign_options: Any) -> CampaignResult:
    """Run the plan's starts with ``checkpointed_map`` (``campaign_options`` as there); without a
    ledger path, on a throw-away ledger.

    Raises:
        diffsoup.store.LedgerConflictError: as ``checkpointed_map``; for blocks of starts, naming
            the settings that changed (``seed``, ``starts_per_block``, the optimizer's options).
    """
    if ledger_path is None:
        with tempfile.TemporaryDirectory(prefix="diffsoup-starts-") as tmp:
            return checkpointed_map(plan.task, plan.items, ledger_path=os.path.join(tmp, "starts.json"),
                                    **campaign_options)  # fmt: skip
    try:
        return checkpointed_map(plan.task, plan.items, ledger_path=ledger_path, **campaign_options)
    except LedgerConflictError as exc:
        detail = conflict_detail(ledger_path, plan.items) if plan.blocks else ""
        if not detail:
            raise
        raise LedgerConflictError(f"{exc} For this batched multistart: {detail}; rerun with those settings to "
                                  "resume.") from exc  # fmt: skip


def ends_of(plan: StartPlan, campaign: CampaignResult) -> list[StartResult]:
    """The finished starts of a campaign, in start order, as their tasks ended them (for blocks:
    the batched phase's end states, before any polish)."""
    if plan.blocks:
        return [start_of(record) for _, record in block_starts(plan.items, campaign.results)]
    return [start_of(campaign.results[item["task_id"]]) for item in plan.items if item["task_id"] in campaign.results]


def starts_of(plan: StartPlan, campaign: CampaignResult) -> list[StartResult]:
    """The finished starts of a campaign, in start order; for blocks of starts, their end states
    with the best distinct optima polished (``polish_ends``: the fit's starts, as :func:`fit_of`'s)."""
    ends = ends_of(plan, campaign)
    if not plan.blocks or not ends:
        return ends
    return polish_ends(plan.lowered, plan.optimizer, ends, analytic=plan.found)[0]


def fit_of(plan: StartPlan, campaign: CampaignResult, *, seconds: float) -> FitResult:
    """The :class:`FitResult` of a campaign's finished starts (``seconds``: its time so far); for
    blocks of starts, with the polish and the distinct optima (``batched_result``).

    Raises:
        RuntimeError: if no start finished (naming the first failures) or every start failed.
    """
    ends = ends_of(plan, campaign)
    if not ends:
        errors = "; ".join(str(r.error) for r in list(campaign.failures.values())[:3])
        raise RuntimeError(f"multistart: every {'block' if plan.blocks else 'start'} failed ({errors}).")
    if plan.blocks:
        return batched_result(plan.lowered, plan.optimizer, ends, seconds=seconds, analytic=plan.found)
    return FitResult.from_starts(plan.lowered, ends, method=plan.optimizer.name, seconds=seconds,
                                 analytic=list(plan.analytic))  # fmt: skip


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
    tags: Mapping[str, Any] | None = None,
    starts_per_block: int | None = None,
    **campaign_options: Any,
) -> FitResult:
    """A multistart fit whose starts are campaign tasks (resumable from ``ledger_path``).

    Args:
        lowered: the lowered study, or a picklable factory ``() -> lowered study`` for
            ``execution="dask"`` (each worker process lowers it once; a ``fingerprint`` string
            attribute of the factory, where it has one, names its study in the workers' cache).
        starts, seed, method, max_nfev, resample_failed_starts, hierarchical: as for
            ``ds.inference.fit`` (by default the noise levels that qualify are optimized
            analytically; the parameters found are part of each task, so a rerun with another
            choice is a ledger conflict).
        ledger_path: the JSON ledger; None runs the starts with a throw-away ledger.
        resume, on_conflict, execution, progress, campaign_options: as for ``checkpointed_map``.
        tags: more entries of every start's item (JSON values: a study's digest, a setting), so
            that a rerun with other values is a ledger conflict rather than a resume.
        starts_per_block: for ``method="batched"`` (or a ``BatchedTrustRegion``): the starts of
            one task (``block-0000``, ...), run as the optimizer's lanes on one worker; None: the
            optimizer's ``lanes`` (where None too: 1,024 when the study lowered here runs on a GPU,
            else 16; give it for GPU workers driven from a CPU). Part of each block's item: a rerun
            with another value (or another seed) is a ledger conflict naming it; a rerun with more
            starts keeps the accepted blocks (a partial last one too) and adds blocks after them. The
            host then polishes the best distinct optima of all blocks with fides (in this process,
            with ``hierarchical``'s parameters).

    Returns:
        The :class:`~diffsoup.inference.FitResult` of the finished starts (for ``"batched"``:
        every start's end state, the best distinct ones polished, and ``optima``).

    Raises:
        ValueError: for a start count below 1, tags named as an item's own entries, or a bad
            ``starts_per_block`` (or one given for another method).
        RuntimeError: if every start (or block) failed.
        diffsoup.store.LedgerConflictError: for a ledger of other starts (for blocks: naming the
            changed ``seed``, ``starts_per_block`` or optimizer options).
    """
    plan = plan_starts(lowered, starts=starts, seed=seed, method=method, max_nfev=max_nfev,
                       resample_failed_starts=resample_failed_starts, hierarchical=hierarchical, tags=tags,
                       starts_per_block=starts_per_block, ledger_path=ledger_path if resume else None)  # fmt: skip
    t0 = time.perf_counter()
    campaign = run_starts(plan, ledger_path, resume=resume, on_conflict=on_conflict, execution=execution,
                          progress=progress, **campaign_options)  # fmt: skip
    return fit_of(plan, campaign, seconds=time.perf_counter() - t0)
