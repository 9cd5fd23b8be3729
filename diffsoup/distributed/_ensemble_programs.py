"""The chunk programs of an ensemble: one jitted, vmapped solve per chunk (a problem's
``ds.simulate`` or a study's predictions), pickled by reference to a per-process registry so that
a worker process compiles each program once; and :func:`_chunk_tasks`, the Dask layer of one
program task per chunk, annotated with its resources.
"""

from __future__ import annotations

import abc
import collections
import threading
import typing
import uuid
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..integrate import simulate

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
