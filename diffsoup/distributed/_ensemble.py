"""``ds.distributed.ensemble``: many simulations as a lazy Dask array, written to Zarr chunk by chunk.

An ensemble of a built problem solves ``ds.simulate`` once per row of ``params`` (and ``y0``):
values ``(experiments, times, outputs)`` and a status ``(experiments,)``. An ensemble of a study
predicts the study's observables at each parameter draw: values ``(draws, experiments, times,
observables)`` (padded with NaN where experiments have fewer times or observables) and a status
``(draws, experiments)``.

Execution: the rows are split into chunks of ``chunk_size`` (a simple rule for now: the argument,
else the setting ``diffsoup.ensemble.chunk-size``, 1024 simulations; a study's chunks hold that
many simulations' worth of draws, at least one). Each chunk is one Dask task running one jitted,
vmapped solve (the last chunk is padded to the same size, so every chunk runs one program),
compiled once per worker process. The solve task is annotated with ``resources`` (``{"GPU": 1}``,
the setting ``diffsoup.ensemble.resources``) when the Dask client current at ``ensemble()``'s call
has a worker offering them, so it runs on GPU workers, one at a time per GPU; without such workers
(CPU clusters, no client) it runs on any worker. The tasks around it (drawing the inputs, writing
into Zarr) ask for nothing, so a worker's second thread runs them beside the next chunk's solve
(``diffsoup.cluster.threads-per-worker``): :meth:`Ensemble.compute` and :meth:`Ensemble.to_zarr`
compute without Dask's graph optimization, which would fuse them into the solve task and lose its
annotation. The task returns one combined block per chunk (parameters, values,
status), which :meth:`Ensemble.values` and :meth:`Ensemble.status` slice: compute them together
(``dask.compute(ens.values, ens.status)``) to solve each chunk once.

Failures are values: a simulation that fails has its ``ds.Status`` code in the status array and
NaN values; the chunk itself succeeds. A chunk whose worker dies is computed again by Dask.

:meth:`Ensemble.to_zarr` writes through Dask's own writer (``da.store``, one region per chunk) into
a store with a completeness record (:mod:`diffsoup.store._ensemble_store`): a rerun after a killed
client or allocation computes only the chunks not yet written.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import hashlib
import inspect
import json
import threading
import time
import typing
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..store._ensemble_store import EnsembleLayout, EnsembleStore
from ._config import get
from ._dask_campaign import check_resources

# simulate()'s keywords an ensemble passes on (the rest it sets itself).
_OWN_KEYWORDS = ("y0", "t_eval", "params", "throw", "problem")


# ------------------------------------------------------------------------------------------------
# What an ensemble returns
# ------------------------------------------------------------------------------------------------


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


@dataclasses.dataclass(frozen=True)
class Ensemble:
    """A lazy ensemble: Dask arrays chunked along the leading axis, one solve task per chunk.

    Attributes:
        combined: the Dask array ``(rows, width)`` each chunk's task returns: per row the
            parameters, the values (flattened) and the status (see ``layout.row_width``).
        params: the parameter values simulated, a Dask array ``(rows, d)`` (columns
            ``parameter_names``); computing it runs no solve.
        layout: shapes, dimension names, coordinates and attributes (what the store holds).
        resources: what each chunk's solve task asks of a worker (``{}``: any worker). Dask's
            graph optimization fuses a chunk's tasks into ones without the annotation:
            :meth:`compute` and :meth:`to_zarr` compute with ``optimize_graph=False``; computing
            ``values`` yourself on a cluster, do the same (``client.compute(ens.values,
            optimize_graph=False)``).
    """

    combined: Any
    params: Any
    layout: EnsembleLayout
    resources: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @property
    def values(self):
        """The simulated values, a Dask array: ``(experiments, times, outputs)`` for a problem,
        ``(draws, experiments, times, observables)`` for a study; NaN where a simulation failed."""
        lay = self.layout
        d = len(lay.parameter_names)
        return self.combined[:, d : d + lay.value_width].reshape(lay.rows, *lay.value_shape)

    @property
    def status(self):
        """A ``ds.Status`` code (int32) per simulation, a Dask array ``(experiments,)`` for a
        problem, ``(draws, experiments)`` for a study."""
        lay = self.layout
        start = len(lay.parameter_names) + lay.value_width
        return self.combined[:, start:].astype(np.int32).reshape(lay.rows, *lay.status_shape)

    def __iter__(self):
        """``values, status = ds.distributed.ensemble(...)``: the two lazy arrays."""
        return iter((self.values, self.status))

    @property
    def parameter_names(self) -> tuple[str, ...]:
        return self.layout.parameter_names

    @property
    def dims(self) -> tuple[str, ...]:
        """The dimension names of :attr:`values`."""
        return self.layout.value_dims

    @property
    def coords(self) -> dict:
        """Coordinates by name: ``(dims, values)`` (times, output or observable names, ids)."""
        return dict(self.layout.coordinates)

    @property
    def chunk_size(self) -> int:
        """Rows (simulations, or draws of a study) per chunk."""
        return self.layout.chunk_rows

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.layout.rows, *self.layout.value_shape)

    def compute(self, client: Any = None, **kwargs) -> tuple[np.ndarray, np.ndarray]:
        """``(values, status)`` as NumPy arrays, each chunk solved once: on ``client`` (the solves
        on its workers offering :attr:`resources`), else with ``dask.compute(**kwargs)``."""
        import dask

        if client is not None:
            combined = np.asarray(client.compute(self.combined, optimize_graph=False, sync=True))
        else:
            combined = np.asarray(dask.compute(self.combined, **{"optimize_graph": False, **kwargs})[0])
        lay = self.layout
        d = len(lay.parameter_names)
        values = combined[:, d : d + lay.value_width].reshape(lay.rows, *lay.value_shape)
        status = combined[:, d + lay.value_width :].astype(np.int32).reshape(lay.rows, *lay.status_shape)
        return values, status

    def to_zarr(self, store: Any, *, resume: bool = True, overwrite: bool = False, client: Any = None,
                progress: bool | Callable[[int, int], None] = False) -> EnsembleWrite:  # fmt: skip
        """Write the ensemble into a Zarr store, chunk by chunk, through Dask's ``da.store``.

        Each chunk's rows are written into its own region of the store's arrays, then the chunk
        is marked done in the store's completeness record. Run it again after a crash, a killed
        client or an ended allocation: only the chunks not yet marked are computed.

        Args:
            store: the store's directory (a path).
            resume: finish a store of this same ensemble found at ``store``; False refuses an
                existing store (unless ``overwrite``).
            overwrite: replace what is at ``store``.
            client: a ``distributed.Client`` to compute on (each chunk's solve asks for
                :attr:`resources`; reading its inputs and writing it ask for nothing, so they run
                beside the next solve, where the data is); None uses Dask's current scheduler (a
                default client if one is set, else local threads).
            progress: True draws a progress bar on stderr; a callable gets ``(chunks done,
                chunks)`` about once a second.

        Returns:
            An :class:`EnsembleWrite`.

        Raises:
            FileExistsError, ValueError: for a store that cannot be resumed (see
                ``EnsembleStore.open``); the message says what to do.
        """
        import dask.array as da

        t0 = time.perf_counter()
        target = EnsembleStore.open(store, self.layout, resume=resume, overwrite=overwrite)
        missing = target.missing()
        lay = self.layout
        if not missing:
            return _write_result(target, 0, 0, time.perf_counter() - t0)
        run = target.begin_run(missing)
        writer = target.writer(run)
        sources, regions = [], []
        for first, last in _runs(missing):  # contiguous chunks: one slice of the ensemble each
            rows = slice(first * lay.chunk_rows, min((last + 1) * lay.chunk_rows, lay.rows))
            sources.append(self.combined[rows])
            regions.append((rows, slice(None)))
        stored = da.store(sources, [writer] * len(sources), regions=regions, lock=False, compute=False)
        _compute_with_progress(stored, target, len(missing), lay.n_chunks, client, progress)
        record = target.finish_run(run)
        return _write_result(target, run, record["chunks_written"], time.perf_counter() - t0)


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
    from ._dashboard_publish import ensemble_reporter
    from ._progress import ProgressBar

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


# ------------------------------------------------------------------------------------------------
# Chunk programs: one jitted, vmapped solve per chunk, one program per worker process
# ------------------------------------------------------------------------------------------------

_PROGRAMS: collections.OrderedDict[str, Any] = collections.OrderedDict()
_PROGRAMS_LOCK = threading.Lock()
_KEPT_PROGRAMS = 8


def _restore(cls, token: str, state: dict):
    """Unpickling a chunk program: the one this process already holds under ``token`` (so its
    compiled program is reused by every chunk the process runs), else this one, kept."""
    with _PROGRAMS_LOCK:
        found = _PROGRAMS.get(token)
        if found is None:
            found = cls.__new__(cls)
            found.__dict__.update(state)
            found._jitted, found._lock = None, threading.Lock()
            _PROGRAMS[token] = found
            while len(_PROGRAMS) > _KEPT_PROGRAMS:
                _PROGRAMS.popitem(last=False)
        else:
            _PROGRAMS.move_to_end(token)
        return found


class _ChunkProgram(abc.ABC):
    """Callable on a chunk's blocks, returning its combined rows (NumPy, float64); pickled by
    reference to a per-process registry (see :func:`_restore`), built on first call."""

    token: str
    rows: int

    def __init__(self, rows: int):
        self.token = uuid.uuid4().hex
        self.rows = rows
        self._jitted = None
        self._lock = threading.Lock()
        with _PROGRAMS_LOCK:
            _PROGRAMS[self.token] = self

    def __reduce__(self):
        state = {k: v for k, v in self.__dict__.items() if k not in ("_jitted", "_lock")}
        return (_restore, (type(self), self.token, state))

    def _program(self):
        with self._lock:
            if self._jitted is None:
                self._jitted = self._build()
            return self._jitted

    @abc.abstractmethod
    def _build(self) -> Any:
        """What :meth:`_program` returns, made once per process (a jitted function, say)."""

    @abc.abstractmethod
    def __call__(self, *blocks) -> np.ndarray:
        """The combined rows ``(c, width)`` of one chunk's input blocks."""


def _pad(block: np.ndarray, rows: int) -> np.ndarray:
    """``block`` with its last row repeated up to ``rows`` rows (one program for every chunk)."""
    if block.shape[0] == rows:
        return block
    return np.concatenate([block, np.repeat(block[-1:], rows - block.shape[0], axis=0)])


@typing.final
class _ProblemChunk(_ChunkProgram):
    """A problem's chunk: one jitted, vmapped ``ds.simulate`` (and observables) on the padded rows."""

    def __init__(self, problem, t_eval, columns, defaults, observables, with_t, options, y0, rows):
        super().__init__(rows)
        self.problem, self.t_eval, self.columns = problem, t_eval, columns
        self.defaults, self.observables, self.with_t = defaults, observables, with_t
        self.options, self.y0 = options, y0

    def _build(self):
        import jax
        import jax.numpy as jnp

        from ..integrate import simulate

        problem, t_eval, obs, with_t, options = self.problem, self.t_eval, self.observables, self.with_t, self.options

        def one(pvec, y0):
            sol = simulate(problem, y0, t_eval, pvec, throw=False, **options)
            ys = sol.ys
            if obs is not None:
                p = problem.params_dict(pvec)
                if with_t:
                    ys = jax.vmap(lambda t, y: jnp.asarray(obs(t, y, p)))(sol.ts, ys)
                else:
                    ys = jax.vmap(lambda y: jnp.asarray(obs(y, p)))(ys)
            return ys.astype(jnp.float64), sol.status

        batched_y0 = self.y0 is None
        return jax.jit(jax.vmap(one, in_axes=(0, 0 if batched_y0 else None)))

    def __call__(self, params_block, y0_block=None):
        params_block = np.asarray(params_block, dtype=np.float64)
        c = params_block.shape[0]
        full = np.repeat(np.asarray(self.defaults, np.float64)[None], self.rows, axis=0)
        full[:, self.columns] = _pad(params_block, self.rows)
        y0 = self.y0 if y0_block is None else _pad(np.asarray(y0_block, np.float64), self.rows)
        import jax

        values, status = jax.device_get(self._program()(full, y0))
        return np.concatenate(
            [params_block, np.asarray(values[:c], np.float64).reshape(c, -1), np.asarray(status[:c], np.float64)[:, None]],
            axis=1,
        )


@typing.final
class _StudyChunk(_ChunkProgram):
    """A study's chunk: ``InferenceProblem.predict`` at each draw (one jitted, vmapped program per
    group of experiments, compiled once per process by ``predict``'s own cache)."""

    def __init__(self, problem, theta_columns, theta_scales, shape, rows):
        super().__init__(rows)
        self.problem = problem  # an InferenceProblem of the study (single shooting)
        self.theta_columns, self.theta_scales = theta_columns, theta_scales
        self.shape = shape  # (experiments, times, observables)

    def _build(self):
        return self.problem  # the same object for every chunk: predict()'s compiled programs are reused

    def __call__(self, params_block):
        params_block = np.asarray(params_block, dtype=np.float64)
        c = params_block.shape[0]
        E, M, K = self.shape
        problem = self._program()
        values = np.full((c, E, M, K), np.nan)
        status = np.zeros((c, E))
        theta = np.repeat(problem.nominal[None], c, axis=0)
        for j, (column, scale) in enumerate(zip(self.theta_columns, self.theta_scales)):
            v = params_block[:, column]
            with np.errstate(divide="ignore", invalid="ignore"):  # a non-positive draw fails its solves
                theta[:, j] = v if scale == "lin" else np.log(v) if scale == "log" else np.log10(v)
        ids = {e.id: i for i, e in enumerate(problem.study.experiments)}
        for row in range(c):
            for eid, rec in problem.predict(theta[row]).items():
                i = ids[eid]
                h = np.asarray(rec["observables"], np.float64)
                values[row, i, : h.shape[0], : h.shape[1]] = h
                status[row, i] = rec["status"]
        return np.concatenate([params_block, values.reshape(c, -1), status], axis=1)


# ------------------------------------------------------------------------------------------------
# Building an ensemble
# ------------------------------------------------------------------------------------------------


def _current_client(client=None):
    if client is not None:
        return client
    try:
        from distributed import default_client

        return default_client()
    except (ImportError, ValueError):
        return None


def ensemble_resources(resources: Mapping[str, float] | None, client: Any = None) -> dict[str, float]:
    """The resources each chunk's task asks for: ``resources`` as given (``{}``: none), else the
    setting ``diffsoup.ensemble.resources`` when the current client (``client``, else Dask's
    default client) has a worker offering them, else none (any worker, e.g. CPU clusters).

    Raises:
        TypeError, ValueError: for bad ``resources`` (given or configured).
    """
    if resources is not None:
        return check_resources(resources)
    wanted = check_resources(get("ensemble.resources"))
    client = _current_client(client)
    if not wanted or client is None:
        return {}
    try:
        workers = client.scheduler_info(n_workers=-1)["workers"].values()
    except Exception:  # noqa: BLE001 (an unreachable scheduler: leave the tasks unpinned)
        return {}
    for info in workers:
        offered = info.get("resources") or {}
        if all(offered.get(name, 0) >= amount for name, amount in wanted.items()):
            return wanted
    return {}


def _chunk_rows(chunk_size: Any, per_row: int = 1) -> int:
    if chunk_size is None:
        size = get("ensemble.chunk-size")
        if isinstance(size, str):
            size = int(size)
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"the setting diffsoup.ensemble.chunk-size={size!r} must be a positive integer.")
        return max(1, int(size) // per_row)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size!r} must be a positive integer (rows per chunk).")
    return int(chunk_size)


def _as_dask(x: Any, name: str, chunk_rows: int, width: int | None = None):
    """``x`` (NumPy or Dask) as a float64 Dask array chunked by ``chunk_rows`` rows, one chunk across."""
    import dask.array as da

    if isinstance(x, da.Array):
        arr = x
    else:
        try:
            arr = np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"ensemble: {name} must be a NumPy or Dask array of numbers.") from None
        arr = da.from_array(arr, chunks=(chunk_rows,) + arr.shape[1:] if arr.ndim else ())
    if arr.ndim != 2:
        raise ValueError(f"ensemble: {name} has shape {arr.shape}; give (rows, {width if width else 'columns'}).")
    if width is not None and arr.shape[1] != width:
        raise ValueError(f"ensemble: {name} has {arr.shape[1]} columns; expected {width}.")
    if not np.issubdtype(arr.dtype, np.number):
        raise TypeError(f"ensemble: {name} must hold numbers, not {arr.dtype}.")
    return arr.astype(np.float64).rechunk((chunk_rows, arr.shape[1]))


def _source(fn: Any) -> str:
    if fn is None:
        return ""
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return getattr(fn, "__qualname__", repr(fn))


def _fingerprint(description: Mapping[str, Any]) -> str:
    text = json.dumps(description, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _status_tables() -> tuple[dict[int, str], dict[str, str]]:
    from ..integrate import Status

    return {int(s): s.name for s in Status}, {s.name: s.message for s in Status}


def _observable_arity(fn: Callable) -> bool:
    """True for ``fn(t, y, p)``, False for ``fn(y, p)`` (told apart by positional parameters)."""
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]  # fmt: skip
    except (TypeError, ValueError):
        return False
    if len(params) not in (2, 3):
        raise TypeError(
            f"ensemble: observables must be observables(y, p) or observables(t, y, p); {fn!r} takes "
            f"{len(params)} positional parameters."
        )
    return len(params) == 3


def ensemble(
    target: Any,
    *,
    params: Any = None,
    y0: Any = None,
    t_eval: Any = None,
    parameter_names: Sequence[str] | None = None,
    observables: Callable | None = None,
    output_names: Sequence[str] | None = None,
    solver: Any = None,
    chunk_size: int | None = None,
    resources: Mapping[str, float] | None = None,
    client: Any = None,
    **options: Any,
) -> Ensemble:
    """An ensemble of simulations as lazy Dask arrays, chunked along the leading axis.

    Of a built problem (``target`` a ``ds.Problem``): one ``ds.simulate(problem, y0[i], t_eval,
    params[i])`` per row ``i``; values ``(experiments, times, outputs)``. Of a study (``target`` a
    ``ds.Study``): the observables of every experiment at each parameter draw (``params`` rows);
    values ``(draws, experiments, times, observables)``. See the module docstring for chunks,
    resources and failures.

    Args:
        target: a built ``ds.Problem`` or a ``ds.Study``.
        params: parameter values (linear), a NumPy or Dask array ``(rows, d)`` whose columns are
            ``parameter_names``, or a mapping name -> ``(rows,)`` array. Problem: None simulates
            the defaults once per row of ``y0``. Study: required (e.g. ``ds.distributed.sample``).
        y0: problem only: initial states, ``(rows, n)`` (NumPy or Dask), ``(n,)`` for all rows,
            or None for the spec's ``y0``.
        t_eval: problem only: the output times ``(m,)`` shared by every row.
        parameter_names: the columns of ``params``. Problem: model parameter names (default: all
            of ``problem.parameter_names``; the others keep their defaults). Study: entry names
            (``k``, ``k[member]``) or parameter names of the study's table (default: the
            estimated entries, ``ParameterBox.of(study).names``); the others keep their nominal values.
        observables: problem only: ``observables(y, p)`` or ``observables(t, y, p)`` -> ``(k,)``
            (``p`` the parameters by name); None returns the states.
        output_names: names of the outputs (problem) or of the observable columns (study).
        solver: study only: a ``ds.inference.SolverOptions`` (tolerances, step budget).
        chunk_size: rows per chunk (problem: simulations; study: draws); None reads the setting
            ``diffsoup.ensemble.chunk-size`` (a study's chunks hold that many simulations' worth
            of draws). The inputs are rechunked to it.
        resources: what each chunk's task asks of a worker (``{}``: nothing); None reads the
            setting ``diffsoup.ensemble.resources`` and applies it only where the current client
            (``client``, else Dask's default) has a worker offering it.
        client: the ``distributed.Client`` whose workers decide ``resources`` (None: the default one).
        **options: problem only: ``ds.simulate``'s keywords (``rtol``, ``atol``, ``method``,
            ``max_steps``, ``t0``, ...), the same for every row.

    Returns:
        An :class:`Ensemble` (lazy: nothing is solved until it is computed or written).

    Raises:
        TypeError: for a ``target`` that is neither, an unknown ``ds.simulate`` keyword, or
            options of the other kind of target.
        ValueError: for shapes that do not match, unknown parameter names, missing ``t_eval``
            or ``params``, a bad ``chunk_size``.
    """
    from ..inference import Study
    from ..model import Problem

    if isinstance(target, Problem):
        if solver is not None:
            raise TypeError("ensemble: solver= is for a study; give a problem's ds.simulate options as keywords "
                            "(rtol=, atol=, max_steps=, ...).")  # fmt: skip
        return _problem_ensemble(target, params, y0, t_eval, parameter_names, observables, output_names, chunk_size,
                                 resources, client, options)  # fmt: skip
    if isinstance(target, Study):
        for name, value in (("y0", y0), ("t_eval", t_eval), ("observables", observables)):
            if value is not None:
                raise TypeError(f"ensemble: {name}= is for a problem; a study's experiments carry their own.")
        if options:
            raise TypeError(f"ensemble: {sorted(options)} are ds.simulate options; for a study give "
                            "solver=ds.inference.SolverOptions(...).")  # fmt: skip
        return _study_ensemble(target, params, parameter_names, output_names, solver, chunk_size, resources, client)
    raise TypeError(f"ensemble: target must be a built ds.Problem (spec.build()) or a ds.Study, not {type(target).__name__}.")


def _named_columns(params: Any, names: Sequence[str] | None, known: Sequence[str], chunk_rows: int, where: str):
    """``params`` as a Dask array ``(rows, d)`` and the names of its columns."""
    import dask.array as da

    if isinstance(params, Mapping):
        if names is not None:
            raise TypeError(f"ensemble: give parameter_names= only with an array of params, not a mapping ({where}).")
        names = tuple(params)
        columns = []
        for n in names:
            col = params[n]
            col = col if isinstance(col, da.Array) else np.asarray(col, dtype=np.float64)
            if col.ndim != 1:
                raise ValueError(f"ensemble: params[{n!r}] has shape {col.shape}; give one value per row (rows,).")
            columns.append(col if isinstance(col, da.Array) else da.from_array(col, chunks=chunk_rows))
        lengths = {c.shape[0] for c in columns}
        if len(lengths) > 1:
            raise ValueError(f"ensemble: the arrays of params have different lengths {sorted(lengths)}.")
        params = da.stack(columns, axis=1) if columns else None
    names = tuple(known if names is None else names)
    if isinstance(names, str):
        raise TypeError("ensemble: parameter_names= is a sequence of names, not one string.")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"ensemble: unknown parameter name(s) {unknown}; {where} has {list(known)}.")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"ensemble: parameter names {dup} appear twice.")
    if params is None:
        return None, names
    return _as_dask(params, "params", chunk_rows, len(names)), names


def _problem_ensemble(problem, params, y0, t_eval, parameter_names, observables, output_names, chunk_size, resources,
                      client, options) -> Ensemble:  # fmt: skip
    import dask
    import dask.array as da
    import jax
    import jax.numpy as jnp

    from ..integrate import simulate

    allowed = set(inspect.signature(simulate).parameters) - set(_OWN_KEYWORDS)
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise TypeError(f"ensemble: unknown ds.simulate option(s) {unknown}; it takes {sorted(allowed)}.")
    if t_eval is None:
        raise ValueError("ensemble: give t_eval, the output times shared by every simulation.")
    t_eval = np.atleast_1d(np.asarray(t_eval, dtype=np.float64))
    if t_eval.ndim != 1 or t_eval.size == 0:
        raise ValueError(f"ensemble: t_eval has shape {t_eval.shape}; give a non-empty 1-D array of times.")
    rows_c = _chunk_rows(chunk_size)
    params_da, names = _named_columns(params, parameter_names, problem.parameter_names, rows_c, "the problem")
    n = problem.n_states
    y0_da, y0_fixed = None, None
    if y0 is None:
        if problem.spec.y0 is None:
            raise ValueError(f"ensemble: the spec {problem.spec.name!r} has no y0; give y0= ((n,) or (rows, n)).")
        y0_fixed = np.asarray(problem.spec.y0, np.float64)
    elif not isinstance(y0, da.Array) and np.ndim(y0) == 1:
        y0_fixed = np.asarray(y0, np.float64)
        if y0_fixed.shape != (n,):
            raise ValueError(f"ensemble: y0 has shape {y0_fixed.shape}; give ({n},) or (rows, {n}).")
    else:
        y0_da = _as_dask(y0, "y0", rows_c, n)
    if params_da is None:
        if problem.spec.parameter_defaults is None and problem.parameter_names:
            raise ValueError(f"ensemble: {problem.spec.name!r} has no default parameter values; give params=.")
        if y0_da is None:
            raise ValueError("ensemble: give params= (rows, d) or y0= (rows, n): the rows to simulate.")
        names = ()
        params_da = da.zeros((y0_da.shape[0], 0), chunks=(rows_c, 0))
    rows = params_da.shape[0]
    if y0_da is not None and y0_da.shape[0] != rows:
        raise ValueError(f"ensemble: params has {rows} rows and y0 {y0_da.shape[0]}; give one of each per simulation.")
    if rows == 0:
        raise ValueError("ensemble: no rows to simulate.")
    defaults = np.asarray(problem.parameter_vector(None) if problem.spec.parameter_defaults is not None
                          else np.zeros(len(problem.parameter_names)), np.float64)  # fmt: skip
    columns = np.array([problem.parameter_names.index(nm) for nm in names], dtype=np.int64)
    with_t = _observable_arity(observables) if observables is not None else False
    if observables is None:
        k = n
    else:
        # Traced once here: a wrong observables function fails now, naming itself, not in a worker.
        def probe(y, p):
            pd = problem.params_dict(p)
            return jnp.asarray(observables(jnp.zeros((), y.dtype), y, pd) if with_t else observables(y, pd))

        try:
            shape = jax.eval_shape(probe, jnp.zeros((n,), problem.dtype), jnp.zeros((len(defaults),), problem.dtype)).shape
        except Exception as err:
            raise ValueError(f"ensemble: observables failed when traced with y ({n},): {type(err).__name__}: {err}") from err
        if len(shape) != 1:
            raise ValueError(f"ensemble: observables returned shape {shape}; it must return a 1-D array (k,).")
        k = shape[0]
    if output_names is None:
        output_names = problem.state_names if observables is None else tuple(f"observable_{i}" for i in range(k))
    output_names = tuple(str(s) for s in output_names)
    if len(output_names) != k:
        raise ValueError(f"ensemble: {len(output_names)} output_names for {k} outputs.")
    program = _ProblemChunk(problem, t_eval, columns, defaults, observables, with_t, dict(options), y0_fixed, rows_c)
    m = t_eval.size
    width = len(names) + m * k + 1
    pinned = ensemble_resources(resources, client)
    codes, messages = _status_tables()
    description = {
        "kind": "problem", "problem": problem.fingerprint, "t_eval": t_eval.tolist(), "parameters": list(names),
        "outputs": list(output_names), "observables": _source(observables), "options": sorted(
            (k_, repr(v)) for k_, v in options.items()), "y0": None if y0_fixed is None else y0_fixed.tolist(),
        "inputs": dask.base.tokenize(params_da, y0_da), "rows": rows, "chunk_rows": rows_c,
    }  # fmt: skip
    layout = EnsembleLayout(
        rows=rows, chunk_rows=rows_c, values_name="outputs", value_dims=("experiment", "time", "output"),
        value_shape=(m, k), status_dims=("experiment",), status_shape=(), parameter_names=names,
        coordinates={"time": (("time",), t_eval), "output": (("output",), np.asarray(output_names, dtype=str))},
        auxiliary=(), status_codes=codes, status_messages=messages, fingerprint=_fingerprint(description),
        attrs={"kind": "problem", "problem": problem.spec.name, "states": list(problem.state_names),
               "options": {k_: repr(v) for k_, v in options.items()}},
    )  # fmt: skip
    inputs = [params_da] if y0_da is None else [params_da, y0_da]
    combined = _chunk_tasks(program, inputs, width, f"diffsoup-ensemble-{layout.fingerprint[:16]}", pinned)
    return Ensemble(combined, params_da, layout, pinned)


def _study_ensemble(study, params, parameter_names, output_names, solver, chunk_size, resources, client) -> Ensemble:
    import dask
    import dask.array as da

    from ..inference import InferenceProblem, ParameterBox, SolverOptions

    if params is None:
        raise ValueError("ensemble: give params=, the parameter draws (e.g. ds.distributed.sample(study, n)).")
    if solver is None:
        solver = SolverOptions()
    if not isinstance(solver, SolverOptions):
        raise TypeError("ensemble: solver= must be a ds.inference.SolverOptions.")
    E = len(study.experiments)
    rows_c = _chunk_rows(chunk_size, per_row=E)
    known = tuple(study.entry_names) + tuple(n for n in study.table if n not in study.entry_index)
    default_names = None if parameter_names is not None or isinstance(params, Mapping) else ParameterBox.of(study).names
    params_da, names = _named_columns(params, parameter_names if default_names is None else default_names, known,
                                      rows_c, "the study's parameter table")  # fmt: skip
    # Each draw is simulated from t0 (single shooting): window starts are a fit's unknowns, not draws.
    single = study.replace(experiments=[e.with_trajectory(None) if e.trajectory is not None else e
                                        for e in study.experiments])  # fmt: skip
    problem = InferenceProblem(single, parameters=names, solver=solver)
    theta_columns, theta_scales = [], []
    for theta_name, i in zip(problem.theta_names, problem.estimated):
        entry = study.entries[i]
        column = names.index(theta_name) if theta_name in names else names.index(entry.parameter.name)
        theta_columns.append(column)
        theta_scales.append(entry.parameter.scale)
    M = max(e.times.shape[0] for e in study.experiments)
    K = max(e.n_observables for e in study.experiments)
    if output_names is None:
        output_names = tuple(f"observable_{i}" for i in range(K))
    output_names = tuple(str(s) for s in output_names)
    if len(output_names) != K:
        raise ValueError(f"ensemble: {len(output_names)} output_names for {K} observable columns.")
    times = np.full((E, M), np.nan)
    for i, e in enumerate(study.experiments):
        times[i, : e.times.shape[0]] = e.times
    rows = params_da.shape[0]
    width = len(names) + E * M * K + E
    program = _StudyChunk(problem, theta_columns, theta_scales, (E, M, K), rows_c)
    pinned = ensemble_resources(resources, client)
    codes, messages = _status_tables()
    observables = sorted({_source(e.observables) for e in study.experiments})
    description = {
        "kind": "study", "problem": study.problem.fingerprint, "experiments": [e.id for e in study.experiments],
        "times": times.tolist(), "table": [repr(p) for p in study.parameters], "levels": list(study.levels),
        "parameters": list(names), "observables": observables, "solver": repr(solver),
        "inputs": dask.base.tokenize(params_da), "rows": rows, "chunk_rows": rows_c, "outputs": list(output_names),
        "y0": [_source(e.y0) if callable(e.y0) else repr(e.y0) for e in study.experiments],
        "conditions": [repr(e.conditions) for e in study.experiments],
    }  # fmt: skip
    layout = EnsembleLayout(
        rows=rows, chunk_rows=rows_c, values_name="observables",
        value_dims=("draw", "experiment", "time_index", "observable"), value_shape=(E, M, K),
        status_dims=("draw", "experiment"), status_shape=(E,), parameter_names=names,
        coordinates={"experiment": (("experiment",), np.asarray([e.id for e in study.experiments], dtype=str)),
                     "observable": (("observable",), np.asarray(output_names, dtype=str)),
                     "time": (("experiment", "time_index"), times)},
        auxiliary=("time",), status_codes=codes, status_messages=messages, fingerprint=_fingerprint(description),
        attrs={"kind": "study", "problem": study.problem.spec.name, "solver": repr(solver)},
    )  # fmt: skip
    combined = _chunk_tasks(program, [params_da], width, f"diffsoup-ensemble-study-{layout.fingerprint[:16]}", pinned)
    return Ensemble(combined, params_da, layout, pinned)


def _chunk_tasks(program: Callable, inputs: Sequence[Any], width: int, name: str, resources: Mapping[str, float]):
    """The Dask array ``(rows, width)`` of one ``program(*blocks)`` task per chunk of ``inputs``
    (Dask arrays chunked alike along their rows, one chunk across), annotated with ``resources``.

    A layer of its own (not a blockwise one, which Dask fuses with its inputs' layers, dropping the
    annotation); Dask's graph optimization still fuses it with its neighbours, which is why
    :meth:`Ensemble.compute` and :meth:`Ensemble.to_zarr` compute with ``optimize_graph=False``."""
    import dask.array as da
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    keys = [x.__dask_keys__() for x in inputs]
    rows = inputs[0].chunks[0]
    tasks = {(name, i, 0): (program, *(k[i][0] for k in keys)) for i in range(len(rows))}
    layer = MaterializedLayer(tasks, annotations={"resources": dict(resources)} if resources else None)
    graph = HighLevelGraph.from_collections(name, layer, dependencies=list(inputs))
    return da.Array(graph, name, chunks=(rows, (width,)), dtype=np.float64, meta=np.empty((0, 0)))
