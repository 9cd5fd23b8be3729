"""``ds.Study``: experiments, the parameter table and the levels (clusters) that own parameters."""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

from ._experiment import Experiment
from ._array_plan import check_levels, resolve_arrays
from ._experiment_arrays import ExperimentArrays, ExperimentViews
from ._noise import Gaussian

SCALES = ("lin", "log", "log10")
EXPERIMENT_LEVEL = "experiment"


class ParameterError(ValueError):
    """A bad :class:`Parameter` row; ``key`` is the field at fault (``"lower"``, ``"nominal"``, ...),
    so that a study file can point at that key's line."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One row of a study's parameter table.

    Args:
        name: the study parameter's name (experiments map model parameters to it).
        nominal: its value on the linear scale (the value it keeps when fixed, and a start).
            None (the default) takes the midpoint of ``lower`` and ``upper`` on the parameter's
            scale (the geometric mean for ``"log"``/``"log10"``); the bounds must then be finite.
        lower, upper: bounds on the linear scale; finite for an estimated parameter, positive
            for the log scales.
        scale: ``"lin"``, ``"log"`` or ``"log10"``: the coordinates the optimizer works in.
        estimate: True to estimate it, False to hold it at ``nominal``.
        level: None for one value shared by all experiments; ``"experiment"`` for one value per
            experiment; a level name of the study for one value per member of that level. The
            entries are named ``name[member]``.

    Raises:
        ValueError: naming the parameter and the field (its ``key`` attribute names the field).
    """

    name: str
    nominal: float | None = None
    lower: float = -math.inf
    upper: float = math.inf
    scale: str = "log10"
    estimate: bool = True
    level: str | None = None

    def __post_init__(self):
        where = f"Parameter {self.name!r}"
        if not isinstance(self.name, str) or not self.name or "[" in self.name:
            raise ParameterError(f"Parameter name {self.name!r} must be a non-empty string without '['.", "name")
        if self.scale not in SCALES:
            raise ParameterError(f"{where}: scale={self.scale!r} must be one of {SCALES}.", "scale")
        for field in ("lower", "upper") + (("nominal",) if self.nominal is not None else ()):
            value = getattr(self, field)
            try:
                object.__setattr__(self, field, float(value))
            except (TypeError, ValueError):
                raise ParameterError(f"{where}: {field}={value!r} must be a number.", field) from None
            if math.isnan(getattr(self, field)):
                raise ParameterError(f"{where}: {field} is NaN; give a number.", field)
        if self.lower > self.upper:
            raise ParameterError(
                f"{where}: lower bound {self.lower} is above the upper bound {self.upper}; swap them.", "upper"
            )
        if self.scale != "lin" and self.lower <= 0:
            raise ParameterError(
                f"{where}: scale={self.scale!r} needs positive values; lower={self.lower} (use scale='lin' or "
                "positive bounds).", "lower"
            )  # fmt: skip
        if self.nominal is None:
            if not (math.isfinite(self.lower) and math.isfinite(self.upper)):
                raise ParameterError(
                    f"{where}: give nominal=, or finite lower= and upper= (nominal then defaults to their midpoint "
                    f"on the {self.scale} scale).", "nominal"
                )  # fmt: skip
            lo, hi = self.lower, self.upper
            midpoint = lo / 2 + hi / 2 if self.scale == "lin" else math.sqrt(lo) * math.sqrt(hi)
            object.__setattr__(self, "nominal", midpoint)
        if not math.isfinite(self.nominal):
            raise ParameterError(f"{where}: nominal={self.nominal} must be finite.", "nominal")
        if self.estimate and not (math.isfinite(self.lower) and math.isfinite(self.upper)):
            raise ParameterError(
                f"{where}: an estimated parameter needs finite bounds (lower=, upper=) for the multistart; "
                "give them or set estimate=False.", "upper" if math.isfinite(self.lower) else "lower"
            )  # fmt: skip
        if self.scale != "lin" and self.nominal <= 0:
            raise ParameterError(
                f"{where}: scale={self.scale!r} needs positive values; nominal={self.nominal} (use scale='lin' or "
                "a positive nominal).", "nominal"
            )  # fmt: skip
        if not (self.lower <= self.nominal <= self.upper):
            raise ParameterError(f"{where}: nominal {self.nominal} lies outside [{self.lower}, {self.upper}].",
                                 "nominal")
        if self.level is not None and (not isinstance(self.level, str) or not self.level):
            raise ParameterError(f"{where}: level must be None, 'experiment' or a level name of the study.", "level")

    def to_scale(self, value):
        """Linear value -> optimizer coordinate."""
        return {"lin": lambda v: v, "log": np.log, "log10": np.log10}[self.scale](np.asarray(value, dtype=np.float64))

    def from_scale(self, value):
        """Optimizer coordinate -> linear value (numpy)."""
        v = np.asarray(value, dtype=np.float64)
        return {"lin": lambda v: v, "log": np.exp, "log10": lambda v: 10.0**v}[self.scale](v)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One entry of the expanded study parameter vector (a parameter, or its value for one member)."""

    name: str
    parameter: Parameter
    member: str | None


class Study:
    """Experiments, a parameter table and optional levels (clusters) whose members own parameters.

    Args:
        problem: the model, a built ``ds.Problem`` (a ``ProblemSpec``/``ReactionNetwork`` is built
            with defaults).
        experiments: the experiments (unique ids). :meth:`from_arrays` and :meth:`from_table` build a
            study of many experiments of one shape held as arrays (``study.arrays``), whose
            ``study.experiments[i]`` are ``Experiment`` views built on access.
        parameters: the parameter table, a sequence of :class:`Parameter`.
        levels: level names, outermost first (e.g. ``("site", "patient")``); each experiment names
            its member of every level in ``Experiment.groups``, and each member of an inner level
            belongs to one member of every outer level.

    Attributes:
        arrays: the experiments' arrays (``ExperimentArrays``) of a study built by
            :meth:`from_arrays`/:meth:`from_table`, else None; ``array_plan`` where its numbers
            come from (the vectorized ``resolved``).
        ids: the experiment ids in study order (:meth:`index_of` finds one).
        entries: the expanded study parameters (one per parameter, or per member of its level).
        entry_names: their names.
        resolved: experiment id -> how its numbers come from the entries: ``plan`` (per model
            parameter ``("entry", index)`` or ``("fixed", value)``), ``y0`` (numbers, NaN where
            estimated; None for a callable), ``y0_entry``, ``y0_set``, ``y0_function``,
            ``observable_plan`` ((name, plan) pairs), ``sigma_entries`` ``(m, k)``, ``sigma_entry``,
            ``pre`` (the pre-equilibration's ``plan`` with ``("keep", 0)`` for the experiment's
            value, and its ``y0...``; None without one), ``k`` (observables).

    Raises:
        ValueError: naming the experiment and the field: duplicate ids, an unknown parameter in a
            mapping, in ``conditions`` or in the pre-equilibration's conditions, an unknown state
            in ``y0``, data whose shape does not match the observables, a missing level member,
            a member in two outer members, a name (sigma, observable parameter, initial amount)
            that is not a study parameter, an observable parameter named like a model parameter,
            a callable (``y0``, spread, discontinuities, reset time) that fails to trace or
            returns the wrong shape, a model parameter with no value.
    """

    def __init__(
        self,
        problem: Any,
        experiments: Sequence[Experiment],
        parameters: Sequence[Parameter],
        *,
        levels: Sequence[str] = (),
    ):
        problem = problem_of(problem)
        self.problem = problem
        # A study held as arrays (Study.from_arrays / from_table) keeps no object per experiment.
        self.arrays = experiments if isinstance(experiments, ExperimentArrays) else None
        if self.arrays is not None:
            self.experiments = ExperimentViews(self.arrays)
        else:
            self.experiments = tuple(experiments)
        if not len(self.experiments):
            raise ValueError("Study: experiments is empty; a study needs at least one experiment.")
        if self.arrays is None:
            for e in self.experiments:
                if not isinstance(e, Experiment):
                    raise TypeError(f"Study: experiments must be ds.Experiment objects, got {type(e).__name__}.")
            ids = [e.id for e in self.experiments]
            counts = collections.Counter(ids)
            dup = sorted(i for i, c in counts.items() if c > 1)
            if dup:
                raise ValueError(f"Study: duplicate experiment ids {dup}; ids must be unique.")
        self.parameters = tuple(parameters)
        for p in self.parameters:
            if not isinstance(p, Parameter):
                raise TypeError(f"Study: parameters must be ds.inference.Parameter rows, got {type(p).__name__}.")
        names = [p.name for p in self.parameters]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"Study: duplicate parameter names {dup}.")
        self.levels = tuple(levels)
        if len(set(self.levels)) != len(self.levels) or EXPERIMENT_LEVEL in self.levels:
            raise ValueError(f"Study: levels={self.levels} must be distinct names other than {EXPERIMENT_LEVEL!r}.")
        for p in self.parameters:
            if p.level is not None and p.level != EXPERIMENT_LEVEL and p.level not in self.levels:
                raise ValueError(
                    f"Study: Parameter {p.name!r} has level={p.level!r}, not one of the study's levels "
                    f"{self.levels} (or 'experiment')."
                )
        if self.arrays is None:
            self._check_levels()
        else:
            check_levels(self.arrays, self.levels)
        self.table = {p.name: p for p in self.parameters}
        self.entries = self._expand()
        self.entry_names = tuple(e.name for e in self.entries)
        self.entry_index = {n: i for i, n in enumerate(self.entry_names)}
        if self.arrays is None:
            self.array_plan = None
            self.resolved = {e.id: self._resolve(e) for e in self.experiments}
        else:
            self.array_plan = resolve_arrays(self)
            self.resolved = _LazyResolved(self)
            self._check_array_functions()

    @classmethod
    def from_arrays(
        cls,
        problem: Any,
        times: Any,
        data: Any,
        *,
        parameters: Sequence[Parameter],
        ids: Any = None,
        y0: Any = None,
        conditions: Mapping[str, Any] | None = None,
        noise: Any = None,
        groups: Mapping[str, Any] | None = None,
        levels: Sequence[str] | None = None,
        observables: Any = None,
        t0: Any = 0.0,
        observable_parameters: Mapping[str, Any] | None = None,
        resets: Sequence[Any] = (),
        discontinuities: Any = (),
    ) -> "Study":
        """A study of many experiments of one shape given as arrays with a leading experiment axis.

        The study holds the arrays (no ``Experiment`` object per experiment): lowering packs chunks
        from them by indexing, and ``study.experiments[i]`` builds an ``Experiment`` view of row
        ``i``. NumPy arrays are kept as given (float64, no copy); Dask and Zarr arrays are read
        chunk by chunk along the experiment axis into NumPy.

        Args:
            problem: the model (as for ``Study``).
            times: measurement times ``(m,)`` shared by all experiments, or ``(E, m)``; NaN at the
                end of a row pads an experiment with fewer times (its data there must be NaN);
                ``+inf`` at the end measures the steady state.
            data: measured values ``(E, m, k)`` (``(E, m)`` reads as ``k = 1``), NaN where missing.
            parameters: the parameter table (``ds.inference.Parameter`` rows).
            ids: ``(E,)`` unique experiment ids (default ``"0"``, ``"1"``, ...).
            y0: None (the model's), ``(n,)``, ``(E, n)``, a mapping state name -> a number or
                ``(E,)`` values overriding the model's ``y0``, or a callable ``y0(p) -> (n,)`` of
                the model parameters by name, shared by all experiments.
            conditions: model parameter name -> a number or ``(E,)`` fixed values; NaN leaves that
                experiment's value to the parameter table (or the model's default); a study
                parameter's name (a string, or in an object array of numbers and names) maps that
                experiment's model parameter to it.
            noise: one noise model for all columns (default ``Gaussian()``) or one per column; its
                spread a number, an array broadcastable to ``(E, m, k)`` (per column: ``(E, m)``)
                of numbers or numbers and study parameters' names, one study parameter's name, or
                a callable (as for ``Experiment``).
            groups: level name -> ``(E,)`` member names.
            levels: the study's levels, outermost first (default: the keys of ``groups``).
            observables: the observables function shared by all experiments (None: every state).
            t0: initial time, a number or ``(E,)``.
            observable_parameters: name -> a number, a study parameter's name, or ``(E,)`` of them
                (as ``Experiment.observable_parameters``, per experiment).
            resets, discontinuities: as for ``Experiment``, shared by all experiments.

        Raises:
            ValueError: naming the experiment (id and row) and the field, with the fix: Inf or no
                data, times out of order or before ``t0``, non-positive spreads, unknown condition
                or state names, a level member in two outer members, shapes that do not match.
        """
        from ._experiment_arrays import experiment_arrays

        problem = problem_of(problem)
        arrays = experiment_arrays(problem, times, data, ids=ids, y0=y0, conditions=conditions,
                                   noise=Gaussian() if noise is None else noise, groups=groups,
                                   observables=observables, t0=t0, observable_parameters=observable_parameters,
                                   resets=resets, discontinuities=discontinuities)  # fmt: skip
        return cls(problem, arrays, parameters, levels=tuple(groups or ()) if levels is None else levels)

    @classmethod
    def from_table(cls, problem: Any, table: Any, *, parameters: Sequence[Parameter], **options: Any) -> "Study":
        """A study of the experiments of a table, held as arrays as by :meth:`from_arrays`.

        Long format: one row per measured value, with columns ``experiment`` (id), ``time``,
        ``observable`` (name) and ``value`` (NaN: missing), optionally ``sigma``. Wide format
        (no ``observable``/``value`` columns): one row per time of an experiment, a column per
        observable and optionally ``sigma:<observable>`` columns (the study files' data files).
        Either may hold condition, level and initial-state columns (one value per experiment).
        Experiments come in order of first appearance, each one's rows by time; a replicate (the
        same experiment, time and observable) gets a time row of its own. Pivoting is vectorized
        (no loop over experiments).

        Args:
            problem: the model.
            table: a pandas ``DataFrame``, a pyarrow ``Table``, or the path of a Parquet, CSV or
                TSV file.
            parameters: the parameter table.
            experiment, time, observable, value, sigma: the column names (defaults: those words;
                ``sigma=None`` ignores a spread column; an empty spread keeps the noise model's).
            conditions: columns named by model parameters, or a mapping model parameter ->
                column (NaN: the experiment leaves it to the parameter table).
            condition, condition_table: a column of condition ids and a ``DataFrame`` indexed by
                condition id whose columns are model parameters.
            groups: level columns outermost first, or a mapping level -> column; levels: the
                study's levels (default: those of ``groups``).
            observable_names: the observables in column order (default: the model's states when
                ``observables`` is None, else the long table's names in order of first appearance).
            observables, noise, t0: as for :meth:`from_arrays`; y0: as there, or a mapping state
                -> column name (``{"A": "A0"}``).

        Raises:
            ValueError: naming the row, its experiment id and the column at fault (a missing
                column, an unknown observable, a NaN time, a time before ``t0``, a non-finite
                value, a spread that is not positive, a condition or member that changes within
                an experiment), or, after pivoting, the experiment and the field as
                :meth:`from_arrays` does.
        """
        from ._study_table import study_arrays_of_table

        problem = problem_of(problem)
        arrays, levels = study_arrays_of_table(problem, table, **options)
        return cls(problem, arrays, parameters, levels=levels)

    @property
    def ids(self) -> tuple:
        """The experiment ids in study order."""
        if self.arrays is not None:
            return tuple(self.arrays.ids.tolist())
        return tuple(e.id for e in self.experiments)

    @property
    def n_measured(self) -> int:
        """The measured (finite) values of all experiments."""
        if self.arrays is not None:
            return int(np.isfinite(self.arrays.data).sum())
        return sum(e.n_measured for e in self.experiments)

    def index_of(self, experiment_id: str) -> int | None:
        """The study index of an experiment id (None if unknown)."""
        if self.arrays is not None:
            return self.arrays.index_of(experiment_id)
        if getattr(self, "_id_index", None) is None:
            self._id_index = {e.id: i for i, e in enumerate(self.experiments)}
        return self._id_index.get(experiment_id)

    def _check_array_functions(self) -> None:
        """Trace the shared observables and callables once (the count of observables, shapes)."""
        view = self.arrays.experiment(0)
        k = self._observable_count(view)
        if k != self.arrays.shape[2]:
            raise ValueError(
                f"Study: data has {self.arrays.shape[2]} observable column(s); the observables give {k} value(s) per "
                f"time, so data must be (experiments, times, {k})."
            )  # fmt: skip
        plan = tuple((name, None) for name in sorted(self.arrays.observable_parameters))
        self._check_functions(view, {"k": k, "y0_function": self.arrays.y0_function, "pre": None,
                                     "observable_plan": plan})  # fmt: skip

    # -- construction helpers -------------------------------------------------------------------
    def _check_levels(self):
        parent: dict[tuple[str, str], tuple] = {}
        for e in self.experiments:
            missing = [lv for lv in self.levels if lv not in e.groups]
            if missing:
                raise ValueError(f"Experiment {e.id!r}: groups has no member for level(s) {missing}.")
            extra = [lv for lv in e.groups if lv not in self.levels]
            if extra:
                raise ValueError(f"Experiment {e.id!r}: groups names unknown level(s) {extra}; levels are {self.levels}.")
            for i, lv in enumerate(self.levels):
                outer = tuple(e.groups[o] for o in self.levels[:i])
                key = (lv, e.groups[lv])
                if parent.setdefault(key, outer) != outer:
                    raise ValueError(
                        f"Experiment {e.id!r}: groups: member {e.groups[lv]!r} of level {lv!r} belongs to "
                        f"{parent[key]} elsewhere and to {outer} here; a member belongs to one outer member."
                    )

    def members(self, level: str) -> tuple[str, ...]:
        """Members of a level (or the experiment ids for ``"experiment"``), in order of first appearance."""
        if level == EXPERIMENT_LEVEL:
            return self.ids
        if level not in self.levels:
            raise ValueError(f"Study: unknown level {level!r}; levels are {self.levels}.")
        if self.arrays is not None:
            return self.arrays.groups[level][1]
        return tuple(dict.fromkeys(e.groups[level] for e in self.experiments))

    def _expand(self):
        out = []
        for p in self.parameters:
            if p.level is None:
                out.append(Entry(p.name, p, None))
            else:
                out.extend(Entry(f"{p.name}[{m}]", p, m) for m in self.members(p.level))
        return tuple(out)

    def entry_of(self, experiment: Experiment, name: str) -> int:
        """Index of the entry that study parameter ``name`` takes for ``experiment``."""
        p = self.table[name]
        if p.level is None:
            return self.entry_index[name]
        member = experiment.id if p.level == EXPERIMENT_LEVEL else experiment.groups[p.level]
        return self.entry_index[f"{name}[{member}]"]

    def _resolve(self, e: Experiment) -> dict:
        """How the experiment's numbers come from the study's entries (the ``resolved`` attribute)."""
        prob = self.problem
        where = f"Experiment {e.id!r}"
        model = prob.parameter_names
        for field, keys in (("conditions", e.conditions), ("parameters", e.parameters)):
            unknown = [k for k in keys if k not in model]
            if unknown:
                raise ValueError(
                    f"{where}: {field} names unknown model parameter(s) {unknown}; the model's parameters are "
                    f"{list(model)}."
                )
        unknown = [v for v in e.parameters.values() if v not in self.table]
        if unknown:
            raise ValueError(
                f"{where}: parameters maps to unknown study parameter(s) {unknown}; the parameter table has "
                f"{list(self.table)}."
            )
        defaults = prob.spec.parameter_defaults
        plan = []
        for i, name in enumerate(model):
            if name in e.conditions:
                plan.append(("fixed", e.conditions[name]))
            elif name in e.parameters:
                plan.append(("entry", self.entry_of(e, e.parameters[name])))
            elif name in self.table:
                plan.append(("entry", self.entry_of(e, name)))
            elif defaults is not None:
                plan.append(("fixed", float(defaults[i])))
            else:
                raise ValueError(
                    f"{where}: model parameter {name!r} has no value: give it in conditions, map it in "
                    "parameters, or add a study parameter of that name."
                )
        out = {"plan": tuple(plan)}
        out.update(self._initial_state(e, e.y0, "y0", main=True))
        out["observable_plan"] = self._observable_plan(e)
        out.update(self._sigma_entries(e))
        out["pre"] = self._preequilibration(e, plan) if e.preequilibration is not None else None
        k = self._observable_count(e)
        if e.data.shape[1] != k:
            raise ValueError(
                f"{where}: data has shape {e.data.shape}; the observables give {k} value(s) per time, so data must "
                f"be ({e.times.shape[0]}, {k})."
            )
        out["k"] = k
        self._check_functions(e, out)
        return out

    def _study_entry(self, e: Experiment, name: str, field: str) -> int:
        if name not in self.table:
            raise ValueError(
                f"Experiment {e.id!r}: {field} names {name!r}, which is not a study parameter; add it to the "
                "parameter table."
            )
        return self.entry_of(e, name)

    def _initial_state(self, e: Experiment, y0: Any, field: str, *, main: bool) -> dict:
        """``y0`` (numbers, NaN where estimated or computed), ``y0_entry`` (entry per state, -1: not
        estimated), ``y0_set`` (the states ``y0`` names), ``y0_function`` (a callable or None)."""
        prob = self.problem
        where = f"Experiment {e.id!r}"
        n = prob.n_states
        entry = np.full(n, -1, dtype=np.int64)
        preeq_main = main and e.preequilibration is not None
        out = {"y0": None, "y0_entry": entry, "y0_set": np.zeros(n, dtype=bool), "y0_function": None}
        if callable(y0):
            out["y0_function"] = y0
            return out
        if y0 is None:
            if preeq_main:
                out["y0"] = np.zeros(n)
                return out
            if prob.spec.y0 is None:
                raise ValueError(f"{where}: {field} is not given and the model has no default y0.")
            out["y0"] = np.asarray(prob.spec.y0, dtype=np.float64)
            return out
        if isinstance(y0, dict):
            unknown = [k for k in y0 if k not in prob.state_names]
            if unknown:
                raise ValueError(
                    f"{where}: {field} names unknown state(s) {unknown}; states are {list(prob.state_names)[:10]}..."
                )
            if prob.spec.y0 is None and len(y0) != n and not preeq_main:
                raise ValueError(f"{where}: {field} gives {len(y0)} of {n} states and the model has no default y0.")
            values = np.array(prob.spec.y0 if prob.spec.y0 is not None else np.zeros(n), dtype=np.float64)
            for k, v in y0.items():
                i = prob.state_names.index(k)
                out["y0_set"][i] = True
                if isinstance(v, str):
                    entry[i] = self._study_entry(e, v, f"{field}[{k!r}]")
                    values[i] = np.nan
                else:
                    values[i] = v
            out["y0"] = values
            return out
        if y0.shape != (n,):
            raise ValueError(f"{where}: {field} has shape {y0.shape}; the model has {n} states.")
        out["y0"] = y0
        out["y0_set"][:] = True
        return out

    def _observable_plan(self, e: Experiment) -> tuple:
        model = set(self.problem.parameter_names)
        clash = sorted(k for k in e.observable_parameters if k in model)
        if clash:
            raise ValueError(
                f"Experiment {e.id!r}: observable_parameters names {clash}, which are model parameters; give "
                "observable parameters names of their own (the model's are set by conditions/parameters)."
            )
        plan = []
        for name in sorted(e.observable_parameters):
            v = e.observable_parameters[name]
            if isinstance(v, str):
                plan.append((name, ("entry", self._study_entry(e, v, f"observable_parameters[{name!r}]"))))
            else:
                plan.append((name, ("fixed", float(v))))
        return tuple(plan)

    def _sigma_entries(self, e: Experiment) -> dict:
        """``sigma_entries`` ``(m, k)`` (the entry of each named spread, -1 elsewhere) and
        ``sigma_entry`` (the one entry of a single named spread, as ``noise.sigma="name"``, else -1)."""
        entries = np.full(e.data.shape, -1, dtype=np.int64)
        shared = not isinstance(e.noise, (list, tuple))
        named = np.not_equal(e.sigma_names, None)
        for i, j in zip(*np.nonzero(named)):
            name = e.sigma_names[i, j]
            model = e.noise_columns[j]
            label = f"noise.{model.spread_field}" if shared else f"noise[{j}].{model.spread_field}"
            if name not in self.table:
                raise ValueError(
                    f"Experiment {e.id!r}: {label} names {name!r}, which is not a study parameter; add it to the "
                    "parameter table."
                )
            sp = self.table[name]
            if sp.lower <= 0:
                raise ValueError(
                    f"Experiment {e.id!r}: {label} is study parameter {sp.name!r}, whose lower bound {sp.lower} must be "
                    "positive."
                )
            entries[i, j] = self.entry_of(e, name)
        single = -1
        if shared and isinstance(e.noise.spread, str):
            single = int(entries[0, 0])
        return {"sigma_entries": entries, "sigma_entry": single}

    def _preequilibration(self, e: Experiment, plan) -> dict:
        pre = e.preequilibration
        model = self.problem.parameter_names
        unknown = [k for k in pre.conditions if k not in model]
        if unknown:
            raise ValueError(
                f"Experiment {e.id!r}: preequilibration.conditions names unknown model parameter(s) {unknown}; the "
                f"model's parameters are {list(model)}."
            )
        pre_plan = []
        for name in model:
            if name not in pre.conditions:
                pre_plan.append(("keep", 0.0))
            elif isinstance(pre.conditions[name], str):
                pre_plan.append(
                    ("entry", self._study_entry(e, pre.conditions[name], f"preequilibration.conditions[{name!r}]"))
                )
            else:
                pre_plan.append(("fixed", float(pre.conditions[name])))
        out = {"plan": tuple(pre_plan)}
        out.update(self._initial_state(e, pre.y0, "preequilibration.y0", main=False))
        return out

    def _check_functions(self, e: Experiment, resolved: dict) -> None:
        """Trace the experiment's callables once (shapes only) for an early, named error."""
        import jax

        prob = self.problem
        n, k = prob.n_states, resolved["k"]
        has_functions = (resolved["y0_function"] is not None or (resolved["pre"] or {}).get("y0_function") is not None
                         or any(f is not None for f in e.sigma_functions) or callable(e.discontinuities)
                         or any(callable(r.time) for r in e.resets))  # fmt: skip
        if not has_functions:  # nothing to trace (most experiments): skip building the shapes
            return
        p = {name: jax.ShapeDtypeStruct((), prob.dtype) for name in prob.parameter_names}
        po = dict(p, **{name: jax.ShapeDtypeStruct((), prob.dtype) for name, _ in resolved["observable_plan"]})
        scalar = jax.ShapeDtypeStruct((), prob.dtype)
        checks = []
        for field, fn in (("y0", resolved["y0_function"]),
                          ("preequilibration.y0", (resolved["pre"] or {}).get("y0_function"))):  # fmt: skip
            if fn is not None:
                checks.append((f"{field}(p)", fn, (dict(p),), ((n,),)))
        shared = not isinstance(e.noise, (list, tuple))
        seen = set()
        for j, fn in enumerate(e.sigma_functions):
            if fn is None or id(fn) in seen:
                continue
            seen.add(id(fn))
            field = e.noise_columns[j].spread_field
            label = f"noise.{field}(t, h, p)" if shared else f"noise[{j}].{field}(t, h, p)"
            h = jax.ShapeDtypeStruct((k,), prob.dtype)
            checks.append((label, fn, (scalar, h, dict(po)), ((k,), ()) if shared else ((k,), (), (1,))))
        if callable(e.discontinuities):
            checks.append(("discontinuities(p)", e.discontinuities, (dict(p),), None))
        for i, r in enumerate(e.resets):
            if callable(r.time):
                checks.append((f"resets[{i}].time(p)", r.time, (dict(p),), ((), (1,))))
        for label, fn, args, shapes in checks:
            try:
                out = jax.eval_shape(fn, *args)
            except Exception as err:  # noqa: BLE001 (the user's function)
                raise ValueError(
                    f"Experiment {e.id!r}: {label} failed when traced with p a dict of the model parameters: "
                    f"{type(err).__name__}: {err}"
                ) from err
            shape = getattr(out, "shape", None)
            if shapes is None:
                if shape is None or len(shape) != 1:
                    raise ValueError(f"Experiment {e.id!r}: {label} must return a 1-D array of times, got shape {shape}.")
            elif shape not in shapes:
                raise ValueError(f"Experiment {e.id!r}: {label} must return shape {' or '.join(map(str, shapes))}, "
                                 f"got {shape}.")  # fmt: skip

    def _observable_count(self, e: Experiment) -> int:
        prob = self.problem
        if e.observables is None:
            return prob.n_states
        # Experiments sharing an observables function (and its parameters' names) trace it once.
        key = (e.observables, e.observables_take_time, tuple(sorted(e.observable_parameters)))
        cache = self.__dict__.setdefault("_observable_counts", {})
        if key not in cache:
            cache[key] = self._traced_observable_count(e)
        return cache[key]

    def _traced_observable_count(self, e: Experiment) -> int:
        prob = self.problem
        import jax
        import jax.numpy as jnp

        y = jnp.ones((prob.n_states,), prob.dtype)
        p = {k: jnp.ones((), prob.dtype) for k in prob.parameter_names}
        p.update({k: jnp.ones((), prob.dtype) for k in e.observable_parameters})
        form = "observables(t, y, p)" if e.observables_take_time else "observables(y, p)"
        args = (jnp.ones((), prob.dtype), y, p) if e.observables_take_time else (y, p)
        try:
            out = jax.eval_shape(e.observables, *args)
        except Exception as err:  # noqa: BLE001 (the user's function)
            raise ValueError(
                f"Experiment {e.id!r}: {form} failed when traced with y of shape ({prob.n_states},) and p a "
                f"dict of the model parameters{' and observable parameters' if e.observable_parameters else ''}: "
                f"{type(err).__name__}: {err}"
            ) from err
        shape = getattr(out, "shape", None)
        if shape is None or len(shape) != 1:
            raise ValueError(f"Experiment {e.id!r}: observables must return a 1-D array (k,), got shape {shape}.")
        return int(shape[0])

    # -- use ------------------------------------------------------------------------------------
    def replace(self, *, experiments: Sequence[Experiment]) -> "Study":
        """The same study with other experiments (e.g. reordered); views of this study's arrays
        (``study.experiments[i]``) stay arrays."""
        if self.arrays is not None and not isinstance(experiments, ExperimentArrays):
            sources = [getattr(e, "_array_source", (None, None)) for e in experiments]
            if sources and all(a is self.arrays for a, _ in sources):
                experiments = self.arrays.take([i for _, i in sources])
        return Study(self.problem, experiments, self.parameters, levels=self.levels)

    def nominal_values(self) -> np.ndarray:
        """Linear-scale nominal value of every entry."""
        return np.array([e.parameter.nominal for e in self.entries], dtype=np.float64)

    def __len__(self) -> int:
        return len(self.experiments)

    def __repr__(self) -> str:
        return (
            f"Study({self.problem.spec.name!r}, experiments={len(self.experiments)}, "
            f"parameters={len(self.entries)}, levels={self.levels})"
        )


def problem_of(problem: Any) -> Any:
    """A built ``ds.Problem`` of a problem, spec or reaction network."""
    from ...model import Problem, ProblemSpec, ReactionNetwork

    if isinstance(problem, ReactionNetwork):
        problem = problem.to_spec()
    if isinstance(problem, ProblemSpec):
        problem = problem.build()
    if not isinstance(problem, Problem):
        raise TypeError(f"Study: problem must be a ds.Problem (spec.build()), not {type(problem).__name__}.")
    return problem


class _LazyResolved(Mapping):
    """``study.resolved`` of a study held as arrays: an experiment's resolution, computed from its
    view when asked for (lowering reads ``study.array_plan`` instead)."""

    def __init__(self, study: Study):
        self._study = study

    def __getitem__(self, experiment_id: str) -> dict:
        i = self._study.index_of(experiment_id)
        if i is None:
            raise KeyError(experiment_id)
        return self._study._resolve(self._study.experiments[i])

    def __iter__(self):
        return iter(self._study.ids)

    def __len__(self) -> int:
        return len(self._study.experiments)


def entries_by_name(study: Study, values: Mapping[str, float] | None) -> np.ndarray:
    """Linear-scale values of all entries: nominal, overridden by ``values`` (entry or base names)."""
    out = study.nominal_values()
    for k, v in (values or {}).items():
        if k in study.entry_index:
            out[study.entry_index[k]] = float(v)
        elif k in study.table:
            for i, e in enumerate(study.entries):
                if e.parameter.name == k:
                    out[i] = float(v)
        else:
            raise ValueError(f"unknown study parameter {k!r}; entries are {list(study.entry_names)[:20]}.")
    return out
