"""How an ``InferenceProblem`` reads the rows (experiments) of its study: the one place that knows
how the study holds them.

A study holds its experiments as arrays with a leading experiment axis (``Study.from_arrays``,
``Study.from_table``: one shape, one group, lanes packed by fancy indexing) or as ``Experiment``
objects (``Study(problem, experiments, ...)``: experiments grouped by what their compiled term
needs, lanes packed one at a time). :func:`study_rows` picks the reader; both offer the same
methods, so the rest of the objective never asks which one it has:

- :meth:`groups`: the groups of experiments that share a compiled term (:class:`Group`);
- :meth:`constants`: per experiment the ``nll`` terms no parameter changes, and
  :meth:`dynamic_cells`: per experiment the measured values whose spread is a parameter or a function;
- :meth:`sigma_entries` / :attr:`has_sigma_functions`: the entries that are spreads;
- :meth:`pack`: the :class:`LaneInputs` of a chunk's lanes;
- :meth:`solve_entries`: the entries (and window starts) that reach the solves of a group.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Sequence

import numpy as np

from ...integrate import SteadyState
from ..study._multishoot import trajectory_signature, window_layout
from ..study._noise_constants import dynamic_cells, term_constants
from ._lane_inputs import LaneInputs, pack_arrays, pack_experiments
from ._same_functions import WARN_FUNCTION_GROUPS, ProgramGroupsWarning, SameFunctions, describe, erased
from ._terms import SIGMA_CELLS, SIGMA_ENTRY, SIGMA_FIXED, Group, Preequilibrated


def steady_state_key(test):
    """The ``SteadyState`` test (None: its defaults), hashable (per-state ``atol`` as a tuple): it
    is part of a group's key."""
    if test is None:
        return SteadyState()
    atol = test.atol
    if atol is not None and np.ndim(atol) > 0:
        test = dataclasses.replace(test, atol=tuple(float(x) for x in np.ravel(atol)))
    return test


def study_rows(study: Any, objective: str) -> "ArrayRows | ExperimentRows":
    """The reader of ``study``'s rows for an objective (``"nll"`` or ``"chi2"``)."""
    return ArrayRows(study, objective) if study.arrays is not None else ExperimentRows(study, objective)


class ArrayRows:
    """The rows of a study held as arrays: one group; numbers read by indexing the arrays."""

    def __init__(self, study: Any, objective: str):
        self.study = study
        arrays = study.arrays
        self._constants = np.zeros(len(arrays)) if objective == "chi2" else \
            term_constants(arrays.data, arrays.sigma, arrays.noise_columns)  # fmt: skip
        self._dynamic = dynamic_cells(arrays)
        self.differing_functions: dict = {}

    def sigma_entries(self) -> set:
        plan = self.study.array_plan
        out = {int(i) for i in np.unique(plan.sigma_entry) if i >= 0}
        if plan.sigma_cells is not None:
            out |= {int(i) for i in np.unique(plan.sigma_cells) if i >= 0}
        return out

    @property
    def has_sigma_functions(self) -> bool:
        return any(f is not None for f in self.study.arrays.sigma_functions)

    def constants(self, members) -> float:
        return float(np.sum(self._constants[np.asarray(members, dtype=np.int64)]))

    def dynamic_cells(self, members) -> float:
        return float(np.sum(self._dynamic[np.asarray(members, dtype=np.int64)]))

    def groups(self) -> tuple[Group, ...]:
        """The one group of a study held as arrays (one shape: observables, noise, spreads)."""
        arrays = self.study.arrays
        E, m, k = arrays.shape
        functions = arrays.sigma_functions if any(f is not None for f in arrays.sigma_functions) else ()
        steady = steady_state_key(None) if np.isposinf(arrays.times[:, -1]).any() else None
        if arrays.sigma_name is not None:
            sigma = SIGMA_ENTRY
        else:
            sigma = SIGMA_CELLS if arrays.sigma_names is not None else SIGMA_FIXED
        discs = arrays.discontinuities
        return (Group(
            arrays.observables, tuple(c.kind for c in arrays.noise_columns), sigma, k, m, range(E),
            observables_take_time=arrays.observables_take_time, sigma_functions=functions, steady_state=steady,
            observable_parameters=tuple(sorted(arrays.observable_parameters)), y0_function=arrays.y0_function,
            resets=tuple((x.time if callable(x.time) else None, x.apply) for x in arrays.resets),
            discontinuities=discs if callable(discs) else len(discs),
        ),)  # fmt: skip

    def pack(self, group: Group, order: Sequence[int], window_offset: dict) -> LaneInputs:
        return pack_arrays(self.study, group, order, self._constants)

    def solve_entries(self, group: Group, window_offset: dict) -> tuple[set, list]:
        entries: set = set()
        for entry, _ in self.study.array_plan.columns:
            entries.update(int(i) for i in np.asarray(np.unique(entry)).reshape(-1) if i >= 0)
        return entries, []


def _dynamic_cells(e) -> int:
    """Measured values of ``e`` whose spread comes from a parameter or a function."""
    mask = np.isfinite(e.data)
    named = np.vectorize(lambda c: c is not None, otypes=[bool])(e.sigma_names) if e.sigma_names.size else mask
    functional = np.array([f is not None for f in e.sigma_functions])[None, :]
    return int(np.sum(mask & (named | functional)))


class ExperimentRows:
    """The rows of a study of ``Experiment`` objects: experiments grouped by what their compiled
    term needs (everything but numbers); numbers read from each experiment's resolution."""

    def __init__(self, study: Any, objective: str):
        self.study = study
        exps = study.experiments
        self._constants = [0.0 if objective == "chi2" else _constant(e) for e in exps]
        self._dynamic = [_dynamic_cells(e) for e in exps]
        self.differing_functions: dict = {}

    def sigma_entries(self) -> set:
        study = self.study
        return {int(i) for r in study.resolved.values() for i in np.unique(r["sigma_entries"]) if i >= 0}

    @property
    def has_sigma_functions(self) -> bool:
        return any(f is not None for e in self.study.experiments for f in e.sigma_functions)

    def constants(self, members) -> float:
        return float(sum(self._constants[i] for i in members))

    def dynamic_cells(self, members) -> float:
        return sum(self._dynamic[i] for i in members)

    def _signature(self, e, r, same) -> tuple:
        """What makes experiments share a group (a compiled term): everything but numbers.

        ``same(f, kind)`` stands for each function: its representative among the equivalent ones
        (:class:`SameFunctions`), or ``erased`` (what the groups would be with shared functions)."""
        if r["sigma_entry"] >= 0:
            sigma = SIGMA_ENTRY
        elif np.any(r["sigma_entries"] >= 0):
            sigma = SIGMA_CELLS
        else:
            sigma = SIGMA_FIXED
        functions = tuple(same(f, "sigma") for f in e.sigma_functions) if any(f is not None for f in e.sigma_functions) else ()
        pre = None
        if e.preequilibration is not None:
            pr = r["pre"]
            pre = Preequilibrated(same(pr["y0_function"], "preequilibration y0"), bool(np.any(pr["y0_entry"] >= 0)),
                                  steady_state_key(e.preequilibration.steady_state))  # fmt: skip
        return (
            same(e.observables, "observable"), e.observables_take_time,
            tuple(name for name, _ in r["observable_plan"]), tuple(c.kind for c in e.noise_columns), sigma,
            functions, r["k"], trajectory_signature(e.trajectory), same(r["y0_function"], "y0"),
            bool(np.any(r["y0_entry"] >= 0)), pre,
            tuple((same(x.time, "reset time") if callable(x.time) else None, same(x.apply, "reset"))
                  for x in e.resets),
            same(e.discontinuities, "discontinuities") if callable(e.discontinuities) else bool(e.discontinuities),
            steady_state_key(e.steady_state) if e.n_steady_times else None,
        )  # fmt: skip

    def groups(self) -> tuple[Group, ...]:
        """The experiments grouped by signature (warns, as ``ProgramGroupsWarning``, when equal
        functions defined apart split them into many groups; call it from ``InferenceProblem``)."""
        study = self.study
        keys, same = {}, SameFunctions()
        for i, e in enumerate(study.experiments):
            keys.setdefault(self._signature(e, study.resolved[e.id], same), []).append(i)
            same.experiment_done()
        self.differing_functions = differing = same.differing()  # kind -> (experiments, distinct functions)
        if differing and len(keys) > WARN_FUNCTION_GROUPS:
            shared = {self._signature(e, study.resolved[e.id], erased) for e in study.experiments}
            if len(keys) > len(shared):
                warnings.warn(
                    f"{describe(differing)}: each group compiles its own program ({len(keys)} groups, "
                    f"{len(shared)} with shared functions); define the function once.",
                    ProgramGroupsWarning, stacklevel=4,
                )  # fmt: skip
        out = []
        n = study.problem.n_states
        for key, members in keys.items():
            (observables, take_time, op_names, noise, sigma, functions, k, (windows,), y0_function, y0_entries, pre,
             resets, discs, steady) = key  # fmt: skip
            exps = [study.experiments[i] for i in members]
            points = max(window_layout(e, e.trajectory)[3].shape[1] for e in exps) if windows else 0
            if discs is True:  # numbers: padded with +inf (none) to the group's most
                discs = max(len(e.discontinuities) for e in exps)
            out.append(Group(
                observables, noise, sigma, k, max(e.times.shape[0] for e in exps), tuple(members), windows,
                points, n if windows else 0, observables_take_time=take_time, observable_parameters=op_names,
                sigma_functions=functions, y0_function=y0_function, y0_entries=y0_entries, preequilibration=pre,
                resets=resets, discontinuities=discs, steady_state=steady,
            ))  # fmt: skip
        return tuple(out)

    def pack(self, group: Group, order: Sequence[int], window_offset: dict) -> LaneInputs:
        return pack_experiments(self.study, group, order, self._constants, window_offset)

    def solve_entries(self, group: Group, window_offset: dict) -> tuple[set, list]:
        study = self.study
        entries: set = set()

        def add(plan):
            entries.update(int(v) for kind, v in plan if kind == "entry")

        def add_states(entry):
            if entry is not None:
                entries.update(int(i) for i in np.asarray(entry).reshape(-1) if i >= 0)

        windows: list = []
        n = study.problem.n_states
        for i in group.members:
            e = study.experiments[i]
            r = study.resolved[e.id]
            add(r["plan"])
            add_states(r["y0_entry"])
            if r["pre"] is not None:
                add(r["pre"]["plan"])
                add_states(r["pre"]["y0_entry"])
            if e.id in window_offset:
                o = window_offset[e.id]
                windows.extend(range(o, o + (e.trajectory.n_windows - 1) * n))
        return entries, windows


def _constant(e) -> float:
    """The experiment's ``nll`` terms that no parameter changes (``log 2 pi``, known spreads, data)."""
    sigma = e.sigma if e.sigma is not None else e.sigma_values
    return float(term_constants(e.data[None], sigma[None], e.noise_columns)[0])
