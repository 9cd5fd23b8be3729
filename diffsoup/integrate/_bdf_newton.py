"""The BDF corrector: modified Newton iterations on a factorization kept across steps, and its
derivatives by the implicit function theorem.

The corrector of a step solves for the correction ``d = y_new - y_pred``

    G(d) = d + psi - c f(tau, y_pred + d, p) = 0,    c = h / alpha_k,

with the factorization of ``M = I - c_lu J`` made at some earlier step (``c_lu``, ``J`` possibly
stale): each iteration solves ``M dy = c f - psi - d`` and scales ``dy`` by ``2 / (1 + c / c_lu)``
(CVODE's correction for a changed ``h gamma``: exact on the stiff components when ``J`` is).
Convergence test (scipy's ``BDF``, with CVODE's rate estimate carried across steps): with the
rate ``rho`` of the last two corrections, converged when ``rho / (1 - rho) ||dy|| < tol``;
diverging when ``rho >= 1`` or when ``rho^(m - k) / (1 - rho) ||dy||`` (the error predicted after
the ``m - k`` iterations left) exceeds ``tol``. The first iteration uses the rate carried from the
last step's iterations (set to 1/2 after a new factorization: then ``||dy|| < tol``), so a step
whose predictor was good converges after one iteration.

Derivatives, forward mode (:func:`solve_corrector`): the converged correction as the solution of ``G(d; y_pred, psi, p) = 0``,
``A d' = c (f_y y_pred' + f_p p') - psi'`` with ``A = I - c f_y(y_new)`` exactly (its products are
Jacobian-vector products at the converged state), solved by iterations preconditioned with the
step's factorization, to the corrector's own tolerance relative to the tangent
(weights ``atol + rtol |y'|``). These are the derivatives of the BDF solution whose corrector
is solved exactly: the primal's iteration error (within ``tol``) is not differentiated.

Derivatives, reverse mode (:func:`exact_corrector`, the adjoint's recomputed step): the same
implicit derivative, through ``jax.lax.custom_linear_solve`` (its transpose solves ``A^T``), from
the corrector solved again with a factorization made at the predictor for the step's own ``c``;
the linear systems with ``A`` and ``A^T`` are solved by iterations preconditioned with it, to
round-off. Both directions give the derivatives of the same discrete solution (the corrector
solved exactly, at the accepted steps and orders). ``A`` is held fixed: derivatives of
derivatives (Hessian-vector products) leave out its own derivative.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ..linear import Factorization, SolveInfo
from ._linear_solve import shifted_values


class Corrector(NamedTuple):
    """Outcome of the corrector iterations of one step attempt."""

    d: Any  # the correction y_new - y_pred
    converged: Any
    iters: Any  # iterations (right-hand sides and solves)
    rate: Any  # convergence-rate estimate for the next step
    factors: Any  # the factors, chained after the solves
    info: Any  # SolveInfo of the solves


class _Iterate(NamedTuple):
    d: Any
    factors: Any
    info: Any
    norm: Any  # weighted RMS norm of the last correction
    rate: Any
    k: Any
    converged: Any
    diverged: Any


def _rms(x, w):
    return jnp.sqrt(jnp.mean(jnp.square(x / w)))


def _zero_tangent(x):
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return jnp.zeros(x.shape, dtype=jax.dtypes.float0)


class CorrectorProblem(NamedTuple):
    """What the corrector is compiled for (hashable): the problem, the solve modes, the most
    iterations."""

    problem: Any
    modes: Any
    max_iters: int


def _iterate(static: CorrectorProblem, values, workspace, factors, c, c_lu, tau, y_pred, psi, p, scale, tol, rate0):
    prepared = static.problem.prepared
    rhs = static.problem.rhs
    m = static.max_iters
    # h gamma changed since the factorization: scale the corrections (exact for stiff modes).
    s = 2.0 / (1.0 + c / c_lu)

    def cond(it: _Iterate):
        return ~it.converged & ~it.diverged & (it.k < m)

    def body(it: _Iterate) -> _Iterate:
        f = rhs(tau, y_pred + it.d, p)
        residual = c * f - psi - it.d
        x, fac, info = prepared.solve(Factorization(values, workspace, it.factors), residual, static.modes.primal)
        # A non-finite residual is the iteration diverging, not the linear solver failing.
        info = info._replace(ok=info.ok | ~jnp.all(jnp.isfinite(residual)))
        dy = (s / c_lu) * x
        norm = _rms(dy, scale)
        observed = norm / it.norm
        rate = jnp.where(it.k == 0, it.rate, observed)
        finite = jnp.isfinite(norm) & jnp.all(jnp.isfinite(residual))
        remaining = (m - it.k).astype(norm.dtype)
        diverged = ~finite | ~info.ok | (
            (it.k > 0) & ((observed >= 1.0) | (observed**remaining / (1.0 - observed) * norm > tol))
        )
        converged = ~diverged & ((norm == 0.0) | (rate / (1.0 - rate) * norm < tol))
        # CVODE's estimate: the observed rate, not let to fall faster than by 0.3 per iteration.
        carried = jnp.where(it.k == 0, it.rate, jnp.maximum(0.3 * it.rate, observed))
        return _Iterate(
            d=jnp.where(diverged, it.d, it.d + dy), factors=fac.factors, info=it.info.combine(info), norm=norm,
            rate=jnp.minimum(carried, 0.5), k=it.k + 1, converged=converged, diverged=diverged,
        )  # fmt: skip

    dtype = y_pred.dtype
    start = _Iterate(
        d=jnp.zeros_like(y_pred), factors=factors, info=SolveInfo.success(), norm=jnp.asarray(jnp.inf, dtype),
        rate=rate0.astype(dtype), k=jnp.zeros((), jnp.int32), converged=jnp.zeros((), bool),
        diverged=jnp.zeros((), bool),
    )  # fmt: skip
    it = jax.lax.while_loop(cond, body, start)
    return Corrector(it.d, it.converged, it.k, it.rate, it.factors, it.info)


def tangent_tolerance_weights(atol, rtol, tangent):
    """Weights of the tangent iterations' test (CVODES's default for sensitivities: the state's
    tolerances applied to the sensitivity)."""
    return atol + rtol * jnp.abs(tangent)


def _tangent(static: CorrectorProblem, values, workspace, factors, c, c_lu, tau, y_new, p, b, atol, rtol, tol, base):
    """``x`` with ``(I - c f_y(y_new)) x = b``, by iterations preconditioned with the factors.

    Returns ``(x, factors)`` (chained after the solves). ``base`` is the rest of the tangent of
    ``y_new`` (for the test's weights)."""
    prepared = static.problem.prepared
    s = 2.0 / (1.0 + c / c_lu)
    _, jvp_y = jax.linearize(lambda y: static.problem.rhs(tau, y, p), y_new)
    m = 2 * static.max_iters

    fac = Factorization(values, workspace, factors)

    def cond(st):
        x, norm, prev, k = st
        rate = norm / prev
        done = (norm == 0.0) | ((k > 1) & (rate < 1.0) & (rate / (1.0 - rate) * norm < tol))
        return (k == 0) | (~done & (k < m) & jnp.isfinite(norm))

    def body(st):
        # Each solve reads the x of the one before: the solves on the factors run in order.
        x, norm, prev, k = st
        r = b - (x - c * jvp_y(x))
        dx = (s / c_lu) * prepared.solve(fac, r, static.modes.tangent)[0]
        x = x + dx
        new = _rms(dx, tangent_tolerance_weights(atol, rtol, base + x))
        return x, new, norm, k + 1

    dtype = b.dtype
    inf = jnp.asarray(jnp.inf, dtype)
    # The factors stay out of the loop's carry: under vmap over tangents (jacfwd) the loop's
    # condition is batched, and so would be everything it carries; the next primal solve waits
    # for the last tangent solve through chain's data dependency (unbatched).
    x, _, _, _ = jax.lax.while_loop(cond, body, (jnp.zeros_like(b), inf, inf, jnp.zeros((), jnp.int32)))
    return x, prepared.chain(fac, x).factors


def _solve_primal(static, values, workspace, factors, c, c_lu, tau, y_pred, psi, p, scale, tol, rate0, atol, rtol):
    return _iterate(static, values, workspace, factors, c, c_lu, tau, y_pred, psi, p, scale, tol, rate0)


_solve = jax.custom_jvp(_solve_primal, nondiff_argnums=(0,))


@_solve.defjvp
def _solve_jvp(static, primals, tangents):
    values, workspace, factors, c, c_lu, tau, y_pred, psi, p, scale, tol, rate0, atol, rtol = primals
    dy_pred, dpsi, dp = tangents[6], tangents[7], tangents[8]
    out = _solve(static, *primals)
    y_new = y_pred + out.d
    # G(d; y_pred, psi, p) = d + psi - c f(tau, y_pred + d, p) = 0:
    # (I - c f_y) d' = c (f_y y_pred' + f_p p') - psi'.
    _, f_dot = jax.jvp(lambda y, pp: static.problem.rhs(tau, y, pp), (y_new, p), (dy_pred, dp))
    b = c * f_dot - dpsi
    dd, factors_after = _tangent(static, values, workspace, out.factors, c, c_lu, tau, y_new, p, b, atol, rtol, tol,
                                 dy_pred)  # fmt: skip
    out = out._replace(factors=factors_after)
    zeros = jax.tree_util.tree_map(_zero_tangent, out)
    return out, zeros._replace(d=dd)


def solve_corrector(problem, modes, max_iters, fac: Factorization, c, c_lu, tau, y_pred, psi, p, scale, tol, rate0,
                    atol, rtol) -> Corrector:  # fmt: skip
    """The corrector of one step (see the module): differentiable in ``y_pred``, ``psi`` and ``p``
    (forward mode); the factorization, ``c``, ``tau`` and the test's numbers are not differentiated."""
    sg = jax.lax.stop_gradient
    static = CorrectorProblem(problem, modes, int(max_iters))
    return _solve(
        static, sg(fac.values), fac.workspace, sg(fac.factors), sg(c), sg(c_lu), sg(tau), y_pred, psi, p, sg(scale),
        sg(tol), sg(rate0), sg(atol), sg(rtol),
    )  # fmt: skip


def _preconditioned(apply, precondition, b, max_iters: int = 30):
    """``x`` with ``apply(x) = b`` by iterations ``x += precondition(b - apply(x))``, to round-off
    (the largest correction at most ``1e-13`` of the largest entry of ``x``)."""

    def cond(st):
        x, dx_norm, k = st
        return (k == 0) | ((dx_norm > 1e-13 * jnp.max(jnp.abs(x))) & (k < max_iters) & jnp.isfinite(dx_norm))

    def body(st):
        x, _, k = st
        dx = precondition(b - apply(x))
        return x + dx, jnp.max(jnp.abs(dx)), k + 1

    x, _, _ = jax.lax.while_loop(cond, body, (jnp.zeros_like(b), jnp.asarray(jnp.inf, b.dtype), jnp.zeros((), jnp.int32)))
    return x


def exact_corrector(problem, modes, workspace, max_iters, c, tau, y_pred, psi, p, scale, tol):
    """The correction ``d`` of a step as a differentiable function of ``(y_pred, psi, p)`` for
    reverse mode (see the module): a factorization at the predictor with this step's ``c``, the
    iterations, then one exact Newton step through ``custom_linear_solve`` that carries the
    implicit derivative."""
    sg = jax.lax.stop_gradient
    prepared = problem.prepared
    c, tau, y0, psi0, p0 = sg((c, tau, y_pred, psi, p))
    jac = sg(problem.jacobian_values(tau, y0, p0))
    values = shifted_values(jac, jnp.asarray(problem.pattern.diagonal), 1.0 / c)
    fac = prepared.factor(workspace, values, modes.with_reverse)
    static = CorrectorProblem(problem, modes, int(max_iters))
    out = _iterate(static, values, workspace, fac.factors, c, c, tau, y0, psi0, p0, sg(scale), sg(tol),
                   jnp.asarray(0.5, y0.dtype))  # fmt: skip
    d_star = sg(out.d)
    y_star = y0 + d_star
    _, jvp_y = jax.linearize(lambda y: problem.rhs(tau, y, p0), y_star)
    fac = Factorization(values, workspace, out.factors)

    def matvec(v):
        return v - c * jvp_y(v)

    def solve(apply, r):
        return _preconditioned(apply, lambda v: prepared.solve(fac, v, modes.primal)[0] / c, r)

    def transpose_solve(apply_t, r):
        def precondition(v):
            return prepared.solve(fac, v, modes.reverse, transpose=True, ir_tol=modes.reverse_ir_tol)[0] / c

        return _preconditioned(apply_t, precondition, r)

    # G(d*; y_pred, psi, p) is ~0 (the iterations' error); its derivative is what matters.
    residual = d_star + psi - c * problem.rhs(tau, y_pred + d_star, p)
    delta = jax.lax.custom_linear_solve(matvec, -residual, solve, transpose_solve)
    return d_star + delta
