"""Where multiple-shooting window starts are kept between solves: the :class:`WindowCache` interface.

The numerical layer computes window starts and asks a cache for them by content key
(:func:`~diffsoup.inference.shooting._windows.window_key`); it does not know how a cache keeps them.
Two implementations:

- ``diffsoup.store.WindowStore``: a Zarr store under ``DIFFSOUP_CACHE_DIR``, shared by every
  process and allocation (safe under concurrent writers). It is the default of
  ``prepare_windows`` and ``InferenceProblem``.
- :class:`MemoryWindowCache`: a dictionary of this process (tests, throw-away work).

The default lives in a higher layer (the stores), which this layer may not import. It is named
here once, as a :class:`~diffsoup._lazy.LazyReference` (data, resolved on first use); the layer
test lists it as an allowed upward reference. Passing ``window_store=`` uses any other cache.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
from typing import Any, ContextManager, Mapping, final

import numpy as np

from ..._lazy import LazyReference

# The cache used when none is given: the shared Zarr store (see the module docstring).
DEFAULT_WINDOW_CACHE = LazyReference("diffsoup.store._windows", "WindowStore")


@dataclasses.dataclass(frozen=True, eq=False)
class WindowEntry:
    """The window starts of one experiment, as a cache keeps them.

    Attributes:
        starts: float64 ``(W-1, n)``: the start state of windows 1..W-1.
        edges: float64 ``(W+1,)``: the window edges ``t0, b_1, ..., t_last``.
        attrs: JSON-like notes (experiment id, state names; a store adds its own).

    Raises:
        ValueError: if ``starts`` is not 2-D or ``edges`` not 1-D with ``len(starts) + 2`` entries.
    """

    starts: np.ndarray
    edges: np.ndarray
    attrs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        starts = np.asarray(self.starts, dtype=np.float64)
        edges = np.asarray(self.edges, dtype=np.float64)
        if starts.ndim != 2:
            raise ValueError(f"WindowEntry.starts must be (W-1, n), got shape {starts.shape}.")
        if edges.shape != (starts.shape[0] + 2,):
            raise ValueError(f"WindowEntry.edges must be (W+1,) = ({starts.shape[0] + 2},) for {starts.shape[0]} "
                             f"starts, got shape {edges.shape}.")  # fmt: skip
        object.__setattr__(self, "starts", starts)
        object.__setattr__(self, "edges", edges)
        object.__setattr__(self, "attrs", dict(self.attrs))

    def fits(self, edges: np.ndarray, n_states: int) -> bool:
        """Whether this entry holds starts for exactly these window ``edges`` and ``n_states`` states."""
        edges = np.asarray(edges, dtype=np.float64)
        return self.starts.shape == (edges.size - 2, n_states) and bool(np.array_equal(self.edges, edges))


class WindowCache(abc.ABC):
    """Window starts by content key (a 32-character hex string of everything they depend on).

    Implementations decide where entries live; two processes saving one key must both end up
    reading the same entry (the key being a content hash, both copies are equal). A cache shared
    by processes also overrides :meth:`computing`, so that they pay for one solve per entry.
    """

    @abc.abstractmethod
    def load(self, key: str) -> WindowEntry | None:
        """The entry of ``key``, or None when absent (or unusable: the caller recomputes it)."""

    @abc.abstractmethod
    def save(self, key: str, entry: WindowEntry) -> bool:
        """Keep ``entry`` under ``key``.

        Returns:
            True if this call placed it; False if an entry of ``key`` was placed first (then
            :meth:`load` returns that one).

        Raises:
            OSError: where the cache cannot be written (the caller keeps its computed starts).
        """

    def computing(self, key: str) -> ContextManager[None]:
        """A context held while this process computes the entry of ``key``, so that other processes
        sharing the cache wait for that one solve instead of solving too.

        The caller loads the entry again inside the context (another process may have placed it
        meanwhile) and computes and saves it only if it is still missing. The default holds no
        lock (a cache of one process); a shared cache overrides it.
        """
        return contextlib.nullcontext()


@final
class MemoryWindowCache(WindowCache):
    """Window starts in a dictionary of this process (nothing on disk, nothing shared)."""

    def __init__(self) -> None:
        self._entries: dict[str, WindowEntry] = {}

    def load(self, key: str) -> WindowEntry | None:
        return self._entries.get(key)

    def save(self, key: str, entry: WindowEntry) -> bool:
        if not isinstance(entry, WindowEntry):
            raise TypeError(f"MemoryWindowCache.save: entry must be a WindowEntry, not {type(entry).__name__}.")
        if key in self._entries:
            return False
        self._entries[key] = entry
        return True

    def keys(self) -> list[str]:
        """The keys held."""
        return sorted(self._entries)

    def __repr__(self) -> str:
        return f"MemoryWindowCache({len(self._entries)} entries)"


def default_window_cache() -> WindowCache:
    """A new instance of the default cache (the Zarr window store under ``DIFFSOUP_CACHE_DIR``)."""
    return DEFAULT_WINDOW_CACHE.resolve()()


def window_cache(window_store: WindowCache | None) -> WindowCache:
    """``window_store`` checked, or the default cache when None.

    Raises:
        TypeError: for anything that is not a :class:`WindowCache`.
    """
    if window_store is None:
        return default_window_cache()
    if not isinstance(window_store, WindowCache):
        raise TypeError(f"window_store= must be a ds.inference.WindowCache (such as ds.store.WindowStore or "
                        f"ds.inference.MemoryWindowCache), not {type(window_store).__name__}.")  # fmt: skip
    return window_store
