"""SBML models as diffsoup problems: ``load_sbml(path) -> SBMLModel`` holding a ``ProblemSpec``.

What the importer does, in SBML's terms:

* States: every species that no assignment rule defines (constant and boundary species too, with
  a zero derivative unless a rate rule drives them), then compartments and parameters that a rate
  rule drives or an event assigns. A state holds what the species' value means in SBML: its
  concentration when ``hasOnlySubstanceUnits`` is false, its amount otherwise. Kinetic laws are
  rates of amount, so ``d[S]/dt = sum(stoichiometry * rate) / size(compartment)`` for a
  concentration (minus ``[S] * size'/size`` when a rate rule changes the compartment's size).
* Parameters (the vector ``p`` of the generated functions, the spec's parameters): the model's
  parameters, then its compartments (their sizes), that nothing defines; a condition can override
  a compartment size through ``p``.
* Derived values (neither states nor parameters): targets of assignment rules (functions of
  time, states and parameters) and constants set by initial assignments (functions of the
  parameters). Their values come from ``derived(t, y, p)``.
* Initial values: ``y0(p)``, from initial assignments, species' initial amounts/concentrations
  (converted with the compartment's size) and the sizes and values of the other states.
* Time-triggered events (trigger ``time >= t_e`` or ``time > t_e`` with ``t_e`` a function of
  the parameters; delays and priorities refused) come back as :class:`TimedEvent` data with
  ``time(p)`` and ``reset(t, y, p)`` for the simulator to apply.
* Piecewise switches on time (``time < t_s`` with ``t_s`` a function of the parameters) are listed
  by ``discontinuities(p)`` so that steps can land on them.

The generated JAX source is cached on disk per model (SHA-256 of the SBML text and the codegen
version) under ``cache_dir()/sbml``: a second load reads it back without libsbml parsing or sympy
work; the sympy expressions are rebuilt only when :attr:`SBMLModel.expressions` is asked for.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from .._settings import cache_dir as _settings_cache_dir
from ..model import ProblemSpec
from ._sbml_error import SBMLError
from ._sympy_compile import PRINTER_VERSION, compile_functions

# What generated code looks like; part of the cache key (bump on any change of the importer's output).
CODEGEN_VERSION = "sbml-1"
_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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
    def expressions(self) -> "SBMLExpressions":
        """The model as sympy expressions (rebuilt from the SBML on first use after a cache hit)."""
        if self._expressions is None:
            doc = _libsbml().readSBMLFromString(self._sbml_text)
            self._expressions = _import_document(doc, self.name, None).expressions
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


# ------------------------------------------------------------------------------------------------
# loading, caching
# ------------------------------------------------------------------------------------------------


def load_sbml(source: Any, *, cache: bool = True, cache_dir: str | os.PathLike | None = None,
              name: str | None = None) -> SBMLModel:  # fmt: skip
    """Import an SBML model.

    Args:
        source: a path to an SBML file, the SBML text itself (a string starting with ``<``), or a
            ``libsbml.SBMLDocument``.
        cache: read and write the generated code in the disk cache.
        cache_dir: the cache's root (default: diffsoup's cache directory, ``DIFFSOUP_CACHE_DIR``);
            models go to its ``sbml/`` folder.
        name: a name for the model (default: its id, else the file's stem).

    Returns:
        An :class:`SBMLModel`.

    Raises:
        SBMLError: for a feature diffsoup does not import (algebraic rules, state-triggered
            events, delays, fast reactions, ...) or an invalid model; the message names the
            SBML element.
        FileNotFoundError: for a missing file.
    """
    text, doc, stem = _read_source(source)
    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    key = hashlib.sha256(f"{CODEGEN_VERSION}\0{PRINTER_VERSION}\0{sha}".encode()).hexdigest()
    path = Path(_settings_cache_dir(cache_dir)) / "sbml" / f"{key}.json"
    if cache:
        entry = _read_cache(path, key)
        if entry is not None:
            meta, generated = entry
            if name is not None:
                meta = dict(meta, name=name)
            return SBMLModel(meta, generated, text, from_cache=True)
    if doc is None:
        doc = _libsbml().readSBMLFromString(text)
    imported = _import_document(doc, name, stem)
    meta, generated = _generate(imported, sha)
    if cache:
        _write_cache(path, key, meta, generated)
    return SBMLModel(meta, generated, text, from_cache=False, expressions=imported.expressions)


def _libsbml():
    try:
        import libsbml
        import sympy  # noqa: F401
    except ImportError as err:  # pragma: no cover - an install without the optional extra
        raise ImportError("SBML import needs python-libsbml and sympy: pip install 'diffsoup[petab]'.") from err
    return libsbml


def _read_source(source):
    """(SBML text, document or None, a name); libsbml is imported only for a document."""
    if not isinstance(source, (str, bytes, os.PathLike)):
        libsbml = _libsbml()
        if isinstance(source, libsbml.SBMLDocument):
            return libsbml.writeSBMLToString(source), source, None
    if isinstance(source, bytes):
        source = source.decode("utf-8")
    if isinstance(source, str) and source.lstrip().startswith("<"):
        return source, None, None
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError("load_sbml: source must be a path, SBML text or a libsbml.SBMLDocument, "
                        f"not {type(source).__name__}.")
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"load_sbml: no SBML file at {str(path)!r}.")
    return path.read_text(encoding="utf-8"), None, path.stem


def _read_cache(path: Path, key: str):
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != key or entry.get("codegen_version") != CODEGEN_VERSION:
        return None
    return entry["meta"], entry["source"]


def _write_cache(path: Path, key: str, meta: dict, generated: str) -> None:
    entry = {"key": key, "codegen_version": CODEGEN_VERSION, "meta": meta, "source": generated}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(entry, f)
        os.replace(tmp, path)  # atomic: concurrent loaders read a whole entry or none
    except OSError:
        pass  # a read-only cache costs the code generation, nothing else


def _named_parameters_rhs(rhs: Callable, parameter_ids: tuple[str, ...]) -> Callable:
    """``rhs(t, y, p)`` taking ``p`` by name (as ``ProblemSpec`` passes it) or as a vector."""
    import jax.numpy as jnp

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


# ------------------------------------------------------------------------------------------------
# SBML -> sympy
# ------------------------------------------------------------------------------------------------


@dataclass
class _Imported:
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


def _import_document(doc, name: str | None, stem: str | None) -> _Imported:
    import sympy

    from ._sbml_math import TIME, MathConverter

    _check_document(doc)
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
        if not _ID.match(sid):
            raise SBMLError(f"SBML element id {sid!r} is not a valid SBML SId.")
    sym = {sid: sympy.Symbol(sid, real=True) for sid in all_ids}

    if m.isSetConversionFactor():
        raise SBMLError(f"SBML model {m.getId()!r}: conversion factors are not supported.")
    for s in species.values():
        if s.isSetConversionFactor():
            raise SBMLError(f"SBML species {s.getId()!r}: conversion factors are not supported.")

    def resolve(name, where):
        if name in species_refs and name not in _ia_targets:
            raise SBMLError(f"{where}: the species reference {name!r} is used in math (variable stoichiometry "
                            "is not supported).")  # fmt: skip
        if name in sym:
            return sym[name]
        raise SBMLError(f"{where}: {name!r} is not a compartment, species, parameter or reaction of the model.")

    _ia_targets: set = set()
    conv = MathConverter(resolve, functions)

    # -- rules and initial assignments ---------------------------------------------------------
    assignment_rules, rate_rules = {}, {}
    for i, rule in enumerate(m.getListOfRules()):
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
    initial_assignments = {}
    for ia in m.getListOfInitialAssignments():
        var = ia.getSymbol()
        if var not in sym or var in reactions:
            raise SBMLError(f"SBML initial assignment to {var!r}: not a compartment, species, parameter or species reference.")
        if var in assignment_rules:
            raise SBMLError(f"SBML initial assignment to {var!r}: {var!r} also has an assignment rule (invalid SBML).")
        _ia_targets.add(var)
    for ia in m.getListOfInitialAssignments():
        var = ia.getSymbol()
        initial_assignments[var] = conv.convert(ia.getMath(), f"SBML initial assignment to {var!r}")

    # -- events (checked here; their triggers once the symbols resolve) -------------------------
    event_list = list(m.getListOfEvents())
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

    # -- constants and roles --------------------------------------------------------------------
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

    for var, eid in event_targets.items():
        if var in compartments and any(s.getCompartment() == var and not s.getHasOnlySubstanceUnits()
                                       for s in species.values()):  # fmt: skip
            raise SBMLError(f"SBML event {eid!r}: assigns the size of compartment {var!r}, which holds "
                            "concentration species (their concentrations would jump); not supported.")  # fmt: skip

    # -- reactions -------------------------------------------------------------------------------
    zero = sympy.Integer(0)
    rate_raw = {}
    stoich_raw: dict[str, dict[str, Any]] = {}  # species -> reaction -> net stoichiometry (raw)
    for rid, r in reactions.items():
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
            local[lp.getId()] = _number(lp.getValue())
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
                    nu = _number(sr.getStoichiometry()) if (level < 3 or sr.isSetStoichiometry()) else sympy.Integer(1)
                entry = stoich_raw.setdefault(sid, {})
                entry[rid] = entry.get(rid, zero) + sign * nu

    # -- initial context: every id as a function of the free parameters --------------------------
    t0 = {TIME: zero}
    init_defs = {}
    for sid in list(compartments) + list(species) + list(parameters) + list(species_refs):
        if sid in parameter_ids:
            continue
        if sid in assignment_rules:
            init_defs[sym[sid]] = assignment_rules[sid].xreplace(t0)
        elif sid in initial_assignments:
            init_defs[sym[sid]] = initial_assignments[sid].xreplace(t0)
        elif sid in species:
            init_defs[sym[sid]] = _species_initial(species[sid], sym)
        elif sid in species_refs:
            continue
        else:
            obj = parameters.get(sid) or compartments.get(sid)
            is_set = obj.isSetValue() if sid in parameters else obj.isSetSize()
            if not is_set:
                what = "parameter" if sid in parameters else "compartment"
                raise SBMLError(f"SBML {what} {sid!r}: it has no value and no initial assignment.")
            init_defs[sym[sid]] = _number(obj.getValue() if sid in parameters else obj.getSize())
    for rid in reactions:
        init_defs[sym[rid]] = rate_raw[rid].xreplace(t0)
    _, init_resolved = _resolve(init_defs, "initial assignments and rules (at the start)")
    initial = [init_resolved[sym[s]] for s in state_ids]
    free_syms = {sym[k] for k in parameter_ids}
    for s, value in zip(state_ids, initial):
        extra = value.free_symbols - free_syms
        if extra:
            raise SBMLError(f"SBML initial value of {s!r} depends on {sorted(map(str, extra))}, which have no "
                            "initial value.")  # fmt: skip

    # -- rhs context: derived values and reaction rates over time, states, free parameters --------
    rhs_defs = {}
    for sid in rule_targets:
        rhs_defs[sym[sid]] = assignment_rules[sid]
    for sid in ia_constants:
        rhs_defs[sym[sid]] = init_resolved[sym[sid]]
    for rid in reactions:
        rhs_defs[sym[rid]] = rate_raw[rid]
    order, rhs_resolved = _resolve(rhs_defs, "assignment rules")
    base_syms = {sym[k] for k in state_ids} | free_syms | {TIME}
    for s, value in rhs_resolved.items():
        extra = value.free_symbols - base_syms
        if extra:
            raise SBMLError(f"SBML value of {s.name!r} depends on {sorted(map(str, extra))}, which are not "
                            "states, parameters or rules.")  # fmt: skip

    constants = free_syms | {sym[k] for k in ia_constants} | {sym[k] for k in species_refs if k in initial_assignments}

    def stoichiometry(nu, sid, rid):
        if nu.free_symbols - constants:
            raise SBMLError(f"SBML reaction {rid!r}: the stoichiometry of {sid!r} varies with time or states; "
                            "only constant stoichiometries (numbers or functions of parameters) are supported.")  # fmt: skip
        return nu.xreplace(init_resolved)

    def time_varying(expr):
        return bool(expr.free_symbols & (base_syms - free_syms))

    derivatives = []
    for sid in state_ids:
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

    resolved_derivatives = [d.xreplace(rhs_resolved) for d in derivatives]

    # -- events --------------------------------------------------------------------------------
    events = []
    for i, ev in enumerate(event_list):
        eid = ev.getId() if ev.isSetId() else f"event#{i}"
        trigger = ev.getTrigger()
        if trigger is None or trigger.getMath() is None:
            raise SBMLError(f"SBML event {eid!r}: it has no trigger.")
        cond = conv.convert_condition(trigger.getMath(), f"SBML event {eid!r} trigger").xreplace(rhs_resolved)
        time, strict = _trigger_time(cond, eid, base_syms - free_syms - {TIME})
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

    # -- switches on time ------------------------------------------------------------------------
    state_syms = {sym[k] for k in state_ids}
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

    model_id = m.getId() if m.isSetId() else ""
    name = name or model_id or stem or (m.getName() if m.isSetName() else "") or "sbml"
    species_info = []
    for sid, s in species.items():
        source = ("assignment_rule" if sid in assignment_rules else "initial_assignment" if sid in initial_assignments
                  else "concentration" if s.isSetInitialConcentration() else "amount")  # fmt: skip
        species_info.append(dict(id=sid, compartment=s.getCompartment(),
                                 only_substance_units=bool(s.getHasOnlySubstanceUnits()),
                                 boundary_condition=bool(s.getBoundaryCondition()), constant=bool(s.getConstant()),
                                 initial=source, state=sid not in assignment_rules))  # fmt: skip
    parameter_values = []
    for k in parameter_ids:
        obj = parameters.get(k)
        if obj is not None:
            parameter_values.append(obj.getValue() if obj.isSetValue() else float("nan"))
        else:
            c = compartments[k]
            parameter_values.append(c.getSize() if c.isSetSize() else float("nan"))
    comp_sizes = [(c, (obj.getSize() if obj.isSetSize() else float("nan"))) for c, obj in compartments.items()]

    expressions = SBMLExpressions(
        time=TIME,
        states={k: sym[k] for k in state_ids},
        parameters={k: sym[k] for k in parameter_ids},
        rates=dict(zip(state_ids, resolved_derivatives)),
        initial=dict(zip(state_ids, initial)),
        derived={k: rhs_resolved[sym[k]] for k in derived_ids},
        reactions={rid: rhs_resolved[sym[rid]] for rid in reactions},
        events=tuple(EventExpressions(e["id"], e["time"], {k: v.xreplace(rhs_resolved) for k, v in e["assignments"].items()})
                     for e in events),  # fmt: skip
        discontinuities=tuple(discontinuities),
    )
    return _Imported(
        model_id=model_id, name=name, state_ids=state_ids, parameter_ids=parameter_ids,
        parameter_values=parameter_values, derived_ids=derived_ids, species=species_info,
        compartments=comp_sizes, reaction_ids=list(reactions),
        rhs_definitions=[(s, rhs_defs[s]) for s in order], derivatives=derivatives, initial=initial,
        events=events, discontinuities=discontinuities, switches_on_states=switches_on_states,
        expressions=expressions,
    )  # fmt: skip


def _check_document(doc) -> None:
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


def _number(value: float):
    import sympy

    if value != value:
        return sympy.nan
    if value == int(value) and abs(value) < 2**53:
        return sympy.Integer(int(value))
    return sympy.Float(value)


def _species_initial(s, sym):
    """A species' initial value from its attributes, in its own units."""
    size = sym[s.getCompartment()]
    if s.isSetInitialConcentration():
        value = _number(s.getInitialConcentration())
        return value * size if s.getHasOnlySubstanceUnits() else value
    if s.isSetInitialAmount():
        value = _number(s.getInitialAmount())
        return value if s.getHasOnlySubstanceUnits() else value / size
    raise SBMLError(f"SBML species {s.getId()!r}: it has no initial amount, concentration, initial assignment "
                    "or assignment rule.")  # fmt: skip


def _resolve(defs: Mapping, what: str):
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


# ------------------------------------------------------------------------------------------------
# sympy -> JAX source
# ------------------------------------------------------------------------------------------------


def _generate(imp: _Imported, sha: str) -> tuple[dict, str]:
    import sympy

    from ._sbml_math import TIME
    from ._sympy_jax import Argument, UnsupportedExpression, function_source

    state_syms = [sympy.Symbol(k, real=True) for k in imp.state_ids]
    param_syms = [sympy.Symbol(k, real=True) for k in imp.parameter_ids]
    t_arg, y_arg, p_arg = Argument("t", [TIME], scalar=True), Argument("y", state_syms), Argument("p", param_syms)
    comments = {s: s.name for s in state_syms + param_syms + [d for d, _ in imp.rhs_definitions]}
    defs = imp.rhs_definitions

    def needed(outputs):
        """The definitions that ``outputs`` use, in order."""
        want = set().union(*[o.free_symbols for o in outputs if isinstance(o, sympy.Basic)])
        by_sym = dict(defs)
        keep = set()
        stack = [s for s in want if s in by_sym]
        while stack:
            s = stack.pop()
            if s in keep:
                continue
            keep.add(s)
            stack.extend(x for x in by_sym[s].free_symbols if x in by_sym and x not in keep)
        return [(s, e) for s, e in defs if s in keep]

    parts = []
    try:
        parts.append(function_source("rhs", [t_arg, y_arg, p_arg], imp.derivatives,
                                     definitions=needed(imp.derivatives), dtype_of="y", comments=comments))  # fmt: skip
        parts.append(function_source("y0", [p_arg], imp.initial, dtype_of="p", comments=comments))
        derived_syms = [sympy.Symbol(k, real=True) for k in imp.derived_ids]
        parts.append(function_source("derived", [t_arg, y_arg, p_arg], derived_syms,
                                     definitions=needed(derived_syms), dtype_of="y", comments=comments))  # fmt: skip
        parts.append(function_source("discontinuities", [p_arg], imp.discontinuities, dtype_of="p"))
        parts.append(function_source("event_times", [p_arg], [e["time"] for e in imp.events], dtype_of="p"))
        for k, e in enumerate(imp.events):
            outputs = [e["assignments"].get(s.name, s) for s in state_syms]
            parts.append(function_source(f"reset_{k}", [t_arg, y_arg, p_arg], outputs,
                                         definitions=needed(outputs), dtype_of="y", comments=comments))  # fmt: skip
    except UnsupportedExpression as err:
        raise SBMLError(f"SBML model {imp.name!r}: cannot generate code: {err}.") from err
    header = (f"# Generated by diffsoup.formats (codegen {CODEGEN_VERSION}) from SBML sha256 {sha}.\n"
              f"# Model {imp.model_id if _ID.match(imp.model_id or '') else ''}: "
              f"{len(imp.state_ids)} states, {len(imp.parameter_ids)} parameters.\n\n")  # fmt: skip
    source = header + "\n\n".join(parts)

    defaults = {s: _float_or_nan(v) for s, v in zip(param_syms, imp.parameter_values)}
    if all(math.isfinite(v) for v in defaults.values()):
        values = {s: sympy.Float(v) for s, v in defaults.items()}
        y0_default = [_evaluate(e, values) for e in imp.initial]
    else:
        y0_default = None
    meta = {
        "id": imp.model_id, "name": imp.name, "sha256": sha,
        "state_ids": imp.state_ids, "parameter_ids": imp.parameter_ids,
        "parameter_values": [_float_or_nan(v) for v in imp.parameter_values],
        "derived_ids": imp.derived_ids, "species": imp.species,
        "compartments": [[c, _float_or_nan(v)] for c, v in imp.compartments],
        "reaction_ids": imp.reaction_ids, "switches_on_states": imp.switches_on_states,
        "y0_default": y0_default,
        "events": [{k: e[k] for k in ("id", "targets", "strict", "initial_value", "persistent", "time_parameters")}
                   for e in imp.events],
    }  # fmt: skip
    return meta, source


def _float_or_nan(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _evaluate(expr, values) -> float:
    try:
        value = expr.xreplace(values).evalf(30)
        return float(value) if value.is_real else float("nan")
    except (TypeError, ValueError):
        return float("nan")
