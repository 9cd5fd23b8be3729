"""The dtype policy of a solve: ``ds.Precision``.

A policy says in which dtype states and residuals are computed, in which dtype the linear
systems are factored, and how the two meet (refinement). It is declared once, on the problem
(``spec.build(precision=...)``), and every layer reads its resolved fields:

* ``compute_dtype``: states, parameters, residuals and Jacobians inside the solve.
* ``solve_mode``: how ``W x = b`` is solved.
    - ``"fp64"``: factor and solve in float64 (read as ``"fp32"`` under float32 compute).
    - ``"fp32"``: factor in float32 and use the float32 solution as it is.
    - ``"fp32_ir"``: factor in float32, refine the solution against a float64 residual.
    - ``"adaptive"``: as ``"fp32_ir"``, and fall back to a float64 factorization at run time
      when refinement stalls.
* derivative directions inherit these unless told otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

SOLVE_MODES = ("fp64", "fp32", "fp32_ir", "adaptive")
_FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def _as_float_dtype(value: Any, field: str) -> np.dtype:
    try:
        dtype = np.dtype(value)
    except TypeError as err:
        raise ValueError(f"Precision.{field}={value!r} is not a dtype; use jnp.float32 or jnp.float64.") from err
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(
            f"Precision.{field}={dtype} is not a real floating dtype; use float32 or float64."
        )
    return dtype


def _check_mode(value: Any, field: str) -> str:
    if value not in SOLVE_MODES:
        raise ValueError(
            f"Precision.{field}={value!r} is not a solve mode; choose one of {', '.join(map(repr, SOLVE_MODES))}."
        )
    return value


@dataclasses.dataclass(frozen=True)
class Precision:
    """The dtype policy of a solve, declared once on the problem.

    ``Precision()`` is float64 compute with the ``"fp64"`` solve mode, the library's default.

    Args:
        compute_dtype: floating dtype of states, parameters, residuals and Jacobians inside the solve.
        solve_mode: linear solve mode, one of ``"fp64"``, ``"fp32"``, ``"fp32_ir"``, ``"adaptive"``;
            ``"fp64"`` is read as ``"fp32"`` under a float32 ``compute_dtype``.
        adjoint_compute_dtype: dtype of the reverse sweep, at least as wide as ``compute_dtype``,
            which it inherits when None.
        adjoint_ir_tol: positive refinement target of the reverse sweep's solves; None inherits the
            forward target (the linear solver's ``ir_tol``).
        forward_sensitivity_solve_mode: solve mode of forward sensitivities; None inherits ``solve_mode``.
        reverse_sensitivity_solve_mode: solve mode of the reverse sweep; None inherits ``solve_mode``.
        jacobian_values_dtype: dtype of the Jacobian entries alone, no wider than ``compute_dtype``;
            None inherits it.

    Raises:
        ValueError: for an unknown solve mode, a dtype that is not float32/float64, an adjoint dtype
            narrower than the compute dtype, Jacobian values wider than it, a non-positive
            ``adjoint_ir_tol``, or refinement modes under float32 compute (there is no wider
            residual to refine against).
    """

    compute_dtype: Any = np.float64
    solve_mode: str = "fp64"
    adjoint_compute_dtype: Any = None
    adjoint_ir_tol: float | None = None
    forward_sensitivity_solve_mode: str | None = None
    reverse_sensitivity_solve_mode: str | None = None
    jacobian_values_dtype: Any = None

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        compute = _as_float_dtype(self.compute_dtype, "compute_dtype")
        set_("compute_dtype", compute)
        _check_mode(self.solve_mode, "solve_mode")
        for field in ("forward_sensitivity_solve_mode", "reverse_sensitivity_solve_mode"):
            if getattr(self, field) is not None:
                _check_mode(getattr(self, field), field)
        if self.adjoint_compute_dtype is not None:
            adjoint = _as_float_dtype(self.adjoint_compute_dtype, "adjoint_compute_dtype")
            if adjoint.itemsize < compute.itemsize:
                raise ValueError(
                    f"Precision.adjoint_compute_dtype={adjoint} is narrower than compute_dtype={compute}; "
                    "the reverse sweep must be at least as wide (leave it None to inherit)."
                )
            set_("adjoint_compute_dtype", adjoint)
        if self.jacobian_values_dtype is not None:
            jac = _as_float_dtype(self.jacobian_values_dtype, "jacobian_values_dtype")
            if jac.itemsize > compute.itemsize:
                raise ValueError(
                    f"Precision.jacobian_values_dtype={jac} is wider than compute_dtype={compute}; "
                    "Jacobian entries can be stored narrower than the states, never wider."
                )
            set_("jacobian_values_dtype", jac)
        if self.adjoint_ir_tol is not None:
            tol = float(self.adjoint_ir_tol)
            if not (tol > 0.0 and np.isfinite(tol)):
                raise ValueError(
                    f"Precision.adjoint_ir_tol={self.adjoint_ir_tol!r} must be a positive finite number "
                    "(or None to inherit the forward refinement target)."
                )
            set_("adjoint_ir_tol", tol)
        if compute == np.float32:
            for field in ("solve_mode", "forward_sensitivity_solve_mode", "reverse_sensitivity_solve_mode"):
                if getattr(self, field) in ("fp32_ir", "adaptive"):
                    raise ValueError(
                        f"Precision.{field}={getattr(self, field)!r} refines against a float64 residual, "
                        "which float32 compute does not have; use compute_dtype=float64 or solve_mode='fp32'."
                    )

    # -- presets ---------------------------------------------------------------------------
    @classmethod
    def fp64(cls) -> "Precision":
        """Float64 compute with float64 factors, the default."""
        return cls(compute_dtype=np.float64, solve_mode="fp64")

    @classmethod
    def fp32(cls) -> "Precision":
        """Float32 compute with float32 factors, end to end (states, factors, both derivative directions)."""
        return cls(compute_dtype=np.float32, solve_mode="fp32")

    @classmethod
    def fp32_factor(cls) -> "Precision":
        """Float64 compute with unrefined float32 factors; forward sensitivities on float32 factors,
        the reverse sweep in float64."""
        return cls(
            compute_dtype=np.float64,
            solve_mode="fp32",
            forward_sensitivity_solve_mode="fp32",
            reverse_sensitivity_solve_mode="fp64",
        )

    @classmethod
    def fp32_ir(cls) -> "Precision":
        """Float64 compute with float32 factors refined against a float64 residual; forward
        sensitivities refined the same way, the reverse sweep in float64."""
        return cls(
            compute_dtype=np.float64,
            solve_mode="fp32_ir",
            forward_sensitivity_solve_mode="fp32_ir",
            reverse_sensitivity_solve_mode="fp64",
        )

    # -- resolved fields (what the layers read) ---------------------------------------------
    def _resolve_mode(self, mode: str) -> str:
        if self.compute_dtype == np.float32 and mode == "fp64":
            return "fp32"
        return mode

    @property
    def effective_solve_mode(self) -> str:
        return self._resolve_mode(self.solve_mode)

    @property
    def effective_forward_sensitivity_solve_mode(self) -> str:
        return self._resolve_mode(self.forward_sensitivity_solve_mode or self.solve_mode)

    @property
    def effective_reverse_sensitivity_solve_mode(self) -> str:
        # Read against the reverse sweep's own dtype: a float64 adjoint of a float32 solve keeps "fp64".
        mode = self.reverse_sensitivity_solve_mode or self.solve_mode
        if self.effective_adjoint_compute_dtype == np.float32 and mode == "fp64":
            return "fp32"
        return mode

    @property
    def effective_adjoint_compute_dtype(self) -> np.dtype:
        return self.adjoint_compute_dtype if self.adjoint_compute_dtype is not None else self.compute_dtype

    @property
    def effective_jacobian_values_dtype(self) -> np.dtype:
        return self.jacobian_values_dtype if self.jacobian_values_dtype is not None else self.compute_dtype

    @property
    def uses_float64(self) -> bool:
        """Whether any part of the policy needs JAX's x64 mode."""
        return np.dtype(np.float64) in (self.compute_dtype, self.effective_adjoint_compute_dtype) or any(
            m in ("fp64", "fp32_ir", "adaptive")
            for m in (
                self.effective_solve_mode,
                self.effective_forward_sensitivity_solve_mode,
                self.effective_reverse_sensitivity_solve_mode,
            )
        )

    def check_x64(self) -> None:
        """Raise a clear error if this policy needs float64 while JAX's x64 mode is off."""
        if self.uses_float64 and not jax.config.values["jax_enable_x64"]:
            raise RuntimeError(
                f"{self!r} computes in float64, but JAX's x64 mode is off, so JAX would silently use "
                "float32. Turn it on before creating arrays: set JAX_ENABLE_X64=1 in the environment, or "
                'call jax.config.update("jax_enable_x64", True). For float32 end to end, use ds.Precision.fp32().'
            )
