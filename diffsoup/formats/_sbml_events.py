"""Events and switches on time of an SBML model.

:func:`check_events` refuses what the simulator cannot apply (delays, priorities, assignments to
what rules define) and names the variables events assign; :func:`check_event_compartments`
refuses events that resize a compartment holding concentrations; :func:`timed_events` reads each
trigger as ``time >= t_e`` with ``t_e`` a function of the parameters; :func:`time_switches` lists
the times of the piecewise switches on time (and whether some switch depends on the states).
"""

from __future__ import annotations

from typing import Mapping

from ._sbml_elements import SBMLElements
from ._sbml_error import SBMLError


def check_events(el: SBMLElements, assignment_rules: Mapping) -> tuple[list, dict]:
    """``(the events in order, assigned variable id -> id of the first event assigning it)``;
    their triggers are read once the symbols resolve (:func:`timed_events`)."""
    compartments, species, parameters = el.compartments, el.species, el.parameters
    event_list = list(el.model.getListOfEvents())
    event_targets: dict[str, str] = {}
    for i, ev in enumerate(event_list):
        eid = ev.getId() if ev.isSetId() else f"event#{i}"
        if ev.isSetDelay():
            raise SBMLError(f"SBML event {eid!r}: events with a delay are not supported.")
        if ev.isSetPriority() and len(event_list) > 1:
            raise SBMLError(f"SBML event {eid!r}: event priorities are not supported.")
        for ea in ev.getListOfEventAssignments():
            var = ea.getVariable()
            if var not in compartments and var not in species and var not in parameters:
                raise SBMLError(f"SBML event {eid!r}: assignment to {var!r}, which is not a compartment, species or parameter.")
            if var in assignment_rules:
                raise SBMLError(f"SBML event {eid!r}: assigns {var!r}, which an assignment rule defines (invalid SBML).")
            event_targets.setdefault(var, eid)
    return event_list, event_targets


def check_event_compartments(el: SBMLElements, event_targets: Mapping) -> None:
    """Refuse an event that assigns the size of a compartment holding concentration species."""
    compartments, species = el.compartments, el.species
    for var, eid in event_targets.items():
        if var in compartments and any(s.getCompartment() == var and not s.getHasOnlySubstanceUnits()
                                       for s in species.values()):  # fmt: skip
            raise SBMLError(f"SBML event {eid!r}: assigns the size of compartment {var!r}, which holds "
                            "concentration species (their concentrations would jump); not supported.")  # fmt: skip


def timed_events(el: SBMLElements, event_list: list, rhs_resolved: Mapping, non_parameters: set) -> list[dict]:
    """Each event as a dict: id, targets, strict, initial_value, persistent, time (resolved in
    the parameters), time_parameters, assignments (raw). ``non_parameters``: the symbols a
    trigger's time must not depend on (the states)."""
    conv, level = el.converter, el.level
    events = []
    for i, ev in enumerate(event_list):
        eid = ev.getId() if ev.isSetId() else f"event#{i}"
        trigger = ev.getTrigger()
        if trigger is None or trigger.getMath() is None:
            raise SBMLError(f"SBML event {eid!r}: it has no trigger.")
        cond = conv.convert_condition(trigger.getMath(), f"SBML event {eid!r} trigger").xreplace(rhs_resolved)
        time, strict = _trigger_time(cond, eid, non_parameters)
        assignments = {}
        for ea in ev.getListOfEventAssignments():
            var = ea.getVariable()
            assignments[var] = conv.convert(ea.getMath(), f"SBML event {eid!r} assignment to {var!r}")
        events.append({
            "id": eid, "targets": list(assignments), "strict": strict,
            "initial_value": bool(trigger.getInitialValue()) if level >= 3 else True,
            "persistent": bool(trigger.getPersistent()) if level >= 3 else True,
            "time": time, "time_parameters": sorted(str(s) for s in time.free_symbols),
            "assignments": assignments,
        })  # fmt: skip
    return events


def time_switches(resolved_derivatives: list, state_syms: set) -> tuple[list, bool]:
    """``(times of the piecewise switches on time, in the parameters; whether some piecewise
    condition depends on the states or is no switch at a time the parameters give)``."""
    import sympy

    from ._sbml_math import TIME

    zero = sympy.Integer(0)
    discontinuities, switches_on_states = [], False
    for expr in resolved_derivatives:
        for pw in expr.atoms(sympy.Piecewise):
            for _, c in pw.args:
                for rel in _relations(c):
                    d = rel.lhs - rel.rhs
                    if d.free_symbols & state_syms:
                        switches_on_states = True
                        continue
                    if TIME not in d.free_symbols:
                        continue
                    slope = sympy.diff(d, TIME)
                    if slope.free_symbols & (state_syms | {TIME}) or slope == 0:
                        switches_on_states = True  # not a switch at a time given by the parameters
                        continue
                    root = sympy.simplify(-d.xreplace({TIME: zero}) / slope)
                    if all(root != r for r in discontinuities):
                        discontinuities.append(root)
    return discontinuities, switches_on_states


def _relations(cond):
    import sympy

    if isinstance(cond, sympy.core.relational.Relational):
        return [cond]
    if isinstance(cond, (sympy.And, sympy.Or, sympy.Xor, sympy.Not)):
        return [r for a in cond.args for r in _relations(a)]
    return []


def _trigger_time(cond, eid, state_syms):
    """``(t_e, strict)`` of a trigger ``time >= t_e`` (or an equivalent form)."""
    import sympy

    from ._sbml_math import TIME

    unsupported = (f"SBML event {eid!r}: the trigger {cond} is not of the form time >= t_e with t_e a function of "
                   "the parameters; state-triggered and compound triggers are not supported.")  # fmt: skip
    if isinstance(cond, (sympy.GreaterThan, sympy.StrictGreaterThan)):
        d = cond.lhs - cond.rhs
    elif isinstance(cond, (sympy.LessThan, sympy.StrictLessThan)):
        d = cond.rhs - cond.lhs
    else:
        raise SBMLError(unsupported)
    if d.free_symbols & state_syms or TIME not in d.free_symbols:
        raise SBMLError(unsupported)
    slope = sympy.diff(d, TIME)
    if slope.free_symbols or not slope.is_number or not slope > 0:
        raise SBMLError(unsupported)
    time = sympy.simplify(-d.xreplace({TIME: sympy.Integer(0)}) / slope)
    if TIME in time.free_symbols:
        raise SBMLError(unsupported)
    return time, isinstance(cond, (sympy.StrictGreaterThan, sympy.StrictLessThan))
