"""Rosenbrock methods: one factorization of ``W = I/(h gamma) - J`` per step, one solve per stage,
no Newton iteration; the coefficients come from a :class:`~diffsoup.integrate.RosenbrockTableau`.

With ``stage_code="loop"`` stages 1..s-1 are one loop body over the tableau's rows, so a program
holds one copy of the right-hand side and of the solve per step function instead of one per stage:
several times less code for XLA to compile when the right-hand side is most of a step (models of
tens of reactions: the Boehm model's value-and-gradient program compiles in half the time). The
stage sums are the stacked increments weighted term by term in the forward loop and products of
a tableau row with them in the reverse sweep (``_looped_stages`` says why); results agree with the unrolled
stages to rounding (not bit for bit: the sums' order differs, and XLA:CPU contracts a
multiply and an add into one FMA where they share a fused kernel, which differs between programs
anyway). A loop iteration has a fixed cost at run time, which shows for small right-hand sides
(ROBER's three states: some 10 % per call) and is lost in the work of larger ones (in vmapped
chunks the loop measured faster than the unrolled code); ``stage_code="auto"``, the default,
chooses by the size of the right-hand side. The same stage code serves the forward loop (solves
with a ``custom_jvp``: forward sensitivities) and the reverse sweep's recomputed step
(``custom_linear_solve``: transposed solves on that step's factors).
"""

from __future__ import annotations

import abc
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..linear import SolveInfo
from ._linear_solve import linear_solve, shifted_values
from ._method import AbstractReversibleIntegrator, Attempt, Work
from ._tableau import RosenbrockTableau


STAGE_CODES = ("auto", "loop", "unrolled")
# stage_code="auto" writes the stages as a loop from this many operations in the right-hand side.
LOOP_FROM_RHS_OPERATIONS = 48


def _operations(jaxpr) -> int:
    """Equations of a jaxpr, those of its inner jaxprs included."""
    count = 0
    for eqn in jaxpr.eqns:
        count += 1
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    count += _operations(inner)
    return count


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
        """How the stages are written into the program: ``"loop"``, ``"unrolled"`` or ``"auto"``
        (see :class:`~diffsoup.integrate.Rodas5P`). A final subclass may make it a field
        (``ds.Rodas5P(stage_code=...)``)."""
        return "auto"

    def resolved_stage_code(self, problem, t, y, p) -> str:
        """``"loop"`` or ``"unrolled"`` for ``problem``: ``"auto"`` takes the loop when the
        right-hand side has at least ``LOOP_FROM_RHS_OPERATIONS`` operations (then its seven copies
        are most of a step's code), the unrolled stages below that (the loop's per-iteration cost
        then shows at run time, and there is little code to save)."""
        code = self.stage_code
        if code not in STAGE_CODES:
            raise ValueError(f"{type(self).__name__}.stage_code={code!r} must be one of {STAGE_CODES}.")
        if code != "auto":
            return code
        abstract = [jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)) for x in (t, y, p)]
        size = _operations(jax.make_jaxpr(problem.rhs)(*abstract).jaxpr)
        return "loop" if size >= LOOP_FROM_RHS_OPERATIONS else "unrolled"

    def run_stages(self, problem, modes, t, y, h, p, dT, f0, fac, t_cap, *, reverse=False):
        """The stages of one step from ``(t, y)`` with step ``h`` and the factorization ``fac`` of
        ``W`` for this ``h``; stage times are capped at ``t_cap`` (just below a discontinuity the
        step lands on, so the left piece is integrated with its own right-hand side).

        Returns ``(y_new, error_vector, fac, info)``.
        """
        if self.resolved_stage_code(problem, t, y, p) == "unrolled":
            return self._unrolled_stages(problem, modes, t, y, h, p, dT, f0, fac, t_cap, reverse=reverse)
        return self._looped_stages(problem, modes, t, y, h, p, dT, f0, fac, t_cap, reverse=reverse)

    def _looped_stages(self, problem, modes, t, y, h, p, dT, f0, fac, t_cap, *, reverse):
        """Stage 0 (which reuses ``f0``), then stages ``1..s-1`` as one loop body over the tableau's
        rows. The increments are stacked in an ``(s, n)`` array (rows not computed yet are zeros,
        which the tableau's zeros meet), and stage ``i`` needs the sums ``sum_j A_ij k_j`` and
        ``sum_j C_ij k_j`` over it, formed in one of two ways:

        * forward loop (``reverse=False``): a weighted sum of the ``s`` rows, written out term by
          term, so one fused kernel reads each increment once and no axis is moved. Two other
          forms cost more. A product of a tableau row with the stacked increments: under
          ``jacfwd`` the stage axis of the increments' tangents is not their minor one, and
          XLA:CPU transposed the whole array twice per stage to feed the dot (Gauss-Newton
          evaluations of Bruno, Fujita, Brannmark and Weber 2.1-2.5x as long). Running sums (every
          sum that uses ``k_j`` updated after stage ``j``, an ``(2 s + 2, n)`` array): each stage
          rewrote all ``2 s + 2`` rows of every tangent, the largest kernel of a
          forward-sensitivity step on the H200 (10,000 lanes, 25 tangents: 0.4 ms per stage), and
          on the 2-core CPU the network study's Jacobian (128 lanes) took 10-25 % longer.
        * reverse sweep (``reverse=True``): each stage's sums one product of a tableau row with the
          stacked increments. Its reverse pass keeps half the carry of running sums', and
          measured faster there (Weber's adjoint gradient 78 ms against 102 ms).
        """
        tab = self.tableau
        prepared = problem.prepared
        s = tab.stages
        chain = s if tab.chained_from is None else int(tab.chained_from)
        dtype = y.dtype
        c, d = jnp.asarray(tab.c, dtype), jnp.asarray(tab.d, dtype)
        inv_h = 1.0 / h
        rows = np.concatenate([tab.A, tab.C])  # row i: stage i's A sum; row s + i: its C sum
        table = jnp.asarray(rows, dtype)

        def record(store, j, k):  # store: the increments (s, n)
            return store.at[j].set(k)

        if reverse:

            def stage_sums(store, i):
                exact = jax.lax.Precision.HIGHEST  # no reduced-precision products (TF32 on GPUs)
                return jnp.matmul(table[i], store, precision=exact), jnp.matmul(table[s + i], store, precision=exact)

        else:
            # Only the increments some stage's sums use: stage i reads k_0 .. k_{i-1}.
            used = [j for j in range(s) if np.any(rows[:, j] != 0.0)]

            def stage_sums(store, i):
                a_weights, c_weights = table[i], table[s + i]
                a_sum = sum(a_weights[j] * store[j] for j in used)
                c_sum = sum(c_weights[j] * store[j] for j in used)
                return a_sum, c_sum

        store = jnp.zeros((s,) + y.shape, dtype)

        rhs0 = f0
        if tab.d[0] != 0.0:
            rhs0 = rhs0 + (float(tab.d[0]) * h) * dT
        k0, fac, info = linear_solve(prepared, fac, rhs0, modes, reverse=reverse)
        store = record(store, 0, k0)

        # Differentiated in reverse (the adjoint's step), the loop would keep every intermediate of
        # the right-hand side of every stage (many small stacked arrays for a model written value
        # by value); recomputing it from (tau, u) in the reverse pass measured faster.
        rhs_fn = jax.checkpoint(problem.rhs) if reverse else problem.rhs

        def stage(i, carry):
            store, u, k_prev, fac, info = carry
            a_sum, c_sum = stage_sums(store, i)
            # Chained stages (Rodas kind): the previous stage's state plus its increment.
            u = jnp.where(i < chain, y + a_sum, u + k_prev)
            tau = jnp.minimum(t + c[i] * h, t_cap)
            rhs = rhs_fn(tau, u, p) + c_sum * inv_h
            rhs = jnp.where(d[i] != 0.0, rhs + (d[i] * h) * dT, rhs)
            k, fac, step_info = linear_solve(prepared, fac, rhs, modes, reverse=reverse)
            return record(store, i, k), u, k, fac, info.combine(step_info)

        store, u, k_last, fac, info = jax.lax.fori_loop(1, s, stage, (store, y, k0, fac, info))
        if chain < s:
            return u + k_last, k_last, fac, info
        return self._weighted_sums(y, [store[j] for j in range(s)]) + (fac, info)

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
