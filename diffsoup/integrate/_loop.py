"""The integration loop: step attempts, error control, outputs at requested times.

Every output time and every discontinuity is a step endpoint: a step that would pass one is
shortened to land on it exactly. Outputs are therefore exact step endpoints (no interpolation),
and across a discontinuity the step that ends there evaluates the right-hand side just below it.

One loop iteration is one *attempt*: Jacobian (reused after a rejection, since the point did not
move), one factorization of ``W``, eight stages, error estimate, accept or reject, new step size.
The same :func:`attempt` function drives the forward pass and the adjoint's replays, so a replay
from a checkpoint retraces the same accepted steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _rodas5p as tab
from ._status import RUNNING, Status
from ._step import SolveModes, error_norm, jacobian_and_time_derivative, rodas_stages, w_values


@dataclasses.dataclass(frozen=True)
class PIController:
    """Proportional-integral step-size control (Gustafsson; Hairer and Wanner's form).

    ``h_new = h * clip(safety * err^-beta1 * err_prev^beta2, factor_min, factor_max)`` with the
    weighted RMS error ``err`` of the embedded estimate; after a rejection the step does not grow.
    """

    safety: float = 0.9
    beta1: float = 0.7 / 5
    beta2: float = 0.4 / 5
    factor_min: float = 0.2
    factor_max: float = 10.0


@dataclasses.dataclass(frozen=True)
class ConstantStep:
    """Fixed steps of size ``h`` (shortened only to land on output times and discontinuities);
    no error control, for convergence-order tests and reproducible step sequences."""

    h: float

    def __post_init__(self):
        if not (float(self.h) > 0.0 and np.isfinite(self.h)):
            raise ValueError(f"ConstantStep.h={self.h!r} must be a positive finite step size.")


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """Static settings of one integration (hashable: part of the compiled program)."""

    rtol: float
    atol: Any  # float, or a tuple of per-state floats
    max_steps: int
    controller: Any
    h0: float | None
    modes: SolveModes


# Fields of the carry that describe the state on arrival at an accepted step: enough to replay.
ARRIVAL_FIELDS = ("t", "y", "h", "err_prev", "i_out", "i_disc", "n_steps")


def _atol(cfg, dtype):
    return jnp.asarray(np.asarray(cfg.atol, dtype=np.float64), dtype)


def initial_step(problem, cfg, t0, y0, p, f0, t_end):
    """Hairer and Wanner's starting step (II.4): from the sizes of ``f`` and its variation."""
    if isinstance(cfg.controller, ConstantStep):
        return jnp.asarray(cfg.controller.h, y0.dtype)
    if cfg.h0 is not None:
        return jnp.asarray(cfg.h0, y0.dtype)
    y0, f0, p = jax.lax.stop_gradient((y0, f0, p))
    scale = _atol(cfg, y0.dtype) + cfg.rtol * jnp.abs(y0)
    d0 = jnp.sqrt(jnp.mean(jnp.square(y0 / scale)))
    d1 = jnp.sqrt(jnp.mean(jnp.square(f0 / scale)))
    h_a = jnp.where((d0 < 1e-5) | (d1 < 1e-5), 1e-6, 0.01 * d0 / d1)
    span = jnp.abs(t_end - t0)
    h_a = jnp.minimum(h_a, span)
    f1 = problem.rhs(t0 + h_a, y0 + h_a * f0, p)
    d2 = jnp.sqrt(jnp.mean(jnp.square((f1 - f0) / scale))) / h_a
    big = jnp.maximum(d1, d2)
    h_b = jnp.where(big <= 1e-15, jnp.maximum(1e-6, h_a * 1e-3), (0.01 / big) ** (1.0 / tab.ORDER))
    h = jnp.minimum(100.0 * h_a, h_b)
    h = jnp.where(jnp.isfinite(h) & (h > 0), h, 1e-6 * jnp.maximum(span, 1.0))
    return jnp.minimum(h, span).astype(y0.dtype)


def init_carry(problem, prepared, cfg: LoopConfig, y0, p, t0, t_eval, discs, workspace):
    dtype = y0.dtype
    n, m = y0.shape[0], t_eval.shape[0]
    done = t_eval <= t0
    ys = jnp.where(done[:, None], y0[None, :], jnp.zeros((m, n), dtype))
    i_out = jnp.sum(done).astype(jnp.int32)
    f0 = problem.rhs(t0, y0, p)
    h = initial_step(problem, cfg, t0, y0, p, f0, t_eval[-1])
    finite = jnp.all(jnp.isfinite(y0)) & jnp.all(jnp.isfinite(p))
    status = jnp.where(i_out >= m, Status.SUCCESS, RUNNING)
    status = jnp.where(finite, status, Status.NONFINITE_STATE).astype(jnp.int32)
    zero = jnp.zeros((), jnp.int32)
    jac_shape = jax.eval_shape(problem.jacobian_values, t0, y0, p)
    return {
        "t": t0, "y": y0, "h": h, "err_prev": jnp.ones((), dtype), "rejected_last": jnp.zeros((), bool),
        "i_out": i_out, "i_disc": jnp.sum(discs <= t0).astype(jnp.int32), "ys": ys, "status": status,
        "jac": jnp.zeros(jac_shape.shape, jac_shape.dtype), "dT": jnp.zeros_like(y0), "f0": f0,
        "jac_fresh": jnp.zeros((), bool),
        "n_steps": zero, "n_rejected": zero, "n_attempts": zero, "n_jac": zero, "n_factor": zero,
        "n_solves": zero, "n_ir_steps": zero, "n_fallbacks": zero, "n_rhs": jnp.asarray(2, jnp.int32),
        "workspace": workspace,
        # the accepted step just taken: its start, step size and stage-time cap (for the adjoint)
        "last_t": t0, "last_y": y0, "last_h": h, "last_cap": jnp.asarray(jnp.inf, dtype),
    }  # fmt: skip


def attempt(problem, prepared, cfg: LoopConfig, p, t_eval, discs, c):
    """One step attempt; returns the new carry."""
    dtype = c["y"].dtype
    m, d = t_eval.shape[0], discs.shape[0]
    t, y, h = c["t"], c["y"], c["h"]
    fixed = isinstance(cfg.controller, ConstantStep)

    t_out = t_eval[jnp.minimum(c["i_out"], m - 1)]
    if d:
        has_disc = c["i_disc"] < d
        t_disc = jnp.where(has_disc, discs[jnp.minimum(c["i_disc"], d - 1)], jnp.inf)
    else:
        t_disc = jnp.asarray(jnp.inf, dtype)
    t_target = jnp.minimum(t_out, t_disc)
    remaining = t_target - t
    # Land when within round-off of the target (no sliver of a step left behind).
    lands = h >= remaining - 64 * jnp.finfo(dtype).eps * jnp.abs(t_target)
    h_try = jnp.where(lands, remaining, h)
    t_new = jnp.where(lands, t_target, t + h_try)
    lands_disc = lands & (t_disc <= t_out)
    t_cap = jnp.where(lands_disc, jnp.nextafter(t_target, t), jnp.inf).astype(dtype)

    jac, dT, f0 = jax.lax.cond(
        c["jac_fresh"],
        lambda: (c["jac"], c["dT"], c["f0"]),
        lambda: jacobian_and_time_derivative(problem, t, y, p),
    )
    diag = jnp.asarray(problem.pattern.diagonal)
    fac = prepared.factor(c["workspace"], w_values(jac, diag, h_try), cfg.modes.all)
    y_new, err_vec, fac, info = rodas_stages(problem, prepared, cfg.modes, t, y, h_try, p, jac, dT, f0, fac, t_cap)

    err = jax.lax.stop_gradient(error_norm(err_vec, y, y_new, cfg.rtol, _atol(cfg, dtype)))
    finite = jnp.all(jnp.isfinite(y_new)) & jnp.isfinite(err)
    healthy = finite & info.ok
    accept = healthy if fixed else healthy & (err <= 1.0)

    if fixed:
        h_next = jnp.asarray(cfg.controller.h, dtype)
        h_next = jnp.where(accept, h_next, 0.0)
    else:
        ctl = cfg.controller
        err_safe = jnp.maximum(err, 1e-10)
        grow = ctl.safety * err_safe ** (-ctl.beta1) * c["err_prev"] ** ctl.beta2
        fmax = jnp.where(c["rejected_last"], jnp.ones((), dtype), jnp.asarray(ctl.factor_max, dtype))
        h_acc = h_try * jnp.clip(grow, ctl.factor_min, fmax)
        h_acc = jnp.where(lands, jnp.maximum(h_acc, h), h_acc)  # landing shortened the step: don't shrink for it
        shrink = jnp.where(healthy, jnp.clip(ctl.safety * err_safe ** (-1.0 / tab.ERROR_ORDER), ctl.factor_min, 0.9), 0.25)
        h_next = jnp.where(accept, h_acc, h_try * shrink)
    h_next = jax.lax.stop_gradient(h_next).astype(dtype)

    # Outputs at t_new (all output times equal to it), discontinuities passed.
    idx = jnp.arange(m)
    write = accept & (t_eval == t_new) & (idx >= c["i_out"])
    ys = jnp.where(write[:, None], y_new[None, :], c["ys"])
    i_out = c["i_out"] + jnp.sum(write).astype(jnp.int32)
    i_disc = c["i_disc"] + (accept & lands_disc).astype(jnp.int32)

    n_attempts = c["n_attempts"] + 1
    tiny = 16 * jnp.finfo(dtype).eps * jnp.maximum(jnp.abs(t), jnp.abs(t_new))
    status = jnp.where(i_out >= m, Status.SUCCESS, RUNNING)
    status = jnp.where((status == RUNNING) & (n_attempts >= cfg.max_steps), Status.MAX_STEPS, status)
    stuck = (status == RUNNING) & ~accept & ((h_next <= tiny) | fixed)
    cause = jnp.where(~finite, Status.NONFINITE_STATE, jnp.where(~info.ok, Status.LINEAR_SOLVE_FAILED, Status.STEP_TOO_SMALL))
    status = jnp.where(stuck, cause, status).astype(jnp.int32)

    def pick(new, old):
        return jnp.where(accept, new, old)

    n_colors = problem.pattern.n_colors
    return {
        "t": pick(t_new, t), "y": pick(y_new, y), "h": h_next,
        "err_prev": pick(jnp.maximum(err, 1e-4), c["err_prev"]).astype(dtype), "rejected_last": ~accept,
        "i_out": i_out, "i_disc": i_disc, "ys": ys, "status": status,
        "jac": jac, "dT": dT, "f0": f0, "jac_fresh": ~accept,
        "n_steps": c["n_steps"] + accept.astype(jnp.int32),
        "n_rejected": c["n_rejected"] + (~accept).astype(jnp.int32),
        "n_attempts": n_attempts,
        "n_jac": c["n_jac"] + (~c["jac_fresh"]).astype(jnp.int32),
        "n_factor": c["n_factor"] + 1,
        "n_solves": c["n_solves"] + tab.STAGES,
        "n_ir_steps": c["n_ir_steps"] + info.ir_steps,
        "n_fallbacks": c["n_fallbacks"] + info.fallbacks,
        "n_rhs": c["n_rhs"] + (tab.STAGES - 1) + jnp.where(c["jac_fresh"], 0, n_colors + 1),
        "workspace": c["workspace"],
        "last_t": pick(t, c["last_t"]), "last_y": pick(y, c["last_y"]), "last_h": pick(h_try, c["last_h"]),
        "last_cap": pick(t_cap, c["last_cap"]),
    }  # fmt: skip


def run_loop(problem, prepared, cfg, p, t_eval, discs, carry, *, on_accept=None, until_steps=None):
    """Attempts until the status leaves RUNNING (or ``n_steps`` reaches ``until_steps``).

    ``on_accept(carry) -> carry`` runs after each attempt that was accepted (checkpointing).
    """

    def cond(c):
        go = c["status"] == RUNNING
        if until_steps is not None:
            go = go & (c["n_steps"] < until_steps)
        return go

    def body(c):
        new = dict(c, **attempt(problem, prepared, cfg, p, t_eval, discs, c))  # keeps recorder fields
        if on_accept is not None:
            accepted = new["n_steps"] > c["n_steps"]
            new = jax.lax.cond(accepted, on_accept, lambda x: x, new)
        return new

    return jax.lax.while_loop(cond, body, carry)
