"""Implicit (backward) Euler with simplified Newton iterations: ``ds.integrate.ImplicitEuler``.

Method:
    order 1; ``y_new`` solves ``y_new = y + h f(t + h, y_new)`` by simplified Newton iterations
    from the explicit Euler predictor ``y + h f(t, y)``: one factorization of
    ``W = I/h - J(t, y)`` per step attempt, reused by every iteration (and by the retry after a
    rejection keeps the Jacobian, since the point did not move).
Stability:
    L-stable; first order, so it needs many steps at tight tolerances: it is here as the simplest
    implicit method behind the integrator interface (a Newton loop, state carried across steps),
    and as a reference, not for production fits (use ``ds.Rodas5P()``).
Error estimate:
    the local error ``-h^2/2 y''`` estimated from the difference to the predictor,
    ``(y_new - y_pred)/2``, filtered by ``(I - h J)^{-1}`` (one more solve with the same factors)
    so that stiff components, which the explicit predictor gets wildly wrong, do not dominate it
    (Shampine's filter, as in Hairer and Wanner's RADAU5).
Newton iteration:
    stops when the weighted RMS norm of a correction (the error test's weights
    ``atol + rtol |y|``) is at most ``newton_tol``; an iteration that has not converged after
    ``max_newton_steps`` corrections, or whose correction does not shrink, or whose linear solve
    fails, makes the attempt a rejected step (retried with a quarter of the step; a step that
    cannot shrink further ends the solve as ``STEP_TOO_SMALL``).
Derivatives:
    forward mode (``adjoint=ds.ForwardMode()``: ``jax.jvp``, ``jax.jacfwd``) differentiates the
    iterations as they ran (exact derivatives of the discrete solution). Reverse mode is not
    available: the checkpointed adjoint needs a step that is a fixed function of ``(y, p)``, and
    the number of Newton iterations is not.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, final

import jax
import jax.numpy as jnp
import numpy as np

from ..linear import SolveInfo
from ._linear_solve import linear_solve, shifted_values
from ._method import AbstractIntegrator, Attempt, Work


class ImplicitEulerState(NamedTuple):
    """The last attempt's Jacobian values and ``f(t, y)``, reused by the retry after a rejection."""

    jac: Any
    f0: Any
    fresh: Any  # bool: jac and f0 are those of the current (t, y)


class _Newton(NamedTuple):
    z: Any
    fac: Any
    info: Any
    norm: Any  # weighted RMS norm of the last correction
    k: Any  # corrections so far
    converged: Any
    diverged: Any


@final
@dataclasses.dataclass(frozen=True)
class ImplicitEuler(AbstractIntegrator):
    """Implicit (backward) Euler with simplified Newton iterations, order 1 (see the module).

    Args:
        newton_tol: the iteration has converged when the weighted RMS norm of its correction
            (weights ``atol + rtol |y|``, as the error test's) is at most this.
        max_newton_steps: most Newton corrections per step attempt.

    Raises:
        ValueError: for a non-positive ``newton_tol`` or ``max_newton_steps``.
    """

    newton_tol: float = 0.01
    max_newton_steps: int = 8

    def __post_init__(self):
        if not (float(self.newton_tol) > 0.0 and np.isfinite(self.newton_tol)):
            raise ValueError(f"ImplicitEuler.newton_tol={self.newton_tol!r} must be positive and finite.")
        if isinstance(self.max_newton_steps, bool) or int(self.max_newton_steps) < 1:
            raise ValueError(f"ImplicitEuler.max_newton_steps={self.max_newton_steps!r} must be a positive integer.")

    @property
    def order(self) -> int:
        return 1

    @property
    def error_order(self) -> int:
        return 1

    def init(self, problem, t0, y0, p, f0) -> ImplicitEulerState:
        jac_shape = jax.eval_shape(problem.jacobian_values, t0, y0, p)
        return ImplicitEulerState(jnp.zeros(jac_shape.shape, jac_shape.dtype), f0, jnp.zeros((), bool))

    def attempt(self, problem, cfg, workspace, state: ImplicitEulerState, t, y, h, p, t_cap) -> Attempt:
        prepared = problem.prepared
        jac, f0 = jax.lax.cond(
            state.fresh,
            lambda: (state.jac, state.f0),
            lambda: (problem.jacobian_values(t, y, p), problem.rhs(t, y, p)),
        )
        diag = jnp.asarray(problem.pattern.diagonal)
        fac = prepared.factor(workspace, shifted_values(jac, diag, 1.0 / h), cfg.modes.all)
        tau = jnp.minimum(t + h, t_cap)
        weights = jax.lax.stop_gradient(cfg.atol + cfg.rtol * jnp.abs(y))
        y_pred = y + h * f0

        def cond(it: _Newton):
            return ~it.converged & ~it.diverged & (it.k < self.max_newton_steps)

        def body(it: _Newton) -> _Newton:
            # W dz = f(t + h, z) - (z - y)/h: a Newton correction of z - y - h f(t + h, z) = 0
            # (divided by h), with the Jacobian of the step's start.
            residual = problem.rhs(tau, it.z, p) - (it.z - y) / h
            dz, fac_, solve_info = linear_solve(prepared, it.fac, residual, cfg.modes)
            # A non-finite residual is the iteration diverging, not the linear solver failing.
            solved = solve_info.ok | ~jnp.all(jnp.isfinite(residual))
            norm = jax.lax.stop_gradient(jnp.sqrt(jnp.mean(jnp.square(dz / weights))))
            shrinking = (it.k == 0) | (norm < it.norm)
            return _Newton(
                z=it.z + dz, fac=fac_, info=it.info.combine(solve_info._replace(ok=solved)), norm=norm, k=it.k + 1,
                converged=norm <= self.newton_tol,
                diverged=~jnp.isfinite(norm) | ~shrinking | ~solve_info.ok,
            )  # fmt: skip

        start = _Newton(
            z=y_pred, fac=fac, info=SolveInfo.success(), norm=jnp.asarray(jnp.inf, y.dtype),
            k=jnp.zeros((), jnp.int32), converged=jnp.zeros((), bool), diverged=jnp.zeros((), bool),
        )  # fmt: skip
        it = jax.lax.while_loop(cond, body, start)
        converged = it.converged & jnp.all(jnp.isfinite(it.z))
        # The local error -h^2/2 y'' ~ (z - y_pred)/2, filtered: (I - h J)^{-1} v = W^{-1} (v / h).
        # A diverged iteration is a rejected step, not a non-finite state: it hands back y.
        err_rhs = jnp.where(converged, (it.z - y_pred) / (2.0 * h), 0.0)
        err, _, err_info = linear_solve(prepared, it.fac, err_rhs, cfg.modes)
        info = it.info.combine(err_info)
        y_new = jnp.where(converged, it.z, y)
        work = Work(
            n_jac=(~state.fresh).astype(jnp.int32), n_factor=1, n_solves=it.k + 1, n_ir_steps=info.ir_steps,
            n_fallbacks=info.fallbacks, n_rhs=it.k + jnp.where(state.fresh, 0, problem.pattern.n_colors + 1),
        )  # fmt: skip
        return Attempt(y_new, err, info.ok, converged, work, ImplicitEulerState(jac, f0, state.fresh))

    def conclude(self, state: ImplicitEulerState, accepted) -> ImplicitEulerState:
        return state._replace(fresh=~accepted)
