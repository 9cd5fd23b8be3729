"""Derivatives of a steady state by the implicit function theorem, conserved quantities kept.

A steady state ``y*`` found by integrating ``dy/dt = f(t, y, p)`` from ``y0`` until it settles
(:class:`~diffsoup.integrate.SteadyState`) satisfies ``f(y*, p) = 0``; where the system conserves
quantities (``w^T f(y, p) = 0`` for the left null vectors ``w`` of the Jacobian ``J = df/dy``: the
moieties of a reaction network), it also keeps them, ``W^T y* = W^T y0``. Differentiating both,

    J dy* = -(df/dp) dp,        W^T dy* = W^T dy0,

a system of full column rank whose least-squares solution is the derivative (``[J; W^T]``'s
pseudo-inverse applied to the right-hand side). This is exact at a true steady state, costs one
dense Jacobian and one SVD of it (``n^3``: meant for the pre-equilibrations of models of tens to a
few hundred states), and does not depend on how long the integration ran -- unlike the derivative
of the discrete solution, which near a steady state stops before the sensitivities have relaxed.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

# Singular values of J below this fraction of the largest count as zero: conservation laws give
# exact zeros (round-off, ~1e-16 of the largest), while the slowest real decay rates of stiff
# models stay far above it.
NULL_SPACE_RTOL = 1e-10


def steady_state_with_derivatives(rhs: Callable, t, y_steady, p, y_start):
    """``y_steady`` (a steady state of ``rhs`` reached from ``y_start`` under parameters ``p``, found
    without derivatives) with the derivatives of the implicit function theorem in ``p`` and
    ``y_start``. Forward and reverse mode (the tangent rule is linear in the tangents).

    Args:
        rhs: ``rhs(t, y, p) -> dy/dt`` (hashable: a function or a bound method).
        t: the time at which ``rhs`` is evaluated (the steady state of an autonomous system).
        y_steady: the steady state, ``(n,)``; its own derivatives are ignored.
        p: the parameters the steady state is of (an array).
        y_start: the state the search started from (its conserved quantities are the steady
            state's).
    """
    return _fixed_point(rhs, t, jax.lax.stop_gradient(y_steady), p, y_start)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _fixed_point(rhs, t, y_steady, p, y_start):
    return y_steady


@_fixed_point.defjvp
def _fixed_point_jvp(rhs, primals, tangents):
    t, y_steady, p, y_start = primals
    _, _, dp, dy_start = tangents
    return y_steady, _implicit_tangent(rhs, t, y_steady, p, dp, dy_start)


def _implicit_tangent(rhs, t, y_steady, p, dp, dy_start):
    """``dy*`` from ``[J; W^T] dy* = [-(df/dp) dp; W^T dy0]`` (least squares, full column rank)."""
    jac = jax.jacfwd(lambda y: rhs(t, y, p))(y_steady)
    u, s, _ = jnp.linalg.svd(jac)
    null = (s <= NULL_SPACE_RTOL * s[0]).astype(jac.dtype)  # which columns of u span the left null space
    w_t = null[:, None] * u.T  # rows: the conserved directions (zero rows elsewhere)
    system = jnp.concatenate([jac, w_t], axis=0)
    _, f_dp = jax.jvp(lambda q: rhs(t, y_steady, q), (p,), (dp,))
    target = jnp.concatenate([-f_dp, w_t @ dy_start])
    return jnp.linalg.pinv(system) @ target
