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
        return tuple(dict.fromkeys((self.primal, self.tangent)))


_CHANGING = ("fp64", "upgraded", "fp64_ready")  # what an "adaptive" fallback changes in a factorization


def linear_solve(prepared, fac, b, modes: SolveModes):
    """``x = W^{-1} b`` for the factorization ``fac``; differentiable in ``b`` and W's values.

    Returns ``(x, fac, info)`` (``fac`` upgraded if ``"adaptive"`` fell back to float64).
    """
    values = fac["values"]
    frozen_fac = jax.lax.stop_gradient(fac)

    def matvec(x):
        return csr_matvec(prepared.rows, prepared.cols, prepared.n, values, x)

    def solve_with(mode, transpose=False, ir_tol=None):
        def solve(_linear_map, rhs):
            x, new_fac, info = prepared.solve(frozen_fac, rhs, mode, transpose=transpose, ir_tol=ir_tol)
            return x, ({k: new_fac[k] for k in _CHANGING if k in new_fac}, info)

        return solve

    transpose_solve = solve_with(modes.reverse, True, modes.reverse_ir_tol)
    if modes.tangent == modes.primal:
        x, (changed, info) = jax.lax.custom_linear_solve(
            matvec, b, solve_with(modes.primal), transpose_solve, has_aux=True
        )
    else:
        # The primal in its own mode; tangents through a solve in the forward-sensitivity mode.
        x0, (changed, info) = solve_with(modes.primal)(None, jax.lax.stop_gradient(b))
        xt, _ = jax.lax.custom_linear_solve(matvec, b, solve_with(modes.tangent), transpose_solve, has_aux=True)
        x = x0 + (xt - jax.lax.stop_gradient(xt))
    return x, dict(fac, **changed), info


def add_info(a: SolveInfo, b: SolveInfo) -> SolveInfo:
    return SolveInfo(a.ok & b.ok, a.ir_steps + b.ir_steps, a.fallbacks + b.fallbacks)


def w_values(jac_values, diag, h):
    """Values of ``W = I/(h gamma) - J`` on the pattern."""
    c = 1.0 / (h * tab.GAMMA)
    return (-jac_values).at[diag].add(c)


def rodas_stages(problem, prepared, modes, t, y, h, p, jac_values, dT, f0, fac, t_cap):
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
            tau = jnp.minimum(t + tab.C_TIME[i] * h, t_cap)
            fi = problem.rhs(tau, u, p)
        rhs = fi
        for j in range(i):
            rhs = rhs + (C[i, j] * inv_h) * ks[j]
        if tab.D_TIME[i] != 0.0:
            rhs = rhs + (tab.D_TIME[i] * h) * dT
        k, fac, step_info = linear_solve(prepared, fac, rhs, modes)
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
    stages. Returns ``(y_new, workspace_after)``."""
    jac, dT, f0 = jacobian_and_time_derivative(problem, t, y, p)
    diag = jnp.asarray(problem.pattern.diagonal)
    fac = prepared.factor(workspace, w_values(jac, diag, h), modes.all)
    y_new, _, fac, _ = rodas_stages(problem, prepared, modes, t, y, h, p, jac, dT, f0, fac, t_cap)
    return y_new


def error_norm(err, y, y_new, rtol, atol):
    """Weighted RMS norm of the error estimate (Hairer and Wanner's)."""
    scale = atol + rtol * jnp.maximum(jnp.abs(y), jnp.abs(y_new))
    return jnp.sqrt(jnp.mean(jnp.square(err / scale)))

