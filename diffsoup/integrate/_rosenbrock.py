"""Rosenbrock methods: one factorization of ``W = I/(h gamma) - J`` per step, one solve per stage,
no Newton iteration; the coefficients come from a :class:`~diffsoup.integrate.RosenbrockTableau`.

By default (``stage_code="loop"``) stages 1..s-1 are one loop body over the tableau's rows, so a
program holds one copy of the right-hand side and of the solve per step function instead of one
per stage: several times less code for XLA to compile (the right-hand side, its derivatives and
the solves are most of a step). The stage sums keep the unrolled code's terms and order (masked,
not multiplied by zero); results agree with ``stage_code="unrolled"`` to rounding, not bit for
bit, because XLA:CPU contracts a multiply and an add into one FMA where they share a fused kernel,
and the two programs fuse differently. The same stage code serves the forward loop (solves with a
``custom_jvp``: forward sensitivities) and the reverse sweep's recomputed step
(``custom_linear_solve``: transposed solves on that step's factors).
"""

from __future__ import annotations

import abc
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ..linear import SolveInfo
from ._linear_solve import linear_solve, shifted_values
from ._method import AbstractReversibleIntegrator, Attempt, Work
from ._tableau import RosenbrockTableau


STAGE_CODES = ("loop", "unrolled")


class RosenbrockState(NamedTuple):
    """What a Rosenbrock method carries across attempts: the last attempt's Jacobian values,
    ``f_t`` and ``f``, reused by the retry after a rejection (the point did not move)."""

    jac: Any
    dT: Any
    f0: Any
    fresh: Any  # bool: jac, dT and f0 are those of the current (t, y)


def jacobian_and_time_derivative(problem, t, y, p):
    """``(J values, df/dt, f)`` at ``(t, y)``."""
    jac = problem.jacobian_values(t, y, p)
    f0, dT = jax.jvp(lambda tt: problem.rhs(tt, y, p), (t,), (jnp.ones_like(t),))
    return jac, dT, f0


class AbstractRosenbrock(AbstractReversibleIntegrator):
    """A Rosenbrock method defined by its ``tableau`` (a :class:`RosenbrockTableau`).

    A final subclass is a frozen dataclass that sets ``tableau`` as a class attribute
    (``tableau: ClassVar[RosenbrockTableau] = ...``); everything else (attempt,
    Jacobian reuse after a rejection, the reverse step of the adjoint) is here.
    """

    @property
    @abc.abstractmethod
    def tableau(self) -> RosenbrockTableau:
        """The method's coefficients (a final subclass sets it as a class attribute)."""

    @property
    def order(self) -> int:
        return self.tableau.order

    @property
    def error_order(self) -> int:
        return self.tableau.error_order

    def init(self, problem, t0, y0, p, f0) -> RosenbrockState:
        jac_shape = jax.eval_shape(problem.jacobian_values, t0, y0, p)
        return RosenbrockState(
            jac=jnp.zeros(jac_shape.shape, jac_shape.dtype), dT=jnp.zeros_like(y0), f0=f0, fresh=jnp.zeros((), bool)
        )

    def w_values(self, jac_values, diag, h):
        """Values of ``W = I/(h gamma) - J`` on the pattern."""
        return shifted_values(jac_values, diag, 1.0 / (h * self.tableau.gamma))

    @property
    def stage_code(self) -> str:
        """How the stages are written into the program: ``"loop"`` (one stage's code in a loop over
        the tableau's rows: a smaller program, which compiles faster) or ``"unrolled"`` (one copy
        per stage). They agree to rounding (see the module). A final subclass may make it a field
        (``ds.Rodas5P(stage_code=...)``)."""
        return "loop"

    def run_stages(self, problem, modes, t, y, h, p, dT, f0, fac, t_cap, *, reverse=False):
        """The stages of one step from ``(t, y)`` with step ``h`` and the factorization ``fac`` of
        ``W`` for this ``h``; stage times are capped at ``t_cap`` (just below a discontinuity the
        step lands on, so the left piece is integrated with its own right-hand side).

        Returns ``(y_new, error_vector, fac, info)``.
        """
        if self.stage_code == "unrolled":
            return self._unrolled_stages(problem, modes, t, y, h, p, dT, f0, fac, t_cap, reverse=reverse)
        if self.stage_code not in STAGE_CODES:
            raise ValueError(f"{type(self).__name__}.stage_code={self.stage_code!r} must be one of {STAGE_CODES}.")
        return self._looped_stages(problem, modes, t, y, h, p, dT, f0, fac, t_cap, reverse=reverse)

    def _looped_stages(self, problem, modes, t, y, h, p, dT, f0, fac, t_cap, *, reverse):
        """Stage 0 (which reuses ``f0``), then stages ``1..s-1`` as one loop body over the tableau's
        rows. The sums run over ``j = 0..s-2`` in order with the terms ``j >= i`` masked out (not
        multiplied by zero), so every stage adds the same terms in the same order as the unrolled
        code: the same numbers, bit for bit."""
        tab = self.tableau
        prepared = problem.prepared
        s = tab.stages
        chain = s if tab.chained_from is None else int(tab.chained_from)
        dtype = y.dtype
        A, C = jnp.asarray(tab.A, dtype), jnp.asarray(tab.C, dtype)
        c, d = jnp.asarray(tab.c, dtype), jnp.asarray(tab.d, dtype)
        inv_h = 1.0 / h
        rhs0 = f0
        if tab.d[0] != 0.0:
            rhs0 = rhs0 + (float(tab.d[0]) * h) * dT
        k0, fac, info = linear_solve(prepared, fac, rhs0, modes, reverse=reverse)
        ks = jnp.zeros((s,) + y.shape, dtype).at[0].set(k0)

        def stage(i, carry):
            ks, u, fac, info = carry
            summed = y
            for j in range(s - 1):
                summed = jnp.where(j < i, summed + A[i, j] * ks[j], summed)
            # Chained stages (Rodas kind): the previous stage's state plus its increment.
            u = jnp.where(i < chain, summed, u + ks[i - 1])
            tau = jnp.minimum(t + c[i] * h, t_cap)
            rhs = problem.rhs(tau, u, p)
            for j in range(s - 1):
                rhs = jnp.where(j < i, rhs + (C[i, j] * inv_h) * ks[j], rhs)
            rhs = jnp.where(d[i] != 0.0, rhs + (d[i] * h) * dT, rhs)
            k, fac, step_info = linear_solve(prepared, fac, rhs, modes, reverse=reverse)
            return ks.at[i].set(k), u, fac, info.combine(step_info)

        ks, u, fac, info = jax.lax.fori_loop(1, s, stage, (ks, y, fac, info))
        if chain < s:
            return u + ks[s - 1], ks[s - 1], fac, info
        return self._weighted_sums(y, [ks[j] for j in range(s)]) + (fac, info)

    def _weighted_sums(self, y, ks):
        """``(y + sum_j b_j k_j, sum_j b_error_j k_j)`` (unchained tableaus), in order of ``j``."""
        tab = self.tableau
        b, b_error = jnp.asarray(tab.b, y.dtype), jnp.asarray(tab.b_error, y.dtype)
        y_new, err = y, jnp.zeros_like(y)
        for j in range(len(ks)):
            y_new = y_new + b[j] * ks[j]
            err = err + b_error[j] * ks[j]
        return y_new, err

    def _unrolled_stages(self, problem, modes, t, y, h, p, dT, f0, fac, t_cap, *, reverse):
        """One copy of the stage code per stage, the tableau's zeros left out."""
        tab = self.tableau
        prepared = problem.prepared
        s = tab.stages
        chain = s if tab.chained_from is None else int(tab.chained_from)
        dtype = y.dtype
        A = jnp.asarray(tab.A, dtype)
        C = jnp.asarray(tab.C, dtype)
        inv_h = 1.0 / h
        ks = []
        info = SolveInfo.success()
        u = y
        for i in range(s):
            if i == 0:
                fi = f0
            else:
                if i < chain:
                    u = y
                    for j in range(i):
                        u = u + A[i, j] * ks[j]
                else:
                    u = u + ks[i - 1]
                tau = jnp.minimum(t + float(tab.c[i]) * h, t_cap)
                fi = problem.rhs(tau, u, p)
            rhs = fi
            for j in range(i):
                rhs = rhs + (C[i, j] * inv_h) * ks[j]
            if tab.d[i] != 0.0:
                rhs = rhs + (float(tab.d[i]) * h) * dT
            k, fac, step_info = linear_solve(prepared, fac, rhs, modes, reverse=reverse)
            info = info.combine(step_info)
            ks.append(k)
        if chain < s:
            return u + ks[-1], ks[-1], fac, info
        return self._weighted_sums(y, ks) + (fac, info)

    def attempt(self, problem, cfg, workspace, state: RosenbrockState, t, y, h, p, t_cap) -> Attempt:
        jac, dT, f0 = jax.lax.cond(
            state.fresh,
            lambda: (state.jac, state.dT, state.f0),
            lambda: jacobian_and_time_derivative(problem, t, y, p),
        )
        diag = jnp.asarray(problem.pattern.diagonal)
        fac = problem.prepared.factor(workspace, self.w_values(jac, diag, h), cfg.modes.all)
        y_new, err, fac, info = self.run_stages(problem, cfg.modes, t, y, h, p, dT, f0, fac, t_cap)
        s = self.tableau.stages
        work = Work(
            n_jac=(~state.fresh).astype(jnp.int32), n_factor=1, n_solves=s, n_ir_steps=info.ir_steps,
            n_fallbacks=info.fallbacks, n_rhs=(s - 1) + jnp.where(state.fresh, 0, problem.pattern.n_colors + 1),
        )  # fmt: skip
        return Attempt(y_new, err, info.ok, jnp.ones((), bool), work, RosenbrockState(jac, dT, f0, state.fresh))

    def conclude(self, state: RosenbrockState, accepted) -> RosenbrockState:
        # After a rejection the retry starts from the same point: keep its Jacobian.
        return state._replace(fresh=~accepted)

    def checkpoint(self, state: RosenbrockState):
        return ()  # a replayed step recomputes its Jacobian

    def resume(self, template: RosenbrockState, saved) -> RosenbrockState:
        return template._replace(fresh=jnp.zeros((), bool))

    def reverse_step(self, problem, modes, workspace, t, y, h, p, t_cap):
        jac, dT, f0 = jacobian_and_time_derivative(problem, t, y, p)
        diag = jnp.asarray(problem.pattern.diagonal)
        fac = problem.prepared.factor(workspace, self.w_values(jac, diag, h), modes.with_reverse)
        y_new, _, _, _ = self.run_stages(problem, modes, t, y, h, p, dT, f0, fac, t_cap, reverse=True)
        return y_new
