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

The tables' modules: :mod:`._petab_errors` (errors and where they point), :mod:`._petab_cells`
(files and cells), :mod:`._petab_observables`, :mod:`._petab_parameters`, :mod:`._petab_conditions`,
:mod:`._petab_measurements` (one table kind each), :mod:`._petab_lint` (``petab.v1``'s reading and
lint); this module reads the YAML file and holds :class:`PetabTables`.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

from ._petab_cells import warn_ignored
from ._petab_conditions import ConditionRow as ConditionRow
from ._petab_conditions import ConditionTable, read_conditions
from ._petab_errors import Origin as Origin
from ._petab_errors import PetabError
from ._petab_errors import PetabWarning as PetabWarning
from ._petab_lint import petab_problem, lint
from ._petab_measurements import MeasurementRow as MeasurementRow
from ._petab_measurements import MeasurementTable, read_measurements
from ._petab_observables import ObservableRow as ObservableRow
from ._petab_observables import read_observables
from ._petab_parameters import ParameterRow as ParameterRow
from ._petab_parameters import read_parameters

YAML_KEYS = ("format_version", "parameter_file", "problems", "extensions")
PROBLEM_KEYS = ("condition_files", "measurement_files", "observable_files", "sbml_files", "model_files",
                "visualization_files", "mapping_files")  # fmt: skip


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
            warn_ignored(f"{yaml_path}: key {key!r} is not part of PEtab v1; ignored")
    if doc.get("extensions"):
        raise PetabError(f"PEtab extensions {list(doc['extensions'])} are not supported", path=yaml_path,
                         column="extensions")  # fmt: skip
    problems = doc.get("problems")
    if not isinstance(problems, list) or len(problems) != 1 or not isinstance(problems[0], dict):
        raise PetabError("problems must list exactly one problem", path=yaml_path, column="problems")
    entry = problems[0]
    for key in entry:
        if key not in PROBLEM_KEYS:
            warn_ignored(f"{yaml_path}: problems[0] key {key!r} is not part of PEtab v1; ignored")
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

    observables = read_observables(observable_files)
    parameters = read_parameters(parameter_files)
    conditions = read_conditions(condition_files)
    measurements = read_measurements(measurement_files, observables, conditions)
    problem = petab_problem(yaml_path)
    tables = PetabTables(yaml_path=yaml_path, sbml_path=sbml_path, problem=problem, observables=observables,
                         parameters=parameters, condition_table=conditions, measurement_table=measurements,
                         files=(yaml_path, sbml_path, *parameter_files, *condition_files, *measurement_files,
                                *observable_files))  # fmt: skip
    if validate:
        lint(tables)
    return tables
