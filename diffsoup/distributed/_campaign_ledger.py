"""A campaign's side of its JSON ledger: the plan a runner carries out (:class:`CampaignPlan`),
opening the ledger for it (resume, conflicts, backups), and the state machine that applies each
task's start and outcome to the ledger (:class:`CampaignLedger`)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..store._ledger import (
    LEDGER_VERSION,
    Ledger,
    LedgerConflictError,
    LedgerError,
    backup_ledger,
    ledger_lock,
    new_record,
    now_iso,
    remove_stale_temporaries,
    unwritable,
)
from ._dashboard_publish import publish_campaign
from ._progress import ProgressBar
from ._tasks import CampaignResult, TaskOutcome, TaskRecord, qualified_name

logger = logging.getLogger("diffsoup.campaign")

CONFLICT_POLICIES = ("error", "restart")


@dataclasses.dataclass(frozen=True)
class CampaignPlan:
    """What a campaign runs, checked by ``checkpointed_map``; every runner carries one out.

    Attributes:
        fn: the task function.
        items: ``{task_id: item}`` in item order.
        fingerprints: ``{task_id: fingerprint}`` of the items.
        ledger_path: the ledger file.
        resume: keep the ledger's accepted tasks (else start anew, the old ledger kept as .bak).
        on_conflict: ``"error"`` or ``"restart"`` for a ledger that recorded other items.
        progress: draw a progress bar on stderr.
    """

    fn: Callable[[Any], Any]
    items: Mapping[str, Any]
    fingerprints: Mapping[str, str]
    ledger_path: Path
    resume: bool = True
    on_conflict: str = "error"
    progress: bool = True

    @property
    def order(self) -> list[str]:
        """The task ids in item order."""
        return list(self.items)


class CampaignLedger:
    """The ledger of one run of a campaign plus the bookkeeping of applying outcomes to it.

    Attributes:
        ledger: the :class:`~diffsoup.store.Ledger`, every task registered.
        order: the task ids in item order.
        to_run: the ids of the tasks this run runs (those not accepted yet), in item order.
    """

    def __init__(self, ledger: Ledger, order: list[str], progress: ProgressBar | None = None):
        self.ledger, self.order = ledger, order
        self.to_run = [task_id for task_id in order if ledger.get(task_id)["state"] != "accepted"]
        self.progress = progress
        # The progress bar counts tasks accepted before plus tasks settled in this run; a task
        # failed in an earlier run runs again, so it starts as queued. Kept beside the ledger so
        # that counting costs nothing per save.
        self._states = {task_id: ledger.get(task_id)["state"] for task_id in order}
        self._states.update(dict.fromkeys(self.to_run, "queued"))

    def counts(self) -> tuple[int, int]:
        """(finished tasks, failed tasks) of this campaign."""
        failed = sum(state == "failed" for state in self._states.values())
        accepted = sum(state == "accepted" for state in self._states.values())
        return accepted + failed, failed

    def is_settled(self, task_id: str) -> bool:
        """Whether ``task_id`` is accepted or failed (in this run or before)."""
        return self._states[task_id] in ("accepted", "failed")

    def _set(self, task_id: str, record: dict[str, Any]) -> None:
        self.ledger.set(task_id, record)
        self._states[task_id] = record["state"]

    def mark_running(self, task_id: str, *, started: str, worker: str | None) -> None:
        """Record the start of one more attempt of ``task_id``."""
        record = self.ledger.get(task_id)
        record.update(
            state="running",
            attempts=record["attempts"] + 1,
            started=started,
            finished=None,
            worker=worker,
            result=None,
            error=None,
            traceback=None,
        )
        self._set(task_id, record)

    def count_attempt(self, task_id: str) -> None:
        """Record an attempt that changes nothing else (a duplicate run of a settled task)."""
        record = self.ledger.get(task_id)
        record["attempts"] += 1
        self._set(task_id, record)

    def finish(self, task_id: str, outcome: TaskOutcome) -> None:
        """Record the outcome of the last attempt: accepted with its result, or failed."""
        record = self.ledger.get(task_id)
        if outcome.ok:
            record.update(state="accepted", result=json.loads(outcome.result), error=None, traceback=None)
        else:
            record.update(state="failed", result=None, error=outcome.error, traceback=outcome.traceback)
        record["finished"] = outcome.finished or now_iso()
        if outcome.started is not None:
            record["started"] = outcome.started
        if outcome.worker is not None:
            record["worker"] = outcome.worker
        self._set(task_id, record)

    def save(self) -> None:
        """Write the ledger (durably)."""
        self.ledger.save()

    def save_and_show(self) -> None:
        """Write the ledger and move the progress bar."""
        self.ledger.save()
        if self.progress is not None:
            self.progress.update(*self.counts())
        publish_campaign(self)  # the dashboard page (where a Dask scheduler is there; throttled)

    def result(self) -> CampaignResult:
        """The campaign's result as the ledger has it now."""
        return CampaignResult.from_records(TaskRecord.from_dict(self.ledger.get(task_id)) for task_id in self.order)


@contextlib.contextmanager
def open_campaign(plan: CampaignPlan) -> Iterator[CampaignLedger]:
    """Lock the plan's ledger, open it (see :func:`open_ledger`), and yield its bookkeeping with
    the progress bar drawn; the bar is closed and the lock released at the end.

    Raises:
        diffsoup.store.LedgerLockedError: if another process runs a campaign on this ledger.
        diffsoup.store.LedgerError, diffsoup.store.LedgerConflictError: see :func:`open_ledger`;
            also when the ledger's directory cannot be written (one line naming it).
    """
    path = plan.ledger_path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise unwritable(path, exc) from exc
    with ledger_lock(path):
        remove_stale_temporaries(path)
        ledger = open_ledger(path, plan.fingerprints, resume=plan.resume, on_conflict=plan.on_conflict,
                             function=qualified_name(plan.fn))  # fmt: skip
        order = plan.order
        to_run = sum(ledger.get(task_id)["state"] != "accepted" for task_id in order)
        bar = ProgressBar(len(order), len(order) - to_run, 0, plan.progress)
        try:
            campaign = CampaignLedger(ledger, order, bar)
            campaign.save_and_show()
            yield campaign
        finally:
            bar.close()


def open_ledger(
    path: Path,
    fingerprints: Mapping[str, str],
    *,
    resume: bool,
    on_conflict: str,
    function: str,
) -> Ledger:
    """The ledger to run on, with every task registered: the existing one (checked), or a new one
    with the old kept as .bak. Tasks interrupted while running are pending again.

    With ``on_conflict="restart"``, the tasks recorded for different items (their fingerprints
    differ) get new records and run again; every other record is kept (accepted results stay
    accepted, records of tasks no longer among the items stay, as in any resume); the previous file
    is kept beside the ledger as a .bak."""
    ledger = _ledger_for(path, fingerprints, resume=resume, on_conflict=on_conflict, function=function)
    for task_id, fp in fingerprints.items():
        record = ledger.get(task_id)
        if record is None:
            ledger.set(task_id, new_record(task_id, fp))
        elif record["state"] == "running":
            # Interrupted: the process that ran it died. It waits for this run like any other.
            record["state"] = "pending"
            ledger.set(task_id, record)
    return ledger


def _backup(path: Path) -> Path:
    try:
        return backup_ledger(path)
    except OSError as exc:
        raise unwritable(path, exc) from exc


def _ledger_for(
    path: Path,
    fingerprints: Mapping[str, str],
    *,
    resume: bool,
    on_conflict: str,
    function: str,
) -> Ledger:
    if path.exists() and not path.is_file():
        # Never move a directory or a device aside, even with resume=False.
        raise LedgerError(f"cannot read the ledger {path}: it is not a regular file. Give a file path.")
    if not path.exists():
        return Ledger(path, function=function)
    if not resume:
        backup = _backup(path)
        logger.info("resume=False: the previous ledger %s is kept as %s", path, backup)
        return Ledger(path, function=function)
    ledger = Ledger.load(path)  # raises LedgerError, leaving a damaged file as it is
    if ledger.read_version is not None and ledger.read_version < LEDGER_VERSION:
        logger.info("the ledger %s has format version %d; it is written as version %d from now on",
                    path, ledger.read_version, LEDGER_VERSION)  # fmt: skip
    conflicts = [
        task_id
        for task_id, fp in fingerprints.items()
        if task_id in ledger and ledger.get(task_id)["fingerprint"] != fp
    ]
    if conflicts:
        if on_conflict == "error":
            first = conflicts[0]
            more = f" (and {len(conflicts) - 1} other tasks)" if len(conflicts) > 1 else ""
            raise LedgerConflictError(
                f"the ledger {path} recorded task {first!r}{more} for a different item than the one "
                "given now: it belongs to another campaign, or the items changed. Pass "
                "on_conflict='restart' to rerun the changed tasks (the ledger is kept beside it as a "
                ".bak), resume=False to start anew, or another ledger_path."
            )
        backup = _backup(path)
        for task_id in conflicts:
            # A changed item is a new task under an old id: nothing recorded for it holds.
            ledger.set(task_id, new_record(task_id, fingerprints[task_id]))
        logger.warning(
            "on_conflict='restart': the ledger %s recorded %d task(s) for different items; those run "
            "anew and the other tasks keep their records. The previous ledger is kept as %s",
            path,
            len(conflicts),
            backup,
        )
    ledger.function = function
    return ledger
