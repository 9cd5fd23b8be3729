"""Study files: a study written as TOML (formats ``diffsoup-study/1`` and ``/2``), read by :func:`load_study`.

A study file names the model, the parameter table, the levels, the noise and the experiments with
their data files (CSV), plus the solver tolerances and fit settings the ``diffsoup`` command uses.
Paths are relative to the study file. Every error names the file, the line and the field::

    format = "diffsoup-study/1"          # required, first: the format and its version
    name = "rober-rates"                 # optional (default: the file's stem)
    levels = ["site"]                    # optional: level names, outermost first

    [model]                              # either a reaction network ...
    species = ["A", "B", "C"]
    reactions = [["A -> B", "k1"], ["2 B -> B + C", "k2"], ["B + C -> A + C", "k3"]]
    parameters = {k1 = 0.04, k2 = 3e7, k3 = 1e4}   # the model's default values
    y0 = {A = 1.0}                       # default initial state (unnamed species start at 0)
    # python = "model.py:make_model"     # ... or a function (file.py:name or package.module:name)
    #                                    # returning a ProblemSpec, ReactionNetwork or Problem;
    #                                    # loading the file runs it: a study file with Python is
    #                                    # code, like a script
    linear_solver = "auto"               # optional: auto, dense, klu, cudss
    precision = "fp64"                   # optional: fp64, fp32, fp32_factor, fp32_ir

    [observables]                        # optional: named expressions of species and model
    total = "A + B + C"                  # parameters (+ - * / **, exp log log10 sqrt abs);
    #                                    # numbers are floats, constants at most 1e300, nesting
    #                                    # at most 200 deep

    [solver]                             # optional: rtol, atol, max_steps, checkpoints
    rtol = 1e-8

    [noise]                              # optional default for every experiment
    model = "gaussian"                   # gaussian or lognormal
    sigma = 0.02                         # a number, or the name of an estimated parameter

    [fit]                                # optional defaults of `diffsoup fit` / `campaign`
    method = "fides"                     # fides (default), trf (least squares) or lbfgsb (adjoint)
    hessian = "gauss_newton"             # fides only: gauss_newton (default), hybrid, exact, bfgs, sr1
    hierarchical = true                  # true (or names): scalings/offsets/noise levels analytic;
                                         # false: none; absent: noise levels (fit's default)
    starts = 4
    seed = 0
    max_nfev = 200
    objective = "nll"                    # nll or chi2

    [[parameters]]                       # one table per parameter row
    name = "k1"
    nominal = 0.04                       # optional with both bounds: their midpoint on the scale
    lower = 0.004
    upper = 0.4
    scale = "log10"                      # lin, log or log10 (default log10)
    estimate = true                      # default true
    level = "site"                       # optional: a level, or "experiment"

    [[experiments]]                      # one table per experiment
    id = "e1"
    data = "data/e1.csv"                 # CSV (see below)
    observables = ["A", "total"]         # optional: default, the data file's columns
    y0 = {A = 0.5}                       # optional overrides of the model's y0
    conditions = {k3 = 2e4}              # optional fixed model parameter values
    parameters = {k1 = "k1"}             # optional model parameter -> study parameter
    groups = {site = "s1"}               # one member per level
    noise = {model = "lognormal", sigma = 0.1}   # optional, overrides [noise]
    t0 = 0.0                             # optional
    multishoot = {windows = 3}           # optional: Multishoot(...) options

A data file is CSV with a header: a ``time`` column, one column per observable (empty or ``nan``
for a missing value), optionally ``sigma:<observable>`` columns giving each value's standard
deviation, and optionally an ``experiment`` column, so that one file can hold many experiments
(each takes the rows carrying its id).

Format ``diffsoup-study/2`` reads every ``/1`` file's keys the same way and adds (a ``/1`` file
using one of these is told to say ``format = "diffsoup-study/2"``)::

    observable_parameters = {scale = "s_A", offset = 0.1}   # names the observable expressions may
                                         # use (numbers or study parameters); experiments may
                                         # override them; expressions may also use `time`

    [noise]                              # models gaussian, lognormal, laplace, loglaplace, or the
    model = "gaussian"                   # name of an AbstractNoise subclass; sigma is the spread
    sigma = 0.05
    [noise.observables]                  # per observable column, over the keys above
    A = {model = "lognormal", sigma = "sd_A", base = 10}   # base: lognormal/loglaplace (default e)

    [[experiments]]
    ...
    y0 = {A = "A0"}                      # an initial amount may be a study parameter (estimated)
    observable_parameters = {scale = "s_A_e1"}
    preequilibration = {conditions = {L = 0.0}, y0 = {A = 1.0}}   # to steady state first; y0 then
                                         # re-initializes the states it names
    resets = [{time = 5.0, add = {A = 1.5}}, {time = 8.0, set = {B = 0.0}}]
    discontinuities = [3.0]              # times where the right-hand side jumps
    steady_state = {rtol = 1e-8}         # the test of steady states (pre-equilibration)

A ``/2`` file may give, instead of ``[[experiments]]`` tables, one ``[experiment_table]``: every
experiment from one data file (a CSV as above with an ``experiment`` column, or Parquet), held as
arrays (``ds.Study.from_table``), for studies of many experiments of one shape (the same
observables and noise)::

    [experiment_table]
    data = "data/cohort.csv"             # experiment, time, one column per observable[, sigma:<obs>]
    observables = ["A", "total"]         # optional: default, the file's other columns
    conditions = ["k3"]                  # optional: columns of model parameter values (or {k3 = "column"})
    groups = {site = "site"}             # a column per level: each experiment's member
    y0 = {A = "A0"}                      # optional: a column (or a number) per species
    t0 = 0.0                             # optional

The reader is split by concept: this module reads the file (``load_study``) and its ``[model]``;
:mod:`._study_format` names the formats and their keys, :mod:`._study_settings` reads ``[solver]``,
``[fit]`` and ``[[parameters]]``, :mod:`._study_noise` the noise, :mod:`._study_experiments` the
``[[experiments]]`` tables, :mod:`._study_v2` what ``diffsoup-study/2`` adds (``[experiment_table]``,
observable parameters, resets, ...); :mod:`._reader` checks values and locates errors
(:class:`StudyFileError`), :mod:`._expressions` checks and evaluates the observable expressions,
:mod:`._data_files` reads the CSV data files.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import re
import tomllib
from pathlib import Path
from typing import Any, Callable, Mapping

from .._precision import Precision
from ..inference import Study
from ..inference import lower as lower_study
from ..linear import KLU, CuDSS, Dense
from ..model import Problem, ProblemSpec, ReactionNetwork
from ._expressions import read_expressions
from ._petab_study import load as load_petab
from ._reader import StudyFileError, TomlReader
from ._study_experiments import ExperimentContext
from ._study_format import FORMAT as FORMAT
from ._study_format import (DEFAULT_FIT, FORMAT_2, FORMAT_PREFIX, FORMATS, LINEAR_SOLVERS, MODEL_KEYS, PETAB_SUFFIXES,
                            PRECISIONS, TOP_KEYS, TOP_KEYS_2, refuse_newer_keys)  # fmt: skip
from ._study_noise import read_noise
from ._study_settings import read_fit, read_parameter, read_solver
from ._study_v2 import observable_parameter_names, parameter_values, read_experiment_table


@dataclasses.dataclass(frozen=True)
class StudyFile:
    """A loaded study file.

    Attributes:
        path: the study file.
        name: the study's name.
        study: the ``ds.Study``.
        solver: the ``SolverOptions`` of ``[solver]``.
        fit: the ``[fit]`` settings with their defaults (method, starts, seed, max_nfev, objective).
        observables: experiment id -> the names of its observables (the data's columns).
        data_files: the data files read (resolved paths, in order of first use).
        description: free text from the file.
        petab: the ``PetabProblem`` when the file is a PEtab problem's YAML (else None).
        format: the file's format (``"diffsoup-study/1"``, ``"diffsoup-study/2"``, ``"petab/1"``).
    """

    path: Path
    name: str
    study: Any
    solver: Any
    fit: dict
    observables: dict
    data_files: tuple = ()
    description: str = ""
    petab: Any = None
    format: str = FORMAT

    @classmethod
    def from_petab(cls, problem: Any) -> "StudyFile":
        """A ``PetabProblem`` as what the ``diffsoup`` command runs: its study, rtol = atol = 1e-8,
        the default ``[fit]`` settings, its observable columns and files."""
        observed = {eid: list(problem.columns) for eid in problem.study.ids}
        return cls(path=problem.path, name=problem.name, study=problem.study, solver=problem.solver,
                   fit=dict(DEFAULT_FIT), observables=observed, data_files=tuple(p.resolve() for p in problem.files[1:]),
                   description=f"PEtab v1 problem {problem.name}", petab=problem, format="petab/1")  # fmt: skip

    def lower(self, **options):
        """``ds.lower`` of the study with the file's objective and solver options (overridable)."""
        options.setdefault("objective", self.fit["objective"])
        options.setdefault("solver", self.solver)
        return lower_study(self.study, **options)


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def load_study(path: Any, *, log: Callable[[str], Any] | None = None) -> StudyFile:
    """Read a study file (TOML, format ``diffsoup-study/1``; see this module's documentation), or a
    PEtab v1 problem's YAML file (``.yaml``/``.yml``: ``StudyFile.from_petab(ds.petab.load(path))``, with
    the default ``[fit]`` settings and rtol = atol = 1e-8).

    A study file whose ``[model]`` names ``python = "file.py:function"`` is code: loading it
    imports that file (or module) and calls the function, as running a script would. Load only
    study files you would run.

    Args:
        path: the study file.
        log: called with one line before the file's Python code runs (the ``diffsoup`` command
            prints it); None says nothing.

    Returns:
        A :class:`StudyFile`, holding the ``ds.Study`` and the file's solver and fit settings.

    Raises:
        StudyFileError: (a ``ValueError``) naming the file, the line and the field: a TOML syntax
            error, an unknown or missing key, a missing or malformed data file, data whose shape
            does not match the observables, an unknown parameter, species or observable, or an
            unsupported format version.
        PetabError: (a ``StudyFileError``) for a PEtab problem, naming the file, row and column.
        FileNotFoundError: if ``path`` does not exist.
    """
    path = Path(path)
    if path.suffix.lower() in PETAB_SUFFIXES:  # a PEtab problem: what the command runs on it is the same
        return StudyFile.from_petab(load_petab(path))
    text = path.read_text(encoding="utf-8")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        raise StudyFileError(f"not valid TOML: {exc}", path=path, line=int(match.group(1)) if match else None) from None
    r = TomlReader(path, text)
    if "format" not in doc:
        raise r.error((), f'the first line must name the format: format = "{FORMAT}"')
    fmt = r.string(doc["format"], ("format",))
    if fmt not in FORMATS:
        if fmt.startswith(FORMAT_PREFIX):
            raise r.error(("format",), f"version {fmt!r} is not supported by this diffsoup; it reads "
                          f"{' and '.join(map(repr, FORMATS))}")  # fmt: skip
        raise r.error(("format",), f"{fmt!r} is not a diffsoup study file format; write format = {FORMAT_2!r}")
    version = FORMATS.index(fmt) + 1
    if version == 1:
        refuse_newer_keys(r, doc, TOP_KEYS_2, TOP_KEYS, ())
    r.keys(doc, TOP_KEYS_2 if version == 2 else TOP_KEYS, ())
    name = r.string(doc.get("name", path.stem), ("name",))
    levels = r.names(doc.get("levels", []), ("levels",))
    problem = _model(r, r.table(doc.get("model", None) or _missing(r, "model"), ("model",)), path.parent, log)
    states = tuple(problem.state_names)
    model_parameters = tuple(problem.parameter_names)
    extra_names: tuple = ()
    if version == 2:
        extra_names = observable_parameter_names(r, doc, model_parameters + states)
    expressions = read_expressions(r, r.table(doc.get("observables", {}), ("observables",)), states,
                                   model_parameters + extra_names)  # fmt: skip
    solver = read_solver(r, r.table(doc.get("solver", {}), ("solver",)))
    fit = read_fit(r, r.table(doc.get("fit", {}), ("fit",)))
    default_noise = read_noise(r, doc.get("noise", {"model": "gaussian", "sigma": 1.0}), ("noise",), version)
    raw_parameters = doc.get("parameters", None)
    if not isinstance(raw_parameters, list) or not raw_parameters:
        raise r.error(("parameters",), "give at least one [[parameters]] table (name, nominal, lower, upper)")
    parameters = [read_parameter(r, p, ("parameters", i), levels) for i, p in enumerate(raw_parameters)]
    study_names = {p.name for p in parameters}
    for name in fit["hierarchical"] if isinstance(fit["hierarchical"], tuple) else ():
        r.known(name, [p.name for p in parameters if p.estimate], ("fit", "hierarchical"), "estimated parameter")
    raw_experiments = doc.get("experiments", None)
    if "experiment_table" in doc:
        if raw_experiments is not None:
            raise r.error(("experiment_table",), "give [[experiments]] tables or one [experiment_table], not both")
        context = ExperimentContext(r, path.parent, states, model_parameters, expressions, default_noise,
                                     study_names, levels, version=version)  # fmt: skip
        study, names, data_file = read_experiment_table(context, problem, parameters, doc["experiment_table"])
        return StudyFile(path=path, name=name, study=study, solver=solver, fit=fit,
                         observables=dict.fromkeys(study.ids, names), data_files=(data_file,),
                         description=str(doc.get("description", "")), format=fmt)  # fmt: skip
    if not isinstance(raw_experiments, list) or not raw_experiments:
        raise r.error(("experiments",), "give at least one [[experiments]] table (id, data)")
    context = ExperimentContext(r, path.parent, states, model_parameters, expressions, default_noise,
                                 study_names, levels, version=version)  # fmt: skip
    if version == 2:
        context.default_observable_parameters = parameter_values(
            r, doc.get("observable_parameters", {}), ("observable_parameters",), study_names)
    experiments, observed = [], {}
    seen: dict[str, int] = {}
    for i, raw in enumerate(raw_experiments):
        e, names = context.experiment(raw, ("experiments", i))
        if e.id in seen:
            raise r.error(("experiments", i, "id"), f"id {e.id!r} is also experiments[{seen[e.id]}]'s; ids must be unique")
        seen[e.id] = i
        experiments.append(e)
        observed[e.id] = names
    try:
        study = Study(problem, experiments, parameters, levels=levels)
    except ValueError as exc:  # what only the whole study can tell (levels, sigma parameters)
        raise _locate(r, exc, seen) from None
    return StudyFile(path=path, name=name, study=study, solver=solver, fit=fit, observables=observed,
                     data_files=tuple(context.tables), description=str(doc.get("description", "")),
                     format=fmt)  # fmt: skip


def _missing(r: TomlReader, key: str):
    raise r.error((), f"the [{key}] table is missing")


def _locate(r: TomlReader, exc: Exception, index: Mapping[str, int]) -> StudyFileError:
    match = re.match(r"(?:Study: )?Experiment '([^']*)'", str(exc))
    if match and match.group(1) in index:
        return r.error(("experiments", index[match.group(1)]), str(exc))
    match = re.search(r"Parameter '([^']*)'", str(exc))
    return r.error(("parameters",), str(exc)) if match else r.error((), str(exc))


def _model(r: TomlReader, table: dict, base: Path, log: Callable[[str], Any] | None = None):
    """The built ``Problem`` of ``[model]``."""
    r.keys(table, MODEL_KEYS, ("model",))
    has_network, has_python = "reactions" in table or "species" in table, "python" in table
    if has_network == has_python:
        raise r.error(("model",), "give either species + reactions (a reaction network) or python = "
                      '"file.py:function" (a function returning a ProblemSpec, ReactionNetwork or Problem)')
    field = ("model",)
    if has_network:
        species = r.names(table.get("species", None) or [], ("model", "species"))
        if not species:
            raise r.error(("model", "species"), "list the species, e.g. species = [\"A\", \"B\"]")
        reactions = table.get("reactions", None)
        if not isinstance(reactions, list) or not reactions:
            raise r.error(("model", "reactions"), 'list the reactions, e.g. reactions = [["A -> B", "k1"]]')
        rows = []
        for i, rxn in enumerate(reactions):
            if not (isinstance(rxn, list) and len(rxn) == 2 and all(isinstance(x, str) and x for x in rxn)):
                raise r.error(("model", "reactions"), f"reaction {i} is {rxn!r}; write [\"A + B -> C\", \"rate_name\"]")
            rows.append(tuple(rxn))
        rates = r.values(table.get("parameters", {}), ("model", "parameters"))
        named = [rate for _, rate in rows]
        for k in rates:
            r.known(k, named, ("model", "parameters", k), "rate constant (not used by any reaction)")
        try:
            network = ReactionNetwork(species, rows, {k: rates.get(k, 1.0) for k in dict.fromkeys(named)})
        except ValueError as exc:
            raise r.error(("model", "reactions"), str(exc)) from None
        y0_values = r.values(table.get("y0", {}), ("model", "y0"))
        for k in y0_values:
            r.known(k, species, ("model", "y0", k), "species")
        spec = network.to_spec(y0=[y0_values.get(s, 0.0) for s in species])
    else:
        for key in ("parameters", "y0"):
            if key in table:
                raise r.error(("model", key), "belongs to a reaction network; a python model sets its own")
        spec = _python_model(r, r.string(table["python"], ("model", "python")), base, log)
    solver_name = r.string(table.get("linear_solver", "auto"), ("model", "linear_solver"), LINEAR_SOLVERS)
    precision_name = r.string(table.get("precision", "fp64"), ("model", "precision"), PRECISIONS)
    if isinstance(spec, Problem):
        if "linear_solver" in table or "precision" in table:
            raise r.error(field, "the python function returned a built Problem; return its ProblemSpec to set "
                          "linear_solver or precision here")  # fmt: skip
        return spec
    if isinstance(spec, ReactionNetwork):
        spec = spec.to_spec()
    if not isinstance(spec, ProblemSpec):
        raise r.error(("model", "python"), f"returned {type(spec).__name__}; it must return a ProblemSpec, "
                      "ReactionNetwork or Problem")  # fmt: skip
    linear = {"auto": None, "dense": Dense, "klu": KLU, "cudss": CuDSS}[solver_name]
    try:
        return spec.build(precision=getattr(Precision, precision_name)(), linear_solver=linear() if linear else None)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise r.error(field, f"the model does not build: {exc}") from None


def _python_model(r: TomlReader, target: str, base: Path, log: Callable[[str], Any] | None = None):
    field = ("model", "python")
    if ":" not in target:
        raise r.error(field, f"{target!r} must read file.py:function or package.module:function")
    where, _, attr = target.rpartition(":")
    if log is not None:
        log(f"running Python code from {r.path}: {target} (a study file with Python is code, like a script)")
    if where.endswith(".py"):
        file = (base / where).resolve()
        if not file.is_file():
            raise r.error(field, f"model file {where!r} not found (looked for {file})")
        # Not registered in sys.modules: cloudpickle then sends the model's functions to Dask
        # workers by value, so workers need not see the file on their path.
        spec = importlib.util.spec_from_file_location(f"diffsoup_study_model_{file.stem}", file)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise r.error(field, f"importing {file} failed: {type(exc).__name__}: {exc}") from None
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise r.error(field, f"cannot import {where!r}: {exc}") from None
    if not hasattr(module, attr):
        raise r.error(field, f"{where!r} has no {attr!r}")
    value = getattr(module, attr)
    if callable(value) and not hasattr(value, "build") and not hasattr(value, "state_names"):
        try:
            value = value()
        except Exception as exc:
            raise r.error(field, f"calling {attr}() failed: {type(exc).__name__}: {exc}") from None
    return value
