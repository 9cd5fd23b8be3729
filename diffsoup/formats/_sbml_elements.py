"""The elements of an SBML model as the importer reads them: :class:`SBMLElements` holds the
compartments, species, parameters, reactions, function definitions and species references by id,
their sympy symbols and the converter of their math; :func:`read_elements` checks the ids and
builds it; :func:`check_document` refuses documents libsbml finds invalid or that need an
unsupported package.

sympy and libsbml are imported inside the functions: this module loads with ``load_sbml``, before
either is needed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ._sbml_error import SBMLError

# An SBML SId (also what the generated code may name a model by).
SID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class SBMLElements:
    """One model's elements by id (libsbml objects), read once and shared by the import's steps.

    Attributes:
        model: the libsbml ``Model``; level: the document's SBML level.
        compartments, species, parameters, reactions: id -> libsbml object, in document order.
        functions: function-definition id -> its ``lambda`` math.
        species_refs: species-reference id -> (reaction id, libsbml ``SpeciesReference``).
        sym: id -> ``sympy.Symbol(id, real=True)`` for every compartment, species, parameter,
            reaction and species reference.
        initial_assignment_targets: the ids that initial assignments set (filled by the rules'
            step; math may use a species reference only once it is one of them).
        converter: the ``MathConverter`` of the model's math (its names resolve through
            :meth:`symbol`).
    """

    model: Any
    level: int
    compartments: dict
    species: dict
    parameters: dict
    reactions: dict
    functions: dict
    species_refs: dict
    sym: dict
    initial_assignment_targets: set = field(default_factory=set)
    converter: Any = None

    def symbol(self, name, where):
        """The symbol of a model id used in math at ``where``."""
        if name in self.species_refs and name not in self.initial_assignment_targets:
            raise SBMLError(f"{where}: the species reference {name!r} is used in math (variable stoichiometry "
                            "is not supported).")  # fmt: skip
        if name in self.sym:
            return self.sym[name]
        raise SBMLError(f"{where}: {name!r} is not a compartment, species, parameter or reaction of the model.")


def read_elements(doc) -> SBMLElements:
    """The elements of a checked document's model, their ids checked (valid SIds, none named
    ``time``) and conversion factors refused."""
    import sympy

    from ._sbml_math import MathConverter

    m = doc.getModel()
    level = doc.getLevel()

    compartments = {c.getId(): c for c in m.getListOfCompartments()}
    species = {s.getId(): s for s in m.getListOfSpecies()}
    parameters = {p.getId(): p for p in m.getListOfParameters()}
    reactions = {r.getId(): r for r in m.getListOfReactions()}
    functions = {}
    for fd in m.getListOfFunctionDefinitions():
        if fd.getMath() is None or not fd.getMath().isLambda():
            raise SBMLError(f"SBML function definition {fd.getId()!r}: its math is not a lambda.")
        functions[fd.getId()] = fd.getMath()
    species_refs = {}
    for r in reactions.values():
        for sr in list(r.getListOfReactants()) + list(r.getListOfProducts()):
            if sr.isSetId():
                species_refs[sr.getId()] = (r.getId(), sr)
    all_ids = list(compartments) + list(species) + list(parameters) + list(reactions) + list(species_refs)
    for sid in all_ids + list(functions):
        if sid == "time":
            raise SBMLError("SBML element with id 'time': diffsoup reserves 'time' for model time (as PEtab "
                            "does); rename it.")
        if not SID.match(sid):
            raise SBMLError(f"SBML element id {sid!r} is not a valid SBML SId.")
    sym = {sid: sympy.Symbol(sid, real=True) for sid in all_ids}

    if m.isSetConversionFactor():
        raise SBMLError(f"SBML model {m.getId()!r}: conversion factors are not supported.")
    for s in species.values():
        if s.isSetConversionFactor():
            raise SBMLError(f"SBML species {s.getId()!r}: conversion factors are not supported.")

    elements = SBMLElements(model=m, level=level, compartments=compartments, species=species,
                            parameters=parameters, reactions=reactions, functions=functions,
                            species_refs=species_refs, sym=sym)  # fmt: skip
    elements.converter = MathConverter(elements.symbol, functions)
    return elements


def check_document(doc) -> None:
    import libsbml

    errors = [doc.getError(i) for i in range(doc.getNumErrors())]
    severe = [e for e in errors if e.getSeverity() >= libsbml.LIBSBML_SEV_ERROR]
    if severe:
        lines = "; ".join(f"line {e.getLine()}: {e.getMessage().strip()}" for e in severe[:5])
        raise SBMLError(f"SBML document: libsbml found {len(severe)} error(s): {lines}")
    if doc.getModel() is None:
        raise SBMLError("SBML document: it holds no model.")
    # Level 3 packages that change the model's meaning say required="true" (layout and render do not);
    # Level 2 has no such attribute (libsbml reports its annotations as required).
    for i in range(doc.getNumPlugins() if doc.getLevel() >= 3 else 0):
        pkg = doc.getPlugin(i).getPackageName()
        if doc.isPackageEnabled(pkg) and doc.getPackageRequired(pkg) and pkg not in ("layout", "render"):
            raise SBMLError(f"SBML document: it requires the package {pkg!r}, which is not supported.")
    for i in range(doc.getNumUnknownPackages()):
        raise SBMLError(f"SBML document: it uses the unknown package {doc.getUnknownPackageURI(i)!r}.")


def sbml_number(value: float):
    """An SBML number as sympy: an integer where it is one (exactly), else a float; NaN as NaN."""
    import sympy

    if value != value:
        return sympy.nan
    if value == int(value) and abs(value) < 2**53:
        return sympy.Integer(int(value))
    return sympy.Float(value)
