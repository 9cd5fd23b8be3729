"""Reactions of an SBML model and the states' rates of change.

:func:`read_reactions` converts each kinetic law (with its local parameters) and sums each
species' net stoichiometry per reaction; :func:`state_derivatives` gives ``d/dt`` of every state:
a rate rule's value, zero for constant and boundary species, and for a species the reactions'
flux, divided by its compartment's size for a concentration (minus the dilution when a rate rule
changes that size).
"""

from __future__ import annotations

from typing import Any, Mapping

from ._sbml_elements import SBMLElements, sbml_number
from ._sbml_error import SBMLError


def read_reactions(el: SBMLElements, initial_assignments: Mapping) -> tuple[dict, dict]:
    """``(reaction id -> raw rate, species id -> reaction id -> raw net stoichiometry)``."""
    import sympy

    species, sym, conv, level = el.species, el.sym, el.converter, el.level
    zero = sympy.Integer(0)
    rate_raw = {}
    stoich_raw: dict[str, dict[str, Any]] = {}  # species -> reaction -> net stoichiometry (raw)
    for rid, r in el.reactions.items():
        if (r.isSetFast() and r.getFast()) if level >= 3 else r.getFast():
            raise SBMLError(f"SBML reaction {rid!r}: fast reactions are not supported.")
        kl = r.getKineticLaw()
        if kl is None or kl.getMath() is None:
            raise SBMLError(f"SBML reaction {rid!r}: it has no kinetic law.")
        local = {}
        for j in range(kl.getNumParameters()):
            lp = kl.getParameter(j)
            if not lp.isSetValue():
                raise SBMLError(f"SBML reaction {rid!r}: local parameter {lp.getId()!r} has no value.")
            local[lp.getId()] = sbml_number(lp.getValue())
        rate_raw[rid] = conv.convert(kl.getMath(), f"SBML kinetic law of reaction {rid!r}", local)
        for sign, refs in ((-1, r.getListOfReactants()), (1, r.getListOfProducts())):
            for sr in refs:
                sid = sr.getSpecies()
                if sid not in species:
                    raise SBMLError(f"SBML reaction {rid!r}: species {sid!r} is not in the model.")
                where = f"SBML reaction {rid!r}, species reference to {sid!r}"
                if sr.isSetId() and sr.getId() in initial_assignments:
                    nu = sym[sr.getId()]
                elif level < 3 and sr.isSetStoichiometryMath():
                    nu = conv.convert(sr.getStoichiometryMath().getMath(), f"{where} (stoichiometryMath)")
                else:
                    nu = sbml_number(sr.getStoichiometry()) if (level < 3 or sr.isSetStoichiometry()) else sympy.Integer(1)
                entry = stoich_raw.setdefault(sid, {})
                entry[rid] = entry.get(rid, zero) + sign * nu
    return rate_raw, stoich_raw


def state_derivatives(el: SBMLElements, roles, assignment_rules: Mapping, rate_rules: Mapping,
                      initial_assignments: Mapping, stoich_raw: Mapping, init_resolved: Mapping,
                      rhs_resolved: Mapping, base_syms: set) -> list:  # fmt: skip
    """The raw ``d/dt`` of each state, in ``roles.state_ids`` order (they may use the rhs
    definitions' symbols)."""
    import sympy

    species, sym = el.species, el.sym
    zero = sympy.Integer(0)
    free_syms = {sym[k] for k in roles.parameter_ids}
    species_refs = el.species_refs
    constants = free_syms | {sym[k] for k in roles.ia_constants} | {sym[k] for k in species_refs if k in initial_assignments}

    def stoichiometry(nu, sid, rid):
        if nu.free_symbols - constants:
            raise SBMLError(f"SBML reaction {rid!r}: the stoichiometry of {sid!r} varies with time or states; "
                            "only constant stoichiometries (numbers or functions of parameters) are supported.")  # fmt: skip
        return nu.xreplace(init_resolved)

    def time_varying(expr):
        return bool(expr.free_symbols & (base_syms - free_syms))

    derivatives = []
    for sid in roles.state_ids:
        if sid in rate_rules:
            derivatives.append(rate_rules[sid])  # in the variable's own units (a concentration for one)
            continue
        if sid not in species:
            derivatives.append(zero)  # a compartment or parameter that events assign
            continue
        s = species[sid]
        comp = s.getCompartment()
        concentration = not s.getHasOnlySubstanceUnits()
        if s.getConstant():
            derivatives.append(zero)
            continue
        if s.getBoundaryCondition():
            if concentration and comp in rate_rules:
                raise SBMLError(f"SBML species {sid!r}: a boundary species in concentration units in compartment "
                                f"{comp!r}, whose size a rate rule changes, is not supported.")  # fmt: skip
            derivatives.append(zero)  # reactions do not change boundary species
            continue
        flux = sympy.Add(*[stoichiometry(nu, sid, rid) * sym[rid] for rid, nu in stoich_raw.get(sid, {}).items()])
        if not concentration:
            derivatives.append(flux)
            continue
        size = sym[comp]
        if comp in assignment_rules and time_varying(rhs_resolved[sym[comp]]):
            raise SBMLError(f"SBML compartment {comp!r}: an assignment rule changes its size over time and it "
                            f"holds the concentration species {sid!r}; not supported (use a rate rule for the size).")
        d = flux / size
        if comp in rate_rules:
            d = d - sym[sid] * rate_rules[comp] / size  # dilution: the amount, not the concentration, is conserved
        derivatives.append(d)
    return derivatives
