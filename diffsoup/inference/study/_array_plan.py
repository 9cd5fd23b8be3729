"""Where a study held as arrays takes its numbers: :func:`resolve_arrays` (the vectorized
``resolve_experiment``) and :func:`check_levels` (the vectorized ``check_experiment_levels``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ._experiment_arrays import ExperimentArrays, _label


@dataclasses.dataclass(frozen=True, eq=False)
class ArrayPlan:
    """Where a study of arrays takes its numbers: per model parameter ``(entry, fixed)``, each a
    number or an ``(E,)`` array (entry -1: ``fixed``); ``sigma_entry`` (a number, an ``(E,)``
    array, or -1); ``k`` observables; per observable parameter (sorted by name) ``(entry,
    fixed)``; ``sigma_cells``: the entries of named spreads broadcastable to ``(E, m, k)`` (-1:
    not named), or None."""

    columns: tuple
    sigma_entry: Any
    k: int
    observable_columns: tuple = ()
    sigma_cells: Any = None


def entry_rows(study: Any, name: str) -> Any:
    """The entry of study parameter ``name`` for every row: an index, or ``(E,)`` indices (a
    parameter owned by a level)."""
    arrays = study.arrays
    p = study.table[name]
    if p.level is None:
        return study.entry_index[name]
    start = study.entry_index[f"{name}[{study.members(p.level)[0]}]"]
    if p.level == "experiment":
        return start + np.arange(len(arrays), dtype=np.int64)
    return start + arrays.groups[p.level][0].astype(np.int64)


def name_entries(study: Any, names: np.ndarray, field: str) -> np.ndarray:
    """The entries of study parameters' names, an array whose first axis is the experiments' (or
    1, or a 0-d array): -1 where the name is ``""``; a parameter owned by a level takes each row's.

    Raises:
        ValueError: naming the experiment and ``field``, for a name that is not a study parameter.
    """
    arrays = study.arrays
    E = len(arrays)
    names = np.asarray(names)
    uniq, inverse = np.unique(names, return_inverse=True)
    inverse = inverse.reshape(names.shape)
    lookup = np.full(uniq.size, -1, dtype=np.int64)
    owned = []
    for code, name in enumerate(uniq.tolist()):
        if not name:
            continue
        if name not in study.table:
            hit = np.argwhere(np.atleast_1d(inverse == code))[0]
            i = int(hit[0]) if names.ndim and names.shape[0] == E else 0
            raise ValueError(f"{_label('Study', arrays.ids, i)}: {field} names {name!r}, which is not a study "
                             "parameter; add it to the parameter table.")  # fmt: skip
        if study.table[name].level is None:
            lookup[code] = study.entry_index[name]
        else:
            owned.append(code)
    out = lookup[inverse]
    if owned:  # per-row entries: the names' rows become the experiments'
        shape = (E,) + names.shape[1:] if names.ndim else (E,)
        out, inverse = np.array(np.broadcast_to(out, shape)), np.broadcast_to(inverse, shape)
        for code in owned:
            rows = np.asarray(entry_rows(study, str(uniq[code]))).reshape((E,) + (1,) * (len(shape) - 1))
            out = np.where(inverse == code, np.broadcast_to(rows, shape), out)
    return out


def resolve_arrays(study: Any) -> ArrayPlan:
    """The :class:`ArrayPlan` of ``study.arrays`` (the vectorized ``resolve_experiment``)."""
    arrays, prob = study.arrays, study.problem
    who = "Study"
    defaults = prob.spec.parameter_defaults
    columns = []
    for j, name in enumerate(prob.parameter_names):
        cond = arrays.conditions.get(name)
        if name in study.table:
            entry, fixed = entry_rows(study, name), 0.0
        elif defaults is not None:
            entry, fixed = -1, float(defaults[j])
        else:
            entry, fixed = None, None
        if cond is None:
            if entry is None:
                raise ValueError(f"{who}: model parameter {name!r} has no value: give it in conditions, or add a study "
                                 "parameter of that name.")  # fmt: skip
            columns.append((entry, fixed))
            continue
        given = ~np.isnan(cond)
        named = np.zeros((), bool)
        if name in arrays.parameters:
            mapped = name_entries(study, arrays.parameters[name], f"conditions[{name!r}]")
            named = mapped >= 0
        if entry is None:
            missing = ~(given | named)
            if missing.any():
                i = int(np.argmax(np.reshape(missing, -1))) if np.ndim(missing) else 0
                raise ValueError(f"{_label(who, arrays.ids, i)}: model parameter {name!r} has no value: its conditions "
                                 "value is NaN; give it, or add a study parameter of that name.")  # fmt: skip
            entry, fixed = -1, 0.0
        if not np.any(named) and np.all(given):
            entry, fixed = -1, cond
        else:
            entry = np.where(given, -1, entry)
            fixed = np.where(given, cond, fixed)
            if np.any(named):
                entry = np.where(named, mapped, entry)
                fixed = np.where(named, 0.0, fixed)
        columns.append((entry, fixed))
    observable_columns = []
    for name in sorted(arrays.observable_parameters):
        values, names = arrays.observable_parameters[name]
        if names is None:
            observable_columns.append((-1, values))
            continue
        mapped = name_entries(study, names, f"observable_parameters[{name!r}]")
        observable_columns.append((mapped, np.where(mapped >= 0, 0.0, values)))
    sigma_entry = -1
    if arrays.sigma_name is not None:
        name = arrays.sigma_name
        if name not in study.table:
            raise ValueError(f"{who}: noise.sigma names {name!r}, which is not a study parameter; add it to the "
                             "parameter table.")  # fmt: skip
        if study.table[name].lower <= 0:
            raise ValueError(f"{who}: noise.sigma is study parameter {name!r}, whose lower bound "
                             f"{study.table[name].lower} must be positive.")  # fmt: skip
        sigma_entry = entry_rows(study, name)
    sigma_cells = None
    if arrays.sigma_names is not None:
        sigma_cells = name_entries(study, arrays.sigma_names, "noise (a spread)")
        for name in np.unique(arrays.sigma_names).tolist():
            if name and study.table[name].lower <= 0:
                raise ValueError(f"{who}: a spread is study parameter {name!r}, whose lower bound "
                                 f"{study.table[name].lower} must be positive.")  # fmt: skip
    return ArrayPlan(tuple(columns), sigma_entry, arrays.shape[2], tuple(observable_columns), sigma_cells)


def check_levels(arrays: ExperimentArrays, levels: tuple) -> None:
    """Every level has a member per row, and each member of an inner level belongs to one member of
    every outer level (the vectorized ``check_experiment_levels``)."""
    missing = [lv for lv in levels if lv not in arrays.groups]
    if missing:
        raise ValueError(f"Study: groups has no members for level(s) {missing}; give groups={{level: names}}.")
    extra = [lv for lv in arrays.groups if lv not in levels]
    if extra:
        raise ValueError(f"Study: groups names unknown level(s) {extra}; levels are {levels}.")
    for depth, lv in enumerate(levels):
        codes, members = arrays.groups[lv]
        first = np.full(len(members), -1, dtype=np.int64)
        first[codes[::-1]] = np.arange(codes.size)[::-1]  # each member's first row
        for outer in levels[:depth]:
            oc, om = arrays.groups[outer]
            bad = oc != oc[first[codes]]
            if bad.any():
                i = int(np.argmax(bad))
                raise ValueError(f"{_label('Study', arrays.ids, i)}: groups: member {members[codes[i]]!r} of level "
                                 f"{lv!r} belongs to {om[oc[first[codes[i]]]]!r} of {outer!r} elsewhere and to "
                                 f"{om[oc[i]]!r} here; a member belongs to one outer member.")  # fmt: skip
