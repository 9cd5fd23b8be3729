"""The checkpointed discrete adjoint of ``simulate`` (reverse mode: ``jax.grad``, ``jax.vjp``).

Why a ``custom_vjp`` around the whole solve: JAX cannot run reverse mode through a
``lax.while_loop`` (the step count is not known when tracing), and storing every step would make
memory grow with ``max_steps``. Forward mode does run through the loop, which is why
``ForwardMode`` exists beside this (as diffrax offers ``adjoint=``); ``jax.jvp`` of the gradient
(Hessian-vector products) also works, because the reverse sweep below is made of operations that
all have forward-mode rules.

Forward pass: the ordinary loop, plus a buffer of ``C`` *step records* taken after accepted
steps at multiples of a stride that doubles (keeping every other record) whenever the buffer is
full. A record holds what a replay needs (the state and controller state on arrival at step
``j``) and what the step's adjoint needs (its accepted step size, stage-time cap and end time).

Reverse sweep, segment by segment from the end: replay the segment from its record with the same
attempt function into a second buffer of ``C`` records (stride ``ceil(L / C)``), then for each
step in reverse get its record (directly, or by replaying from the nearest inner record), and
apply the step's vector-Jacobian product: ``jax.vjp`` of one Rodas5P step as a function of
``(y, p)``, whose linear solves are ``custom_linear_solve`` with transposed solves on the step's
factors. Cotangents of the outputs enter when the sweep passes the step that wrote them.

Exactness: the derivative is that of the discrete solution with the accepted step sizes held
fixed. A replay retraces the forward steps because it runs the same attempt function from the
same state; each segment's replay is checked against the next record, and a mismatch (or a failed
forward solve) makes the cotangents NaN rather than silently wrong.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from ..linear._base import depends_on
from ._loop import init_carry, run_loop
from ._status import RUNNING, Status
from ._step import SolveModes, full_step

RECORD_FIELDS = ("t", "y", "h", "err_prev", "i_out", "i_disc", "n_steps", "acc_h", "acc_cap", "t_new")


@dataclasses.dataclass(frozen=True)
class _Static:
    problem: object
    cfg: object
    checkpoints: int


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def solve_with_adjoint(problem, cfg, checkpoints, y0, p, t0, t_eval, discs):
    return _solve(_Static(problem, cfg, checkpoints), y0, p, t0, t_eval, discs)


# ----------------------------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------------------------


def _empty_records(capacity, y0, carry):
    dtype = y0.dtype
    zi = jnp.zeros((capacity,), jnp.int32)
    zf = jnp.zeros((capacity,), dtype)
    return {
        "t": zf, "y": jnp.zeros((capacity,) + y0.shape, dtype), "h": zf, "err_prev": zf, "i_out": zi,
        "i_disc": zi, "n_steps": zi, "acc_h": zf, "acc_cap": zf, "t_new": zf,
    }  # fmt: skip


def _arrival(c):
    return {"h": c["h"], "err_prev": c["err_prev"], "i_out": c["i_out"], "i_disc": c["i_disc"]}


def _record_of_last_step(c):
    """The record of the step just accepted (``c`` is the carry right after it)."""
    arr = c["arr"]
    return {
        "t": c["last_t"], "y": c["last_y"], "h": arr["h"], "err_prev": arr["err_prev"], "i_out": arr["i_out"],
        "i_disc": arr["i_disc"], "n_steps": c["n_steps"] - 1, "acc_h": c["last_h"], "acc_cap": c["last_cap"],
        "t_new": c["t"],
    }  # fmt: skip


def _write(records, slot, record, do):
    return {k: jnp.where(do, records[k].at[slot].set(record[k]), records[k]) for k in records}


def _top_recorder(capacity):
    """``on_accept`` of the forward pass: records at multiples of a doubling stride."""

    def on_accept(c):
        rec = _record_of_last_step(c)
        j = rec["n_steps"]
        stride = c["stride"]
        full = (j % stride == 0) & (j // stride >= capacity)
        # Full: keep every other record, double the stride.
        thinned = {k: v[jnp.minimum(2 * jnp.arange(capacity), capacity - 1)] for k, v in c["rec"].items()}
        records = jax.tree_util.tree_map(lambda a, b: jnp.where(full, a, b), thinned, c["rec"])
        stride = jnp.where(full, 2 * stride, stride)
        store = j % stride == 0
        records = _write(records, jnp.minimum(j // stride, capacity - 1), rec, store)
        return dict(c, rec=records, stride=stride, arr=_arrival(c), rec_last=rec)

    return on_accept


def _inner_recorder(base, stride):
    """``on_accept`` of a segment replay: records at ``base + q * stride``."""

    def on_accept(c):
        rec = _record_of_last_step(c)
        offset = rec["n_steps"] - base
        store = offset % stride == 0
        records = _write(c["rec"], offset // stride, rec, store)
        return dict(c, rec=records, arr=_arrival(c), rec_last=rec)

    return on_accept


def _last_recorder(c):
    rec = _record_of_last_step(c)
    return dict(c, arr=_arrival(c), rec_last=rec)


def _carry_from_record(problem, prepared, cfg, p, t_eval, discs, rec, workspace, template):
    """A loop carry on arrival at the record's step, as the forward pass had it."""
    c = dict(template)
    c.update(
        t=rec["t"], y=rec["y"], h=rec["h"], err_prev=rec["err_prev"], rejected_last=jnp.zeros((), bool),
        i_out=rec["i_out"], i_disc=rec["i_disc"], n_steps=rec["n_steps"], status=jnp.asarray(RUNNING, jnp.int32),
        jac_fresh=jnp.zeros((), bool), workspace=workspace,
    )  # fmt: skip
    c["arr"] = _arrival(c)
    return c


# ----------------------------------------------------------------------------------------------
# Forward pass with records
# ----------------------------------------------------------------------------------------------


def _forward(static, y0, p, t0, t_eval, discs):
    from ._simulate import STAT_FIELDS, batched_zeros

    problem, cfg, capacity = static.problem, static.cfg, static.checkpoints
    prepared = problem.prepared
    jac0 = jax.eval_shape(problem.jacobian_values, t0, y0, p)
    workspace = prepared.begin(batched_zeros(jac0, y0, p, t0, t_eval), cfg.modes.all)
    carry = init_carry(problem, prepared, cfg, y0, p, t0, t_eval, discs, workspace)
    carry["rec"] = _empty_records(capacity, y0, carry)
    carry["stride"] = jnp.ones((), jnp.int32)
    carry["arr"] = _arrival(carry)
    carry["rec_last"] = {k: v[0] for k, v in carry["rec"].items()}
    carry = run_loop(problem, prepared, cfg, p, t_eval, discs, carry, on_accept=_top_recorder(capacity))
    token = prepared.end(workspace, carry["ys"])
    status = carry["status"] + 0 * token
    stats = {k: carry[k] for k in STAT_FIELDS}
    residual = {"rec": carry["rec"], "stride": carry["stride"], "n_steps": carry["n_steps"], "status": status}
    return carry["ys"], status, stats, residual


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _solve(static, y0, p, t0, t_eval, discs):
    ys, status, stats, _ = _forward(static, y0, p, t0, t_eval, discs)
    return ys, status, stats


def _solve_fwd(static, y0, p, t0, t_eval, discs):
    ys, status, stats, residual = _forward(static, y0, p, t0, t_eval, discs)
    return (ys, status, stats), (residual, y0, p, t0, t_eval, discs)


# ----------------------------------------------------------------------------------------------
# Reverse sweep
# ----------------------------------------------------------------------------------------------


def _solve_bwd(static, residuals, cotangents):
    residual, y0, p, t0, t_eval, discs = residuals
    ct_ys = cotangents[0]
    problem, cfg, capacity = static.problem, static.cfg, static.checkpoints
    prepared = problem.prepared
    modes = cfg.modes
    adjoint_dtype = jnp.dtype(problem.precision.effective_adjoint_compute_dtype)
    step_modes = SolveModes(modes.primal, modes.primal, modes.reverse, modes.reverse_ir_tol)
    dtype = y0.dtype
    ct_ys = jnp.asarray(ct_ys, dtype)

    from ._simulate import batched_zeros

    jac0 = jax.eval_shape(problem.jacobian_values, t0, y0, p)
    workspace = prepared.begin(batched_zeros(jac0, y0, p, t0, t_eval), step_modes.with_reverse)
    template = init_carry(problem, prepared, cfg, y0, p, t0, t_eval, discs, workspace)
    template["rec"] = _empty_records(capacity, y0, template)
    template["arr"] = _arrival(template)
    template["rec_last"] = {k: v[0] for k, v in template["rec"].items()}

    records, stride, n_total = residual["rec"], residual["stride"], residual["n_steps"]
    count = jnp.where(n_total > 0, (n_total - 1) // stride + 1, 0)

    def pick(records, slot):
        return {k: v[slot] for k, v in records.items()}

    def step_vjp(rec, lam, pbar):
        """Adjoint of the accepted step of ``rec``: outputs it wrote, then the step itself."""
        wrote = (t_eval == rec["t_new"]) & (t_eval > t0)
        lam = lam + jnp.sum(jnp.where(wrote[:, None], ct_ys, 0.0), axis=0).astype(lam.dtype)
        t, h, cap = (rec[k].astype(adjoint_dtype) for k in ("t", "acc_h", "acc_cap"))

        def one_step(y, pp):
            return full_step(problem, prepared, step_modes, workspace, t, y, h, pp, cap)

        y_new, vjp = jax.vjp(one_step, rec["y"].astype(adjoint_dtype), p.astype(adjoint_dtype))
        # The transposed solves read the factors' workspace too: start them after the recomputed
        # step's own solves (the last stage's transpose needs only the incoming cotangent).
        ybar, pb = vjp(depends_on(lam, y_new))
        return ybar, pbar + pb

    def replay(rec, until, recorder):
        c = _carry_from_record(problem, prepared, cfg, p, t_eval, discs, rec, workspace, template)
        return run_loop(problem, prepared, cfg, p, t_eval, discs, c, on_accept=recorder, until_steps=until)

    def record_of_step(inner, base, s2, j):
        """The record of step ``j`` from the inner records (replaying from the nearest one)."""
        q = (j - base) // s2
        start = pick(inner, q)

        def from_replay():
            c = replay(start, j + 1, _last_recorder)
            return c["rec_last"]

        return jax.lax.cond(start["n_steps"] == j, lambda: start, from_replay)

    def segment(state):
        k, lam, pbar, bad = state
        base = k * stride
        length = jnp.minimum(stride, n_total - base)
        top = pick(records, k)
        s2 = jnp.maximum((length + capacity - 1) // capacity, 1)

        def replay_segment():
            c = replay(top, base + length, _inner_recorder(base, s2))
            # The replay must end where the forward pass recorded the next segment's start.
            nxt = pick(records, jnp.minimum(k + 1, capacity - 1))
            ends_ok = jnp.where(k + 1 < count, (c["t"] == nxt["t"]) & jnp.all(c["y"] == nxt["y"]), True)
            ok = (c["n_steps"] == base + length) & ends_ok
            return c["rec"], ~ok

        def single():
            inner = jax.tree_util.tree_map(lambda v, r: v.at[0].set(r), template["rec"], top)
            return inner, jnp.zeros((), bool)

        inner, mismatch = jax.lax.cond(length > 1, replay_segment, single)

        def step_body(st):
            j, lam, pbar = st
            rec = record_of_step(inner, base, s2, j)
            lam, pbar = step_vjp(rec, lam, pbar)
            return j - 1, lam, pbar

        _, lam, pbar = jax.lax.while_loop(
            lambda st: st[0] >= base, step_body, (base + length - 1, lam, pbar)
        )
        return k - 1, lam, pbar, bad | mismatch

    lam0 = jnp.zeros(y0.shape, adjoint_dtype)
    pbar0 = jnp.zeros(p.shape, adjoint_dtype)
    _, lam, pbar, bad = jax.lax.while_loop(
        lambda st: st[0] >= 0, segment, (count - 1, lam0, pbar0, jnp.zeros((), bool))
    )
    at_start = t_eval <= t0
    lam = lam + jnp.sum(jnp.where(at_start[:, None], ct_ys, 0.0), axis=0).astype(adjoint_dtype)
    token = prepared.end(workspace, (lam, pbar))
    del token  # the release is ordered after the cotangents; its value is not needed
    failed = bad | (residual["status"] != Status.SUCCESS)
    nan = jnp.asarray(jnp.nan, adjoint_dtype)
    ybar = jnp.where(failed, nan, lam).astype(y0.dtype)
    pbar = jnp.where(failed, nan, pbar).astype(p.dtype)
    return ybar, pbar, jnp.zeros_like(t0), jnp.zeros_like(t_eval), jnp.zeros_like(discs)


_solve.defvjp(_solve_fwd, _solve_bwd)

