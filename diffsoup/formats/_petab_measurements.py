"""The PEtab measurement tables: :class:`MeasurementTable` (every row as columns, checked against
the observable and condition tables, the placeholder counts included) read by :func:`read_measurements`,
and :class:`MeasurementRow` (one row).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ._petab_cells import (
    IDENTIFIER, BadCell, cell_number, cell_text, factorized, is_blank, number_or_id, parse_column, raise_first_bad,
    read_table_file, warn_unknown_columns,
)
from ._petab_conditions import ConditionTable
from ._petab_errors import Origin, PetabError

MEASUREMENT_COLUMNS = ("observableId", "preequilibrationConditionId", "simulationConditionId", "measurement", "time",
                       "observableParameters", "noiseParameters", "datasetId", "replicateId")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class MeasurementRow:
    """A row of the measurement table.

    Attributes:
        index: its position in the concatenated measurement tables (the simulation table's order).
        observable_parameters, noise_parameters: the ``;``-separated values, each a float or a
            parameter id.
        preequilibration: the pre-equilibration condition, or None.
    """

    index: int
    observable: str
    condition: str
    preequilibration: str | None
    value: float
    time: float
    observable_parameters: tuple
    noise_parameters: tuple
    origin: Origin


def _replacements(value) -> tuple:
    """A ``;``-separated list of numbers and parameter ids (PEtab's observable and noise parameters)."""
    if is_blank(value):
        return ()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (float(value),)
    out = []
    for part in str(value).split(";"):
        v = number_or_id(part)
        if isinstance(v, float) and math.isnan(v):
            raise BadCell(f"{value!r} holds an empty entry")
        if isinstance(v, str) and not IDENTIFIER.match(v):
            raise BadCell(f"{part.strip()!r} is neither a number nor a parameter id")
        out.append(v)
    return tuple(out)


@dataclasses.dataclass(frozen=True, eq=False)
class MeasurementTable:
    """The measurement tables as columns, one entry per row (the concatenated tables' order).

    Attributes:
        observable, condition, preequilibration: ``(N,)`` ids (``""``: no pre-equilibration).
        value, time: ``(N,)`` floats.
        observable_parameters, noise_parameters: ``(N,)`` codes into ``replacements`` (the
            distinct ``;``-separated lists, each a tuple of floats and parameter ids).
        paths, file, row: the files, and each row's file (index) and 1-based row.
    """

    observable: np.ndarray
    condition: np.ndarray
    preequilibration: np.ndarray
    value: np.ndarray
    time: np.ndarray
    observable_parameters: np.ndarray
    noise_parameters: np.ndarray
    replacements: tuple
    paths: tuple
    file: np.ndarray
    row: np.ndarray

    def __len__(self) -> int:
        return int(self.value.size)

    def origin(self, i: int) -> Origin:
        return Origin(self.paths[int(self.file[i])], int(self.row[i]))

    def error(self, i: int, message: str, column: str | None = None) -> PetabError:
        """A :class:`PetabError` naming row ``i``'s file and row."""
        return self.origin(i).error(message, column)

    def rows(self) -> tuple:
        """The rows as :class:`MeasurementRow` objects."""
        rep = self.replacements
        return tuple(
            MeasurementRow(i, o, c, p or None, v, t, rep[op], rep[nz], Origin(self.paths[f], r))
            for i, (o, c, p, v, t, op, nz, f, r) in enumerate(zip(
                self.observable.tolist(), self.condition.tolist(), self.preequilibration.tolist(),
                self.value.tolist(), self.time.tolist(), self.observable_parameters.tolist(),
                self.noise_parameters.tolist(), self.file.tolist(), self.row.tolist()))
        )  # fmt: skip


def _ids(values) -> np.ndarray:
    """A column of ids as stripped strings (``""`` where empty)."""
    codes, uniques = factorized(values)
    if not uniques.size:
        return np.array([], dtype=object)
    return np.array([cell_text(u) for u in uniques], dtype=object)[codes]


def read_measurements(paths, observables: dict, conditions: ConditionTable) -> MeasurementTable:
    import pandas as pd
    from petab.v1.measurements import get_measurement_df

    parts = []
    replacements: dict[tuple, int] = {}
    want = {kind: {oid: o.placeholders(kind) for oid, o in observables.items()} for kind in ("observable", "noise")}
    for path in paths:
        df = read_table_file(path, get_measurement_df)
        warn_unknown_columns(path, df.columns, MEASUREMENT_COLUMNS, "measurement table")
        for column in ("observableId", "simulationConditionId", "measurement", "time"):
            if column not in df.columns:
                raise PetabError("the measurement table has no such column", path=path, column=column)
        n = len(df)
        rows = np.arange(1, n + 1)

        def column_of(name, df=df, n=n):
            return df[name].to_numpy(object) if name in df.columns else np.full(n, None, dtype=object)

        oid = _ids(column_of("observableId"))
        cond = _ids(column_of("simulationConditionId"))
        pre = _ids(column_of("preequilibrationConditionId"))
        numbers = {}
        for name in ("measurement", "time"):
            values = df[name]
            if values.dtype.kind in "fiu":
                numbers[name] = values.to_numpy(np.float64)
                continue
            codes, parsed = parse_column(path, rows, values.to_numpy(object), name, cell_number)
            numbers[name] = np.asarray(parsed, dtype=np.float64)[codes]
        value, time = numbers["measurement"], numbers["time"]
        lists = {}
        for name in ("observableParameters", "noiseParameters"):
            codes, parsed = parse_column(path, rows, column_of(name), name, _replacements)
            lists[name] = np.array([replacements.setdefault(t, len(replacements)) for t in parsed],
                                   dtype=np.int64)[codes]  # fmt: skip
        length = np.array([len(t) for t in replacements], dtype=np.int64)
        obs_index = pd.Index(list(observables)).get_indexer(oid)
        known_obs = obs_index >= 0
        known_conditions = pd.Index(conditions.ids)
        checks = [
            (~known_obs, lambda i: f"{oid[i]!r} is not in the observable table", "observableId"),
            (known_conditions.get_indexer(cond) < 0,
             lambda i: f"{cond[i]!r} is not in the condition table", "simulationConditionId"),
            ((pre != "") & (known_conditions.get_indexer(pre) < 0),
             lambda i: f"{pre[i]!r} is not in the condition table", "preequilibrationConditionId"),
            (np.isnan(value), lambda i: "is empty; give a number", "measurement"),
            (np.isinf(value), lambda i: f"{value[i]} is not a finite measured value", "measurement"),
            (np.isnan(time), lambda i: "is empty; give a number", "time"),
            ((time < 0) | np.isneginf(time),
             lambda i: f"{time[i]} must be a non-negative time or inf (a steady-state measurement)", "time"),
        ]  # fmt: skip
        for kind, name in (("observable", "observableParameters"), ("noise", "noiseParameters")):
            wanted = np.array(list(want[kind].values()) + [0], dtype=np.int64)[obs_index]
            given = length[lists[name]]

            def message(i, kind=kind, given=given, wanted=wanted):
                return (f"gives {given[i]} value(s); the {kind} formula of {oid[i]!r} has {wanted[i]} placeholder(s) "
                        f"{kind}Parameter{{n}}_{oid[i]}")  # fmt: skip

            checks.append((known_obs & (given != wanted), message, name))
        raise_first_bad(path, rows, checks)
        parts.append((oid, cond, pre, value, time, lists["observableParameters"], lists["noiseParameters"], rows))
    if not sum(p[0].size for p in parts):
        raise PetabError("the measurement tables hold no measurement", path=paths[0])
    cat = [np.concatenate([p[k] for p in parts]) for k in range(8)]
    file = np.concatenate([np.full(p[0].size, k, dtype=np.int64) for k, p in enumerate(parts)])
    return MeasurementTable(*cat[:7], tuple(replacements), tuple(paths), file, cat[7])
