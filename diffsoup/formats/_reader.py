"""Reading checked values out of a parsed TOML file, with errors that name the file, line and field.

``tomllib`` gives values without positions; :class:`TomlLines` finds the line of each table and
key from the text (enough for the tables and key = value pairs study files are written with), and
:class:`TomlReader` checks values and raises :class:`StudyFileError` pointing at them.
"""

from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Any, Mapping


class StudyFileError(ValueError):
    """A study file (or one of its data files) that cannot be read.

    Attributes:
        path: the file at fault.
        line: its 1-based line, or None when unknown.
        field: the field, written as in the file (``experiments[2].data``), or None.
    """

    def __init__(self, message: str, *, path: Any, line: int | None = None, field: str | None = None):
        self.path, self.line, self.field = Path(path), line, field
        where = f"{path}:{line}" if line else f"{path}"
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")


_HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.\-\"' ]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_\-]+|\"[^\"]*\"|'[^']*')\s*(\.|=)")


class TomlLines:
    """Line numbers of tables and keys in a TOML text, by field path (``("experiments", 2, "data")``)."""

    def __init__(self, text: str):
        self.at: dict[tuple, int] = {}
        counts: dict[str, int] = {}
        table: tuple = ()
        for number, line in enumerate(text.splitlines(), start=1):
            header = _HEADER.match(line)
            if header:
                name = header.group(2).replace('"', "").replace("'", "").strip()
                parts = tuple(p.strip() for p in name.split("."))
                if header.group(1) == "[[":
                    index = counts.get(name, 0)
                    counts[name] = index + 1
                    table = parts + (index,)
                else:
                    # a sub-table of the latest array element: [experiments.y0] after [[experiments]]
                    head = parts[0]
                    table = (head, counts[head] - 1) + parts[1:] if head in counts else parts
                self.at.setdefault(table, number)
                continue
            key = _KEY.match(line)
            if key:
                self.at.setdefault(table + (key.group(1).strip("\"'"),), number)

    def line(self, path: tuple) -> int | None:
        """The line of ``path``, else of its nearest enclosing table; None when none is known."""
        for end in range(len(path), 0, -1):
            if path[:end] in self.at:
                return self.at[path[:end]]
        return None


def field_name(path: tuple) -> str:
    """``("experiments", 2, "data")`` -> ``"experiments[2].data"``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def kind(value: Any) -> str:
    """How a wrong value is described in a message."""
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"


class TomlReader:
    """Checks values of the parsed TOML and raises :class:`StudyFileError` with line and field."""

    def __init__(self, path: Path, text: str):
        self.path = path
        self.lines = TomlLines(text)

    def error(self, field: tuple, message: str) -> StudyFileError:
        return StudyFileError(message, path=self.path, line=self.lines.line(field),
                              field=field_name(field) if field else None)  # fmt: skip

    def keys(self, table: Mapping, allowed: tuple, field: tuple) -> None:
        for key in table:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(allowed)}"
                raise self.error(field + (key,), f"unknown key {key!r}{hint}")

    def table(self, value: Any, field: tuple) -> dict:
        if not isinstance(value, Mapping):
            raise self.error(field, f"must be a table (key = value pairs), not {kind(value)}")
        return dict(value)

    def string(self, value: Any, field: tuple, choices: tuple | None = None) -> str:
        if not isinstance(value, str) or not value:
            raise self.error(field, f"must be a non-empty string, not {kind(value)}")
        if choices is not None and value not in choices:
            raise self.error(field, f"{value!r} is not one of {', '.join(choices)}")
        return value

    def number(self, value: Any, field: tuple, *, positive: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(field, f"must be a number, not {kind(value)}")
        value = float(value)
        if math.isnan(value) or (positive and not (value > 0 and math.isfinite(value))):
            raise self.error(field, f"must be a {'positive finite ' if positive else ''}number, not {value}")
        return value

    def integer(self, value: Any, field: tuple, *, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(field, f"must be an integer of at least {minimum}, not {value!r}")
        return value

    def names(self, value: Any, field: tuple) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.error(field, f"must be a list of names (strings), not {kind(value)}")
        dup = sorted({v for v in value if value.count(v) > 1})
        if dup:
            raise self.error(field, f"names {dup} appear twice")
        return list(value)

    def values(self, table: Any, field: tuple) -> dict[str, float]:
        """A table of numbers (``{k1 = 0.04, k2 = 3e7}``)."""
        table = self.table(table, field)
        return {k: self.number(v, field + (k,)) for k, v in table.items()}

    def known(self, name: str, known: Any, field: tuple, what: str) -> None:
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(map(str, known)) or 'none'}"
            raise self.error(field, f"unknown {what} {name!r}{hint}")
