"""How a PEtab problem's checked tables and SBML model become a
:class:`~diffsoup.formats._petab_problem.PetabProblem`: :class:`PetabStudyBuilder` checks the ids
against the model, lays out the observable columns, compiles the formulas, builds the problem's
functions (observables, noise, initial state with the conditions' species values, events) and the
study, as arrays or as ``Experiment`` objects (see :mod:`._petab_study` for the rules).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..inference import Experiment, Parameter, Preequilibration, Study
from ..inference.study._noise import petab_noise_class
from ..integrate import Reset
from ..model import ProblemSpec
from . import _petab_arrays
from ._petab_arrays import INITIAL_SET, INITIAL_VALUE, Placements
from ._petab_formulas import Column, compile_formulas
from ._petab_errors import PetabError
from ._petab_problem import PetabProblem
from ._petab_tables import PetabTables

_IDENTIFIER_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def _is_identifier(text: str) -> bool:
    return bool(text) and not text[0].isdigit() and set(text) <= _IDENTIFIER_CHARS


class PetabStudyBuilder:
    """Turns checked tables and an SBML model into a :class:`PetabProblem`."""

    def __init__(self, tables: PetabTables, model: Any, *, cache, cache_dir, precision, linear_solver):
        self.t, self.model = tables, model
        self.cache, self.cache_dir = cache, cache_dir
        self.precision, self.linear_solver = precision, linear_solver
        self.states = set(model.state_ids)
        self.model_parameters = set(model.parameter_ids)
        self.table = tables.parameters

    # -- checks ---------------------------------------------------------------------------------
    def check_ids(self) -> None:
        model = self.model
        entities = self.states | self.model_parameters | set(model.derived_ids) | set(model.reaction_ids)
        for pid, row in self.table.items():
            if pid in self.states or pid in model.derived_ids:
                raise row.origin.error(f"{pid!r} is a state or assignment-rule target of the model, not a parameter; "
                                       "set a species' initial value in the condition table", "parameterId")  # fmt: skip
        ct = self.t.condition_table
        init_states = []
        for column, (numbers, names, given) in ct.columns.items():
            named = names != ""
            if not given.any():
                continue
            first = int(np.argmax(given))
            if column in self.states:
                if np.any(given & (named | ~np.isnan(numbers))):
                    init_states.append(column)
            elif column in self.model_parameters:
                missing = given & ~named & np.isnan(numbers)
                if missing.any():
                    i = int(np.argmax(missing))
                    raise ct.origin(i).error(f"condition {ct.ids[i]!r} gives no value for model parameter {column!r}",
                                             column)  # fmt: skip
            elif column in entities:
                raise ct.origin(first).error(f"{column!r} is an assignment-rule target or reaction of the model; a "
                                             "condition can set parameters, compartments and species", column)  # fmt: skip
            else:
                raise ct.origin(first).error(f"{column!r} is not a parameter, compartment or species of the model",
                                             column)  # fmt: skip
            if column in self.table:
                raise ct.origin(first).error(f"{column!r} is also in the parameter table; a condition column may not "
                                             "be", column)  # fmt: skip
            unknown = given & named & ~np.isin(names, list(self.table))
            if unknown.any():
                i = int(np.argmax(unknown))
                raise ct.origin(i).error(f"{names[i]!r} is not a parameter of the parameter table", column)
        self.init_states = tuple(s for s in model.state_ids if s in init_states)
        events = model.events
        if events and np.any(self.t.measurement_table.preequilibration != ""):
            raise PetabError(f"the model has time-triggered events ({', '.join(e.id for e in events)}) and the "
                             "problem pre-equilibrates: events with pre-equilibration are not supported",
                             path=self.t.sbml_path)  # fmt: skip

    # -- layout ---------------------------------------------------------------------------------
    def array_noise(self, obs) -> bool:
        text = obs.noise_formula.strip()
        try:
            float(text)
            return True
        except ValueError:
            pass
        if not _is_identifier(text):
            return False
        if text.startswith("noiseParameter") and text.endswith(f"_{obs.id}"):
            return True
        return text in self.table and text not in self.model_parameters

    def array_columns(self, rows, array: dict) -> tuple:
        """The columns of a study held as arrays: one per measured observable, in table order."""
        measured = set(np.unique(rows.observable).tolist())
        return tuple(Column(obs, 0, tuple((n, n) for n in self.placeholder_names(obs, array[oid])), array[oid])
                     for o, (oid, obs) in enumerate(self.t.observables.items()) if o in measured)  # fmt: skip

    @staticmethod
    def placeholder_names(obs, array_noise: bool) -> list:
        """The placeholders of an observable that are observable parameters (``q``)."""
        names = [f"observableParameter{n}_{obs.id}" for n in range(1, obs.placeholders("observable") + 1)]
        if not array_noise:
            names += [f"noiseParameter{n}_{obs.id}" for n in range(1, obs.placeholders("noise") + 1)]
        return names

    def layout(self, array: dict):
        """Experiments (key -> rows), columns, and each experiment's slot of each observable row."""
        groups: dict[tuple, list] = {}
        for m in self.t.measurements:
            groups.setdefault((m.condition, m.preequilibration), []).append(m)
        slots: dict[tuple, dict] = {}  # experiment key -> observable -> slot key -> slot index
        n_slots: dict[str, int] = {}
        for key, rows in groups.items():
            per = slots.setdefault(key, {})
            for m in rows:
                sk = (m.observable_parameters, () if array[m.observable] else m.noise_parameters)
                own = per.setdefault(m.observable, {})
                own.setdefault(sk, len(own))
                n_slots[m.observable] = max(n_slots.get(m.observable, 0), len(own))
        columns = []
        for oid, obs in self.t.observables.items():
            for s in range(n_slots.get(oid, 0)):
                names = self.placeholder_names(obs, array[oid])
                renames = tuple((n, n if s == 0 else f"{n}/{s}") for n in names)
                columns.append(Column(obs, s, renames, array[oid]))
        return groups, tuple(columns), slots

    # -- the model ------------------------------------------------------------------------------
    def problem(self):
        spec = self.model.spec
        if self.init_states:
            extra = {}
            for s in self.init_states:
                extra[s + INITIAL_VALUE] = 0.0
                extra[s + INITIAL_SET] = 0.0
            clash = sorted(set(extra) & self.model_parameters)
            if clash:  # cannot happen for SBML ids (no ':'), but a clash would be silent
                raise PetabError(f"model parameters {clash} clash with diffsoup's initial-value parameters",
                                 path=self.t.sbml_path)  # fmt: skip
            defaults = spec.parameter_defaults
            params = (dict(zip(spec.parameter_names, defaults.tolist())) if defaults is not None
                      else list(spec.parameter_names))  # fmt: skip
            params = {**params, **extra} if isinstance(params, dict) else params + list(extra)
            spec = ProblemSpec(spec.rhs, states=spec.state_names, parameters=params, y0=spec.y0, name=spec.name,
                               identity=f"{spec.identity}:petab-initial:{','.join(self.init_states)}")  # fmt: skip
        options = {}
        if self.precision is not None:
            options["precision"] = self.precision
        if self.linear_solver is not None:
            options["linear_solver"] = self.linear_solver
        try:
            return spec.build(**options)
        except (ValueError, TypeError) as exc:
            raise PetabError(f"the model does not build: {exc}", path=self.t.sbml_path) from None

    def functions(self, formulas):
        """The experiments' shared callables: observables, sigma, y0, discontinuities, resets."""
        model = self.model
        pids, q_names = model.parameter_ids, formulas.q_names
        init_states = self.init_states
        state_index = np.array([model.state_ids.index(s) for s in init_states], dtype=np.int64)

        def pvec(p, like):
            if not pids:
                return jnp.zeros((0,), jnp.result_type(like))
            return jnp.stack([jnp.asarray(p[k]) for k in pids])

        def qvec(p, like):
            if not q_names:
                return jnp.zeros((0,), jnp.result_type(like))
            return jnp.stack([jnp.asarray(p[k]) for k in q_names])

        def observables(t, y, p):
            return formulas.observables(t, y, pvec(p, y), qvec(p, y))

        def sigma(t, h, p):
            return formulas.noise(t, h, pvec(p, h), qvec(p, h))

        def y0(p):
            pv = pvec(p, 0.0)
            base = model.y0(pv)
            if not init_states:
                return base
            values = jnp.stack([jnp.asarray(p[s + INITIAL_VALUE]) for s in init_states]).astype(base.dtype)
            flags = jnp.stack([jnp.asarray(p[s + INITIAL_SET]) for s in init_states])
            return base.at[state_index].set(jnp.where(flags > 0.5, values, base[state_index]))

        discontinuities = ()
        zeros = jnp.zeros((len(pids),), jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
        if jax.eval_shape(model.discontinuities, zeros).shape[0]:
            def discontinuities(p):
                return model.discontinuities(pvec(p, 0.0))

        resets = []
        for event in model.events:
            if event.time_parameters:
                def time(p, event=event):
                    return event.time(pvec(p, 0.0))
            else:
                time = float(event.time(np.zeros(len(pids))))
                if time <= 0.0:
                    if event.initial_value:
                        continue  # its trigger holds from the start: it never turns true, never fires
                    raise PetabError(f"SBML event {event.id!r} fires at the start (time {time} <= 0 with "
                                     "initialValue=false); not supported", path=self.t.sbml_path)  # fmt: skip

            def apply(t, y, p, event=event):
                return event.reset(t, y, pvec(p, y))

            resets.append(Reset(time, apply))
        return observables, sigma, y0, discontinuities, tuple(resets)

    # -- experiments ----------------------------------------------------------------------------
    def build(self, arrays: bool | None = None) -> PetabProblem:
        self.check_ids()
        array = {oid: self.array_noise(o) for oid, o in self.t.observables.items()}
        reason, rows = "load(arrays=False)", None
        if arrays is not False:
            rows = _petab_arrays.rows_of(self.t)
            reason = _petab_arrays.obstacle(self.t, rows, array)
            if reason is not None and arrays:
                raise PetabError(f"the study cannot be held as arrays (arrays=True): {reason}", path=self.t.yaml_path)
        if reason is None:
            columns = self.array_columns(rows, array)
        else:
            groups, columns, slots = self.layout(array)
        table_parameters = [p for p in self.table if p not in self.model_parameters]
        formulas = compile_formulas(self.model, columns, table_parameters, cache=self.cache, cache_dir=self.cache_dir)
        problem = self.problem()
        functions = self.functions(formulas)
        parameters = self.parameters()
        if reason is None:
            study, placements = _petab_arrays.build_study(self, rows, columns, formulas, problem, functions, parameters)
        else:
            study, placements = self.objects(groups, columns, slots, array, formulas, problem, functions, parameters)
        return PetabProblem(self.t, self.model, study, tuple(c.name for c in columns), placements, formulas, reason)

    def parameters(self) -> list:
        """The parameter table's rows as ``ds.inference.Parameter``."""
        parameters = []
        for pid, row in self.table.items():
            lower, upper = row.lower, row.upper
            if not row.estimate and not (lower <= row.nominal <= upper and (row.scale == "lin" or lower > 0)):
                lower = upper = row.nominal  # a fixed parameter's bounds are not used
            try:
                parameters.append(Parameter(pid, nominal=row.nominal, lower=lower, upper=upper, scale=row.scale,
                                            estimate=row.estimate))  # fmt: skip
            except ValueError as exc:
                raise row.origin.error(str(exc)) from None
        return parameters

    def objects(self, groups, columns, slots, array, formulas, problem, functions, parameters):
        """``(study of one ds.Experiment per group, Placements)``."""
        observables, sigma, y0, discontinuities, resets = functions
        column_of = {(c.observable.id, c.slot): j for j, c in enumerate(columns)}
        noise_models = [self.noise_class(c) for c in columns]
        n = len(self.t.measurement_table)
        placed = np.zeros((3, n), dtype=np.int64)  # experiment, row, column of each measurement row
        experiments = []
        for (cid, pre), rows in groups.items():
            eid = cid if pre is None else f"{cid}@{pre}"
            slot_of = slots[(cid, pre)]
            finite = sorted({m.time for m in rows if math.isfinite(m.time)})
            times_sorted = finite + ([math.inf] if any(math.isinf(m.time) for m in rows) else [])
            counts: dict[tuple, int] = {}
            cell_of_row = {}
            for m in rows:
                sk = (m.observable_parameters, () if array[m.observable] else m.noise_parameters)
                j = column_of[(m.observable, slot_of[m.observable][sk])]
                r = counts.get((m.time, j), 0)
                counts[(m.time, j)] = r + 1
                cell_of_row[m.index] = (m.time, r, j)
            replicates = {t: max(c for (tt, _), c in counts.items() if tt == t) for t in times_sorted}
            first_row = {}
            times = []
            for t in times_sorted:
                first_row[t] = len(times)
                times.extend([t] * replicates[t])
            m_rows, k = len(times), len(columns)
            data = np.full((m_rows, k), np.nan)
            cells = np.full((m_rows, k), 1.0, dtype=object)
            for m in rows:
                t, r, j = cell_of_row[m.index]
                i = first_row[t] + r
                data[i, j] = m.value
                placed[:, m.index] = (len(experiments), i, j)
                col = columns[j]
                if col.array_noise:
                    cells[i, j] = self.spread_cell(m, col)
                if col.observable.transformation != "lin" and m.value <= 0:
                    raise m.origin.error(f"{m.value} is not positive; the observable {m.observable!r} is "
                                         f"{col.observable.transformation}-transformed", "measurement")  # fmt: skip
            obs_params: dict[str, Any] = {name: 1.0 for name in formulas.q_names}
            for name in formulas.q_names:
                if name in self.table:
                    obs_params[name] = name
            for oid, own in slot_of.items():
                for (op, npars), s in own.items():
                    col = columns[column_of[(oid, s)]]
                    renames = dict(col.renames)
                    for n, v in enumerate(op, start=1):
                        q = renames[f"observableParameter{n}_{oid}"]
                        if q in obs_params:
                            obs_params[q] = v
                    for n, v in enumerate(npars, start=1):
                        q = renames[f"noiseParameter{n}_{oid}"]
                        if q in obs_params:
                            obs_params[q] = v
            noise = self.noise(noise_models, columns, cells, sigma)
            conditions, mapping, initial = self.condition_values(cid)
            options: dict[str, Any] = {}
            if pre is None:
                options["y0"] = y0
            else:
                pre_conditions, pre_mapping, _ = self.condition_values(pre)
                pre_conditions.update(pre_mapping)
                options["preequilibration"] = Preequilibration(conditions=pre_conditions, y0=y0)
                options["y0"] = initial or None
            try:
                experiments.append(Experiment(
                    eid, np.asarray(times), data, observables=observables, noise=noise, conditions=conditions,
                    parameters=mapping, observable_parameters=obs_params, resets=resets,
                    discontinuities=discontinuities, **options))  # fmt: skip
            except (ValueError, TypeError) as exc:
                raise rows[0].origin.error(f"experiment {eid!r} (the rows of simulation condition {cid!r}"
                                           f"{'' if pre is None else f' after {pre!r}'}): {exc}") from None  # fmt: skip
        try:
            study = Study(problem, experiments, parameters)
        except ValueError as exc:
            raise PetabError(f"the problem does not make a study: {exc}", path=self.t.yaml_path) from None
        return study, Placements(study.ids, *placed)

    def spread_cell(self, m, col) -> float | str:
        text = col.observable.noise_formula.strip()
        try:
            value: float | str = float(text)
        except ValueError:
            value = m.noise_parameters[0] if text.startswith("noiseParameter") and text.endswith(f"_{m.observable}") \
                else text  # fmt: skip
        if isinstance(value, float) and not (value > 0 and math.isfinite(value)):
            raise m.origin.error(f"the noise of {m.observable!r} is {value}; it must be positive and finite",
                                 "noiseParameters")  # fmt: skip
        if isinstance(value, str) and value not in self.table:
            raise m.origin.error(f"{value!r} is not a parameter of the parameter table", "noiseParameters")
        return value

    @staticmethod
    def noise_class(col):
        """The registered noise model class and keywords of the column's ``noiseDistribution`` and
        ``observableTransformation``."""
        obs = col.observable
        return petab_noise_class(obs.distribution, obs.transformation)

    @staticmethod
    def noise(models, columns, cells, sigma):
        kinds = {(cls, tuple(sorted(kw.items()))) for cls, kw in models}
        arrays = {c.array_noise for c in columns}
        if len(kinds) == 1 and len(arrays) == 1:
            cls, kw = models[0]
            return cls(**{cls.spread_field: cells if columns[0].array_noise else sigma}, **kw)
        return [cls(**{cls.spread_field: cells[:, j] if c.array_noise else sigma}, **kw)
                for j, ((cls, kw), c) in enumerate(zip(models, columns))]  # fmt: skip

    def condition_values(self, cid: str):
        """``(conditions, parameters, initial)`` of a condition: model parameter -> number,
        model parameter -> study parameter, state -> number or study parameter (NaN-free)."""
        conditions: dict[str, float] = {}
        mapping: dict[str, str] = {}
        initial: dict[str, Any] = {}
        for column, value in self.t.conditions[cid].values.items():
            if column in self.states:
                if not (isinstance(value, float) and math.isnan(value)):
                    initial[column] = value
            elif isinstance(value, str):
                mapping[column] = value
            else:
                conditions[column] = float(value)
        for s in self.init_states:
            if s in initial:
                conditions[s + INITIAL_SET] = 1.0
                if isinstance(initial[s], str):
                    mapping[s + INITIAL_VALUE] = initial[s]
                else:
                    conditions[s + INITIAL_VALUE] = float(initial[s])
            else:
                conditions[s + INITIAL_SET] = 0.0
                conditions[s + INITIAL_VALUE] = 0.0
        return conditions, mapping, initial
