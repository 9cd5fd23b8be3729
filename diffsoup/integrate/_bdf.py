"""Variable-order BDF with factorizations kept across steps: ``ds.BDF``.

Method:
    the backward differentiation formulas of orders 1 to ``max_order`` (5), or the numerical
    differentiation formulas (NDF, the default, as MATLAB's ``ode15s`` and scipy's ``BDF``), in
    quasi-constant step size form: the history is the backward differences of the interpolating
    polynomial at equally spaced points, re-sampled when the step size changes
    (:mod:`~diffsoup.integrate._bdf_coefficients`). A step solves its corrector by modified Newton
    iterations (:mod:`~diffsoup.integrate._bdf_newton`).
Factorizations (CVODE's strategy): the Jacobian and the factorization of ``I - c J``
    (``c = h / alpha_k``) are kept across steps. The factorization is made again when ``c`` has
    changed by more than a factor ``1 + lu_change`` (2) since it was made, after ``max_lu_age``
    (50) steps, or with a new Jacobian; the Jacobian is evaluated again after a Newton failure with an old one
    (the attempt is retried with the same step), after ``max_jac_age`` steps, and after a
    discontinuity. Between refreshes the iterations correct for the changed ``c`` (see
    ``_bdf_newton``), and the step size is changed only when it can grow by half or more (or must
    shrink), as CVODE does, so that a factorization serves many steps.
Error control and order selection (Shampine and Reichelt; scipy's ``BDF``):
    the local error ``error_const_k * (y_new - y_pred)`` in the weighted RMS norm of the loop;
    after ``k + 1`` steps at one step size and order, the errors estimated for orders ``k - 1``,
    ``k``, ``k + 1`` give the step size each could take, and the largest wins (capped at 10x).
    A rejected step shrinks by ``max(0.2, 0.9 err^(-1/(k+1)))`` (by 10 after two failures in a
    row); a Newton failure with a fresh Jacobian by 4.
Outputs and discontinuities:
    every output time and discontinuity is a step endpoint, as for every method of the loop
    (exact outputs, no interpolation); the loop reaches a target that is between one and two
    steps ahead in two equal steps (no sliver, which would spoil the history), and after a step
    that the loop shortened the step size returns to what it was (at most doubling). At a
    discontinuity the method restarts at order 1 with a new starting step (Hairer and Wanner's
    estimate) and a new Jacobian: the history does not extend across it.
Batching (``vmap``):
    each experiment keeps its own step size, order, history and factorization, but lanes run in
    lock-step, and a conditional whose lanes disagree runs both branches: the Jacobian and the
    factorization are then computed at every step attempt of every lane (lanes that keep theirs
    re-factor the same matrix), so the savings of reuse are lost under ``vmap``; Rosenbrock
    (``ds.Rodas5P()``), which factors once per step anyway and takes fewer, larger steps at
    moderate tolerances, is then the better choice for batches of small systems.
``ConstantStep``:
    a constant step size with no error control: the order rises by one every ``k + 1`` steps up
    to ``max_order`` and stays there (for convergence-order tests), and the Jacobian and the
    factorization are made at every step (a Newton failure cannot be retried).
Derivatives:
    both directions give the derivatives of the BDF solution whose corrector is solved exactly,
    at the accepted step sizes and orders (the forward pass stops its iterations within
    ``newton_tol``; that difference is not differentiated, so the derivatives converge with the
    tolerance and agree with finite differences of the solution to about the tolerance). Forward
    mode (``adjoint=ds.ForwardMode()``) differentiates each step's corrector by the implicit
    function theorem with the step's factorization (``_bdf_newton``). Reverse mode
    (``ds.CheckpointAdjoint()``, the default) is the discrete adjoint of the steps: the reverse
    sweep carries the cotangent of the history as well as of the state, and each step is
    recomputed with a factorization of its own (one more per accepted step than the forward
    pass made, as for Rosenbrock) and differentiated implicitly. A step record keeps the
    history, the Jacobian and the controller state: ``(max_order + 3) n + nnz`` numbers, against
    ``n`` for Rosenbrock (``CheckpointAdjoint(checkpoints=...)`` bounds how many).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, final

import jax
import jax.numpy as jnp
import numpy as np

from ..linear import Factorization
from ._bdf_coefficients import MAX_ORDER, advance, coefficients, predict, rescale, start_history
from ._bdf_newton import exact_corrector, solve_corrector
from ._linear_solve import SolveModes, shifted_values
from ._loop import error_norm
from ._method import AbstractReversibleIntegrator, Attempt, Work

# A step size grows only by this factor or more (CVODE's THRESH): a factorization serves on.
GROW_THRESHOLD = 1.5
MAX_GROWTH = 10.0


class BDFHistory(NamedTuple):
    """What an accepted and a rejected attempt leave differently.

    Attributes:
        D: the history, ``(max_order + 3, n)`` differences at spacing ``h_D``.
        h_D: the spacing of ``D`` (1 for a history started from ``[y, y']``).
        order: the order of the next step (int32).
        n_equal: accepted steps since the step size or the order last changed (int32).
        h_next: the step size to try next (NaN before the first step: the loop's choice).
        jac_age, lu_age: accepted steps since the Jacobian, the factorization (int32).
        need_jac: evaluate the Jacobian at the next attempt.
        error_failures: error-test failures in a row at the current step.
    """

    D: Any
    h_D: Any
    order: Any
    n_equal: Any
    h_next: Any
    jac_age: Any
    lu_age: Any
    need_jac: Any
    error_failures: Any


class BDFState(NamedTuple):
    """The method's state in the loop's carry.

    Attributes:
        history: what the next attempt starts from.
        if_accepted: what the last attempt leaves if the loop accepts it (:meth:`BDF.conclude`
            picks between the two).
        jac: the Jacobian values of the factorization.
        c_lu: ``c = h / alpha_k`` of the factorization (0: none yet).
        factors: the linear solver's factors of ``I / c_lu - J``.
        rate: the Newton iterations' convergence-rate estimate.
        lu_missing: the factors must be made again from ``jac`` and ``c_lu`` before use (a state
            restored from a checkpoint keeps no factors).
    """

    history: BDFHistory
    if_accepted: BDFHistory
    jac: Any
    c_lu: Any
    factors: Any
    rate: Any
    lu_missing: Any


def _rms(x, w):
    return jnp.sqrt(jnp.mean(jnp.square(x / w)))


@final
@dataclasses.dataclass(frozen=True)
class BDF(AbstractReversibleIntegrator):
    """Variable-order, variable-step BDF/NDF with factorizations reused across steps (see the module).

    Args:
        max_order: highest order (1 to 5).
        ndf: the numerical differentiation formulas (Klopfenstein, Shampine and Reichelt's
            coefficients: more accurate at orders 1-4, as stable); False: the plain BDFs.
        newton_tol: the corrector has converged when its error, estimated from the rate of
            convergence, is at most this in the error test's weighted RMS norm (raised to
            ``10 eps / rtol`` where that is larger: round-off). 0.1 is a tenth of what the error
            test allows, about CVODE's choice; scipy's ``BDF`` asks for ``min(0.03, sqrt(rtol))``,
            which measured 1.6x the iterations on the Brusselator (N = 32, rtol 1e-6, each a
            sparse solve) for the same accuracy.
        max_newton_iters: most corrector iterations per attempt.
        lu_change: make the factorization again when ``c = h / alpha_k`` has changed by more than
            a factor ``1 + lu_change`` (either way) since it was made. With the corrections
            scaled for the change, the iterations contract by ``|r - 1| / (r + 1)`` (``r`` the
            ratio), at most 1/3 within a factor 2: CVODE's 0.3 (``r`` in [0.7, 1.3]) measured
            twice the factorizations on the Brusselator (N = 64, rtol 1e-6: 83 against 41) for
            15 % fewer iterations; at N = 64 a factorization costs about 12 solves.
        max_lu_age: make the factorization again after this many steps (CVODE: 20).
        max_jac_age: evaluate the Jacobian again after this many steps.

    Raises:
        ValueError: for a ``max_order`` outside 1..5 or a non-positive setting.
    """

    max_order: int = 5
    ndf: bool = True
    newton_tol: float = 0.1
    max_newton_iters: int = 4
    lu_change: float = 1.0
    max_lu_age: int = 50
    max_jac_age: int = 50

    lands_evenly = True
    newton_stats = True

    def __post_init__(self):
        if isinstance(self.max_order, bool) or int(self.max_order) != self.max_order or not 1 <= self.max_order <= MAX_ORDER:
            raise ValueError(f"BDF.max_order={self.max_order!r} must be an integer from 1 to {MAX_ORDER}.")
        if not isinstance(self.ndf, bool):
            raise ValueError(f"BDF.ndf={self.ndf!r} must be True or False.")
        if not (float(self.newton_tol) > 0.0 and np.isfinite(self.newton_tol)):
            raise ValueError(f"BDF.newton_tol={self.newton_tol!r} must be positive and finite.")
        for name in ("max_newton_iters", "max_lu_age", "max_jac_age"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or int(value) < 1:
                raise ValueError(f"BDF.{name}={value!r} must be a positive integer.")
        if not (float(self.lu_change) > 0.0 and np.isfinite(self.lu_change)):
            raise ValueError(f"BDF.lu_change={self.lu_change!r} must be positive and finite.")

    @property
    def order(self) -> int:
        return int(self.max_order)

    @property
    def error_order(self) -> int:
        return 1  # the first steps are of order 1 (the loop's starting step size)

    # -- state ------------------------------------------------------------------------------------

    def _state(self, problem, modes: SolveModes, t0, y0, p, f0, workspace=None) -> BDFState:
        dtype = y0.dtype
        rows = int(self.max_order) + 3
        jac_shape = jax.eval_shape(problem.jacobian_values, t0, y0, p)
        jac = jnp.zeros(jac_shape.shape, jac_shape.dtype)
        prepared = problem.prepared
        values = shifted_values(jac, jnp.asarray(problem.pattern.diagonal), jnp.ones((), dtype))
        if workspace is None:
            shape = jax.eval_shape(lambda v: prepared.factor(prepared.begin(v, modes.all), v, modes.all).factors, values)
        else:
            shape = jax.eval_shape(lambda w, v: prepared.factor(w, v, modes.all).factors, workspace, values)
        factors = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shape)
        zero = jnp.zeros((), jnp.int32)
        history = BDFHistory(
            D=start_history(rows, y0, f0), h_D=jnp.ones((), dtype), order=jnp.ones((), jnp.int32), n_equal=zero,
            h_next=jnp.full((), jnp.nan, dtype), jac_age=zero, lu_age=zero, need_jac=jnp.ones((), bool),
            error_failures=zero,
        )  # fmt: skip
        return BDFState(history, history, jac, jnp.zeros((), dtype), factors, jnp.full((), 0.5, dtype),
                        jnp.ones((), bool))  # fmt: skip

    def init(self, problem, t0, y0, p, f0) -> BDFState:
        prec = problem.precision
        modes = SolveModes(prec.effective_solve_mode, prec.effective_forward_sensitivity_solve_mode,
                           prec.effective_reverse_sensitivity_solve_mode, prec.adjoint_ir_tol)  # fmt: skip
        return self._state(problem, modes, t0, y0, p, f0)

    def start(self, problem, cfg, workspace, t0, y0, p, f0) -> BDFState:
        return self._state(problem, cfg.modes, t0, y0, p, f0, workspace)

    def proposed_step(self, state: BDFState):
        return state.history.h_next

    def conclude(self, state: BDFState, accepted) -> BDFState:
        history = jax.tree_util.tree_map(lambda a, r: jnp.where(accepted, a, r), state.if_accepted, state.history)
        return state._replace(history=history)

    # -- one attempt ------------------------------------------------------------------------------

    def newton_tolerance(self, rtol, dtype):
        """The corrector's tolerance (weighted RMS norm) at ``rtol``."""
        eps = jnp.finfo(dtype).eps
        return jnp.maximum(10.0 * eps / rtol, self.newton_tol).astype(dtype)

    def attempt(self, problem, cfg, workspace, state: BDFState, t, y, h, p, t_cap) -> Attempt:
        prepared = problem.prepared
        dtype = y.dtype
        sg = jax.lax.stop_gradient
        kmax = int(self.max_order)
        rows = kmax + 3
        gamma, alpha, econst = (jnp.asarray(c, dtype) for c in coefficients(self.ndf))
        hist = state.history
        k = hist.order
        fixed = cfg.fixed_step

        # The history at this attempt's step size, the predictor and the corrector's constant.
        factor = (h / hist.h_D).astype(dtype)
        D = rescale(hist.D, k, factor)
        y_pred, psi = predict(D, k, self._psi_weights(gamma, alpha, k, rows))
        tau = jnp.minimum(t + h, t_cap)
        c = (h / alpha[k]).astype(dtype)

        # Jacobian and factorization, kept across steps. Under vmap both branches of a cond run:
        # the factorization is always given the values its lane means to use.
        need_jac = hist.need_jac | (hist.jac_age >= self.max_jac_age)
        if fixed:
            need_jac = jnp.ones((), bool)
        jac = jax.lax.cond(need_jac, lambda: problem.jacobian_values(*sg((tau, y_pred, p))), lambda: state.jac)
        jac = sg(jac)
        # Within a factor 1 + lu_change either way (c_lu = 0 before the first factorization: the
        # ratio is infinite).
        spread = jnp.abs(jnp.log(c / state.c_lu))
        need_lu = need_jac | ~(spread <= np.log1p(self.lu_change)) | (hist.lu_age >= self.max_lu_age)
        c_lu = jnp.where(need_lu, c, state.c_lu)
        diag = jnp.asarray(problem.pattern.diagonal)
        values = shifted_values(jac, diag, 1.0 / c_lu)
        refactor = need_lu | state.lu_missing

        def factor_now():
            new = prepared.factor(workspace, values, cfg.modes.all).factors
            if new.upgraded is not None:
                # A factorization restored from a checkpoint keeps its adaptive upgrade.
                new = new._replace(upgraded=jnp.where(need_lu, new.upgraded, state.factors.upgraded))
            return new

        factors = jax.lax.cond(refactor, factor_now, lambda: state.factors)
        fac = Factorization(values, workspace, factors)

        # The corrector.
        scale = cfg.atol + cfg.rtol * jnp.abs(sg(y_pred))
        tol = self.newton_tolerance(cfg.rtol, dtype)
        # The first iteration's convergence test needs a rate: the last step's, but at least what
        # the changed c costs (the scaled corrections contract by |r - 1| / (r + 1), r = c / c_lu,
        # on stiff and non-stiff components alike); 1/2 after a new factorization.
        ratio = c / c_lu
        # (need_lu, not refactor: a state restored from a checkpoint iterates as the forward pass did.)
        rate0 = jnp.where(need_lu, 0.5, jnp.maximum(state.rate, jnp.abs(ratio - 1.0) / (ratio + 1.0))).astype(dtype)
        corr = solve_corrector(problem, cfg.modes, self.max_newton_iters, fac, c, c_lu, tau, y_pred, psi, p, scale,
                               tol, rate0, cfg.atol, cfg.rtol)  # fmt: skip
        d = corr.d
        y_new = y_pred + d
        converged = corr.converged & jnp.all(jnp.isfinite(y_new))
        y_out = jnp.where(converged, y_new, y)  # a failed iteration hands back y: a rejected step
        error = jnp.where(converged, econst[k] * d, 0.0)
        err = sg(error_norm(error, y, y_out, cfg.rtol, cfg.atol))
        iters = corr.iters
        safety = 0.9 * (2 * self.max_newton_iters + 1) / (2 * self.max_newton_iters + iters).astype(dtype)

        # If accepted: the history, then order and step size for the next step.
        D_acc = advance(D, k, d)
        weights = sg(cfg.atol + cfg.rtol * jnp.maximum(jnp.abs(y), jnp.abs(y_out)))
        err_down = jnp.where(k > 1, _rms(econst[jnp.maximum(k - 1, 0)] * sg(D_acc[k]), weights), jnp.inf)
        err_up = jnp.where(
            k < kmax, _rms(econst[jnp.minimum(k + 1, MAX_ORDER)] * sg(D_acc[jnp.minimum(k + 2, rows - 1)]), weights), jnp.inf
        )  # fmt: skip
        norms = jnp.stack([err_down, err, err_up]).astype(dtype)
        exponents = -1.0 / (k + jnp.arange(3)).astype(dtype)
        gains = jnp.nan_to_num(jnp.where(norms == 0.0, jnp.inf, norms**exponents), nan=0.0, posinf=jnp.inf)
        best = jnp.argmax(gains).astype(jnp.int32)
        grow = jnp.minimum(MAX_GROWTH, safety * gains[best])

        was_shortened = h < hist.h_next  # the loop shortened the step to land on a target
        n_eq = jnp.where(factor != 1.0, 0, hist.n_equal) + 1
        ready = n_eq >= k + 1
        if fixed:
            raise_order = ready & (k < kmax)
            order_acc = jnp.where(raise_order, k + 1, k)
            n_eq_acc = jnp.where(raise_order, 0, n_eq)
            h_acc = h
        else:
            change = ready & (grow >= GROW_THRESHOLD) & ~was_shortened
            order_acc = jnp.where(change, k + best - 1, k)
            h_acc = jnp.where(change, h * grow, h)
            h_acc = jnp.where(was_shortened, jnp.minimum(hist.h_next, 2.0 * h), h_acc)
            n_eq_acc = jnp.where(change | was_shortened, 0, n_eq)

        # A step that lands on a discontinuity: restart at order 1 from [y, f] on the far side.
        restart = jnp.isfinite(t_cap) & converged
        t_disc = jnp.nextafter(t_cap, jnp.asarray(jnp.inf, dtype))

        def restart_values():
            f_new = problem.rhs(t_disc, y_out, p)
            return f_new, self._restart_step(problem, cfg, t_disc, sg(y_out), sg(f_new), sg(p))

        f_new, h_restart = jax.lax.cond(
            restart, restart_values, lambda: (jnp.zeros_like(y_out), jnp.zeros((), dtype))
        )  # fmt: skip
        zero = jnp.zeros((), jnp.int32)
        accepted = BDFHistory(
            D=jnp.where(restart, start_history(rows, y_out, f_new), D_acc),
            h_D=jnp.where(restart, 1.0, h).astype(dtype),
            order=jnp.where(restart, 1, order_acc).astype(jnp.int32),
            n_equal=jnp.where(restart, 0, n_eq_acc).astype(jnp.int32),
            h_next=jnp.where(restart, h_restart, h_acc).astype(dtype),
            jac_age=jnp.where(need_jac, 1, hist.jac_age + 1).astype(jnp.int32),
            lu_age=jnp.where(need_lu, 1, hist.lu_age + 1).astype(jnp.int32),
            need_jac=restart,
            error_failures=zero,
        )  # fmt: skip

        # If rejected: the same history (at its own spacing), a smaller step or a new Jacobian.
        newton_failed = ~converged
        retry_with_jacobian = newton_failed & ~need_jac
        # (The order stays: the adjoint reads the accepted attempt's order from the state on
        # arrival at the step.)
        repeated = hist.error_failures >= 2
        shrink = jnp.where(repeated, 0.1, jnp.maximum(0.2, safety * jnp.maximum(err, 1e-10) ** (-1.0 / (k + 1))))
        h_rej = jnp.where(newton_failed, jnp.where(retry_with_jacobian, h, 0.25 * h), h * shrink)
        rejected = hist._replace(
            h_next=h_rej.astype(dtype),
            jac_age=jnp.where(need_jac, 0, hist.jac_age).astype(jnp.int32),
            lu_age=jnp.where(need_lu, 0, hist.lu_age).astype(jnp.int32),
            need_jac=retry_with_jacobian,
            error_failures=jnp.where(newton_failed, hist.error_failures, hist.error_failures + 1).astype(jnp.int32),
        )  # fmt: skip
        new_state = BDFState(rejected, accepted, jac, c_lu, corr.factors, corr.rate, jnp.zeros((), bool))
        work = Work(
            n_jac=need_jac.astype(jnp.int32), n_factor=refactor.astype(jnp.int32), n_solves=iters,
            n_ir_steps=corr.info.ir_steps, n_fallbacks=corr.info.fallbacks,
            n_rhs=iters + jnp.where(need_jac, problem.pattern.n_colors, 0) + jnp.where(restart, 2, 0),
            n_newton_iters=iters, n_newton_failures=newton_failed.astype(jnp.int32),
        )  # fmt: skip
        return Attempt(y_out, error, corr.info.ok, converged, work, new_state)

    # -- the adjoint ---------------------------------------------------------------------------

    def checkpoint(self, state: BDFState):
        # The factors are made again from jac and c_lu on resume (the same values: the same
        # factors), keeping an adaptive upgrade.
        upgraded = state.factors.upgraded
        return (state.history, state.jac, state.c_lu, state.rate, () if upgraded is None else upgraded)

    def resume(self, template: BDFState, saved) -> BDFState:
        history, jac, c_lu, rate, upgraded = saved
        factors = template.factors
        if factors.upgraded is not None:
            factors = factors._replace(upgraded=upgraded)
        return BDFState(history, history, jac, c_lu, factors, rate, jnp.ones((), bool))

    def history(self, state: BDFState):
        return state.history.D

    def initial_history(self, problem, t0, y0, p):
        return start_history(int(self.max_order) + 3, y0, problem.rhs(t0, y0, p))

    def reverse_transition(self, problem, cfg, modes, workspace, state: BDFState, history, t, y, h, p, t_cap):
        """The accepted step as a function of ``(y, D, p)`` (``y`` is ``D[0]``, not read): the
        history re-sampled at ``h``, the corrector solved again and differentiated implicitly
        (``_bdf_newton.exact_corrector``), the history advanced, or restarted past a
        discontinuity. Exact for the BDF solution whose corrector is solved exactly; the forward
        pass's own iterations stopped within ``newton_tol``, and that difference (a tenth of
        the local error test, at most) is not differentiated."""
        dtype = y.dtype
        kmax = int(self.max_order)
        rows = kmax + 3
        gamma, alpha, _ = (jnp.asarray(c, dtype) for c in coefficients(self.ndf))
        hist = state.history
        k = hist.order
        D = rescale(history, k, (h / hist.h_D).astype(dtype))
        y_pred, psi = predict(D, k, self._psi_weights(gamma, alpha, k, rows))
        tau = jnp.minimum(t + h, t_cap)
        c = (h / alpha[k]).astype(dtype)
        atol, rtol = cfg.atol.astype(dtype), jnp.asarray(cfg.rtol).astype(dtype)
        scale = atol + rtol * jnp.abs(jax.lax.stop_gradient(y_pred))
        d = exact_corrector(problem, modes, workspace, 2 * self.max_newton_iters, c, tau, y_pred, psi, p, scale,
                            self.newton_tolerance(rtol, dtype))  # fmt: skip
        y_new = y_pred + d
        landed = jnp.isfinite(t_cap)
        f_new = problem.rhs(jnp.where(landed, jnp.nextafter(t_cap, jnp.asarray(jnp.inf, dtype)), tau), y_new, p)
        D_new = jnp.where(landed, start_history(rows, y_new, f_new), advance(D, k, d))
        return y_new, D_new

    @staticmethod
    def _psi_weights(gamma, alpha, k, rows):
        """``gamma_j / alpha_k`` for ``j = 1..k`` (0 elsewhere), over the history's rows."""
        gamma_rows = jnp.zeros((max(rows, MAX_ORDER + 1),), gamma.dtype).at[: MAX_ORDER + 1].set(gamma)[:rows]
        j = jnp.arange(rows)
        return jnp.where((j >= 1) & (j <= k), gamma_rows / alpha[k], 0.0)

    def _restart_step(self, problem, cfg, t, y, f, p):
        """A starting step size of order 1 at ``(t, y)`` with ``f = y'`` (Hairer and Wanner, II.4)."""
        dtype = y.dtype
        scale = cfg.atol + cfg.rtol * jnp.abs(y)
        d0, d1 = _rms(y, scale), _rms(f, scale)
        h0 = jnp.where((d0 < 1e-5) | (d1 < 1e-5), 1e-6, 0.01 * d0 / d1)
        f1 = problem.rhs(t + h0, y + h0 * f, p)
        d2 = _rms(f1 - f, scale) / h0
        big = jnp.maximum(d1, d2)
        h1 = jnp.where(big <= 1e-15, jnp.maximum(1e-6, h0 * 1e-3), jnp.sqrt(0.01 / big))
        h = jnp.minimum(100.0 * h0, h1)
        return jnp.where(jnp.isfinite(h) & (h > 0), h, 1e-6).astype(dtype)
