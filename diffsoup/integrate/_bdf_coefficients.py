"""Coefficients of the variable-order BDF/NDF formulas and the operations on their history.

Form (Shampine and Reichelt, "The MATLAB ODE Suite", 1997; scipy's ``BDF``): quasi-constant step
size in backward-difference form. The history of order ``k`` is the array ``D`` of modified
divided differences ``D[j] = nabla^j y_n`` (``j = 0..k``) of the interpolating polynomial at the
equally spaced points ``t_n, t_n - h, ..., t_n - k h``; a change of step size re-samples the same
polynomial at the new spacing (:func:`rescale`), and a step of order ``k`` solves

    (y_{n+1} - y_pred) + psi = (h / alpha_k) f(t_{n+1}, y_{n+1}),
    y_pred = sum_{j<=k} D[j],   psi = sum_{j=1..k} gamma_j D[j] / alpha_k,

with ``gamma_j = sum_{i<=j} 1/i``, ``alpha_k = (1 - kappa_k) gamma_k``. ``kappa = 0`` gives the
BDFs; the NDFs (Klopfenstein; Shampine and Reichelt's choice of ``kappa``) are more accurate at
orders 1-4 for the same stability (order 5 is the BDF). The local error is
``error_const_k * (y_{n+1} - y_pred)`` with ``error_const_k = kappa_k gamma_k + 1/(k + 1)``;
``D[k + 2] = d_{n+1} - d_n`` of two consecutive corrections estimates the error of order ``k + 1``.

The history array holds ``max_order + 3`` rows (orders up to ``max_order``, plus the two rows the
update and the order-raise estimate need); the order is a traced integer, so every operation
below works on all rows, masked by the order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

MAX_ORDER = 5
# Shampine and Reichelt's NDF coefficients (order 5: the BDF, kappa = 0).
NDF_KAPPA = np.array([0.0, -0.1850, -1.0 / 9.0, -0.0823, -0.0415, 0.0])
_HIGHEST = jax.lax.Precision.HIGHEST


def coefficients(ndf: bool):
    """``(gamma, alpha, error_const)`` for orders 0..5 (numpy float64; index = order)."""
    kappa = NDF_KAPPA if ndf else np.zeros(MAX_ORDER + 1)
    gamma = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, MAX_ORDER + 1))])
    alpha = (1.0 - kappa) * gamma
    error_const = kappa * gamma + 1.0 / np.arange(1, MAX_ORDER + 2)
    return gamma, alpha, error_const


def _r_matrix(size, factor):
    """Shampine and Reichelt's ``R`` (size ``size``): differences at spacing ``h`` to spacing
    ``factor * h`` (its ``k + 1`` leading rows and columns are those of order ``k``)."""
    i = jnp.arange(1, size, dtype=factor.dtype)[:, None]
    j = jnp.arange(1, size, dtype=factor.dtype)[None, :]
    m = jnp.ones((size, size), factor.dtype)
    m = m.at[1:, 1:].set((i - 1.0 - factor * j) / i).at[1:, 0].set(0.0)
    return jnp.cumprod(m, axis=0)


def rescale_matrix(order, factor, rows: int):
    """The ``(rows, rows)`` matrix ``T`` with ``D_new = T @ D``: the history of ``order`` re-sampled
    at ``factor`` times the spacing (rows above ``order`` unchanged)."""
    size = rows
    r = _r_matrix(size, factor)
    u = _r_matrix(size, jnp.ones((), factor.dtype))
    ru = jnp.matmul(r, u, precision=_HIGHEST)
    idx = jnp.arange(size)
    inside = (idx[:, None] <= order) & (idx[None, :] <= order)
    # U is upper triangular (U[m, j] = 0 for m > j), so the leading (k+1) block of R U is that of
    # order k: one matrix for every order, masked.
    return jnp.where(inside, ru.T, jnp.eye(size, dtype=factor.dtype))


def rescale(D, order, factor):
    """The history re-sampled at ``factor`` times its spacing; unchanged (bit for bit) for factor 1."""
    t = rescale_matrix(order, factor, D.shape[0])
    return jnp.where(factor == 1.0, D, jnp.matmul(t, D, precision=_HIGHEST))


def predict(D, order, gamma_over_alpha):
    """``(y_pred, psi)`` of a step of ``order`` from the history ``D``;
    ``gamma_over_alpha[j] = gamma_j / alpha_order`` for ``j <= order`` (0 above)."""
    rows = jnp.arange(D.shape[0])
    mask = (rows <= order).astype(D.dtype)
    y_pred = jnp.matmul(mask, D, precision=_HIGHEST)
    psi = jnp.matmul(gamma_over_alpha, D, precision=_HIGHEST)
    return y_pred, psi


def advance(D, order, d):
    """The history after an accepted step of ``order`` whose correction is ``d = y_new - y_pred``:
    ``D[k+2] = d - D[k+1]``, ``D[k+1] = d``, ``D[j] = D[j] + ... + D[k] + d`` for ``j <= k``."""
    rows = jnp.arange(D.shape[0])
    below = (rows <= order)[:, None]
    # D[j] + ... + D[k]: reverse cumulative sums of the rows up to the order.
    tail = jnp.cumsum(jnp.where(below, D, 0.0)[::-1], axis=0)[::-1]
    d_row = D[jnp.minimum(order + 1, D.shape[0] - 1)]
    new = jnp.where(below, tail + d[None, :], D)
    new = jnp.where((rows == order + 1)[:, None], d[None, :], new)
    return jnp.where((rows == order + 2)[:, None], (d - d_row)[None, :], new)


def start_history(rows: int, y, f):
    """The history of order 1 at spacing 1 from ``y`` and ``f = y'``: ``[y, f, 0, ...]`` (the
    first attempt re-samples it at its step size)."""
    D = jnp.zeros((rows,) + y.shape, y.dtype)
    return D.at[0].set(y).at[1].set(f)
