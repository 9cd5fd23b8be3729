"""State resets at given times (:class:`Reset`) and the chain of solves that runs them.

``ds.simulate(..., resets=...)`` solves from one reset time to the next, each piece an ordinary
solve (its own loop, its own derivative: ``ForwardMode`` and ``CheckpointAdjoint`` compose
through the chain), and applies each reset to the state the piece ended with. The pieces are one
``lax.scan`` (one copy of the loop in the program whatever the number of resets) and a last solve
after the last reset (which alone looks for a steady state when there are ``+inf`` outputs).
Reset times are operands: new times compile nothing, they may be traced, and lanes under
``vmap`` each keep their own.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from ._loop import STAT_FIELDS
from ._steady_state import steady_criterion


@dataclasses.dataclass(frozen=True)
class Reset:
    """The state jumps at ``time`` to ``apply(t, y, p)``: ``ds.simulate(..., resets=(Reset(...),))``.

    An output at the reset time reports the state after the jump (as SBML and AMICI do); a reset
    before ``t0`` is not applied; resets at equal times apply in the order given. The solve is
    differentiable through the jump (forward mode and adjoint; ``apply`` is differentiated with
    respect to ``y`` and ``p``); the reset time itself is not differentiated (``stop_gradient``,
    like the output times).

    Args:
        time: when: a number, a traced scalar (under ``jit``/``vmap``: each experiment its own
            time), or a function ``time(p) -> scalar`` of the parameters (a dict by name).
        apply: ``apply(t, y, p) -> y_new`` in JAX: ``t`` the reset time, ``y`` the state just
            before it ``(n,)``, ``p`` the parameters as a dict by name; returns the state after it
            ``(n,)``. A state it does not change is returned as it is (``y.at[i].set(v)`` changes
            one).
    """

    time: Any
    apply: Callable

    def __post_init__(self):
        if not callable(self.apply):
            raise TypeError(f"Reset.apply must be a function apply(t, y, p) -> y_new; got {type(self.apply).__name__}.")
        time = self.time
        if callable(time) or isinstance(time, jax.core.Tracer):
            return
        try:
            value = np.asarray(time, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"Reset.time={time!r} must be a number, a traced scalar or a function time(p).") from None
        if value.shape != ():
            raise ValueError(f"Reset.time has shape {value.shape}; give one time per Reset (a scalar).")
        if not np.isfinite(value):
            raise ValueError(f"Reset.time={time!r} must be finite.")


def reset_times(resets, problem, pvec, dtype, where: str):
    """The resets' times as an ``(R,)`` array (``time(p)`` evaluated; not differentiated)."""
    pdict = problem.params_dict(pvec)
    times = []
    for i, reset in enumerate(resets):
        t = reset.time(pdict) if callable(reset.time) else reset.time
        t = jnp.asarray(t)
        if t.shape != ():
            raise ValueError(f"{where}: resets[{i}].time gave shape {t.shape}; a reset time is a scalar.")
        times.append(t.astype(dtype))
    return jax.lax.stop_gradient(jnp.stack(times))


def solve_with_resets(adjoint, problem, cfg, y0, p, t0, t_eval, discs, resets, steady):
    """``(ys, status, stats)`` of the chain of solves between the ``resets`` (a non-empty sequence
    of :class:`Reset`); ``steady`` is ``(rtol, atol, horizon)`` of the steady-state test or None."""
    where = f"simulate({problem.spec.name!r})"
    applies, branches = [], []
    for i, reset in enumerate(resets):
        if not isinstance(reset, Reset):
            raise TypeError(f"{where}: resets[{i}]={reset!r} is not a ds.Reset(time, apply).")
        # One branch per distinct function (a switch picks it when the times are sorted).
        if reset.apply not in applies:
            applies.append(reset.apply)
        branches.append(applies.index(reset.apply))
    times = reset_times(resets, problem, p, y0.dtype, where)
    pdict = problem.params_dict(p)
    for i, apply in enumerate(applies):
        try:
            out = jax.eval_shape(apply, t0, y0, pdict)
        except Exception as exc:  # noqa: BLE001 (the user's function: say which one failed)
            raise ValueError(f"{where}: a reset's apply(t, y, p) failed: {type(exc).__name__}: {exc}") from exc
        if getattr(out, "shape", None) != y0.shape:
            raise ValueError(
                f"{where}: a reset's apply(t, y, p) returned shape {getattr(out, 'shape', type(out).__name__)}; "
                f"it must return the new state, shape {y0.shape}."
            )
    static = _ChainStatic(adjoint, problem, tuple(applies), tuple(branches))
    return _solve_chain(static, cfg, y0, p, t0, t_eval, discs, times, steady)


@dataclasses.dataclass(frozen=True)
class _ChainStatic:
    """What the chain's program is compiled for (the reset functions compare by identity)."""

    adjoint: Any
    problem: Any
    applies: tuple
    branches: tuple  # for each reset (in the order given), its function's index in ``applies``


@functools.partial(jax.jit, static_argnums=(0,))
def _solve_chain(static: _ChainStatic, cfg, y0, p, t0, t_eval, discs, times, steady):
    adjoint, problem = static.adjoint, static.problem
    m = t_eval.shape[0]
    # Sorted by time (stable: equal times apply in the order given); a reset before t0 is not
    # applied, one after the last output changes no output: its piece is empty (no steps).
    order = jnp.argsort(times, stable=True)
    tau = times[order]
    branch = jnp.asarray(static.branches, jnp.int32)[order]
    t_stop = t_eval[-1]  # the last output (+inf: the steady state)
    applied = (tau >= t0) & (tau <= t_stop)
    starts = jnp.clip(tau, t0, t_stop)
    pdict = problem.params_dict(p)

    def apply(b, t, y):
        if len(static.applies) == 1:
            y_new = static.applies[0](t, y, pdict)
        else:
            y_new = jax.lax.switch(b, [lambda t, y, fn=fn: fn(t, y, pdict) for fn in static.applies], t, y)
        return jnp.asarray(y_new).astype(y.dtype)

    def with_budget(used, **changes):
        # max_steps bounds the whole chain: each piece gets what the earlier ones left.
        return dataclasses.replace(cfg, max_steps=jnp.maximum(cfg.max_steps - used, 1).astype(jnp.int32), **changes)

    def piece(carry, x):
        y, status, stats, used = carry
        start, end, b, on = x
        te = jnp.concatenate([jnp.clip(t_eval, start, end), end[None]])  # outputs, then the piece's end
        ys, st, sts = adjoint.solve(problem, with_budget(used), y, p, start, te, discs)
        y_end = ys[-1]
        y_next = jnp.where(on, apply(b, end, y_end), y_end)
        return _combine((y_next, status, stats, used), st, sts), ys[:m]

    zero = jnp.zeros((), jnp.int32)
    stats0 = {k: zero for k in STAT_FIELDS}
    firsts = jnp.concatenate([t0[None], starts[:-1]])
    carry, ys_pieces = jax.lax.scan(piece, (y0, zero, stats0, zero), (firsts, starts, branch, applied))
    y_last, status, stats, used = carry
    start = starts[-1]
    te = jnp.maximum(t_eval, start)
    last_cfg = with_budget(used, steady=None if steady is None else steady_criterion(*steady, start, te))
    ys_last, st, sts = adjoint.solve(problem, last_cfg, y_last, p, start, te, discs)
    _, status, stats, _ = _combine(carry, st, sts)
    # Output i comes from the piece that starts last at or before it (after the resets there).
    pieces = jnp.concatenate([ys_pieces, ys_last[None]], axis=0)
    which = jnp.sum((starts[None, :] <= t_eval[:, None]).astype(jnp.int32), axis=1)
    ys = pieces[which, jnp.arange(m)]
    return ys, status, stats


def _combine(carry, status_piece, stats_piece):
    """The chain's carry after a piece: the first failure's status, summed counters."""
    y, status, stats, used = carry
    status = jnp.where(status == 0, status_piece, status).astype(jnp.int32)
    stats = {k: stats[k] + stats_piece[k] for k in stats}
    used = used + stats_piece["n_steps"] + stats_piece["n_rejected"]
    return y, status, stats, used
