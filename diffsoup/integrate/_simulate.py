"""``ds.simulate``: solve a built problem at requested times, differentiably."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..model import Problem
from ._loop import ConstantStep, LoopConfig, PIController, init_carry, run_loop
from ._status import SolveError, Status
from ._step import SolveModes

STAT_FIELDS = ("n_steps", "n_rejected", "n_jac", "n_factor", "n_solves", "n_ir_steps", "n_fallbacks", "n_rhs")


@dataclasses.dataclass(frozen=True)
class Rodas5P:
    """The default integrator: Rodas5P, a stiffly accurate Rosenbrock method of order 5(4)."""


@dataclasses.dataclass(frozen=True)
class ForwardMode:
    """Differentiate by forward mode only (``jax.jvp``/``jax.jacfwd``, Gauss-Newton Jacobians).

    The loop is a plain ``lax.while_loop``: tangents ride along each step and reuse its
    factorization. Reverse mode (``jax.grad``) is not available with it.
    """


@dataclasses.dataclass(frozen=True)
class CheckpointAdjoint:
    """Differentiate by a checkpointed discrete adjoint (``jax.grad``/``jax.vjp``), the default.

    The forward pass keeps at most ``checkpoints`` step records (thinned online as the step count
    grows); the reverse sweep replays each segment between records into a second buffer of the
    same size and runs the adjoint of each step with transposed solves on that step's factors.
    Memory is ``2 * checkpoints`` states, whatever ``max_steps``; beyond ``checkpoints**2 / 2``
    accepted steps, segments are replayed step by step (slower, same result).
    Forward mode (``jax.jvp``) of a function using it is not available; ``jax.jvp`` of its
    gradient is (Hessian-vector products).

    Args:
        checkpoints: records per level (at least 1).
    """

    checkpoints: int = 128

    def __post_init__(self):
        if isinstance(self.checkpoints, bool) or int(self.checkpoints) < 1:
            raise ValueError(f"CheckpointAdjoint.checkpoints={self.checkpoints!r} must be a positive integer.")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Solution:
    """States at the requested times and what it took to get them.

    Attributes:
        ts: the output times, ``(m,)``.
        ys: the states at those times, ``(m, n)`` (NaN after a failure point is not guaranteed:
            check ``status``).
        status: a :class:`Status` code (int32; one per experiment under vmap).
        stats: counters (int32): ``n_steps`` (accepted), ``n_rejected``, ``n_jac`` (Jacobian
            evaluations), ``n_factor`` (factorizations), ``n_solves``, ``n_ir_steps`` (refinement
            steps), ``n_fallbacks`` (adaptive float64 fallbacks), ``n_rhs`` (right-hand-side
            evaluations, Jacobian colors included).
    """

    ts: Any
    ys: Any
    status: Any
    stats: dict

    @property
    def ok(self) -> bool:
        """True when every solve succeeded (host-side)."""
        return bool(np.all(np.asarray(self.status) == Status.SUCCESS))

    def raise_if_failed(self) -> "Solution":
        """Raise :class:`SolveError` naming the failure(s); return ``self`` otherwise."""
        if not self.ok:
            raise SolveError(self.status)
        return self


def _float_tuple(x, n, name, problem):
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 0:
        if not (arr > 0 and np.isfinite(arr)):
            raise ValueError(f"simulate({problem!r}): {name}={x!r} must be positive and finite.")
        return float(arr)
    if arr.shape != (n,):
        raise ValueError(f"simulate({problem!r}): {name} has shape {arr.shape}; give a scalar or ({n},).")
    if not (np.all(arr > 0) and np.all(np.isfinite(arr))):
        raise ValueError(f"simulate({problem!r}): every entry of {name} must be positive and finite.")
    return tuple(float(a) for a in arr)


def _is_concrete(x) -> bool:
    try:
        np.asarray(x)
        return True
    except Exception:  # noqa: BLE001 (a tracer)
        return False


def simulate(
    problem: Problem,
    y0: Any = None,
    t_eval: Any = None,
    params: Any = None,
    *,
    t0: float = 0.0,
    rtol: float = 1e-6,
    atol: float | Sequence[float] = 1e-9,
    method: Rodas5P = Rodas5P(),
    controller: PIController | ConstantStep = PIController(),
    max_steps: int = 100_000,
    h0: float | None = None,
    discontinuities: Sequence[float] = (),
    adjoint: CheckpointAdjoint | ForwardMode = CheckpointAdjoint(),
    throw: bool = True,
) -> Solution:
    """Solve ``dy/dt = rhs(t, y, p)`` from ``t0`` and return the states at ``t_eval``.

    Differentiable with respect to ``y0`` and ``params``: ``jax.grad``/``jax.vjp`` run the
    checkpointed adjoint (``adjoint=CheckpointAdjoint()``, the default), ``jax.jvp``/``jax.jacfwd``
    need ``adjoint=ForwardMode()``. Both are exact derivatives of the discrete solution (the
    accepted steps held fixed) and reuse the forward solve's factorizations. It can be jitted and
    vmapped (each experiment keeps its own steps).

    Args:
        problem: a built problem (``spec.build()``).
        y0: initial state ``(n,)``; None takes the spec's ``y0``.
        t_eval: output times ``(m,)``, non-decreasing, at or after ``t0``; every one is a step endpoint.
        params: parameters: a dict by name (missing names take defaults), a vector in
            ``problem.parameter_names`` order, or None for the defaults.
        t0: initial time.
        rtol, atol: relative and absolute tolerances (``atol`` a scalar or per state).
        method: the integrator (``Rodas5P()``).
        controller: ``PIController()`` (adaptive) or ``ConstantStep(h)``.
        max_steps: most step attempts (accepted and rejected).
        h0: first step size (None: chosen from the problem).
        discontinuities: times where ``rhs`` jumps; steps land on them and do not cross them.
        adjoint: ``CheckpointAdjoint(checkpoints=...)`` or ``ForwardMode()``.
        throw: when the result is concrete (not under jit/vmap), raise :class:`SolveError` on a
            failed solve; under transformations the status is returned instead.

    Returns:
        A :class:`Solution`.

    Raises:
        ValueError: for a wrong ``y0`` shape, non-finite ``y0``, unknown parameter names,
            non-positive tolerances, or bad output times.
        SolveError: for a failed solve, when ``throw`` and the result is concrete.
    """
    if not isinstance(problem, Problem):
        raise TypeError(f"simulate: problem must be a built ds.Problem (spec.build()), not {type(problem).__name__}.")
    if not isinstance(method, Rodas5P):
        raise TypeError(f"simulate: method={method!r} is not a diffsoup integrator (use ds.Rodas5P()).")
    name = problem.spec.name
    n, dtype = problem.n_states, problem.dtype
    problem.precision.check_x64()
    if y0 is None:
        if problem.spec.y0 is None:
            raise ValueError(f"simulate({name!r}): no y0 given and the spec has none.")
        y0 = problem.spec.y0
    y0 = jnp.asarray(y0, dtype)
    if y0.shape != (n,):
        raise ValueError(f"simulate({name!r}): y0 has shape {y0.shape}; expected ({n},) (one value per state).")
    if _is_concrete(y0) and not np.all(np.isfinite(np.asarray(y0))):
        bad = [problem.state_names[i] for i in np.nonzero(~np.isfinite(np.asarray(y0)))[0][:5]]
        raise ValueError(f"simulate({name!r}): y0 is not finite for state(s) {bad}.")
    if t_eval is None:
        raise ValueError(f"simulate({name!r}): give t_eval, the output times.")
    t_eval = jnp.atleast_1d(jnp.asarray(t_eval, dtype))
    if t_eval.ndim != 1 or t_eval.shape[0] == 0:
        raise ValueError(f"simulate({name!r}): t_eval must be a non-empty 1-D array of times.")
    t0 = jnp.asarray(t0, dtype)
    if _is_concrete(t_eval) and _is_concrete(t0):
        te = np.asarray(t_eval)
        if not np.all(np.isfinite(te)) or np.any(np.diff(te) < 0) or te[0] < float(t0):
            raise ValueError(
                f"simulate({name!r}): t_eval must be finite, non-decreasing and not before t0={float(t0)}."
            )
    pvec = problem.parameter_vector(params)
    if float(rtol) <= 0 or not np.isfinite(rtol):
        raise ValueError(f"simulate({name!r}): rtol={rtol!r} must be positive and finite.")
    atol_s = _float_tuple(atol, n, "atol", name)
    if isinstance(max_steps, bool) or int(max_steps) < 1:
        raise ValueError(f"simulate({name!r}): max_steps={max_steps!r} must be a positive integer.")
    discs = np.sort(np.asarray(discontinuities, dtype=np.float64).reshape(-1))
    if not np.all(np.isfinite(discs)):
        raise ValueError(f"simulate({name!r}): discontinuities must be finite times.")
    prec = problem.precision
    modes = SolveModes(
        primal=prec.effective_solve_mode,
        tangent=prec.effective_forward_sensitivity_solve_mode,
        reverse=prec.effective_reverse_sensitivity_solve_mode,
        reverse_ir_tol=prec.adjoint_ir_tol,
    )
    cfg = LoopConfig(float(rtol), atol_s, int(max_steps), controller, None if h0 is None else float(h0), modes)
    discs_j = jnp.asarray(discs, dtype)
    t0, t_eval = jax.lax.stop_gradient((t0, t_eval))
    if isinstance(adjoint, ForwardMode):
        ys, status, stats = _solve_forward(problem, cfg, y0, pvec, t0, t_eval, discs_j)
    elif isinstance(adjoint, CheckpointAdjoint):
        from ._adjoint import solve_with_adjoint

        ys, status, stats = solve_with_adjoint(problem, cfg, int(adjoint.checkpoints), y0, pvec, t0, t_eval, discs_j)
    else:
        raise TypeError(f"simulate: adjoint={adjoint!r} must be ds.CheckpointAdjoint() or ds.ForwardMode().")
    sol = Solution(t_eval, ys, status, stats)
    if throw and _is_concrete(status) and not sol.ok:
        raise SolveError(status, f" for {name!r}")
    return sol


def batched_zeros(like, y0, p, t0, t_eval):
    """Zeros shaped like ``like`` that are batched whenever any input is (under vmap), so that
    per-experiment solver state (KLU handles) is allocated per experiment."""
    anchor = jax.lax.stop_gradient(y0[0] + jnp.sum(p) + t0 + t_eval[0])
    return jnp.zeros(like.shape, like.dtype) + 0.0 * jnp.nan_to_num(anchor).astype(like.dtype)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _solve_forward(problem, cfg, y0, p, t0, t_eval, discs):
    """The forward pass: begin (allocate factors), loop, end (release after the outputs)."""
    prepared = problem.prepared
    jac0 = jax.eval_shape(problem.jacobian_values, t0, y0, p)
    workspace = prepared.begin(batched_zeros(jac0, y0, p, t0, t_eval), cfg.modes.all)
    carry = init_carry(problem, prepared, cfg, y0, p, t0, t_eval, discs, workspace)
    carry = run_loop(problem, prepared, cfg, p, t_eval, discs, carry)
    token = prepared.end(workspace, carry["ys"])
    status = carry["status"] + 0 * token
    stats = {k: carry[k] for k in STAT_FIELDS}
    return carry["ys"], status, stats
