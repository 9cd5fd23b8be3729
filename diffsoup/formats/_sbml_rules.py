"""Rules and initial assignments of an SBML model, and the values they define.

:func:`read_rules` and :func:`read_initial_assignments` convert their math (algebraic rules,
rules on species references and doubly defined variables refused); :func:`initial_values` gives
every state's initial value as a function of the free parameters; :func:`rhs_definitions` gives
the derived values and reaction rates over time, states and free parameters;
:func:`resolve_definitions` orders definitions by dependency (refusing cycles).
"""

from __future__ import annotations

from typing import Mapping

from ._sbml_elements import SBMLElements, sbml_number
from ._sbml_error import SBMLError


def read_rules(el: SBMLElements) -> tuple[dict, dict]:
    """``(assignment_rules, rate_rules)``: variable id -> converted math."""
    reactions, species_refs, sym, conv = el.reactions, el.species_refs, el.sym, el.converter
    assignment_rules, rate_rules = {}, {}
    for i, rule in enumerate(el.model.getListOfRules()):
        if rule.isAlgebraic():
            label = f"#{i}" + (f" (metaid {rule.getMetaId()!r})" if rule.isSetMetaId() else "")
            raise SBMLError(f"SBML algebraic rule {label}: algebraic rules (DAE constraints) are not supported.")
        var = rule.getVariable()
        kind = "assignment" if rule.isAssignment() else "rate"
        if var in species_refs:
            raise SBMLError(f"SBML {kind} rule for species reference {var!r}: variable stoichiometry is not supported.")
        if var not in sym or var in reactions:
            raise SBMLError(f"SBML {kind} rule for {var!r}: not a compartment, species or parameter of the model.")
        if var in assignment_rules or var in rate_rules:
            raise SBMLError(f"SBML {kind} rule for {var!r}: {var!r} has another rule.")
        expr = conv.convert(rule.getMath(), f"SBML {kind} rule for {var!r}")
        (assignment_rules if kind == "assignment" else rate_rules)[var] = expr
    return assignment_rules, rate_rules


def read_initial_assignments(el: SBMLElements, assignment_rules: Mapping) -> dict:
    """Variable id -> converted math of its initial assignment. Every target is checked (and
    recorded in ``el.initial_assignment_targets``, so that the math may use species references
    that initial assignments set) before any math is converted."""
    m, reactions, sym, conv = el.model, el.reactions, el.sym, el.converter
    initial_assignments = {}
    for ia in m.getListOfInitialAssignments():
        var = ia.getSymbol()
        if var not in sym or var in reactions:
            raise SBMLError(f"SBML initial assignment to {var!r}: not a compartment, species, parameter or species reference.")
        if var in assignment_rules:
            raise SBMLError(f"SBML initial assignment to {var!r}: {var!r} also has an assignment rule (invalid SBML).")
        el.initial_assignment_targets.add(var)
    for ia in m.getListOfInitialAssignments():
        var = ia.getSymbol()
        initial_assignments[var] = conv.convert(ia.getMath(), f"SBML initial assignment to {var!r}")
    return initial_assignments


def initial_values(el: SBMLElements, roles, assignment_rules: Mapping, initial_assignments: Mapping,
                   rate_raw: Mapping) -> tuple[dict, list]:  # fmt: skip
    """The initial context: ``(every id's symbol -> its value at the start in the free
    parameters, the states' initial values in order)``."""
    import sympy

    from ._sbml_math import TIME

    compartments, species, parameters, sym = el.compartments, el.species, el.parameters, el.sym
    parameter_ids, state_ids = roles.parameter_ids, roles.state_ids
    zero = sympy.Integer(0)
    t0 = {TIME: zero}
    init_defs = {}
    for sid in list(compartments) + list(species) + list(parameters) + list(el.species_refs):
        if sid in parameter_ids:
            continue
        if sid in assignment_rules:
            init_defs[sym[sid]] = assignment_rules[sid].xreplace(t0)
        elif sid in initial_assignments:
            init_defs[sym[sid]] = initial_assignments[sid].xreplace(t0)
        elif sid in species:
            init_defs[sym[sid]] = _species_initial(species[sid], sym)
        elif sid in el.species_refs:
            continue
        else:
            obj = parameters.get(sid) or compartments.get(sid)
            is_set = obj.isSetValue() if sid in parameters else obj.isSetSize()
            if not is_set:
                what = "parameter" if sid in parameters else "compartment"
                raise SBMLError(f"SBML {what} {sid!r}: it has no value and no initial assignment.")
            init_defs[sym[sid]] = sbml_number(obj.getValue() if sid in parameters else obj.getSize())
    for rid in el.reactions:
        init_defs[sym[rid]] = rate_raw[rid].xreplace(t0)
    _, init_resolved = resolve_definitions(init_defs, "initial assignments and rules (at the start)")
    initial = [init_resolved[sym[s]] for s in state_ids]
    free_syms = {sym[k] for k in parameter_ids}
    for s, value in zip(state_ids, initial):
        extra = value.free_symbols - free_syms
        if extra:
            raise SBMLError(f"SBML initial value of {s!r} depends on {sorted(map(str, extra))}, which have no "
                            "initial value.")  # fmt: skip
    return init_resolved, initial


def rhs_definitions(el: SBMLElements, roles, assignment_rules: Mapping, init_resolved: Mapping,
                    rate_raw: Mapping) -> tuple[dict, list, dict, set]:  # fmt: skip
    """The rhs context: derived values and reaction rates over time, states and free parameters:
    ``(symbol -> raw definition, symbols in dependency order, symbol -> resolved value, the
    symbols they may use: states, free parameters and time)``."""
    from ._sbml_math import TIME

    sym = el.sym
    rhs_defs = {}
    for sid in roles.rule_targets:
        rhs_defs[sym[sid]] = assignment_rules[sid]
    for sid in roles.ia_constants:
        rhs_defs[sym[sid]] = init_resolved[sym[sid]]
    for rid in el.reactions:
        rhs_defs[sym[rid]] = rate_raw[rid]
    order, rhs_resolved = resolve_definitions(rhs_defs, "assignment rules")
    free_syms = {sym[k] for k in roles.parameter_ids}
    base_syms = {sym[k] for k in roles.state_ids} | free_syms | {TIME}
    for s, value in rhs_resolved.items():
        extra = value.free_symbols - base_syms
        if extra:
            raise SBMLError(f"SBML value of {s.name!r} depends on {sorted(map(str, extra))}, which are not "
                            "states, parameters or rules.")  # fmt: skip
    return rhs_defs, order, rhs_resolved, base_syms


def _species_initial(s, sym):
    """A species' initial value from its attributes, in its own units."""
    size = sym[s.getCompartment()]
    if s.isSetInitialConcentration():
        value = sbml_number(s.getInitialConcentration())
        return value * size if s.getHasOnlySubstanceUnits() else value
    if s.isSetInitialAmount():
        value = sbml_number(s.getInitialAmount())
        return value if s.getHasOnlySubstanceUnits() else value / size
    raise SBMLError(f"SBML species {s.getId()!r}: it has no initial amount, concentration, initial assignment "
                    "or assignment rule.")  # fmt: skip


def resolve_definitions(defs: Mapping, what: str):
    """Definitions in dependency order and each resolved into the symbols that have none."""
    order, resolved, state = [], {}, {}
    for root in defs:
        if root in resolved:
            continue
        stack = [(root, iter(sorted(defs[root].free_symbols & defs.keys(), key=str)))]
        state[root] = 1
        while stack:
            node, deps = stack[-1]
            for dep in deps:
                if state.get(dep) == 1:
                    cycle = [str(n) for n, _ in stack[[n for n, _ in stack].index(dep):]]
                    raise SBMLError(f"SBML {what}: {' -> '.join(cycle + [str(dep)])} form a cycle.")
                if state.get(dep) is None:
                    state[dep] = 1
                    stack.append((dep, iter(sorted(defs[dep].free_symbols & defs.keys(), key=str))))
                    break
            else:
                stack.pop()
                expr = defs[node]
                resolved[node] = expr.xreplace({d: resolved[d] for d in expr.free_symbols & defs.keys()})
                state[node] = 2
                order.append(node)
    return order, resolved
