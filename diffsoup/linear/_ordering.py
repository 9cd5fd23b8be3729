"""Ordering side effects by data dependency: ``depends_on(x, after)``.

XLA's CPU runtime runs operations in any order their data dependencies allow (and removes
optimization barriers before that), so the order of side effects (KLU's in-place refactor, its
solve workspace, releases) must be carried by data. ``depends_on(x, after)`` returns ``x``
unchanged but computed from ``after``: ``x + 0`` where the 0 is ``popcount(bits) > 64`` of a
reduction of ``after``, always false for a 64-bit word and not something the simplifier folds.
Under vmap, an unbatched ``x`` stays unbatched (the dependency on a batched ``after`` is reduced
over the batch), so one factorization serving many tangents is not turned into one handle per
tangent.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

_depends_on_p = Primitive("diffsoup_depends_on")
_depends_on_p.def_abstract_eval(lambda x, after: jax.core.ShapedArray(x.shape, x.dtype))


def _depends_on_impl(x, after):
    bits = jax.lax.bitcast_convert_type(after, jnp.uint64)
    zero = jax.lax.population_count(bits) > 64
    return x + zero.astype(x.dtype)


_depends_on_p.def_impl(lambda x, after: jax.jit(_depends_on_impl)(x, after))
mlir.register_lowering(_depends_on_p, mlir.lower_fun(_depends_on_impl, multiple_results=False))


def _depends_on_batch(args, dims):
    x, after = args
    xd, ad_ = dims
    if ad_ is not None:
        after = jnp.sum(after, axis=ad_)
    return _depends_on_p.bind(x, after), xd


def _depends_on_jvp(primals, tangents):
    x, after = primals
    dx, _ = tangents
    return _depends_on_p.bind(x, after), dx


batching.primitive_batchers[_depends_on_p] = _depends_on_batch
ad.primitive_jvps[_depends_on_p] = _depends_on_jvp


def _reduce_to_scalar(after):
    leaves = [jnp.sum(jnp.asarray(a).astype(jnp.float64)) for a in jax.tree_util.tree_leaves(after)]
    total = jnp.zeros((), jnp.float64)
    for leaf in leaves:
        total = total + leaf
    return jax.lax.stop_gradient(total)


def depends_on(x, after):
    """``x`` unchanged, but not computed before ``after`` (any pytree) is."""
    return _depends_on_p.bind(x, _reduce_to_scalar(after))
