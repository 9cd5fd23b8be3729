"""The one process-wide cache of lowered studies that campaign tasks and shards share.

A Dask worker (or the process running a serial campaign) runs many tasks on the same study: the
starts of a multistart (``ds.inference.multistart``, ``diffsoup campaign``), the profiles of
``ds.inference.profile``, the shard requests of ``ds.distributed.run``. Lowering a study, and then
compiling its programs, is the expensive part, so the first task lowers it and the others reuse
it. :data:`LOWERED` holds them, keyed by ``(fingerprint, options)``:

- ``fingerprint``: a string naming the study and how it is lowered -- a factory's
  ``fingerprint`` attribute where it has one (a study file's path and digest), else a SHA-256 of
  the pickled factory (:func:`fingerprint_of`); ``ds.distributed.run``'s ``study_fingerprint``
  (the study and its lowering options) for shards.
- ``options``: what is done to that lowered study besides (``()`` for the whole study,
  ``("restrict", members)`` for a shard of ``ds.distributed.run``).

The cache is bounded (least recently used entries go first: :data:`DEFAULT_MAX_ENTRIES`) and
thread-safe, since a Dask worker runs tasks in threads: two tasks asking for the same key at once
lower it once (the second waits for the first), tasks asking for different keys lower side by side.
A task holds on to what it got, so an entry evicted while it runs stays alive until it ends.
"""

from __future__ import annotations

import hashlib
import pickle
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from ..inference.objective._abstract_lowered import AbstractLoweredStudy

DEFAULT_MAX_ENTRIES = 16
"""Lowered studies a process keeps at most: enough for every shard a worker holds in a run (shards are
released when their run closes) beside a few campaign studies; their compiled programs stay in memory."""


class LoweredCache:
    """A bounded, thread-safe LRU cache of lowered studies keyed by ``(fingerprint, options)``.

    Args:
        max_entries: the most lowered studies kept; the least recently used go first.

    Attributes:
        lowerings: how many times :meth:`get` built an entry (for tests and diagnostics).
    """

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES):
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"LoweredCache: max_entries={max_entries!r} must be a positive integer.")
        self.max_entries = max_entries
        self.lowerings = 0
        self._entries: OrderedDict[tuple[str, Hashable], Any] = OrderedDict()
        self._gates: dict[tuple[str, Hashable], threading.Lock] = {}
        self._lock = threading.Lock()

    def get(self, fingerprint: str, options: Hashable, build: Callable[[], Any]) -> tuple[Any, bool]:
        """The entry of ``(fingerprint, options)``, built by ``build()`` if the cache has none.

        Returns:
            ``(entry, built)``: ``built`` is True when this call built it.

        Raises:
            TypeError: for a fingerprint that is not a string or options that are not hashable.
            Whatever ``build`` raises (nothing is kept then).
        """
        if not isinstance(fingerprint, str):
            raise TypeError(f"LoweredCache.get: fingerprint must be a string, not {type(fingerprint).__name__}.")
        try:
            hash(options)
        except TypeError:
            raise TypeError(f"LoweredCache.get: options={options!r} must be hashable (a tuple, not a list or "
                            "dict).") from None  # fmt: skip
        key = (fingerprint, options)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key], False
            gate = self._gates.setdefault(key, threading.Lock())
        with gate:  # one builder per key; the others wait for its entry
            with self._lock:
                if key in self._entries:
                    self._entries.move_to_end(key)
                    return self._entries[key], False
            try:
                entry = build()
            finally:
                with self._lock:
                    if self._gates.get(key) is gate:
                        del self._gates[key]
            with self._lock:
                self._entries[key] = entry
                self.lowerings += 1
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
            return entry, True

    def discard(self, fingerprint: str) -> int:
        """Drop every entry of ``fingerprint`` (any options); returns how many were dropped."""
        with self._lock:
            keys = [k for k in self._entries if k[0] == fingerprint]
            for k in keys:
                del self._entries[k]
        return len(keys)

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()

    def keys(self) -> list[tuple[str, Hashable]]:
        """The keys held, least recently used first."""
        with self._lock:
            return list(self._entries)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries


LOWERED = LoweredCache()
"""The process's cache: every campaign task and shard of this process uses it."""


def fingerprint_of(factory: Callable[[], Any]) -> str:
    """The fingerprint of a factory of a lowered study: its ``fingerprint`` attribute (a string)
    where it has one, else the SHA-256 (16 hex digits) of the factory pickled (by cloudpickle where
    installed: lambdas and closures by value; module-level functions by name), else its repr.

    Compute it where the task is made, once: the task carries it to the workers."""
    given = getattr(factory, "fingerprint", None)
    if isinstance(given, str):
        return given
    try:
        import cloudpickle

        blob = cloudpickle.dumps(factory)
    except ImportError:  # pragma: no cover (Dask brings cloudpickle)
        try:
            blob = pickle.dumps(factory)
        except Exception:  # noqa: BLE001 (an unpicklable factory runs in this process only)
            blob = repr(factory).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def lowered_from(source: AbstractLoweredStudy | Callable[[], AbstractLoweredStudy],
                 fingerprint: str | None = None) -> tuple[AbstractLoweredStudy, bool]:  # fmt: skip
    """The lowered study of a task: ``source`` itself when it is one, else the cache's entry of the
    factory ``source`` under ``fingerprint`` (:func:`fingerprint_of` when None), built by calling
    it on first use.

    Returns:
        ``(lowered, built)``: ``built`` is True when this call lowered the study.

    Raises:
        TypeError: if the factory returns something other than a lowered study.
    """
    if isinstance(source, AbstractLoweredStudy):
        return source, False

    def build() -> AbstractLoweredStudy:
        lowered = source()
        if not isinstance(lowered, AbstractLoweredStudy):
            raise TypeError(f"the factory {source!r} returned a {type(lowered).__name__}, not a lowered study "
                            "(ds.lower's or ds.distributed.run's).")  # fmt: skip
        return lowered

    return LOWERED.get(fingerprint if fingerprint is not None else fingerprint_of(source), (), build)
