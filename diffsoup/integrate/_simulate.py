"""``ds.simulate``: solve a built problem at requested times, differentiably."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..model import Problem
from ._adjoint import AbstractAdjoint
from ._auto_method import AutoMethod
from ._checkpoint import CheckpointAdjoint
from ._lane_compaction import compaction_in_force
from ._linear_solve import SolveModes
from ._loop import ConstantStep, LoopConfig, PIController
from ._method import AbstractIntegrator
from ._rodas5p import Rodas5P
from ._reset import Reset, solve_with_resets
from ._solution import Solution
from ._status import SolveError
from ._steady_state import SteadyState, steady_criterion
from ._tolerance import checked_rtol, rtol_floor


def _atol_vector(atol, n, dtype, name):
    """``atol`` as an ``(n,)`` array of ``dtype`` (a scalar broadcast: the same numbers, and one
    program for scalar and per-state tolerances); checked when concrete."""
    if _is_concrete(atol):
        arr = np.asarray(atol, dtype=np.float64)
        if arr.ndim == 0:
            if not (arr > 0 and np.isfinite(arr)):
                raise ValueError(f"simulate({name!r}): atol={atol!r} must be positive and finite.")
        elif arr.shape != (n,):
            raise ValueError(f"simulate({name!r}): atol has shape {arr.shape}; give a scalar or ({n},).")
        elif not (np.all(arr > 0) and np.all(np.isfinite(arr))):
            raise ValueError(f"simulate({name!r}): every entry of atol must be positive and finite.")
        return np.broadcast_to(np.asarray(atol, dtype), (n,))
    atol = jnp.asarray(atol, dtype)
    if atol.ndim == 1 and atol.shape != (n,) or atol.ndim > 1:
        raise ValueError(f"simulate({name!r}): atol has shape {atol.shape}; give a scalar or ({n},).")
    return jnp.broadcast_to(atol, (n,))


def _operand(x, dtype):
    """``x`` as a scalar operand of ``dtype``: numpy when concrete (no device work here), else traced."""
    return np.asarray(x, dtype) if _is_concrete(x) else jnp.asarray(x).astype(dtype)


def _is_concrete(x) -> bool:
    try:
        np.asarray(x)
        return True
    except Exception:  # noqa: BLE001 (a tracer)
        return False


def _steady_numbers(steady_state: SteadyState, cfg: LoopConfig, n, dtype, name):
    """``(rtol, atol (n,), horizon)`` of the steady-state test (the solve's tolerances where None)."""
    rtol = cfg.rtol if steady_state.rtol is None else _operand(steady_state.rtol, dtype)
    atol = cfg.atol if steady_state.atol is None else _atol_vector(steady_state.atol, n, dtype, name)
    return rtol, atol, _operand(steady_state.horizon, dtype)


def simulate(
    problem: Problem,
    y0: Any = None,
    t_eval: Any = None,
    params: Any = None,
    *,
    t0: float = 0.0,
    rtol: float = 1e-6,
    atol: float | Sequence[float] = 1e-9,
    method: AbstractIntegrator | AutoMethod = Rodas5P(),
    controller: PIController | ConstantStep = PIController(),
    max_steps: int = 100_000,
    h0: float | None = None,
    discontinuities: Any = (),
    resets: Sequence[Reset] = (),
    steady_state: SteadyState | None = None,
    adjoint: AbstractAdjoint = CheckpointAdjoint(),
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
        t_eval: output times ``(m,)``, non-decreasing, at or after ``t0``; every one is a step
            endpoint. Entries ``+inf`` (at the end) are the steady state: past the last finite
            output the solve goes on until the state is steady (``steady_state``) and reports it
            there.
        params: parameters: a dict by name (missing names take defaults), a vector in
            ``problem.parameter_names`` order, or None for the defaults.
        t0: initial time.
        rtol, atol: relative and absolute tolerances (``atol`` a scalar or per state). They, ``h0``,
            ``max_steps`` and the controller's numbers are operands of the compiled solve, not
            part of it: new values compile nothing, and they may be traced (``jax.jit`` over
            ``rtol``). An ``rtol`` below ``100 * eps`` of the compute dtype is raised to that
            with a :class:`~diffsoup.integrate.ToleranceWarning`.
        method: the integrator: ``ds.Rodas5P()``, ``ds.BDF()`` (large sparse systems, tight
            tolerances), another :class:`~diffsoup.integrate.AbstractIntegrator`
            (``ds.integrate.ImplicitEuler()``), or ``ds.AutoMethod()`` (chosen from the problem).
        controller: ``PIController()`` (adaptive) or ``ConstantStep(h)``.
        max_steps: most step attempts (accepted and rejected).
        h0: first step size (None: chosen from the problem).
        discontinuities: times where ``rhs`` jumps; steps land on them and do not cross them. A
            sequence or an array (it may be traced: its length is part of the program, its
            values are not); ``+inf`` entries stand for none (to pad lanes to one length).
        resets: :class:`~diffsoup.integrate.Reset` s (or one): at each one's time the state jumps to its
            ``apply(t, y, p)``; an output at a reset time reports the state after the jump. The
            solve is a chain of solves between reset times, differentiable through the jumps
            (both ``adjoint=`` kinds); reset times are operands (new times compile nothing; they
            may be traced) and are not differentiated. ``max_steps`` bounds the whole chain.
        steady_state: a :class:`~diffsoup.integrate.SteadyState`: when the state is steady and
            how long to look for it. None takes ``SteadyState()`` when ``t_eval`` has ``+inf``
            entries; under ``jit``/``vmap`` with traced ``t_eval``, give it to allow them (the
            program then contains the steady-state test; without ``+inf`` outputs a solve is
            what it would be without it). Failing to find it within its ``horizon`` (or within
            ``max_steps``) is ``Status.STEADY_STATE_NOT_REACHED``.
        adjoint: ``CheckpointAdjoint(checkpoints=...)`` or ``ForwardMode()`` (an
            :class:`~diffsoup.integrate.AbstractAdjoint`).
        throw: when the result is concrete (not under jit/vmap), raise :class:`SolveError` on a
            failed solve; under transformations the status is returned instead.

    Returns:
        A :class:`Solution` (after a failure, the outputs the solve did not reach are NaN).

    Raises:
        TypeError: for a ``problem``, ``method``, ``adjoint``, ``controller``, ``resets`` or
            ``steady_state`` of the wrong kind.
        ValueError: for a wrong ``y0`` shape, non-finite ``y0``, unknown parameter names,
            non-positive tolerances, a non-positive ``h0`` or ``max_steps``, bad output times,
            NaN discontinuities, or a reset whose ``apply`` returns a wrong shape.
        SolveError: for a failed solve, when ``throw`` and the result is concrete.
    """
    if not isinstance(problem, Problem):
        raise TypeError(f"simulate: problem must be a built ds.Problem (spec.build()), not {type(problem).__name__}.")
    if isinstance(method, AutoMethod):
        method = method.choose(problem)
    if not isinstance(method, AbstractIntegrator):
        raise TypeError(
            f"simulate: method={method!r} is not a diffsoup integrator (an AbstractIntegrator) or ds.AutoMethod(); "
            "use ds.Rodas5P() or ds.BDF()."
        )
    if not isinstance(adjoint, AbstractAdjoint):
        raise TypeError(f"simulate: adjoint={adjoint!r} must be ds.CheckpointAdjoint() or ds.ForwardMode().")
    if not isinstance(controller, (PIController, ConstantStep)):
        raise TypeError(f"simulate: controller={controller!r} must be ds.PIController() or ds.ConstantStep(h).")
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
    has_inf = False
    if _is_concrete(t_eval) and _is_concrete(t0):
        te = np.asarray(t_eval)
        if np.any(np.isnan(te)) or np.any(te[1:] < te[:-1]) or te[0] < float(t0) or not np.isfinite(float(t0)):
            raise ValueError(
                f"simulate({name!r}): t_eval must be non-decreasing and not before t0={float(t0)} (and finite, "
                "but for +inf entries at its end: the steady state)."
            )
        has_inf = bool(np.isposinf(te[-1]))
    if steady_state is not None and not isinstance(steady_state, SteadyState):
        raise TypeError(f"simulate({name!r}): steady_state={steady_state!r} must be a ds.integrate.SteadyState or None.")
    if steady_state is None and has_inf:
        steady_state = SteadyState()
    pvec = problem.parameter_vector(params)
    # The numbers below are operands of the compiled solve: new values compile nothing.
    if _is_concrete(rtol):
        rtol = float(rtol)
        if not (rtol > 0 and np.isfinite(rtol)):
            raise ValueError(f"simulate({name!r}): rtol={rtol!r} must be positive and finite.")
        rtol = checked_rtol(rtol, dtype, f"simulate({name!r})")
    else:
        rtol = jnp.maximum(rtol, rtol_floor(dtype))
    atol = _atol_vector(atol, n, dtype, name)
    if _is_concrete(max_steps):
        if isinstance(max_steps, bool) or not float(max_steps).is_integer() or not 1 <= int(max_steps) < 2**31:
            raise ValueError(f"simulate({name!r}): max_steps={max_steps!r} must be a positive integer (below 2**31).")
    if h0 is not None and _is_concrete(h0) and not (float(h0) > 0 and np.isfinite(float(h0))):
        raise ValueError(f"simulate({name!r}): h0={h0!r} must be a positive finite step size (or None).")
    if _is_concrete(discontinuities):
        discs = np.sort(np.asarray(discontinuities, dtype=np.float64).reshape(-1))
        if np.any(np.isnan(discs)):
            raise ValueError(f"simulate({name!r}): discontinuities must be times (finite, or +inf for none), not NaN.")
        discs_j = jnp.asarray(discs, dtype)
    else:
        discs_j = jnp.asarray(discontinuities).astype(dtype).reshape(-1)
        discs_j = jnp.sort(jnp.where(jnp.isnan(discs_j), jnp.inf, discs_j))
    prec = problem.precision
    modes = SolveModes(
        primal=prec.effective_solve_mode,
        tangent=prec.effective_forward_sensitivity_solve_mode,
        reverse=prec.effective_reverse_sensitivity_solve_mode,
        reverse_ir_tol=prec.adjoint_ir_tol,
    )
    cfg = LoopConfig(
        rtol=_operand(rtol, dtype), atol=atol, h0=_operand(np.nan if h0 is None else h0, dtype),
        max_steps=_operand(max_steps, np.int32), control=controller.control(dtype), method=method, modes=modes,
        fixed_step=isinstance(controller, ConstantStep), lanes=compaction_in_force(),
    )  # fmt: skip
    t0, t_eval, discs_j = jax.lax.stop_gradient((t0, t_eval, discs_j))
    steady = None
    if steady_state is not None:
        steady = _steady_numbers(steady_state, cfg, n, dtype, name)
    if isinstance(resets, Reset):
        resets = (resets,)
    if resets:
        ys, status, stats = solve_with_resets(adjoint, problem, cfg, y0, pvec, t0, t_eval, discs_j, resets, steady)
    else:
        if steady is not None:
            cfg = dataclasses.replace(cfg, steady=steady_criterion(*steady, t0, t_eval))
        ys, status, stats = adjoint.solve(problem, cfg, y0, pvec, t0, t_eval, discs_j)
    sol = Solution(t_eval, ys, status, stats)
    if throw and _is_concrete(status) and not sol.ok:
        raise SolveError(status, f" for {name!r}")
    return sol
