"""The rows (experiments) of a study as the objective reads them: per group, one block of arrays
with a leading experiment axis.

A study holds its experiments as arrays (``Study.from_arrays``, ``Study.from_table``: one shape,
one group) or as ``Experiment`` objects (``Study(problem, experiments, ...)``: experiments
grouped by what their compiled term needs). That difference ends here, once per problem:
:func:`study_rows` groups the rows (:class:`Group`) and gives each group a :class:`RowBlock`,
arrays with an experiment axis that chunks take their lanes from. The objects of a group are
packed once into one :class:`LaneInputs` with a row per member (:class:`PackedRows`); a study
held as arrays already is one (:class:`ArrayRowsBlock`: its arrays, gathered per chunk, so that a
study of a million rows is not copied). Everything after reads the blocks alone (:class:`RowBlocks`):

- :attr:`RowBlocks.groups`: the groups of experiments that share a compiled term;
- :meth:`RowBlocks.pack`: a chunk's :class:`LaneInputs`, rows taken from the blocks (padding lanes
  added), the same numbers for both kinds of study;
- :meth:`RowBlocks.constants` / :meth:`RowBlocks.dynamic_cells`: per experiment the ``nll`` terms
  no parameter changes and the measured values whose spread is a parameter or a function;
- :meth:`RowBlocks.sigma_entries`, :attr:`RowBlocks.has_sigma_functions`: the entries that are
  spreads; :meth:`RowBlocks.solve_entries`: the entries (and window starts) that reach a group's solves.
"""

from __future__ import annotations

import abc
import dataclasses
import warnings
from typing import Any, Sequence

import numpy as np

from ...integrate import SteadyState
from ..study._multishoot import trajectory_signature, window_layout
from ..study._noise_constants import dynamic_cells, term_constants
from ._lane_inputs import LaneInputs, pack_arrays, pack_experiments
from ._same_functions import WARN_FUNCTION_GROUPS, ProgramGroupsWarning, SameFunctions, describe, erased
from ._terms import SIGMA_CELLS, SIGMA_ENTRY, SIGMA_FIXED, Group, Preequilibrated, member_array


def steady_state_key(test):
    """The ``SteadyState`` test (None: its defaults), hashable (per-state ``atol`` as a tuple): it
    is part of a group's key."""
    if test is None:
        return SteadyState()
    atol = test.atol
    if atol is not None and np.ndim(atol) > 0:
        test = dataclasses.replace(test, atol=tuple(float(x) for x in np.ravel(atol)))
    return test


class RowBlock(abc.ABC):
    """The rows of one group: arrays with a leading experiment axis, in ``group.members`` order.

    Attributes:
        group: the :class:`Group`.
    """

    group: Group

    @abc.abstractmethod
    def take(self, order: np.ndarray) -> LaneInputs:
        """The :class:`LaneInputs` of the study indices ``order`` (members of the group; -1: a
        padding lane, which repeats the group's first member, is not valid, measures nothing and
        adds nothing)."""

    def entries(self, field: str) -> set:
        """The study entries (``theta`` indices for ``win_idx``) that the :class:`LaneInputs`
        field ``field`` (``p_entry``, ``sigma_entries``, ...) holds over all rows; none for a
        field the group does not read (``sigma_entry`` outside spreads of ``"entry"``,
        ``sigma_entries`` outside ``"cells"``)."""
        if (field == "sigma_entry" and self.group.sigma != SIGMA_ENTRY) or \
                (field == "sigma_entries" and self.group.sigma != SIGMA_CELLS):  # fmt: skip
            return set()
        return {int(i) for x in self._values(field) for i in np.unique(np.asarray(x)) if i >= 0}

    @abc.abstractmethod
    def _values(self, field: str) -> list:
        """Arrays holding the values of ``field`` over all rows (empty: the group has none)."""


class PackedRows(RowBlock):
    """A group of ``Experiment`` objects packed once, lane by lane, into one :class:`LaneInputs`
    with a row per member; a chunk's lanes are taken from it by indexing."""

    def __init__(self, study: Any, group: Group, constants: np.ndarray, window_offset: dict):
        self.group = group
        members = member_array(group.members)
        self.rows = pack_experiments(study, group, members, constants, window_offset)
        self._position = {int(i): row for row, i in enumerate(members.tolist())}

    def take(self, order: np.ndarray) -> LaneInputs:
        real = order >= 0
        take = np.array([self._position[int(i)] if i >= 0 else 0 for i in order.tolist()], dtype=np.int64)
        a = LaneInputs(*(None if x is None else x[take] for x in self.rows))
        a.mask[~real] = False
        a.data[~real] = 1.0
        a.const[~real] = 0.0
        a.valid[:] = real
        return a

    def _values(self, field: str) -> list:
        values = getattr(self.rows, field)
        return [] if values is None else [values]


class ArrayRowsBlock(RowBlock):
    """The one group of a study held as arrays: its rows are the study's arrays, gathered for a
    chunk by fancy indexing (``pack_arrays``); nothing is copied for the whole study."""

    def __init__(self, study: Any, group: Group, constants: np.ndarray):
        self.group, self._study, self._constants = group, study, constants

    def take(self, order: np.ndarray) -> LaneInputs:
        return pack_arrays(self._study, self.group, order, self._constants)

    def _values(self, field: str) -> list:
        plan = self._study.array_plan
        sources = {
            "p_entry": [entry for entry, _ in plan.columns],
            "op_entry": [entry for entry, _ in plan.observable_columns],
            "sigma_entry": [plan.sigma_entry],
            "sigma_entries": [] if plan.sigma_cells is None else [plan.sigma_cells],
        }  # the other fields' features (initial-state names, pre-equilibration, windows) arrays do not hold
        return sources.get(field, [])


class RowBlocks:
    """The rows of a study as the objective reads them: a :class:`RowBlock` per group, and per
    experiment (study order) its constant ``nll`` terms and its count of dynamic cells.

    Attributes:
        groups: the groups (:class:`Group`), in the order of ``blocks``.
        blocks: their :class:`RowBlock`.
        differing_functions: kind -> (experiments, distinct functions) of functions that split
            groups (``InferenceProblem.differing_functions``).
    """

    def __init__(self, blocks: Sequence[RowBlock], constants: np.ndarray, dynamic: np.ndarray,
                 differing_functions: dict):  # fmt: skip
        self.blocks = tuple(blocks)
        self.groups = tuple(b.group for b in self.blocks)
        self.differing_functions = differing_functions
        self._constants = np.asarray(constants, dtype=np.float64)
        self._dynamic = np.asarray(dynamic, dtype=np.int64)
        self._block_of = {id(b.group): b for b in self.blocks}

    def block(self, group: Group) -> RowBlock:
        return self._block_of[id(group)]

    def constants(self, members) -> float:
        return float(np.sum(self._constants[np.asarray(members, dtype=np.int64)]))

    def dynamic_cells(self, members) -> float:
        return float(np.sum(self._dynamic[np.asarray(members, dtype=np.int64)]))

    def sigma_entries(self) -> set:
        """The study entries that are spreads (of a group's one named spread, or of its cells)."""
        out: set = set()
        for b in self.blocks:
            if b.group.sigma == SIGMA_ENTRY:
                out |= b.entries("sigma_entry")
            elif b.group.sigma == SIGMA_CELLS:
                out |= b.entries("sigma_entries")
        return out

    @property
    def has_sigma_functions(self) -> bool:
        return any(g.sigma_functions for g in self.groups)

    def pack(self, group: Group, order: Sequence[int]) -> LaneInputs:
        """The :class:`LaneInputs` of the experiments ``order`` (study indices of ``group``'s
        members; -1: a padding lane)."""
        return self.block(group).take(np.asarray(order, dtype=np.int64))

    def solve_entries(self, group: Group) -> tuple[set, list]:
        """The entries the group's solves read (model parameters, initial states,
        pre-equilibration), and the ``theta`` indices of its window starts."""
        b = self.block(group)
        entries = set().union(*(b.entries(f) for f in ("p_entry", "y0_entry", "pre_entry", "pre_y0_entry")))
        return entries, sorted(b.entries("win_idx"))


def study_rows(study: Any, objective: str, window_offset: dict) -> RowBlocks:
    """The rows of ``study`` for an objective (``"nll"`` or ``"chi2"``), grouped, a :class:`RowBlock`
    per group (``window_offset``: experiment id -> its first window start in ``theta``)."""
    E = len(study.experiments)
    if study.arrays is not None:
        arrays = study.arrays
        constants = np.zeros(E) if objective == "chi2" else \
            term_constants(arrays.data, arrays.sigma, arrays.noise_columns)  # fmt: skip
        (group,) = _array_groups(study)
        return RowBlocks([ArrayRowsBlock(study, group, constants)], constants, dynamic_cells(arrays), {})
    exps = study.experiments
    constants = np.array([0.0 if objective == "chi2" else _constant(e) for e in exps], dtype=np.float64)
    dynamic = np.array([_dynamic_cells(e) for e in exps], dtype=np.int64)
    groups, differing = _experiment_groups(study)
    return RowBlocks([PackedRows(study, g, constants, window_offset) for g in groups], constants, dynamic, differing)


def _array_groups(study: Any) -> tuple[Group]:
    """The one group of a study held as arrays (one shape: observables, noise, spreads)."""
    arrays = study.arrays
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


def _dynamic_cells(e) -> int:
    """Measured values of ``e`` whose spread comes from a parameter or a function."""
    mask = np.isfinite(e.data)
    named = np.vectorize(lambda c: c is not None, otypes=[bool])(e.sigma_names) if e.sigma_names.size else mask
    functional = np.array([f is not None for f in e.sigma_functions])[None, :]
    return int(np.sum(mask & (named | functional)))


def _signature(e, r, same) -> tuple:
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


def _experiment_groups(study: Any) -> tuple[tuple[Group, ...], dict]:
    """The experiments of a study of objects grouped by signature, and the functions that split
    groups (warns, as ``ProgramGroupsWarning``, when equal functions defined apart split them into
    many groups; called by :func:`study_rows` from ``InferenceProblem``)."""
    keys, same = {}, SameFunctions()
    for i, e in enumerate(study.experiments):
        keys.setdefault(_signature(e, study.resolved[e.id], same), []).append(i)
        same.experiment_done()
    differing = same.differing()  # kind -> (experiments, distinct functions)
    if differing and len(keys) > WARN_FUNCTION_GROUPS:
        shared = {_signature(e, study.resolved[e.id], erased) for e in study.experiments}
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
    return tuple(out), differing


def _constant(e) -> float:
    """The experiment's ``nll`` terms that no parameter changes (``log 2 pi``, known spreads, data)."""
    sigma = e.sigma if e.sigma is not None else e.sigma_values
    return float(term_constants(e.data[None], sigma[None], e.noise_columns)[0])
