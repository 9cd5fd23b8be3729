"""``diffsoup campaign``: a multistart campaign on a study file, resumable from its JSON ledger.

Each start is a task of ``ds.inference.multistart``'s campaign (:mod:`diffsoup.distributed._start_runs`:
the same items, task and ``start-0000`` ids), run here or on the GPU workers of a Dask cluster;
each worker lowers the study file once (its factory, :class:`StudyLowering`, is fingerprinted by
the file's path and digest). The items also carry the study's digest and the ``hierarchical``
choice, so a rerun on another version of the file, or with another choice, is a ledger conflict.

Ledgers written before the campaign ran through ``multistart`` name the starts ``start-000``,
``start-001``, ...: a rerun reads them as the same starts (:func:`read_old_start_ids`).
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ._auto_method import default_backend
from ._campaign_settings import SETTINGS_FILE, campaign_settings, check_campaign_settings, write_campaign_settings
from ._honest_answers import check_tolerance
from ._output_folder import check_output_folder
from ._study_runs import (
    StudyLowering,
    _describe,
    _explain_failed_fit,
    _finish_fit,
    _fit_entries,
    _method_label,
    _optimizer,
    _relative,
    _settings,
    _study_file,
    study_digest,
)

LEDGER = "campaign.json"
# The task ids of the campaign's starts before it ran through multistart: start-000, start-001, ...
_OLD_ID = re.compile(r"start-(\d{3,})")


def _old_item(plan_item: Mapping[str, Any], digest: str, hierarchical: Any) -> dict:
    """The item an earlier diffsoup gave the same start (its fingerprint is in old ledgers)."""
    i = plan_item["index"]
    return {"task_id": f"start-{i:03d}", "x0": plan_item["x0"], "study_digest": digest,
            "optimizer": plan_item["optimizer"], "hierarchical": hierarchical}  # fmt: skip


def read_old_start_ids(ledger_path: Path, items: Sequence[Mapping[str, Any]], digest: str, hierarchical: Any,
                       log: Callable = print) -> Path | None:  # fmt: skip
    """Rewrite a ledger whose starts have the ids of an earlier diffsoup (``start-000``) with
    today's (``start-0000``): a record of the same start as an item of ``items`` (its
    fingerprint is that of the item the earlier version made for it) gets the item's fingerprint
    and keeps its state and result, so the rerun resumes it; any other record keeps its
    fingerprint under the new id, so a rerun with other settings is a conflict as before.

    The old file is kept beside the ledger as a ``.bak``; nothing is done to a ledger without old
    ids (or that does not exist).

    Returns:
        The backup's path when the ledger was rewritten, else None.

    Raises:
        diffsoup.store.LedgerError: for a ledger that cannot be read (damaged, edited by hand).
        diffsoup.store.LedgerLockedError: if another process runs a campaign on it.
    """
    from ..store import Ledger, backup_ledger, fingerprint
    from ..store._ledger import ledger_lock

    if not ledger_path.is_file():
        return None
    with ledger_lock(ledger_path):
        ledger = Ledger.load(ledger_path)
        ids = ledger.task_ids()

        def renamed(task_id: str) -> str:
            m = _OLD_ID.fullmatch(task_id)
            new = f"start-{int(m.group(1)):04d}" if m else task_id
            return task_id if new != task_id and new in ids else new  # never over a record of today's ids

        by_new = {it["task_id"]: it for it in items}
        old_fp = {it["task_id"]: fingerprint(_old_item(it, digest, hierarchical)) for it in items}
        records: dict[str, dict] = {}
        changed = 0
        for task_id in ids:
            record, new = ledger.get(task_id), renamed(task_id)
            if new in by_new and record["fingerprint"] == old_fp[new] and _OLD_ID.fullmatch(task_id):
                record["fingerprint"] = fingerprint(by_new[new])
                changed += 1
            elif new != task_id:
                changed += 1
            record["task_id"] = new
            records[new] = record
        if not changed:
            return None
        backup = backup_ledger(ledger_path)
        Ledger(ledger_path, function=ledger.function, created=ledger.created, tasks=records).save()
    log(f"[diffsoup] {ledger_path.name} names its starts as an earlier diffsoup did (start-000, ...): read as "
        f"start-0000, ...; the file as it was is kept as {backup.name}")  # fmt: skip
    return backup


def _tasks_label(plan: Any) -> str:
    """What the campaign's tasks are: ``"20 starts"``, or ``"4 blocks of starts (1000 starts)"``."""
    n_tasks = len(plan.items)
    if not plan.blocks:
        return f"{n_tasks} starts"
    starts = sum(int(item["count"]) for item in plan.items)
    return f"{n_tasks} block{'s' if n_tasks != 1 else ''} of starts ({starts} starts)"


def check_campaign(study: Any, out: Any, *, starts: int | None = None, seed: int | None = None,
                   method: str | None = None, max_nfev: int | None = None, hessian: str | None = None,
                   hierarchical: bool | Sequence[str] | None = None) -> None:  # fmt: skip
    """What ``campaign_study`` with these arguments checks before any work: the output folder can be
    written, and a campaign already in it ran with the same settings (a rerun resumes it). The
    ``diffsoup campaign`` command calls it before its cluster starts.

    Raises:
        OutputFolderError: for an output folder that cannot be written.
        diffsoup.store.LedgerConflictError: for a campaign in ``out`` with other settings, naming
            each change (:func:`~._campaign_settings.check_campaign_settings`).
    """
    sf = _study_file(study)
    out = check_output_folder(out)
    settings = _settings(sf, method, starts, seed, max_nfev, hessian, hierarchical)
    check_campaign_settings(out, campaign_settings(settings, study_digest(sf)), LEDGER)


def campaign_study(study: Any, out: Any, *, client: Any = None, starts: int | None = None, seed: int | None = None,
                   method: str | None = None, max_nfev: int | None = None, hessian: str | None = None,
                   hierarchical: bool | Sequence[str] | None = None, resume: bool = True,
                   on_conflict: str = "error", progress: bool = True, plots: bool = True,
                   log: Callable = print, no_worker_timeout: float | None = None,
                   at_best_tolerance: float | None = None) -> dict:  # fmt: skip
    """A multistart campaign on a study file: each start is a task of ``ds.inference.multistart``'s
    campaign (a Dask task on a worker offering ``GPU=1`` when ``client`` is given, else run here),
    recorded in the ledger ``<out>/campaign.json``, so a rerun -- after a crash, a cancelled
    allocation, a lost worker -- runs only the starts not yet finished. The best start is then
    written as a fit.

    Args:
        study: the study file (a path or a loaded ``StudyFile``).
        out: the output directory (holds the ledger).
        client: a ``distributed.Client``, or None to run the starts here one after another.
        starts, seed, method, max_nfev, hessian, hierarchical: override the file's ``[fit]`` settings (as for
            :func:`fit_study`); the start points are the scrambled Sobol' sequence of ``seed``
            (point ``i`` the same for any count: a rerun with more starts keeps the finished ones
            and runs the new ones).
            A start point that fails to solve is not replaced (the start fails).
        resume, on_conflict: as for ``checkpointed_map``.
        no_worker_timeout: seconds a start may wait for a worker offering its resources; None
            reads the setting ``diffsoup.campaign.no-worker-timeout`` (60 s); ``math.inf`` waits
            for ever (as when workers come from a batch queue).
        at_best_tolerance: starts within this of the best objective count as at the best (1e-3).

    Returns:
        The summary (also in ``<out>/summary.json``), with ``campaign``: tasks accepted, failed,
        resumed from the ledger, window-start solves done in this run (here and by its tasks; 0
        when every window start came from the shared store), and the SLURM jobs that ran tasks.
        Its paths are relative to ``out``.

    Raises:
        StudyFailedError: as for :func:`fit_study`.
    """
    from ..distributed._start_runs import plan_starts, run_starts, starts_of
    from ..inference import FitResult, window_solves

    sf = _study_file(study)
    check_tolerance(at_best_tolerance)
    out = check_output_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    settings = _settings(sf, method, starts, seed, max_nfev, hessian, hierarchical)

    solves_before = window_solves()
    digest = study_digest(sf)
    now = campaign_settings(settings, digest)
    ledger = out / LEDGER
    if resume and on_conflict == "error":  # before the study is lowered: a changed setting is named
        check_campaign_settings(out, now, LEDGER)
    # The study file is lowered here through the process's cache (compiling nothing yet): it gives
    # the start points, and after the campaign the Gauss-Newton Hessian of the best start; tasks
    # run here share it. Named parameters that do not qualify for analytic optimization fail
    # here, before any ledger is written. The optimizer with its options, the study's digest and
    # the hierarchical choice are part of each item, so a rerun with another method, Hessian,
    # evaluation cap, study or choice is a ledger conflict (resume refused, --restart offered).
    # Blocks of starts (method batched) are sized for the device they run on (1,024 lanes on a GPU).
    plan = plan_starts(StudyLowering(str(sf.path.resolve()), digest), starts=settings["starts"], seed=settings["seed"],
                       method=_optimizer(settings), max_nfev=settings["max_nfev"], resample_failed_starts=0,
                       hierarchical=settings["hierarchical"], ledger_path=ledger if resume else None,
                       tags={"study_digest": digest, "hierarchical": settings["hierarchical"]},
                       platform=default_backend(client) if settings["method"] == "batched" else None)  # fmt: skip
    lowered, items = plan.lowered, plan.items
    log(f"[diffsoup] campaign on {sf.name}: {_tasks_label(plan)} ({_method_label(settings)}), "
        f"ledger {ledger}, {'on ' + _describe(client) if client is not None else 'in this process'}")  # fmt: skip
    if resume and not plan.blocks:  # blocks of starts (method batched) never had the old ids
        read_old_start_ids(ledger, items, digest, settings["hierarchical"], log)
    t0 = time.perf_counter()
    began = datetime.now(timezone.utc)
    options: dict[str, Any] = dict(resume=resume, on_conflict=on_conflict, progress=progress)
    if client is not None:
        options.update(execution="dask", client=client, no_worker_timeout=no_worker_timeout)
    # The settings go beside the ledger before the starts run (a run stopped by Ctrl-C has them);
    # beside a ledger of an earlier diffsoup, only once its fingerprints have agreed.
    checked = not ledger.is_file() or not resume or on_conflict != "error" or (out / SETTINGS_FILE).is_file()
    if checked:
        write_campaign_settings(out, now)
    campaign = run_starts(plan, ledger, **options)
    if not checked:
        write_campaign_settings(out, now)
    seconds = time.perf_counter() - t0
    done = [r for r in campaign.records if r.state == "accepted"]
    # Accepted by an earlier run: finished before this one began.
    earlier = {r.task_id for r in done if r.finished and datetime.fromisoformat(r.finished) < began}
    log(f"[diffsoup] campaign: {len(campaign.results)} of {_tasks_label(plan)} finished, "
        f"{len(campaign.failures)} failed")  # fmt: skip
    if not campaign.results:  # every task raised
        exc = RuntimeError(f"campaign: every start failed; see {ledger} (first: "
                           f"{next(iter(campaign.failures.values())).error if campaign.failures else 'none'}).")  # fmt: skip
        if campaign.failures and all("fit: every start failed" in str(r.error) for r in campaign.failures.values()):
            _explain_failed_fit(sf, exc, solve_failures=True)  # each start's solves failed, not the cluster
        raise exc
    try:
        result = FitResult.from_starts(lowered, starts_of(plan, campaign), method=settings["method"], seconds=seconds,
                                       analytic=plan.analytic)  # fmt: skip
    except RuntimeError as exc:
        _explain_failed_fit(sf, exc)
        raise
    fresh = [r.result for r in done if r.task_id not in earlier]
    solves = window_solves() - solves_before + sum(int(r.get("window_solves", 0)) for r in fresh)
    if sf.study.shooting:
        log(f"[diffsoup] window-start solves in this run: {solves}"
            + (" (every window start came from the store)" if solves == 0 else ""))
    extra = {
        "where": _describe(client) if client is not None else "in-process",
        "campaign": {
            "ledger": _relative(ledger, out), "tasks": len(items), "accepted": len(done),
            "failed": len(campaign.failures), "resumed": len(earlier),
            "window_solves": int(solves),
            "slurm_jobs": sorted({str(r["slurm_job"]) for r in campaign.results.values() if r.get("slurm_job")}),
        },
        **_fit_entries(settings),
    }  # fmt: skip
    return _finish_fit(sf, lowered, result, out, command="campaign", plots=plots, log=log, extra=extra,
                       at_best_tolerance=at_best_tolerance)
