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

The reader is split by concept: this module reads the study's tables into a ``ds.Study``;
:mod:`._reader` checks values and locates errors (:class:`StudyFileError`), :mod:`._expressions`
checks and evaluates the observable expressions, :mod:`._data_files` reads the CSV data files.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import re
import tomllib
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from .._precision import Precision
from ..inference import Experiment, Multishoot, Parameter, SolverOptions, Study
from ..inference.study._noise import noise_class, noise_names
from ..inference import lower as lower_study
from ..inference.fitting._fides import DEFAULT_HESSIAN, HESSIANS
from ..inference.fitting._fit import DEFAULT_METHOD, METHODS
from ..inference.study._study import EXPERIMENT_LEVEL, SCALES, ParameterError
from ..linear import KLU, CuDSS, Dense
from ..model import Problem, ProblemSpec, ReactionNetwork
from ._data_files import DataTable, read_data_table
from ._expressions import EXPRESSION_FUNCTIONS, Observables, read_expressions
from ._reader import StudyFileError, TomlReader, kind

FORMAT = "diffsoup-study/1"
FORMAT_2 = "diffsoup-study/2"
FORMATS = (FORMAT, FORMAT_2)
FORMAT_PREFIX = "diffsoup-study/"

TOP_KEYS = ("format", "name", "description", "levels", "model", "observables", "solver", "noise", "fit",
            "parameters", "experiments")  # fmt: skip
MODEL_KEYS = ("species", "reactions", "parameters", "y0", "python", "linear_solver", "precision")
SOLVER_KEYS = ("rtol", "atol", "max_steps", "checkpoints")
NOISE_KEYS = ("model", "sigma")
FIT_KEYS = ("method", "hessian", "hierarchical", "starts", "seed", "max_nfev", "objective")
PARAMETER_KEYS = ("name", "nominal", "lower", "upper", "scale", "estimate", "level")
EXPERIMENT_KEYS = ("id", "data", "observables", "y0", "conditions", "parameters", "groups", "noise", "t0",
                   "multishoot")  # fmt: skip
MULTISHOOT_KEYS = ("windows", "boundaries", "continuity_weight", "state_scale", "init", "lower", "upper")
LINEAR_SOLVERS = ("auto", "dense", "klu", "cudss")
PRECISIONS = ("fp64", "fp32", "fp32_factor", "fp32_ir")
NOISE_MODELS = ("gaussian", "lognormal")
# diffsoup-study/2: what the core gained (issue 19), each key refused with a pointer in /1 files.
TOP_KEYS_2 = TOP_KEYS + ("observable_parameters", "experiment_table")
EXPERIMENT_TABLE_KEYS = ("data", "observables", "conditions", "groups", "y0", "t0")
EXPERIMENT_KEYS_2 = EXPERIMENT_KEYS + ("observable_parameters", "preequilibration", "resets", "discontinuities",
                                       "steady_state")  # fmt: skip
NOISE_KEYS_2 = ("model", "sigma", "base", "observables")
NOISE_COLUMN_KEYS_2 = ("model", "sigma", "base")
# /2 files name any registered noise model (ds.inference.AbstractNoise subclasses with a name).
PREEQUILIBRATION_KEYS = ("conditions", "y0")
RESET_KEYS = ("time", "set", "add")
STEADY_STATE_KEYS = ("rtol", "atol", "horizon")
TIME = "time"  # the measurement time's name in observable expressions (/2)
OBJECTIVES = ("nll", "chi2")
PETAB_SUFFIXES = (".yaml", ".yml")  # load_study reads these as PEtab v1 problems (ds.petab.load)
# The [fit] settings a file does not give (and a PEtab problem's, which has no [fit]).
DEFAULT_FIT = {"method": DEFAULT_METHOD, "hessian": DEFAULT_HESSIAN, "starts": 4, "seed": 0, "max_nfev": None,
               "objective": "nll", "hierarchical": None}


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
        from ._petab_study import load as load_petab

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
        _newer_keys(r, doc, TOP_KEYS_2, TOP_KEYS, ())
    r.keys(doc, TOP_KEYS_2 if version == 2 else TOP_KEYS, ())
    name = r.string(doc.get("name", path.stem), ("name",))
    levels = r.names(doc.get("levels", []), ("levels",))
    problem = _model(r, r.table(doc.get("model", None) or _missing(r, "model"), ("model",)), path.parent, log)
    states = tuple(problem.state_names)
    model_parameters = tuple(problem.parameter_names)
    extra_names: tuple = ()
    if version == 2:
        extra_names = _observable_parameter_names(r, doc, model_parameters + states)
    expressions = read_expressions(r, r.table(doc.get("observables", {}), ("observables",)), states,
                                   model_parameters + extra_names)  # fmt: skip
    solver = _solver(r, r.table(doc.get("solver", {}), ("solver",)))
    fit = _fit(r, r.table(doc.get("fit", {}), ("fit",)))
    default_noise = _noise(r, doc.get("noise", {"model": "gaussian", "sigma": 1.0}), ("noise",), version)
    raw_parameters = doc.get("parameters", None)
    if not isinstance(raw_parameters, list) or not raw_parameters:
        raise r.error(("parameters",), "give at least one [[parameters]] table (name, nominal, lower, upper)")
    parameters = [_parameter(r, p, ("parameters", i), levels) for i, p in enumerate(raw_parameters)]
    study_names = {p.name for p in parameters}
    for name in fit["hierarchical"] if isinstance(fit["hierarchical"], tuple) else ():
        r.known(name, [p.name for p in parameters if p.estimate], ("fit", "hierarchical"), "estimated parameter")
    raw_experiments = doc.get("experiments", None)
    if "experiment_table" in doc:
        if raw_experiments is not None:
            raise r.error(("experiment_table",), "give [[experiments]] tables or one [experiment_table], not both")
        context = _ExperimentContext(r, path.parent, states, model_parameters, expressions, default_noise,
                                     study_names, levels, version=version)  # fmt: skip
        study, names, data_file = _experiment_table(context, problem, parameters, doc["experiment_table"])
        return StudyFile(path=path, name=name, study=study, solver=solver, fit=fit,
                         observables=dict.fromkeys(study.ids, names), data_files=(data_file,),
                         description=str(doc.get("description", "")), format=fmt)  # fmt: skip
    if not isinstance(raw_experiments, list) or not raw_experiments:
        raise r.error(("experiments",), "give at least one [[experiments]] table (id, data)")
    context = _ExperimentContext(r, path.parent, states, model_parameters, expressions, default_noise,
                                 study_names, levels, version=version)  # fmt: skip
    if version == 2:
        context.default_observable_parameters = _parameter_values(
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


def _experiment_table(context: "_ExperimentContext", problem: Any, parameters: list, raw: Any):
    """The study of ``[experiment_table]`` (/2): every experiment from one data file, held as arrays
    (``ds.Study.from_table``); returns ``(study, observable names, data file)``."""
    r, field = context.r, ("experiment_table",)
    raw = r.table(raw, field)
    r.keys(raw, EXPERIMENT_TABLE_KEYS, field)
    if "data" not in raw:
        raise r.error(field, 'an experiment table needs data = "file.csv" (or .parquet)')
    file = (context.base / r.string(raw["data"], field + ("data",))).resolve()
    if not file.exists():
        raise r.error(field + ("data",), f"data file {file} does not exist")
    conditions = raw.get("conditions", [])
    if isinstance(conditions, list):
        conditions = {c: c for c in r.names(conditions, field + ("conditions",))}
    conditions = {k: r.string(v, field + ("conditions", k))
                  for k, v in r.table(conditions, field + ("conditions",)).items()}  # fmt: skip
    for k in conditions:
        r.known(k, context.model_parameters, field + ("conditions", k), "model parameter")
    groups = {k: r.string(v, field + ("groups", k)) for k, v in r.table(raw.get("groups", {}), field + ("groups",)).items()}
    for k in groups:
        r.known(k, context.levels, field + ("groups", k), "level")
    for level in context.levels:
        if level not in groups:
            raise r.error(field + ("groups",),
                          f"names no column for level {level!r}; write groups = {{{level} = \"column\"}}")  # fmt: skip
    y0 = {}
    for k, v in r.table(raw.get("y0", {}), field + ("y0",)).items():
        r.known(k, context.states, field + ("y0", k), "species")
        y0[k] = v if isinstance(v, str) else r.number(v, field + ("y0", k))
    t0 = r.number(raw.get("t0", 0.0), field + ("t0",))
    from ..inference.study._study_table import read_table

    try:
        df = read_table(file)
    except (ValueError, ImportError, OSError) as exc:
        raise r.error(field + ("data",), f"{file}: {exc}") from None
    taken = {"experiment", "time", *conditions.values(), *groups.values(), *(v for v in y0.values() if isinstance(v, str))}
    if "observables" in raw:
        names = r.names(raw["observables"], field + ("observables",))
    else:
        names = [c for c in df.columns if c not in taken and not str(c).startswith("sigma:")]
    for n in names:
        r.known(n, list(context.states) + list(context.expressions), field + ("observables",),
                "observable (a species or an [observables] name)")  # fmt: skip
    used = set()
    for n in names:
        if n in context.expressions:
            used |= {node.id for node in ast.walk(context.expressions[n]) if isinstance(node, ast.Name)}
    extra = sorted(used - set(context.states) - set(context.model_parameters) - {TIME} - set(EXPRESSION_FUNCTIONS))
    if extra:
        raise r.error(field + ("observables",), f"the observables use {extra} (observable parameters), which an "
                      "experiment table does not give; use [[experiments]] tables")  # fmt: skip
    noise = context.default_noise
    if isinstance(noise, _NoiseSpec):
        columns = noise.columns(names)
        shared = all(c == columns[0] for c in columns)
        noise = _noise_model(columns[0], columns[0]["sigma"]) if shared else \
            [_noise_model(c, c["sigma"]) for c in columns]  # fmt: skip
    observables = context.observables(tuple(names))
    try:
        study = Study.from_table(problem, df, parameters=parameters, observable_names=names, observables=observables,
                                 noise=noise, conditions=conditions, groups=groups, levels=tuple(context.levels),
                                 y0=y0 or None, t0=t0)  # fmt: skip
    except (ValueError, TypeError) as exc:
        raise r.error(field, str(exc)) from None
    return study, list(names), file


def _newer_keys(r: TomlReader, table: Mapping, newer: tuple, allowed: tuple, field: tuple) -> None:
    """A diffsoup-study/2 key in a /1 file: say which format it needs."""
    for key in table:
        if key in newer and key not in allowed:
            raise r.error(field + (key,), f"{key!r} needs format = {FORMAT_2!r} (this file says {FORMAT!r})")


def _observable_parameter_names(r: TomlReader, doc: Mapping, taken: tuple) -> tuple:
    """Every observable-parameter name of a /2 file (top level and experiments): expressions may
    use them, and ``time``."""
    names: dict[str, tuple] = {}
    tables = [(doc.get("observable_parameters", {}), ("observable_parameters",))]
    for i, raw in enumerate(doc.get("experiments", []) if isinstance(doc.get("experiments"), list) else []):
        if isinstance(raw, Mapping) and "observable_parameters" in raw:
            tables.append((raw["observable_parameters"], ("experiments", i, "observable_parameters")))
    for table, field in tables:
        for k in r.table(table, field):
            if k in taken or k == TIME:
                raise r.error(field + (k,), f"{k!r} is a species or model parameter (or 'time'); give observable "
                              "parameters names of their own")  # fmt: skip
            names.setdefault(k, field)
    if TIME in taken:
        raise r.error(("model",), "the model has a species or parameter named 'time', which observable expressions "
                      "of diffsoup-study/2 read as the measurement time; rename it")  # fmt: skip
    return tuple(names) + (TIME,)


def _parameter_values(r: TomlReader, table: Any, field: tuple, study_names) -> dict:
    """A table name -> number or study-parameter name (a string)."""
    table = r.table(table, field)
    out: dict[str, Any] = {}
    for k, v in table.items():
        if isinstance(v, str):
            r.known(v, study_names, field + (k,), "study parameter")
            out[k] = v
        else:
            out[k] = r.number(v, field + (k,))
    return out


class _TimedObservables:
    """``observables(t, y, p)`` of a /2 file: the expressions see the measurement time as ``time``
    (and the experiment's observable parameters, which are in ``p``)."""

    def __init__(self, inner: Observables):
        self.inner = inner

    def __call__(self, t, y, p):
        return self.inner(y, {**p, TIME: t})

    def __repr__(self) -> str:
        return repr(self.inner)


def _state_reset(time: float, set_: Mapping[str, float], add: Mapping[str, float], states: tuple):
    from ..integrate import Reset

    set_idx = np.array([states.index(s) for s in set_], dtype=np.int64)
    set_val = np.array(list(set_.values()), dtype=np.float64)
    add_idx = np.array([states.index(s) for s in add], dtype=np.int64)
    add_val = np.array(list(add.values()), dtype=np.float64)

    def apply(t, y, p):
        if set_idx.size:
            y = y.at[set_idx].set(set_val.astype(y.dtype))
        if add_idx.size:
            y = y.at[add_idx].add(add_val.astype(y.dtype))
        return y

    return Reset(time, apply)


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


def _solver(r: TomlReader, table: dict):
    r.keys(table, SOLVER_KEYS, ("solver",))
    values = {}
    for key in ("rtol", "atol"):
        if key in table:
            values[key] = r.number(table[key], ("solver", key), positive=True)
    for key in ("max_steps", "checkpoints"):
        if key in table:
            values[key] = r.integer(table[key], ("solver", key), minimum=1)
    return SolverOptions(**values)


def _fit(r: TomlReader, table: dict) -> dict:
    r.keys(table, FIT_KEYS, ("fit",))
    max_nfev = table.get("max_nfev", None)
    method = r.string(table.get("method", DEFAULT_FIT["method"]), ("fit", "method"), METHODS)
    if "hessian" in table and method != "fides":
        raise r.error(("fit", "hessian"), f"applies to method \"fides\" only (method is {method!r}); remove it "
                                          f"or set method = \"fides\"")  # fmt: skip
    return {
        "method": method,
        "hessian": r.string(table.get("hessian", DEFAULT_FIT["hessian"]), ("fit", "hessian"), HESSIANS),
        "starts": r.integer(table.get("starts", DEFAULT_FIT["starts"]), ("fit", "starts"), minimum=1),
        "seed": r.integer(table.get("seed", DEFAULT_FIT["seed"]), ("fit", "seed")),
        "max_nfev": None if max_nfev is None else r.integer(max_nfev, ("fit", "max_nfev"), minimum=1),
        "objective": r.string(table.get("objective", DEFAULT_FIT["objective"]), ("fit", "objective"), OBJECTIVES),
        "hierarchical": _hierarchical(r, table.get("hierarchical", DEFAULT_FIT["hierarchical"])),
    }


def _hierarchical(r: TomlReader, value: Any) -> bool | tuple[str, ...] | None:
    """``[fit] hierarchical``: true, false, or the names of the parameters to optimize analytically
    (checked against the estimated parameters once those are read); None where the file does not
    say (``fit``'s default: the noise levels that qualify)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, list):
        names = r.names(value, ("fit", "hierarchical"))
        if not names:
            raise r.error(("fit", "hierarchical"), "is an empty list; write false, true or the parameters' names")
        return tuple(names)
    raise r.error(("fit", "hierarchical"), f"must be true, false or a list of parameter names, not {kind(value)}")


def _noise(r: TomlReader, table: Any, field: tuple, version: int = 1):
    """A noise model (/1), or a :class:`_NoiseSpec` (/2: models with ``base``, Laplace, per observable)."""
    table = r.table(table, field)
    if version == 1:
        _newer_keys(r, table, NOISE_KEYS_2, NOISE_KEYS, field)
        r.keys(table, NOISE_KEYS, field)
        model = r.string(table.get("model", "gaussian"), field + ("model",), NOISE_MODELS)
        sigma = table.get("sigma", _default_spread(noise_class(model)))
        if not isinstance(sigma, str):
            sigma = r.number(sigma, field + ("sigma",), positive=True)
        return _noise_model({"model": model, "base": None}, sigma)
    r.keys(table, NOISE_KEYS_2, field)
    default = _noise_column(r, {k: v for k, v in table.items() if k != "observables"}, field)
    per = {}
    for name, sub in r.table(table.get("observables", {}), field + ("observables",)).items():
        sub = r.table(sub, field + ("observables", name))
        r.keys(sub, NOISE_COLUMN_KEYS_2, field + ("observables", name))
        per[name] = _noise_column(r, {k: v for k, v in table.items() if k != "observables"} | sub,
                                  field + ("observables", name))  # fmt: skip
    return _NoiseSpec(default, per, field)


def _noise_column(r: TomlReader, table: Mapping, field: tuple) -> dict:
    """One column's noise of a /2 file: ``{"model", "sigma", "base"}`` checked."""
    model = r.string(table.get("model", "gaussian"), field + ("model",), noise_names())
    cls = noise_class(model)
    sigma = table.get("sigma", _default_spread(cls))
    if not isinstance(sigma, str):
        sigma = r.number(sigma, field + ("sigma",), positive=True)
    base = None
    if "base" in table:
        if not cls.logarithmic:
            logarithmic = [name for name in noise_names() if noise_class(name).logarithmic]
            raise r.error(field + ("base",), f"only {' and '.join(logarithmic)} noise have a base (this is {model})")
        base = r.number(table["base"], field + ("base",), positive=True)
        if base == 1.0:
            raise r.error(field + ("base",), "the logarithm's base must not be 1 (use 2.718281828459045 or 10)")
    return {"model": model, "sigma": sigma, "base": base}


@dataclasses.dataclass(frozen=True)
class _NoiseSpec:
    """The noise of a /2 file or experiment: a default column and per-observable columns."""

    default: dict
    per_observable: dict
    field: tuple

    def columns(self, names) -> list[dict]:
        return [self.per_observable.get(n, self.default) for n in names]


def _default_spread(cls: type):
    """The default spread of a noise model class (its spread field's default)."""
    field = next(f for f in dataclasses.fields(cls) if f.name == cls.spread_field)
    return field.default


def _noise_model(column: dict, spread):
    """The registered noise model ``column["model"]`` with ``spread`` (and ``base`` where given)."""
    cls = noise_class(column["model"])
    kw = {} if column["base"] is None else {"base": column["base"]}
    return cls(**{cls.spread_field: spread}, **kw)


def _parameter(r: TomlReader, raw: Any, field: tuple, levels: list[str]):
    raw = r.table(raw, field)
    r.keys(raw, PARAMETER_KEYS, field)
    if "name" not in raw:
        raise r.error(field, "a parameter needs name = ..., and nominal or lower and upper")
    values: dict[str, Any] = {"name": r.string(raw["name"], field + ("name",))}
    for key in ("nominal", "lower", "upper"):
        if key in raw:
            values[key] = r.number(raw[key], field + (key,))
    if "scale" in raw:
        values["scale"] = r.string(raw["scale"], field + ("scale",), SCALES)
    if "estimate" in raw:
        if not isinstance(raw["estimate"], bool):
            raise r.error(field + ("estimate",), f"must be true or false, not {raw['estimate']!r}")
        values["estimate"] = raw["estimate"]
    if "level" in raw:
        values["level"] = r.string(raw["level"], field + ("level",))
        r.known(values["level"], levels + [EXPERIMENT_LEVEL], field + ("level",), "level")
    try:
        return Parameter(**values)
    except ParameterError as exc:  # at the line of the key at fault, when the file has it
        key = exc.key if exc.key in raw else None
        raise r.error(field + ((key,) if key else ()), str(exc)) from None


class _ExperimentContext:
    def __init__(self, r, base, states, model_parameters, expressions, default_noise, study_names, levels, *,
                 version: int = 1):  # fmt: skip
        self.r, self.base = r, base
        self.version = version
        self.default_observable_parameters: dict = {}
        self.resets: dict[tuple, Any] = {}
        self.states, self.model_parameters = states, model_parameters
        self.expressions, self.default_noise = expressions, default_noise
        self.study_names, self.levels = study_names, levels
        self.observable_functions: dict[tuple, Any] = {}
        self.tables: dict[Path, DataTable] = {}

    def experiment(self, raw: Any, field: tuple):
        r = self.r
        raw = r.table(raw, field)
        if self.version == 1:
            _newer_keys(r, raw, EXPERIMENT_KEYS_2, EXPERIMENT_KEYS, field)
        r.keys(raw, EXPERIMENT_KEYS_2 if self.version == 2 else EXPERIMENT_KEYS, field)
        for key in ("id", "data"):
            if key not in raw:
                raise r.error(field, f"an experiment needs {key} = ...")
        eid = r.string(raw["id"], field + ("id",))
        if "[" in eid or "]" in eid:
            raise r.error(field + ("id",), f"{eid!r} must not hold '[' or ']' (they name level members)")
        times, columns, data, sigmas = self.data(r.string(raw["data"], field + ("data",)), eid, field + ("data",))
        if "observables" in raw:
            names = r.names(raw["observables"], field + ("observables",))
            for n in names:
                r.known(n, list(self.states) + list(self.expressions), field + ("observables",), "observable "
                        "(a species or an [observables] name)")  # fmt: skip
                if n not in columns:
                    raise r.error(field + ("data",), f"the data file has no column {n!r} for observable {n!r} "
                                  f"(its columns: {', '.join(columns)})")  # fmt: skip
            order = [columns.index(n) for n in names]
            data, sigmas = data[:, order], sigmas[:, order]
        else:
            names = list(columns)
            for n in names:
                if n not in self.states and n not in self.expressions:
                    raise r.error(field + ("data",), f"column {n!r} of the data file is neither a species nor an "
                                  f"[observables] name; species: {', '.join(self.states)}")  # fmt: skip
        observables = self.observables(tuple(names))
        noise = self.default_noise if "noise" not in raw else _noise(r, raw["noise"], field + ("noise",), self.version)
        if isinstance(noise, _NoiseSpec):
            noise = self.noise_2(noise, names, sigmas, field)
        elif np.any(np.isfinite(sigmas)):
            if isinstance(noise.sigma, str):
                raise r.error(field + ("data",), "the data file gives sigma: columns but the noise's sigma is the "
                              f"estimated parameter {noise.sigma!r}; keep one")  # fmt: skip
            sigmas = np.where(np.isfinite(sigmas), sigmas, noise.sigma)
            noise = type(noise)(sigmas)
        if not isinstance(noise, list) and isinstance(noise.sigma, str):
            r.known(noise.sigma, self.study_names, field + ("noise", "sigma"), "study parameter")
        conditions = r.values(raw.get("conditions", {}), field + ("conditions",))
        for k in conditions:
            r.known(k, self.model_parameters, field + ("conditions", k), "model parameter")
        mapping = r.table(raw.get("parameters", {}), field + ("parameters",))
        for k, v in mapping.items():
            r.known(k, self.model_parameters, field + ("parameters", k), "model parameter")
            r.known(r.string(v, field + ("parameters", k)), self.study_names, field + ("parameters", k), "study parameter")
        y0 = None
        if "y0" in raw:
            y0 = self.initial_state(raw["y0"], field + ("y0",))
        groups = r.table(raw.get("groups", {}), field + ("groups",))
        for k, v in groups.items():
            r.known(k, self.levels, field + ("groups", k), "level")
            r.string(v, field + ("groups", k))
        for level in self.levels:
            if level not in groups:
                raise r.error(field + ("groups",), f"names no member of level {level!r}; write groups = {{{level} = \"...\"}}")
        t0 = r.number(raw.get("t0", 0.0), field + ("t0",))
        trajectory = self.multishoot(raw["multishoot"], field + ("multishoot",)) if "multishoot" in raw else None
        extra = self.version_2(raw, field, names) if self.version == 2 else {}
        try:
            experiment = Experiment(eid, times, data, observables=observables, noise=noise, conditions=conditions,
                                    parameters=mapping, y0=y0, groups=groups, t0=t0, trajectory=trajectory,
                                    **extra)  # fmt: skip
        except (ValueError, TypeError) as exc:
            raise r.error(field, str(exc)) from None
        return experiment, names

    def observables(self, names: tuple):
        if names == self.states:
            return None  # every state observed in order: data-initialized window starts work
        if names not in self.observable_functions:
            inner = Observables(names, self.states, self.expressions)
            self.observable_functions[names] = _TimedObservables(inner) if self.version == 2 else inner
        return self.observable_functions[names]

    # -- diffsoup-study/2 -------------------------------------------------------------------------
    def initial_state(self, table: Any, field: tuple) -> dict:
        """An experiment's (or pre-equilibration's) ``y0``: species -> number (or, /2, a study
        parameter's name: an estimated initial amount)."""
        if self.version == 1:
            values: dict = self.r.values(table, field)
        else:
            values = _parameter_values(self.r, table, field, self.study_names)
        for k in values:
            self.r.known(k, self.states, field + (k,), "species")
        return values

    def noise_2(self, spec: _NoiseSpec, names, sigmas, field: tuple):
        """The noise models of a /2 experiment: one, or one per column where they differ; the data
        file's ``sigma:`` columns give per-value spreads."""
        r = self.r
        columns = spec.columns(names)
        if spec.field[0] == "experiments":  # an experiment's own noise names its own columns
            for n in spec.per_observable:
                r.known(n, list(names), spec.field + ("observables", n), "observable of this experiment")
        for j, c in enumerate(columns):
            if isinstance(c["sigma"], str):
                r.known(c["sigma"], self.study_names, spec.field + ("sigma",), "study parameter")
                if np.any(np.isfinite(sigmas[:, j])):
                    raise r.error(field + ("data",), f"the data file gives sigma:{names[j]} but the noise's sigma of "
                                  f"{names[j]!r} is the estimated parameter {c['sigma']!r}; keep one")  # fmt: skip
        shared = all(c == columns[0] for c in columns)
        given = np.isfinite(sigmas)
        if shared:
            c = columns[0]
            spread = np.where(given, sigmas, c["sigma"]) if np.any(given) else c["sigma"]
            return _noise_model(c, spread)
        return [_noise_model(c, np.where(given[:, j], sigmas[:, j], c["sigma"]) if np.any(given[:, j]) else c["sigma"])
                for j, c in enumerate(columns)]  # fmt: skip

    def version_2(self, raw: Mapping, field: tuple, names) -> dict:
        """The /2 keys of an experiment as ``Experiment`` arguments."""
        from ..inference import Preequilibration

        r, out = self.r, {}
        params = dict(self.default_observable_parameters)
        params.update(_parameter_values(r, raw.get("observable_parameters", {}), field + ("observable_parameters",),
                                        self.study_names))  # fmt: skip
        used = set()
        for n in names:
            if n in self.expressions:
                used |= {node.id for node in ast.walk(self.expressions[n]) if isinstance(node, ast.Name)}
        missing = sorted(used - set(self.states) - set(self.model_parameters) - set(params) - {TIME}
                         - set(EXPRESSION_FUNCTIONS))  # fmt: skip
        if missing:
            raise r.error(field + ("observable_parameters",), f"the observables use {missing}, which this experiment's "
                          "observable_parameters (or the top-level ones) do not give")  # fmt: skip
        out["observable_parameters"] = params
        if "preequilibration" in raw:
            pf = field + ("preequilibration",)
            pre = r.table(raw["preequilibration"], pf)
            r.keys(pre, PREEQUILIBRATION_KEYS, pf)
            conditions = _parameter_values(r, pre.get("conditions", {}), pf + ("conditions",), self.study_names)
            for k in conditions:
                r.known(k, self.model_parameters, pf + ("conditions", k), "model parameter")
            y0 = self.initial_state(pre["y0"], pf + ("y0",)) if "y0" in pre else None
            out["preequilibration"] = Preequilibration(conditions=conditions, y0=y0)
        if "resets" in raw:
            resets = raw["resets"]
            if not isinstance(resets, list):
                raise r.error(field + ("resets",), "must be a list of tables {time = ..., set = {...}, add = {...}}")
            out["resets"] = tuple(self.reset(x, field + ("resets", i)) for i, x in enumerate(resets))
        if "discontinuities" in raw:
            values = raw["discontinuities"]
            if not isinstance(values, list):
                raise r.error(field + ("discontinuities",), "must be a list of times, e.g. [3.0, 10.0]")
            out["discontinuities"] = tuple(sorted(r.number(v, field + ("discontinuities",)) for v in values))
        if "steady_state" in raw:
            from ..integrate import SteadyState

            sf = field + ("steady_state",)
            table = r.table(raw["steady_state"], sf)
            r.keys(table, STEADY_STATE_KEYS, sf)
            out["steady_state"] = SteadyState(**{k: r.number(v, sf + (k,), positive=True) for k, v in table.items()})
        return out

    def reset(self, raw: Any, field: tuple):
        """A ``ds.Reset`` at a time: ``set`` states to numbers, ``add`` numbers to states (the
        same reset object for equal tables, so that experiments sharing it are vmapped together)."""
        r = self.r
        raw = r.table(raw, field)
        r.keys(raw, RESET_KEYS, field)
        if "time" not in raw:
            raise r.error(field, "a reset needs time = ...")
        time = r.number(raw["time"], field + ("time",))
        if not np.isfinite(time):
            raise r.error(field + ("time",), f"must be finite, not {time}")
        set_, add = (r.values(raw.get(k, {}), field + (k,)) for k in ("set", "add"))
        for table, k in ((set_, "set"), (add, "add")):
            for s in table:
                r.known(s, self.states, field + (k, s), "species")
        if not set_ and not add:
            raise r.error(field, "a reset needs set = {species = value} or add = {species = amount}")
        key = (time, tuple(sorted(set_.items())), tuple(sorted(add.items())))
        if key not in self.resets:
            self.resets[key] = _state_reset(time, set_, add, self.states)
        return self.resets[key]

    def multishoot(self, raw: Any, field: tuple):
        raw = self.r.table(raw, field)
        self.r.keys(raw, MULTISHOOT_KEYS, field)
        try:
            return Multishoot(**raw)
        except (ValueError, TypeError) as exc:
            raise self.r.error(field, str(exc)) from None

    def data(self, name: str, eid: str, field: tuple):
        """(times, observable columns, values (m, k), sigmas (m, k) NaN where not given) of one experiment."""
        file = (self.base / name).resolve()
        if not file.is_file():
            raise self.r.error(field, f"data file {name!r} not found (looked for {file})")
        if file not in self.tables:
            self.tables[file] = read_data_table(file)
        data = self.tables[file].experiment(eid)
        if data is None:
            raise self.r.error(field, f"{name} has no rows whose experiment column is {eid!r}")
        return data
