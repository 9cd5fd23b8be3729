"""The task model of campaigns: what a task is (an item with a ``task_id``), what the ledger knows
about it (:class:`TaskRecord`), how one attempt ended (:class:`TaskOutcome`), what a campaign
returns (:class:`CampaignResult`), and running one task (:func:`run_task`)."""

from __future__ import annotations

import dataclasses
import json
import traceback as _traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from ..store._ledger import fingerprint, json_result, now_iso


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
            lost mid-task makes one more); each start is in the ledger before the task function
            runs, so a killed client never leaves a run uncounted.
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

    @classmethod
    def from_records(cls, records: Sequence[TaskRecord]) -> CampaignResult:
        """The result whose records are ``records`` (in item order)."""
        records = tuple(records)
        return cls(
            {r.task_id: r.result for r in records if r.state == "accepted"},
            {r.task_id: r for r in records if r.state == "failed"},
            records,
        )


@dataclasses.dataclass(frozen=True)
class TaskOutcome:
    """How one attempt of a task ended: what a runner hands to the ledger.

    Attributes:
        ok: whether the task returned a JSON-serializable result.
        result: that result as JSON text, so that what the ledger stores is exactly what a rerun
            reads back; None when not ``ok``.
        error: ``"ExceptionType: message"`` when not ``ok``.
        traceback: the formatted traceback of the failure, or None.
        finished: ISO 8601 UTC time the attempt ended.
        started: ISO 8601 UTC time it started, where the runner learns it with the outcome.
        worker: where it ran, where the runner learns it with the outcome.
        token: a fresh id per attempt (Dask: the id its start event carries), or None.
    """

    ok: bool
    result: str | None = None
    error: str | None = None
    traceback: str | None = None
    finished: str = dataclasses.field(default_factory=now_iso)
    started: str | None = None
    worker: str | None = None
    token: str | None = None

    @classmethod
    def failure(cls, error: str, traceback: str | None = None) -> TaskOutcome:
        """A failed attempt ending now."""
        return cls(ok=False, error=error, traceback=traceback)

    def to_json(self) -> str:
        """The outcome as JSON text (for the key-value store of a multi-process run)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> TaskOutcome:
        """The outcome :meth:`to_json` wrote."""
        return cls(**json.loads(text))


# --------------------------------------------------------------------------------------------
# Items
# --------------------------------------------------------------------------------------------


def task_id_of(item: Any, index: int) -> str:
    """The ``task_id`` of item ``index`` (a mapping key or an attribute), checked."""
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


def index_items(items: Sequence[Any]) -> dict[str, Any]:
    """``{task_id: item}`` in item order, after checking that the ids are unique and non-empty."""
    if isinstance(items, (Mapping, str, bytes)):
        raise TypeError(f"items must be a sequence of tasks, not a {type(items).__name__}.")
    by_id: dict[str, Any] = {}
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        task_id = task_id_of(item, index)
        if task_id in by_id:
            raise ValueError(
                f"duplicate task_id {task_id!r} (items {first[task_id]} and {index}); each task needs "
                "its own id, which is how a rerun finds it in the ledger."
            )
        by_id[task_id] = item
        first[task_id] = index
    return by_id


def fingerprint_items(by_id: Mapping[str, Any]) -> dict[str, str]:
    """``{task_id: fingerprint}``: what identifies each item across restarts."""
    fingerprints = {}
    for task_id, item in by_id.items():
        try:
            fingerprints[task_id] = fingerprint(item)
        except TypeError as exc:
            raise TypeError(f"task {task_id!r}: {exc}") from exc
    return fingerprints


def qualified_name(fn: Callable) -> str:
    """``module.qualname`` of the task function, recorded in the ledger."""
    module = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{name}" if module else name


# --------------------------------------------------------------------------------------------
# One task
# --------------------------------------------------------------------------------------------


def run_task(fn: Callable, item: Any, task_id: str) -> TaskOutcome:
    """Run one task and encode its outcome; an exception of the task becomes a failed outcome (the
    other tasks still run)."""
    try:
        value = fn(item)
    except Exception as exc:  # the task's own failure: recorded, and the others still run
        return TaskOutcome.failure(f"{type(exc).__name__}: {exc}", _traceback.format_exc())
    try:
        text = json_result(value)
    except (TypeError, ValueError, RecursionError) as exc:
        return TaskOutcome.failure(
            f"result of task {task_id!r} is not JSON-serializable: {exc}. Return numbers, strings, "
            "booleans, None, lists and dicts with string keys (NumPy/JAX arrays become lists; NaN "
            "and infinity are not allowed), and keep large arrays in a Zarr store.",
            _traceback.format_exc(),
        )
    return TaskOutcome(ok=True, result=text)
