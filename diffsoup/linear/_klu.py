"""KLU sparse LU on the CPU (SuiteSparse, through klujax's XLA FFI handlers).

Symbolic analysis and numeric factorization handles allocated once per solve (inside the
program, so that compiled programs hold no handle addresses and can be cached on disk) and the
numeric handles refactored in place every step; transpose solves for the adjoint. See
``_klu_ffi`` for how klujax's traps are kept away from the integrator.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, final

import jax
import jax.numpy as jnp
import numpy as np

from . import _klu_ffi as ffi
from ._base import AbstractLinearSolver, AbstractPreparedSolver, round_to_float32
from ._ordering import depends_on


@final
@dataclasses.dataclass(frozen=True)
class KLU(AbstractLinearSolver):
    """KLU sparse direct solver, CPU only, float64 factors.

    Float32 solve modes are emulated: the factors are those of the float32-rounded values, computed
    in float64 (their accuracy, not their speed).

    Args:
        ir_tol: refinement target (see :class:`~diffsoup.linear.LinearSolver`).
        ir_max_steps: most refinement steps per solve.
    """

    def prepare(self, pattern, precision, *, layout=None) -> "PreparedKLU":
        if layout is not None:
            layout.check_one_device_factorization("ds.linear.KLU")
        return PreparedKLU(self, pattern, precision)


class KLUHandles(NamedTuple):
    """One slot's workspace: the symbolic analysis of the pattern and a numeric handle."""

    sym: Any
    num: Any


class KLUFactors(NamedTuple):
    """A numeric handle refactored in place, whether the values it was given were finite, and
    the analysis it was factored with."""

    num: Any
    finite: Any
    sym: Any


@final
class PreparedKLU(AbstractPreparedSolver):
    def __init__(self, solver, pattern, precision):
        if not jax.config.values["jax_enable_x64"]:
            raise RuntimeError(
                "ds.linear.KLU factors in float64 and keeps 64-bit handles, which need JAX's x64 mode: set "
                'JAX_ENABLE_X64=1 or call jax.config.update("jax_enable_x64", True) first, or use ds.linear.Dense().'
            )
        platform = _default_platform()
        if platform != "cpu":
            raise ValueError(
                f"ds.linear.KLU runs on the CPU only (klujax's handlers), but JAX computes on {platform!r} here. "
                "On a GPU use ds.linear.CuDSS() (the default there), or put the work on the CPU: "
                "with jax.default_device(jax.devices('cpu')[0]): ..."
            )
        super().__init__(solver, pattern, precision)
        ffi.load_klujax()
        self.n = int(pattern.n)
        self.Ai = np.asarray(pattern.rows, np.int32)
        self.Aj = np.asarray(pattern.indices, np.int32)
        self.diag_mask = np.asarray(pattern.rows == pattern.indices)

    def _identity_like(self, values):
        # Depends on `values` so that it is batched as they are under vmap, but is always the
        # identity (finite, never singular).
        zero = 0.0 * jnp.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
        return jnp.where(self.diag_mask, 1.0, zero).astype(jnp.float64)

    def _raw_begin(self, values, slot):
        sym = ffi.analyze(self.Ai, self.Aj, self.n)
        return KLUHandles(sym, ffi.factor(self.Ai, self.Aj, self._identity_like(values), sym))

    def _raw_end(self, workspace, after):
        token = jnp.zeros((), jnp.int32)
        for handles in (workspace.fp64, workspace.low):
            if handles is not None:
                token = token + ffi.free(handles.num, (after, token))
                token = token + ffi.free_symbolic(handles.sym, (after, token))
        return token

    def _raw_factor(self, workspace, values, slot):
        v = round_to_float32(values) if slot == "low" else values
        # Only finite values are factored: klujax turns a singular matrix into a program abort.
        finite = jnp.all(jnp.isfinite(v))
        v = jnp.where(finite, v, self._identity_like(v))
        return KLUFactors(ffi.refactor(self.Ai, self.Aj, v, workspace.sym, workspace.num), finite, workspace.sym)

    def _unfactored(self, workspace, values, slot):
        # The slot's own handle (allocated at begin, always factored): a zero handle is a null
        # pointer to klujax, and a vmap'd cond solves with these factors too. Marked not finite,
        # so a solve with them gives NaN.
        return KLUFactors(workspace.num, jnp.zeros((), bool), workspace.sym)

    def _chain_slot(self, factors, after):
        # klu_solve uses a workspace inside the numeric object: two solves on one handle must
        # not run at once, so the next solve takes a handle that waits for this one's result.
        return factors._replace(num=depends_on(factors.num, after))

    def _raw_solve(self, factors, b, transpose, slot):
        x = ffi.solve(factors.sym, factors.num, b, transpose)
        if slot == "low":
            x = x.astype(jnp.float32).astype(b.dtype)
        return jnp.where(factors.finite, x, jnp.nan)


def _default_platform() -> str:
    """The platform JAX computes on by default: the ``jax.default_device`` in effect, else the
    default backend."""
    device = jax.config.values.get("jax_default_device")
    if device is None:
        return jax.default_backend()
    if isinstance(device, str):
        return "gpu" if device in ("cuda", "rocm") else device
    return "gpu" if device.platform in ("cuda", "rocm") else device.platform
