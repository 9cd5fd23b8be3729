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

The importer's parts: :mod:`._sbml_elements` (the document's elements and ids),
:mod:`._sbml_rules` (rules, initial assignments, initial values), :mod:`._sbml_roles` (states,
parameters, derived values), :mod:`._sbml_reactions` (kinetic laws, the states' rates),
:mod:`._sbml_events` (events, switches on time), :mod:`._sbml_import` (the steps in order),
:mod:`._sbml_codegen` (sympy to JAX source), :mod:`._sbml_model` (:class:`SBMLModel`); this module
loads a model, through the disk cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .._settings import cache_dir as _settings_cache_dir
from ._sbml_codegen import CODEGEN_VERSION as CODEGEN_VERSION
from ._sbml_codegen import generate as _generate
from ._sbml_expressions import EventExpressions as EventExpressions
from ._sbml_expressions import SBMLExpressions as SBMLExpressions
from ._sbml_import import import_document as _import_document
from ._sbml_import import libsbml_module as _libsbml
from ._sbml_model import SBMLModel as SBMLModel
from ._sbml_model import SpeciesInfo as SpeciesInfo
from ._sbml_model import TimedEvent as TimedEvent
from ._sympy_compile import PRINTER_VERSION


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
