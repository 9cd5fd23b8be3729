"""``any_per_matrix(pred, values)``: a solve's boolean, made as batched as its matrix.

``"adaptive"`` solves factor in float64 when refinement of one solve stalls, and mark the step's
factorization upgraded. Both depend on the right-hand side, so under ``vmap`` over right-hand sides
alone (``jax.jacfwd`` of forward sensitivities: many tangents, one matrix) they are batched while
the matrix and its handles are not: a ``lax.cond`` on such a predicate runs its branches batched
over every operand, which asks KLU for one float64 factorization per tangent (it refuses: the
handles are not batched), and a batched flag in the factorization batches the primal solution.
``any_per_matrix`` reduces the predicate (``any``) over every ``vmap`` axis that the matrix's
values are not batched along, and keeps it per member along the axes they are (experiments of a
study stay independent): "some solve with this matrix needs it".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

_any_per_matrix_p = Primitive("diffsoup_any_per_matrix")
_any_per_matrix_p.def_impl(lambda pred, values: pred)
_any_per_matrix_p.def_abstract_eval(lambda pred, values: jax.core.ShapedArray(pred.shape, pred.dtype))
mlir.register_lowering(_any_per_matrix_p, mlir.lower_fun(lambda pred, values: pred, multiple_results=False))


def _batch(args, dims):
    pred, values = args
    pred_dim, values_dim = dims
    if pred_dim is None:
        return _any_per_matrix_p.bind(pred, values), None
    if values_dim is None:  # one matrix for the whole batch: any member decides for all
        return _any_per_matrix_p.bind(jnp.any(pred, axis=pred_dim), values), None
    return _any_per_matrix_p.bind(pred, values), pred_dim  # one matrix per member: its own


def _jvp(primals, tangents):
    out = _any_per_matrix_p.bind(*primals)
    return out, ad.Zero.from_primal_value(out)


batching.primitive_batchers[_any_per_matrix_p] = _batch
ad.primitive_jvps[_any_per_matrix_p] = _jvp


def any_per_matrix(pred, values):
    """``pred`` (a boolean scalar of one solve), true where any solve with the same matrix
    ``values`` in a ``vmap`` batch has it."""
    return _any_per_matrix_p.bind(jnp.asarray(pred, bool), jax.lax.stop_gradient(values))
