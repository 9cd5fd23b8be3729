"""Dense LU (``jax.scipy.linalg.lu_factor``), for small systems and as the reference backend.

The matrix is assembled from the CSR values into an ``n x n`` array, so memory and time grow as
``n^2`` and ``n^3``: use it up to a few hundred states. Float32 factors are real float32 LUs.
A singular matrix gives non-finite solutions, reported as a failed solve.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, final

import jax
import jax.numpy as jnp

from ._base import AbstractLinearSolver, AbstractPreparedSolver


@final
@dataclasses.dataclass(frozen=True)
class Dense(AbstractLinearSolver):
    """Dense LU with partial pivoting, on any device.

    Args:
        ir_tol: refinement target (see :class:`~diffsoup.linear.LinearSolver`).
        ir_max_steps: most refinement steps per solve.
    """

    def prepare(self, pattern, precision, *, layout=None) -> "PreparedDense":
        return PreparedDense(self, pattern, precision)


class DenseFactors(NamedTuple):
    """An LU factorization (``lu`` in the slot's dtype) and its pivots."""

    lu: Any
    piv: Any


@final
class PreparedDense(AbstractPreparedSolver):
    def _dense(self, values):
        return jnp.zeros((self.n, self.n), values.dtype).at[self.rows, self.cols].set(values)

    def _raw_begin(self, values, slot):
        return None  # nothing persists across steps

    def _raw_end(self, workspace, after):
        return jnp.zeros((), jnp.int32)

    def _raw_factor(self, workspace, values, slot):
        dtype = jnp.float32 if slot == "low" else values.dtype
        lu, piv = jax.scipy.linalg.lu_factor(self._dense(values.astype(dtype)))
        # A non-finite matrix must fail the solve on every backend: the GPU LU was seen to give a
        # finite solution for a matrix holding a NaN, so the factor is poisoned explicitly (the
        # solves stay linear in b, as the transposed solves of the adjoint need).
        finite = jnp.all(jnp.isfinite(values))
        return DenseFactors(jnp.where(finite, lu, jnp.nan), piv)

    def _raw_solve(self, factors, b, transpose, slot):
        lu, piv = factors
        x = jax.scipy.linalg.lu_solve((lu, piv), b.astype(lu.dtype), trans=1 if transpose else 0)
        return x.astype(b.dtype)
