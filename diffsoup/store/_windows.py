"""The window-start store: multiple-shooting window starts kept in Zarr, shared by processes.

:class:`WindowStore` is the default :class:`~diffsoup.inference.WindowCache` of
``ds.inference.prepare_windows`` and ``InferenceProblem`` (the numerical layer names it through
a lazy reference and never imports this module; see ``diffsoup/inference/shooting/_window_cache.py``).

Layout (plain Zarr v3, readable with ``zarr.open_group``)::

    <cache dir>/windows/             a Zarr group
        <key>/                       one entry, a Zarr group: attrs key, checksum, complete, ...
            starts                   float64 (W-1, n): the start state of windows 1..W-1
            edges                    float64 (W+1,): the window edges t0, b_1, ..., t_last

The cache directory is ``DIFFSOUP_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/diffsoup``, else
``~/.cache/diffsoup`` (read by :func:`diffsoup._settings.cache_dir`).

Zarr itself does not make concurrent writers safe (zarr 3.4: creating one array from two
processes is not exclusive, two writers of one chunk lose updates). So an entry is written whole
by one process in a directory of its own (``.tmp-<key>-<random>.<pid>@<host>``), its checksum
attribute last, and then renamed into place with one ``os.rename``, which is atomic on a POSIX file
system and fails when the target exists: the loser of a race deletes its copy and reads the
winner's. An entry is therefore present only once complete. On reading, an entry whose metadata
cannot be read, whose ``complete`` flag or checksum is missing, or whose arrays do not match the
checksum (truncated or corrupted files) is reported with a :class:`WindowStoreWarning`, moved aside
and deleted, and the caller recomputes it.

One solve per entry: while a process computes an entry it holds the lock file ``.lock-<key>``
(created with ``O_CREAT | O_EXCL``, which is exclusive on local file systems and on NFS v3+ and
Lustre, holding the owner's host, pid and a token), and other processes needing the same entry
wait for it and then read the entry instead of solving too (:meth:`WindowStore.computing`). A lock
whose owner is gone (a process no longer running on this host), or another host's lock older than
``stale_after``, is broken; a process that waited ``lock_timeout`` seconds computes anyway, with a
warning. The lock only saves solves: correctness rests on the atomic rename alone.

Debris of killed processes (temporary entries, entries moved aside, lock copies) carries its
owner's pid and host in its name. Each save removes what is older than ``stale_after`` (1 h) and
whose owner is gone; what a live process on this host owns is never removed, and what another host
owns only by its age (see :meth:`WindowStore.remove_stale`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, final

import numpy as np

from .._settings import cache_dir
from ..inference.shooting._window_cache import WindowCache, WindowEntry

FORMAT = "diffsoup.windows/1"
ARRAYS = ("starts", "edges")


class WindowStoreWarning(UserWarning):
    """Something in the window store needs attention: an entry was incomplete or corrupted and is
    being recomputed, or a process waited ``lock_timeout`` for another's solve and solves itself."""


def _host() -> str:
    return socket.gethostname()


def _owner_tag() -> str:
    """``<pid>@<host>``: the end of the names of this process's temporaries."""
    return f"{os.getpid()}@{_host()}"


def _owner_of(name: str) -> tuple[int, str] | None:
    """``(pid, host)`` from a name ending in ``.<pid>@<host>``, or None (a name without owner)."""
    head, at, host = name.rpartition("@")
    if not at or not host:
        return None
    _, dot, pid = head.rpartition(".")
    return (int(pid), host) if dot and pid.isdigit() else None


def _alive_here(pid: int, host: str) -> bool | None:
    """Whether process ``pid`` of ``host`` runs: True or False on this host, None elsewhere."""
    if host != _host():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OSError:
        return True  # cannot tell: count it as alive (never remove what may be in use)
    return True


def _age(path: Path) -> float | None:
    """Seconds since ``path`` last changed, or None if it is gone."""
    try:
        return time.time() - path.lstat().st_mtime
    except OSError:
        return None


def _seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"WindowStore: {name}={value!r} must be a number of seconds >= 0 (math.inf: never).")
    return float(value)


def checksum(arrays: dict) -> str:
    """SHA-256 of the named arrays' dtype, shape and float64 bytes, in ``ARRAYS`` order."""
    h = hashlib.sha256()
    for name in ARRAYS:
        a = np.ascontiguousarray(np.asarray(arrays[name], dtype=np.float64))
        h.update(f"{name}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


@final
class WindowStore(WindowCache):
    """Window starts by key, in a Zarr group under the cache directory.

    Args:
        root: the cache directory; None reads ``DIFFSOUP_CACHE_DIR`` (see
            :func:`diffsoup._settings.cache_dir`).
        stale_after: seconds after which debris of a process that is gone (a temporary entry of a
            killed writer) is removed, and after which a lock counts as abandoned even if its
            owner cannot be checked (another host). Default 1 h.
        lock_timeout: seconds a process waits for another's solve of the same entry before it
            solves itself, with a :class:`WindowStoreWarning`. Default 10 min; ``math.inf`` waits
            for ever.

    Attributes:
        path: the Zarr group holding the entries (``root/windows``).

    Raises:
        ValueError: for a negative or non-numeric ``stale_after`` or ``lock_timeout``.
    """

    POLL_SECONDS = (0.05, 1.0)
    """The first and the longest pause between a waiting process's looks at a lock."""

    def __init__(self, root: Any = None, *, stale_after: float = 3600.0, lock_timeout: float = 600.0):
        self.path = cache_dir(root) / "windows"
        self.stale_after = _seconds(stale_after, "stale_after")
        self.lock_timeout = _seconds(lock_timeout, "lock_timeout")

    def _ensure_root(self) -> None:
        """Create the group directory and its ``zarr.json`` (atomically; identical in every process)."""
        self.path.mkdir(parents=True, exist_ok=True)
        meta = self.path / "zarr.json"
        if not meta.exists():
            tmp = self.path / f".zarr.json.{uuid.uuid4().hex}.{_owner_tag()}"
            tmp.write_text('{"zarr_format": 3, "node_type": "group", "attributes": {"format": "%s"}}' % FORMAT)
            os.replace(tmp, meta)

    def entry_path(self, key: str) -> Path:
        """Where the entry of ``key`` lives."""
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"WindowStore: key={key!r} must be a non-empty name without '/' not starting with '.'.")
        return self.path / key

    def __repr__(self) -> str:
        return f"WindowStore({str(self.path)!r})"

    def load(self, key: str) -> WindowEntry | None:
        """The entry of ``key``, or None when absent or damaged.

        A damaged entry (unreadable, incomplete, checksum mismatch) is reported with a
        :class:`WindowStoreWarning` and removed, so that the caller recomputes and stores it.
        """
        import zarr

        where = self.entry_path(key)
        if not where.exists():
            return None
        try:
            group = zarr.open_group(str(where), mode="r")
            attrs = dict(group.attrs)
            if attrs.get("complete") is not True or "checksum" not in attrs:
                raise ValueError("the entry has no completion flag/checksum (written partially)")
            arrays = {name: np.asarray(group[name][...], dtype=np.float64) for name in ARRAYS}
            if checksum(arrays) != attrs["checksum"]:
                raise ValueError("the stored arrays do not match their checksum")
            if attrs.get("key") != key:
                raise ValueError(f"the entry names key {attrs.get('key')!r}")
            entry = WindowEntry(arrays["starts"], arrays["edges"], attrs)
        except Exception as err:  # noqa: BLE001 (any read failure means a damaged entry)
            warnings.warn(
                f"diffsoup window store: entry {key} at {where} is incomplete or corrupted "
                f"({type(err).__name__}: {err}); it is removed and recomputed.",
                WindowStoreWarning,
                stacklevel=3,
            )
            self._discard(where)
            return None
        return entry

    def save(self, key: str, entry: WindowEntry) -> bool:
        """Write the entry of ``key`` whole, then rename it into place.

        Args:
            key: the content key.
            entry: the window starts and edges; its ``attrs`` (JSON: experiment id, state names)
                are kept as attributes of the entry's group.

        Returns:
            True if this call's copy was placed; False if another process placed the entry first
            (this copy is then discarded; both hold the same content, as the key is a content hash).
        """
        import zarr

        if not isinstance(entry, WindowEntry):
            raise TypeError(f"WindowStore.save: entry must be a ds.inference.WindowEntry, not {type(entry).__name__}.")
        self._ensure_root()
        self.remove_stale()
        target = self.entry_path(key)
        arrays = {"starts": entry.starts, "edges": entry.edges}
        tmp = self.path / f".tmp-{key}-{uuid.uuid4().hex}.{_owner_tag()}"
        try:
            group = zarr.open_group(str(tmp), mode="w-")
            for name in ARRAYS:
                group.create_array(name, data=arrays[name])
            meta = dict(entry.attrs)
            meta.update(format=FORMAT, key=key, checksum=checksum(arrays))
            group.attrs.update(meta)
            group.attrs["complete"] = True  # last: the entry is complete once this is written
            if target.exists():
                return False
            try:
                os.rename(tmp, target)
            except OSError:
                if target.exists():
                    return False
                raise
            return True
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def _discard(self, where: Path) -> None:
        aside = where.with_name(f".bad-{where.name}-{uuid.uuid4().hex}.{_owner_tag()}")
        try:
            os.rename(where, aside)
        except OSError:
            return  # another process moved it already
        shutil.rmtree(aside, ignore_errors=True)

    # ----------------------------------------------------------------------------------------
    # One solve per entry: the lock of a key
    # ----------------------------------------------------------------------------------------

    def lock_path(self, key: str) -> Path:
        """The lock file held while a process computes the entry of ``key``."""
        return self.path / f".lock-{self.entry_path(key).name}"

    @contextlib.contextmanager
    def computing(self, key: str) -> Iterator[None]:
        """Hold the lock of ``key`` while computing its entry; wait while another process holds it.

        Enters the block when this process holds the lock; when the entry appeared (the holder
        placed it: load it instead of computing); when the holder released the lock without
        placing it (then this process takes it); when the lock was abandoned (its owner, a process
        of this host, is gone, or another host's lock is older than ``stale_after``: it is broken
        and taken); or after ``lock_timeout`` seconds, with a :class:`WindowStoreWarning` (then
        without the lock). Where the store cannot be written, no lock is taken.
        """
        try:
            held = self._acquire(key)
        except OSError:
            held = None  # a read-only store: compute without a lock (saving will warn)
        try:
            yield
        finally:
            if held is not None:
                self._release(*held)

    def _acquire(self, key: str) -> tuple[Path, str] | None:
        """Take the lock of ``key``: ``(lock path, token)``, or None when not taken (see computing)."""
        self._ensure_root()
        path, target = self.lock_path(key), self.entry_path(key)
        token = uuid.uuid4().hex
        content = json.dumps({"host": _host(), "pid": os.getpid(), "token": token, "since": time.time()})
        started = time.monotonic()
        pause, longest = self.POLL_SECONDS
        while True:
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "w") as handle:
                    handle.write(content)
                return path, token
            if target.exists():
                return None  # the holder placed the entry
            text = self._read(path)
            if text is None:
                continue  # released just now: take it
            if self._abandoned(path, text):
                self._break(path, text)
                continue
            waited = time.monotonic() - started
            if waited >= self.lock_timeout:
                warnings.warn(
                    f"diffsoup window store: waited {waited:.0f} s (lock_timeout) for another process's solve "
                    f"of entry {key} at {self.path} (lock {path.name}: {text.strip()}); solving here as well. "
                    "Raise WindowStore(lock_timeout=...) if solves take longer.",
                    WindowStoreWarning,
                    stacklevel=4,
                )
                return None
            time.sleep(min(pause, max(0.0, self.lock_timeout - waited)))
            pause = min(longest, pause * 2)

    @staticmethod
    def _read(path: Path) -> str | None:
        try:
            return path.read_text()
        except FileNotFoundError:
            return None
        except OSError:
            return ""  # unreadable: judged by its age alone

    def _abandoned(self, path: Path, text: str) -> bool:
        """Whether the lock holding ``text`` is abandoned: its owner, a process of this host, is
        gone; or, owned by another host (or unreadable), it is older than ``stale_after``."""
        try:
            holder = json.loads(text)
            alive = _alive_here(int(holder["pid"]), str(holder["host"]))
        except (ValueError, KeyError, TypeError):
            alive = None  # being written just now, or garbage: judged by its age
        if alive is not None:
            return not alive  # this host's: its owner runs or not, whatever the lock's age
        age = _age(path)
        return age is not None and age > self.stale_after

    def _break(self, path: Path, text: str) -> None:
        """Remove the abandoned lock at ``path`` (holding ``text``), and only that lock.

        It is renamed aside first: of several processes breaking it at once one succeeds, and if
        what it moved is a fresh lock taken meanwhile, it is put back.
        """
        aside = path.with_name(f"{path.name}.broken-{uuid.uuid4().hex}.{_owner_tag()}")
        try:
            os.rename(path, aside)
        except OSError:
            return  # another process broke or released it
        try:
            if self._read(aside) != text:
                with contextlib.suppress(OSError):
                    os.link(aside, path)  # a fresh lock: back in place (unless a newer one is there)
        finally:
            with contextlib.suppress(OSError):
                aside.unlink()

    def _release(self, path: Path, token: str) -> None:
        text = self._read(path)
        try:
            ours = text is not None and json.loads(text).get("token") == token
        except (ValueError, AttributeError):
            ours = False
        if ours:  # a lock broken as abandoned and taken by another process is theirs now
            with contextlib.suppress(OSError):
                path.unlink()

    # ----------------------------------------------------------------------------------------
    # Debris of killed processes
    # ----------------------------------------------------------------------------------------

    def remove_stale(self) -> list[Path]:
        """Remove what killed processes left in the store; called by every save.

        Temporary entries (``.tmp-*``), entries moved aside (``.bad-*``), root metadata
        temporaries and lock copies are removed when older than ``stale_after`` and their owner
        is gone: a live process on this host never loses its files, another host's are judged by
        age alone, as are names without an owner (written by an earlier diffsoup). Locks
        (``.lock-*``) are removed when abandoned (see :meth:`computing`).

        Returns:
            The paths removed.
        """
        try:
            names = [name for name in os.listdir(self.path) if name.startswith(".")]
        except OSError:
            return []
        removed = []
        for name in names:
            where = self.path / name
            if name.startswith(".lock-") and ".broken-" not in name:
                text = self._read(where)
                if text is not None and self._abandoned(where, text):
                    self._break(where, text)
                    if not where.exists():
                        removed.append(where)
                continue
            if not name.startswith((".tmp-", ".bad-", ".zarr.json.", ".lock-")):
                continue
            age = _age(where)
            if age is None or age <= self.stale_after:
                continue
            owner = _owner_of(name)
            if owner is not None and _alive_here(*owner):
                continue  # a live process of this host: never removed, whatever its age
            if where.is_dir() and not where.is_symlink():
                shutil.rmtree(where, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    where.unlink()
            if not where.exists():
                removed.append(where)
        return removed

    def keys(self) -> list[str]:
        """The keys of the complete-looking entries present (not verified)."""
        if not self.path.exists():
            return []
        return sorted(p.name for p in self.path.iterdir() if p.is_dir() and not p.name.startswith("."))
