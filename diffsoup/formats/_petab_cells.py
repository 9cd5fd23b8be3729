"""Reading PEtab table files and their cells: a file read through ``petab.v1`` (its errors as
:class:`~diffsoup.formats._petab_errors.PetabError`), unknown columns warned about, cells as
numbers, ids and text, and whole columns parsed once per distinct value with the first bad row
named.
"""

from __future__ import annotations

import contextlib
import math
import re
import warnings
from pathlib import Path

import numpy as np

from ._petab_errors import Origin, PetabError, PetabWarning

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def warn_ignored(message: str) -> None:
    warnings.warn(message, PetabWarning, stacklevel=3)


@contextlib.contextmanager
def mixed_columns_quiet():
    """pandas' DtypeWarning (a large column of numbers and ids, e.g. observableParameters) kept
    quiet: the importer parses such columns cell by distinct cell itself."""
    from pandas.errors import DtypeWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DtypeWarning)
        yield


def read_table_file(path: Path, reader):
    try:
        with mixed_columns_quiet():
            return reader(path)
    except Exception as exc:  # noqa: BLE001 (pandas' and petab's errors for a malformed table vary)
        raise PetabError(f"cannot be read as a PEtab table: {type(exc).__name__}: {exc}", path=path) from None


def warn_unknown_columns(path: Path, columns, known, what: str) -> None:
    extra = [c for c in columns if c not in known]
    if extra:
        warn_ignored(f"{path}: {what} column(s) {extra} are not PEtab v1 columns diffsoup uses; ignored")


def is_blank(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (isinstance(value, str) and not value.strip())


def cell_text(value) -> str:
    return "" if is_blank(value) else str(value).strip()


def parse_number(origin: Origin, value, column: str, *, required: bool = True) -> float:
    if is_blank(value):
        if required:
            raise origin.error("is empty; give a number", column)
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        raise origin.error(f"{value!r} is not a number", column) from None


def number_or_id(value) -> float | str:
    """A table cell that is a number (float) or an id (str); NaN for an empty cell."""
    if is_blank(value):
        return math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        return text


class BadCell(Exception):
    """A cell that does not parse; its message, and its column (None: the caller's)."""

    def __init__(self, message: str, column: str | None = None):
        super().__init__(message)
        self.column = column


def factorized(values) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, uniques)`` of a column, NaN and None a value of their own: the cells are parsed
    once per distinct value, not once per row."""
    import pandas as pd

    codes, uniques = pd.factorize(pd.Series(values, dtype=object), use_na_sentinel=False)
    return codes, np.asarray(uniques, dtype=object)


def parse_column(path: Path, rows: np.ndarray, values, column: str, parse) -> tuple[np.ndarray, list]:
    """``(codes, parsed)``: ``parse`` of each distinct value of a column; a value it refuses raises
    a :class:`PetabError` naming the first row that holds it (``rows``: their 1-based rows)."""
    codes, uniques = factorized(values)
    parsed: list = []
    bad = {}
    for code, value in enumerate(uniques):
        try:
            parsed.append(parse(value))
        except BadCell as exc:
            parsed.append(None)
            bad[code] = exc
    if bad:
        first = int(np.flatnonzero(np.isin(codes, list(bad)))[0])
        exc = bad[int(codes[first])]
        raise PetabError(str(exc), path=path, row=int(rows[first]), column=exc.column or column)
    return codes, parsed


def raise_first_bad(path: Path, rows: np.ndarray, checks) -> None:
    """Raise the error of the earliest row among ``checks`` (``(bad mask, message of row i,
    column)``, ties in their order)."""
    found = []
    for order, (bad, message, column) in enumerate(checks):
        hit = np.flatnonzero(bad)
        if hit.size:
            found.append((int(hit[0]), order, message, column))
    if found:
        i, _, message, column = min(found, key=lambda x: x[:2])
        raise PetabError(message(i), path=path, row=int(rows[i]), column=column)


def cell_number(value, *, required: bool = True) -> float:
    if is_blank(value):
        if required:
            raise BadCell("is empty; give a number")
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        raise BadCell(f"{value!r} is not a number") from None
