"""Where a PEtab problem is wrong: :class:`PetabError` (naming the file, row, line and column),
:class:`PetabWarning` (what the importer ignores) and :class:`Origin` (a row's file and row).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ._reader import StudyFileError


class PetabError(StudyFileError):
    """A PEtab problem that cannot be imported: a malformed table, an unsupported feature.

    Attributes:
        path: the file at fault.
        row: the 1-based data row of a table (the header is not counted), or None.
        line: the row's line in the file (``row + 1``), or None.
        column: the table's column, or None.
    """

    def __init__(self, message: str, *, path: Any, row: int | None = None, column: str | None = None):
        self.path, self.row, self.column = Path(path), row, column
        self.line = None if row is None else row + 1
        self.field = column
        where = f"{path}"
        if row is not None:
            where += f", row {row} (line {row + 1})"
        if column is not None:
            where += f", column {column!r}"
        ValueError.__init__(self, f"{where}: {message}")


class PetabWarning(UserWarning):
    """Something of a PEtab problem that diffsoup ignores (an unknown column, initialization priors)."""


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where a row came from: the file and its 1-based data row."""

    path: Path
    row: int

    def error(self, message: str, column: str | None = None) -> PetabError:
        return PetabError(message, path=self.path, row=self.row, column=column)
