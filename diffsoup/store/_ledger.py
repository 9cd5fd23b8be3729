"""The JSON ledger of a campaign: one file, written whole and durably after every change.

A ledger records, task by task, what :func:`diffsoup.inference.checkpointed_map` did, so that a
rerun resumes where the last one stopped. The file layout (version 2)::

    {
     "format": "diffsoup-ledger",
     "version": 2,
     "campaign": "<sha256 of the sorted (task_id, fingerprint) pairs>",
     "checksum": "<sha256 of every field of every task record>",
     "function": "module.qualname of the task function",
     "created": "<ISO 8601 UTC>",
     "updated": "<ISO 8601 UTC>",
     "tasks": {
      "<task_id>": {"task_id": ..., "fingerprint": ..., "state": ..., "result": ..., "error": ...,
                    "traceback": ..., "attempts": ..., "started": ..., "finished": ..., "worker": ...},
      ...
     }
    }

Each task record sits on one line, so the file stays readable and ``grep``-able and a save only
re-serializes the records that changed. ``campaign`` is a checksum of the identity part of the
records: a ledger whose records were edited into another campaign's, or damaged, is refused.
``checksum`` covers everything a rerun trusts, every field of every record (a result, a state, an
attempt count): a ledger edited by hand or damaged in any record is refused with a
:class:`LedgerError` rather than silently handing back an edited result. A version-1 ledger (no
``checksum``; written by diffsoup before it) is read as before, trusted as it was then, and written
back as version 2 with its checksum on the campaign's first save.

Writes go to a temporary file in the same directory, which is flushed, fsynced and moved over the
ledger with ``os.replace``, after which the directory is fsynced: a reader (or a rerun after a
crash or SIGKILL) sees either the previous ledger or the new one, never a partial file. Only one
process writes a ledger: :func:`ledger_lock` holds an advisory lock for the whole campaign.

The pieces live beside it: fingerprints of items in :mod:`._fingerprint`, durable writes and
backups in :mod:`._durable_files`; this module holds the errors, the records' checks and
checksums, the lock, and the :class:`Ledger` itself.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ._durable_files import backup_ledger as backup_ledger
from ._durable_files import remove_stale_temporaries as remove_stale_temporaries
from ._durable_files import write_text_durably as write_text_durably
from ._fingerprint import fingerprint as fingerprint

LEDGER_FORMAT = "diffsoup-ledger"
LEDGER_VERSION = 2
# Versions this one reads: 1 (no "checksum") is migrated on its first save.
READABLE_VERSIONS = (1, 2)
TASK_STATES = ("pending", "running", "accepted", "failed")
RECORD_FIELDS = (
    "task_id",
    "fingerprint",
    "state",
    "result",
    "error",
    "traceback",
    "attempts",
    "started",
    "finished",
    "worker",
)
_HEADER_FIELDS = ("format", "version", "campaign", "checksum", "function", "created", "updated", "tasks")
_HEADER_FIELDS_V1 = ("format", "version", "campaign", "function", "created", "updated", "tasks")


class LedgerError(ValueError):
    """A ledger file that cannot be read, is damaged, or belongs to something else."""


class LedgerConflictError(LedgerError):
    """The ledger recorded a ``task_id`` for a different item than the one given now."""


class LedgerLockedError(RuntimeError):
    """Another process holds the ledger's lock: it is running a campaign on that file."""


def unwritable(path: str | os.PathLike, exc: OSError) -> LedgerError:
    """The error for a ledger that cannot be written: one line naming its directory and the remedy."""
    path = Path(path)
    reason = exc.strerror or str(exc) or type(exc).__name__
    directory = path.parent
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent  # the directory the missing ones were to be created in
    return LedgerError(
        f"cannot write the ledger {path}: {reason} in the directory {directory} "
        f"({type(exc).__name__}). Give the campaign a directory this process can write: another "
        "ledger_path (the diffsoup command: another --out)."
    )


def now_iso() -> str:
    """The current time as an ISO 8601 string in UTC with microseconds (the ledger's time format)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


# --------------------------------------------------------------------------------------------
# Checksums of the records
# --------------------------------------------------------------------------------------------


def campaign_fingerprint(tasks: Mapping[str, Mapping[str, Any]]) -> str:
    """The checksum of a ledger's identity: SHA-256 of its sorted ``(task_id, fingerprint)`` pairs."""
    pairs = sorted((tid, rec["fingerprint"]) for tid, rec in tasks.items())
    text = json.dumps(pairs, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def record_digest(record: Mapping[str, Any]) -> str:
    """SHA-256 of every field of one task record (canonical JSON: sorted keys, ASCII)."""
    text = json.dumps({name: record[name] for name in RECORD_FIELDS}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=True, allow_nan=False)  # fmt: skip
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def records_checksum(digests: Mapping[str, str]) -> str:
    """The ledger's ``checksum``: SHA-256 of the sorted ``(task_id, record digest)`` pairs."""
    text = json.dumps(sorted(digests.items()), separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()

# --------------------------------------------------------------------------------------------
# The lock
# --------------------------------------------------------------------------------------------


@contextmanager
def ledger_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``<path>.lock`` while a campaign writes ``path``.

    The kernel drops the lock when the process dies (even by SIGKILL), so a rerun is never blocked
    by a stale lock. The holder removes the file when it lets go (a finished or interrupted
    campaign leaves no lock file); a process that locked a file removed meanwhile opens the new one
    and locks again. Where the file system offers no locks, the campaign runs without one.

    Raises:
        LedgerLockedError: if another process holds the lock.
        LedgerError: if the lock file cannot be created (a read-only directory).
    """
    path = Path(path)
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks through fcntl.
        yield
        return
    lock_path = path.with_name(path.name + ".lock")
    locked = False
    while True:
        try:
            handle = open(lock_path, "a+")
        except OSError as exc:
            raise unwritable(path, exc) from exc
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise LedgerLockedError(
                f"ledger {path} is in use by another process ({holder}); a ledger has one writer. "
                "Wait for that campaign to end, or give this one another ledger_path."
            ) from None
        except OSError as exc:
            warnings.warn(
                f"cannot lock {lock_path} ({exc}); running without a lock, so do not start a "
                "second campaign on this ledger at the same time.",
                RuntimeWarning,
                stacklevel=3,
            )
            break
        try:  # the file locked is still the one at lock_path (its last holder may have removed it)
            locked = os.path.samestat(os.fstat(handle.fileno()), os.stat(lock_path))
        except FileNotFoundError:
            locked = False
        if locked:
            break
        handle.close()
    try:
        if locked:
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()} on {os.uname().nodename} since {now_iso()}\n")
            handle.flush()
        yield
    finally:
        if locked:  # removed while still held: no other process holds a lock on this file
            try:
                os.unlink(lock_path)
            except OSError:
                pass
        handle.close()


# --------------------------------------------------------------------------------------------
# The ledger
# --------------------------------------------------------------------------------------------


def _dump_record(record: Mapping[str, Any]) -> str:
    return json.dumps(
        {name: record[name] for name in RECORD_FIELDS},
        separators=(", ", ": "),
        ensure_ascii=False,
        allow_nan=False,
    )


def new_record(task_id: str, fingerprint: str) -> dict[str, Any]:
    """A pending task record: never started, no result."""
    return {
        "task_id": task_id,
        "fingerprint": fingerprint,
        "state": "pending",
        "result": None,
        "error": None,
        "traceback": None,
        "attempts": 0,
        "started": None,
        "finished": None,
        "worker": None,
    }


def _check_record(record: Any, key: str) -> str | None:
    """What is wrong with one task record as read from a file, or None."""
    if not isinstance(record, dict):
        return f"the record of task {key!r} is a {type(record).__name__}, not an object"
    missing = [name for name in RECORD_FIELDS if name not in record]
    if missing:
        return f"the record of task {key!r} lacks {', '.join(missing)}"
    if record["task_id"] != key:
        return f"the record under {key!r} names task {record['task_id']!r}"
    if not isinstance(record["fingerprint"], str) or not record["fingerprint"]:
        return f"the record of task {key!r} has no fingerprint"
    if record["state"] not in TASK_STATES:
        return f"task {key!r} has state {record['state']!r}, not one of {TASK_STATES}"
    attempts = record["attempts"]
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
        return f"task {key!r} has attempts={attempts!r}, not a count"
    for name in ("error", "traceback", "started", "finished", "worker"):
        if record[name] is not None and not isinstance(record[name], str):
            return f"task {key!r} has {name}={record[name]!r}, not a string or null"
    return None


class Ledger:
    """The in-memory copy of one ledger file; :meth:`save` writes it back whole and durably.

    Records are plain dicts with the keys of :data:`RECORD_FIELDS`. Records of tasks that the
    current campaign does not name are kept as they are, so shrinking or growing a campaign's
    item list never drops what the ledger knows.

    Args:
        path: the ledger file.
        function: ``module.qualname`` of the task function, kept for people reading the file.
        created: ISO time the ledger was first written, or None for now.
        tasks: records keyed by task_id, in order.

    Attributes:
        read_version: the format version of the file this ledger was loaded from (None for a
            new ledger); an older version is written back as :data:`LEDGER_VERSION`.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        function: str | None = None,
        created: str | None = None,
        tasks: Mapping[str, Mapping[str, Any]] | None = None,
    ):
        self.path = Path(path)
        self.function = function
        self.created = created or now_iso()
        self.read_version: int | None = None
        self._records: dict[str, dict[str, Any]] = {}
        self._lines: dict[str, str] = {}
        self._digests: dict[str, str] = {}
        self._campaign: str | None = None
        self._checksum: str | None = None
        for task_id, record in (tasks or {}).items():
            self.set(task_id, record)

    def __contains__(self, task_id: str) -> bool:
        return task_id in self._records

    def __len__(self) -> int:
        return len(self._records)

    def task_ids(self) -> list[str]:
        """The recorded task ids, in file order."""
        return list(self._records)

    def get(self, task_id: str) -> dict[str, Any] | None:
        """A copy of the record of ``task_id``, or None if the ledger has none."""
        record = self._records.get(task_id)
        return None if record is None else dict(record)

    def set(self, task_id: str, record: Mapping[str, Any]) -> None:
        """Replace the record of ``task_id`` (in memory; :meth:`save` writes it).

        Raises:
            ValueError: if the record is malformed or its result is not strict JSON.
        """
        record = {name: record[name] for name in RECORD_FIELDS}
        problem = _check_record(record, task_id)
        if problem:
            raise ValueError(problem)
        line = _dump_record(record)  # raises before anything changes if it is not JSON
        digest = record_digest(record)
        previous = self._records.get(task_id)
        if previous is None or previous["fingerprint"] != record["fingerprint"]:
            self._campaign = None  # the identity changed; state changes leave it as it is
        self._checksum = None
        self._records[task_id] = record
        self._lines[task_id] = line
        self._digests[task_id] = digest

    @property
    def campaign(self) -> str:
        """The campaign fingerprint of the records held now."""
        if self._campaign is None:
            self._campaign = campaign_fingerprint(self._records)
        return self._campaign

    @property
    def checksum(self) -> str:
        """The checksum of every field of the records held now (the file's ``checksum``)."""
        if self._checksum is None:
            self._checksum = records_checksum(self._digests)
        return self._checksum

    def to_text(self) -> str:
        """The file content: a header, then one task record per line."""
        header = {
            "format": LEDGER_FORMAT,
            "version": LEDGER_VERSION,
            "campaign": self.campaign,
            "checksum": self.checksum,
            "function": self.function,
            "created": self.created,
            "updated": now_iso(),
        }
        head = "".join(f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)},\n" for k, v in header.items())
        body = ",\n".join(f"  {json.dumps(k, ensure_ascii=False)}: {line}" for k, line in self._lines.items())
        tasks = ' "tasks": {\n' + body + "\n }\n" if body else ' "tasks": {}\n'
        return "{\n" + head + tasks + "}\n"

    def save(self) -> None:
        """Write the whole ledger to its file durably (see the module docstring).

        Raises:
            LedgerError: if the file cannot be written (a read-only directory, a full disk); the
                message names the directory and what to do. The file on disk is left as it was.
        """
        try:
            write_text_durably(self.path, self.to_text())
        except OSError as exc:
            raise unwritable(self.path, exc) from exc

    @classmethod
    def load(cls, path: str | os.PathLike) -> Ledger:
        """Read and check a ledger file.

        Args:
            path: the ledger file, which must exist.

        Returns:
            The ledger, with records in file order.

        Raises:
            FileNotFoundError: if there is no file at ``path``.
            LedgerError: if the file cannot be read, is not JSON, is not a diffsoup ledger, was
                written by a newer version, its records are damaged, or they do not match its
                checksum (edited by hand). The file is left as it is.
        """
        path = Path(path)
        fix = (
            "The file was left untouched. Move it away, or pass resume=False to start the "
            "campaign anew (the old file is then kept beside it as a .bak)."
        )
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise LedgerError(f"cannot read the ledger {path}: {exc}. {fix}") from exc
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise LedgerError(f"the ledger {path} is corrupted: it is not valid JSON ({exc}). {fix}") from exc
        if not isinstance(data, dict) or data.get("format") != LEDGER_FORMAT:
            raise LedgerError(
                f"{path} is not a diffsoup ledger (no \"format\": \"{LEDGER_FORMAT}\" field). {fix}"
            )
        version = data.get("version")
        if isinstance(version, bool) or not isinstance(version, int):
            raise LedgerError(f"the ledger {path} is corrupted: its version is {version!r}. {fix}")
        if version > LEDGER_VERSION:
            raise LedgerError(
                f"the ledger {path} has version {version}, written by a newer diffsoup than this one "
                f"(which reads version {LEDGER_VERSION}); upgrade diffsoup to resume it. {fix}"
            )
        if version not in READABLE_VERSIONS:
            raise LedgerError(f"the ledger {path} is corrupted: its version is {version!r}. {fix}")
        missing = [name for name in (_HEADER_FIELDS if version >= 2 else _HEADER_FIELDS_V1) if name not in data]
        if missing:
            raise LedgerError(f"the ledger {path} is corrupted: it lacks {', '.join(missing)}. {fix}")
        tasks = data["tasks"]
        if not isinstance(tasks, dict):
            raise LedgerError(f"the ledger {path} is corrupted: \"tasks\" is not an object. {fix}")
        for key, record in tasks.items():
            problem = _check_record(record, key)
            if problem:
                raise LedgerError(f"the ledger {path} is corrupted: {problem}. {fix}")
        if campaign_fingerprint(tasks) != data["campaign"]:
            raise LedgerError(
                f"the ledger {path} is corrupted: its campaign fingerprint does not match its task "
                f"records (a record's task_id or fingerprint was changed by hand or damaged). {fix}"
            )
        try:
            ledger = cls(path, function=data["function"], created=data["created"], tasks=tasks)
        except ValueError as exc:  # e.g. a NaN written by another tool
            raise LedgerError(f"the ledger {path} is corrupted: {exc}. {fix}") from exc
        if version >= 2 and ledger.checksum != data["checksum"]:
            raise LedgerError(
                f"the ledger {path} does not match its checksum: a task record (a result, state, attempt "
                "count or another field) was changed after diffsoup wrote it, by hand or by damage, and "
                "a rerun would trust it. The file was left untouched. Restore the ledger from a copy "
                "(a .bak beside it, if any), or start the campaign anew with resume=False (the diffsoup "
                "command: --restart), which keeps this file beside the new one as a .bak."
            )
        # A version-1 ledger had no checksum: it is trusted as version 1 trusted it, and the next
        # save writes it as the current version with its checksum.
        ledger.read_version = version
        return ledger


def json_result(value: Any) -> str:
    """Encode a task result as strict JSON; NumPy/JAX arrays and scalars become (nested) lists.

    Raises:
        TypeError: for values JSON cannot hold (objects, tuple keys, ...).
        ValueError: for NaN or infinity, which strict JSON cannot hold either.
    """

    def default(obj: Any) -> Any:
        tolist = getattr(obj, "tolist", None)
        if callable(tolist) and hasattr(obj, "dtype"):
            return tolist()
        raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")

    # allow_nan=False applies at every depth, including to what default() returns.
    return json.dumps(value, allow_nan=False, default=default, ensure_ascii=False)
