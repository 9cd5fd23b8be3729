"""The integrators' linear solves, differentiable, with the factorization reused by tangents and
cotangents; the solve modes of one integration.

Why ``jax.lax.custom_linear_solve`` (reverse sweep) and a ``custom_jvp`` (forward loop): JAX never
differentiates through the factorization or the refinement loop themselves, which is what lets
them be FFI calls and ``while`` loops; the rules below solve with the *same* factors, so ``jacfwd``
over p parameters costs p right-hand sides per solve, not p factorizations, and a transposed solve
(KLU ``tsolve``, dense ``trans=1``) serves the adjoint. (DESIGN.md records that ``linear_call``
failed for this and that a ``custom_vjp`` cannot be ``jvp``'d; these two compose with both
directions.)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ..linear import Factorization, SolveInfo
from ..linear._base import csr_matvec


@dataclasses.dataclass(frozen=True)
class SolveModes:
    """Solve modes of one integration: primal, forward-sensitivity and reverse-sweep solves."""

    primal: str
    tangent: str
    reverse: str
    reverse_ir_tol: float | None = None

    @property
    def all(self) -> tuple[str, ...]:
        """Modes the forward loop factors for (primal and tangent solves)."""
        return tuple(dict.fromkeys((self.primal, self.tangent)))

    @property
    def with_reverse(self) -> tuple[str, ...]:
        """Modes a step inside the reverse sweep factors for (its recompute and its transpose)."""
        return tuple(dict.fromkeys((self.primal, self.tangent, self.reverse)))


def _zero_tangent(x):
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, dtype=jax.dtypes.float0)


def shifted_values(jac_values, diag, shift):
    """Values of ``shift * I - J`` on the pattern (``W = I/(h gamma) - J`` for ``shift = 1/(h gamma)``)."""
    return (-jac_values).at[diag].add(shift)


def linear_solve(prepared, fac: Factorization, b, modes: SolveModes, *, reverse: bool = False):
    """``x = W^{-1} b`` for the factorization ``fac``; differentiable in ``b`` and W's values.

    Returns ``(x, fac, info)`` (``fac`` upgraded if ``"adaptive"`` fell back to float64).

    Two differentiation rules, one per direction (both reuse ``fac``):

    * ``reverse=False`` (the integration loop): a ``custom_jvp`` whose tangent solves
      ``W dx = db - dW x`` in the forward-sensitivity mode; it also returns the solve's counters.
    * ``reverse=True`` (one step inside the adjoint sweep): ``jax.lax.custom_linear_solve``, whose
      transpose solves with ``W^T`` in the reverse-sweep mode, and whose JVP (forward over
      reverse: Hessian-vector products) solves with ``W`` again. (Its ``has_aux`` outputs come
      out batched under ``vmap`` of ``jvp``, which is why the loop does not use it.)
    """
    values = fac.values
    frozen = jax.lax.stop_gradient(fac)

    def matvec(v, x):
        return csr_matvec(prepared.rows, prepared.cols, prepared.n, v, x)

    if reverse:

        def solve(_matvec, rhs):
            return prepared.solve(frozen, rhs, modes.primal)[0]

        def transpose_solve(_vecmat, rhs):
            return prepared.solve(frozen, rhs, modes.reverse, transpose=True, ir_tol=modes.reverse_ir_tol)[0]

        x = jax.lax.custom_linear_solve(lambda x: matvec(values, x), b, solve, transpose_solve)
        return x, fac, SolveInfo.success(ok=jnp.all(jnp.isfinite(x)))

    # The solve changes only the factors (chained after it) and the adaptive flags: those are
    # what the rule returns, so the values and the workspace keep their own (un)batched layout.
    @jax.custom_jvp
    def solve_stage(fac_, values_, rhs):
        x, new_fac, info = prepared.solve(fac_, rhs, modes.primal)
        return x, new_fac.factors, info

    @solve_stage.defjvp
    def solve_stage_jvp(primals, tangents):
        fac_, values_, rhs = primals
        _, dvalues, drhs = tangents
        x, changed, info = solve_stage(fac_, values_, rhs)
        dx, after_tangent, _ = prepared.solve(fac_._replace(factors=changed), drhs - matvec(dvalues, x), modes.tangent)
        # The next solve on these factors waits for the tangent solve too.
        changed = after_tangent.factors
        zeros = jax.tree_util.tree_map(_zero_tangent, (changed, info))
        return (x, changed, info), (dx,) + zeros

    x, changed, info = solve_stage(frozen, values, b)
    return x, fac._replace(factors=changed), info
