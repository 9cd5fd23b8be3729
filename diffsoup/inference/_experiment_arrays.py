"""Experiments held as arrays with a leading experiment axis (a structure of arrays).

``ds.Study.from_arrays`` and ``ds.Study.from_table`` build an :class:`ExperimentArrays`: the times,
data, spreads, conditions, initial states and level members of many experiments of one shape (the
same observables and noise models; times padded at their end), checked with vectorized tests whose
errors still name the experiment and the field. A study of such arrays holds no Python object per
experiment: :func:`resolve_arrays` says where each model parameter's value comes from (a column of
numbers, an entry, an entry per level member) and ``InferenceProblem.pack`` gathers a chunk's lanes
with fancy indexing (:func:`pack_arrays`). ``study.experiments[i]`` builds an ``Experiment`` view of
row ``i`` on demand.

Conventions of the arrays: NaN in ``data`` is a missing value; NaN at the end of an experiment's
``times`` pads it to the common length (its data there must be NaN); NaN in a ``conditions`` column
leaves that experiment's model parameter to the parameter table (or the model's default).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from ._experiment import Experiment, takes_time
from ._noise import LAPLACE, AbstractNoise, Gaussian
from ._terms import SIGMA_ENTRY, SIGMA_FIXED

# Experiments read at a time from an array that is not NumPy (Dask, Zarr) when its chunks do not say.
READ_ROWS = 65536


def _label(who: str, ids: np.ndarray, i: int) -> str:
    return f"{who}: experiment {str(ids[i])!r} (row {i})"


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


def _noise_columns(noise: Any, k: int, who: str) -> tuple:
    if isinstance(noise, AbstractNoise):
        return (noise,) * k
    if isinstance(noise, (list, tuple)) and noise and all(isinstance(x, AbstractNoise) for x in noise):
        if len(noise) != k:
            raise ValueError(f"{who}: noise gives {len(noise)} models for {k} observable column(s); give one model, or "
                             "one per column.")  # fmt: skip
        return tuple(noise)
    raise TypeError(f"{who}: noise must be ds.inference.Gaussian(...), LogNormal(...), Laplace(...) or LogLaplace(...), "
                    f"or a sequence of one per observable column, not {noise!r}.")  # fmt: skip


@dataclasses.dataclass(eq=False)
class ExperimentArrays:
    """Experiments of one shape as arrays with a leading experiment axis ``E``.

    Attributes:
        ids: ``(E,)`` experiment ids (a NumPy string array).
        times: ``(E, m)`` measurement times (a broadcast view when shared), padded at the end with
            the experiment's last time; n_times: ``(E,)`` times per experiment, or None (all ``m``).
        t0: the initial time, a number or ``(E,)``.
        data: ``(E, m, k)`` measured values, NaN where missing (and at padded times).
        noise: the noise model, or a tuple of one per observable column, as given.
        sigma: the known spreads, broadcastable to ``(E, m, k)`` (NaN where not measured), or None
            when they come from a study parameter (``sigma_name``) or a function.
        sigma_name: the study parameter every spread is (``noise.sigma="name"``), or None.
        sigma_functions: per column the spread callable (None: not a callable).
        conditions: model parameter name -> ``(E,)`` fixed values (NaN: not fixed for that row).
        y0: None (the model's) or initial states broadcastable to ``(E, n)``.
        groups: level -> ``(codes (E,), members)``: member ``members[codes[i]]`` for row ``i``
            (members in order of first appearance).
        observables, observables_take_time: the shared observables function, as for ``Experiment``.
    """

    ids: np.ndarray
    times: np.ndarray
    n_times: np.ndarray | None
    t0: Any
    data: np.ndarray
    noise: Any
    noise_columns: tuple
    sigma: np.ndarray | None
    sigma_name: str | None
    sigma_functions: tuple
    conditions: dict
    y0: np.ndarray | None
    groups: dict
    observables: Callable | None
    observables_take_time: bool
    _id_index: dict | None = None

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(E, m, k)``."""
        return tuple(int(s) for s in self.data.shape)

    def index_of(self, experiment_id: str) -> int | None:
        """Row of an experiment id (None if unknown); the id index is built on first use."""
        if self._id_index is None:
            self._id_index = {str(x): i for i, x in enumerate(self.ids.tolist())}
        return self._id_index.get(experiment_id)

    def take(self, rows: Any) -> "ExperimentArrays":
        """The experiments of ``rows`` (indices), in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        E = len(self)

        def take(x, ndim=None):
            # Per-row arrays only: a shared one (a number, one row, y0 of (n,)) stays as it is.
            if x is None or np.ndim(x) == 0 or np.shape(x)[0] != E or (ndim is not None and np.ndim(x) != ndim):
                return x
            return np.asarray(x)[rows]

        return dataclasses.replace(
            self, ids=self.ids[rows], times=take(self.times), n_times=take(self.n_times), t0=take(self.t0),
            data=self.data[rows], sigma=take(self.sigma, 3), conditions={k: take(v) for k, v in self.conditions.items()},
            y0=take(self.y0, 2),
            groups={lv: _codes_of(np.asarray(m, dtype=object)[c[rows]]) for lv, (c, m) in self.groups.items()},
            _id_index=None,
        )  # fmt: skip

    def experiment(self, i: int) -> Experiment:
        """Row ``i`` as an ``Experiment`` (the same numbers; padded times dropped)."""
        E = len(self)
        m = int(self.n_times[i]) if self.n_times is not None else self.times.shape[1]
        sigma = None
        if self.sigma is not None:  # an Experiment wants a spread in every cell, measured or not
            sigma = np.broadcast_to(self.sigma, self.data.shape)[i, :m]
            sigma = np.where(np.isnan(sigma), 1.0, sigma)
        if isinstance(self.noise, AbstractNoise):
            noise = self.noise if sigma is None else _with_spread(self.noise, sigma)
        else:
            noise = [c if sigma is None else _with_spread(c, sigma[:, j]) for j, c in enumerate(self.noise_columns)]
        conditions = {k: float(v if np.ndim(v) == 0 else v[i]) for k, v in self.conditions.items()}
        conditions = {k: v for k, v in conditions.items() if not math.isnan(v)}
        y0 = None
        if self.y0 is not None:
            y0 = np.array(self.y0[i] if self.y0.ndim == 2 and self.y0.shape[0] == E else self.y0.reshape(-1))
        t0 = float(self.t0 if np.ndim(self.t0) == 0 else self.t0[i])
        exp = Experiment(
            str(self.ids[i]), self.times[i, :m], self.data[i, :m], observables=self.observables, noise=noise,
            conditions=conditions, y0=y0, groups={lv: str(ms[c[i]]) for lv, (c, ms) in self.groups.items()}, t0=t0,
        )  # fmt: skip
        exp._array_source = (self, i)  # lets Study.replace keep the arrays of views of these rows
        return exp


def _with_spread(model: AbstractNoise, spread: Any) -> AbstractNoise:
    fields = {f.name: getattr(model, f.name) for f in dataclasses.fields(model)}
    fields[model.spread_field] = np.array(spread)
    return type(model)(**fields)


def _codes_of(values: np.ndarray) -> tuple[np.ndarray, tuple]:
    """``(codes, members)`` of level members, members in order of first appearance."""
    uniq, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[inverse.reshape(-1)].astype(np.int32), tuple(str(x) for x in uniq[order])


class ExperimentViews(Sequence):
    """``study.experiments`` of a study held as arrays: ``Experiment`` views built on access."""

    def __init__(self, arrays: ExperimentArrays):
        self.arrays = arrays

    def __len__(self) -> int:
        return len(self.arrays)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self.arrays.experiment(j) for j in range(*i.indices(len(self))))
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"experiment index {i} out of range for {len(self)} experiments.")
        return self.arrays.experiment(i)

    def __iter__(self):
        return (self.arrays.experiment(i) for i in range(len(self)))

    def __repr__(self) -> str:
        return f"<{len(self)} experiments held as arrays>"


# -- building -------------------------------------------------------------------------------------
def experiment_arrays(
    problem: Any,
    times: Any,
    data: Any,
    *,
    ids: Any = None,
    y0: Any = None,
    conditions: Mapping[str, Any] | None = None,
    noise: Any = Gaussian(),
    groups: Mapping[str, Any] | None = None,
    observables: Callable | None = None,
    t0: Any = 0.0,
    who: str = "Study.from_arrays",
) -> ExperimentArrays:
    """Check and hold the arrays of ``Study.from_arrays`` (see there)."""
    if not hasattr(data, "shape"):
        data = np.asarray(data, dtype=np.float64)
    if len(data.shape) == 2:
        data = data[:, :, None] if isinstance(data, np.ndarray) else np.asarray(data, dtype=np.float64)[:, :, None]
    if len(data.shape) != 3:
        raise ValueError(f"{who}: data has shape {tuple(data.shape)}; expected (experiments, times, observables).")
    E, m, k = (int(s) for s in data.shape)
    if E == 0 or m == 0 or k == 0:
        raise ValueError(f"{who}: data has shape {(E, m, k)}; a study needs experiments, times and observables.")
    ids = _checked_ids(ids, E, who)
    columns = _noise_columns(noise, k, who)
    t0 = _checked_t0(t0, E, ids, who)
    times, n_times = _checked_times(times, E, m, t0, ids, who)
    logs = np.array([c.log_base is not None for c in columns])

    def check_data(a: int, block: np.ndarray) -> None:
        if block.shape[1:] != (m, k):
            raise ValueError(f"{who}: data rows have shape {block.shape[1:]}; expected {(m, k)}.")
        bad = np.isinf(block)
        if bad.any():
            i, t, j = (int(v) for v in np.argwhere(bad)[0])
            raise ValueError(f"{_label(who, ids, a + i)}: data[{t}, {j}] = {block[i, t, j]}; measured values must be "
                             "finite (use NaN for a missing value).")  # fmt: skip
        fin = np.isfinite(block)
        empty = ~fin.any(axis=(1, 2))
        if empty.any():
            i = int(np.argmax(empty))
            raise ValueError(f"{_label(who, ids, a + i)}: data holds no measured value (all NaN); an experiment needs "
                             "data (drop the row).")  # fmt: skip
        if n_times is not None:
            past = fin & (np.arange(m)[None, :] >= n_times[a : a + block.shape[0], None])[:, :, None]
            if past.any():
                i, t, j = (int(v) for v in np.argwhere(past)[0])
                raise ValueError(f"{_label(who, ids, a + i)}: data[{t}, {j}] is measured at a padded (NaN) time; give "
                                 "its time or set the value to NaN.")  # fmt: skip
        if logs.any():
            neg = fin & (block <= 0) & logs[None, None, :]
            if neg.any():
                i, t, j = (int(v) for v in np.argwhere(neg)[0])
                raise ValueError(f"{_label(who, ids, a + i)}: data[{t}, {j}] = {block[i, t, j]}; a logarithmic noise "
                                 "model needs positive data.")  # fmt: skip

    data = host_array(data, who, "data", check_data)
    sigma, sigma_name, functions = _checked_spreads(columns, noise, data, ids, who)
    n = problem.n_states
    conds = _checked_conditions(conditions, problem, E, ids, who)
    y0 = _checked_y0(y0, problem, E, ids, who)
    levels = _checked_groups(groups, E, who)
    if observables is not None and not callable(observables):
        raise TypeError(f"{who}: observables must be a function observables(y, p) -> (k,), or None.")
    if observables is None and k != n:
        raise ValueError(f"{who}: data has {k} observable column(s) and observables=None observes all {n} states; give "
                         f"observables= or data of shape (experiments, times, {n}).")  # fmt: skip
    return ExperimentArrays(
        ids=ids, times=times, n_times=n_times, t0=t0, data=data, noise=noise, noise_columns=columns, sigma=sigma,
        sigma_name=sigma_name, sigma_functions=functions, conditions=conds, y0=y0, groups=levels,
        observables=observables, observables_take_time=observables is not None and takes_time(observables),
    )  # fmt: skip


def _checked_ids(ids: Any, E: int, who: str) -> np.ndarray:
    if ids is None:
        return np.arange(E).astype(str)
    out = np.asarray(ids)
    if out.shape != (E,):
        raise ValueError(f"{who}: ids has shape {out.shape}; give one id per experiment, ({E},).")
    out = out.astype(str)
    empty = np.char.str_len(out) == 0
    if empty.any():
        raise ValueError(f"{who}: ids[{int(np.argmax(empty))}] is empty; experiment ids must be non-empty strings.")
    uniq, first, counts = np.unique(out, return_index=True, return_counts=True)
    if np.any(counts > 1):
        dup = uniq[counts > 1]
        raise ValueError(f"{who}: duplicate experiment ids {[str(x) for x in dup[:10]]}; ids must be unique.")
    return out


def _checked_t0(t0: Any, E: int, ids: np.ndarray, who: str):
    arr = np.asarray(t0, dtype=np.float64)
    if arr.ndim == 0:
        if not np.isfinite(arr):
            raise ValueError(f"{who}: t0={t0!r} must be finite.")
        return float(arr)
    if arr.shape != (E,):
        raise ValueError(f"{who}: t0 has shape {arr.shape}; give a number or one per experiment, ({E},).")
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ValueError(f"{_label(who, ids, int(np.argmax(bad)))}: t0 must be finite.")
    return arr


def _checked_times(times: Any, E: int, m: int, t0, ids: np.ndarray, who: str):
    """``(times (E, m) padded with each row's last time, n_times (E,) or None)``."""
    times = host_array(times, who, "times")
    if times.shape == (m,):
        times = times[None, :]
    elif times.shape != (E, m):
        raise ValueError(f"{who}: times has shape {times.shape}; give ({m},) shared by all experiments or ({E}, {m}) "
                         "(the data's experiments and times).")  # fmt: skip
    rows = times.shape[0]
    nan = np.isnan(times)
    n_times = None
    if nan.any():
        n_t = np.sum(~nan, axis=1)
        tail = np.arange(m)[None, :] >= n_t[:, None]
        bad = nan != tail
        if bad.any() or np.any(n_t == 0):
            i = int(np.argmax(bad.any(axis=1) | (n_t == 0)))
            raise ValueError(f"{_label(who, ids, i)}: times holds NaN before a time, or only NaN; NaN may only pad the "
                             "end of an experiment's times.")  # fmt: skip
        last = times[np.arange(rows), n_t - 1]
        times = np.where(nan, last[:, None], times)
        n_times = np.broadcast_to(n_t.astype(np.int32), (E,)).copy()
    if np.isneginf(times).any():
        i = int(np.argmax(np.isneginf(times).any(axis=1)))
        raise ValueError(f"{_label(who, ids, i)}: times must be finite (or +inf, the steady state, at the end).")
    steady = np.isposinf(times)
    if steady.any() and np.any(steady[:, :-1] & ~steady[:, 1:]):
        i = int(np.argmax(np.any(steady[:, :-1] & ~steady[:, 1:], axis=1)))
        raise ValueError(f"{_label(who, ids, i)}: times must be finite; +inf (the steady state) may only end the times.")
    early = times < np.reshape(t0, (-1, 1))
    if early.any():
        i, j = (int(v) for v in np.argwhere(early)[0])
        raise ValueError(f"{_label(who, ids, i)}: times[{j}] = {times[i, j]} is before t0; times must not be negative "
                         "(before t0).")  # fmt: skip
    finite = np.where(steady, np.inf, times)
    back = np.diff(finite, axis=1) < 0
    if back.any():
        i, j = (int(v) for v in np.argwhere(back)[0])
        raise ValueError(f"{_label(who, ids, i)}: times are out of order (times[{j}]={times[i, j]} > "
                         f"times[{j + 1}]={times[i, j + 1]}); sort them and the rows of data with them.")  # fmt: skip
    return np.broadcast_to(times, (E, m)), n_times


def _checked_spreads(columns: tuple, noise: Any, data: np.ndarray, ids: np.ndarray, who: str):
    """``(sigma broadcastable to (E, m, k) or None, sigma_name or None, functions per column)``."""
    E, m, k = data.shape
    shared = isinstance(noise, AbstractNoise)
    functions = tuple(c.spread if callable(c.spread) else None for c in columns)
    names = [c.spread for c in columns if isinstance(c.spread, str)]
    if names:
        if not shared or not names[0]:
            raise ValueError(f"{who}: a spread named by a study parameter must be one name for all columns "
                             "(noise=Gaussian(sigma='name')); per-column or per-cell names need ds.Experiment "
                             "objects.")  # fmt: skip
        return None, names[0], functions
    if any(f is not None for f in functions):
        if not all(f is not None for f in functions):
            raise ValueError(f"{who}: mix of callable and numeric spreads across columns; use ds.Experiment objects.")
        return None, None, functions
    if shared:
        spread = columns[0].spread
        label = f"noise.{columns[0].spread_field}"
        sigma = host_array(spread, who, label)
        try:
            np.broadcast_shapes(sigma.shape, (E, m, k))
        except ValueError:
            raise ValueError(f"{who}: {label} has shape {sigma.shape}, which does not broadcast to the data shape "
                             f"{(E, m, k)}.") from None  # fmt: skip
        sigma = sigma.reshape((1,) * (3 - sigma.ndim) + sigma.shape)
    else:
        cols = []
        for j, c in enumerate(columns):
            s = host_array(c.spread, who, f"noise[{j}].{c.spread_field}")
            try:
                cols.append(np.broadcast_to(s.reshape((1,) * (2 - s.ndim) + s.shape), (E, m)))
            except ValueError:
                raise ValueError(f"{who}: noise[{j}].{c.spread_field} has shape {s.shape}; a column's spread "
                                 f"broadcasts to ({E}, {m}).") from None  # fmt: skip
        sigma = np.stack(cols, axis=-1)
    full = np.broadcast_to(sigma, (E, m, k))
    measured = np.isfinite(data)
    bad = measured & ~(full > 0) | measured & ~np.isfinite(full)
    if bad.any():
        i, t, j = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(f"{_label(who, ids, i)}: the spread of data[{t}, {j}] is {full[i, t, j]}; give a positive, "
                         "finite standard deviation for every measured value.")  # fmt: skip
    return sigma, None, functions


def _column(values: Any, E: int, who: str, field: str) -> np.ndarray:
    arr = host_array(values, who, field)
    if arr.ndim == 0:
        return arr
    if arr.shape != (E,):
        raise ValueError(f"{who}: {field} has shape {arr.shape}; give a number or one value per experiment, ({E},).")
    return arr


def _checked_conditions(conditions, problem, E: int, ids: np.ndarray, who: str) -> dict:
    if conditions is None:
        return {}
    if not isinstance(conditions, Mapping):
        raise TypeError(f"{who}: conditions must be a mapping model parameter name -> values (one per experiment).")
    model = problem.parameter_names
    unknown = [c for c in conditions if c not in model]
    if unknown:
        raise ValueError(f"{who}: conditions names unknown model parameter(s) {unknown}; the model's parameters are "
                         f"{list(model)}.")  # fmt: skip
    out = {}
    for name, values in conditions.items():
        col = _column(values, E, who, f"conditions[{name!r}]")
        inf = np.isinf(col)
        if inf.any():
            i = int(np.argmax(np.reshape(inf, -1))) if col.ndim else 0
            raise ValueError(f"{_label(who, ids, i)}: conditions[{name!r}] = {float(np.reshape(col, -1)[i])} must be "
                             "finite (NaN leaves it to the parameter table).")  # fmt: skip
        out[name] = col
    return out


def _checked_y0(y0, problem, E: int, ids: np.ndarray, who: str):
    n = problem.n_states
    if y0 is None:
        if problem.spec.y0 is None:
            raise ValueError(f"{who}: y0 is not given and the model has no default y0; give y0 ((n,), (E, n) or a "
                             "mapping state name -> values).")  # fmt: skip
        return None
    if isinstance(y0, Mapping):
        unknown = [s for s in y0 if s not in problem.state_names]
        if unknown:
            raise ValueError(f"{who}: y0 names unknown state(s) {unknown}; states are {list(problem.state_names)[:10]}...")
        if problem.spec.y0 is None and len(y0) != n:
            raise ValueError(f"{who}: y0 gives {len(y0)} of {n} states and the model has no default y0.")
        cols = {s: _column(v, E, who, f"y0[{s!r}]") for s, v in y0.items()}
        per_row = any(c.ndim for c in cols.values())
        base = np.asarray(problem.spec.y0 if problem.spec.y0 is not None else np.zeros(n), dtype=np.float64)
        out = np.array(np.broadcast_to(base, (E, n) if per_row else (n,)))
        for s, c in cols.items():
            out[..., problem.state_names.index(s)] = c
        y0 = out
    else:
        y0 = host_array(y0, who, "y0")
        if y0.shape not in ((n,), (E, n)):
            raise ValueError(f"{who}: y0 has shape {y0.shape}; give ({n},) for all experiments or ({E}, {n}), or a "
                             "mapping state name -> values.")  # fmt: skip
    bad = ~np.isfinite(y0)
    if bad.any():
        i = int(np.argmax(bad.any(axis=-1))) if y0.ndim == 2 else 0
        raise ValueError(f"{_label(who, ids, i)}: y0 holds a non-finite value; initial states must be finite.")
    return y0


def _checked_groups(groups, E: int, who: str) -> dict:
    if groups is None:
        return {}
    if not isinstance(groups, Mapping):
        raise TypeError(f"{who}: groups must be a mapping level name -> member names (one per experiment).")
    out = {}
    for level, values in groups.items():
        arr = np.asarray(values)
        if arr.shape != (E,):
            raise ValueError(f"{who}: groups[{level!r}] has shape {arr.shape}; give one member name per experiment, "
                             f"({E},).")  # fmt: skip
        arr = arr.astype(str)
        empty = np.char.str_len(arr) == 0
        if empty.any():
            raise ValueError(f"{who}: groups[{level!r}][{int(np.argmax(empty))}] is empty; member names are non-empty.")
        out[str(level)] = _codes_of(arr)
    return out


# -- resolution against a study --------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class ArrayPlan:
    """Where a study of arrays takes its numbers: per model parameter ``(entry, fixed)``, each a
    number or an ``(E,)`` array (entry -1: ``fixed``); ``sigma_entry`` (a number, an ``(E,)``
    array, or -1); ``k`` observables."""

    columns: tuple
    sigma_entry: Any
    k: int


def entry_rows(study: Any, name: str) -> Any:
    """The entry of study parameter ``name`` for every row: an index, or ``(E,)`` indices (a
    parameter owned by a level)."""
    arrays = study.arrays
    p = study.table[name]
    if p.level is None:
        return study.entry_index[name]
    start = study.entry_index[f"{name}[{study.members(p.level)[0]}]"]
    if p.level == "experiment":
        return start + np.arange(len(arrays), dtype=np.int64)
    return start + arrays.groups[p.level][0].astype(np.int64)


def resolve_arrays(study: Any) -> ArrayPlan:
    """The :class:`ArrayPlan` of ``study.arrays`` (the vectorized ``Study._resolve``)."""
    arrays, prob = study.arrays, study.problem
    who = "Study"
    defaults = prob.spec.parameter_defaults
    columns = []
    for j, name in enumerate(prob.parameter_names):
        cond = arrays.conditions.get(name)
        if name in study.table:
            entry, fixed = entry_rows(study, name), 0.0
        elif defaults is not None:
            entry, fixed = -1, float(defaults[j])
        else:
            entry, fixed = None, None
        if cond is not None:
            nan = np.isnan(cond)
            if entry is None and nan.any():
                i = int(np.argmax(np.reshape(nan, -1)))
                raise ValueError(f"{_label(who, arrays.ids, i)}: model parameter {name!r} has no value: its conditions "
                                 "value is NaN; give it, or add a study parameter of that name.")  # fmt: skip
            if not nan.any():
                entry, fixed = -1, cond
            else:
                entry = np.where(nan, entry, -1)
                fixed = np.where(nan, fixed, cond)
        elif entry is None:
            raise ValueError(f"{who}: model parameter {name!r} has no value: give it in conditions, or add a study "
                             "parameter of that name.")  # fmt: skip
        columns.append((entry, fixed))
    sigma_entry = -1
    if arrays.sigma_name is not None:
        name = arrays.sigma_name
        if name not in study.table:
            raise ValueError(f"{who}: noise.sigma names {name!r}, which is not a study parameter; add it to the "
                             "parameter table.")  # fmt: skip
        if study.table[name].lower <= 0:
            raise ValueError(f"{who}: noise.sigma is study parameter {name!r}, whose lower bound "
                             f"{study.table[name].lower} must be positive.")  # fmt: skip
        sigma_entry = entry_rows(study, name)
    return ArrayPlan(tuple(columns), sigma_entry, arrays.shape[2])


def check_levels(arrays: ExperimentArrays, levels: tuple) -> None:
    """Every level has a member per row, and each member of an inner level belongs to one member of
    every outer level (the vectorized ``Study._check_levels``)."""
    missing = [lv for lv in levels if lv not in arrays.groups]
    if missing:
        raise ValueError(f"Study: groups has no members for level(s) {missing}; give groups={{level: names}}.")
    extra = [lv for lv in arrays.groups if lv not in levels]
    if extra:
        raise ValueError(f"Study: groups names unknown level(s) {extra}; levels are {levels}.")
    for depth, lv in enumerate(levels):
        codes, members = arrays.groups[lv]
        first = np.full(len(members), -1, dtype=np.int64)
        first[codes[::-1]] = np.arange(codes.size)[::-1]  # each member's first row
        for outer in levels[:depth]:
            oc, om = arrays.groups[outer]
            bad = oc != oc[first[codes]]
            if bad.any():
                i = int(np.argmax(bad))
                raise ValueError(f"{_label('Study', arrays.ids, i)}: groups: member {members[codes[i]]!r} of level "
                                 f"{lv!r} belongs to {om[oc[first[codes[i]]]]!r} of {outer!r} elsewhere and to "
                                 f"{om[oc[i]]!r} here; a member belongs to one outer member.")  # fmt: skip


def term_constants(data: np.ndarray, sigma: np.ndarray | None, columns: tuple) -> np.ndarray:
    """The ``nll`` terms that no parameter changes, per experiment ``(E,)``, of data ``(E, m, k)``
    and known spreads broadcastable to it (NaN or None: not known): ``log 2 pi`` (normal) or
    ``log 2`` (Laplace), ``log s`` of the known spreads, ``log(d ln b)`` of logarithmic columns."""
    mask = np.isfinite(data)
    count = np.sum(mask, axis=(1, 2))
    laplace = np.array([c.distribution == LAPLACE for c in columns])
    n_laplace = np.sum(mask & laplace[None, None, :], axis=(1, 2)) if laplace.any() else 0
    c = 0.5 * math.log(2 * math.pi) * (count - n_laplace) + math.log(2.0) * n_laplace
    if sigma is not None:
        # The logarithm of the spreads as given (a number, a column, ...), broadcast afterwards.
        s = np.asarray(sigma, dtype=np.float64)
        known = np.isfinite(s) & (s > 0)
        log_s = np.log(np.where(known, s, 1.0))
        if s.size == 1:
            c = c + float(log_s.reshape(-1)[0]) * count
        else:
            c = c + np.sum(np.where(mask & np.broadcast_to(known, data.shape), np.broadcast_to(log_s, data.shape), 0.0),
                           axis=(1, 2))  # fmt: skip
    bases = [col.log_base for col in columns]
    logs = np.array([b is not None for b in bases])
    if logs.any():
        c = c + np.sum(np.log(np.where(mask & logs[None, None, :], data, 1.0)), axis=(1, 2))
        lnb = np.array([math.log(math.log(b)) if b is not None and b != math.e else 0.0 for b in bases])
        c = c + np.sum(mask * lnb[None, None, :], axis=(1, 2))
    return np.asarray(c, dtype=np.float64)


def dynamic_cells(arrays: ExperimentArrays) -> np.ndarray:
    """Measured values per experiment whose spread comes from a parameter or a function ``(E,)``."""
    if arrays.sigma_name is None and not any(f is not None for f in arrays.sigma_functions):
        return np.zeros(len(arrays), dtype=np.int64)
    return np.sum(np.isfinite(arrays.data), axis=(1, 2))


# -- packing ----------------------------------------------------------------------------------------
def _rows(x: Any, idx: np.ndarray, E: int):
    """``x[idx]`` of a per-row array, or ``x`` itself when it is shared (a number or one row)."""
    if np.ndim(x) == 0 or np.shape(x)[0] != E:
        return x
    return np.asarray(x)[idx]


def pack_arrays(study: Any, plan: ArrayPlan, const: np.ndarray, members: Any, order: Any) -> dict:
    """The packed lanes (``InferenceProblem.pack``'s arrays) of rows ``order`` (-1: a padding lane,
    which repeats the group's first member, is not valid and adds nothing), by fancy indexing."""
    arrays, prob = study.arrays, study.problem
    order = np.asarray(order, dtype=np.int64)
    real = order >= 0
    idx = np.where(real, order, members[0])
    E, m, k = arrays.shape
    L, n = idx.size, prob.n_states
    data = arrays.data[idx]
    mask = np.isfinite(data) & real[:, None, None]
    arr = {
        "times": np.ascontiguousarray(arrays.times[idx]),
        "t0": np.broadcast_to(_rows(arrays.t0, idx, E), (L,)).astype(np.float64),
        "data": np.where(mask, data, 1.0), "mask": mask,
        "sigma": np.ones((L, m, k)), "sigma_entry": np.zeros(L, dtype=np.int32),
        "y0": np.zeros((L, n)), "const": np.where(real, const[idx], 0.0), "valid": real,
    }  # fmt: skip
    if arrays.sigma is not None:
        s = _rows(arrays.sigma, idx, E)
        s = np.broadcast_to(s, (L, m, k))
        arr["sigma"] = np.where(np.isfinite(s), s, 1.0)
    if np.ndim(plan.sigma_entry) or plan.sigma_entry >= 0:
        arr["sigma_entry"][:] = _rows(plan.sigma_entry, idx, E)
    y0 = arrays.y0 if arrays.y0 is not None else np.asarray(prob.spec.y0, dtype=np.float64)
    arr["y0"][:] = _rows(y0, idx, E) if y0.ndim == 2 else y0
    P = len(plan.columns)
    p_entry, p_fixed = np.full((L, P), -1, dtype=np.int32), np.zeros((L, P))
    for j, (entry, fixed) in enumerate(plan.columns):
        p_entry[:, j] = _rows(entry, idx, E)
        p_fixed[:, j] = _rows(fixed, idx, E)
    arr["p_entry"], arr["p_fixed"] = p_entry, p_fixed
    return arr
