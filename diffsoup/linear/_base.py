"""The linear-solver interface the integrator calls, and the precision modes shared by every backend.

The integrator solves ``W x = b`` with ``W = I/(h gamma) - J`` given as values on a fixed CSR
pattern. A solver is a frozen configuration object (``Dense()``, ``KLU()``, ``CuDSS()``); at build
time ``solver.prepare(pattern, precision)`` does the host-side work once per pattern (symbolic
analysis) and returns a :class:`PreparedSolver`, whose methods are traced inside ``jit``:

* ``begin(batch_values)``: allocate what the backend keeps across steps (KLU numeric handles);
* ``factor(workspace, values, mode)``: one (re)factorization per step, in the solve mode;
* ``solve(fac, b, mode, transpose=..., ir_tol=...)``: one solve, refined as the mode says,
  returning the solution, the (possibly upgraded) factorization and a :class:`SolveInfo`;
* ``end(workspace, after)``: release, ordered after ``after``.

Precision modes (``ds.Precision``): ``"fp64"`` factors the values as they are; ``"fp32"`` factors
float32-rounded values and returns the unrefined solution; ``"fp32_ir"`` refines that solution
against a float64 residual until the correction is below ``ir_tol`` relative, in at most
``ir_max_steps`` steps, and reports failure if it stalls; ``"adaptive"`` does the same and, when
refinement stalls, factors in float64 and solves again (a *fallback*), using the float64 factors
for the rest of that step's solves. Failures are values (``SolveInfo.ok``), never exceptions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .._precision import SOLVE_MODES


class SolveInfo(NamedTuple):
    """Counters and outcome of one solve (int32 / bool scalars, batched under vmap)."""

    ok: Any
    ir_steps: Any
    fallbacks: Any

    @staticmethod
    def success(ir_steps=0, fallbacks=0, ok=True):
        return SolveInfo(jnp.asarray(ok), jnp.asarray(ir_steps, jnp.int32), jnp.asarray(fallbacks, jnp.int32))


@dataclasses.dataclass(frozen=True)
class LinearSolver:
    """Base of the solver configurations.

    Args:
        ir_tol: target of iterative refinement, as the size of the last correction relative to
            the solution (infinity norms); used by ``"fp32_ir"`` and ``"adaptive"``.
        ir_max_steps: most refinement steps per solve.
    """

    ir_tol: float = 1e-13
    ir_max_steps: int = 12

    def __post_init__(self):
        if not (float(self.ir_tol) > 0.0):
            raise ValueError(f"{type(self).__name__}.ir_tol={self.ir_tol!r} must be positive.")
        if isinstance(self.ir_max_steps, bool) or int(self.ir_max_steps) < 1:
            raise ValueError(f"{type(self).__name__}.ir_max_steps={self.ir_max_steps!r} must be a positive integer.")

    def prepare(self, pattern, precision, *, layout=None) -> "PreparedSolver":  # pragma: no cover - abstract
        """Host-side work once per pattern (symbolic analysis); ``layout`` is the problem's ``ds.Layout``."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        return type(self).__name__


def csr_matvec(pattern_rows, pattern_cols, n, values, x, transpose=False):
    """``A @ x`` (or ``A.T @ x``) for values on a CSR pattern; ``x`` is ``(n,)`` or ``(n, k)``."""
    src, dst = (pattern_rows, pattern_cols) if transpose else (pattern_cols, pattern_rows)
    contrib = values.reshape((-1,) + (1,) * (x.ndim - 1)) * x[src]
    return jax.ops.segment_sum(contrib, dst, num_segments=n, indices_are_sorted=not transpose)


def _inf_norm(x):
    return jnp.max(jnp.abs(x)) if x.size else jnp.zeros((), x.dtype)


class PreparedSolver:
    """A solver bound to one pattern and precision. Backends implement the ``_raw_*`` methods.

    Backend methods (all traced):
        ``_raw_begin(values, slots)`` -> workspace pytree
        ``_raw_factor(workspace, values, slot)`` -> factor pytree; slot ``"low"`` factors the
            float32-rounded values, ``"fp64"`` the values as they are
        ``_raw_solve(factor, b, transpose, slot)`` -> x in the dtype of ``b``
        ``_raw_end(workspace, after)`` -> int32 token
    """

    solver: LinearSolver

    def __init__(self, solver: LinearSolver, pattern, precision):
        self.solver = solver
        self.pattern = pattern
        self.precision = precision
        self.n = pattern.n
        self.rows = jnp.asarray(pattern.rows)
        self.cols = jnp.asarray(pattern.indices)

    # -- what the integrator calls ------------------------------------------------------------
    @staticmethod
    def slots_for(modes) -> tuple[str, ...]:
        """Factorizations a set of solve modes needs: ``"low"`` (float32-rounded) and/or ``"fp64"``."""
        slots = set()
        for mode in modes:
            _check_mode(mode)
            slots.add("fp64" if mode == "fp64" else "low")
            if mode == "adaptive":
                slots.add("fp64")  # kept ready for the fallback; factored only when needed
        return tuple(sorted(slots))

    def begin(self, values, modes=("fp64",)):
        """Allocate what persists across steps for the solve ``modes`` (traced)."""
        return self._raw_begin(values, self.slots_for(modes))

    def end(self, workspace, after):
        """Release the workspace after ``after`` is computed; returns an int32 token."""
        return self._raw_end(workspace, after)

    def factor(self, workspace, values, modes):
        """Factor ``values`` for the solve ``modes`` (one factorization per slot they need).

        The factorization is not differentiated: tangents and cotangents of the values enter
        through the solves' own rules (``diffsoup.integrate``), which reuse these factors.
        """
        modes = tuple(modes)
        eager = {"fp64" if m == "fp64" else "low" for m in modes}
        frozen = jax.lax.stop_gradient(values)
        fac = {"values": values, "workspace": workspace}
        for slot in ("low", "fp64"):
            if slot in eager:
                fac[slot] = self._raw_factor(workspace, frozen, slot)
        if "adaptive" in modes:
            fac["upgraded"] = jnp.zeros((), bool)
            if "fp64" not in fac:
                fac["fp64"] = jax.tree_util.tree_map(
                    jnp.zeros_like, jax.eval_shape(lambda v: self._raw_factor(workspace, v, "fp64"), frozen)
                )
                fac["fp64_ready"] = jnp.zeros((), bool)
            else:
                fac["fp64_ready"] = jnp.ones((), bool)
        return fac

    def solve(self, fac, b, mode: str, *, transpose: bool = False, ir_tol: float | None = None):
        """Solve with a factorization from :meth:`factor` that covered ``mode``.

        Returns ``(x, fac, info)``; ``fac`` changes only when ``"adaptive"`` falls back to float64.
        """
        _check_mode(mode)
        tol = self.solver.ir_tol if ir_tol is None else ir_tol
        if mode == "fp64":
            x = self._raw_solve(fac["fp64"], b, transpose, "fp64")
            return x, self.chain(fac, x), SolveInfo.success(ok=jnp.all(jnp.isfinite(x)))
        if mode == "fp32":
            x = self._raw_solve(fac["low"], b, transpose, "low")
            return x, self.chain(fac, x), SolveInfo.success(ok=jnp.all(jnp.isfinite(x)))
        if mode == "fp32_ir":
            x, steps, converged = self._refine(fac, b, transpose, tol)
            return x, self.chain(fac, x), SolveInfo.success(steps, 0, converged)
        # adaptive: once a factorization has fallen back, its float64 factors serve every solve.
        x, steps, converged = jax.lax.cond(
            fac["upgraded"],
            lambda: (jnp.zeros_like(b), jnp.zeros((), jnp.int32), jnp.zeros((), bool)),
            lambda: self._refine(fac, b, transpose, tol),
        )
        need64 = fac["upgraded"] | ~converged
        refactor = need64 & ~fac["fp64_ready"]
        frozen = jax.lax.stop_gradient(fac["values"])
        fac64 = jax.lax.cond(
            refactor, lambda: self._raw_factor(fac["workspace"], frozen, "fp64"), lambda: fac["fp64"]
        )
        x_out = jax.lax.cond(need64, lambda: self._raw_solve(fac64, b, transpose, "fp64"), lambda: x)
        fell_back = need64 & ~fac["upgraded"]
        new_fac = dict(fac, fp64=fac64, upgraded=need64, fp64_ready=fac["fp64_ready"] | need64)
        info = SolveInfo.success(steps, fell_back.astype(jnp.int32), jnp.all(jnp.isfinite(x_out)))
        return x_out, self.chain(new_fac, x_out), info

    # Slots of a factorization that a solve reads (and, for backends with solve workspaces, uses).
    SLOTS = ("low", "fp64")

    def chain(self, fac, after):
        """``fac`` with its slots made data-dependent on ``after`` (see :meth:`_chain_slot`)."""
        return {k: (self._chain_slot(v, after) if k in self.SLOTS else v) for k, v in fac.items()}

    def _chain_slot(self, slot_fac, after):
        """Backends whose solves share a workspace (KLU keeps one in its numeric object) make the
        next solve wait for ``after``; XLA otherwise runs independent solves concurrently."""
        return slot_fac

    # -- refinement -----------------------------------------------------------------------------
    def _refine(self, fac, b, transpose, tol):
        """Iterative refinement of the float32-factor solution against the float64 residual."""
        values = fac["values"]
        max_steps = int(self.solver.ir_max_steps)

        def residual(x):
            return b - csr_matvec(self.rows, self.cols, self.n, values, x, transpose)

        x0 = self._raw_solve(fac["low"], b, transpose, "low")

        def cond(state):
            x, dx_norm, prev_norm, k, stalled = state
            converged = dx_norm <= tol * _inf_norm(x)
            return (~converged) & (~stalled) & (k < max_steps)

        def body(state):
            x, dx_norm, prev_norm, k, stalled = state
            dx = self._raw_solve(fac["low"], residual(x), transpose, "low")
            new_norm = _inf_norm(dx)
            # Refinement contracts by about cond(W) * eps32 per step; a correction that does not
            # halve means it will not reach the target (or is diverging).
            stalled = ~(new_norm <= 0.5 * dx_norm) | ~jnp.isfinite(new_norm)
            return x + dx, new_norm, dx_norm, k + 1, stalled

        inf = jnp.asarray(jnp.inf, b.dtype)
        init = (x0, inf, inf, jnp.zeros((), jnp.int32), jnp.zeros((), bool))
        x, dx_norm, _, k, stalled = jax.lax.while_loop(cond, body, init)
        converged = (dx_norm <= tol * _inf_norm(x)) & jnp.all(jnp.isfinite(x))
        return x, k, converged


# ------------------------------------------------------------------------------------------------
# Ordering by data dependency
# ------------------------------------------------------------------------------------------------
# XLA's CPU runtime runs operations in any order their data dependencies allow (and removes
# optimization barriers before that), so the order of side effects (KLU's in-place refactor, its
# solve workspace, releases) must be carried by data. `depends_on(x, after)` returns `x` unchanged
# but computed from `after`: x + 0 where the 0 is `popcount(bits) > 64` of a reduction of `after`,
# always false for a 64-bit word and not something the simplifier folds. Under vmap, an unbatched
# `x` stays unbatched (the dependency on a batched `after` is reduced over the batch), so one
# factorization serving many tangents is not turned into one handle per tangent.

_depends_on_p = Primitive("diffsoup_depends_on")
_depends_on_p.def_abstract_eval(lambda x, after: jax.core.ShapedArray(x.shape, x.dtype))


def _depends_on_impl(x, after):
    bits = jax.lax.bitcast_convert_type(after, jnp.uint64)
    zero = jax.lax.population_count(bits) > 64
    return x + zero.astype(x.dtype)


_depends_on_p.def_impl(lambda x, after: jax.jit(_depends_on_impl)(x, after))
mlir.register_lowering(
    _depends_on_p, mlir.lower_fun(_depends_on_impl, multiple_results=False)
)


def _depends_on_batch(args, dims):
    x, after = args
    xd, ad = dims
    if ad is not None:
        after = jnp.sum(after, axis=ad)
    return _depends_on_p.bind(x, after), xd


def _depends_on_jvp(primals, tangents):
    x, after = primals
    dx, _ = tangents
    return _depends_on_p.bind(x, after), dx


batching.primitive_batchers[_depends_on_p] = _depends_on_batch
ad.primitive_jvps[_depends_on_p] = _depends_on_jvp


def _reduce_to_scalar(after):
    leaves = [jnp.sum(jnp.asarray(a).astype(jnp.float64)) for a in jax.tree_util.tree_leaves(after)]
    total = jnp.zeros((), jnp.float64)
    for leaf in leaves:
        total = total + leaf
    return jax.lax.stop_gradient(total)


def depends_on(x, after):
    """``x`` unchanged, but not computed before ``after`` (any pytree) is."""
    return _depends_on_p.bind(x, _reduce_to_scalar(after))


def _check_mode(mode):
    if mode not in SOLVE_MODES:
        raise ValueError(f"unknown solve mode {mode!r}; choose one of {SOLVE_MODES}")


def round_to_float32(values):
    """Values as a float32 factorization sees them (kept in their dtype, for float64-only backends)."""
    return values.astype(jnp.float32).astype(values.dtype)


def numpy_dtype(x) -> np.dtype:
    return np.dtype(x.dtype)
