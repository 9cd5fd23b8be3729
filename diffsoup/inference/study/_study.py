"""``ds.Study``: experiments, the parameter table and the levels (clusters) that own parameters."""

from __future__ import annotations

import collections
from typing import Any, Mapping, Sequence

import numpy as np

from ...model import Problem, ProblemSpec, ReactionNetwork
from ._array_plan import check_levels, resolve_arrays
from ._experiment import Experiment
from ._experiment_arrays import ExperimentArrays, ExperimentViews, experiment_arrays
from ._experiment_resolution import check_experiment_levels, check_functions, observable_count, resolve_experiment
from ._noise import Gaussian
from ._parameter import EXPERIMENT_LEVEL, SCALES, Entry, Parameter, ParameterError  # noqa: F401 (re-exported)
from ._row_index import row_index_of_arrays, row_index_of_experiments
from ._study_table import study_arrays_of_table


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
            come from (the vectorized ``resolved``). Only construction and the objective's
            reader of rows (``objective._study_rows``, which packs either kind of study into the
            same blocks of arrays, once per problem) look at it.
        rows: what the study knows of its rows whichever way it holds them (a ``RowIndex``: ids,
            padded times with an experiment axis, counts, level members, multiple-shooting rows);
            ``ids``, ``n_measured``, ``n_observables``, ``shooting``, :meth:`times_of`,
            :meth:`members`, :meth:`index_of` and :meth:`shape_examples` read it.
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
            check_experiment_levels(self)
            self.rows = row_index_of_experiments(self.experiments, self.levels)
        else:
            check_levels(self.arrays, self.levels)
            self.rows = row_index_of_arrays(self.arrays)
        self.table = {p.name: p for p in self.parameters}
        self.entries = self._expand()
        self.entry_names = tuple(e.name for e in self.entries)
        self.entry_index = {n: i for i, n in enumerate(self.entry_names)}
        if self.arrays is None:
            self.array_plan = None
            self.resolved = {e.id: resolve_experiment(self, e) for e in self.experiments}
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
        problem = problem_of(problem)
        arrays, levels = study_arrays_of_table(problem, table, **options)
        return cls(problem, arrays, parameters, levels=levels)

    @property
    def ids(self) -> tuple:
        """The experiment ids in study order."""
        return self.rows.ids

    @property
    def n_measured(self) -> int:
        """The measured (finite) values of all experiments."""
        return self.rows.n_measured

    @property
    def n_observables(self) -> int:
        """The most observables an experiment of the study has (``k`` of a study held as arrays)."""
        return self.rows.n_observables

    @property
    def shooting(self) -> tuple:
        """The study indices of the experiments solved by multiple shooting (a ``Multishoot``)."""
        return self.rows.shooting

    def times_of(self, i: int) -> np.ndarray:
        """The measurement times of experiment ``i`` (a study index)."""
        return self.rows.times_of(i)

    def shape_examples(self) -> tuple:
        """One experiment of each distinct shape (observables, noise): what holds for it holds for
        the experiments of its shape (every experiment of a study of objects; the first of a study
        held as arrays)."""
        return tuple(self.experiments[i] for i in self.rows.shape_examples)

    def index_of(self, experiment_id: str) -> int | None:
        """The study index of an experiment id (None if unknown)."""
        if getattr(self, "_id_index", None) is None:
            self._id_index = {eid: i for i, eid in enumerate(self.rows.ids)}
        return self._id_index.get(experiment_id)

    def _check_array_functions(self) -> None:
        """Trace the shared observables and callables once (the count of observables, shapes)."""
        view = self.arrays.experiment(0)
        k = observable_count(self, view)
        if k != self.arrays.shape[2]:
            raise ValueError(
                f"Study: data has {self.arrays.shape[2]} observable column(s); the observables give {k} value(s) per "
                f"time, so data must be (experiments, times, {k})."
            )  # fmt: skip
        plan = tuple((name, None) for name in sorted(self.arrays.observable_parameters))
        check_functions(self, view, {"k": k, "y0_function": self.arrays.y0_function, "pre": None,
                                     "observable_plan": plan})  # fmt: skip

    def members(self, level: str) -> tuple[str, ...]:
        """Members of a level (or the experiment ids for ``"experiment"``), in order of first appearance."""
        if level == EXPERIMENT_LEVEL:
            return self.ids
        if level not in self.levels:
            raise ValueError(f"Study: unknown level {level!r}; levels are {self.levels}.")
        return self.rows.members[level]

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
        return resolve_experiment(self._study, self._study.experiments[i])

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