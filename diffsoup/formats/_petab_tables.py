"""PEtab v1 tables: the YAML file and its condition, measurement, observable and parameter tables,
read with ``petab.v1``, checked, and turned into typed rows that remember where they came from.

Every error is a :class:`PetabError` naming the file, the row (and its line) and the column. A
column this importer does not know is ignored with a :class:`PetabWarning` naming it (the
visualization tables are not read at all). Objective priors in the parameter table are refused:
diffsoup's objective is the likelihood alone. Initialization priors change only how starts are
drawn; they are ignored with a warning (diffsoup's starts are Latin hypercube samples within the
bounds).

After the checks of this module, ``petab.v1.lint_problem`` runs over the whole problem (it checks
what the rows cannot show alone, e.g. that every estimated parameter is used); its errors are
raised as one :class:`PetabError` naming the YAML file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ._reader import StudyFileError

SCALES = ("lin", "log", "log10")
TRANSFORMATIONS = ("lin", "log", "log10")
DISTRIBUTIONS = ("normal", "laplace")

MEASUREMENT_COLUMNS = ("observableId", "preequilibrationConditionId", "simulationConditionId", "measurement", "time",
                       "observableParameters", "noiseParameters", "datasetId", "replicateId")  # fmt: skip
OBSERVABLE_COLUMNS = ("observableId", "observableName", "observableFormula", "observableTransformation",
                      "noiseFormula", "noiseDistribution")  # fmt: skip
PARAMETER_COLUMNS = ("parameterId", "parameterName", "parameterScale", "lowerBound", "upperBound", "nominalValue",
                     "estimate", "initializationPriorType", "initializationPriorParameters", "objectivePriorType",
                     "objectivePriorParameters")  # fmt: skip
CONDITION_COLUMNS = ("conditionId", "conditionName")
YAML_KEYS = ("format_version", "parameter_file", "problems", "extensions")
PROBLEM_KEYS = ("condition_files", "measurement_files", "observable_files", "sbml_files", "model_files",
                "visualization_files", "mapping_files")  # fmt: skip
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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


@dataclasses.dataclass(frozen=True)
class ObservableRow:
    """A row of the observable table (transformation and distribution with PEtab's defaults)."""

    id: str
    formula: str
    noise_formula: str
    transformation: str
    distribution: str
    origin: Origin

    def placeholders(self, kind: str) -> int:
        """How many ``observableParameter{n}_{id}`` (``kind="observable"``) or ``noiseParameter{n}_{id}``
        (``kind="noise"``) placeholders its formula has (the largest ``n``)."""
        text = self.formula if kind == "observable" else self.noise_formula
        found = [int(n) for n in re.findall(rf"\b{kind}Parameter(\d+)_{re.escape(self.id)}\b", text)]
        return max(found, default=0)


@dataclasses.dataclass(frozen=True)
class ParameterRow:
    """A row of the parameter table (bounds and nominal value on the linear scale)."""

    id: str
    scale: str
    lower: float
    upper: float
    nominal: float
    estimate: bool
    origin: Origin


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


@dataclasses.dataclass(frozen=True)
class ConditionRow:
    """A row of the condition table: column (a model id) -> a float, a parameter id, or NaN."""

    id: str
    values: dict
    origin: Origin


@dataclasses.dataclass(frozen=True)
class PetabTables:
    """A PEtab problem's checked tables.

    Attributes:
        yaml_path: the YAML file.
        sbml_path: the SBML model.
        problem: the ``petab.v1.Problem`` (its data frames: what ``petab.v1`` functions take).
        observables, parameters: id -> row, in table order.
        condition_table, measurement_table: the conditions and measurements as columns
            (:class:`ConditionTable`, :class:`MeasurementTable`).
        files: every file read (the YAML first).
    """

    yaml_path: Path
    sbml_path: Path
    problem: Any
    observables: dict
    parameters: dict
    condition_table: ConditionTable
    measurement_table: MeasurementTable
    files: tuple

    @functools.cached_property
    def conditions(self) -> dict:
        """Condition id -> :class:`ConditionRow`, in table order (built on first use)."""
        return self.condition_table.rows()

    @functools.cached_property
    def measurements(self) -> tuple:
        """The :class:`MeasurementRow` objects in table order (built on first use)."""
        return self.measurement_table.rows()


# ------------------------------------------------------------------------------------------------


def read_tables(yaml_path: Any, *, validate: bool = True) -> PetabTables:
    """Read and check a PEtab v1 problem.

    Args:
        yaml_path: the problem's YAML file.
        validate: also run ``petab.v1.lint_problem``.

    Raises:
        PetabError: naming the file, row and column of what is wrong or unsupported.
        FileNotFoundError: for a missing YAML file.
    """
    import yaml

    yaml_path = Path(yaml_path)
    if not yaml_path.is_file():
        raise FileNotFoundError(f"ds.petab.load: no PEtab YAML file at {str(yaml_path)!r}.")
    try:
        doc = yaml.safe_load(yaml_path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise PetabError(f"not valid YAML: {exc}", path=yaml_path) from None
    if not isinstance(doc, dict):
        raise PetabError("a PEtab YAML file holds a mapping (format_version, parameter_file, problems)", path=yaml_path)
    version = str(doc.get("format_version", ""))
    if version not in ("1", "1.0.0"):
        raise PetabError(f"format_version {doc.get('format_version')!r}: diffsoup reads PEtab v1 (format_version: 1)",
                         path=yaml_path, column="format_version")  # fmt: skip
    for key in doc:
        if key not in YAML_KEYS:
            _warn(f"{yaml_path}: key {key!r} is not part of PEtab v1; ignored")
    if doc.get("extensions"):
        raise PetabError(f"PEtab extensions {list(doc['extensions'])} are not supported", path=yaml_path,
                         column="extensions")  # fmt: skip
    problems = doc.get("problems")
    if not isinstance(problems, list) or len(problems) != 1 or not isinstance(problems[0], dict):
        raise PetabError("problems must list exactly one problem", path=yaml_path, column="problems")
    entry = problems[0]
    for key in entry:
        if key not in PROBLEM_KEYS:
            _warn(f"{yaml_path}: problems[0] key {key!r} is not part of PEtab v1; ignored")
    base = yaml_path.parent

    def files(key, *, required=True, single=False):
        names = entry.get(key) or []
        if isinstance(names, str):
            names = [names]
        if required and not names:
            raise PetabError(f"problems[0] names no {key}", path=yaml_path, column=key)
        if single and len(names) > 1:
            raise PetabError(f"problems[0] names {len(names)} {key}; diffsoup imports one model", path=yaml_path,
                             column=key)  # fmt: skip
        out = []
        for name in names:
            path = base / str(name)
            if not path.is_file():
                raise PetabError(f"{key}: {name!r} not found (looked for {path})", path=yaml_path, column=key)
            out.append(path)
        return out

    if entry.get("mapping_files"):
        raise PetabError("mapping tables are not supported", path=yaml_path, column="mapping_files")
    if entry.get("model_files"):
        raise PetabError("model_files (PEtab v2) are not supported; give sbml_files", path=yaml_path,
                         column="model_files")  # fmt: skip
    (sbml_path,) = files("sbml_files", single=True)
    if "parameter_file" not in doc:
        raise PetabError("parameter_file is missing", path=yaml_path, column="parameter_file")
    parameter_names = doc["parameter_file"] if isinstance(doc["parameter_file"], list) else [doc["parameter_file"]]
    parameter_files = []
    for name in parameter_names:
        path = base / str(name)
        if not path.is_file():
            raise PetabError(f"parameter_file {name!r} not found (looked for {path})", path=yaml_path,
                             column="parameter_file")  # fmt: skip
        parameter_files.append(path)
    condition_files = files("condition_files")
    measurement_files = files("measurement_files")
    observable_files = files("observable_files")

    observables = _observables(observable_files)
    parameters = _parameters(parameter_files)
    conditions = _conditions(condition_files)
    measurements = _measurements(measurement_files, observables, conditions)
    problem = _petab_problem(yaml_path)
    tables = PetabTables(yaml_path=yaml_path, sbml_path=sbml_path, problem=problem, observables=observables,
                         parameters=parameters, condition_table=conditions, measurement_table=measurements,
                         files=(yaml_path, sbml_path, *parameter_files, *condition_files, *measurement_files,
                                *observable_files))  # fmt: skip
    if validate:
        lint(tables)
    return tables


def _warn(message: str) -> None:
    warnings.warn(message, PetabWarning, stacklevel=3)


@contextlib.contextmanager
def _mixed_columns_quiet():
    """pandas' DtypeWarning (a large column of numbers and ids, e.g. observableParameters) kept
    quiet: the importer parses such columns cell by distinct cell itself."""
    from pandas.errors import DtypeWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DtypeWarning)
        yield


def _read(path: Path, reader):
    try:
        with _mixed_columns_quiet():
            return reader(path)
    except Exception as exc:  # noqa: BLE001 (pandas' and petab's errors for a malformed table vary)
        raise PetabError(f"cannot be read as a PEtab table: {type(exc).__name__}: {exc}", path=path) from None


def _unknown_columns(path: Path, columns, known, what: str) -> None:
    extra = [c for c in columns if c not in known]
    if extra:
        _warn(f"{path}: {what} column(s) {extra} are not PEtab v1 columns diffsoup uses; ignored")


def _blank(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (isinstance(value, str) and not value.strip())


def _text(value) -> str:
    return "" if _blank(value) else str(value).strip()


def _number(origin: Origin, value, column: str, *, required: bool = True) -> float:
    if _blank(value):
        if required:
            raise origin.error("is empty; give a number", column)
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        raise origin.error(f"{value!r} is not a number", column) from None


def number_or_id(value) -> float | str:
    """A table cell that is a number (float) or an id (str); NaN for an empty cell."""
    if _blank(value):
        return math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        return text


def _observables(paths) -> dict:
    from petab.v1.observables import get_observable_df

    out: dict[str, ObservableRow] = {}
    for path in paths:
        df = _read(path, get_observable_df)
        _unknown_columns(path, df.columns, OBSERVABLE_COLUMNS, "observable table")
        for row, (oid, rec) in enumerate(df.iterrows(), start=1):
            origin = Origin(path, row)
            oid = str(oid)
            if not _IDENTIFIER.match(oid):
                raise origin.error(f"{oid!r} is not a valid id", "observableId")
            if oid in out:
                raise origin.error(f"{oid!r} is defined twice (also {out[oid].origin.path}, row {out[oid].origin.row})",
                                   "observableId")  # fmt: skip
            formula = _text(rec.get("observableFormula"))
            if not formula:
                raise origin.error("is empty", "observableFormula")
            noise = _text(rec.get("noiseFormula"))
            if not noise:
                raise origin.error("is empty; give a number, a parameter or a formula", "noiseFormula")
            transformation = _text(rec.get("observableTransformation")) or "lin"
            if transformation not in TRANSFORMATIONS:
                raise origin.error(f"{transformation!r} is not one of {', '.join(TRANSFORMATIONS)}",
                                   "observableTransformation")  # fmt: skip
            distribution = _text(rec.get("noiseDistribution")) or "normal"
            if distribution not in DISTRIBUTIONS:
                raise origin.error(f"{distribution!r} is not supported; diffsoup has {', '.join(DISTRIBUTIONS)}",
                                   "noiseDistribution")  # fmt: skip
            out[oid] = ObservableRow(oid, formula, noise, transformation, distribution, origin)
    return out


def _parameters(paths) -> dict:
    from petab.v1.parameters import get_parameter_df

    out: dict[str, ParameterRow] = {}
    for path in paths:
        df = _read(path, get_parameter_df)
        _unknown_columns(path, df.columns, PARAMETER_COLUMNS, "parameter table")
        for row, (pid, rec) in enumerate(df.iterrows(), start=1):
            origin = Origin(path, row)
            pid = str(pid)
            if not _IDENTIFIER.match(pid):
                raise origin.error(f"{pid!r} is not a valid id", "parameterId")
            if pid in out:
                raise origin.error(f"{pid!r} is defined twice", "parameterId")
            for column in ("objectivePriorType", "objectivePriorParameters"):
                if not _blank(rec.get(column)):
                    raise origin.error(f"parameter {pid!r} has an objective prior ({rec.get(column)!r}); diffsoup's "
                                       "objective is the likelihood alone: priors are not supported (remove the "
                                       "prior, or add it to the objective yourself)", column)  # fmt: skip
            for column in ("initializationPriorType", "initializationPriorParameters"):
                value = rec.get(column)
                if not _blank(value) and not (column == "initializationPriorType" and str(value) == "parameterScaleUniform"):
                    _warn(f"{path}, row {row}, column {column!r}: the initialization prior of {pid!r} is ignored "
                          "(diffsoup draws starts uniformly on the parameter's scale within its bounds)")
            scale = _text(rec.get("parameterScale")) or "lin"
            if scale not in SCALES:
                raise origin.error(f"{scale!r} is not one of {', '.join(SCALES)}", "parameterScale")
            estimate_text = _text(rec.get("estimate"))
            if estimate_text not in ("0", "1", "0.0", "1.0", "True", "False", "true", "false"):
                raise origin.error(f"{estimate_text!r} must be 0 or 1", "estimate")
            estimate = estimate_text in ("1", "1.0", "True", "true")
            lower = _number(origin, rec.get("lowerBound"), "lowerBound", required=estimate)
            upper = _number(origin, rec.get("upperBound"), "upperBound", required=estimate)
            nominal = _number(origin, rec.get("nominalValue"), "nominalValue", required=not estimate)
            if estimate:
                if not (math.isfinite(lower) and math.isfinite(upper) and lower < upper):
                    raise origin.error(f"estimated parameter {pid!r} needs finite bounds lowerBound < upperBound "
                                       f"(got {lower}, {upper})", "upperBound")  # fmt: skip
                if scale != "lin" and lower <= 0:
                    raise origin.error(f"parameter {pid!r} on scale {scale} needs a positive lowerBound (got {lower})",
                                       "lowerBound")  # fmt: skip
                if math.isnan(nominal):  # PEtab: optional for estimated parameters; the midpoint on the scale
                    lo, hi = (lower, upper) if scale == "lin" else (math.log(lower), math.log(upper))
                    nominal = 0.5 * (lo + hi) if scale == "lin" else math.exp(0.5 * (lo + hi))
                if not lower <= nominal <= upper:
                    raise origin.error(f"nominal value {nominal} of {pid!r} lies outside its bounds [{lower}, {upper}]",
                                       "nominalValue")  # fmt: skip
            if not math.isfinite(nominal):
                raise origin.error(f"nominal value of {pid!r} must be finite", "nominalValue")
            if scale != "lin" and nominal <= 0:
                raise origin.error(f"parameter {pid!r} on scale {scale} needs a positive nominal value (got {nominal})",
                                   "nominalValue")  # fmt: skip
            out[pid] = ParameterRow(pid, scale, lower, upper, nominal, estimate, origin)
    return out


class _BadCell(Exception):
    """A cell that does not parse; its message, and its column (None: the caller's)."""

    def __init__(self, message: str, column: str | None = None):
        super().__init__(message)
        self.column = column


def _factorized(values) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, uniques)`` of a column, NaN and None a value of their own: the cells are parsed
    once per distinct value, not once per row."""
    import pandas as pd

    codes, uniques = pd.factorize(pd.Series(values, dtype=object), use_na_sentinel=False)
    return codes, np.asarray(uniques, dtype=object)


def _parse_column(path: Path, rows: np.ndarray, values, column: str, parse) -> tuple[np.ndarray, list]:
    """``(codes, parsed)``: ``parse`` of each distinct value of a column; a value it refuses raises
    a :class:`PetabError` naming the first row that holds it (``rows``: their 1-based rows)."""
    codes, uniques = _factorized(values)
    parsed: list = []
    bad = {}
    for code, value in enumerate(uniques):
        try:
            parsed.append(parse(value))
        except _BadCell as exc:
            parsed.append(None)
            bad[code] = exc
    if bad:
        first = int(np.flatnonzero(np.isin(codes, list(bad)))[0])
        exc = bad[int(codes[first])]
        raise PetabError(str(exc), path=path, row=int(rows[first]), column=exc.column or column)
    return codes, parsed


def _first_bad(path: Path, rows: np.ndarray, checks) -> None:
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


def _cell_number(value, *, required: bool = True) -> float:
    if _blank(value):
        if required:
            raise _BadCell("is empty; give a number")
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        raise _BadCell(f"{value!r} is not a number") from None


def _condition_cell(value) -> float | str:
    v = number_or_id(value)
    if isinstance(v, str) and not _IDENTIFIER.match(v):
        raise _BadCell(f"{v!r} is neither a number nor a parameter id")
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


def _conditions(paths) -> ConditionTable:
    import pandas as pd
    from petab.v1.conditions import get_condition_df

    frames = []
    for path in paths:
        df = _read(path, get_condition_df)
        rows = np.arange(1, len(df) + 1)
        ids = np.asarray(df.index.astype(str), dtype=object)
        bad_id = ~pd.Series(ids, dtype=object).str.match(_IDENTIFIER.pattern).to_numpy(bool)
        _first_bad(path, rows, [(bad_id, lambda i: f"{ids[i]!r} is not a valid id", "conditionId")])
        columns = {}
        for column in df.columns:
            if column in CONDITION_COLUMNS:
                continue
            values = df[column]
            if values.dtype.kind in "fiu":
                numbers, names = values.to_numpy(np.float64), np.full(len(df), "", dtype=object)
            else:
                codes, parsed = _parse_column(path, rows, values.to_numpy(object), str(column), _condition_cell)
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


def _replacements(value) -> tuple:
    """A ``;``-separated list of numbers and parameter ids (PEtab's observable and noise parameters)."""
    if _blank(value):
        return ()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (float(value),)
    out = []
    for part in str(value).split(";"):
        v = number_or_id(part)
        if isinstance(v, float) and math.isnan(v):
            raise _BadCell(f"{value!r} holds an empty entry")
        if isinstance(v, str) and not _IDENTIFIER.match(v):
            raise _BadCell(f"{part.strip()!r} is neither a number nor a parameter id")
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
    codes, uniques = _factorized(values)
    if not uniques.size:
        return np.array([], dtype=object)
    return np.array([_text(u) for u in uniques], dtype=object)[codes]


def _measurements(paths, observables: dict, conditions: ConditionTable) -> MeasurementTable:
    import pandas as pd
    from petab.v1.measurements import get_measurement_df

    parts = []
    replacements: dict[tuple, int] = {}
    want = {kind: {oid: o.placeholders(kind) for oid, o in observables.items()} for kind in ("observable", "noise")}
    for path in paths:
        df = _read(path, get_measurement_df)
        _unknown_columns(path, df.columns, MEASUREMENT_COLUMNS, "measurement table")
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
            codes, parsed = _parse_column(path, rows, values.to_numpy(object), name, _cell_number)
            numbers[name] = np.asarray(parsed, dtype=np.float64)[codes]
        value, time = numbers["measurement"], numbers["time"]
        lists = {}
        for name in ("observableParameters", "noiseParameters"):
            codes, parsed = _parse_column(path, rows, column_of(name), name, _replacements)
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
        _first_bad(path, rows, checks)
        parts.append((oid, cond, pre, value, time, lists["observableParameters"], lists["noiseParameters"], rows))
    if not sum(p[0].size for p in parts):
        raise PetabError("the measurement tables hold no measurement", path=paths[0])
    cat = [np.concatenate([p[k] for p in parts]) for k in range(8)]
    file = np.concatenate([np.full(p[0].size, k, dtype=np.int64) for k, p in enumerate(parts)])
    return MeasurementTable(*cat[:7], tuple(replacements), tuple(paths), file, cat[7])


def _petab_problem(yaml_path: Path):
    import petab.v1 as petab

    try:
        with _quiet_petab(), _mixed_columns_quiet():
            return petab.Problem.from_yaml(str(yaml_path))
    except Exception as exc:  # noqa: BLE001 (petab's errors vary)
        raise PetabError(f"petab.v1 cannot read the problem: {type(exc).__name__}: {exc}", path=yaml_path) from None


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@contextlib.contextmanager
def _quiet_petab():
    """petab's log messages collected (not printed); yields the handler holding them."""
    logger = logging.getLogger("petab")
    handler = _Records()
    logger.addHandler(handler)
    propagate = logger.propagate
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def lint(tables: PetabTables) -> None:
    """``petab.v1.lint_problem``; its errors raised as one :class:`PetabError`."""
    import petab.v1 as petab

    with _quiet_petab() as log:
        failed = petab.lint_problem(tables.problem)
    if failed:
        errors = [r.getMessage() for r in log.records if r.levelno >= logging.ERROR] or ["(no message)"]
        raise PetabError("petab.v1.lint_problem found errors: " + "; ".join(errors[:8])
                         + (f"; ... ({len(errors)} in all)" if len(errors) > 8 else ""), path=tables.yaml_path)  # fmt: skip
