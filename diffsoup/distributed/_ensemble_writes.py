"""Writing an ensemble into its Zarr store: :class:`EnsembleWrite` (what
:meth:`~diffsoup.distributed._ensemble.Ensemble.to_zarr` did), the runs of consecutive missing
chunks it writes, and the computation of Dask's store graph with a progress report.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Sequence

import numpy as np

from ..store._ensemble_store import EnsembleStore
from ._dashboard_publish import ensemble_reporter
from ._progress import ProgressBar


@dataclasses.dataclass(frozen=True)
class EnsembleWrite:
    """What :meth:`Ensemble.to_zarr` did.

    Attributes:
        path: the store.
        run: this write's number in the store (1 for the first; 0 when nothing was missing).
        chunks: chunks of the ensemble.
        written: chunks this run wrote (the others were complete before it, or are still missing
            if it failed).
        complete: every chunk is in the store.
        seconds: wall time of the write.
        status: ``ds.Status`` name -> number of simulations with it, over the whole store.
    """

    path: Path
    run: int
    chunks: int
    written: int
    complete: bool
    seconds: float
    status: dict



def _runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted indices grouped into runs of consecutive ones: ``[(first, last), ...]``."""
    out: list[list[int]] = []
    for i in indices:
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return [(a, b) for a, b in out]


def _write_result(target: EnsembleStore, run: int, written: int, seconds: float) -> EnsembleWrite:
    done = target.chunk_runs()
    return EnsembleWrite(target.path, run, target.layout.n_chunks, written, bool(np.all(done > 0)), seconds,
                         target.status_counts())  # fmt: skip


def _compute_with_progress(stored, target: EnsembleStore, to_write: int, total: int, client, progress) -> None:
    """Compute ``stored`` (Dask's store graph, unoptimized: the solve tasks keep their resources)
    here, while a thread reports the chunks marked in the store about once a second (so that
    Ctrl-C reaches the computation)."""
    bar = None
    if progress is True:
        bar = ProgressBar(total, total - to_write, 0, True, desc="diffsoup ensemble")
        report = lambda done: bar.update(done, 0)  # noqa: E731
    elif callable(progress):
        report = lambda done: progress(done, total)  # noqa: E731
    else:
        report = None
    report = ensemble_reporter(target, total, to_write, report, client)  # the dashboard page (Dask)
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(1.0):
            report(target.completed())

    reporter = threading.Thread(target=poll, name="diffsoup-ensemble-progress", daemon=True) if report else None
    if reporter is not None:
        reporter.start()
    try:
        if client is not None:
            future = client.compute(stored, optimize_graph=False)
            try:
                future.result()
            except BaseException:
                future.cancel()
                raise
        else:
            stored.compute(optimize_graph=False)
    finally:
        stop.set()
        if reporter is not None:
            reporter.join()
            report(target.completed())
        if bar is not None:
            bar.close()
