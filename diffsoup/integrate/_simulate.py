"""``ds.simulate``: solve a built problem at requested times, differentiably."""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..model import Problem
from ._adjoint import AbstractAdjoint
from ._checkpoint import CheckpointAdjoint
from ._linear_solve import SolveModes
from ._loop import ConstantStep, LoopConfig, PIController
from ._method import AbstractIntegrator
from ._rodas5p import Rodas5P
from ._solution import Solution
from ._status import SolveError
from ._tolerance import checked_rtol


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
    method: AbstractIntegrator = Rodas5P(),
    controller: PIController | ConstantStep = PIController(),
    max_steps: int = 100_000,
    h0: float | None = None,
    discontinuities: Sequence[float] = (),
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
        t_eval: output times ``(m,)``, non-decreasing, at or after ``t0``; every one is a step endpoint.
        params: parameters: a dict by name (missing names take defaults), a vector in
            ``problem.parameter_names`` order, or None for the defaults.
        t0: initial time.
        rtol, atol: relative and absolute tolerances (``atol`` a scalar or per state).
        method: the integrator: ``ds.Rodas5P()``, or another
            :class:`~diffsoup.integrate.AbstractIntegrator` (``ds.integrate.ImplicitEuler()``).
        controller: ``PIController()`` (adaptive) or ``ConstantStep(h)``.
        max_steps: most step attempts (accepted and rejected).
        h0: first step size (None: chosen from the problem).
        discontinuities: times where ``rhs`` jumps; steps land on them and do not cross them.
        adjoint: ``CheckpointAdjoint(checkpoints=...)`` or ``ForwardMode()`` (an
            :class:`~diffsoup.integrate.AbstractAdjoint`).
        throw: when the result is concrete (not under jit/vmap), raise :class:`SolveError` on a
            failed solve; under transformations the status is returned instead.

    Returns:
        A :class:`Solution`.

    Raises:
        TypeError: for a ``problem``, ``method``, ``adjoint`` or ``controller`` of the wrong kind.
        ValueError: for a wrong ``y0`` shape, non-finite ``y0``, unknown parameter names,
            non-positive tolerances, or bad output times.
        SolveError: for a failed solve, when ``throw`` and the result is concrete.
    """
    if not isinstance(problem, Problem):
        raise TypeError(f"simulate: problem must be a built ds.Problem (spec.build()), not {type(problem).__name__}.")
    if not isinstance(method, AbstractIntegrator):
        raise TypeError(
            f"simulate: method={method!r} is not a diffsoup integrator (an AbstractIntegrator); use ds.Rodas5P()."
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
    if _is_concrete(t_eval) and _is_concrete(t0):
        te = np.asarray(t_eval)
        if not np.all(np.isfinite(te)) or np.any(np.diff(te) < 0) or te[0] < float(t0):
            raise ValueError(
                f"simulate({name!r}): t_eval must be finite, non-decreasing and not before t0={float(t0)}."
            )
    pvec = problem.parameter_vector(params)
    if float(rtol) <= 0 or not np.isfinite(rtol):
        raise ValueError(f"simulate({name!r}): rtol={rtol!r} must be positive and finite.")
    rtol = checked_rtol(float(rtol), dtype, f"simulate({name!r})")
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
    cfg = LoopConfig(
        float(rtol), atol_s, int(max_steps), controller, None if h0 is None else float(h0), modes, method
    )
    discs_j = jnp.asarray(discs, dtype)
    t0, t_eval = jax.lax.stop_gradient((t0, t_eval))
    ys, status, stats = adjoint.solve(problem, cfg, y0, pvec, t0, t_eval, discs_j)
    sol = Solution(t_eval, ys, status, stats)
    if throw and _is_concrete(status) and not sol.ok:
        raise SolveError(status, f" for {name!r}")
    return sol
