"""``ds.distributed.ensemble``: many simulations as a lazy Dask array, written to Zarr chunk by chunk.

An ensemble of a built problem solves ``ds.simulate`` once per row of ``params`` (and ``y0``):
values ``(experiments, times, outputs)`` and a status ``(experiments,)``. An ensemble of a study
predicts the study's observables at each parameter draw: values ``(draws, experiments, times,
observables)`` (padded with NaN where experiments have fewer times or observables) and a status
``(draws, experiments)``.

Execution: the rows (parameter draws) are split into chunks of ``draws_per_chunk`` (a simple rule
for now: the argument, else the setting ``diffsoup.ensemble.chunk-size``, 1024 *simulations*; a
problem simulates each draw once, so that is 1024 draws, while a study simulates each draw once per
experiment, so its chunks hold that many simulations' worth of draws, at least one). ``chunk_size=``
is the deprecated name of ``draws_per_chunk=``. Each chunk is one Dask task running one jitted,
vmapped solve (the last chunk is padded to the same size, so every chunk runs one program), compiled
once per worker process. The solve task is annotated with ``resources`` (``{"GPU": 1}``, the setting
``diffsoup.ensemble.resources``) when the Dask client current at ``ensemble()``'s call has a worker
offering them, so it runs on GPU workers, one at a time per GPU; without such workers (CPU clusters,
no client) it runs on any worker. The tasks around it (drawing the inputs, writing into Zarr) ask
for nothing, so a worker's second thread runs them beside the next chunk's solve
(``diffsoup.cluster.threads-per-worker``): :meth:`Ensemble.compute` and :meth:`Ensemble.to_zarr`
compute without Dask's graph optimization, which would fuse them into the solve task and lose its
annotation. The task returns one combined block per chunk (parameters, values, status), which
:meth:`Ensemble.values` and :meth:`Ensemble.status` slice: compute them together
(``dask.compute(ens.values, ens.status)``) to solve each chunk once.

Failures are values: a simulation that fails has its ``ds.Status`` code in the status array and
NaN values; the chunk itself succeeds. A chunk whose worker dies is computed again by Dask.

:meth:`Ensemble.to_zarr` writes through Dask's own writer (``da.store``, one region per chunk) into
a store with a completeness record (:mod:`diffsoup.store._ensemble_store`): a rerun after a killed
client or allocation computes only the chunks not yet written.

The parts: this module builds an ensemble (:func:`ensemble`) and holds it (:class:`Ensemble`);
:mod:`._ensemble_programs` holds the chunk programs and the Dask layer of their tasks,
:mod:`._ensemble_writes` the write into Zarr (:class:`EnsembleWrite`, the progress report).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import time
import warnings
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .._deprecated import renamed_keyword
from ..inference import InferenceProblem, ParameterBox, SolverOptions, Study
from ..integrate import Status, simulate
from ..model import Problem
from ..store._ensemble_store import EnsembleLayout, EnsembleStore
from ._config import get
from ._dask_campaign import check_resources
from ._ensemble_programs import _PROGRAMS as _PROGRAMS  # the per-process registry (tests read it)
from ._ensemble_programs import _chunk_tasks, _ProblemChunk, _StudyChunk
from ._ensemble_writes import EnsembleWrite as EnsembleWrite
from ._ensemble_writes import _compute_with_progress, _runs, _write_result

# simulate()'s keywords an ensemble passes on (the rest it sets itself).
_OWN_KEYWORDS = ("y0", "t_eval", "params", "throw", "problem")


# ------------------------------------------------------------------------------------------------
# What an ensemble returns
# ------------------------------------------------------------------------------------------------


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
    def draws_per_chunk(self) -> int:
        """Parameter draws (rows) per chunk: a problem's simulations, or a study's draws (each
        simulated once per experiment)."""
        return self.layout.chunk_rows

    @property
    def chunk_size(self) -> int:
        """Deprecated name of :attr:`draws_per_chunk`."""
        warnings.warn("Ensemble.chunk_size is deprecated; read Ensemble.draws_per_chunk (the same number).",
                      DeprecationWarning, stacklevel=2)  # fmt: skip
        return self.draws_per_chunk

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


def _chunk_rows(draws_per_chunk: Any, per_row: int = 1) -> int:
    """Draws per chunk: ``draws_per_chunk``, else the setting (simulations) over ``per_row``
    simulations per draw."""
    if draws_per_chunk is None:
        size = get("ensemble.chunk-size")
        if isinstance(size, str):
            size = int(size)
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"the setting diffsoup.ensemble.chunk-size={size!r} must be a positive integer.")
        return max(1, int(size) // per_row)
    size = draws_per_chunk
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"draws_per_chunk={size!r} must be a positive integer (parameter draws, rows of params, "
                         "per chunk).")  # fmt: skip
    return int(size)


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
    draws_per_chunk: int | None = None,
    resources: Mapping[str, float] | None = None,
    client: Any = None,
    chunk_size: int | None = None,
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
        draws_per_chunk: rows of ``params`` (parameter draws) per chunk: a problem's simulations,
            a study's draws (each simulated once per experiment); None reads the setting
            ``diffsoup.ensemble.chunk-size``, in simulations (a study's chunks hold that many
            simulations' worth of draws). The inputs are rechunked to it.
        resources: what each chunk's task asks of a worker (``{}``: nothing); None reads the
            setting ``diffsoup.ensemble.resources`` and applies it only where the current client
            (``client``, else Dask's default) has a worker offering it.
        client: the ``distributed.Client`` whose workers decide ``resources`` (None: the default one).
        chunk_size: the deprecated name of ``draws_per_chunk`` (warns).
        **options: problem only: ``ds.simulate``'s keywords (``rtol``, ``atol``, ``method``,
            ``max_steps``, ``t0``, ...), the same for every row.

    Returns:
        An :class:`Ensemble` (lazy: nothing is solved until it is computed or written).

    Raises:
        TypeError: for a ``target`` that is neither, an unknown ``ds.simulate`` keyword, or
            options of the other kind of target.
        ValueError: for shapes that do not match, unknown parameter names, missing ``t_eval``
            or ``params``, a bad ``draws_per_chunk``.
        TypeError: for both ``draws_per_chunk`` and its deprecated name ``chunk_size``.
    """
    draws_per_chunk = renamed_keyword("ensemble", "chunk_size", chunk_size, "draws_per_chunk", draws_per_chunk)
    if isinstance(target, Problem):
        if solver is not None:
            raise TypeError("ensemble: solver= is for a study; give a problem's ds.simulate options as keywords "
                            "(rtol=, atol=, max_steps=, ...).")  # fmt: skip
        return _problem_ensemble(target, params, y0, t_eval, parameter_names, observables, output_names,
                                 draws_per_chunk, resources, client, options)  # fmt: skip
    if isinstance(target, Study):
        for name, value in (("y0", y0), ("t_eval", t_eval), ("observables", observables)):
            if value is not None:
                raise TypeError(f"ensemble: {name}= is for a problem; a study's experiments carry their own.")
        if options:
            raise TypeError(f"ensemble: {sorted(options)} are ds.simulate options; for a study give "
                            "solver=ds.inference.SolverOptions(...).")  # fmt: skip
        return _study_ensemble(target, params, parameter_names, output_names, solver, draws_per_chunk, resources,
                               client)  # fmt: skip
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


def _problem_ensemble(problem, params, y0, t_eval, parameter_names, observables, output_names, draws_per_chunk,
                      resources, client, options) -> Ensemble:  # fmt: skip
    import dask
    import dask.array as da
    allowed = set(inspect.signature(simulate).parameters) - set(_OWN_KEYWORDS)
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise TypeError(f"ensemble: unknown ds.simulate option(s) {unknown}; it takes {sorted(allowed)}.")
    if t_eval is None:
        raise ValueError("ensemble: give t_eval, the output times shared by every simulation.")
    t_eval = np.atleast_1d(np.asarray(t_eval, dtype=np.float64))
    if t_eval.ndim != 1 or t_eval.size == 0:
        raise ValueError(f"ensemble: t_eval has shape {t_eval.shape}; give a non-empty 1-D array of times.")
    rows_c = _chunk_rows(draws_per_chunk)
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


def _study_ensemble(study, params, parameter_names, output_names, solver, draws_per_chunk, resources,
                    client) -> Ensemble:  # fmt: skip
    import dask
    import dask.array as da

    if params is None:
        raise ValueError("ensemble: give params=, the parameter draws (e.g. ds.distributed.sample(study, n)).")
    if solver is None:
        solver = SolverOptions()
    if not isinstance(solver, SolverOptions):
        raise TypeError("ensemble: solver= must be a ds.inference.SolverOptions.")
    E = len(study.experiments)
    rows_c = _chunk_rows(draws_per_chunk, per_row=E)
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
