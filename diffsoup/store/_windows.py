"""The window-start store: multiple-shooting window starts kept in Zarr, shared by processes.

:class:`WindowStore` is the default :class:`~diffsoup.inference.WindowCache` of
``ds.inference.prepare_windows`` and ``InferenceProblem`` (the numerical layer names it through
a lazy reference and never imports this module; see ``diffsoup/inference/_window_cache.py``).

Layout (plain Zarr v3, readable with ``zarr.open_group``)::

    <cache dir>/windows/             a Zarr group
        <key>/                       one entry, a Zarr group: attrs key, checksum, complete, ...
            starts                   float64 (W-1, n): the start state of windows 1..W-1
            edges                    float64 (W+1,): the window edges t0, b_1, ..., t_last

The cache directory is ``DIFFSOUP_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/diffsoup``, else
``~/.cache/diffsoup`` (read by :func:`diffsoup._settings.cache_dir`).

Zarr itself does not make concurrent writers safe (zarr 3.4: creating one array from two
processes is not exclusive, two writers of one chunk lose updates). So an entry is written whole
by one process in a directory of its own (``.tmp-<key>-<random>``), its checksum attribute last,
and then renamed into place with one ``os.rename``, which is atomic on a POSIX file system and
fails when the target exists: the loser of a race deletes its copy and reads the winner's. An
entry is therefore present only once complete. On reading, an entry whose metadata cannot be read,
whose ``complete`` flag or checksum is missing, or whose arrays do not match the checksum
(truncated or corrupted files) is reported with a :class:`WindowStoreWarning`, moved aside and
deleted, and the caller recomputes it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
import warnings
from pathlib import Path
from typing import Any, final

import numpy as np

from .._settings import cache_dir
from ..inference._window_cache import WindowCache, WindowEntry

FORMAT = "diffsoup.windows/1"
ARRAYS = ("starts", "edges")


class WindowStoreWarning(UserWarning):
    """An entry of the window store was incomplete or corrupted and is being recomputed."""


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

    Attributes:
        path: the Zarr group holding the entries (``root/windows``).
    """

    def __init__(self, root: Any = None):
        self.path = cache_dir(root) / "windows"

    def _ensure_root(self) -> None:
        """Create the group directory and its ``zarr.json`` (atomically; identical in every process)."""
        self.path.mkdir(parents=True, exist_ok=True)
        meta = self.path / "zarr.json"
        if not meta.exists():
            tmp = self.path / f".zarr.json.{uuid.uuid4().hex}"
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
        target = self.entry_path(key)
        arrays = {"starts": entry.starts, "edges": entry.edges}
        tmp = self.path / f".tmp-{key}-{uuid.uuid4().hex}"
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
        aside = where.with_name(f".bad-{where.name}-{uuid.uuid4().hex}")
        try:
            os.rename(where, aside)
        except OSError:
            return  # another process moved it already
        shutil.rmtree(aside, ignore_errors=True)

    def keys(self) -> list[str]:
        """The keys of the complete-looking entries present (not verified)."""
        if not self.path.exists():
            return []
        return sorted(p.name for p in self.path.iterdir() if p.is_dir() and not p.name.startswith("."))
