"""Dense LU (``jax.scipy.linalg.lu_factor``), for small systems and as the reference backend.

The matrix is assembled from the CSR values into an ``n x n`` array, so memory and time grow as
``n^2`` and ``n^3``: use it up to a few hundred states. Float32 factors are real float32 LUs.
A singular matrix gives non-finite solutions, reported as a failed solve.

The LU factors ``P W P^T`` (then pivots rows as partial pivoting does), with ``P`` a symmetric
elimination order of the pattern computed once at prepare: multiple minimum degree on ``A + A^T``
(``_minimum_degree``). Eliminating in the natural order gave wrong answers reported as successes on
stiff, badly scaled problems (E5 of the Test Set: a large state eliminated first leaks its rounding
errors into a conserved combination of tiny ones); sparse solvers order anyway.

How a solve uses the factors (``Dense.solve``):

* ``"lu"``: forward and backward substitution with the LU factors (``lu_solve``), after gathering
  ``b`` into the elimination order and before gathering the answer back.
* ``"inverse"``: at factor time, the explicit inverse ``X = W^{-1} = P^T (P W P^T)^{-1} P`` is
  formed from the same LU, by one solve with ``n`` right-hand sides (the columns of ``P``, so the
  elimination order is folded into ``X`` and a solve needs no gather); every solve is then one
  matrix-vector product, ``X b`` (``X^T b`` for the adjoint's transposed solves). On a GPU, where
  the profile of a study's step (docs/benchmarks.md) put two thirds of the device time into the
  chains of small triangular-solve kernels of the stages, this turns each stage solve into one
  batched product; the factorization costs one more solve (``n`` columns at once), once per step.
* ``"auto"`` (default): ``"lu"`` where the program runs on a CPU (results bit for bit those of the
  LU solve) and ``"inverse"`` on other platforms, chosen when the program is lowered for its
  platform (``jax.lax.platform_dependent``): the compiled program holds one of the two.

Numerics of the explicit inverse (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd
ed., SIAM 2002, §14.1 and §14.3; ch. 12 for refinement): the computed ``x = fl(X b)`` has a forward
error of the same order as the LU solve's, ``cond(W) u`` (``u`` the unit roundoff), but it is not
backward stable: its residual is bounded only by ``u |W| |W^{-1}| |b|`` instead of ``u |L| |U|
|x|``, so on an ill-conditioned ``W`` (stiff stages, ``W = I/(h gamma) - J`` with widely spread
scales) the components that cancel in ``X b`` may lose digits the LU solve keeps. Measured against
the LU path on the CPU (tests/test_dense_inverse.py): the 20-species network (float64 and
``"fp32_ir"``) and OREGO agree to 5e-13 relative or better, with the same steps; ROBER to 1e-7
relative in ``y1`` at rtol 1e-10 (0.2 of its absolute tolerance); E5 (states near 1e-22 beside
1e-3) to 0.7 % (rtol 1e-7) and 0.3 % (1e-10) in ``y2`` and ``y3``, less than the absolute tolerance
(1.1e-24 is 1.2 % of them) and within the Test Set reference's bounds. The float32 factors of
``"fp32_ir"`` and ``"adaptive"`` (a float32 inverse) are refined against the float64 residual as
any backend's are (``_base``), which restores the accuracy the LU solve had there. Float64 solves
are not refined: a step of fixed-precision refinement (``x += X (b - W x)``, residual from the CSR
values) was tried and made E5 *worse* (y2 off by 2x at rtol 1e-10, 7x at 1e-7, reported as
successes): the residual's own rounding, ``u |W| |x|`` with ``|x|`` dominated by the large states,
swamps the conserved combination of the tiny ones. The products run at full precision
(``Precision.HIGHEST``: no TF32 on GPUs). Problems like E5 that need the LU's every digit can take
``Dense(solve="lu")``.

A non-finite matrix fails the solve on every path: its factors (the LU, or the inverse) are
poisoned with NaN, so every solution is NaN, as the solves stay linear in ``b``.
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
DENSE_SOLVES = ("auto", "lu", "inverse")
_HIGHEST = jax.lax.Precision.HIGHEST


@final
@dataclasses.dataclass(frozen=True)
class Dense(AbstractLinearSolver):
    """Dense LU with partial pivoting, on any device, in a minimum-degree elimination order.

    Args:
        reorder: elimination order: ``"amd"`` (a minimum-degree order of the pattern), ``"natural"``
            (the states' own order: no reordering), or None (default) to take the layout's
            ``ds.Layout.reorder``, whose ``"amd"`` and ``"metis"`` both mean the minimum-degree
            order here (a dense factor has no fill for nested dissection to save).
        solve: how a solve uses the LU: ``"lu"`` (triangular solves), ``"inverse"`` (the explicit
            inverse formed once per factorization, then one matrix-vector product per solve), or
            ``"auto"`` (default: ``"lu"`` on a CPU, ``"inverse"`` elsewhere). See the module's
            notes on the numerics.
        ir_tol: refinement target (see :class:`~diffsoup.linear.LinearSolver`).
        ir_max_steps: most refinement steps per solve.

    Raises:
        ValueError: for a ``reorder`` other than None, ``"amd"`` or ``"natural"``, or a ``solve``
            other than ``"auto"``, ``"lu"`` or ``"inverse"``.
    """

    reorder: str | None = None
    solve: str = "auto"

    def __post_init__(self):
        super().__post_init__()
        if self.reorder is not None and self.reorder not in DENSE_REORDERINGS:
            raise ValueError(
                f"Dense.reorder={self.reorder!r} must be None (the layout's), 'amd' (minimum degree) or 'natural'."
            )
        if self.solve not in DENSE_SOLVES:
            raise ValueError(
                f"Dense.solve={self.solve!r} must be 'auto' (LU solves on a CPU, the inverse elsewhere), "
                "'lu' (triangular solves) or 'inverse' (one product with the explicit inverse)."
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
    """One slot's factors.

    Attributes:
        matrix: the LU factorization of ``P W P^T`` (``"lu"``) or the inverse ``W^{-1}``
            (``"inverse"``), in the slot's dtype.
        piv: the LU's row pivots (kept on both paths, so ``"auto"``'s two have one layout).
    """

    matrix: Any
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
        # P's columns, the right-hand sides that form the inverse: P b = b[order].
        self._p_matrix = np.eye(pattern.n) if self.order is None else np.eye(pattern.n)[self.order]

    def _dense(self, values):
        """``P W P^T`` as an ``n x n`` array."""
        return jnp.zeros((self.n, self.n), values.dtype).at[self._perm_rows, self._perm_cols].set(values)

    def _by_platform(self, lu_path, inverse_path):
        """``Dense.solve``'s path (two functions of no arguments): one of them, or (``"auto"``)
        the LU on a CPU and the inverse elsewhere, picked when the program is lowered for its
        platform."""
        choice = self.solver.solve
        if choice == "lu":
            return lu_path()
        if choice == "inverse":
            return inverse_path()
        return jax.lax.platform_dependent(cpu=lu_path, default=inverse_path)

    def _raw_begin(self, values, slot):
        return None  # nothing persists across steps

    def _raw_end(self, workspace, after):
        return jnp.zeros((), jnp.int32)

    def _raw_factor(self, workspace, values, slot):
        dtype = jnp.float32 if slot == "low" else values.dtype
        lu, piv = jax.scipy.linalg.lu_factor(self._dense(values.astype(dtype)))

        def inverse():
            # (P W P^T)^{-1} P from the LU, by one solve with P's columns; then P^T on the left.
            y = jax.scipy.linalg.lu_solve((lu, piv), jnp.asarray(self._p_matrix, dtype))
            return y if self._position is None else y[self._position]

        matrix = self._by_platform(lambda: lu, inverse)
        # A non-finite matrix must fail the solve on every backend: the GPU LU was seen to give a
        # finite solution for a matrix holding a NaN, so the factor is poisoned explicitly (the
        # solves stay linear in b, as the transposed solves of the adjoint need).
        finite = jnp.all(jnp.isfinite(values))
        return DenseFactors(jnp.where(finite, matrix, jnp.nan), piv)

    def _raw_solve(self, factors, b, transpose, slot):
        return self._by_platform(lambda: self._lu_solve(factors, b, transpose),
                                 lambda: self._inverse_solve(factors, b, transpose))  # fmt: skip

    def _lu_solve(self, factors, b, transpose):
        # W x = b  <=>  (P W P^T) (P x) = P b, and W^T x = b  <=>  (P W P^T)^T (P x) = P b.
        lu, piv = factors.matrix, factors.piv
        pb = b if self._order is None else b[self._order]
        z = jax.scipy.linalg.lu_solve((lu, piv), pb.astype(lu.dtype), trans=1 if transpose else 0)
        x = z if self._position is None else z[self._position]
        return x.astype(b.dtype)

    def _inverse_solve(self, factors, b, transpose):
        # x = X b, or X^T b as (b^T X)^T (b may hold several right-hand sides as its columns).
        inv = factors.matrix
        r = b.astype(inv.dtype)
        x = jnp.matmul(r.T, inv, precision=_HIGHEST).T if transpose else jnp.matmul(inv, r, precision=_HIGHEST)
        return x.astype(b.dtype)
