"""The PEtab condition tables: :class:`ConditionTable` (the conditions as columns of numbers and
parameter ids) read by :func:`read_conditions`, and :class:`ConditionRow` (one condition).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from ._petab_cells import IDENTIFIER, BadCell, number_or_id, parse_column, raise_first_bad, read_table_file
from ._petab_errors import Origin

CONDITION_COLUMNS = ("conditionId", "conditionName")


@dataclasses.dataclass(frozen=True)
class ConditionRow:
    """A row of the condition table: column (a model id) -> a float, a parameter id, or NaN."""

    id: str
    values: dict
    origin: Origin


def _condition_cell(value) -> float | str:
    v = number_or_id(value)
    if isinstance(v, str) and not IDENTIFIER.match(v):
        raise BadCell(f"{v!r} is neither a number nor a parameter id")
    return v


@dataclasses.dataclass(frozen=True, eq=False)
class ConditionTable:
    """The condition tables as columns, one entry per condition (in table order).

    Attributes:
        ids: ``(C,)`` condition ids.
        columns: column (a model id) -> ``(numbers, names, given)``: ``(C,)`` floats (NaN where
            empty or a name), ``(C,)`` parameter ids (``""`` where none), and where the row's file
            has the column.
        paths, file, row: the files, and each condition's file (index) and 1-based row.
    """

    ids: np.ndarray
    columns: dict
    paths: tuple
    file: np.ndarray
    row: np.ndarray

    def __len__(self) -> int:
        return int(self.ids.size)

    def origin(self, i: int) -> Origin:
        return Origin(self.paths[int(self.file[i])], int(self.row[i]))

    @functools.cached_property
    def index(self) -> dict:
        """Condition id -> its position."""
        return {c: i for i, c in enumerate(self.ids.tolist())}

    def rows(self) -> dict:
        """Condition id -> :class:`ConditionRow` (the columns its file has)."""
        out = {}
        items = [(c, *v) for c, v in self.columns.items()]
        for i, cid in enumerate(self.ids.tolist()):
            values = {}
            for column, numbers, names, given in items:
                if given[i]:
                    values[column] = names[i] if names[i] else float(numbers[i])
            out[cid] = ConditionRow(cid, values, self.origin(i))
        return out


def read_conditions(paths) -> ConditionTable:
    import pandas as pd
    from petab.v1.conditions import get_condition_df

    frames = []
    for path in paths:
        df = read_table_file(path, get_condition_df)
        rows = np.arange(1, len(df) + 1)
        ids = np.asarray(df.index.astype(str), dtype=object)
        bad_id = ~pd.Series(ids, dtype=object).str.match(IDENTIFIER.pattern).to_numpy(bool)
        raise_first_bad(path, rows, [(bad_id, lambda i: f"{ids[i]!r} is not a valid id", "conditionId")])
        columns = {}
        for column in df.columns:
            if column in CONDITION_COLUMNS:
                continue
            values = df[column]
            if values.dtype.kind in "fiu":
                numbers, names = values.to_numpy(np.float64), np.full(len(df), "", dtype=object)
            else:
                codes, parsed = parse_column(path, rows, values.to_numpy(object), str(column), _condition_cell)
                numeric = np.array([math.nan if isinstance(v, str) else v for v in parsed], dtype=np.float64)
                label = np.array([v if isinstance(v, str) else "" for v in parsed], dtype=object)
                numbers, names = numeric[codes], label[codes]
            columns[str(column)] = (numbers, names)
        frames.append((path, ids, rows, columns))
    all_columns = list(dict.fromkeys(c for _, _, _, cols in frames for c in cols))
    ids = np.concatenate([f[1] for f in frames])
    n = ids.size
    table_columns = {}
    for column in all_columns:
        numbers = np.full(n, np.nan)
        names = np.full(n, "", dtype=object)
        given = np.zeros(n, dtype=bool)
        at = 0
        for _, fids, _, cols in frames:
            if column in cols:
                numbers[at : at + fids.size], names[at : at + fids.size] = cols[column]
                given[at : at + fids.size] = True
            at += fids.size
        table_columns[column] = (numbers, names, given)
    file = np.concatenate([np.full(f[1].size, k, dtype=np.int64) for k, f in enumerate(frames)])
    row = np.concatenate([f[2] for f in frames])
    table = ConditionTable(ids, table_columns, tuple(paths), file, row)
    dup = pd.Index(ids).duplicated()
    if dup.any():
        i = int(np.argmax(dup))
        raise table.origin(i).error(f"{ids[i]!r} is defined twice", "conditionId")
    return table
