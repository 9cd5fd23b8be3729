"""The settings tables of a study file: ``[solver]`` (a ``SolverOptions``), ``[fit]`` (the
command's fit settings with their defaults) and each ``[[parameters]]`` table (a ``ds.Parameter``).
"""

from __future__ import annotations

from typing import Any

from ..inference import Parameter, SolverOptions
from ..inference.fitting._hessians import FIDES_HESSIANS
from ..inference.fitting._fit import METHODS
from ..inference.study._study import EXPERIMENT_LEVEL, SCALES, ParameterError
from ._reader import TomlReader, kind
from ._study_format import DEFAULT_FIT, FIT_KEYS, OBJECTIVES, PARAMETER_KEYS, SOLVER_KEYS


def read_solver(r: TomlReader, table: dict):
    r.keys(table, SOLVER_KEYS, ("solver",))
    values = {}
    for key in ("rtol", "atol"):
        if key in table:
            values[key] = r.number(table[key], ("solver", key), positive=True)
    for key in ("max_steps", "checkpoints"):
        if key in table:
            values[key] = r.integer(table[key], ("solver", key), minimum=1)
    return SolverOptions(**values)


def read_fit(r: TomlReader, table: dict) -> dict:
    r.keys(table, FIT_KEYS, ("fit",))
    max_nfev = table.get("max_nfev", None)
    method = r.string(table.get("method", DEFAULT_FIT["method"]), ("fit", "method"), METHODS)
    if "hessian" in table and method != "fides":
        raise r.error(("fit", "hessian"), f"applies to method \"fides\" only (method is {method!r}); remove it "
                                          f"or set method = \"fides\"")  # fmt: skip
    return {
        "method": method,
        "hessian": r.string(table.get("hessian", DEFAULT_FIT["hessian"]), ("fit", "hessian"), FIDES_HESSIANS),
        "starts": r.integer(table.get("starts", DEFAULT_FIT["starts"]), ("fit", "starts"), minimum=1),
        "seed": r.integer(table.get("seed", DEFAULT_FIT["seed"]), ("fit", "seed")),
        "max_nfev": None if max_nfev is None else r.integer(max_nfev, ("fit", "max_nfev"), minimum=1),
        "objective": r.string(table.get("objective", DEFAULT_FIT["objective"]), ("fit", "objective"), OBJECTIVES),
        "hierarchical": _hierarchical(r, table.get("hierarchical", DEFAULT_FIT["hierarchical"])),
    }


def _hierarchical(r: TomlReader, value: Any) -> bool | tuple[str, ...] | None:
    """``[fit] hierarchical``: true, false, or the names of the parameters to optimize analytically
    (checked against the estimated parameters once those are read); None where the file does not
    say (``fit``'s default: the noise levels that qualify)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, list):
        names = r.names(value, ("fit", "hierarchical"))
        if not names:
            raise r.error(("fit", "hierarchical"), "is an empty list; write false, true or the parameters' names")
        return tuple(names)
    raise r.error(("fit", "hierarchical"), f"must be true, false or a list of parameter names, not {kind(value)}")


def read_parameter(r: TomlReader, raw: Any, field: tuple, levels: list[str]):
    raw = r.table(raw, field)
    r.keys(raw, PARAMETER_KEYS, field)
    if "name" not in raw:
        raise r.error(field, "a parameter needs name = ..., and nominal or lower and upper")
    values: dict[str, Any] = {"name": r.string(raw["name"], field + ("name",))}
    for key in ("nominal", "lower", "upper"):
        if key in raw:
            values[key] = r.number(raw[key], field + (key,))
    if "scale" in raw:
        values["scale"] = r.string(raw["scale"], field + ("scale",), SCALES)
    if "estimate" in raw:
        if not isinstance(raw["estimate"], bool):
            raise r.error(field + ("estimate",), f"must be true or false, not {raw['estimate']!r}")
        values["estimate"] = raw["estimate"]
    if "level" in raw:
        values["level"] = r.string(raw["level"], field + ("level",))
        r.known(values["level"], levels + [EXPERIMENT_LEVEL], field + ("level",), "level")
    try:
        return Parameter(**values)
    except ParameterError as exc:  # at the line of the key at fault, when the file has it
        key = exc.key if exc.key in raw else None
        raise r.error(field + ((key,) if key else ()), str(exc)) from None
