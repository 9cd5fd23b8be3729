"""Data files of study files: CSV with a header, errors naming the file and the line.

Columns: ``time``; one per observable (empty, ``nan`` or ``na`` for a missing value); optionally
``sigma:<observable>`` (each value's standard deviation) and ``experiment`` (one file holding many
experiments, each taking the rows that carry its id). Rows of one experiment are in time order.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ._reader import StudyFileError


class ExperimentData(NamedTuple):
    """One experiment's part of a data file."""

    times: np.ndarray  # (m,)
    columns: list[str]  # the observables' names, in file order
    values: np.ndarray  # (m, k), NaN where missing
    sigmas: np.ndarray  # (m, k), NaN where not given


class DataTable(NamedTuple):
    """A data file read whole: its header, its non-blank rows (stripped cells) and their line numbers."""

    path: Path
    header: list[str]
    rows: list[list[str]]
    lines: list[int]

    def experiment(self, eid: str) -> ExperimentData | None:
        """The rows of experiment ``eid`` (all rows when the file has no ``experiment`` column);
        None when the column names no such experiment.

        Raises:
            StudyFileError: naming the file and line, for a header without observable columns, a
                ``sigma:`` column of no observable, a cell that is not a finite number, or times
                out of order.
        """
        header, rows, lines, file = self.header, self.rows, self.lines, self.path
        if "experiment" in header:
            col = header.index("experiment")
            keep = [i for i, row in enumerate(rows) if row[col] == eid]
            if not keep:
                return None
            rows, lines = [rows[i] for i in keep], [lines[i] for i in keep]
        names = [h for h in header if h not in ("time", "experiment") and not h.startswith("sigma:")]
        if not names:
            raise StudyFileError("no observable columns besides time", path=file, line=1)
        for h in header:
            if h.startswith("sigma:") and h[6:] not in names:
                raise StudyFileError(f"column {h!r} names no observable column", path=file, line=1)
        values = np.full((len(rows), len(names)), np.nan)
        sigmas = np.full((len(rows), len(names)), np.nan)
        times = np.empty(len(rows))
        for i, (row, line) in enumerate(zip(rows, lines)):
            times[i] = _cell(row[header.index("time")], file, line, "time", steady_state=True)
            for j, n in enumerate(names):
                values[i, j] = _cell(row[header.index(n)], file, line, n, missing=True)
                if f"sigma:{n}" in header:
                    sigmas[i, j] = _cell(row[header.index(f"sigma:{n}")], file, line, f"sigma:{n}", missing=True)
        if times.size and np.any(np.diff(times) < 0):
            i = int(np.nonzero(np.diff(times) < 0)[0][0])
            raise StudyFileError(f"times are out of order for experiment {eid!r} ({times[i]} then {times[i + 1]}); "
                                 "sort the rows by time", path=file, line=lines[i + 1])  # fmt: skip
        return ExperimentData(times, names, values, sigmas)


def read_data_table(file: Path) -> DataTable:
    """Read a data file (header checked, blank rows skipped).

    Raises:
        StudyFileError: naming the file and line, for an empty file, a header without ``time`` or
            with a column twice, a row of the wrong length, or no data rows.
    """
    with open(file, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise StudyFileError("the file is empty; it needs a header line (time, observables...)", path=file,
                                 line=1) from None  # fmt: skip
        if "time" not in header:
            raise StudyFileError(f"the header {header} has no 'time' column", path=file, line=1)
        dup = sorted({h for h in header if header.count(h) > 1})
        if dup:
            raise StudyFileError(f"columns {dup} appear twice in the header", path=file, line=1)
        rows, lines = [], []
        for row in reader:
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise StudyFileError(f"{len(row)} values where the header has {len(header)} columns", path=file,
                                     line=reader.line_num)  # fmt: skip
            rows.append([c.strip() for c in row])
            lines.append(reader.line_num)
    if not rows:
        raise StudyFileError("the file has a header but no data rows", path=file, line=1)
    return DataTable(file, header, rows, lines)


def _cell(text: str, file: Path, line: int, column: str, *, missing: bool = False,
          steady_state: bool = False) -> float:  # fmt: skip
    """One number of a data file; ``steady_state``: ``inf`` is allowed (a steady-state measurement)."""
    if steady_state and text.lower() in ("inf", "+inf"):
        return math.inf
    if missing and text.lower() in ("", "nan", "na"):
        return math.nan
    try:
        value = float(text)
    except ValueError:
        raise StudyFileError(f"column {column!r}: {text!r} is not a number", path=file, line=line) from None
    if not math.isfinite(value):
        hint = " or 'inf' (a steady-state measurement)" if steady_state else " (leave a missing value empty)"
        raise StudyFileError(f"column {column!r}: {text!r} must be finite{hint}",
                             path=file, line=line) from None  # fmt: skip
    return value
