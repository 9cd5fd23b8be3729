"""Rosenbrock tableaus: the coefficients of a Rosenbrock method, and their order conditions.

A tableau holds the method in the W-transformed form that the step computes (Hairer and Wanner
IV.7, (7.27); OrdinaryDiffEq.jl's form):

    W k_i = f(t + c_i h, y + sum_j A_ij k_j) + sum_j (C_ij / h) k_j + d_i h f_t,
    W = I/(h gamma) - J,    y_new = y + sum_j b_j k_j,    error estimate = sum_j b_error_j k_j,

with one factorization of ``W`` per step and one solve per stage. :meth:`RosenbrockTableau.classical`
converts it back to the classical form ``(alpha, Gamma, b)`` (``Gamma = (diag(1/gamma) - C)^{-1}``,
``alpha = A Gamma``, ``b_classical = b Gamma``), where the order conditions of
``_order_conditions`` apply.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from ._order_conditions import rosenbrock_residuals


class ClassicalRosenbrock(NamedTuple):
    """A Rosenbrock method in Hairer and Wanner's classical form (IV.7, (7.4'))."""

    alpha: np.ndarray  # (s, s) strictly lower
    gamma: np.ndarray  # (s, s) lower, diagonal gamma
    b: np.ndarray  # weights of the solution
    b_embedded: np.ndarray  # weights of the embedded solution (the error estimate's comparison)


def _frozen(x, shape, name):
    arr = np.array(x, dtype=np.float64)
    if arr.shape != shape:
        raise ValueError(f"RosenbrockTableau.{name} has shape {arr.shape}; expected {shape}.")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"RosenbrockTableau.{name} must be finite.")
    arr.setflags(write=False)
    return arr


@dataclasses.dataclass(frozen=True, eq=False)
class RosenbrockTableau:
    """Coefficients of a Rosenbrock method (W-transformed form, see the module docstring).

    Attributes:
        A: ``(s, s)`` strictly lower: stage ``i`` evaluates ``f`` at ``y + sum_j A_ij k_j``.
        C: ``(s, s)`` strictly lower: stage ``i`` adds ``sum_j (C_ij / h) k_j``.
        c: ``(s,)`` stage times ``t + c_i h`` (``c_0 = 0``: stage 0 reuses ``f(t, y)``).
        d: ``(s,)`` coefficients of ``h f_t`` (the time derivative, for non-autonomous problems).
        b, b_error: ``(s,)`` weights of the solution and of the error estimate.
        gamma: the diagonal of the method (``W = I/(h gamma) - J``).
        order, error_order: orders of the solution and of the embedded solution
            ``y + sum_j (b_j - b_error_j) k_j``.
        chained_from: for stiffly accurate methods of the Rodas kind: stages ``i >= chained_from``
            evaluate at the previous stage's state plus its increment (``u_i = u_{i-1} + k_{i-1}``),
            the solution is the last stage's state plus its increment and the error estimate is
            the last increment; the step computes them that way (fewer operations, and the
            rounding of the published method). ``A``, ``b`` and ``b_error`` must say the same
            (:meth:`chained` builds them). None: no chain.

    Raises:
        ValueError: for wrong shapes, non-finite or non-lower-triangular coefficients, a first
            stage that is not at ``(t, y)``, or a chain the coefficients do not match.
    """

    A: np.ndarray
    C: np.ndarray
    c: np.ndarray
    d: np.ndarray
    b: np.ndarray
    b_error: np.ndarray
    gamma: float
    order: int
    error_order: int
    chained_from: int | None = None

    def __post_init__(self):
        s = int(np.shape(self.c)[0]) if np.ndim(self.c) == 1 else -1
        if s < 1:
            raise ValueError(f"RosenbrockTableau.c must be a 1-D array of stage times, not {self.c!r}.")
        for name, shape in (("A", (s, s)), ("C", (s, s)), ("c", (s,)), ("d", (s,)), ("b", (s,)), ("b_error", (s,))):
            object.__setattr__(self, name, _frozen(getattr(self, name), shape, name))
        for name in ("A", "C"):
            if np.any(np.triu(getattr(self, name)) != 0.0):
                raise ValueError(f"RosenbrockTableau.{name} must be strictly lower triangular.")
        if not (float(self.gamma) > 0.0 and np.isfinite(self.gamma)):
            raise ValueError(f"RosenbrockTableau.gamma={self.gamma!r} must be positive and finite.")
        object.__setattr__(self, "gamma", float(self.gamma))
        for name in ("order", "error_order"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) < 1:
                raise ValueError(f"RosenbrockTableau.{name}={value!r} must be a positive integer.")
        if self.c[0] != 0.0:
            raise ValueError("RosenbrockTableau.c[0] must be 0 (the first stage reuses f(t, y)).")
        k = self.chained_from
        if k is not None:
            if isinstance(k, bool) or not 1 <= int(k) <= s:
                raise ValueError(f"RosenbrockTableau.chained_from={k!r} must be an integer in 1..{s} or None.")
            eye = np.eye(s)
            rows_ok = all(np.array_equal(self.A[i], self.A[i - 1] + eye[i - 1]) for i in range(int(k), s))
            if not (rows_ok and np.array_equal(self.b, self.A[s - 1] + eye[s - 1])
                    and np.array_equal(self.b_error, eye[s - 1])):  # fmt: skip
                raise ValueError(
                    "RosenbrockTableau: A, b and b_error do not match chained_from (stage i >= chained_from must "
                    "be stage i-1 plus its increment, b the last stage plus its increment, b_error the last "
                    "increment); build the tableau with RosenbrockTableau.chained(...)."
                )

    @property
    def stages(self) -> int:
        return int(self.c.shape[0])

    @classmethod
    def chained(cls, *, A, C, c, d, gamma, order, error_order, chained_from) -> "RosenbrockTableau":
        """A stiffly accurate tableau whose stages from ``chained_from`` on chain (see the class);
        ``A``'s rows from ``chained_from`` on are filled in, ``b`` and ``b_error`` follow."""
        A = np.array(A, dtype=np.float64)
        s = A.shape[0]
        eye = np.eye(s)
        for i in range(int(chained_from), s):
            A[i] = A[i - 1] + eye[i - 1]
        return cls(A=A, C=C, c=c, d=d, b=A[s - 1] + eye[s - 1], b_error=eye[s - 1], gamma=gamma, order=order,
                   error_order=error_order, chained_from=chained_from)  # fmt: skip

    def classical(self) -> ClassicalRosenbrock:
        """The method in the classical form (Hairer and Wanner IV.7, (7.27) read backwards)."""
        Gamma = np.linalg.inv(np.diag(np.full(self.stages, 1.0 / self.gamma)) - self.C)
        return ClassicalRosenbrock(self.A @ Gamma, Gamma, self.b @ Gamma, (self.b - self.b_error) @ Gamma)

    def order_residuals(self, order: int | None = None, error_order: int | None = None):
        """Residuals of the order conditions (``sum_j b_j Phi_j(t) - 1/gamma(t)`` per rooted tree)
        of the solution up to ``order`` and of the embedded solution up to ``error_order``
        (default: the tableau's own), plus the two conditions that make the method consistent on
        non-autonomous problems (``c_i = sum_j alpha_ij``, ``d_i = sum_j Gamma_ij``).

        Returns:
            ``(solution, embedded, time)``: two dicts tree -> residual and the largest time residual.
        """
        cl = self.classical()
        solution = rosenbrock_residuals(cl.alpha, cl.gamma, cl.b, self.order if order is None else order)
        embedded = rosenbrock_residuals(
            cl.alpha, cl.gamma, cl.b_embedded, self.error_order if error_order is None else error_order
        )
        time = max(np.max(np.abs(cl.alpha.sum(axis=1) - self.c)), np.max(np.abs(cl.gamma.sum(axis=1) - self.d)))
        return solution, embedded, float(time)
