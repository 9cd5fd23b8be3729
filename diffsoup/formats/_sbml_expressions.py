"""The imported SBML model in sympy: :class:`SBMLExpressions` (public, ``SBMLModel.expressions``)
with its :class:`EventExpressions`, and :class:`ImportedModel`, everything the code generator
needs (what :func:`~diffsoup.formats._sbml_import.import_document` returns).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class EventExpressions:
    """A time-triggered event in sympy: ``time`` (of the parameters) and ``assignments`` (target
    state id -> expression of time, states and parameters)."""

    id: str
    time: Any
    assignments: Mapping[str, Any]


@dataclass(frozen=True)
class SBMLExpressions:
    """The imported model in sympy. Symbols are ``sympy.Symbol(id, real=True)``; time is
    :data:`TIME` (named ``time``).

    Attributes:
        time: the time symbol.
        states, parameters: id -> symbol.
        rates: state id -> ``d/dt`` (of time, states and parameters).
        initial: state id -> initial value (of parameters).
        derived: derived id -> value (assignment rules: of time, states, parameters; initial-
            assignment constants: of parameters).
        reactions: reaction id -> rate (amount per time).
        events: :class:`EventExpressions` in order.
        discontinuities: times (of parameters) of the piecewise switches on time.
    """

    time: Any
    states: Mapping[str, Any]
    parameters: Mapping[str, Any]
    rates: Mapping[str, Any]
    initial: Mapping[str, Any]
    derived: Mapping[str, Any]
    reactions: Mapping[str, Any]
    events: tuple
    discontinuities: tuple

    def value_of(self, sid: str):
        """The expression of a model id: a state's or parameter's symbol, or a derived value."""
        for table in (self.states, self.parameters, self.derived):
            if sid in table:
                return table[sid]
        raise KeyError(f"{sid!r} is not a state, parameter or derived value of the model.")



@dataclass
class ImportedModel:
    """Everything the code generator needs, in sympy."""

    model_id: str
    name: str
    state_ids: list
    parameter_ids: list
    parameter_values: list
    derived_ids: list
    species: list
    compartments: list
    reaction_ids: list
    rhs_definitions: list  # (symbol, raw expression) in dependency order: derived values and reaction rates
    derivatives: list  # raw d/dt per state (may use the definitions' symbols)
    initial: list  # y0 per state, resolved in the parameters
    events: list  # dicts: id, targets, strict, initial_value, persistent, time (resolved), assignments (raw)
    discontinuities: list  # resolved times
    switches_on_states: bool
    expressions: SBMLExpressions
