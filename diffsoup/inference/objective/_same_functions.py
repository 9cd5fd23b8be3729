"""Functions that are "the same code with the same constants", so experiments share a program.

Experiments are grouped by what their compiled term depends on, functions included; a function
compares by identity, so 64 experiments each given their own ``lambda y, p: ...`` (written in a
loop) would make 64 groups, 64 programs per mode. :class:`SameFunctions` maps each function to
the first one met that is equivalent to it: the same code object, the same globals, and equal
defaults and closure contents (numbers, strings, NumPy and concrete JAX arrays by value, tuples item by item,
functions recursively, anything else by identity). Lambdas that capture different values (a loop
variable bound as a default ``i=i``) stay apart.

It also counts, per kind of function (observables, sigma, ...), the distinct ones, for the warning
:class:`ProgramGroupsWarning` and the bound ``DEFAULT_MAX_PROGRAM_GROUPS`` of ``ds.lower``.
"""

from __future__ import annotations

import types

import jax
import numpy as np

# The most groups (programs per mode) a lowering compiles by default: past it ``ds.lower`` refuses
# before compiling anything (each program costs seconds and memory maps; thousands exhaust them).
DEFAULT_MAX_PROGRAM_GROUPS = 32
# More groups than this, caused by differing functions, warn once.
WARN_FUNCTION_GROUPS = 4
_SCALARS = (type(None), bool, int, complex, str, bytes)


class ProgramGroupsWarning(UserWarning):
    """Experiments split into many groups (one compiled program each) because their functions differ."""


def _value_key(v, depth: int):
    """A hashable key of a captured value: equal keys mean equal values (else identity)."""
    if isinstance(v, _SCALARS):
        return (type(v), v)
    if isinstance(v, float):
        return (float, repr(v))  # -0.0 apart from 0.0, nan equal to nan
    if isinstance(v, jax.Array) and not isinstance(v, jax.core.Tracer):
        v = np.asarray(v)  # a concrete JAX array: by value, as a NumPy one
    if isinstance(v, (np.ndarray, np.generic)) and v.dtype != object:
        a = np.asarray(v)
        return (type(v), a.dtype.str, a.shape, a.tobytes())
    if depth > 0 and type(v) is tuple:
        return (tuple, tuple(_value_key(x, depth - 1) for x in v))
    if depth > 0 and isinstance(v, types.FunctionType):
        return function_key(v, depth - 1)
    return ("id", id(v))


def function_key(f, depth: int = 8):
    """A hashable key of ``f``: equal keys mean the same code with the same constants; anything
    that is not a plain Python function keys by identity."""
    if not isinstance(f, types.FunctionType):
        return ("id", id(f))
    cells = []
    for c in f.__closure__ or ():
        try:
            cells.append(_value_key(c.cell_contents, depth))
        except ValueError:  # an empty cell
            cells.append(("empty",))
    kwdefaults = tuple(sorted((k, _value_key(v, depth)) for k, v in (f.__kwdefaults__ or {}).items()))
    return ("function", f.__code__, id(f.__globals__), tuple(_value_key(d, depth) for d in f.__defaults__ or ()),
            kwdefaults, tuple(cells))  # fmt: skip


class SameFunctions:
    """Each function replaced by the first equivalent one met; the distinct ones counted by kind."""

    def __init__(self):
        self._first: dict = {}  # function_key -> the first function with it
        self._keep: list = []  # the functions whose ids are in keys stay alive
        self.kinds: dict[str, set] = {}  # kind -> the keys of its distinct functions
        self.uses: dict[str, int] = {}  # kind -> experiments that have one
        self.touched: set[str] = set()  # the kinds met since the last :meth:`experiment_done`

    def __call__(self, f, kind: str):
        """``f``'s representative (None stays None)."""
        if f is None or not callable(f):
            return f
        key = function_key(f)
        self._keep.append(f)
        self.kinds.setdefault(kind, set()).add(key)
        self.touched.add(kind)
        return self._first.setdefault(key, f)

    def experiment_done(self) -> None:
        """Count the kinds of function the experiment just keyed uses."""
        for kind in self.touched:
            self.uses[kind] = self.uses.get(kind, 0) + 1
        self.touched = set()

    def differing(self) -> dict[str, tuple[int, int]]:
        """``kind -> (experiments that use one, distinct functions)`` for kinds of several functions."""
        return {k: (self.uses.get(k, 0), len(s)) for k, s in self.kinds.items() if len(s) > 1}


def erased(f, kind: str):
    """Every function the same: what the groups would be if the functions were shared."""
    return None if f is None or not callable(f) else "function"


def describe(differing: dict[str, tuple[int, int]]) -> str:
    """``64 experiments use 64 different observables functions`` (and the other kinds)."""
    return "; ".join(f"{n} experiments use {d} different {kind} functions" for kind, (n, d) in differing.items())


def check_program_groups(problem, max_program_groups: int) -> None:
    """Refuse, before compiling anything, a problem of more groups than ``max_program_groups``."""
    n = len(problem.groups)
    if not isinstance(max_program_groups, int) or max_program_groups < 1:
        raise ValueError(f"lower: max_program_groups must be a positive integer, not {max_program_groups!r}.")
    if n <= max_program_groups:
        return
    differing = getattr(problem, "differing_functions", {})
    cause = (f"{describe(differing)}: each group compiles its own program; define the function once "
             "(one function shared by the experiments, its differences as parameters or data)"
             if differing else "the experiments differ in what their programs compile from (shapes, noise models, "
             "trajectories); make them alike")  # fmt: skip
    raise ValueError(
        f"lower: the experiments split into {n} groups, each compiling its own programs (at most "
        f"{max_program_groups}, max_program_groups): {cause}, or raise max_program_groups."
    )
