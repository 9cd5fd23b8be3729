"""SBML math (libsbml's ``ASTNode`` trees) to sympy expressions.

The converter walks the tree node by node: it never parses formula strings, so nothing in a file
is evaluated. Names resolve through the caller (model symbols, local parameters of a kinetic
law, bound variables of a function definition); function definitions are inlined.
"""

from __future__ import annotations

from typing import Callable, Mapping

import libsbml
import sympy
from sympy.logic.boolalg import Boolean

from ._sbml_error import SBMLError

# The symbol of SBML's ``time`` csymbol. Model identifiers named ``time`` are refused, so that this
# name means model time here and in PEtab formulas alike.
TIME = sympy.Symbol("time", real=True)
# SBML Level 3's value of the ``avogadro`` csymbol (L3V1 and L3V2 specifications, section 3.4.6).
AVOGADRO = sympy.Float(6.02214179e23)


_FUNCTIONS_1 = {
    libsbml.AST_FUNCTION_EXP: sympy.exp,
    libsbml.AST_FUNCTION_LN: sympy.log,
    libsbml.AST_FUNCTION_ABS: sympy.Abs,
    libsbml.AST_FUNCTION_FLOOR: sympy.floor,
    libsbml.AST_FUNCTION_CEILING: sympy.ceiling,
    libsbml.AST_FUNCTION_FACTORIAL: sympy.factorial,
    libsbml.AST_FUNCTION_SIN: sympy.sin,
    libsbml.AST_FUNCTION_COS: sympy.cos,
    libsbml.AST_FUNCTION_TAN: sympy.tan,
    libsbml.AST_FUNCTION_SEC: sympy.sec,
    libsbml.AST_FUNCTION_CSC: sympy.csc,
    libsbml.AST_FUNCTION_COT: sympy.cot,
    libsbml.AST_FUNCTION_SINH: sympy.sinh,
    libsbml.AST_FUNCTION_COSH: sympy.cosh,
    libsbml.AST_FUNCTION_TANH: sympy.tanh,
    libsbml.AST_FUNCTION_SECH: sympy.sech,
    libsbml.AST_FUNCTION_CSCH: sympy.csch,
    libsbml.AST_FUNCTION_COTH: sympy.coth,
    libsbml.AST_FUNCTION_ARCSIN: sympy.asin,
    libsbml.AST_FUNCTION_ARCCOS: sympy.acos,
    libsbml.AST_FUNCTION_ARCTAN: sympy.atan,
    libsbml.AST_FUNCTION_ARCSEC: sympy.asec,
    libsbml.AST_FUNCTION_ARCCSC: sympy.acsc,
    libsbml.AST_FUNCTION_ARCCOT: sympy.acot,
    libsbml.AST_FUNCTION_ARCSINH: sympy.asinh,
    libsbml.AST_FUNCTION_ARCCOSH: sympy.acosh,
    libsbml.AST_FUNCTION_ARCTANH: sympy.atanh,
    libsbml.AST_FUNCTION_ARCSECH: sympy.asech,
    libsbml.AST_FUNCTION_ARCCSCH: sympy.acsch,
    libsbml.AST_FUNCTION_ARCCOTH: sympy.acoth,
}
_RELATIONS = {
    libsbml.AST_RELATIONAL_LT: sympy.Lt,
    libsbml.AST_RELATIONAL_LEQ: sympy.Le,
    libsbml.AST_RELATIONAL_GT: sympy.Gt,
    libsbml.AST_RELATIONAL_GEQ: sympy.Ge,
    libsbml.AST_RELATIONAL_EQ: sympy.Eq,
}
_REFUSED = {
    libsbml.AST_FUNCTION_DELAY: "the delay function (delay differential equations)",
    libsbml.AST_FUNCTION_RATE_OF: "the rateOf function",
    libsbml.AST_FUNCTION_QUOTIENT: "the quotient function",
    libsbml.AST_FUNCTION_REM: "the rem function",
    libsbml.AST_CSYMBOL_FUNCTION: "a csymbol function",
}


class MathConverter:
    """Converts libsbml ``ASTNode`` trees to sympy.

    Args:
        resolve: maps a model-level identifier to its sympy symbol; raises :class:`SBMLError`
            for an identifier it does not know.
        function_definitions: function-definition id -> its ``lambda`` ASTNode (inlined).
    """

    def __init__(self, resolve: Callable[[str, str], sympy.Expr], function_definitions: Mapping[str, object]):
        self._resolve = resolve
        self._functions = dict(function_definitions)

    def convert(self, node, where: str, local: Mapping[str, sympy.Expr] | None = None) -> sympy.Expr:
        """The sympy value of ``node``; ``where`` names the SBML element for messages;
        ``local`` maps names that shadow model identifiers (local parameters)."""
        if node is None:
            raise SBMLError(f"{where}: no math.")
        value = self._node(node, where, dict(local or {}), depth=0)
        if _is_logical(value):
            raise SBMLError(f"{where}: the math is a logical value ({value}) where a number is needed.")
        return value

    def convert_condition(self, node, where: str) -> Boolean:
        """The sympy value of a logical expression (a trigger)."""
        if node is None:
            raise SBMLError(f"{where}: no math.")
        return _as_condition(self._node(node, where, {}, depth=0), where)

    # ------------------------------------------------------------------------------------------
    def _node(self, node, where: str, local: dict, depth: int):
        if depth > 200:
            raise SBMLError(f"{where}: math nested too deeply (a recursive function definition?).")
        t = node.getType()
        kids = [node.getChild(i) for i in range(node.getNumChildren())]

        def num(i):
            return _as_number(self._node(kids[i], where, local, depth + 1), where)

        def nums():
            return [_as_number(self._node(k, where, local, depth + 1), where) for k in kids]

        def conds():
            return [_as_condition(self._node(k, where, local, depth + 1), where) for k in kids]

        if t == libsbml.AST_INTEGER:
            return sympy.Integer(node.getInteger())
        if t in (libsbml.AST_REAL, libsbml.AST_REAL_E):
            value = node.getReal()
            if value != value:
                return sympy.nan
            if value in (float("inf"), float("-inf")):
                return sympy.oo if value > 0 else -sympy.oo
            # Integral reals become integers so that x^2 stays an integer power.
            if value == int(value) and abs(value) < 2**53:
                return sympy.Integer(int(value))
            return sympy.Float(value)
        if t == libsbml.AST_RATIONAL:
            return sympy.Rational(node.getNumerator(), node.getDenominator())
        if t == libsbml.AST_NAME:
            name = node.getName()
            if name in local:
                return local[name]
            return self._resolve(name, where)
        if t == libsbml.AST_NAME_TIME:
            return TIME
        if t == libsbml.AST_NAME_AVOGADRO:
            return AVOGADRO
        if t == libsbml.AST_CONSTANT_PI:
            return sympy.pi
        if t == libsbml.AST_CONSTANT_E:
            return sympy.E
        if t == libsbml.AST_CONSTANT_TRUE:
            return sympy.true
        if t == libsbml.AST_CONSTANT_FALSE:
            return sympy.false
        if t == libsbml.AST_PLUS:
            return sympy.Add(*nums())
        if t == libsbml.AST_TIMES:
            return sympy.Mul(*nums())
        if t == libsbml.AST_MINUS:
            if len(kids) == 1:
                return -num(0)
            self._arity(node, kids, 2, where)
            return num(0) - num(1)
        if t == libsbml.AST_DIVIDE:
            self._arity(node, kids, 2, where)
            return num(0) / num(1)
        if t in (libsbml.AST_POWER, libsbml.AST_FUNCTION_POWER):
            self._arity(node, kids, 2, where)
            return sympy.Pow(num(0), num(1))
        if t == libsbml.AST_FUNCTION_ROOT:
            if len(kids) == 1:
                return sympy.sqrt(num(0))
            self._arity(node, kids, 2, where)
            return sympy.Pow(num(1), 1 / num(0))
        if t == libsbml.AST_FUNCTION_LOG:
            if len(kids) == 1:
                return sympy.log(num(0), 10)
            self._arity(node, kids, 2, where)
            return sympy.log(num(1), num(0))
        if t in _FUNCTIONS_1:
            self._arity(node, kids, 1, where)
            return _FUNCTIONS_1[t](num(0))
        if t == libsbml.AST_FUNCTION_MAX:
            return sympy.Max(*nums())
        if t == libsbml.AST_FUNCTION_MIN:
            return sympy.Min(*nums())
        if t == libsbml.AST_FUNCTION_PIECEWISE:
            return self._piecewise(kids, where, local, depth)
        if t in _RELATIONS:
            args = nums()
            if len(args) < 2:
                raise SBMLError(f"{where}: a relation with {len(args)} argument(s).")
            return sympy.And(*[_RELATIONS[t](a, b) for a, b in zip(args[:-1], args[1:])])
        if t == libsbml.AST_RELATIONAL_NEQ:
            self._arity(node, kids, 2, where)
            return sympy.Ne(num(0), num(1))
        if t == libsbml.AST_LOGICAL_AND:
            return sympy.And(*conds())
        if t == libsbml.AST_LOGICAL_OR:
            return sympy.Or(*conds())
        if t == libsbml.AST_LOGICAL_XOR:
            return sympy.Xor(*conds())
        if t == libsbml.AST_LOGICAL_NOT:
            self._arity(node, kids, 1, where)
            return sympy.Not(conds()[0])
        if t == libsbml.AST_LOGICAL_IMPLIES:
            self._arity(node, kids, 2, where)
            a, b = conds()
            return sympy.Or(sympy.Not(a), b)
        if t == libsbml.AST_FUNCTION:
            return self._call(node, kids, where, local, depth)
        if t in _REFUSED:
            raise SBMLError(f"{where}: {_REFUSED[t]} is not supported.")
        raise SBMLError(f"{where}: the MathML element {node.getName()!r} (libsbml AST type {t}) is not supported.")

    def _piecewise(self, kids, where, local, depth):
        values = [self._node(k, where, local, depth + 1) for k in kids]
        pieces = []
        for i in range(0, len(values) - 1, 2):
            pieces.append((_as_number(values[i], where), _as_condition(values[i + 1], where)))
        if len(values) % 2 == 1:
            pieces.append((_as_number(values[-1], where), sympy.true))
        if not pieces:
            raise SBMLError(f"{where}: an empty piecewise.")
        return sympy.Piecewise(*pieces)

    def _call(self, node, kids, where, local, depth):
        name = node.getName()
        fd = self._functions.get(name)
        if fd is None:
            raise SBMLError(f"{where}: call of {name!r}, which is not a function definition of the model.")
        if not fd.isLambda():
            raise SBMLError(f"function definition {name!r}: its math is not a lambda.")
        n_bvars = fd.getNumBvars()
        if len(kids) != n_bvars:
            raise SBMLError(f"{where}: function {name!r} takes {n_bvars} argument(s), got {len(kids)}.")
        args = [self._node(k, where, local, depth + 1) for k in kids]
        bound = {fd.getChild(i).getName(): args[i] for i in range(n_bvars)}
        # The body sees only its bound variables (and, as SBML allows, no model identifiers but
        # through them); model names still resolve, which valid SBML never needs.
        return self._node(fd.getChild(n_bvars), f"{where} (in function {name!r})", bound, depth + 1)

    @staticmethod
    def _arity(node, kids, n, where):
        if len(kids) != n:
            raise SBMLError(f"{where}: {node.getName() or 'an operator'} with {len(kids)} argument(s), expected {n}.")


def _is_logical(value) -> bool:
    # A sympy Symbol is a Boolean too (it can stand in logic); a logical value is not an Expr.
    return isinstance(value, Boolean) and not isinstance(value, sympy.Expr)


def _as_number(value, where):
    if _is_logical(value):
        raise SBMLError(f"{where}: the logical value {value} is used as a number.")
    return value


def _as_condition(value, where):
    if _is_logical(value):
        return value
    raise SBMLError(f"{where}: the number {value} is used as a logical condition.")
