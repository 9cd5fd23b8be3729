"""Observable expressions of study files: ``total = "A + B + C"``, checked when read, evaluated in JAX.

An expression is Python syntax restricted to numbers, species, model parameters, ``+ - * / **``,
unary signs and the functions of :data:`EXPRESSION_FUNCTIONS`; it is parsed once with ``ast`` and
evaluated node by node with ``jax.numpy`` (never by ``eval``), so it traces, differentiates and
vmaps like any observable written in JAX.

Numbers are floating point: every literal is read as a float and the parts of an expression made
of numbers only (``10 ** 20``, ``2 * exp(3)``) are evaluated once, when the file is read, in
float64 -- integer arithmetic would overflow silently (``10 ** 20`` in int64) or take for ever
(``10 ** 10 ** 10``). Such a constant must be finite and at most :data:`MAX_CONSTANT` in
magnitude, and an expression at most :data:`MAX_DEPTH` operations deep; anything else is an error
naming the file, the line and the observable.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Mapping

import jax.numpy as jnp

from ._reader import TomlReader

EXPRESSION_FUNCTIONS = ("exp", "log", "log10", "sqrt", "abs")
MAX_DEPTH = 200  # nested operations; a sum of 200 species still reads
MAX_CONSTANT = 1e300  # larger constants are mistakes (float64 ends at 1.8e308)
_BINARY = {ast.Add: "add", ast.Sub: "subtract", ast.Mult: "multiply", ast.Div: "divide", ast.Pow: "power"}
_FLOAT_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
                 ast.Pow: operator.pow}  # fmt: skip
_FLOAT_FUNCTIONS = {"exp": math.exp, "log": math.log, "log10": math.log10, "sqrt": math.sqrt, "abs": abs}
# An integral exponent up to this size stays an integer for jnp.power (exact powers of negative bases).
_MAX_INTEGER_EXPONENT = 1024


def read_expressions(r: TomlReader, table: dict, states: tuple, model_parameters: tuple) -> dict[str, ast.AST]:
    """The checked expressions of ``[observables]``, by name, with their constant parts folded
    into float constants.

    Raises:
        StudyFileError: for an expression that does not parse, uses an unknown name or anything
            outside the allowed syntax, is nested more than :data:`MAX_DEPTH` deep, holds a
            constant that is not finite or exceeds :data:`MAX_CONSTANT`, or an observable named
            like a species.
    """
    out = {}
    for name, text in table.items():
        field = ("observables", name)
        if name in states:
            raise r.error(field, f"observable {name!r} has a species' name; give it another name")
        text = r.string(text, field)
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError as exc:
            raise r.error(field, f"{text!r} is not an expression: {exc.msg}") from None
        except (RecursionError, MemoryError):  # the parser's own limit, far beyond MAX_DEPTH
            raise r.error(field, _too_deep(text)) from None
        if _depth(tree.body) > MAX_DEPTH:
            raise r.error(field, _too_deep(text))
        out[name] = _fold(r, tree.body, field, states, model_parameters)
    return out


def _shown(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def _too_deep(text: str) -> str:
    return (f"{_shown(text)!r} is nested more than {MAX_DEPTH} operations deep; write it with fewer nested operations "
            "(or as a Python observables function)")  # fmt: skip


def _depth(node: ast.AST) -> int:
    """Nesting depth of an expression, counted without recursion (so any depth is measured)."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        n, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > MAX_DEPTH:
            break
        stack.extend((c, d + 1) for c in ast.iter_child_nodes(n) if isinstance(c, ast.expr))
    return deepest


def _fold(r: TomlReader, node: ast.AST, field: tuple, states: tuple, model_parameters: tuple) -> ast.AST:
    """Check ``node`` and return it with every number a float and every part made of numbers only
    replaced by its value (a float constant)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        try:
            value = float(node.value)
        except OverflowError:  # an integer literal of hundreds of digits
            value = math.inf
        return _constant(r, node, value, field)
    if isinstance(node, ast.Name):
        if node.id not in states and node.id not in model_parameters:
            r.known(node.id, states + model_parameters, field, "species or model parameter")
        return node
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left = _fold(r, node.left, field, states, model_parameters)
        right = _fold(r, node.right, field, states, model_parameters)
        if isinstance(left, ast.Constant) and isinstance(right, ast.Constant):
            return _constant(r, node, lambda: _FLOAT_BINARY[type(node.op)](left.value, right.value), field)
        if isinstance(node.op, ast.Div) and isinstance(right, ast.Constant) and right.value == 0.0:
            raise r.error(field, f"{_shown(ast.unparse(node))!r} divides by zero")
        return ast.copy_location(ast.BinOp(left, node.op, right), node)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _fold(r, node.operand, field, states, model_parameters)
        if isinstance(operand, ast.Constant):
            return _constant(r, node, -operand.value if isinstance(node.op, ast.USub) else operand.value, field)
        return ast.copy_location(ast.UnaryOp(node.op, operand), node)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in EXPRESSION_FUNCTIONS
            and len(node.args) == 1 and not node.keywords):  # fmt: skip
        arg = _fold(r, node.args[0], field, states, model_parameters)
        if isinstance(arg, ast.Constant):
            return _constant(r, node, lambda: _FLOAT_FUNCTIONS[node.func.id](arg.value), field)
        return ast.copy_location(ast.Call(node.func, [arg], []), node)
    raise r.error(field, f"{ast.unparse(node)!r} is not allowed: use numbers, species, model parameters, "
                  f"+ - * / ** and {', '.join(EXPRESSION_FUNCTIONS)}")  # fmt: skip


def _constant(r: TomlReader, node: ast.AST, value, field: tuple) -> ast.Constant:
    """``value`` (a float, or a function computing it) as a constant node, checked."""
    text = _shown(ast.unparse(node))
    if callable(value):
        try:
            value = value()
        except ZeroDivisionError:
            raise r.error(field, f"the constant {text!r} divides by zero") from None
        except OverflowError:
            value = math.inf
        except ValueError:  # math domain error: log of a non-positive number, sqrt of a negative one
            raise r.error(field, f"the constant {text!r} is not a finite real number") from None
    if isinstance(value, complex):  # a negative number to a fractional power
        raise r.error(field, f"the constant {text!r} is not a real number")
    if not math.isfinite(value) or abs(value) > MAX_CONSTANT:
        shown = "overflows floating point" if not math.isfinite(value) else f"evaluates to {value:.3g}"
        raise r.error(field, f"the constant {text!r} {shown}; constants must be finite and at most "
                      f"{MAX_CONSTANT:g} in magnitude")  # fmt: skip
    return ast.copy_location(ast.Constant(float(value)), node)


def _evaluate(node: ast.AST, y, p, index: Mapping[str, int]):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return y[index[node.id]] if node.id in index else p[node.id]
    if isinstance(node, ast.BinOp):
        left = _evaluate(node.left, y, p, index)
        if (isinstance(node.op, ast.Pow) and isinstance(node.right, ast.Constant) and node.right.value.is_integer()
                and abs(node.right.value) <= _MAX_INTEGER_EXPONENT):  # fmt: skip
            return jnp.power(left, int(node.right.value))  # integer_pow: exact for negative bases too
        return getattr(jnp, _BINARY[type(node.op)])(left, _evaluate(node.right, y, p, index))
    if isinstance(node, ast.UnaryOp):
        value = _evaluate(node.operand, y, p, index)
        return -value if isinstance(node.op, ast.USub) else value
    return getattr(jnp, node.func.id)(_evaluate(node.args[0], y, p, index))


class Observables:
    """``observables(y, p)`` of named species and expressions; one object per name list, so that
    experiments observing the same names are evaluated together.

    Args:
        names: the observables, in the data's column order (species or expression names).
        states: the model's species.
        expressions: the checked expressions by name (:func:`read_expressions`).
    """

    def __init__(self, names: tuple, states: tuple, expressions: Mapping[str, ast.AST]):
        self.names, self.states = names, states
        self.nodes = {n: expressions[n] for n in names if n in expressions}
        self.index = {s: i for i, s in enumerate(states)}

    def __call__(self, y, p):
        values = [_evaluate(self.nodes[n], y, p, self.index) if n in self.nodes else y[self.index[n]]
                  for n in self.names]  # fmt: skip
        return jnp.stack([jnp.asarray(v, dtype=y.dtype) for v in values])

    def __repr__(self) -> str:
        return f"observables({', '.join(self.names)})"
