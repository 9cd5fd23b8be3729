"""Ensembles in Zarr: a store written chunk by chunk, resumable, labelled for xarray.

Layout (Zarr v3, ``format = "diffsoup.ensemble/1"``; each array carries its dimension names, so
``xarray.open_zarr(path)`` reads it labelled)::

    <path>/                  group; attrs: format, fingerprint, dims, chunk_rows, n_chunks,
                             parameter_names, status_codes (code -> name), status_messages,
                             runs (one record per write: started, finished, host, pid, chunks
                             written), complete (every chunk written), and the ensemble's own attrs
        <values>             float (rows, ...): what was simulated (``outputs`` or ``observables``),
                             NaN where a simulation failed or was not yet written
        status               int32 (rows, ...): a ds.Status code per simulation (-1: not written);
                             attrs flag_values / flag_meanings (CF) name the codes
        parameters           float64 (rows, d): the parameter values simulated
        parameter            str (d,): coordinate, the parameters' names
        <coordinates>        the ensemble's other coordinates (times, output names, ...)
        chunk_run            int32 (n_chunks,), one Zarr chunk per entry: the run that wrote each
                             chunk of rows (0: not yet); the completeness record

Every data array is chunked as the ensemble is (``chunk_rows`` rows), so each chunk of rows is its
own set of files and chunks can be written in any order, by any process, at the same time. A
chunk is written as a whole by :class:`ChunkWriter` (through Dask's ``da.store``): its parameters,
values and status first, its ``chunk_run`` entry last. Zarr's local store writes each file
atomically, so a killed writer leaves whole files: a chunk whose ``chunk_run`` is 0 may hold
anything and is written again by the next run; one whose ``chunk_run`` is set is complete and is
never computed again. Attributes (metadata) are written only by the process that opens the store.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

ENSEMBLE_FORMAT = "diffsoup.ensemble/1"
STATUS_NOT_WRITTEN = -1


@dataclasses.dataclass(frozen=True)
class EnsembleLayout:
    """Everything an ensemble store holds but the data: shapes, chunks, names, coordinates, attributes.

    Attributes:
        rows: the leading axis' length (simulations, or parameter draws).
        chunk_rows: rows per chunk.
        values_name: the name of the values array (``"outputs"``, ``"observables"``).
        value_dims: the values' dimension names, the leading one first.
        value_shape: the values' shape after the leading axis.
        status_dims: the status array's dimension names (the leading one first).
        status_shape: its shape after the leading axis.
        parameter_names: the parameters' names (the columns of ``parameters``).
        coordinates: name -> ``(dims, values)`` of the coordinates written once (times, names, ids).
        auxiliary: names of coordinates that are not dimension coordinates (listed in the values'
            ``coordinates`` attribute so that xarray reads them as coordinates).
        status_codes: code -> name of the status values (a flag table for readers).
        status_messages: name -> what it means.
        fingerprint: identifies what is simulated: a store is resumed only by the same ensemble.
        attrs: more attributes of the group (JSON values).
    """

    rows: int
    chunk_rows: int
    values_name: str
    value_dims: tuple[str, ...]
    value_shape: tuple[int, ...]
    status_dims: tuple[str, ...]
    status_shape: tuple[int, ...]
    parameter_names: tuple[str, ...]
    coordinates: Mapping[str, tuple[tuple[str, ...], Any]]
    auxiliary: tuple[str, ...]
    status_codes: Mapping[int, str]
    status_messages: Mapping[str, str]
    fingerprint: str
    attrs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def n_chunks(self) -> int:
        return -(-self.rows // self.chunk_rows)

    @property
    def value_width(self) -> int:
        return int(np.prod(self.value_shape, dtype=np.int64))

    @property
    def status_width(self) -> int:
        return int(np.prod(self.status_shape, dtype=np.int64))

    @property
    def row_width(self) -> int:
        """Columns of a combined row: parameters, values (flattened), status (flattened)."""
        return len(self.parameter_names) + self.value_width + self.status_width

    def chunk_slice(self, index: int) -> slice:
        return slice(index * self.chunk_rows, min((index + 1) * self.chunk_rows, self.rows))


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _consolidate(path: Path) -> None:
    import zarr

    with warnings.catch_warnings():
        # Consolidated metadata is an extension of Zarr v3 that zarr and xarray read; it spares
        # readers one file per array (xarray warns when it is missing).
        warnings.simplefilter("ignore", zarr.errors.ZarrUserWarning)
        zarr.consolidate_metadata(str(path))


class EnsembleStore:
    """An ensemble store on disk (see the module docstring): created or resumed by :meth:`open`.

    Attributes:
        path: the store's directory.
        layout: its :class:`EnsembleLayout`.
    """

    def __init__(self, path: Path, layout: EnsembleLayout):
        self.path = Path(path)
        self.layout = layout

    # -- opening ----------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: Any, layout: EnsembleLayout, *, resume: bool = True, overwrite: bool = False) -> "EnsembleStore":
        """Create the store at ``path``, or reopen the one there to finish it.

        Args:
            path: a directory (created with its parents).
            layout: what the store holds.
            resume: reopen a store of the same ensemble (same fingerprint) and write only its
                missing chunks; False refuses an existing store unless ``overwrite``.
            overwrite: replace whatever is at ``path`` (another ensemble's store included).

        Raises:
            FileExistsError: ``path`` exists, ``resume`` is False and ``overwrite`` is not set.
            ValueError: ``path`` holds something other than this ensemble's store (another
                ensemble, another kind of store, files) and ``overwrite`` is not set.
        """
        import zarr

        path = Path(path)
        if path.exists() and not overwrite:
            if not resume:
                raise FileExistsError(
                    f"to_zarr: {path} exists; pass resume=True to finish the ensemble written there, or "
                    "overwrite=True to replace it."
                )
            found = cls._read_attrs(path)
            if found.get("format") != ENSEMBLE_FORMAT:
                raise ValueError(
                    f"to_zarr: {path} exists and is not a diffsoup ensemble store (format {found.get('format')!r}); "
                    "choose another path or pass overwrite=True to replace it."
                )
            if found.get("fingerprint") != layout.fingerprint:
                raise ValueError(
                    f"to_zarr: {path} holds another ensemble (fingerprint {found.get('fingerprint')}, this one "
                    f"{layout.fingerprint}: other model, times, options, inputs or chunks). Write to another path, "
                    "or pass overwrite=True to replace it. To resume, build the inputs the same way (NumPy arrays, "
                    "da.from_array, ds.distributed.sample with its seed) and keep draws_per_chunk."
                )
            return cls(path, layout)
        if path.exists():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        cls._create(path, layout)
        return cls(path, layout)

    @staticmethod
    def _read_attrs(path: Path) -> dict:
        import zarr

        try:
            return dict(zarr.open_group(str(path), mode="r").attrs)
        except Exception:  # noqa: BLE001 (what zarr raises for a directory that is no group varies)
            return {}

    @staticmethod
    def _create(path: Path, layout: EnsembleLayout) -> None:
        import zarr

        root = zarr.open_group(str(path), mode="w-")
        rows, c = layout.rows, layout.chunk_rows
        d = len(layout.parameter_names)
        lead = layout.value_dims[0]
        values = root.create_array(
            layout.values_name, shape=(rows, *layout.value_shape), chunks=(c, *layout.value_shape), dtype="f8",
            fill_value=np.nan, dimension_names=layout.value_dims,
        )  # fmt: skip
        if layout.auxiliary:
            values.attrs["coordinates"] = " ".join(layout.auxiliary)
        status = root.create_array(
            "status", shape=(rows, *layout.status_shape), chunks=(c, *layout.status_shape), dtype="i4",
            fill_value=STATUS_NOT_WRITTEN, dimension_names=layout.status_dims,
        )  # fmt: skip
        codes = sorted(layout.status_codes)
        status.attrs.update(
            flag_values=[STATUS_NOT_WRITTEN, *codes],
            flag_meanings=" ".join(["NOT_WRITTEN", *(layout.status_codes[k] for k in codes)]),
            long_name="ds.Status code of each simulation",
        )  # fmt: skip
        root.create_array("parameters", shape=(rows, d), chunks=(c, d), dtype="f8", fill_value=np.nan,
                          dimension_names=(lead, "parameter"))  # fmt: skip
        root.create_array("parameter", data=np.asarray(layout.parameter_names, dtype=str), dimension_names=("parameter",))
        for name, (dims, data) in layout.coordinates.items():
            root.create_array(name, data=np.asarray(data), dimension_names=tuple(dims))
        root.create_array("chunk_run", shape=(layout.n_chunks,), chunks=(1,), dtype="i4", fill_value=0,
                          dimension_names=("chunk",))  # fmt: skip
        root.attrs.update(
            format=ENSEMBLE_FORMAT, fingerprint=layout.fingerprint, dims=list(layout.value_dims),
            chunk_rows=c, n_chunks=layout.n_chunks, parameter_names=list(layout.parameter_names),
            status_codes={str(k): v for k, v in layout.status_codes.items()},
            status_messages=dict(layout.status_messages), runs=[], complete=False, **dict(layout.attrs),
        )  # fmt: skip
        _consolidate(path)

    # -- the completeness record ------------------------------------------------------------------
    def chunk_runs(self) -> np.ndarray:
        """The run that wrote each chunk (0: not written yet)."""
        import zarr

        return np.asarray(zarr.open_array(str(self.path / "chunk_run"), mode="r")[:])

    def missing(self) -> list[int]:
        """The chunks not written yet, in order."""
        return [int(i) for i in np.flatnonzero(self.chunk_runs() == 0)]

    def completed(self) -> int:
        """How many chunks are written."""
        return int(np.count_nonzero(self.chunk_runs()))

    def status_counts(self) -> dict[str, int]:
        """Status name -> number of simulations with it (``NOT_WRITTEN`` for rows not yet written)."""
        import zarr

        status = np.asarray(zarr.open_array(str(self.path / "status"), mode="r")[:])
        codes, counts = np.unique(status, return_counts=True)
        names = {int(k): v for k, v in self.layout.status_codes.items()}
        names[STATUS_NOT_WRITTEN] = "NOT_WRITTEN"
        return {names.get(int(c), str(int(c))): int(n) for c, n in zip(codes, counts)}

    def chunk_status(self, index: int) -> np.ndarray:
        """The ``ds.Status`` codes of chunk ``index``'s rows (``-1``: not written)."""
        import zarr

        return np.asarray(zarr.open_array(str(self.path / "status"), mode="r")[self.layout.chunk_slice(index)])

    def begin_run(self, missing: Sequence[int]) -> int:
        """Record the start of a write of the chunks ``missing``; returns the run's number (1, 2, ...)."""
        import zarr

        root = zarr.open_group(str(self.path), mode="r+")
        runs = list(root.attrs.get("runs", []))
        number = len(runs) + 1
        runs.append({"run": number, "started": _now(), "finished": None, "host": socket.gethostname(),
                     "pid": os.getpid(), "chunks_to_write": len(missing)})  # fmt: skip
        root.attrs["runs"] = runs
        return number

    def finish_run(self, number: int) -> dict:
        """Record the end of run ``number`` (how many chunks it wrote, whether the store is complete)."""
        import zarr

        done = self.chunk_runs()
        root = zarr.open_group(str(self.path), mode="r+")
        runs = list(root.attrs.get("runs", []))
        record = dict(runs[number - 1], finished=_now(), chunks_written=int(np.count_nonzero(done == number)))
        runs[number - 1] = record
        root.attrs.update(runs=runs, complete=bool(np.all(done > 0)))
        _consolidate(self.path)
        return record

    def writer(self, run: int) -> "ChunkWriter":
        """The target Dask's ``da.store`` writes combined rows into, for run ``run``."""
        return ChunkWriter(str(self.path), self.layout, run)


class ChunkWriter:
    """A ``da.store`` target: ``writer[rows, :] = block`` writes one chunk of combined rows
    (parameters, flattened values, flattened status, see :attr:`EnsembleLayout.row_width`) into the
    store's arrays, then marks the chunk in ``chunk_run``. Picklable (it travels to Dask workers);
    each process opens the arrays once.

    Raises (on write):
        ValueError: for a block that is not one whole chunk of rows.
    """

    def __init__(self, path: str, layout: EnsembleLayout, run: int):
        self.path, self.layout, self.run = path, layout, run
        self._arrays: dict | None = None

    def __getstate__(self):
        return {"path": self.path, "layout": self.layout, "run": self.run, "_arrays": None}

    def _open(self) -> dict:
        if self._arrays is None:
            import zarr

            root = zarr.open_group(self.path, mode="r+")
            self._arrays = {k: root[k] for k in (self.layout.values_name, "status", "parameters", "chunk_run")}
        return self._arrays

    @property
    def shape(self) -> tuple[int, int]:
        return (self.layout.rows, self.layout.row_width)

    @property
    def dtype(self):
        return np.dtype(np.float64)

    @property
    def ndim(self) -> int:
        return 2

    def __setitem__(self, key, block) -> None:
        lay = self.layout
        rows = key[0] if isinstance(key, tuple) else key
        start, stop, _ = rows.indices(lay.rows)
        index, extra = divmod(start, lay.chunk_rows)
        if extra or lay.chunk_slice(index) != slice(start, stop):
            raise ValueError(f"ChunkWriter: rows {start}:{stop} are not one chunk of {lay.chunk_rows} rows.")
        block = np.asarray(block)
        d, nv = len(lay.parameter_names), lay.value_width
        arrays = self._open()
        n = stop - start
        arrays["parameters"][start:stop] = block[:, :d]
        arrays[lay.values_name][start:stop] = block[:, d : d + nv].reshape(n, *lay.value_shape)
        arrays["status"][start:stop] = block[:, d + nv :].astype(np.int32).reshape(n, *lay.status_shape)
        arrays["chunk_run"][index] = self.run  # last: the chunk is complete
