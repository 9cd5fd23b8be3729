"""One Rosenbrock step, differentiable, with the linear solves as ``custom_linear_solve``.

Why ``jax.lax.custom_linear_solve``: it is JAX's own primitive for ``x = A^{-1} b`` given a
matvec and solve functions; its JVP solves ``A dx = db - dA x`` with the *same* solve function
(so tangents reuse this step's factorization: ``jacfwd`` over p parameters costs p right-hand
sides per stage, not p factorizations), its transpose calls our transposed solve (KLU
``tsolve``, dense ``trans=1``), and it batches under ``vmap``. JAX never differentiates through
the factorization or the refinement loop themselves, which is what lets them be FFI calls and
``while`` loops. (DESIGN.md records that ``linear_call`` failed for this and that a
``custom_vjp`` cannot be ``jvp``'d; ``custom_linear_solve`` composes with both directions.)
"""

from __future__ import annotations

import dataclasses
import jax
import jax.numpy as jnp
import numpy as np

from ..linear._base import SolveInfo, csr_matvec
from . import _rodas5p as tab


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


# What a solve changes in a factorization: its slots (chained after the solve, so the next solve on
# a handle waits for it) and what an "adaptive" fallback sets.
_CHANGING = ("low", "fp64", "upgraded", "fp64_ready")


def _zero_tangent(x):
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, dtype=jax.dtypes.float0)


def linear_solve(prepared, fac, b, modes: SolveModes, *, reverse: bool = False):
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
    values = fac["values"]
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

    @jax.custom_jvp
    def solve_stage(fac_, values_, rhs):
        x, new_fac, info = prepared.solve(fac_, rhs, modes.primal)
        return x, {k: new_fac[k] for k in _CHANGING if k in new_fac}, info

    @solve_stage.defjvp
    def solve_stage_jvp(primals, tangents):
        fac_, values_, rhs = primals
        _, dvalues, drhs = tangents
        x, changed, info = solve_stage(fac_, values_, rhs)
        dx, after_tangent, _ = prepared.solve(dict(fac_, **changed), drhs - matvec(dvalues, x), modes.tangent)
        # The next solve on these factors waits for the tangent solve too.
        changed = {k: after_tangent[k] for k in changed}
        zeros = jax.tree_util.tree_map(_zero_tangent, (changed, info))
        return (x, changed, info), (dx,) + zeros

    x, changed, info = solve_stage(frozen, values, b)
    return x, dict(fac, **changed), info


def add_info(a: SolveInfo, b: SolveInfo) -> SolveInfo:
    return SolveInfo(a.ok & b.ok, a.ir_steps + b.ir_steps, a.fallbacks + b.fallbacks)


def w_values(jac_values, diag, h):
    """Values of ``W = I/(h gamma) - J`` on the pattern."""
    c = 1.0 / (h * tab.GAMMA)
    return (-jac_values).at[diag].add(c)


def rodas_stages(problem, prepared, modes, t, y, h, p, jac_values, dT, f0, fac, t_cap, *, reverse=False):
    """The eight stages of one Rodas5P step from ``(t, y)`` with step ``h``.

    ``fac`` is the factorization of ``W`` for this ``h``; stage times are capped at ``t_cap``
    (just below a discontinuity the step lands on, so the left piece is integrated with its own
    right-hand side). Returns ``(y_new, error_vector, fac, info)``.
    """
    dtype = y.dtype
    A = jnp.asarray(tab.A, dtype)
    C = jnp.asarray(tab.C, dtype)
    inv_h = 1.0 / h
    ks = []
    info = SolveInfo.success()
    u = y
    for i in range(tab.STAGES):
        if i == 0:
            fi = f0
        else:
            if i <= 5:
                u = y
                for j in range(i):
                    u = u + A[i, j] * ks[j]
            else:
                u = u + ks[i - 1]
            tau = jnp.minimum(t + float(tab.C_TIME[i]) * h, t_cap)
            fi = problem.rhs(tau, u, p)
        rhs = fi
        for j in range(i):
            rhs = rhs + (C[i, j] * inv_h) * ks[j]
        if tab.D_TIME[i] != 0.0:
            rhs = rhs + (float(tab.D_TIME[i]) * h) * dT
        k, fac, step_info = linear_solve(prepared, fac, rhs, modes, reverse=reverse)
        info = add_info(info, step_info)
        ks.append(k)
    y_new = u + ks[-1]
    return y_new, ks[-1], fac, info


def jacobian_and_time_derivative(problem, t, y, p):
    """``(J values, df/dt, f)`` at ``(t, y)``."""
    jac = problem.jacobian_values(t, y, p)
    f0, dT = jax.jvp(lambda tt: problem.rhs(tt, y, p), (t,), (jnp.ones_like(t),))
    return jac, dT, f0


def full_step(problem, prepared, modes, workspace, t, y, h, p, t_cap):
    """A whole step as a function of ``(y, p)`` (for the reverse sweep): Jacobian, factorization,
    stages. Returns ``y_new``."""
    jac, dT, f0 = jacobian_and_time_derivative(problem, t, y, p)
    diag = jnp.asarray(problem.pattern.diagonal)
    fac = prepared.factor(workspace, w_values(jac, diag, h), modes.with_reverse)
    y_new, _, fac, _ = rodas_stages(problem, prepared, modes, t, y, h, p, jac, dT, f0, fac, t_cap, reverse=True)
    return y_new


def error_norm(err, y, y_new, rtol, atol):
    """Weighted RMS norm of the error estimate (Hairer and Wanner's)."""
    scale = atol + rtol * jnp.maximum(jnp.abs(y), jnp.abs(y_new))
    return jnp.sqrt(jnp.mean(jnp.square(err / scale)))

