"""Arrays of a study's experiments read onto the host: NumPy as it is, Dask or Zarr chunk by chunk."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

# Experiments read at a time from an array that is not NumPy (Dask, Zarr) when its chunks do not say.
READ_ROWS = 65536


def _rows_of(x: Any) -> int | None:
    """Rows per chunk along the experiment axis of a chunked array (Dask: its first chunk; Zarr:
    its chunk shape), or None."""
    chunks = getattr(x, "chunks", None)
    if not chunks:
        return None
    first = chunks[0]
    return int(first[0] if isinstance(first, tuple) else first)


def read_rows(x: Any, who: str, field: str) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, rows)`` float64 NumPy blocks of ``x`` along its first axis: a NumPy array in one
    block (no copy when it already is float64), a Dask or Zarr array chunk by chunk."""
    if isinstance(x, np.ndarray) or not hasattr(x, "shape") or not hasattr(x, "__getitem__"):
        yield 0, np.asarray(x, dtype=np.float64)
        return
    n = int(x.shape[0])
    step = max(1, _rows_of(x) or READ_ROWS)
    for a in range(0, n, step):
        block = x[a : a + step]
        block = block.compute() if hasattr(block, "compute") else block
        yield a, np.asarray(block, dtype=np.float64)


def host_array(x: Any, who: str, field: str, check: Callable[[int, np.ndarray], None] | None = None) -> np.ndarray:
    """``x`` as one float64 NumPy array, read block by block (``check(start, block)`` on each)."""
    if isinstance(x, np.ndarray) or not hasattr(x, "shape"):
        out = np.asarray(x, dtype=np.float64)
        if check is not None:
            check(0, out)
        return out
    out = np.empty(tuple(int(s) for s in x.shape), dtype=np.float64)
    for a, block in read_rows(x, who, field):
        if check is not None:
            check(a, block)
        out[a : a + block.shape[0]] = block
    return out
