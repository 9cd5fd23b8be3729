"""An SBML document read into sympy: :func:`import_document`, the import's steps in order.

1. the document checked and its elements read (:mod:`._sbml_elements`);
2. rules and initial assignments converted (:mod:`._sbml_rules`), events checked
   (:mod:`._sbml_events`);
3. each id's role: state, parameter or derived value (:mod:`._sbml_roles`);
4. reactions' rates and stoichiometries (:mod:`._sbml_reactions`);
5. initial values, then the derived values and rates over time (:mod:`._sbml_rules`);
6. the states' derivatives (:mod:`._sbml_reactions`), the events' times and resets and the
   switches on time (:mod:`._sbml_events`);
7. the model's metadata and its :class:`~diffsoup.formats._sbml_expressions.SBMLExpressions`.

sympy and libsbml are imported inside the functions (``load_sbml`` of a cached model needs neither).
"""

from __future__ import annotations

from ._sbml_elements import SBMLElements, check_document, read_elements
from ._sbml_events import check_event_compartments, check_events, time_switches, timed_events
from ._sbml_expressions import EventExpressions, ImportedModel, SBMLExpressions
from ._sbml_reactions import read_reactions, state_derivatives
from ._sbml_roles import Roles, assign_roles
from ._sbml_rules import initial_values, read_initial_assignments, read_rules, rhs_definitions


def libsbml_module():
    """The ``libsbml`` module (sympy checked too), or an ImportError naming the extra to install."""
    try:
        import libsbml
        import sympy  # noqa: F401
    except ImportError as err:  # pragma: no cover - an install without the optional extra
        raise ImportError("SBML import needs python-libsbml and sympy: pip install 'diffsoup[petab]'.") from err
    return libsbml


def import_document(doc, name: str | None, stem: str | None) -> ImportedModel:
    """The model of a libsbml document in sympy, with everything the code generator needs.

    Raises:
        SBMLError: for an invalid model or a feature diffsoup does not import, naming the element.
    """
    check_document(doc)
    el = read_elements(doc)
    sym = el.sym

    assignment_rules, rate_rules = read_rules(el)
    initial_assignments = read_initial_assignments(el, assignment_rules)
    event_list, event_targets = check_events(el, assignment_rules)
    roles = assign_roles(el, assignment_rules, rate_rules, initial_assignments, event_targets)
    check_event_compartments(el, event_targets)

    rate_raw, stoich_raw = read_reactions(el, initial_assignments)
    init_resolved, initial = initial_values(el, roles, assignment_rules, initial_assignments, rate_raw)
    rhs_defs, order, rhs_resolved, base_syms = rhs_definitions(el, roles, assignment_rules, init_resolved, rate_raw)
    derivatives = state_derivatives(el, roles, assignment_rules, rate_rules, initial_assignments, stoich_raw,
                                    init_resolved, rhs_resolved, base_syms)  # fmt: skip
    resolved_derivatives = [d.xreplace(rhs_resolved) for d in derivatives]

    from ._sbml_math import TIME

    free_syms = {sym[k] for k in roles.parameter_ids}
    events = timed_events(el, event_list, rhs_resolved, base_syms - free_syms - {TIME})
    discontinuities, switches_on_states = time_switches(resolved_derivatives, {sym[k] for k in roles.state_ids})

    m = el.model
    model_id = m.getId() if m.isSetId() else ""
    name = name or model_id or stem or (m.getName() if m.isSetName() else "") or "sbml"
    expressions = SBMLExpressions(
        time=TIME,
        states={k: sym[k] for k in roles.state_ids},
        parameters={k: sym[k] for k in roles.parameter_ids},
        rates=dict(zip(roles.state_ids, resolved_derivatives)),
        initial=dict(zip(roles.state_ids, initial)),
        derived={k: rhs_resolved[sym[k]] for k in roles.derived_ids},
        reactions={rid: rhs_resolved[sym[rid]] for rid in el.reactions},
        events=tuple(EventExpressions(e["id"], e["time"], {k: v.xreplace(rhs_resolved) for k, v in e["assignments"].items()})
                     for e in events),  # fmt: skip
        discontinuities=tuple(discontinuities),
    )
    return ImportedModel(
        model_id=model_id, name=name, state_ids=roles.state_ids, parameter_ids=roles.parameter_ids,
        parameter_values=_parameter_values(el, roles), derived_ids=roles.derived_ids,
        species=_species_info(el, assignment_rules, initial_assignments),
        compartments=[(c, (obj.getSize() if obj.isSetSize() else float("nan"))) for c, obj in el.compartments.items()],
        reaction_ids=list(el.reactions), rhs_definitions=[(s, rhs_defs[s]) for s in order], derivatives=derivatives,
        initial=initial, events=events, discontinuities=discontinuities, switches_on_states=switches_on_states,
        expressions=expressions,
    )  # fmt: skip


def _species_info(el: SBMLElements, assignment_rules, initial_assignments) -> list[dict]:
    """Each species as the fields of a :class:`~diffsoup.formats._sbml_model.SpeciesInfo`."""
    species_info = []
    for sid, s in el.species.items():
        source = ("assignment_rule" if sid in assignment_rules else "initial_assignment" if sid in initial_assignments
                  else "concentration" if s.isSetInitialConcentration() else "amount")  # fmt: skip
        species_info.append(dict(id=sid, compartment=s.getCompartment(),
                                 only_substance_units=bool(s.getHasOnlySubstanceUnits()),
                                 boundary_condition=bool(s.getBoundaryCondition()), constant=bool(s.getConstant()),
                                 initial=source, state=sid not in assignment_rules))  # fmt: skip
    return species_info


def _parameter_values(el: SBMLElements, roles: Roles) -> list:
    """The SBML value of each parameter in ``roles.parameter_ids`` order (NaN where unset)."""
    parameter_values = []
    for k in roles.parameter_ids:
        obj = el.parameters.get(k)
        if obj is not None:
            parameter_values.append(obj.getValue() if obj.isSetValue() else float("nan"))
        else:
            c = el.compartments[k]
            parameter_values.append(c.getSize() if c.isSetSize() else float("nan"))
    return parameter_values
