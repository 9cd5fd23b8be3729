"""Observable expressions of study files: ``total = "A + B + C"``, checked when read, evaluated in JAX.

An expression is Python syntax restricted to numbers, species, model parameters, ``+ - * / **``,
unary signs and the functions of :data:`EXPRESSION_FUNCTIONS`; it is parsed once with ``ast`` and
evaluated node by node with ``jax.numpy`` (never by ``eval``), so it traces, differentiates and
vmaps like any observable written in JAX.
"""

from __future__ import annotations

import ast
from typing import Mapping

from ._reader import TomlReader

EXPRESSION_FUNCTIONS = ("exp", "log", "log10", "sqrt", "abs")
_BINARY = {ast.Add: "add", ast.Sub: "subtract", ast.Mult: "multiply", ast.Div: "divide", ast.Pow: "power"}


def read_expressions(r: TomlReader, table: dict, states: tuple, model_parameters: tuple) -> dict[str, ast.AST]:
    """The checked expressions of ``[observables]``, by name.

    Raises:
        StudyFileError: for an expression that does not parse, uses an unknown name or anything
            outside the allowed syntax, or an observable named like a species.
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
        _check(r, tree.body, field, states, model_parameters)
        out[name] = tree.body
    return out


def _check(r: TomlReader, node: ast.AST, field: tuple, states: tuple, model_parameters: tuple) -> None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return
    if isinstance(node, ast.Name):
        if node.id not in states and node.id not in model_parameters:
            r.known(node.id, states + model_parameters, field, "species or model parameter")
        return
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        _check(r, node.left, field, states, model_parameters)
        _check(r, node.right, field, states, model_parameters)
        return
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        _check(r, node.operand, field, states, model_parameters)
        return
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in EXPRESSION_FUNCTIONS
            and len(node.args) == 1 and not node.keywords):  # fmt: skip
        _check(r, node.args[0], field, states, model_parameters)
        return
    raise r.error(field, f"{ast.unparse(node)!r} is not allowed: use numbers, species, model parameters, "
                  f"+ - * / ** and {', '.join(EXPRESSION_FUNCTIONS)}")  # fmt: skip


def _evaluate(node: ast.AST, y, p, index: Mapping[str, int]):
    import jax.numpy as jnp

    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return y[index[node.id]] if node.id in index else p[node.id]
    if isinstance(node, ast.BinOp):
        return getattr(jnp, _BINARY[type(node.op)])(_evaluate(node.left, y, p, index), _evaluate(node.right, y, p, index))
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
        import jax.numpy as jnp

        values = [_evaluate(self.nodes[n], y, p, self.index) if n in self.nodes else y[self.index[n]]
                  for n in self.names]  # fmt: skip
        return jnp.stack([jnp.asarray(v, dtype=y.dtype) for v in values])

    def __repr__(self) -> str:
        return f"observables({', '.join(self.names)})"
