"""A PEtab problem's study held as arrays (``ds.Study.from_arrays``), built from the measurement
and condition tables' columns with no Python loop over rows or conditions.

The layout is that of the ``Experiment`` objects (see :mod:`._petab_study`): one experiment per
simulation condition, in order of first appearance in the measurement tables; its times are its
distinct measurement times, each repeated as often as the most replicates an observable has there;
one column per observable. What makes it possible (:func:`obstacle` says what does not): no pre-
equilibration, and one set of ``observableParameters`` (and of ``noiseParameters`` of noise
formulas that are expressions) per observable and condition, so that every observable has one
column. Condition values that are parameter ids, per-measurement noise parameters (numbers or
parameter ids), per-condition observable parameters, species set by conditions, events and
switches are all held per experiment or shared.

The checks of the rows (positive data of log-transformed observables, positive finite noise
values, noise parameters that are parameters) are vectorized too, and their errors name the
measurement table's file, row and column.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from ..inference import Study
from ._petab_errors import PetabError

_EXPERIMENT_ROW = re.compile(r"experiment '(.*?)' \(row (\d+)\)")
# The model parameters a species set by some condition adds: "<species>:initial" (its value) and
# "<species>:initial_set" (1 where the condition sets it), read by the shared y0(p).
INITIAL_VALUE, INITIAL_SET = ":initial", ":initial_set"


@dataclasses.dataclass(frozen=True, eq=False)
class Rows:
    """The measurement rows' experiments and observables as codes.

    Attributes:
        experiment: ``(N,)`` each row's experiment (its simulation condition, numbered in order of
            first appearance); ids: ``(E,)`` those conditions.
        observable: ``(N,)`` each row's observable (its position in the observable table).
        first: ``(E,)`` each experiment's first row.
    """

    experiment: np.ndarray
    ids: np.ndarray
    observable: np.ndarray
    first: np.ndarray


def rows_of(tables: Any) -> Rows:
    import pandas as pd

    mt = tables.measurement_table
    experiment, ids = pd.factorize(mt.condition)
    _, first = np.unique(experiment, return_index=True)
    observable = pd.Index(list(tables.observables)).get_indexer(mt.observable)
    return Rows(experiment.astype(np.int64), np.asarray(ids, dtype=str), observable.astype(np.int64), first)


def obstacle(tables: Any, rows: Rows, array_noise: dict) -> str | None:
    """Why the problem's study cannot be held as arrays (None: it can)."""
    import pandas as pd

    mt = tables.measurement_table
    pre = mt.preequilibration != ""
    if pre.any():
        i = int(np.argmax(pre))
        return (f"{mt.paths[mt.file[i]].name}, row {mt.row[i]}, pre-equilibrates (condition "
                f"{mt.preequilibration[i]!r})")  # fmt: skip
    # A slot of an observable: its observable parameters, and the noise parameters of a noise
    # formula that is an expression (the others are per-measurement spreads).
    expression = np.array([not array_noise[o] for o in tables.observables], dtype=bool)[rows.observable]
    slots = pd.DataFrame({"experiment": rows.experiment, "observable": rows.observable,
                          "op": mt.observable_parameters, "np": np.where(expression, mt.noise_parameters, -1)})  # fmt: skip
    distinct = slots.drop_duplicates()
    twice = distinct.duplicated(["experiment", "observable"])
    if twice.any():
        e, o = (int(x) for x in distinct.loc[twice.idxmax(), ["experiment", "observable"]])
        same = np.flatnonzero((rows.experiment == e) & (rows.observable == o))
        key = slots.iloc[same][["op", "np"]].to_numpy()
        b = same[int(np.argmax((key != key[0]).any(axis=1)))]
        oid = list(tables.observables)[o]
        return (f"observable {oid!r} has different observableParameters or noiseParameters within condition "
                f"{str(rows.ids[e])!r} ({mt.paths[mt.file[same[0]]].name}, rows {mt.row[same[0]]} and {mt.row[b]}): "
                "it needs several columns")  # fmt: skip
    return None


@dataclasses.dataclass(frozen=True)
class Placements:
    """Where each measurement row lies in the study: ``placements[row] -> (experiment id, row of
    its data, column)``; the arrays ``experiment`` (study indices), ``row`` and ``column`` ``(N,)``."""

    ids: tuple
    experiment: np.ndarray
    row: np.ndarray
    column: np.ndarray

    def __len__(self) -> int:
        return int(self.experiment.size)

    def __getitem__(self, i: int) -> tuple[str, int, int]:
        return self.ids[int(self.experiment[i])], int(self.row[i]), int(self.column[i])


def _occurrence(keys: np.ndarray) -> np.ndarray:
    """Each entry's count of earlier equal entries (0 for the first of its value)."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    n = keys.size
    start = np.ones(n, dtype=bool)
    start[1:] = sorted_keys[1:] != sorted_keys[:-1]
    run_start = np.maximum.accumulate(np.where(start, np.arange(n), 0))
    out = np.empty(n, dtype=np.int64)
    out[order] = np.arange(n) - run_start
    return out


def layout(tables: Any, rows: Rows, column_of_observable: np.ndarray, k: int):
    """``(times (E, m) NaN-padded, data (E, m, k), cell_row (N,), cell_column (N,))``."""
    mt = tables.measurement_table
    E, N = rows.ids.size, len(mt)
    j = column_of_observable[rows.observable]
    t_unique, t_code = np.unique(mt.time, return_inverse=True)  # sorted: +inf last
    T = t_unique.size
    key = rows.experiment * T + t_code.reshape(-1)  # (experiment, time)
    replicate = _occurrence(key * k + j)  # the rows before it of its (experiment, time, column)
    keys, inverse = np.unique(key, return_inverse=True)  # sorted by experiment, then time
    inverse = inverse.reshape(-1)
    repeats = np.zeros(keys.size, dtype=np.int64)
    np.maximum.at(repeats, inverse, replicate + 1)
    owner = keys // T
    ends = np.cumsum(repeats)
    begins = ends - repeats
    first_row = begins - begins[np.searchsorted(owner, owner, side="left")]  # within the experiment
    m = int(np.bincount(owner, weights=repeats, minlength=E).max())
    times = np.full((E, m), np.nan)
    which = np.repeat(np.arange(keys.size), repeats)
    times[owner[which], np.arange(which.size) - begins[which] + first_row[which]] = t_unique[keys[which] % T]
    cell_row = first_row[inverse] + replicate
    data = np.full((E, m, k), np.nan)
    data[rows.experiment, cell_row, j] = mt.value
    return times, data, cell_row, j


def _replacement_columns(mt: Any, position: int) -> tuple[np.ndarray, np.ndarray]:
    """Per code of ``mt.replacements``: its entry ``position`` as ``(number or NaN, name or "")``."""
    numbers = np.full(len(mt.replacements), np.nan)
    names = np.full(len(mt.replacements), "", dtype=object)
    for code, entries in enumerate(mt.replacements):
        if position < len(entries):
            if isinstance(entries[position], str):
                names[code] = entries[position]
            else:
                numbers[code] = entries[position]
    return numbers, names


def _per_experiment(numbers: np.ndarray, names: np.ndarray) -> Any:
    """One experiment axis of numbers and names as ``Study.from_arrays`` takes it: one value when
    all are equal, floats without names, else an object array."""
    named = names != ""
    if not named.any():
        return float(numbers[0]) if np.all(numbers == numbers[0]) else numbers
    if named.all() and np.all(names == names[0]):
        return str(names[0])
    return np.where(named, names, numbers.astype(object))


def spreads(builder: Any, rows: Rows, columns: tuple, cell_row: np.ndarray, cell_column: np.ndarray, shape,
            sigma: Any) -> list:  # fmt: skip
    """The noise model of each column, its spreads per cell ``(E, m)`` (numbers, or numbers and
    parameter ids), one parameter id, or the noise function ``sigma``; the rows' noise checked."""
    mt = builder.t.measurement_table
    E, m, k = shape
    first_numbers, first_names = _replacement_columns(mt, 0)
    out = []
    for j, col in enumerate(columns):
        cls, kw = builder.noise_class(col)
        if not col.array_noise:
            out.append(cls(sigma, **kw))
            continue
        at = np.flatnonzero(cell_column == j)
        obs = col.observable
        text = obs.noise_formula.strip()
        try:
            numbers, names = np.full(at.size, float(text)), np.full(at.size, "", dtype=object)
        except ValueError:
            if text.startswith("noiseParameter") and text.endswith(f"_{obs.id}"):
                codes = mt.noise_parameters[at]
                numbers, names = first_numbers[codes], first_names[codes]
            else:
                numbers, names = np.full(at.size, np.nan), np.full(at.size, text, dtype=object)
        named = names != ""
        bad_number = ~named & ~((numbers > 0) & np.isfinite(numbers))
        unknown = named & ~np.isin(names, list(builder.table))
        bad = bad_number | unknown
        if bad.any():
            i = at[int(np.argmax(bad))]
            b = int(np.argmax(bad))
            message = (f"the noise of {obs.id!r} is {numbers[b]}; it must be positive and finite" if bad_number[b]
                       else f"{names[b]!r} is not a parameter of the parameter table")  # fmt: skip
            raise mt.error(i, message, "noiseParameters")
        if named.all() and np.all(names == names[0]):
            out.append(cls(str(names[0]), **kw))
            continue
        cells = np.full((E, m), np.nan)
        cells[rows.experiment[at], cell_row[at]] = numbers
        if named.any():
            cells = cells.astype(object)
            cells[rows.experiment[at][named], cell_row[at][named]] = names[named]
        out.append(cls(cells, **kw))
    return out


def observable_parameters(builder: Any, rows: Rows, columns: tuple, q_names: tuple) -> dict:
    """The observable parameters ``q`` of each experiment: its rows' ``observableParameters`` (and
    ``noiseParameters`` of noise expressions) for the placeholders, the parameter-table ids the
    formulas name, 1.0 for the placeholders of an observable an experiment does not measure."""
    mt = builder.t.measurement_table
    E = rows.ids.size
    out: dict[str, Any] = {name: (name if name in builder.table else 1.0) for name in q_names}
    oids = list(builder.t.observables)
    for col in columns:
        obs = col.observable
        at = np.flatnonzero(rows.observable == oids.index(obs.id))
        experiments, first = np.unique(rows.experiment[at], return_index=True)
        kinds = [("observable", mt.observable_parameters)]
        if not col.array_noise:
            kinds.append(("noise", mt.noise_parameters))
        for kind, codes in kinds:
            for n in range(1, obs.placeholders(kind) + 1):
                q = dict(col.renames)[f"{kind}Parameter{n}_{obs.id}"]
                if q not in out:
                    continue
                by_code = _replacement_columns(mt, n - 1)
                numbers, names = np.ones(E), np.full(E, "", dtype=object)
                numbers[experiments] = by_code[0][codes[at[first]]]
                names[experiments] = by_code[1][codes[at[first]]]
                out[q] = _per_experiment(numbers, names)
    return out


def conditions(builder: Any, rows: Rows) -> dict:
    """The condition tables' values per experiment, as ``Study.from_arrays`` takes ``conditions``:
    model parameters (numbers, or parameter ids: a mapping), and for each species some condition
    sets, ``"<species>:initial_set"`` (1 where set) and ``"<species>:initial"`` (its value)."""
    ct = builder.t.condition_table
    index = np.asarray([ct.index[c] for c in rows.ids.tolist()], dtype=np.int64)
    out: dict[str, Any] = {}
    for column, (numbers, names, given) in ct.columns.items():
        if column in builder.states:
            continue
        values, labels = numbers[index], names[index]
        values = np.where(given[index], values, np.nan)
        out[column] = _per_experiment(values, np.where(given[index], labels, ""))
    for s in builder.init_states:
        numbers, names, given = ct.columns[s]
        values, labels = np.where(given[index], numbers[index], np.nan), np.where(given[index], names[index], "")
        is_set = ~np.isnan(values) | (labels != "")
        out[s + INITIAL_SET] = _per_experiment(is_set.astype(np.float64), np.full(index.size, "", dtype=object))
        out[s + INITIAL_VALUE] = _per_experiment(np.where(is_set, np.nan_to_num(values), 0.0), labels)
    return out


def check_measurements(builder: Any, columns: tuple, cell_column: np.ndarray) -> None:
    """Log-transformed observables need positive measurements (the first bad row named)."""
    mt = builder.t.measurement_table
    logs = np.array([c.observable.transformation != "lin" for c in columns], dtype=bool)
    bad = logs[cell_column] & (mt.value <= 0)
    if bad.any():
        i = int(np.argmax(bad))
        col = columns[cell_column[i]]
        raise mt.error(i, f"{mt.value[i]} is not positive; the observable {col.observable.id!r} is "
                          f"{col.observable.transformation}-transformed", "measurement")  # fmt: skip


def build_study(builder: Any, rows: Rows, columns: tuple, formulas: Any, problem: Any, functions: tuple,
                parameters: list):  # fmt: skip
    """``(study held as arrays, Placements)``."""
    observables, sigma, y0, discontinuities, resets = functions
    mt = builder.t.measurement_table
    oids = list(builder.t.observables)
    column_of_observable = np.full(len(oids), -1, dtype=np.int64)
    for j, c in enumerate(columns):
        column_of_observable[oids.index(c.observable.id)] = j
    times, data, cell_row, cell_column = layout(builder.t, rows, column_of_observable, len(columns))
    check_measurements(builder, columns, cell_column)
    noise = spreads(builder, rows, columns, cell_row, cell_column, data.shape, sigma)
    try:
        study = Study.from_arrays(
            problem, times, data, parameters=parameters, ids=rows.ids, y0=y0, conditions=conditions(builder, rows),
            noise=noise, observables=observables,
            observable_parameters=observable_parameters(builder, rows, columns, formulas.q_names),
            resets=resets, discontinuities=discontinuities,
        )  # fmt: skip
    except ValueError as exc:
        found = _EXPERIMENT_ROW.search(str(exc))
        if found is None:
            raise PetabError(f"the problem does not make a study: {exc}", path=builder.t.yaml_path) from None
        e = int(found.group(2))
        raise mt.error(int(rows.first[e]), f"the rows of simulation condition {str(rows.ids[e])!r}: {exc}") from None
    return study, Placements(tuple(rows.ids.tolist()), rows.experiment, cell_row, cell_column)

