"""PEtab observable and noise formulas compiled to JAX, with a disk cache of the generated code.

The formulas are parsed by ``petab.v1.math.sympify_petab`` (sympy expression trees; no ``eval``
of the file's strings) and printed to JAX source by :mod:`._sympy_jax`. Each observable column of
the study (an observable, or one *slot* of it when rows of one experiment give it different
``observableParameters``) becomes one output of two generated functions::

    observables(t, y, p, q) -> (k,)     the observable formulas
    noise(t, h, p, q) -> (k,)           the noise formulas that are not a bare number or name
                                        (1.0 in the other columns: their spreads are per-cell arrays)

``t`` is the time, ``y`` the states, ``p`` the SBML model's parameters (its ``parameter_ids``),
``q`` the *observable parameters*: the placeholders ``observableParameter{n}_{id}`` and
``noiseParameter{n}_{id}`` (renamed per slot) and the parameter-table parameters that are not
model parameters (scaling factors, sigmas), ``h`` the observables at ``t``. Assignment-rule
targets and reaction ids in a formula are replaced by their expressions of the states.

The source is kept under ``cache_dir()/petab`` keyed by SHA-256 of everything the code is made
from (the model's SHA-256, the formulas, the column layout, the names, the printer's version), so
a second load of the same problem compiles the cached text without sympy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from .._settings import cache_dir as _settings_cache_dir
from ._petab_observables import ObservableRow
from ._sympy_compile import PRINTER_VERSION, compile_functions

CODEGEN_VERSION = "petab-1"


@dataclasses.dataclass(frozen=True)
class Column:
    """One observable column of the study.

    Attributes:
        observable: the observable table's row.
        slot: which of the observable's columns (0, 1, ...: experiments whose rows give one
            observable different observable parameters use several).
        renames: placeholder name -> its name in ``q`` (slot 0 keeps the placeholder's name).
        array_noise: the noise formula is a bare number, placeholder or parameter: its spread
            is a per-cell array, not a function.
    """

    observable: ObservableRow
    slot: int
    renames: tuple
    array_noise: bool

    @property
    def name(self) -> str:
        """The column's name: the observable id (slot 0), else ``id/slot``."""
        return self.observable.id if self.slot == 0 else f"{self.observable.id}/{self.slot}"


@dataclasses.dataclass(frozen=True)
class Formulas:
    """The compiled formulas of a column layout.

    Attributes:
        observables: ``observables(t, y, p, q) -> (k,)`` (JAX; ``p``, ``q`` vectors).
        noise: ``noise(t, h, p, q) -> (k,)`` (JAX).
        q_names: the observable parameters, in ``q`` order.
        source: the generated source.
        from_cache: whether it came from the disk cache.
    """

    observables: Callable
    noise: Callable
    q_names: tuple
    source: str
    from_cache: bool


def compile_formulas(model: Any, columns: Sequence[Column], table_parameters: Sequence[str], *, cache: bool = True,
                     cache_dir: Any = None) -> Formulas:  # fmt: skip
    """The JAX functions of the columns' formulas (from the cache when it holds them).

    Args:
        model: the ``SBMLModel``.
        columns: the study's observable columns, in order.
        table_parameters: ids of the parameter table that are not model parameters (a formula
            may use them; they become entries of ``q``).

    Raises:
        PetabError: naming the observable table's row and column, for a symbol that is not
            ``time``, a model entity, a placeholder of that observable or a parameter, or a noise
            formula that depends on the model's states (the noise sees ``t``, the observables and
            the parameters).
    """
    request = {
        "codegen": CODEGEN_VERSION, "printer": PRINTER_VERSION, "model": model.sha256,
        "states": list(model.state_ids), "parameters": list(model.parameter_ids),
        "table_parameters": sorted(table_parameters),
        "columns": [[c.observable.id, c.slot, c.observable.formula, c.observable.noise_formula, list(map(list, c.renames)),
                     c.array_noise] for c in columns],
    }  # fmt: skip
    key = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
    path = Path(_settings_cache_dir(cache_dir)) / "petab" / f"{key}.json"
    entry = _read_cache(path, key) if cache else None
    from_cache = entry is not None
    if entry is None:
        entry = {"key": key, "codegen_version": CODEGEN_VERSION, **_generate(model, columns, table_parameters)}
        if cache:
            _write_cache(path, entry)
    functions = compile_functions(entry["source"], filename=f"<petab {model.id}>")
    return Formulas(functions["observables"], functions["noise"], tuple(entry["q_names"]), entry["source"], from_cache)


def _read_cache(path: Path, key: str):
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != key or entry.get("codegen_version") != CODEGEN_VERSION:
        return None
    return entry


def _write_cache(path: Path, entry: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(entry, f)
        os.replace(tmp, path)  # atomic: concurrent loaders read a whole entry or none
    except OSError:
        pass  # a read-only cache costs the code generation, nothing else


def _generate(model: Any, columns: Sequence[Column], table_parameters: Sequence[str]) -> dict:
    import sympy
    from petab.v1.math import sympify_petab

    from ._sbml_math import TIME
    from ._sympy_jax import Argument, UnsupportedExpression, function_source

    ex = model.expressions
    states = [sympy.Symbol(k, real=True) for k in model.state_ids]
    params = [sympy.Symbol(k, real=True) for k in model.parameter_ids]
    by_name = {s.name: s for s in states + params}
    substitute = {**{k: v for k, v in ex.derived.items()}, **{k: v for k, v in ex.reactions.items()}}
    table = set(table_parameters)
    state_symbols = set(states)

    def parse(text: str, column: Column, field: str):
        try:
            return sympify_petab(text)
        except Exception as exc:  # noqa: BLE001 (sympy's parse errors vary)
            raise column.observable.origin.error(f"{text!r} is not a formula: {type(exc).__name__}: {exc}", field) from None

    q_symbols: dict[str, Any] = {}

    def q(name: str):
        return q_symbols.setdefault(name, sympy.Symbol(f"q::{name}", real=True))

    observables, noises = [], []
    h_symbols = [sympy.Symbol(f"h::{j}", real=True) for j in range(len(columns))]
    for j, column in enumerate(columns):
        obs = column.observable
        renames = dict(column.renames)
        for field, text in (("observableFormula", obs.formula), ("noiseFormula", obs.noise_formula)):
            if field == "noiseFormula" and column.array_noise:
                noises.append(sympy.Integer(1))
                continue
            expr = parse(text, column, field)
            mapping = {}
            for s in expr.free_symbols:
                name = s.name
                if name == "time":
                    mapping[s] = TIME
                elif name in renames:
                    mapping[s] = q(renames[name])
                elif field == "noiseFormula" and name == obs.id:
                    mapping[s] = h_symbols[j]
                elif name in by_name:
                    mapping[s] = by_name[name]
                elif name in substitute:
                    mapping[s] = substitute[name]
                elif name in table:
                    mapping[s] = q(name)
                else:
                    raise obs.origin.error(f"{name!r} in {text!r} is not time, a state, parameter, compartment, "
                                           "assignment-rule target or reaction of the model, a placeholder of "
                                           f"{obs.id!r}, or a parameter of the parameter table", field)  # fmt: skip
            expr = expr.xreplace(mapping)
            if field == "noiseFormula" and expr.free_symbols & state_symbols:
                raise obs.origin.error(f"the noise formula {text!r} depends on the model's states; diffsoup's noise "
                                       "sees the time, the observable and the parameters (write the observable's "
                                       "id for its value)", field)  # fmt: skip
            (observables if field == "observableFormula" else noises).append(expr)
    q_names = sorted(q_symbols)
    q_args = [q_symbols[n] for n in q_names]
    t_arg = Argument("t", [TIME], scalar=True)
    comments = {s: s.name for s in states + params}
    comments.update({q_symbols[n]: n for n in q_names})
    try:
        parts = [
            function_source("observables", [t_arg, Argument("y", states), Argument("p", params), Argument("q", q_args)],
                            observables, dtype_of="y", comments=comments),
            function_source("noise", [t_arg, Argument("h", h_symbols), Argument("p", params), Argument("q", q_args)],
                            noises, dtype_of="h", comments=comments),
        ]  # fmt: skip
    except UnsupportedExpression as err:
        raise columns[0].observable.origin.error(f"cannot generate code: {err}", "observableFormula") from err
    header = (f"# Generated by diffsoup.formats (codegen {CODEGEN_VERSION}) from PEtab formulas over SBML sha256 "
              f"{model.sha256}.\n# {len(columns)} observable columns, {len(q_names)} observable parameters.\n\n")  # fmt: skip
    return {"source": header + "\n\n".join(parts), "q_names": q_names}
