"""Campaigns of independent tasks with a JSON ledger: ``checkpointed_map`` and ``CampaignResult``.

A campaign maps a function over items (multistarts, profile points, per-experiment fits, sweep
points). Every change of a task's state is written to the ledger (see
:mod:`diffsoup.store._ledger`) by this process alone, so a campaign killed at any moment (an
allocation ending, SIGKILL, a lost node) resumes on rerun: accepted tasks are kept, failed and
interrupted ones run again.

``execution="serial"`` runs the tasks here, one after another. ``execution="dask"`` submits each
task as a Dask task restricted to workers that carry ``resources`` (``{"GPU": 1}`` by default), so
tasks land only on GPU workers, one at a time per GPU. Workers report each start through a Dask
event, so the ledger shows a task as running, on which worker, and how many attempts it took
when a worker died under it. Dask itself is imported only inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import queue
import shutil
import socket
import subprocess
import sys
import time
import traceback as _traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..store._ledger import (
    Ledger,
    LedgerConflictError,
    LedgerError,
    backup_ledger,
    fingerprint,
    json_result,
    ledger_lock,
    new_record,
    now_iso,
    remove_stale_temporaries,
)

if TYPE_CHECKING:  # pragma: no cover
    from distributed import Client

logger = logging.getLogger("diffsoup.campaign")

EXECUTIONS = ("serial", "dask", "processes")
CONFLICT_POLICIES = ("error", "restart")
DEFAULT_RESOURCES: Mapping[str, float] = {"GPU": 1}
DEFAULT_NO_WORKER_TIMEOUT = 60.0
"""Seconds a Dask task may wait in the scheduler's ``no-worker`` state before it is failed."""


@dataclasses.dataclass(frozen=True)
class TaskRecord:
    """What the ledger knows about one task.

    Attributes:
        task_id: the item's ``task_id``.
        fingerprint: SHA-256 of the item's canonical JSON (:func:`diffsoup.store.fingerprint`).
        state: ``"pending"``, ``"running"``, ``"accepted"`` or ``"failed"``.
        result: the accepted result in its JSON form (lists for tuples and arrays, string keys),
            else None.
        error: ``"ExceptionType: message"`` of the last failure, else None.
        traceback: the formatted traceback of the last failure, else None.
        attempts: how many times the task was started, over all runs of the campaign (a worker
            lost mid-task makes one more).
        started: ISO 8601 UTC time the last attempt started, or None.
        finished: ISO 8601 UTC time the last attempt ended, or None.
        worker: where the last attempt ran: a Dask worker address, or ``"<host> pid <pid>"`` for
            serial execution.
    """

    task_id: str
    fingerprint: str
    state: str
    result: Any = None
    error: str | None = None
    traceback: str | None = None
    attempts: int = 0
    started: str | None = None
    finished: str | None = None
    worker: str | None = None

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> TaskRecord:
        """The record of a ledger entry (a dict with the ledger's record fields)."""
        return cls(**{f.name: record[f.name] for f in dataclasses.fields(cls)})


class CampaignResult(NamedTuple):
    """The outcome of :func:`checkpointed_map`.

    Attributes:
        results: ``{task_id: result}`` of the accepted tasks, in item order; each result in its
            JSON form, whether computed in this run or read from the ledger.
        failures: ``{task_id: TaskRecord}`` of the failed tasks, in item order; ``.error`` and
            ``.traceback`` say why.
        records: one :class:`TaskRecord` per item, in item order.
    """

    results: dict[str, Any]
    failures: dict[str, TaskRecord]
    records: tuple[TaskRecord, ...]


# --------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------


def _task_id_of(item: Any, index: int) -> str:
    if isinstance(item, Mapping):
        if "task_id" not in item:
            raise TypeError(
                f"item {index} has no 'task_id' key: each item is a mapping or object with a "
                "unique, non-empty string task_id that stays the same across restarts."
            )
        task_id = item["task_id"]
    else:
        if not hasattr(item, "task_id"):
            raise TypeError(
                f"item {index} ({type(item).__name__}) has no task_id attribute: each item is a "
                "mapping or object with a unique, non-empty string task_id."
            )
        task_id = item.task_id
    if not isinstance(task_id, str):
        raise TypeError(f"item {index} has task_id={task_id!r} ({type(task_id).__name__}); task_id must be a string.")
    if not task_id.strip():
        raise ValueError(f"item {index} has an empty task_id {task_id!r}; give each task a non-empty string id.")
    return task_id


def _index_items(items: Sequence[Any]) -> dict[str, Any]:
    """``{task_id: item}`` in item order, after checking that the ids are unique and non-empty."""
    if isinstance(items, (Mapping, str, bytes)):
        raise TypeError(f"items must be a sequence of tasks, not a {type(items).__name__}.")
    by_id: dict[str, Any] = {}
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        task_id = _task_id_of(item, index)
        if task_id in by_id:
            raise ValueError(
                f"duplicate task_id {task_id!r} (items {first[task_id]} and {index}); each task needs "
                "its own id, which is how a rerun finds it in the ledger."
            )
        by_id[task_id] = item
        first[task_id] = index
    return by_id


def _check_resources(resources: Any) -> dict[str, float]:
    if not isinstance(resources, Mapping):
        raise TypeError(f"resources must be a mapping such as {{'GPU': 1}}, not {resources!r}.")
    out = {}
    for name, amount in resources.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"resources has the name {name!r}; resource names are non-empty strings.")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not amount > 0:
            raise ValueError(f"resources[{name!r}] = {amount!r}; an amount is a positive number.")
        out[name] = amount
    return out


def _qualified_name(fn: Callable) -> str:
    module = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{name}" if module else name


# --------------------------------------------------------------------------------------------
# Running one task (here, or inside a Dask worker)
# --------------------------------------------------------------------------------------------


def _execute(fn: Callable, item: Any, task_id: str) -> dict[str, Any]:
    """Run one task and encode its outcome; exceptions of the task become a failed outcome.

    Returns:
        ``{"ok": True, "result": <JSON text>, "finished": ...}`` or
        ``{"ok": False, "error": ..., "traceback": ..., "finished": ...}``. The result travels as
        JSON text so that what the client stores is exactly what a rerun reads back.
    """
    try:
        value = fn(item)
    except Exception as exc:  # the task's own failure: recorded, and the others still run
        return {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": _traceback.format_exc(),
            "finished": now_iso(),
        }
    try:
        text = json_result(value)
    except (TypeError, ValueError, RecursionError) as exc:
        return {
            "ok": False,
            "error": (
                f"result of task {task_id!r} is not JSON-serializable: {exc}. Return numbers, strings, "
                "booleans, None, lists and dicts with string keys (NumPy/JAX arrays become lists; NaN "
                "and infinity are not allowed), and keep large arrays in a Zarr store."
            ),
            "traceback": _traceback.format_exc(),
            "finished": now_iso(),
        }
    return {"ok": True, "result": text, "finished": now_iso()}


def _run_on_worker(item: Any, task_id: str, *, fn: Callable, topic: str) -> dict[str, Any]:
    """The Dask task: announce the start to the client (one event per attempt), then run."""
    from distributed import get_worker

    token = uuid.uuid4().hex
    started = now_iso()
    try:
        worker = get_worker()
    except ValueError:  # run outside a worker (e.g. a synchronous scheduler): no events
        worker = None
    address = getattr(worker, "address", None)
    if worker is not None:
        worker.log_event(topic, {"task_id": task_id, "token": token, "worker": address, "started": started})
    outcome = _execute(fn, item, task_id)
    outcome.update(token=token, worker=address, started=started)
    return outcome


# --------------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------------


class _Progress:
    """A progress bar on stderr: tqdm's when tqdm is installed, else a one-line bar of our own.

    Our own bar redraws in place at most ten times a second on a terminal; when stderr is a file
    or a pipe (CI logs) it writes a line at each tenth of the way instead of flooding the log.
    """

    def __init__(self, total: int, done: int, failed: int, enabled: bool, desc: str = "diffsoup campaign"):
        self.total, self.desc = total, desc
        self.enabled = enabled and total > 0
        self._tqdm = None
        self._start = time.monotonic()
        self._last_draw = -1.0
        self._drawn: tuple[int, int] | None = None
        self._done, self._failed = done, failed
        if self.enabled and importlib.util.find_spec("tqdm") is not None:
            from tqdm.auto import tqdm

            self._tqdm = tqdm(total=total, initial=done, desc=desc, unit="task", file=sys.stderr)
            self._tqdm.set_postfix(failed=failed)

    def update(self, done: int, failed: int) -> None:
        """Show ``done`` finished tasks (accepted or failed), ``failed`` of them failed."""
        if not self.enabled:
            return
        if self._tqdm is not None:
            if (done, failed) != (self._done, self._failed):
                self._tqdm.set_postfix(failed=failed, refresh=False)
                self._tqdm.update(done - self._done)
            self._done, self._failed = done, failed
            return
        self._done, self._failed = done, failed
        self._draw()

    def _draw(self, final: bool = False) -> None:
        stream = sys.stderr
        tty = getattr(stream, "isatty", lambda: False)()
        now = time.monotonic()
        state = (self._done, self._failed)
        if tty:
            if not final and now - self._last_draw < 0.1:
                return
        elif state == self._drawn or not final and self._drawn is not None and (
            self._done * 10 // self.total == self._drawn[0] * 10 // self.total
        ):
            return
        self._last_draw, self._drawn = now, state
        width = 30
        filled = width * self._done // self.total
        line = (
            f"{self.desc} [{'#' * filled}{'.' * (width - filled)}] {self._done}/{self.total} "
            f"failed {self._failed} {now - self._start:6.1f}s"
        )
        stream.write(f"\r{line}" + ("\n" if final else "") if tty else line + "\n")
        stream.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._tqdm is not None:
            self._tqdm.close()
        else:
            self._draw(final=True)


# --------------------------------------------------------------------------------------------
# The campaign
# --------------------------------------------------------------------------------------------


class _Campaign:
    """The ledger of one run plus the bookkeeping of applying outcomes to it."""

    def __init__(self, ledger: Ledger, order: list[str], to_run: list[str], progress: _Progress):
        self.ledger, self.order, self.progress = ledger, order, progress
        # The progress bar counts tasks accepted before plus tasks settled in this run; a task
        # failed in an earlier run runs again, so it starts as queued. Kept beside the ledger so
        # that counting costs nothing per save.
        self._states = {task_id: ledger.get(task_id)["state"] for task_id in order}
        self._states.update(dict.fromkeys(to_run, "queued"))

    def counts(self) -> tuple[int, int]:
        """(finished tasks, failed tasks) of this campaign."""
        failed = sum(state == "failed" for state in self._states.values())
        accepted = sum(state == "accepted" for state in self._states.values())
        return accepted + failed, failed

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

    def finish(self, task_id: str, outcome: Mapping[str, Any]) -> None:
        """Record the outcome of the last attempt: accepted with its result, or failed."""
        record = self.ledger.get(task_id)
        if outcome["ok"]:
            record.update(state="accepted", result=json.loads(outcome["result"]), error=None, traceback=None)
        else:
            record.update(state="failed", result=None, error=outcome["error"], traceback=outcome.get("traceback"))
        record["finished"] = outcome.get("finished") or now_iso()
        for name in ("started", "worker"):
            if outcome.get(name) is not None:
                record[name] = outcome[name]
        self._set(task_id, record)

    def save_and_show(self) -> None:
        self.ledger.save()
        self.progress.update(*self.counts())

    def result(self) -> CampaignResult:
        records = tuple(TaskRecord.from_dict(self.ledger.get(task_id)) for task_id in self.order)
        results = {r.task_id: r.result for r in records if r.state == "accepted"}
        failures = {r.task_id: r for r in records if r.state == "failed"}
        return CampaignResult(results, failures, records)


def _open_ledger(
    path: Path,
    fingerprints: Mapping[str, str],
    *,
    resume: bool,
    on_conflict: str,
    function: str,
) -> Ledger:
    """The ledger to run on, with every task registered: the existing one (checked), or a new one
    with the old kept as .bak. Tasks interrupted while running are pending again."""
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
        backup = backup_ledger(path)
        logger.info("resume=False: the previous ledger %s is kept as %s", path, backup)
        return Ledger(path, function=function)
    ledger = Ledger.load(path)  # raises LedgerError, leaving a damaged file as it is
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
                "on_conflict='restart' to discard it (it is kept beside it as a .bak), resume=False to "
                "start anew, or another ledger_path."
            )
        backup = backup_ledger(path)
        logger.warning(
            "on_conflict='restart': the ledger %s recorded %d task(s) for different items; it is "
            "kept as %s and the campaign starts anew",
            path,
            len(conflicts),
            backup,
        )
        return Ledger(path, function=function)
    ledger.function = function
    return ledger


def checkpointed_map(
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    *,
    ledger_path: str | os.PathLike,
    resume: bool = True,
    execution: str = "serial",
    device_groups: Any = None,
    on_conflict: str = "error",
    client: Client | None = None,
    resources: Mapping[str, float] | None = None,
    no_worker_timeout: float | None = DEFAULT_NO_WORKER_TIMEOUT,
    progress: bool = True,
) -> CampaignResult:
    """Map a function over independent tasks, recording each outcome in a JSON ledger so a rerun resumes.

    Each item carries a ``task_id`` that stays the same across restarts. A result is stored as
    JSON and comes back in that form. A task that raises is recorded as failed, and the others
    still run. The ledger is written whole, durably, after every change, by this process only;
    another process running a campaign on the same ledger is refused (an advisory lock on
    ``<ledger>.lock``, which the kernel releases when a process dies, even by SIGKILL).

    Args:
        fn: the task, a function of one item returning its result (JSON: numbers, strings, bools,
            None, lists, dicts with string keys; NumPy/JAX arrays become lists).
        items: the tasks, mappings or objects with a unique non-empty string ``task_id``. An item's
            fingerprint (:func:`diffsoup.store.fingerprint`) identifies it across restarts.
        ledger_path: the JSON file the ledger is written to; its directory is created if needed.
        resume: whether to read the ledger first, keep its accepted tasks, and run the failed and
            interrupted ones again. False runs everything anew; the old ledger is then kept beside
            the new one as ``<name>.<UTC time>.bak``.
        execution: ``"serial"`` to run the tasks here one after another; ``"dask"`` to run each
            as a Dask task on a worker carrying ``resources``; ``"processes"`` to run each task on
            one device group of a multi-process JAX run (``ds.distributed.initialize``), on the
            processes that own the group, with the ledger written by process 0 (every process
            calls ``checkpointed_map`` with the same items and gets the same result; in a single
            process it runs the tasks here, one group after another).
        device_groups: for ``"processes"``: disjoint JAX submeshes (``ds.mesh_groups``), or None
            for each device its own group. Task ``i`` of those to run goes to group
            ``i % len(groups)``; while it runs, :func:`device_group` returns its mesh and a
            one-device group is JAX's default device. Must be None for other executions.
        on_conflict: ``"error"`` to refuse a ledger that recorded a ``task_id`` for a different
            item, or ``"restart"`` to discard that ledger (kept beside it as a ``.bak``).
        client: for ``"dask"``: the Dask client to use. None takes the active client, or else
            starts the embedded default: a LocalCluster on 127.0.0.1 with one worker process per
            visible GPU (``CUDA_VISIBLE_DEVICES`` or ``nvidia-smi -L``), or, without GPUs, two CPU
            worker processes (a testing default). Its workers carry exactly ``resources`` and one
            thread, and it is closed when the campaign ends.
        resources: for ``"dask"``: the worker resources each task asks for; None means
            ``{"GPU": 1}``, so tasks run only on GPU workers, one at a time per GPU. ``{}`` lets
            tasks run on any worker.
        no_worker_timeout: for ``"dask"``: seconds (default 60) a task may wait in Dask's
            ``no-worker`` state, where no connected worker offers the resources it asks for,
            before it is failed with an error naming the request and the workers' resources. The
            check runs about once a second, so a task fails within this time plus about a second.
            None waits for ever (for clusters whose workers arrive from a batch queue).
        progress: whether to show a progress bar on stderr (tqdm's when installed).

    Returns:
        ``CampaignResult(results, failures, records)``: ``results`` maps task_id to the accepted
        result in item order, ``failures`` maps task_id to the :class:`TaskRecord` of each failed
        task, and ``records`` holds one :class:`TaskRecord` per item in item order.

    Raises:
        ValueError: for an unknown ``execution`` or ``on_conflict``, an empty or duplicate
            ``task_id``, or options that do not apply to the chosen execution.
        TypeError: for a non-callable ``fn``, an item without a string ``task_id``, or an item
            that cannot be fingerprinted stably.
        ValueError: for ``execution="processes"``: device groups that are not disjoint meshes.
        diffsoup.store.LedgerError: if the existing ledger cannot be read or is damaged (the
            file is left untouched).
        diffsoup.store.LedgerConflictError: with ``on_conflict="error"``, if the ledger recorded
            a task_id for a different item; the message names the task.
        diffsoup.store.LedgerLockedError: if another process is running a campaign on this ledger.
    """
    if execution not in EXECUTIONS:
        raise ValueError(f"execution={execution!r} is not one of {EXECUTIONS}.")
    if device_groups is not None and execution != "processes":
        raise ValueError(f"device_groups applies to execution='processes', not execution={execution!r}.")
    if on_conflict not in CONFLICT_POLICIES:
        raise ValueError(f"on_conflict={on_conflict!r} is not one of {CONFLICT_POLICIES}.")
    if not isinstance(resume, bool):
        raise TypeError(f"resume must be True or False, not {resume!r}.")
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}.")
    if execution in ("serial", "processes"):
        for name, value in (("client", client), ("resources", resources)):
            if value is not None:
                raise ValueError(f"{name}= applies to execution='dask', not execution={execution!r}.")
    groups = _check_device_groups(device_groups) if execution == "processes" else None
    resources = _check_resources(DEFAULT_RESOURCES if resources is None else resources)
    if no_worker_timeout is not None and (
        isinstance(no_worker_timeout, bool)
        or not isinstance(no_worker_timeout, (int, float))
        or not no_worker_timeout > 0
    ):
        raise ValueError(f"no_worker_timeout={no_worker_timeout!r} must be a positive number of seconds or None.")

    by_id = _index_items(items)
    fingerprints = {}
    for task_id, item in by_id.items():
        try:
            fingerprints[task_id] = fingerprint(item)
        except TypeError as exc:
            raise TypeError(f"task {task_id!r}: {exc}") from exc

    path = Path(ledger_path)
    if execution == "processes":
        return _run_processes(fn, by_id, fingerprints, path, groups, resume=resume, on_conflict=on_conflict,
                              progress=progress)  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    with ledger_lock(path):
        remove_stale_temporaries(path)
        ledger = _open_ledger(
            path, fingerprints, resume=resume, on_conflict=on_conflict, function=_qualified_name(fn)
        )
        order = list(by_id)
        to_run = [task_id for task_id in order if ledger.get(task_id)["state"] != "accepted"]
        bar = _Progress(len(order), len(order) - len(to_run), 0, progress)
        campaign = _Campaign(ledger, order, to_run, bar)
        try:
            campaign.save_and_show()
            if execution == "serial":
                _run_serial(campaign, fn, by_id, to_run)
            elif to_run:
                _run_dask(campaign, fn, by_id, to_run, client, resources, no_worker_timeout)
        finally:
            bar.close()
        return campaign.result()


def _run_serial(campaign: _Campaign, fn: Callable, by_id: Mapping[str, Any], to_run: list[str]) -> None:
    worker = f"{socket.gethostname()} pid {os.getpid()}"
    for task_id in to_run:
        # Written before the task runs, so a kill mid-task leaves it visibly interrupted.
        campaign.mark_running(task_id, started=now_iso(), worker=worker)
        campaign.ledger.save()
        campaign.finish(task_id, _execute(fn, by_id[task_id], task_id))
        campaign.save_and_show()


# --------------------------------------------------------------------------------------------
# Dask execution
# --------------------------------------------------------------------------------------------


def _visible_gpus() -> list[str]:
    """The ids of the GPUs JAX would see, without importing JAX (which may grab GPU memory).

    ``JAX_PLATFORMS`` without cuda/gpu hides them all; ``CUDA_VISIBLE_DEVICES`` lists them (CUDA
    stops at the first negative id); otherwise ``nvidia-smi -L`` counts them.
    """
    platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms and not any(p in platforms for p in ("cuda", "gpu")):
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids = []
        for entry in (e.strip() for e in listed.split(",")):
            if not entry or entry.startswith("-"):
                break
            ids.append(entry)
        return ids
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    count = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    return [str(i) for i in range(count)]


def _start_embedded_cluster(resources: Mapping[str, float]):
    """The embedded default cluster and a client on it (see ``client=`` of checkpointed_map)."""
    from ._clusters import embedded_cluster

    cluster, client = embedded_cluster(resources)
    logger.info("started the embedded Dask cluster %s", cluster)
    return cluster, client


def _keys_without_worker(keys: list[str], dask_scheduler=None) -> list[str]:
    """Run on the scheduler: which of ``keys`` wait in the ``no-worker`` state."""
    tasks = dask_scheduler.tasks
    return [key for key in keys if key in tasks and tasks[key].state == "no-worker"]


def _workers_resources(client: Client) -> str:
    """The connected workers and the resources each offers, for error messages."""
    try:
        workers = client.scheduler_info(n_workers=-1)["workers"]
    except Exception as exc:  # the message must not fail because the cluster is in trouble
        return f"unknown ({type(exc).__name__}: {exc})"
    if not workers:
        return "no workers are connected"
    return "; ".join(f"{address}: {info.get('resources') or {}}" for address, info in workers.items())


def _run_dask(
    campaign: _Campaign,
    fn: Callable,
    by_id: Mapping[str, Any],
    to_run: list[str],
    client: Client | None,
    resources: Mapping[str, float],
    no_worker_timeout: float | None,
) -> None:
    from distributed import default_client

    cluster = None
    if client is None:
        try:
            client = default_client()
        except ValueError:
            cluster, client = _start_embedded_cluster(resources)
    events: queue.SimpleQueue = queue.SimpleQueue()
    topic = f"diffsoup-campaign-{uuid.uuid4().hex}"
    # Keys read "diffsoup-<task_id>-<8 hex digits>": unique on a shared scheduler and across
    # reruns, named by task on the dashboard's task stream, and grouped into one progress bar
    # per campaign (Dask's key_split drops the hex suffix and words holding digits).
    suffix = uuid.uuid4().hex[:8]
    try:
        # Subscribed before submitting: the scheduler handles a client's messages in order, so
        # no start event can be missed.
        client.subscribe_topic(topic, lambda event: events.put(("start", event[1])))
        from distributed.spans import span

        # One span per campaign on the dashboard, named by the task function.
        span_name = f"diffsoup-campaign-{getattr(fn, '__name__', 'task')}"
        with span(span_name):
            submitted = client.map(
                _run_on_worker,
                [by_id[task_id] for task_id in to_run],
                to_run,
                key=[f"diffsoup-{task_id}-{suffix}" for task_id in to_run],
                resources=dict(resources) or None,
                pure=False,
                fn=fn,
                topic=topic,
            )
        futures = {future.key: (task_id, future) for task_id, future in zip(to_run, submitted)}
        for future in submitted:
            future.add_done_callback(lambda f: events.put(("done", f)))
        _drive(campaign, client, futures, events, resources, no_worker_timeout)
    finally:
        try:
            client.unsubscribe_topic(topic)
        except Exception:  # a closed client has nothing to unsubscribe
            pass
        if cluster is not None:
            client.close()
            cluster.close()


def _drive(
    campaign: _Campaign,
    client: Client,
    futures: dict[str, tuple[str, Any]],
    events: queue.SimpleQueue,
    resources: Mapping[str, float],
    no_worker_timeout: float | None,
) -> None:
    """Apply start events and finished futures to the ledger until every task has an outcome.

    Everything that arrives together goes into one ledger write, so a burst of short tasks does
    not cost one whole-file write each.
    """
    outstanding = dict(futures)  # key -> (task_id, Future) of tasks without an outcome yet
    unsettled = {task_id for task_id, _ in futures.values()}
    tokens: dict[str, set[str]] = {task_id: set() for task_id in unsettled}
    poll = 1.0 if no_worker_timeout is None else min(1.0, max(0.05, no_worker_timeout / 4))
    last_check = time.monotonic()
    waiting_since: dict[str, float] = {}
    try:
        while outstanding:
            try:
                batch = [events.get(timeout=poll)]
            except queue.Empty:
                batch = []
            while True:
                try:
                    batch.append(events.get_nowait())
                except queue.Empty:
                    break
            changed = False
            finished = []
            for kind, payload in batch:
                if kind == "start":
                    task_id, token = payload["task_id"], payload["token"]
                    if task_id not in tokens or token in tokens[task_id]:
                        continue
                    tokens[task_id].add(token)
                    if task_id in unsettled:
                        campaign.mark_running(task_id, started=payload["started"], worker=payload["worker"])
                    else:
                        campaign.count_attempt(task_id)
                    changed = True
                elif payload.key in outstanding:
                    finished.append(payload)
            outcomes = _gather_outcomes(client, finished)
            for future in finished:
                task_id, _ = outstanding.pop(future.key)
                unsettled.discard(task_id)
                outcome = outcomes[future.key]
                token = outcome.get("token")
                if token is not None and token not in tokens[task_id]:
                    # Its start event is still on the way: count the attempt now.
                    tokens[task_id].add(token)
                    campaign.mark_running(task_id, started=outcome["started"], worker=outcome["worker"])
                campaign.finish(task_id, outcome)
                future.release()
                changed = True
            if no_worker_timeout is not None and outstanding and time.monotonic() - last_check >= poll:
                last_check = time.monotonic()
                for task_id in _fail_unrunnable(
                    campaign, client, outstanding, waiting_since, resources, no_worker_timeout
                ):
                    unsettled.discard(task_id)
                    changed = True
            if changed:
                campaign.save_and_show()
    finally:
        if outstanding:
            # Interrupted (KeyboardInterrupt, a lost scheduler): the ledger keeps these tasks as
            # pending or running, and a rerun starts them again.
            try:
                client.cancel([future for _, future in outstanding.values()])
            except Exception:
                pass


def _gather_outcomes(client: Client, finished: list) -> dict[str, dict[str, Any]]:
    """The outcome of each settled future: what the task returned, or why it did not return."""
    outcomes: dict[str, dict[str, Any]] = {}
    ok = [future for future in finished if future.status == "finished"]
    if ok:
        try:
            outcomes.update(zip((f.key for f in ok), client.gather(ok)))
        except Exception:
            # One of them was lost with its worker and failed on recomputation: one at a time.
            for future in ok:
                try:
                    outcomes[future.key] = future.result()
                except Exception:
                    pass
    for future in finished:
        if future.key not in outcomes:
            outcomes[future.key] = _failed_future_outcome(future)
    return outcomes


def _failed_future_outcome(future) -> dict[str, Any]:
    """The outcome of a Dask task that did not return (killed its workers, erred, was cancelled)."""
    try:
        exc = future.exception()
        tb = future.traceback()
    except Exception as err:  # cancelled futures raise here
        exc, tb = err, None
    if exc is None:
        return {
            "ok": False,
            "error": f"the Dask task {future.key} ended as {future.status!r}",
            "traceback": None,
            "finished": now_iso(),
        }
    return {
        "ok": False,
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": "".join(_traceback.format_tb(tb)) if tb is not None else None,
        "finished": now_iso(),
    }


def _fail_unrunnable(
    campaign: _Campaign,
    client: Client,
    outstanding: dict[str, tuple[str, Any]],
    waiting_since: dict[str, float],
    resources: Mapping[str, float],
    timeout: float,
) -> list[str]:
    """Fail the tasks that sat in ``no-worker`` for ``timeout`` seconds; returns their task ids."""
    now = time.monotonic()
    stuck = set(client.run_on_scheduler(_keys_without_worker, list(outstanding)))
    for key in list(waiting_since):
        if key not in stuck:
            del waiting_since[key]  # a worker with the resources arrived
    for key in stuck:
        waiting_since.setdefault(key, now)
    expired = [key for key, since in waiting_since.items() if now - since >= timeout and key in outstanding]
    if not expired:
        return []
    offered = _workers_resources(client)
    failed = []
    for key in expired:
        task_id, future = outstanding.pop(key)
        waited = now - waiting_since.pop(key)
        future.cancel()
        error = (
            f"task {task_id!r} waited {waited:.1f} s (no_worker_timeout={timeout:g} s) in Dask's "
            f"'no-worker' state: it asks for resources {dict(resources)} and no worker offers them. "
            f"Workers' resources: {offered}. Start workers with matching resources (dask worker "
            "--resources \"GPU=1\"), pass resources= that your workers carry, or raise "
            "no_worker_timeout (None waits for ever)."
        )
        campaign.finish(task_id, {"ok": False, "error": error, "traceback": None, "finished": now_iso()})
        failed.append(task_id)
    return failed


# --------------------------------------------------------------------------------------------
# Device groups of a multi-process JAX run
# --------------------------------------------------------------------------------------------

import contextvars  # noqa: E402

_CURRENT_GROUP: contextvars.ContextVar = contextvars.ContextVar("diffsoup_device_group", default=None)
_CAMPAIGN_COUNTER = [0]
_KV_WAIT_MS = 24 * 3_600_000


def device_group():
    """The device group (a ``jax.sharding.Mesh``) of the task running now under
    ``checkpointed_map(..., execution="processes")``, or None outside such a task."""
    return _CURRENT_GROUP.get()


def _check_device_groups(device_groups: Any) -> tuple:
    """The groups as a tuple of meshes: None gives each device (of every process) its own group."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    if device_groups is None:
        return tuple(Mesh(np.asarray([d], dtype=object), ("data",)) for d in jax.devices())
    if isinstance(device_groups, Mesh):
        device_groups = (device_groups,)
    groups = tuple(device_groups)
    if not groups:
        raise ValueError("device_groups is empty; give meshes from ds.mesh_groups, or None for one device each.")
    seen: dict = {}
    for g, mesh in enumerate(groups):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"device_groups[{g}] is a {type(mesh).__name__}; give jax.sharding.Mesh objects "
                            "(ds.mesh_groups(mesh, sizes)).")  # fmt: skip
        for d in mesh.devices.flat:
            if d.id in seen:
                raise ValueError(f"device {d} is in device groups {seen[d.id]} and {g}; groups must be disjoint.")
            seen[d.id] = g
    return groups


def _run_in_group(fn: Callable, item: Any, task_id: str, mesh) -> dict[str, Any]:
    import jax

    token = _CURRENT_GROUP.set(mesh)
    try:
        devices = list(mesh.devices.flat)
        with contextlib.ExitStack() as stack:
            if len(devices) == 1:
                stack.enter_context(jax.default_device(devices[0]))
            return _execute(fn, item, task_id)
    finally:
        _CURRENT_GROUP.reset(token)


def _run_processes(
    fn: Callable,
    by_id: Mapping[str, Any],
    fingerprints: Mapping[str, str],
    path: Path,
    groups: tuple,
    *,
    resume: bool,
    on_conflict: str,
    progress: bool,
) -> CampaignResult:
    """``execution="processes"``: the plan and the outcomes travel through the JAX coordinator's
    key-value store; process 0 alone opens, locks and writes the ledger."""
    import hashlib

    from ._runtime import process_count, process_index

    nproc, me = process_count(), process_index()
    kv = None
    if nproc > 1:
        from jax._src import distributed as _jd

        kv = _jd.global_state.client
    serial = _CAMPAIGN_COUNTER[0]
    _CAMPAIGN_COUNTER[0] += 1
    digest = hashlib.sha256(json.dumps([str(path), sorted(fingerprints.items())]).encode()).hexdigest()[:16]
    prefix = f"diffsoup/campaign/{serial}/{digest}"
    worker = f"{socket.gethostname()} pid {os.getpid()} process {me}"
    order = list(by_id)

    def owners(mesh) -> list[int]:
        return sorted({d.process_index for d in mesh.devices.flat})

    def run_mine(to_run: list[str], on_done: Callable[[str, dict], None]) -> None:
        for i, task_id in enumerate(to_run):
            mesh = groups[i % len(groups)]
            procs = owners(mesh)
            if me not in procs:
                continue
            started = now_iso()
            outcome = _run_in_group(fn, by_id[task_id], task_id, mesh)
            outcome.update(started=started, worker=worker)
            if me == procs[0]:
                on_done(task_id, outcome)

    if me != 0:
        to_run = json.loads(kv.blocking_key_value_get_bytes(f"{prefix}/plan", _KV_WAIT_MS).decode())
        if to_run is None:  # process 0 failed to open the ledger
            raise LedgerError(f"process 0 could not open the ledger {path}; see its error.")
        run_mine(to_run, lambda task_id, outcome: kv.key_value_set_bytes(
            f"{prefix}/out/{task_id}", json.dumps(outcome).encode()))  # fmt: skip
        records = json.loads(kv.blocking_key_value_get_bytes(f"{prefix}/final", _KV_WAIT_MS).decode())
        recs = tuple(TaskRecord.from_dict(r) for r in records)
        return CampaignResult({r.task_id: r.result for r in recs if r.state == "accepted"},
                              {r.task_id: r for r in recs if r.state == "failed"}, recs)  # fmt: skip

    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        lock = ledger_lock(path)
        lock.__enter__()
    except BaseException:
        if kv is not None:
            kv.key_value_set_bytes(f"{prefix}/plan", b"null")
        raise
    try:
        try:
            remove_stale_temporaries(path)
            ledger = _open_ledger(path, fingerprints, resume=resume, on_conflict=on_conflict,
                                  function=_qualified_name(fn))  # fmt: skip
        except BaseException:
            if kv is not None:
                kv.key_value_set_bytes(f"{prefix}/plan", b"null")
            raise
        to_run = [task_id for task_id in order if ledger.get(task_id)["state"] != "accepted"]
        if kv is not None:
            kv.key_value_set_bytes(f"{prefix}/plan", json.dumps(to_run).encode())
        bar = _Progress(len(order), len(order) - len(to_run), 0, progress)
        campaign = _Campaign(ledger, order, to_run, bar)
        leader = {task_id: owners(groups[i % len(groups)])[0] for i, task_id in enumerate(to_run)}
        try:
            campaign.save_and_show()

            def settle(task_id: str, outcome: dict) -> None:
                campaign.mark_running(task_id, started=outcome["started"], worker=outcome["worker"])
                campaign.finish(task_id, outcome)
                campaign.save_and_show()

            def collect(block: bool) -> None:
                for task_id in to_run:
                    if leader[task_id] == 0 or campaign._states[task_id] in ("accepted", "failed"):
                        continue
                    key = f"{prefix}/out/{task_id}"
                    if block:
                        blob = kv.blocking_key_value_get_bytes(key, _KV_WAIT_MS)
                    else:
                        try:
                            blob = kv.key_value_try_get_bytes(key)
                        except Exception:  # not there yet
                            continue
                    kv.key_value_delete(key)
                    settle(task_id, json.loads(blob.decode()))

            def on_mine(task_id: str, outcome: dict) -> None:
                settle(task_id, outcome)
                if kv is not None:
                    collect(block=False)

            run_mine(to_run, on_mine)
            if kv is not None:
                collect(block=True)
        finally:
            bar.close()
        result = campaign.result()
        if kv is not None:
            kv.key_value_set_bytes(f"{prefix}/final", json.dumps([dataclasses.asdict(r) for r in result.records]).encode())
        return result
    finally:
        lock.__exit__(None, None, None)
