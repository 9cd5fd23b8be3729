"""How an ``Experiment``'s numbers come from a study's entries (``Study.resolved``), with the checks
that name the experiment and the field: :func:`resolve_experiment` (model parameters, initial
states, observable parameters, spreads, pre-equilibration), :func:`check_functions` (the user's
callables traced once for their shapes), :func:`observable_count` and
:func:`check_experiment_levels`. The vectorized versions for experiments held as arrays are in
:mod:`._array_plan`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._experiment import Experiment


def check_experiment_levels(study) -> None:
    """Every experiment names a member of every level of the study, and each member of an inner level
    belongs to one member of every outer level."""
    parent: dict[tuple[str, str], tuple] = {}
    for e in study.experiments:
        missing = [lv for lv in study.levels if lv not in e.groups]
        if missing:
            raise ValueError(f"Experiment {e.id!r}: groups has no member for level(s) {missing}.")
        extra = [lv for lv in e.groups if lv not in study.levels]
        if extra:
            raise ValueError(f"Experiment {e.id!r}: groups names unknown level(s) {extra}; levels are {study.levels}.")
        for i, lv in enumerate(study.levels):
            outer = tuple(e.groups[o] for o in study.levels[:i])
            key = (lv, e.groups[lv])
            if parent.setdefault(key, outer) != outer:
                raise ValueError(
                    f"Experiment {e.id!r}: groups: member {e.groups[lv]!r} of level {lv!r} belongs to "
                    f"{parent[key]} elsewhere and to {outer} here; a member belongs to one outer member."
                )


def resolve_experiment(study, e: Experiment) -> dict:
    """How the experiment's numbers come from the study's entries (the ``resolved`` attribute)."""
    prob = study.problem
    where = f"Experiment {e.id!r}"
    model = prob.parameter_names
    for field, keys in (("conditions", e.conditions), ("parameters", e.parameters)):
        unknown = [k for k in keys if k not in model]
        if unknown:
            raise ValueError(
                f"{where}: {field} names unknown model parameter(s) {unknown}; the model's parameters are "
                f"{list(model)}."
            )
    unknown = [v for v in e.parameters.values() if v not in study.table]
    if unknown:
        raise ValueError(
            f"{where}: parameters maps to unknown study parameter(s) {unknown}; the parameter table has "
            f"{list(study.table)}."
        )
    defaults = prob.spec.parameter_defaults
    plan = []
    for i, name in enumerate(model):
        if name in e.conditions:
            plan.append(("fixed", e.conditions[name]))
        elif name in e.parameters:
            plan.append(("entry", study.entry_of(e, e.parameters[name])))
        elif name in study.table:
            plan.append(("entry", study.entry_of(e, name)))
        elif defaults is not None:
            plan.append(("fixed", float(defaults[i])))
        else:
            raise ValueError(
                f"{where}: model parameter {name!r} has no value: give it in conditions, map it in "
                "parameters, or add a study parameter of that name."
            )
    out = {"plan": tuple(plan)}
    out.update(_initial_state(study, e, e.y0, "y0", main=True))
    out["observable_plan"] = _observable_plan(study, e)
    out.update(_sigma_entries(study, e))
    out["pre"] = _preequilibration(study, e, plan) if e.preequilibration is not None else None
    k = observable_count(study, e)
    if e.data.shape[1] != k:
        raise ValueError(
            f"{where}: data has shape {e.data.shape}; the observables give {k} value(s) per time, so data must "
            f"be ({e.times.shape[0]}, {k})."
        )
    out["k"] = k
    check_functions(study, e, out)
    return out

def _study_entry(study, e: Experiment, name: str, field: str) -> int:
    if name not in study.table:
        raise ValueError(
            f"Experiment {e.id!r}: {field} names {name!r}, which is not a study parameter; add it to the "
            "parameter table."
        )
    return study.entry_of(e, name)

def _initial_state(study, e: Experiment, y0: Any, field: str, *, main: bool) -> dict:
    """``y0`` (numbers, NaN where estimated or computed), ``y0_entry`` (entry per state, -1: not
    estimated), ``y0_set`` (the states ``y0`` names), ``y0_function`` (a callable or None)."""
    prob = study.problem
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
                entry[i] = _study_entry(study, e, v, f"{field}[{k!r}]")
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

def _observable_plan(study, e: Experiment) -> tuple:
    model = set(study.problem.parameter_names)
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
            plan.append((name, ("entry", _study_entry(study, e, v, f"observable_parameters[{name!r}]"))))
        else:
            plan.append((name, ("fixed", float(v))))
    return tuple(plan)

def _sigma_entries(study, e: Experiment) -> dict:
    """``sigma_entries`` ``(m, k)`` (the entry of each named spread, -1 elsewhere) and
    ``sigma_entry`` (the one entry of a single named spread, as ``noise.sigma="name"``, else -1)."""
    entries = np.full(e.data.shape, -1, dtype=np.int64)
    shared = not isinstance(e.noise, (list, tuple))
    named = np.not_equal(e.sigma_names, None)
    for i, j in zip(*np.nonzero(named)):
        name = e.sigma_names[i, j]
        model = e.noise_columns[j]
        label = f"noise.{model.spread_field}" if shared else f"noise[{j}].{model.spread_field}"
        if name not in study.table:
            raise ValueError(
                f"Experiment {e.id!r}: {label} names {name!r}, which is not a study parameter; add it to the "
                "parameter table."
            )
        sp = study.table[name]
        if sp.lower <= 0:
            raise ValueError(
                f"Experiment {e.id!r}: {label} is study parameter {sp.name!r}, whose lower bound {sp.lower} must be "
                "positive."
            )
        entries[i, j] = study.entry_of(e, name)
    single = -1
    if shared and isinstance(e.noise.spread, str):
        single = int(entries[0, 0])
    return {"sigma_entries": entries, "sigma_entry": single}

def _preequilibration(study, e: Experiment, plan) -> dict:
    pre = e.preequilibration
    model = study.problem.parameter_names
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
                ("entry", _study_entry(study, e, pre.conditions[name], f"preequilibration.conditions[{name!r}]"))
            )
        else:
            pre_plan.append(("fixed", float(pre.conditions[name])))
    out = {"plan": tuple(pre_plan)}
    out.update(_initial_state(study, e, pre.y0, "preequilibration.y0", main=False))
    return out

def check_functions(study, e: Experiment, resolved: dict) -> None:
    """Trace the experiment's callables once (shapes only) for an early, named error."""
    prob = study.problem
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

def observable_count(study, e: Experiment) -> int:
    prob = study.problem
    if e.observables is None:
        return prob.n_states
    # Experiments sharing an observables function (and its parameters' names) trace it once.
    key = (e.observables, e.observables_take_time, tuple(sorted(e.observable_parameters)))
    cache = study.__dict__.setdefault("_observable_counts", {})
    if key not in cache:
        cache[key] = _traced_observable_count(study, e)
    return cache[key]

def _traced_observable_count(study, e: Experiment) -> int:
    prob = study.problem
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
