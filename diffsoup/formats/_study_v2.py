"""What ``diffsoup-study/2`` adds to ``/1``: ``[experiment_table]`` (every experiment from one
data file, :func:`read_experiment_table`), observable parameters (:func:`observable_parameter_names`,
:func:`parameter_values`), observables that see the measurement ``time``
(:class:`TimedObservables`), and an experiment's ``/2`` keys: per-observable noise, pre-equilibration,
resets, discontinuities and steady state (:class:`Version2Experiments`, a part of
:class:`~diffsoup.formats._study_experiments.ExperimentContext`).
"""

from __future__ import annotations

import ast
from typing import Any, Mapping

import numpy as np

from ..inference import Preequilibration, Study
from ..inference.study._study_table import read_table
from ..integrate import Reset, SteadyState
from ._expressions import EXPRESSION_FUNCTIONS, Observables
from ._reader import TomlReader
from ._study_format import EXPERIMENT_TABLE_KEYS, PREEQUILIBRATION_KEYS, RESET_KEYS, STEADY_STATE_KEYS, TIME
from ._study_noise import NoiseSpec, noise_model


def read_experiment_table(context, problem: Any, parameters: list, raw: Any):
    """The study of ``[experiment_table]`` (/2): every experiment from one data file, held as arrays
    (``ds.Study.from_table``); returns ``(study, observable names, data file)``. ``context``: the
    file's :class:`~diffsoup.formats._study_experiments.ExperimentContext`."""
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
    if isinstance(noise, NoiseSpec):
        columns = noise.columns(names)
        shared = all(c == columns[0] for c in columns)
        noise = noise_model(columns[0], columns[0]["sigma"]) if shared else \
            [noise_model(c, c["sigma"]) for c in columns]  # fmt: skip
    observables = context.observables(tuple(names))
    try:
        study = Study.from_table(problem, df, parameters=parameters, observable_names=names, observables=observables,
                                 noise=noise, conditions=conditions, groups=groups, levels=tuple(context.levels),
                                 y0=y0 or None, t0=t0)  # fmt: skip
    except (ValueError, TypeError) as exc:
        raise r.error(field, str(exc)) from None
    return study, list(names), file


def observable_parameter_names(r: TomlReader, doc: Mapping, taken: tuple) -> tuple:
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


def parameter_values(r: TomlReader, table: Any, field: tuple, study_names) -> dict:
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


class TimedObservables:
    """``observables(t, y, p)`` of a /2 file: the expressions see the measurement time as ``time``
    (and the experiment's observable parameters, which are in ``p``)."""

    def __init__(self, inner: Observables):
        self.inner = inner

    def __call__(self, t, y, p):
        return self.inner(y, {**p, TIME: t})

    def __repr__(self) -> str:
        return repr(self.inner)


def state_reset(time: float, set_: Mapping[str, float], add: Mapping[str, float], states: tuple):
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


class Version2Experiments:
    """The ``/2`` keys of an ``[[experiments]]`` table, read by the experiment context (which
    holds ``r``, ``states``, ``model_parameters``, ``expressions``, ``study_names``,
    ``default_observable_parameters`` and ``resets``)."""

    def noise_2(self, spec: NoiseSpec, names, sigmas, field: tuple):
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
            return noise_model(c, spread)
        return [noise_model(c, np.where(given[:, j], sigmas[:, j], c["sigma"]) if np.any(given[:, j]) else c["sigma"])
                for j, c in enumerate(columns)]  # fmt: skip

    def version_2(self, raw: Mapping, field: tuple, names) -> dict:
        """The /2 keys of an experiment as ``Experiment`` arguments."""
        r, out = self.r, {}
        params = dict(self.default_observable_parameters)
        params.update(parameter_values(r, raw.get("observable_parameters", {}), field + ("observable_parameters",),
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
            conditions = parameter_values(r, pre.get("conditions", {}), pf + ("conditions",), self.study_names)
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
            self.resets[key] = state_reset(time, set_, add, self.states)
        return self.resets[key]
