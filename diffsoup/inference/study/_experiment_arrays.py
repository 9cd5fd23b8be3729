"""Experiments held as arrays with a leading experiment axis (a structure of arrays).

``ds.Study.from_arrays`` and ``ds.Study.from_table`` build an :class:`ExperimentArrays`: the times,
data, spreads, conditions, initial states and level members of many experiments of one shape (the
same observables and noise models; times padded at their end), checked with vectorized tests whose
errors still name the experiment and the field. A study of such arrays holds no Python object per
experiment: :func:`resolve_arrays` says where each model parameter's value comes from (a column of
numbers, an entry, an entry per level member; :mod:`._array_plan`) and the objective packs the
rows by fancy indexing (``objective._lane_inputs.pack_arrays``, once per problem).
``study.experiments[i]`` builds an ``Experiment`` view of row ``i`` on demand.

Conventions of the arrays: NaN in ``data`` is a missing value; NaN at the end of an experiment's
``times`` pads it to the common length (its data there must be NaN); NaN in a ``conditions`` column
leaves that experiment's model parameter to the parameter table (or the model's default), and a
study parameter's name there maps that experiment's model parameter to it (PEtab's condition
tables). Observable parameters, spreads and ``y0`` follow ``Experiment``: numbers or study
parameters' names per experiment (or per cell), a shared ``y0(p)`` function; resets and
discontinuities are shared by all experiments.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ._experiment import Experiment, _checked_discontinuities, _checked_resets, takes_time
from ._host_arrays import host_array
from ._noise import AbstractNoise, Gaussian


def _label(who: str, ids: np.ndarray, i: int) -> str:
    return f"{who}: experiment {str(ids[i])!r} (row {i})"


def _noise_columns(noise: Any, k: int, who: str) -> tuple:
    if isinstance(noise, AbstractNoise):
        return (noise,) * k
    if isinstance(noise, (list, tuple)) and noise and all(isinstance(x, AbstractNoise) for x in noise):
        if len(noise) != k:
            raise ValueError(f"{who}: noise gives {len(noise)} models for {k} observable column(s); give one model, or "
                             "one per column.")  # fmt: skip
        return tuple(noise)
    raise TypeError(f"{who}: noise must be a noise model (ds.inference.Gaussian(...), LogNormal(...), Laplace(...), "
                    "LogLaplace(...) or another AbstractNoise), "
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
        sigma_names: study-parameter names of spreads, broadcastable to ``(E, m, k)`` (``""`` where
            the spread is a number or a function; ``sigma`` is NaN there), or None when none is.
        parameters: model parameter -> study-parameter names, a name or ``(E,)`` (``""``: the
            experiment's ``conditions`` value, or the default, holds); the names given in
            ``conditions``.
        observable_parameters: name -> ``(values, names)``: numbers (a number or ``(E,)``, NaN
            where a name is) and None or names of the same shape (``""`` where a number is).
        y0_function: the shared ``y0(p)`` callable, or None (``y0`` holds the numbers).
        resets: the shared ``ds.Reset`` objects; discontinuities: shared times (a tuple) or a
            callable ``discontinuities(p)``.
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
    sigma_names: np.ndarray | None = None
    parameters: dict = dataclasses.field(default_factory=dict)
    observable_parameters: dict = dataclasses.field(default_factory=dict)
    y0_function: Callable | None = None
    resets: tuple = ()
    discontinuities: Any = ()
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
            sigma_names=take(self.sigma_names, 3), parameters={k: take(v) for k, v in self.parameters.items()},
            observable_parameters={k: (take(v), take(n)) for k, (v, n) in self.observable_parameters.items()},
            _id_index=None,
        )  # fmt: skip

    def experiment(self, i: int) -> Experiment:
        """Row ``i`` as an ``Experiment`` (the same numbers; padded times dropped)."""
        E = len(self)
        m = int(self.n_times[i]) if self.n_times is not None else self.times.shape[1]

        def row(x):  # row i of a per-row array, or the shared value
            return x if np.ndim(x) == 0 or np.shape(x)[0] != E else x[i]

        cells = None
        if self.sigma is not None:  # an Experiment wants a spread in every cell, measured or not
            sigma = np.broadcast_to(self.sigma, self.data.shape)[i, :m]
            cells = np.where(np.isnan(sigma), 1.0, sigma)
            if self.sigma_names is not None:
                names = np.broadcast_to(self.sigma_names, self.data.shape)[i, :m]
                cells = np.where(names != "", names.astype(object), cells.astype(object))
        if isinstance(self.noise, AbstractNoise):
            noise = self.noise if cells is None else _with_spread(self.noise, cells)
        else:
            noise = [c if cells is None or callable(c.spread) else _with_spread(c, cells[:, j])
                     for j, c in enumerate(self.noise_columns)]  # fmt: skip
        conditions = {k: float(row(v)) for k, v in self.conditions.items()}
        conditions = {k: v for k, v in conditions.items() if not math.isnan(v)}
        mapping = {k: str(row(v)) for k, v in self.parameters.items()}
        mapping = {k: v for k, v in mapping.items() if v}
        observable_parameters = {}
        for name, (values, names) in self.observable_parameters.items():
            label = "" if names is None else str(row(names))
            observable_parameters[name] = label if label else float(row(values))
        y0 = self.y0_function
        if y0 is None and self.y0 is not None:
            y0 = np.array(self.y0[i] if self.y0.ndim == 2 and self.y0.shape[0] == E else self.y0.reshape(-1))
        t0 = float(self.t0 if np.ndim(self.t0) == 0 else self.t0[i])
        exp = Experiment(
            str(self.ids[i]), self.times[i, :m], self.data[i, :m], observables=self.observables, noise=noise,
            conditions=conditions, parameters=mapping, observable_parameters=observable_parameters, y0=y0,
            groups={lv: str(ms[c[i]]) for lv, (c, ms) in self.groups.items()}, t0=t0, resets=self.resets,
            discontinuities=self.discontinuities,
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
    observable_parameters: Mapping[str, Any] | None = None,
    resets: Sequence[Any] = (),
    discontinuities: Any = (),
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
    sigma, sigma_name, sigma_names, functions = _checked_spreads(columns, noise, data, ids, who)
    n = problem.n_states
    conds, mapping = _checked_conditions(conditions, problem, E, ids, who)
    y0_function = y0 if callable(y0) else None
    y0 = None if callable(y0) else _checked_y0(y0, problem, E, ids, who)
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
        sigma_names=sigma_names, parameters=mapping,
        observable_parameters=_checked_observable_parameters(observable_parameters, problem, E, ids, who),
        y0_function=y0_function, resets=_checked_resets(resets, who),
        discontinuities=_checked_discontinuities(discontinuities, who),
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


def _numbers_and_names(values: Any, who: str, field: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Numbers and study parameters' names, as a number, a name, or an array of them (an object or
    string array; ``""`` in a string array is missing): ``(numbers, names)``, ``numbers`` float64
    (NaN where a name is, or nothing), ``names`` None when there is no name, else a string array of
    the same shape (``""`` where a number is)."""
    if isinstance(values, str):
        return np.array(np.nan), np.array(values)
    kind = getattr(getattr(values, "dtype", None), "kind", None)
    if kind is None and isinstance(values, (list, tuple)):
        values = np.asarray(values, dtype=object)
        kind = "O"
    if kind not in ("O", "U", "S"):
        return host_array(values, who, field), None
    arr = np.asarray(values)
    if kind in "US":
        names = arr.astype(str)
        return np.full(arr.shape, np.nan), names
    is_name = np.frompyfunc(lambda c: isinstance(c, str), 1, 1)(arr).astype(bool)
    numbers = np.full(arr.shape, np.nan)
    try:
        numbers[~is_name] = arr[~is_name].astype(np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{who}: {field} must hold numbers or study parameters' names.") from None
    if not is_name.any():
        return numbers, None
    return numbers, np.where(is_name, arr, "").astype(str)


def _checked_spreads(columns: tuple, noise: Any, data: np.ndarray, ids: np.ndarray, who: str):
    """``(sigma broadcastable to (E, m, k) or None, sigma_name or None, sigma_names or None,
    functions per column)``: ``sigma`` NaN where a spread is named or a function."""
    E, m, k = data.shape
    shared = isinstance(noise, AbstractNoise)
    functions = tuple(c.spread if callable(c.spread) else None for c in columns)
    if shared and isinstance(columns[0].spread, str):
        if not columns[0].spread:
            raise ValueError(f"{who}: noise.{columns[0].spread_field} is an empty study-parameter name.")
        return None, columns[0].spread, None, functions
    if shared and functions[0] is not None:
        return None, None, None, functions
    if shared:
        label = f"noise.{columns[0].spread_field}"
        sigma, names = _numbers_and_names(columns[0].spread, who, label)
        try:
            np.broadcast_shapes(sigma.shape, (E, m, k))
        except ValueError:
            raise ValueError(f"{who}: {label} has shape {sigma.shape}, which does not broadcast to the data shape "
                             f"{(E, m, k)}.") from None  # fmt: skip
        lead = (1,) * (3 - sigma.ndim)
        sigma = sigma.reshape(lead + sigma.shape)
        names = None if names is None else names.reshape(lead + names.shape)
    else:
        cols, name_cols = [], []
        for j, c in enumerate(columns):
            if functions[j] is not None:
                s, nm = np.full((1, 1), np.nan), None
            else:
                s, nm = _numbers_and_names(c.spread, who, f"noise[{j}].{c.spread_field}")
                try:
                    np.broadcast_shapes((1,) * (2 - s.ndim) + s.shape, (E, m))
                except ValueError:
                    raise ValueError(f"{who}: noise[{j}].{c.spread_field} has shape {s.shape}; a column's spread "
                                     f"broadcasts to ({E}, {m}).") from None  # fmt: skip
            cols.append(s.reshape((1,) * (2 - s.ndim) + s.shape))
            name_cols.append(None if nm is None else nm.reshape((1,) * (2 - nm.ndim) + nm.shape))
        shape = np.broadcast_shapes(*(c.shape for c in cols), *(n.shape for n in name_cols if n is not None))
        sigma = np.stack([np.broadcast_to(c, shape) for c in cols], axis=-1)
        names = None
        if any(n is not None for n in name_cols):
            names = np.stack([np.broadcast_to(n if n is not None else np.array(""), shape) for n in name_cols], axis=-1)
    full = np.broadcast_to(sigma, (E, m, k))
    measured = np.isfinite(data)
    known = np.array([f is None for f in functions])[None, None, :]
    if names is not None:
        known = known & (np.broadcast_to(names, (E, m, k)) == "")
    bad = measured & known & ~((full > 0) & np.isfinite(full))
    if bad.any():
        i, t, j = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(f"{_label(who, ids, i)}: the spread of data[{t}, {j}] is {full[i, t, j]}; give a positive, "
                         "finite standard deviation for every measured value.")  # fmt: skip
    return sigma, None, names, functions


def _column(values: Any, E: int, who: str, field: str) -> np.ndarray:
    arr = host_array(values, who, field)
    if arr.ndim == 0:
        return arr
    if arr.shape != (E,):
        raise ValueError(f"{who}: {field} has shape {arr.shape}; give a number or one value per experiment, ({E},).")
    return arr


def _per_experiment(values: Any, E: int, who: str, field: str) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`_numbers_and_names` of a number, a name or ``(E,)`` of them."""
    numbers, names = _numbers_and_names(values, who, field)
    if numbers.ndim and numbers.shape != (E,):
        raise ValueError(f"{who}: {field} has shape {numbers.shape}; give a number, a study parameter's name or one "
                         f"per experiment, ({E},).")  # fmt: skip
    return numbers, names


def _checked_conditions(conditions, problem, E: int, ids: np.ndarray, who: str) -> tuple[dict, dict]:
    """``(conditions, parameters)``: model parameter -> numbers (NaN: not fixed), and -> the study
    parameters' names given instead of numbers."""
    if conditions is None:
        return {}, {}
    if not isinstance(conditions, Mapping):
        raise TypeError(f"{who}: conditions must be a mapping model parameter name -> values (one per experiment).")
    model = problem.parameter_names
    unknown = [c for c in conditions if c not in model]
    if unknown:
        raise ValueError(f"{who}: conditions names unknown model parameter(s) {unknown}; the model's parameters are "
                         f"{list(model)}.")  # fmt: skip
    out, mapping = {}, {}
    for name, values in conditions.items():
        col, names = _per_experiment(values, E, who, f"conditions[{name!r}]")
        inf = np.isinf(col)
        if inf.any():
            i = int(np.argmax(np.reshape(inf, -1))) if col.ndim else 0
            raise ValueError(f"{_label(who, ids, i)}: conditions[{name!r}] = {float(np.reshape(col, -1)[i])} must be "
                             "finite (NaN leaves it to the parameter table).")  # fmt: skip
        out[name] = col
        if names is not None:
            mapping[name] = names
    return out, mapping


def _checked_observable_parameters(values, problem, E: int, ids: np.ndarray, who: str) -> dict:
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise TypeError(f"{who}: observable_parameters must be a mapping name -> numbers or study parameters' names.")
    clash = sorted(k for k in values if k in problem.parameter_names)
    if clash:
        raise ValueError(f"{who}: observable_parameters names {clash}, which are model parameters; give observable "
                         "parameters names of their own (the model's are set by conditions).")  # fmt: skip
    out = {}
    for name, v in values.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{who}: observable_parameters keys must be names (strings), got {name!r}.")
        field = f"observable_parameters[{name!r}]"
        numbers, names = _per_experiment(v, E, who, field)
        bad = ~np.isfinite(numbers) if names is None else ~np.isfinite(numbers) & (names == "")
        if bad.any():
            i = int(np.argmax(np.reshape(bad, -1))) if numbers.ndim else 0
            raise ValueError(f"{_label(who, ids, i)}: {field} is {float(np.reshape(numbers, -1)[i])}; give a finite "
                             "number or a study parameter's name.")  # fmt: skip
        out[name] = (numbers, names)
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
