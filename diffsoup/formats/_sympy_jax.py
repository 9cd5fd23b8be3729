"""JAX source code from sympy expression trees.

A small printer of our own (rather than ``lambdify``) so that the set of supported operations is
explicit, every symbol is printed under a name we choose (a model's identifiers never reach the
generated code), and numbers are printed as exact float literals. The printed functions are
compiled once with :func:`._sympy_compile.compile_functions`; the source is plain text that a cache can keep.

Each function takes named arguments that are scalars (``t``) or vectors (``y``, ``p``), binds the
symbols it needs to locals (``x3 = y[3]``), evaluates a sequence of intermediate definitions in
order (assignment rules, reaction rates: each printed once), and returns its outputs stacked into
one vector in the dtype of a chosen argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import sympy
from sympy.logic.boolalg import Boolean, BooleanFalse, BooleanTrue

from ._sympy_compile import PRINTER_VERSION as PRINTER_VERSION
from ._sympy_compile import compile_functions



class UnsupportedExpression(ValueError):
    """A sympy expression holds an operation the printer does not translate."""


# sympy function class -> JAX function of one argument.
_UNARY = {
    sympy.exp: "jnp.exp",
    sympy.log: "jnp.log",
    sympy.sin: "jnp.sin",
    sympy.cos: "jnp.cos",
    sympy.tan: "jnp.tan",
    sympy.asin: "jnp.arcsin",
    sympy.acos: "jnp.arccos",
    sympy.atan: "jnp.arctan",
    sympy.sinh: "jnp.sinh",
    sympy.cosh: "jnp.cosh",
    sympy.tanh: "jnp.tanh",
    sympy.asinh: "jnp.arcsinh",
    sympy.acosh: "jnp.arccosh",
    sympy.atanh: "jnp.arctanh",
    sympy.Abs: "jnp.abs",
    sympy.floor: "jnp.floor",
    sympy.ceiling: "jnp.ceil",
}
# Reciprocal functions: f(x) = 1 / g(x), and their inverses: f^-1(x) = g^-1(1 / x).
_RECIPROCAL = {sympy.sec: "jnp.cos", sympy.csc: "jnp.sin", sympy.cot: "jnp.tan",
               sympy.sech: "jnp.cosh", sympy.csch: "jnp.sinh", sympy.coth: "jnp.tanh"}  # fmt: skip
_INVERSE_RECIPROCAL = {sympy.asec: "jnp.arccos", sympy.acsc: "jnp.arcsin", sympy.acot: "jnp.arctan",
                       sympy.asech: "jnp.arccosh", sympy.acsch: "jnp.arcsinh", sympy.acoth: "jnp.arctanh"}  # fmt: skip
_RELATIONAL = {sympy.StrictLessThan: "<", sympy.LessThan: "<=", sympy.StrictGreaterThan: ">",
               sympy.GreaterThan: ">=", sympy.Equality: "==", sympy.Unequality: "!="}  # fmt: skip


class JaxPrinter:
    """Prints a sympy expression as a JAX expression.

    Args:
        names: the printed name of each free symbol (a local of the generated function).
    """

    def __init__(self, names: Mapping[sympy.Symbol, str]):
        self.names = names

    def __call__(self, expr) -> str:
        return self._print(sympy.sympify(expr) if isinstance(expr, (bool, int, float)) else expr)

    # -- dispatch -------------------------------------------------------------------------------
    def _print(self, e) -> str:
        if isinstance(e, BooleanTrue):
            return "True"
        if isinstance(e, BooleanFalse):
            return "False"
        if isinstance(e, sympy.Symbol):
            try:
                return self.names[e]
            except KeyError:
                raise UnsupportedExpression(f"symbol {e.name!r} has no value here") from None
        if isinstance(e, sympy.Piecewise):
            return self._piecewise(e)
        if isinstance(e, sympy.core.relational.Relational):
            op = _RELATIONAL.get(type(e))
            if op is None:
                raise UnsupportedExpression(f"relation {type(e).__name__}")
            return f"({self._print(e.lhs)} {op} {self._print(e.rhs)})"
        if isinstance(e, sympy.And):
            return self._fold("jnp.logical_and", e.args)
        if isinstance(e, sympy.Or):
            return self._fold("jnp.logical_or", e.args)
        if isinstance(e, sympy.Xor):
            return self._fold("jnp.logical_xor", e.args)
        if isinstance(e, sympy.Not):
            return f"jnp.logical_not({self._print(e.args[0])})"
        if isinstance(e, Boolean):
            raise UnsupportedExpression(f"logical operation {type(e).__name__}")
        if e.is_number:
            return self._number(e)
        if isinstance(e, sympy.Add):
            return self._add(e)
        if isinstance(e, sympy.Mul):
            return self._mul(e)
        if isinstance(e, sympy.Pow):
            return self._pow(e)
        if isinstance(e, (sympy.Min, sympy.Max)):
            return self._fold("jnp.minimum" if isinstance(e, sympy.Min) else "jnp.maximum", e.args)
        f = type(e)
        if f in _UNARY and len(e.args) == 1:
            return f"{_UNARY[f]}({self._print(e.args[0])})"
        if f in _RECIPROCAL:
            return f"(1 / {_RECIPROCAL[f]}({self._print(e.args[0])}))"
        if f in _INVERSE_RECIPROCAL:
            return f"{_INVERSE_RECIPROCAL[f]}(1 / {self._print(e.args[0])})"
        if f is sympy.factorial:
            return f"jsp.gamma({self._print(e.args[0])} + 1)"
        raise UnsupportedExpression(f"operation {f.__name__} in {e}")

    def _number(self, e) -> str:
        if e is sympy.nan:
            return "jnp.nan"
        if e is sympy.oo:
            return "jnp.inf"
        if e is sympy.S.NegativeInfinity:
            return "(-jnp.inf)"
        if isinstance(e, sympy.Integer) and abs(int(e)) < 2**31:
            return f"({int(e)})" if e < 0 else str(int(e))
        value = e.evalf(30)
        if not value.is_real:
            raise UnsupportedExpression(f"number {e} is not real")
        number = float(value)
        if not math.isfinite(number):
            raise UnsupportedExpression(f"number {e} is not finite in float64")
        text = repr(number)
        return f"({text})" if text.startswith("-") else text

    def _add(self, e: sympy.Add) -> str:
        out = ""
        for i, term in enumerate(e.args):
            if term.could_extract_minus_sign():
                out += (" - " if i else "-") + self._print(-term)
            else:
                out += (" + " if i else "") + self._print(term)
        return f"({out})"

    def _mul(self, e: sympy.Mul) -> str:
        coeff, factors = e.as_coeff_mul()
        sign = ""
        if coeff.is_negative:
            sign, coeff = "-", -coeff
        num, den = ([] if coeff == 1 else [self._number(coeff)]), []
        for f in factors:
            if isinstance(f, sympy.Pow) and f.exp.is_number and f.exp.is_negative:
                den.append(self._print(f.base if f.exp == -1 else sympy.Pow(f.base, -f.exp)))
            else:
                num.append(self._print(f))
        top = " * ".join(num) if num else "1"
        text = top if not den else f"{top} / " + (den[0] if len(den) == 1 else f"({' * '.join(den)})")
        return f"({sign}{text})"

    def _pow(self, e: sympy.Pow) -> str:
        base, exp = e.base, e.exp
        if base is sympy.E:
            return f"jnp.exp({self._print(exp)})"
        if isinstance(exp, sympy.Integer):
            n = int(exp)
            b = self._print(base)
            if n == -1:
                return f"(1 / {b})"
            return f"({b} ** {n})" if n >= 0 else f"(1 / {b} ** {-n})"
        if exp == sympy.Rational(1, 2):
            return f"jnp.sqrt({self._print(base)})"
        if exp == sympy.Rational(-1, 2):
            return f"(1 / jnp.sqrt({self._print(base)}))"
        return f"jnp.power({self._print(base)}, {self._print(exp)})"

    def _piecewise(self, e: sympy.Piecewise) -> str:
        default = "jnp.nan"
        pieces = []
        for value, cond in e.args:
            if cond is sympy.true:
                default = self._print(value)
                break
            pieces.append((self._print(cond), self._print(value)))
        out = default
        for cond, value in reversed(pieces):
            out = f"jnp.where({cond}, {value}, {out})"
        return out

    def _fold(self, fn: str, args) -> str:
        printed = [self._print(a) for a in args]
        out = printed[0]
        for a in printed[1:]:
            out = f"{fn}({out}, {a})"
        return out


def _balanced(text: str) -> bool:
    depth = 0
    for c in text:
        depth += c == "("
        depth -= c == ")"
        if depth < 0:
            return False
    return depth == 0


@dataclass(frozen=True)
class Argument:
    """An argument of a generated function: a scalar bound to one symbol, or a vector whose
    entries are bound to ``symbols`` in order (``None`` entries are skipped)."""

    name: str
    symbols: Sequence[sympy.Symbol | None]
    scalar: bool = False


def function_source(
    name: str,
    arguments: Sequence[Argument],
    outputs: Sequence,
    *,
    definitions: Sequence[tuple[sympy.Symbol, object]] = (),
    dtype_of: str,
    comments: Mapping[sympy.Symbol, str] | None = None,
) -> str:
    """Python source of ``def name(args): ...`` returning ``outputs`` stacked in one vector.

    Args:
        name: the function's name (a Python identifier).
        arguments: its arguments, in order.
        outputs: sympy expressions of the arguments' symbols and of the defined symbols.
        definitions: ``(symbol, expression)`` pairs evaluated in order before the outputs; an
            expression may use the arguments and the symbols defined before it.
        dtype_of: the argument whose dtype the result takes.
        comments: text printed beside a symbol's binding (for a reader of the source).

    Raises:
        UnsupportedExpression: for an operation the printer does not translate.
    """
    comments = comments or {}
    names: dict[sympy.Symbol, str] = {}
    lines = [f"def {name}({', '.join(a.name for a in arguments)}):"]
    used = set()
    for expr in list(outputs) + [e for _, e in definitions]:
        if isinstance(expr, sympy.Basic):
            used |= expr.free_symbols
    for arg in arguments:
        if arg.scalar:
            (sym,) = arg.symbols
            names[sym] = arg.name
            continue
        for i, sym in enumerate(arg.symbols):
            if sym is None:
                continue
            local = f"{arg.name}_{i}"
            names[sym] = local
            if sym in used:
                lines.append(_with_comment(f"    {local} = {arg.name}[{i}]", comments.get(sym)))
    for i, (sym, expr) in enumerate(definitions):
        local = f"d_{i}"
        text = JaxPrinter(names)(expr)
        names[sym] = local
        lines.append(_with_comment(f"    {local} = {text}", comments.get(sym)))
    printer = JaxPrinter(names)
    if outputs:
        items = ",\n        ".join(printer(o) for o in outputs)
        lines.append(f"    return jnp.stack([\n        {items},\n    ]).astype({dtype_of}.dtype)")
    else:
        lines.append(f"    return jnp.zeros((0,), {dtype_of}.dtype)")
    return "\n".join(lines) + "\n"


def _with_comment(line: str, comment: str | None) -> str:
    if comment and comment.isprintable() and "\n" not in comment:
        return f"{line}  # {comment}"
    return line


def jax_function(outputs: Sequence, arguments: Sequence[Argument], *, dtype_of: str | None = None,
                 definitions: Sequence[tuple[sympy.Symbol, object]] = (), name: str = "f") -> Callable:  # fmt: skip
    """A JAX function of ``arguments`` returning ``outputs`` (sympy expressions) as one vector.

    For example ``jax_function([a * x], [Argument("y", [x]), Argument("p", [a])])`` is
    ``f(y, p) -> [p[0] * y[0]]``. The result takes the dtype of ``dtype_of`` (default: the
    last vector argument).
    """
    if dtype_of is None:
        vectors = [a.name for a in arguments if not a.scalar]
        if not vectors:
            raise ValueError("jax_function: give dtype_of= when every argument is a scalar.")
        dtype_of = vectors[-1]
    source = function_source(name, arguments, outputs, definitions=definitions, dtype_of=dtype_of)
    return compile_functions(source)[name]
