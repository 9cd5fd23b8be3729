"""What each id of an SBML model becomes: a state, a parameter of ``p`` or a derived value.

:func:`assign_roles` checks that what rules and events change is not constant, that species
reactions change are not also defined by rules, and returns the :class:`Roles` (the orders the
generated functions use).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ._sbml_elements import SBMLElements
from ._sbml_error import SBMLError


@dataclass(frozen=True)
class Roles:
    """The ids by role, in the generated functions' orders.

    Attributes:
        state_ids: species that no assignment rule defines, then compartments and parameters that
            a rate rule drives or an event assigns.
        parameter_ids: the free parameters (model parameters, then compartment sizes) that
            nothing defines.
        rule_targets: targets of assignment rules.
        ia_constants: parameters and compartments set by initial assignments only.
        derived_ids: ``rule_targets + ia_constants``.
    """

    state_ids: list
    parameter_ids: list
    rule_targets: list
    ia_constants: list
    derived_ids: list


def assign_roles(el: SBMLElements, assignment_rules: Mapping, rate_rules: Mapping, initial_assignments: Mapping,
                 event_targets: Mapping) -> Roles:  # fmt: skip
    """The roles of the model's ids (see :class:`Roles`), after checking what rules, events and
    reactions change."""
    m, compartments, species, parameters, reactions = el.model, el.compartments, el.species, el.parameters, el.reactions

    def constant(sid):
        obj = compartments.get(sid) or parameters.get(sid) or species.get(sid)
        return bool(obj.getConstant())

    for var, kind in [(v, "assignment rule") for v in assignment_rules] + [(v, "rate rule") for v in rate_rules] + \
            [(v, "event assignment") for v in event_targets]:  # fmt: skip
        if constant(var):
            raise SBMLError(f"SBML {kind} for {var!r}: {var!r} is constant (invalid SBML).")

    reacting = {}  # species id -> reaction ids where it is a reactant or product
    for r in reactions.values():
        for sr in list(r.getListOfReactants()) + list(r.getListOfProducts()):
            reacting.setdefault(sr.getSpecies(), []).append(r.getId())
    for sid, s in species.items():
        if sid in reacting and not s.getBoundaryCondition():
            for rules, kind in ((assignment_rules, "an assignment rule"), (rate_rules, "a rate rule")):
                if sid in rules:
                    raise SBMLError(f"SBML species {sid!r}: defined by {kind} and changed by reaction "
                                    f"{reacting[sid][0]!r}; such a species must have boundaryCondition=true.")  # fmt: skip
        if s.getCompartment() not in compartments:
            raise SBMLError(f"SBML species {sid!r}: its compartment {s.getCompartment()!r} is not in the model.")

    state_species = [sid for sid in species if sid not in assignment_rules]
    state_compartments = [c for c in compartments if c in rate_rules or c in event_targets]
    state_parameters = [p for p in parameters if p in rate_rules or p in event_targets]
    state_ids = state_species + state_compartments + state_parameters
    if not state_ids:
        raise SBMLError(f"SBML model {m.getId()!r}: it has no state (no species, rate rule or event assignment).")
    free_parameters = [p for p in parameters
                       if p not in assignment_rules and p not in rate_rules and p not in event_targets
                       and p not in initial_assignments]  # fmt: skip
    free_compartments = [c for c in compartments
                         if c not in assignment_rules and c not in rate_rules and c not in event_targets
                         and c not in initial_assignments]  # fmt: skip
    parameter_ids = free_parameters + free_compartments
    ia_constants = [x for x in list(parameters) + list(compartments)
                    if x in initial_assignments and x not in rate_rules and x not in event_targets]  # fmt: skip
    rule_targets = [x for x in list(compartments) + list(species) + list(parameters) if x in assignment_rules]
    derived_ids = rule_targets + ia_constants
    return Roles(state_ids=state_ids, parameter_ids=parameter_ids, rule_targets=rule_targets,
                 ia_constants=ia_constants, derived_ids=derived_ids)  # fmt: skip
