"""The linear-solver interface the integrator calls, and the precision modes shared by every backend.

The integrator solves ``W x = b`` with ``W`` (``I/(h gamma) - J`` for a Rosenbrock method) given
as values on a fixed CSR pattern. A solver is a frozen configuration object (``Dense()``,
``KLU()``, ``CuDSS()``: final subclasses of :class:`AbstractLinearSolver`); at build time
``solver.prepare(pattern, precision)`` does the host-side work once per pattern (symbolic
analysis) and returns an :class:`AbstractPreparedSolver`, whose methods are traced inside ``jit``:

* ``begin(batch_values, modes)``: allocate what the backend keeps across steps (a
  :class:`Workspace`: KLU numeric handles, cuDSS analyses);
* ``factor(workspace, values, modes)``: one (re)factorization per step, a :class:`Factorization`;
* ``solve(fac, b, mode, transpose=..., ir_tol=...)``: one solve, refined as the mode says,
  returning the solution, the (possibly upgraded) factorization and a :class:`SolveInfo`;
* ``end(workspace, after)``: release, ordered after ``after``.

A backend implements four hooks, declared abstract here: ``_raw_begin`` (one slot's workspace),
``_raw_factor`` (one slot's factors), ``_raw_solve`` (a solve with one slot's factors) and
``_raw_end`` (release). A *slot* is ``"fp64"`` (factors of the values as they are) or ``"low"``
(factors of the float32-rounded values).

Precision modes (``ds.Precision``): ``"fp64"`` factors the values as they are; ``"fp32"`` factors
float32-rounded values and returns the unrefined solution; ``"fp32_ir"`` refines that solution
against a float64 residual until the correction is below ``ir_tol`` relative, in at most
``ir_max_steps`` steps, and reports failure if it stalls; ``"adaptive"`` does the same and, when
refinement stalls, factors in float64 and solves again (a *fallback*), using the float64 factors
for the rest of that step's solves; under ``vmap`` over right-hand sides that share one matrix
(``jax.jacfwd``'s tangents), a fallback of any of them upgrades the matrix for all
(``_any_per_matrix``). Failures are values (``SolveInfo.ok``), never exceptions.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._precision import SOLVE_MODES
from ._any_per_matrix import any_per_matrix

Slot = Literal["low", "fp64"]
SLOTS: tuple[Slot, ...] = ("low", "fp64")


class SolveInfo(NamedTuple):
    """Counters and outcome of one solve (int32 / bool scalars, batched under vmap)."""

    ok: Any
    ir_steps: Any
    fallbacks: Any

    @staticmethod
    def success(ir_steps=0, fallbacks=0, ok=True):
        return SolveInfo(jnp.asarray(ok), jnp.asarray(ir_steps, jnp.int32), jnp.asarray(fallbacks, jnp.int32))

    def combine(self, other: "SolveInfo") -> "SolveInfo":
        """Outcome and counters of two solves together (both must succeed)."""
        return SolveInfo(self.ok & other.ok, self.ir_steps + other.ir_steps, self.fallbacks + other.fallbacks)


class Workspace(NamedTuple):
    """What a backend keeps across the steps of one solve, per slot (None: a slot the modes do not need)."""

    low: Any = None
    fp64: Any = None


class Factors(NamedTuple):
    """The part of a factorization that a solve may change.

    Attributes:
        low, fp64: each slot's factors (backend pytrees; None where the modes do not need the
            slot). A solve returns them chained after itself (backends whose solves share a
            workspace make the next solve wait for this one).
        upgraded: ``"adaptive"`` only: this step fell back to float64, whose factors now serve
            every solve of the step.
        fp64_ready: ``"adaptive"`` only: the float64 factors are computed (they are factored
            lazily, at the first fallback, unless another mode needs them anyway).
    """

    low: Any = None
    fp64: Any = None
    upgraded: Any = None
    fp64_ready: Any = None


class Factorization(NamedTuple):
    """One step's factorization of ``W``: its values (differentiable: tangents and cotangents of
    ``W`` enter through the solves' rules), the workspace it lives in, and its :class:`Factors`."""

    values: Any
    workspace: Workspace
    factors: Factors


@dataclasses.dataclass(frozen=True)
class AbstractLinearSolver(abc.ABC):
    """Base of the solver configurations (``ds.linear.LinearSolver`` is this class).

    A final subclass is a frozen dataclass of numerical options implementing :meth:`prepare`.

    Args:
        ir_tol: target of iterative refinement, as the size of the last correction relative to
            the solution (infinity norms); used by ``"fp32_ir"`` and ``"adaptive"``.
        ir_max_steps: most refinement steps per solve.
    """

    ir_tol: float = dataclasses.field(default=1e-13, kw_only=True)
    ir_max_steps: int = dataclasses.field(default=12, kw_only=True)

    def __post_init__(self):
        if not (float(self.ir_tol) > 0.0):
            raise ValueError(f"{type(self).__name__}.ir_tol={self.ir_tol!r} must be positive.")
        if isinstance(self.ir_max_steps, bool) or int(self.ir_max_steps) < 1:
            raise ValueError(f"{type(self).__name__}.ir_max_steps={self.ir_max_steps!r} must be a positive integer.")

    @abc.abstractmethod
    def prepare(self, pattern, precision, *, layout=None) -> "AbstractPreparedSolver":
        """Host-side work once per pattern (symbolic analysis); ``layout`` is the problem's ``ds.Layout``."""

    @property
    def name(self) -> str:
        return type(self).__name__


LinearSolver = AbstractLinearSolver  # the public name (ds.linear.LinearSolver)


# Off the CPU, a pattern whose (entries x rows) is at most this sums a product's terms into rows by
# a product with a 0/1 matrix rather than segment_sum's scatter-add: on the H200 the scatter-add of
# the tangent solves' W x products (10,000 lanes, 25 tangents, 56 entries) took 0.2 ms per stage, 12 %
# of a forward-sensitivity evaluation (the product's time there is not measured yet); the 0/1
# matrix of such patterns is a few kilobytes.
INCIDENCE_MAX_ENTRIES = 1 << 16


def csr_matvec(pattern_rows, pattern_cols, n, values, x, transpose=False):
    """``A @ x`` (or ``A.T @ x``) for values on a CSR pattern; ``x`` is ``(n,)`` or ``(n, k)``."""
    src, dst = (pattern_rows, pattern_cols) if transpose else (pattern_cols, pattern_rows)
    terms = values.reshape((-1,) + (1,) * (x.ndim - 1)) * x[src]

    def by_scatter():
        return jax.ops.segment_sum(terms, dst, num_segments=n, indices_are_sorted=not transpose)

    if isinstance(dst, jax.core.Tracer) or np.size(dst) * n > INCIDENCE_MAX_ENTRIES:
        return by_scatter()
    return jax.lax.platform_dependent(cpu=by_scatter, default=lambda: rows_by_product(terms, np.asarray(dst), n))


def rows_by_product(terms, rows, n):
    """``out[i] = sum of terms[e] over the entries e with rows[e] == i`` (``terms`` ``(entries, ...)``,
    ``rows`` concrete) as one product with a 0/1 ``(n, entries)`` matrix: exact weights, each row's
    terms summed in one pass."""
    incidence = np.equal.outer(np.arange(n), rows).astype(terms.dtype)
    return jnp.tensordot(jnp.asarray(incidence), terms, axes=1, precision=jax.lax.Precision.HIGHEST)


def _inf_norm(x):
    return jnp.max(jnp.abs(x)) if x.size else jnp.zeros((), x.dtype)


class AbstractPreparedSolver(abc.ABC):
    """A solver bound to one pattern and precision (``ds.linear.PreparedSolver`` is this class).

    The methods without an underscore are what the integrator calls; a backend implements the
    abstract ``_raw_*`` hooks (all traced), and may override :meth:`_chain_slot`.
    """

    solver: AbstractLinearSolver

    def __init__(self, solver: AbstractLinearSolver, pattern, precision):
        self.solver = solver
        self.pattern = pattern
        self.precision = precision
        self.n = pattern.n
        self.rows = jnp.asarray(pattern.rows)
        self.cols = jnp.asarray(pattern.indices)

    # -- the backend's hooks ----------------------------------------------------------------------
    @abc.abstractmethod
    def _raw_begin(self, values, slot: Slot):
        """The workspace of one slot, for a solve whose matrices look like ``values``."""

    @abc.abstractmethod
    def _raw_factor(self, workspace, values, slot: Slot):
        """The factors of one slot (``workspace`` is that slot's): ``"low"`` factors the
        float32-rounded values, ``"fp64"`` the values as they are."""

    @abc.abstractmethod
    def _raw_solve(self, factors, b, transpose: bool, slot: Slot):
        """``x`` (in the dtype of ``b``) from one slot's factors."""

    @abc.abstractmethod
    def _raw_end(self, workspace: Workspace, after):
        """Release ``workspace`` once ``after`` is computed; an int32 token."""

    def _unfactored(self, workspace, values, slot: Slot):
        """Factors standing for a slot not factored yet (``"adaptive"``'s lazy float64 slot).

        Never used for an answer, but solved with where a ``cond`` becomes a ``select`` under
        ``vmap`` (both branches run): a backend whose zeros are not safe to solve with (a null
        handle) returns something that is. Default: zeros shaped like the slot's factors.
        """
        shape = jax.eval_shape(lambda v: self._raw_factor(workspace, v, slot), values)
        return jax.tree_util.tree_map(jnp.zeros_like, shape)

    def _chain_slot(self, factors, after):
        """Backends whose solves share a workspace (KLU keeps one in its numeric object) make the
        next solve wait for ``after``; XLA otherwise runs independent solves concurrently."""
        return factors

    # -- what the integrator calls ------------------------------------------------------------
    @staticmethod
    def slots_for(modes) -> tuple[Slot, ...]:
        """Factorizations a set of solve modes needs: ``"low"`` (float32-rounded) and/or ``"fp64"``."""
        slots = set()
        for mode in modes:
            _check_mode(mode)
            slots.add("fp64" if mode == "fp64" else "low")
            if mode == "adaptive":
                slots.add("fp64")  # kept ready for the fallback; factored only when needed
        return tuple(sorted(slots))

    def begin(self, values, modes=("fp64",)) -> Workspace:
        """Allocate what persists across steps for the solve ``modes`` (traced)."""
        return Workspace(**{slot: self._raw_begin(values, slot) for slot in self.slots_for(modes)})

    def end(self, workspace: Workspace, after):
        """Release the workspace after ``after`` is computed; returns an int32 token."""
        return self._raw_end(workspace, after)

    def factor(self, workspace: Workspace, values, modes) -> Factorization:
        """Factor ``values`` for the solve ``modes`` (one factorization per slot they need).

        The factorization is not differentiated: tangents and cotangents of the values enter
        through the solves' own rules (``diffsoup.integrate``), which reuse these factors.
        """
        modes = tuple(modes)
        eager = {"fp64" if m == "fp64" else "low" for m in modes}
        frozen = jax.lax.stop_gradient(values)
        slots = {slot: self._raw_factor(getattr(workspace, slot), frozen, slot) for slot in SLOTS if slot in eager}
        if "adaptive" in modes:
            slots["upgraded"] = jnp.zeros((), bool)
            if "fp64" not in slots:
                slots["fp64"] = self._unfactored(workspace.fp64, frozen, "fp64")
                slots["fp64_ready"] = jnp.zeros((), bool)
            else:
                slots["fp64_ready"] = jnp.ones((), bool)
        return Factorization(values, workspace, Factors(**slots))

    def solve(self, fac: Factorization, b, mode: str, *, transpose: bool = False, ir_tol: float | None = None):
        """Solve with a factorization from :meth:`factor` that covered ``mode``.

        Returns ``(x, fac, info)``; ``fac`` changes only when ``"adaptive"`` falls back to float64.
        """
        _check_mode(mode)
        tol = self.solver.ir_tol if ir_tol is None else ir_tol
        f = fac.factors
        if mode == "fp64":
            x = self._raw_solve(f.fp64, b, transpose, "fp64")
            return x, self.chain(fac, x), SolveInfo.success(ok=jnp.all(jnp.isfinite(x)))
        if mode == "fp32":
            x = self._raw_solve(f.low, b, transpose, "low")
            return x, self.chain(fac, x), SolveInfo.success(ok=jnp.all(jnp.isfinite(x)))
        if mode == "fp32_ir":
            x, steps, converged = self._refine(fac, b, transpose, tol)
            return x, self.chain(fac, x), SolveInfo.success(steps, 0, converged)
        # adaptive: once a factorization has fallen back, its float64 factors serve every solve.
        x, steps, converged = jax.lax.cond(
            f.upgraded,
            lambda: (jnp.zeros_like(b), jnp.zeros((), jnp.int32), jnp.zeros((), bool)),
            lambda: self._refine(fac, b, transpose, tol),
        )
        need64 = f.upgraded | ~converged
        frozen = jax.lax.stop_gradient(fac.values)
        # The float64 factors and the upgrade belong to the matrix: under vmap over right-hand
        # sides alone (jacfwd's tangents) they are decided once, by any of them (_any_per_matrix).
        upgraded = any_per_matrix(need64, frozen)
        refactor = any_per_matrix(need64 & ~f.fp64_ready, frozen)
        fac64 = jax.lax.cond(refactor, lambda: self._raw_factor(fac.workspace.fp64, frozen, "fp64"), lambda: f.fp64)
        x_out = jax.lax.cond(upgraded, lambda: self._raw_solve(fac64, b, transpose, "fp64"), lambda: x)
        fell_back = need64 & ~f.upgraded
        new_fac = fac._replace(factors=f._replace(fp64=fac64, upgraded=upgraded, fp64_ready=f.fp64_ready | refactor))
        info = SolveInfo.success(steps, fell_back.astype(jnp.int32), jnp.all(jnp.isfinite(x_out)))
        return x_out, self.chain(new_fac, x_out), info

    def chain(self, fac: Factorization, after) -> Factorization:
        """``fac`` with its slots' factors made data-dependent on ``after`` (see :meth:`_chain_slot`)."""
        f = fac.factors
        chained = {slot: self._chain_slot(getattr(f, slot), after) for slot in SLOTS if getattr(f, slot) is not None}
        return fac._replace(factors=f._replace(**chained))

    # -- refinement -----------------------------------------------------------------------------
    def _refine(self, fac: Factorization, b, transpose, tol):
        """Iterative refinement of the float32-factor solution against the float64 residual."""
        values, low = fac.values, fac.factors.low
        max_steps = int(self.solver.ir_max_steps)

        def residual(x):
            return b - csr_matvec(self.rows, self.cols, self.n, values, x, transpose)

        x0 = self._raw_solve(low, b, transpose, "low")

        def cond(state):
            x, dx_norm, prev_norm, k, stalled = state
            converged = dx_norm <= tol * _inf_norm(x)
            return (~converged) & (~stalled) & (k < max_steps)

        def body(state):
            x, dx_norm, prev_norm, k, stalled = state
            dx = self._raw_solve(low, residual(x), transpose, "low")
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


PreparedSolver = AbstractPreparedSolver  # the public name (ds.linear.PreparedSolver)


def _check_mode(mode):
    if mode not in SOLVE_MODES:
        raise ValueError(f"unknown solve mode {mode!r}; choose one of {SOLVE_MODES}")


def round_to_float32(values):
    """Values as a float32 factorization sees them (kept in their dtype, for float64-only backends)."""
    return values.astype(jnp.float32).astype(values.dtype)
