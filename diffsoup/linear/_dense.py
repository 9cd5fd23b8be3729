"""Dense LU (``jax.scipy.linalg.lu_factor``), for small systems and as the reference backend.

The matrix is assembled from the CSR values into an ``n x n`` array, so memory and time grow as
``n^2`` and ``n^3``: use it up to a few hundred states. Float32 factors are real float32 LUs.
A singular matrix gives non-finite solutions, reported as a failed solve.

The LU factors ``P W P^T`` (then pivots rows as partial pivoting does), with ``P`` a symmetric
elimination order of the pattern computed once at prepare: multiple minimum degree on ``A + A^T``
(``_minimum_degree``). Eliminating in the natural order gave wrong answers reported as successes on
stiff, badly scaled problems (E5 of the Test Set: a large state eliminated first leaks its rounding
errors into a conserved combination of tiny ones); sparse solvers order anyway.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, final

import jax
import jax.numpy as jnp
import numpy as np

from ._base import AbstractLinearSolver, AbstractPreparedSolver
from ._minimum_degree import minimum_degree_order

DENSE_REORDERINGS = ("amd", "natural")


@final
@dataclasses.dataclass(frozen=True)
class Dense(AbstractLinearSolver):
    """Dense LU with partial pivoting, on any device, in a minimum-degree elimination order.

    Args:
        reorder: elimination order: ``"amd"`` (a minimum-degree order of the pattern), ``"natural"``
            (the states' own order: no reordering), or None (default) to take the layout's
            ``ds.Layout.reorder``, whose ``"amd"`` and ``"metis"`` both mean the minimum-degree
            order here (a dense factor has no fill for nested dissection to save).
        ir_tol: refinement target (see :class:`~diffsoup.linear.LinearSolver`).
        ir_max_steps: most refinement steps per solve.

    Raises:
        ValueError: for a ``reorder`` other than None, ``"amd"`` or ``"natural"``.
    """

    reorder: str | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.reorder is not None and self.reorder not in DENSE_REORDERINGS:
            raise ValueError(
                f"Dense.reorder={self.reorder!r} must be None (the layout's), 'amd' (minimum degree) or 'natural'."
            )

    def elimination_order(self, layout=None) -> str:
        """The order in force, ``"amd"`` or ``"natural"``: this object's ``reorder``, else the
        minimum-degree order, which both of the layout's fill-reducing choices (``Layout.reorder``,
        ``"amd"`` or ``"metis"``) mean for a dense factor."""
        return self.reorder if self.reorder is not None else "amd"

    def prepare(self, pattern, precision, *, layout=None) -> "PreparedDense":
        if layout is not None:
            layout.check_one_device_factorization("ds.linear.Dense")
        return PreparedDense(self, pattern, precision, self.elimination_order(layout))


class DenseFactors(NamedTuple):
    """An LU factorization of ``P W P^T`` (``lu`` in the slot's dtype) and its row pivots."""

    lu: Any
    piv: Any


@final
class PreparedDense(AbstractPreparedSolver):
    """Dense LU bound to one pattern.

    Attributes:
        order: ``order[k]`` is the state eliminated ``k``-th (``P W P^T = W[order][:, order]``),
            or None for the natural order.
    """

    def __init__(self, solver, pattern, precision, elimination_order: str = "amd"):
        super().__init__(solver, pattern, precision)
        self.order = None
        if elimination_order == "amd":
            order = minimum_degree_order(pattern.n, pattern.rows, pattern.indices)
            if not np.array_equal(order, np.arange(pattern.n)):
                self.order = order
        position = np.arange(pattern.n) if self.order is None else np.argsort(self.order)
        # Entry (i, j) of W lands at (position[i], position[j]) of P W P^T.
        self._perm_rows = jnp.asarray(position[np.asarray(pattern.rows)], jnp.int32)
        self._perm_cols = jnp.asarray(position[np.asarray(pattern.indices)], jnp.int32)
        self._position = None if self.order is None else jnp.asarray(position, jnp.int32)
        self._order = None if self.order is None else jnp.asarray(self.order, jnp.int32)

    def _dense(self, values):
        """``P W P^T`` as an ``n x n`` array."""
        return jnp.zeros((self.n, self.n), values.dtype).at[self._perm_rows, self._perm_cols].set(values)

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
        # W x = b  <=>  (P W P^T) (P x) = P b, and W^T x = b  <=>  (P W P^T)^T (P x) = P b.
        lu, piv = factors
        pb = b if self._order is None else b[self._order]
        z = jax.scipy.linalg.lu_solve((lu, piv), pb.astype(lu.dtype), trans=1 if transpose else 0)
        x = z if self._position is None else z[self._position]
        return x.astype(b.dtype)
