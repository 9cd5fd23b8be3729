"""``ds.Study.from_table``: the experiments of a long-format table (one row per measured value) as
arrays (:mod:`diffsoup.inference.study._experiment_arrays`), pivoted without a loop over experiments."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ._experiment_arrays import ExperimentArrays, _noise_columns, _with_spread, experiment_arrays
from ._noise import AbstractNoise, Gaussian

WHO = "Study.from_table"


def read_table(table: Any):
    """A pandas ``DataFrame`` of a ``DataFrame``, a pyarrow ``Table`` or a Parquet/CSV/TSV path."""
    import pandas as pd

    if isinstance(table, pd.DataFrame):
        return table
    if hasattr(table, "to_pandas"):  # pyarrow.Table (and anything that converts the same way)
        return table.to_pandas()
    if isinstance(table, (str, os.PathLike)):
        path = Path(table)
        suffix = path.suffix.lower()
        if suffix in (".parquet", ".pq"):
            try:
                return pd.read_parquet(path)
            except ImportError as err:
                raise ImportError(f"{WHO}: reading {path} needs a Parquet engine (pip install pyarrow): {err}") from None
        if suffix in (".csv", ".tsv", ".txt"):
            return pd.read_csv(path, sep="\t" if suffix in (".tsv", ".txt") else ",")
        raise ValueError(f"{WHO}: {path} is neither a Parquet (.parquet) nor a CSV (.csv) or TSV (.tsv) file.")
    raise TypeError(f"{WHO}: table must be a pandas DataFrame, a pyarrow Table or a Parquet/CSV path, not "
                    f"{type(table).__name__}.")  # fmt: skip


def _row_error(df, rows: np.ndarray, ids: np.ndarray, codes: np.ndarray, column: str, message: str):
    """A ``ValueError`` naming the first row in ``rows`` (a mask), its experiment and the column."""
    r = int(np.argmax(rows))
    label = df.index[r]
    return ValueError(f"{WHO}: row {label!r} (experiment {str(ids[codes[r]])!r}), column {column!r}: {message}")


def _constant_per_experiment(df, values: np.ndarray, ids, codes, first: np.ndarray, column: str) -> np.ndarray:
    """``values`` of each experiment's first row ``(E,)``, after checking the other rows agree."""
    per = values[first]
    mine = per[codes]
    same = (mine == values) | (_isnan(mine) & _isnan(values))
    if not same.all():
        raise _row_error(df, ~same, ids, codes, column,
                         f"{_shown(values[int(np.argmax(~same))])} differs from the experiment's first row "
                         f"({_shown(mine[int(np.argmax(~same))])}); a {column!r} value holds for a whole "
                         "experiment.")  # fmt: skip
    return per


def _shown(x: Any) -> str:
    return repr(x.item() if isinstance(x, np.generic) else x)


def _isnan(x: np.ndarray) -> np.ndarray:
    return np.isnan(x) if x.dtype.kind == "f" else np.zeros(x.shape, dtype=bool)


def study_arrays_of_table(
    problem: Any,
    table: Any,
    *,
    experiment: str = "experiment",
    time: str = "time",
    observable: str = "observable",
    value: str = "value",
    sigma: str | None = "sigma",
    conditions: Sequence[str] | Mapping[str, str] = (),
    condition: str | None = None,
    condition_table: Any = None,
    groups: Sequence[str] | Mapping[str, str] = (),
    levels: Sequence[str] | None = None,
    observable_names: Sequence[str] | None = None,
    observables: Any = None,
    noise: Any = None,
    y0: Any = None,
    t0: float = 0.0,
) -> tuple[ExperimentArrays, tuple]:
    """The :class:`ExperimentArrays` and levels of a long-format table.

    Args:
        problem: the built ``ds.Problem``.
        table: a pandas ``DataFrame``, a pyarrow ``Table`` or a Parquet/CSV/TSV path.
        experiment, time, observable, value: the columns of the experiment id, measurement time,
            observable name and measured value (NaN: missing) of each row.
        sigma: the column of each value's standard deviation (or Laplace scale), used when the
            table has it (empty: the noise model's spread), None to ignore it. A wide table gives
            them in ``sigma:<observable>`` columns.
        conditions: columns named by model parameters (or a mapping model parameter -> column),
            one value per experiment (NaN: left to the parameter table).
        condition, condition_table: a column of condition ids and a ``DataFrame`` indexed by
            condition id whose columns are model parameters (PEtab's condition table).
        groups: level columns, outermost first (or a mapping level -> column), one member per
            experiment.
        levels: the study's levels (default: those of ``groups``).
        observable_names: the observables' names in column order (default: the model's states
            when ``observables`` is None, else the names in order of first appearance).
        observables, noise, y0, t0: as for ``Study.from_arrays``; a mapping ``y0`` may name a
            column for a state (``{"A": "A0"}``: the initial amount of ``A`` from column ``A0``,
            one value per experiment); arrays are of the experiments in order of first appearance.

    Returns:
        ``(arrays, levels)``; experiments in order of first appearance, each experiment's rows by
        time (a replicate at the same time and observable gets a time row of its own).

    Raises:
        ValueError: naming the row, its experiment id and the column: a missing column, an unknown
            observable, a time that is NaN or before ``t0``, a non-finite value, a spread that is
            not positive, a condition or member that changes within an experiment.
    """
    import pandas as pd

    df = read_table(table)
    conditions = dict(conditions) if isinstance(conditions, Mapping) else {c: c for c in conditions}
    groups = dict(groups) if isinstance(groups, Mapping) else {c: c for c in groups}
    # Wide: no observable and value columns, one column per observable (and "sigma:<observable>").
    wide = observable not in df.columns and value not in df.columns
    if wide and observable_names is None and observables is None:
        observable_names = problem.state_names  # every state; a state without a column is not measured
    if wide and not any(c in df.columns for c in observable_names or ()):
        raise ValueError(f"{WHO}: the table has neither {observable!r} and {value!r} columns (long format) nor columns "
                         "named by the observables (wide format: give observable_names=).")  # fmt: skip
    use_sigma = sigma is not None and sigma in df.columns
    needed = [experiment, time, *([] if wide else [observable, value]), *conditions.values(), *groups.values()]
    needed += [condition] if condition is not None else []
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise ValueError(f"{WHO}: the table has no column(s) {missing}; its columns are {list(df.columns)} (name them "
                         "with experiment=, time=, observable=, value=, ...).")  # fmt: skip
    exp_col = df[experiment]
    if exp_col.isna().any():
        r = int(np.argmax(exp_col.isna().to_numpy()))
        raise ValueError(f"{WHO}: row {df.index[r]!r}, column {experiment!r}: the experiment id is missing.")
    codes, ids = pd.factorize(exp_col.astype(str), sort=False)
    ids = np.asarray(ids, dtype=str)
    E = ids.size
    first = np.full(E, -1, dtype=np.int64)
    first[codes[::-1]] = np.arange(codes.size)[::-1]
    t = pd.to_numeric(df[time], errors="coerce").to_numpy(dtype=np.float64)
    bad = np.isnan(t) | np.isneginf(t)
    if bad.any():
        raise _row_error(df, bad, ids, codes, time, "the time is missing or not a number; give a finite time (or inf, "
                         "the steady state).")  # fmt: skip
    early = t < t0
    if early.any():
        raise _row_error(df, early, ids, codes, time, f"time {t[int(np.argmax(early))]} is before t0={t0}.")
    if wide:
        times, data, cells = _pivot_wide(df, codes, ids, t, [str(x) for x in observable_names])
    else:
        times, data, cells = _pivot_long(df, codes, ids, t, observable, value, sigma if use_sigma else None,
                                         observable_names, observables, problem)  # fmt: skip
    if noise is None:
        noise = Gaussian()
    if cells is not None:
        noise = _with_table_spread(noise, cells)
    conds = {}
    for name, column in conditions.items():
        col = pd.to_numeric(df[column], errors="coerce").to_numpy(dtype=np.float64)
        conds[name] = _constant_per_experiment(df, col, ids, codes, first, column)
    if condition is not None:
        conds.update(_conditions_of_table(df, condition, condition_table, ids, codes, first, conds))
    if isinstance(y0, Mapping):  # a state's initial amount may come from a column
        y0 = dict(y0)
        for state, column in y0.items():
            if isinstance(column, str):
                if column not in df.columns:
                    raise ValueError(f"{WHO}: y0[{state!r}] names column {column!r}, which the table does not have.")
                col = pd.to_numeric(df[column], errors="coerce").to_numpy(dtype=np.float64)
                y0[state] = _constant_per_experiment(df, col, ids, codes, first, column)
    members = {}
    for level, column in groups.items():
        col = df[column].astype(str).to_numpy(dtype=object)
        members[level] = _constant_per_experiment(df, col, ids, codes, first, column)
    arrays = experiment_arrays(problem, times, data, ids=ids, y0=y0, conditions=conds, noise=noise, groups=members,
                               observables=observables, t0=t0, who=WHO)  # fmt: skip
    return arrays, tuple(members) if levels is None else tuple(levels)


def _slots(codes: np.ndarray, keys: tuple, E: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Rows sorted by experiment then ``keys`` (lexsort order, last most significant): ``(order,
    slot)`` with slot the time row of each sorted row within its experiment (a new slot where any
    key changes), and the most slots of an experiment."""
    order = np.lexsort(keys + (codes,))
    e_s = codes[order]
    new = np.ones(order.size, dtype=bool)
    new[1:] = e_s[1:] != e_s[:-1]
    for key in keys:
        k_s = key[order]
        new[1:] |= k_s[1:] != k_s[:-1]
    slot_id = np.cumsum(new) - 1
    first_slot = np.zeros(E, dtype=np.int64)
    starts = np.ones(order.size, dtype=bool)
    starts[1:] = e_s[1:] != e_s[:-1]
    first_slot[e_s[starts]] = slot_id[starts]
    slot = slot_id - first_slot[e_s]
    return order, slot, int(slot.max()) + 1


def _refuse_first(df, bad: np.ndarray, ids, codes, columns: Sequence[str], values: np.ndarray, reason: str) -> None:
    """Raise the row error of the first ``True`` cell of ``bad`` (rows x ``columns``), if any,
    naming its value and ``reason``."""
    if bad.any():
        r, j = (int(x) for x in np.argwhere(bad)[0])
        raise _row_error(df, bad.any(axis=1), ids, codes, columns[j], f"{values[r, j]} {reason}")


def _numeric_columns(df, columns: Sequence[str], rows: int) -> np.ndarray:
    """``(rows, len(columns))`` float64: each column as numbers (NaN where not a number or absent)."""
    import pandas as pd

    return np.stack([pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=np.float64) if c in df.columns
                     else np.full(rows, np.nan) for c in columns], axis=1)  # fmt: skip


def _pivot_wide(df, codes, ids, t, names):
    """``(times, data, spreads or None)`` of a wide table: each row one time of one experiment."""
    E = ids.size
    row = np.arange(codes.size)
    order, slot, m = _slots(codes, (row, t), E)  # each row its own time row, in time order
    e_s = codes[order]
    times = np.full((E, m), np.nan)
    times[e_s, slot] = t[order]
    values = _numeric_columns(df, names, codes.size)
    _refuse_first(df, np.isinf(values), ids, codes, names, values,
                  "is not finite; measured values are finite (empty or NaN: missing).")  # fmt: skip
    data = np.full((E, m, len(names)), np.nan)
    data[e_s, slot] = values[order]
    sigma_columns = [f"sigma:{c}" for c in names]
    cells = None
    if any(c in df.columns for c in sigma_columns):
        spreads = _numeric_columns(df, sigma_columns, codes.size)
        bad = np.isfinite(values) & ~np.isnan(spreads) & ~(np.isfinite(spreads) & (spreads > 0))
        _refuse_first(df, bad, ids, codes, sigma_columns, spreads,
                      "is not a positive, finite spread; give one for every measured value.")  # fmt: skip
        cells = np.full((E, m, len(names)), np.nan)
        cells[e_s, slot] = spreads[order]
    return times, data, cells


def _pivot_long(df, codes, ids, t, observable, value, sigma, observable_names, observables, problem):
    """``(times, data, spreads or None)`` of a long table: each row one value; a replicate (same
    experiment, time and observable) gets a time row of its own."""
    import pandas as pd

    E = ids.size
    v = pd.to_numeric(df[value], errors="coerce").to_numpy(dtype=np.float64)
    inf = np.isinf(v)
    if inf.any():
        raise _row_error(df, inf, ids, codes, value, f"{v[int(np.argmax(inf))]} is not finite; measured values are "
                         "finite (NaN: missing).")  # fmt: skip
    if observable_names is None:
        observable_names = problem.state_names if observables is None else \
            tuple(pd.unique(df[observable].astype(str)))  # fmt: skip
    observable_names = [str(x) for x in observable_names]
    obs = pd.Index(observable_names).get_indexer(df[observable].astype(str)).astype(np.int64)
    unknown = obs < 0
    if unknown.any():
        name = df[observable].iloc[int(np.argmax(unknown))]
        raise _row_error(df, unknown, ids, codes, observable, f"unknown observable {name!r}; the observables are "
                         f"{observable_names[:10]}{'...' if len(observable_names) > 10 else ''} "
                         "(observable_names=).")  # fmt: skip
    k = len(observable_names)
    s = None
    if sigma is not None:
        s = pd.to_numeric(df[sigma], errors="coerce").to_numpy(dtype=np.float64)
        bad = np.isfinite(v) & ~np.isnan(s) & ~(np.isfinite(s) & (s > 0))
        if bad.any():
            raise _row_error(df, bad, ids, codes, sigma, f"{s[int(np.argmax(bad))]} is not a positive, finite spread; "
                             "give one for every measured value.")  # fmt: skip
    # The replicate number of each row among the rows of its (experiment, time, observable).
    order = np.lexsort((obs, t, codes))
    e_s, t_s, o_s = codes[order], t[order], obs[order]
    new_cell = np.ones(order.size, dtype=bool)
    new_cell[1:] = (e_s[1:] != e_s[:-1]) | (t_s[1:] != t_s[:-1]) | (o_s[1:] != o_s[:-1])
    cell_start = np.maximum.accumulate(np.where(new_cell, np.arange(order.size), 0))
    rep = np.empty(order.size, dtype=np.int64)
    rep[order] = np.arange(order.size) - cell_start
    # A time row per (time, replicate) of each experiment.
    order, slot, m = _slots(codes, (rep, t), E)
    e_s = codes[order]
    times = np.full((E, m), np.nan)
    times[e_s, slot] = t[order]
    data = np.full((E, m, k), np.nan)
    data[e_s, slot, obs[order]] = v[order]
    cells = None
    if s is not None:
        cells = np.full((E, m, k), np.nan)
        cells[e_s, slot, obs[order]] = s[order]
    return times, data, cells


def _with_table_spread(noise: Any, cells: np.ndarray) -> Any:
    """``noise`` (one model or one per column) with the table's spreads ``(E, m, k)``; a cell the
    table leaves empty (NaN) keeps the model's spread."""
    columns = _noise_columns(noise, cells.shape[2], WHO)
    for j, c in enumerate(columns):
        if isinstance(c.spread, str) or callable(c.spread):
            if np.isfinite(cells[:, :, j]).any():
                raise ValueError(f"{WHO}: the table gives spreads of observable column {j}, whose noise spread is "
                                 f"{c.spread!r} (a parameter or a function); keep one.")  # fmt: skip
            continue
        empty = np.isnan(cells[:, :, j])
        if empty.any():
            spread = np.broadcast_to(np.asarray(c.spread, dtype=np.float64), cells.shape[:2] if not isinstance(
                noise, AbstractNoise) else cells.shape)  # fmt: skip
            spread = spread if not isinstance(noise, AbstractNoise) else spread[:, :, j]
            cells[:, :, j] = np.where(empty, spread, cells[:, :, j])
    if all(isinstance(c.spread, str) or callable(c.spread) for c in columns):
        return noise
    if isinstance(noise, AbstractNoise):
        return _with_spread(noise, cells)
    return [c if isinstance(c.spread, str) or callable(c.spread) else _with_spread(c, cells[:, :, j])
            for j, c in enumerate(columns)]  # fmt: skip


def _conditions_of_table(df, condition: str, condition_table: Any, ids, codes, first, given: dict) -> dict:
    """Model parameter -> ``(E,)`` values of each experiment's condition id (the condition table's row)."""
    import pandas as pd

    if condition_table is None:
        raise ValueError(f"{WHO}: condition={condition!r} names a column of condition ids; give condition_table= (a "
                         "DataFrame indexed by condition id whose columns are model parameters).")  # fmt: skip
    table = condition_table if isinstance(condition_table, pd.DataFrame) else pd.DataFrame(condition_table).T
    col = df[condition].astype(str).to_numpy(dtype=object)
    per = _constant_per_experiment(df, col, ids, codes, first, condition)
    index = pd.Index(table.index.astype(str))
    where = index.get_indexer(per.astype(str))
    if np.any(where < 0):
        e = int(np.argmax(where < 0))
        raise ValueError(f"{WHO}: experiment {str(ids[e])!r}, column {condition!r}: condition {per[e]!r} is not in "
                         f"condition_table (its conditions are {list(index[:10])}).")  # fmt: skip
    out = {}
    for name in table.columns:
        if name in given:
            continue
        values = pd.to_numeric(table[name], errors="coerce").to_numpy(dtype=np.float64)
        out[str(name)] = values[where]
    return out
