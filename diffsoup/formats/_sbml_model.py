"""The imported SBML model: :class:`SBMLModel` (its ``ProblemSpec``, ids, compiled JAX functions,
events), rebuilt from the generated source and its metadata; :class:`SpeciesInfo` and
:class:`TimedEvent` describe its species and events.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

import jax.numpy as jnp
import numpy as np

from ..model import ProblemSpec
from ._sbml_codegen import CODEGEN_VERSION
from ._sbml_expressions import SBMLExpressions
from ._sbml_import import import_document, libsbml_module
from ._sympy_compile import compile_functions


@dataclass(frozen=True)
class SpeciesInfo:
    """An SBML species as imported.

    Attributes:
        id, compartment: as in the SBML.
        only_substance_units: the species' value (and its state) is an amount; otherwise a
            concentration (amount / compartment size).
        boundary_condition, constant: as in the SBML (reactions do not change boundary species).
        initial: where its initial value comes from: ``"concentration"``, ``"amount"`` (the
            species' attributes), ``"initial_assignment"`` or ``"assignment_rule"``.
        state: whether it is a state (False for assignment-rule targets).
    """

    id: str
    compartment: str
    only_substance_units: bool
    boundary_condition: bool
    constant: bool
    initial: str
    state: bool


@dataclass(frozen=True)
class TimedEvent:
    """A time-triggered SBML event: at ``time(p)`` the states ``targets`` are reset.

    Attributes:
        id: the event's id (or ``"event#i"`` when it has none).
        targets: ids of the states its assignments set.
        strict: trigger ``time > t_e`` (else ``time >= t_e``); the same instant for a solver.
        initial_value: the trigger's value before the start (SBML L3 ``initialValue``; True for
            L2): an event whose time is at or before the start fires at the start only when False.
        persistent: SBML L3 ``persistent`` (True for L2); irrelevant for time triggers.
        time_parameters: ids of the parameters ``t_e`` depends on (empty: a constant time).
        time: ``time(p) -> t_e`` (JAX).
        reset: ``reset(t, y, p) -> y_new``: every assignment evaluated with the values just
            before the event, then applied (JAX).
    """

    id: str
    targets: tuple[str, ...]
    strict: bool
    initial_value: bool
    persistent: bool
    time_parameters: tuple[str, ...]
    time: Callable = field(repr=False, compare=False)
    reset: Callable = field(repr=False, compare=False)


class SBMLModel:
    """An imported SBML model. Made by :func:`load_sbml`.

    Attributes:
        id, name: the model's id and name (or the file's stem).
        sha256: SHA-256 of the SBML text.
        spec: a :class:`ProblemSpec` (``rhs(t, y, p)`` with ``p`` by name, states
            ``state_ids``, parameters ``parameter_ids`` with their SBML values as defaults when
            all are set, ``y0`` = ``y0(defaults)``).
        state_ids: the states in order (species first, then compartments and parameters that
            rate rules drive or events assign).
        parameter_ids: the parameters in order (model parameters, then compartment sizes).
        parameter_values: the SBML value of each parameter (NaN where the file sets none).
        derived_ids: assignment-rule targets and initial-assignment constants, in the order of
            ``derived(t, y, p)``.
        species: id -> :class:`SpeciesInfo`, every species.
        compartments: id -> SBML size (NaN where unset), every compartment.
        reaction_ids: the reactions in order.
        events: the time-triggered events (:class:`TimedEvent`).
        switches_on_states: some piecewise condition depends on the states (a switch that
            ``discontinuities`` cannot list).
        source: the generated JAX source of the functions below.
        from_cache: whether the source came from the disk cache.

    Functions (JAX, ``p`` a vector in ``parameter_ids`` order, ``y`` in ``state_ids`` order):
        rhs(t, y, p) -> dy/dt;  y0(p) -> initial state;  derived(t, y, p) -> derived values;
        discontinuities(p) -> times of the piecewise switches on time (may hold duplicates);
        event_times(p) -> each event's time.
    """

    def __init__(self, meta: dict, source: str, sbml_text: str, *, from_cache: bool, expressions=None):
        self._meta = meta
        self._sbml_text = sbml_text
        self._expressions = expressions
        self.source = source
        self.from_cache = from_cache
        self.id = meta["id"]
        self.name = meta["name"]
        self.sha256 = meta["sha256"]
        self.state_ids = tuple(meta["state_ids"])
        self.parameter_ids = tuple(meta["parameter_ids"])
        self.parameter_values = {k: float(v) for k, v in zip(self.parameter_ids, meta["parameter_values"])}
        self.derived_ids = tuple(meta["derived_ids"])
        self.species = {s["id"]: SpeciesInfo(**s) for s in meta["species"]}
        self.compartments = {k: float(v) for k, v in meta["compartments"]}
        self.reaction_ids = tuple(meta["reaction_ids"])
        self.switches_on_states = bool(meta["switches_on_states"])
        functions = compile_functions(source, filename=f"<sbml {self.id}>")
        self.rhs = functions["rhs"]
        self.y0 = functions["y0"]
        self.derived = functions["derived"]
        self.discontinuities = functions["discontinuities"]
        self.event_times = functions["event_times"]
        events = []
        for k, e in enumerate(meta["events"]):
            time = _event_time(self.event_times, k)
            events.append(TimedEvent(id=e["id"], targets=tuple(e["targets"]), strict=e["strict"],
                                     initial_value=e["initial_value"], persistent=e["persistent"],
                                     time_parameters=tuple(e["time_parameters"]), time=time,
                                     reset=functions[f"reset_{k}"]))  # fmt: skip
        self.events = tuple(events)
        defaults = np.asarray(meta["parameter_values"], dtype=np.float64)
        self._defaults_complete = bool(np.all(np.isfinite(defaults)))
        y0_default = meta["y0_default"]
        self.spec = ProblemSpec(
            _named_parameters_rhs(self.rhs, self.parameter_ids),
            states=self.state_ids,
            parameters=(dict(zip(self.parameter_ids, defaults.tolist())) if self._defaults_complete
                        else self.parameter_ids),  # fmt: skip
            y0=y0_default if y0_default is not None and all(math.isfinite(v) for v in y0_default) else None,
            name=self.name or self.id or "sbml",
            identity=f"sbml:{self.sha256}:{CODEGEN_VERSION}:{hashlib.sha256(source.encode()).hexdigest()}",
        )

    @property
    def expressions(self) -> SBMLExpressions:
        """The model as sympy expressions (rebuilt from the SBML on first use after a cache hit)."""
        if self._expressions is None:
            doc = libsbml_module().readSBMLFromString(self._sbml_text)
            self._expressions = import_document(doc, self.name, None).expressions
        return self._expressions

    def parameter_vector(self, values: Mapping[str, float] | None = None):
        """The parameters as a float64 vector in ``parameter_ids`` order: the SBML values,
        overridden by ``values`` (by id).

        Raises:
            ValueError: for an id that is not a parameter, or a parameter left without value.
        """
        values = dict(values or {})
        unknown = sorted(set(values) - set(self.parameter_ids))
        if unknown:
            raise ValueError(f"SBML model {self.id!r}: {unknown} are not parameters; they are {list(self.parameter_ids)}.")
        vec = np.array([values.get(k, self.parameter_values[k]) for k in self.parameter_ids], dtype=np.float64)
        missing = [k for k, v in zip(self.parameter_ids, vec) if not np.isfinite(v)]
        if missing:
            raise ValueError(f"SBML model {self.id!r}: no finite value for parameters {missing}; pass them in values=.")
        return vec

    def values(self, t, y, p) -> dict:
        """Every model quantity by id at ``(t, y, p)``: states, parameters and derived values
        (what an observable formula may refer to)."""
        out = {k: y[i] for i, k in enumerate(self.state_ids)}
        out.update({k: p[i] for i, k in enumerate(self.parameter_ids)})
        if self.derived_ids:
            d = self.derived(t, y, p)
            out.update({k: d[i] for i, k in enumerate(self.derived_ids)})
        return out

    def __repr__(self) -> str:
        return (f"SBMLModel({self.id!r}, states={len(self.state_ids)}, parameters={len(self.parameter_ids)}, "
                f"derived={len(self.derived_ids)}, events={len(self.events)})")  # fmt: skip


def _named_parameters_rhs(rhs: Callable, parameter_ids: tuple[str, ...]) -> Callable:
    """``rhs(t, y, p)`` taking ``p`` by name (as ``ProblemSpec`` passes it) or as a vector."""
    def sbml_rhs(t, y, p):
        if isinstance(p, Mapping):
            p = (jnp.stack([jnp.asarray(p[k]) for k in parameter_ids]) if parameter_ids
                 else jnp.zeros((0,), y.dtype))  # fmt: skip
        return rhs(t, y, p)

    return sbml_rhs


def _event_time(event_times: Callable, k: int) -> Callable:
    def time(p):
        return event_times(p)[k]

    return time
