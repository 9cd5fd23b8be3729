"""``ds.CheckpointAdjoint``: the checkpointed discrete adjoint of ``simulate`` (``jax.grad``, ``jax.vjp``).

Why a ``custom_vjp`` around the whole solve: JAX cannot run reverse mode through a
``lax.while_loop`` (the step count is not known when tracing), and storing every step would make
memory grow with ``max_steps``. Forward mode does run through the loop, which is why
``ForwardMode`` exists beside this (as diffrax offers ``adjoint=``); ``jax.jvp`` of the gradient
(Hessian-vector products) also works, because the reverse sweep below is made of operations that
all have forward-mode rules.

Forward pass: the ordinary loop, plus a buffer of ``C`` *step records* taken after accepted
steps at multiples of a stride that doubles (keeping every other record) whenever the buffer is
full. A record (:class:`StepRecord`) holds what a replay needs (the state and controller state on
arrival at step ``j``, with the method's checkpoint) and what the step's adjoint needs (its
accepted step size, stage-time cap and end time).

Reverse sweep, segment by segment from the end, step by step from the segment's last: get the
step's record and apply its vector-Jacobian product: ``jax.vjp`` of the method's
:meth:`~diffsoup.integrate.AbstractReversibleIntegrator.reverse_step` as a function of ``(y, p)``
(for a multistep method, :meth:`~diffsoup.integrate.AbstractReversibleIntegrator.reverse_transition`
of ``(y, history, p)``: the sweep then carries the history's cotangent too, and ends with the
vector-Jacobian product of the initial history), whose linear solves are ``custom_linear_solve``
with transposed solves on the step's factors.
The record comes from one replay (the same attempt function): for the segment's last step, from
the segment's record to the step, filling a second buffer of ``C`` inner records (stride
``ceil(L / C)``) on the way; for the others, from the inner record at or before the step, a replay
that ends at once when that record is the step's own. The program thus holds two copies of the
attempt (forward loop, replay) and one reverse step, and lanes in lock-step under ``vmap`` replay
nothing they do not need. Cotangents of the outputs enter when the sweep passes the step that
wrote them.

Exactness: the derivative is that of the discrete solution with the accepted step sizes held
fixed. A replay retraces the forward steps because it runs the same attempt function from the
same state; each segment's replay is checked against the next record (the same time and state, to
a small share of the step and of the error tolerance: linear solvers that are not bit-reproducible,
such as cuDSS's uniform batches, differ in the last bits, see :func:`replay_landed`), and a
mismatch (or a failed forward solve) makes the cotangents NaN rather than silently wrong.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple, final

import jax
import jax.numpy as jnp

from ..linear._ordering import depends_on
from ._adjoint import AbstractAdjoint
from ._linear_solve import SolveModes
from ._forward_mode import solve_forward
from ._lane_compaction import lane_while_loop
from ._loop import LoopState, begin_workspace, init_carry, regrouping, run_loop
from ._method import AbstractReversibleIntegrator
from ._status import RUNNING, Status


@final
@dataclasses.dataclass(frozen=True)
class CheckpointAdjoint(AbstractAdjoint):
    """Differentiate by a checkpointed discrete adjoint (``jax.grad``/``jax.vjp``), the default.

    The forward pass keeps at most ``checkpoints`` step records (thinned online as the step count
    grows); the reverse sweep replays each segment between records into a second buffer of the
    same size and runs the adjoint of each step with transposed solves on that step's factors.
    Memory is ``2 * checkpoints`` states, whatever ``max_steps``; beyond ``checkpoints**2 / 2``
    accepted steps, segments are replayed step by step (slower, same result).
    Forward mode (``jax.jvp``) of a function using it is not available; ``jax.jvp`` of its
    gradient is (Hessian-vector products). It needs a method with a discrete adjoint step (an
    ``AbstractReversibleIntegrator`` such as ``ds.Rodas5P()``); with another method the solve
    runs, and reverse mode raises a ``TypeError``.

    Args:
        checkpoints: records per level (at least 1).
    """

    checkpoints: int = 128

    def __post_init__(self):
        if isinstance(self.checkpoints, bool) or int(self.checkpoints) < 1:
            raise ValueError(f"CheckpointAdjoint.checkpoints={self.checkpoints!r} must be a positive integer.")

    def solve(self, problem, cfg, y0, p, t0, t_eval, discs):
        if not isinstance(cfg.method, AbstractReversibleIntegrator):
            return _solve_without_adjoint(problem, cfg, y0, p, t0, t_eval, discs)
        return solve_with_adjoint(problem, int(self.checkpoints), cfg, y0, p, t0, t_eval, discs)


@dataclasses.dataclass(frozen=True)
class _Static:
    """The solve's static part besides ``cfg``'s (which travels as an operand: its numbers are
    traced, its method and modes live in its pytree structure)."""

    problem: object
    checkpoints: int


@functools.partial(jax.jit, static_argnums=(0, 1))
def solve_with_adjoint(problem, checkpoints, cfg, y0, p, t0, t_eval, discs):
    return _solve(_Static(problem, checkpoints), cfg, y0, p, t0, t_eval, discs)


# ----------------------------------------------------------------------------------------------
# A method without a discrete adjoint: the solve runs, reverse mode says why it cannot
# ----------------------------------------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _solve_without_adjoint(problem, cfg, y0, p, t0, t_eval, discs):
    return solve_forward(problem, cfg, y0, p, t0, t_eval, discs)


def _without_adjoint_fwd(problem, cfg, y0, p, t0, t_eval, discs):
    return _solve_without_adjoint(problem, cfg, y0, p, t0, t_eval, discs), cfg


def _without_adjoint_bwd(problem, cfg, cotangents):
    name = type(cfg.method).__name__
    raise TypeError(
        f"simulate(method={name}(...)): {name} has no discrete adjoint step, so reverse mode (jax.grad, "
        "jax.vjp) cannot differentiate it; use adjoint=ds.ForwardMode() with jax.jvp/jax.jacfwd, or a method "
        "with an adjoint such as ds.Rodas5P()."
    )


_solve_without_adjoint.defvjp(_without_adjoint_fwd, _without_adjoint_bwd)


# ----------------------------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------------------------


class Arrival(NamedTuple):
    """The loop's state on arrival at a step (after the previous accepted step): what a replay
    starts from, with the method's :meth:`~AbstractReversibleIntegrator.checkpoint`."""

    h: Any
    err_prev: Any
    i_out: Any
    i_disc: Any
    method: Any


class StepRecord(NamedTuple):
    """One accepted step: where it started (and the loop's state on arrival), its size, its
    stage-time cap and its end time."""

    t: Any
    y: Any
    n_steps: Any  # accepted steps before it
    arrival: Arrival
    acc_h: Any
    acc_cap: Any
    t_new: Any


class Recorder(NamedTuple):
    """The adjoint's part of the loop carry: the record buffer and the record of the last step."""

    records: StepRecord  # every leaf with a leading (capacity,) axis
    stride: Any  # the forward pass records the steps at multiples of it
    arrival: Arrival  # on arrival at the next step
    last: StepRecord  # the step just accepted


def _pick(records: StepRecord, slot) -> StepRecord:
    return jax.tree_util.tree_map(lambda v: v[slot], records)


def _empty_records(capacity, template: StepRecord) -> StepRecord:
    return jax.tree_util.tree_map(lambda v: jnp.zeros((capacity,) + jnp.shape(v), jnp.result_type(v)), template)


def _arrival(method, c: LoopState) -> Arrival:
    return Arrival(c.h, c.err_prev, c.i_out, c.i_disc, method.checkpoint(c.method))


def _record_of_last_step(c: LoopState) -> StepRecord:
    """The record of the step just accepted (``c`` is the carry right after it)."""
    return StepRecord(
        t=c.last.t, y=c.last.y, n_steps=c.counters.n_steps - 1, arrival=c.recorder.arrival, acc_h=c.last.h,
        acc_cap=c.last.cap, t_new=c.t,
    )  # fmt: skip


def _write(records, slot, record, do):
    return jax.tree_util.tree_map(lambda r, v: jnp.where(do, r.at[slot].set(v), r), records, record)


def _with_recorder(method, c: LoopState, capacity) -> LoopState:
    """``c`` with an empty recorder (arrival: ``c``'s own state)."""
    arrival = _arrival(method, c)
    dtype = c.y.dtype
    scalar_t = jnp.zeros((), dtype)
    blank = StepRecord(
        t=scalar_t, y=jnp.zeros_like(c.y), n_steps=jnp.zeros((), jnp.int32), arrival=arrival, acc_h=scalar_t,
        acc_cap=scalar_t, t_new=scalar_t,
    )  # fmt: skip
    records = _empty_records(capacity, blank)
    return c._replace(recorder=Recorder(records, jnp.ones((), jnp.int32), arrival, _pick(records, 0)))


def _top_recorder(method, capacity):
    """``on_accept`` of the forward pass: records at multiples of a doubling stride."""

    def on_accept(c: LoopState) -> LoopState:
        rec = _record_of_last_step(c)
        j = rec.n_steps
        r = c.recorder
        stride = r.stride
        full = (j % stride == 0) & (j // stride >= capacity)
        # Full: keep every other record, double the stride.
        thinned = jax.tree_util.tree_map(lambda v: v[jnp.minimum(2 * jnp.arange(capacity), capacity - 1)], r.records)
        records = jax.tree_util.tree_map(lambda a, b: jnp.where(full, a, b), thinned, r.records)
        stride = jnp.where(full, 2 * stride, stride)
        store = j % stride == 0
        records = _write(records, jnp.minimum(j // stride, capacity - 1), rec, store)
        return c._replace(recorder=Recorder(records, stride, _arrival(method, c), rec))

    return on_accept


def _inner_recorder(method, base, stride):
    """``on_accept`` of a segment replay: records at ``base + q * stride``."""

    def on_accept(c: LoopState) -> LoopState:
        rec = _record_of_last_step(c)
        offset = rec.n_steps - base
        store = offset % stride == 0
        records = _write(c.recorder.records, offset // stride, rec, store)
        return c._replace(recorder=c.recorder._replace(records=records, arrival=_arrival(method, c), last=rec))

    return on_accept


def _carry_from_record(method, rec: StepRecord, workspace, template: LoopState) -> LoopState:
    """A loop carry on arrival at the record's step, as the forward pass had it."""
    a = rec.arrival
    c = template._replace(
        t=rec.t, y=rec.y, h=a.h, err_prev=a.err_prev, rejected_last=jnp.zeros((), bool), i_out=a.i_out,
        i_disc=a.i_disc, counters=template.counters._replace(n_steps=rec.n_steps),
        status=jnp.asarray(RUNNING, jnp.int32), method=method.resume(template.method, a.method), workspace=workspace,
    )  # fmt: skip
    return c._replace(recorder=c.recorder._replace(arrival=_arrival(method, c)))


# ----------------------------------------------------------------------------------------------
# Forward pass with records
# ----------------------------------------------------------------------------------------------


def _forward(static, cfg, y0, p, t0, t_eval, discs):
    problem, capacity = static.problem, static.checkpoints
    method = cfg.method
    workspace = begin_workspace(problem, cfg.modes.all, y0, p, t0, t_eval)
    carry = init_carry(problem, cfg, y0, p, t0, t_eval, discs, workspace)
    carry = _with_recorder(method, carry, capacity)
    carry = run_loop(problem, cfg, p, t_eval, discs, carry, on_accept=_top_recorder(method, capacity), regroup=True)
    token = problem.prepared.end(workspace, carry.ys)
    status = carry.status + 0 * token
    stats = carry.counters.stats(method)
    residual = (carry.recorder.records, carry.recorder.stride, carry.counters.n_steps, status)
    return carry.ys, status, stats, residual


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _solve(static, cfg, y0, p, t0, t_eval, discs):
    ys, status, stats, _ = _forward(static, cfg, y0, p, t0, t_eval, discs)
    return ys, status, stats


def _solve_fwd(static, cfg, y0, p, t0, t_eval, discs):
    ys, status, stats, residual = _forward(static, cfg, y0, p, t0, t_eval, discs)
    return (ys, status, stats), (residual, cfg, y0, p, t0, t_eval, discs)


# ----------------------------------------------------------------------------------------------
# Reverse sweep
# ----------------------------------------------------------------------------------------------

# A replay has retraced the forward pass when it ends on the forward pass's next record within
# REPLAY_TIME_SHARE of the record's step size in time and, once moved along the solution by that
# time difference (``y + (t_record - t) f(t, y)``), within REPLAY_STATE_SHARE of the error
# tolerance ``atol + rtol |y|`` in every state. A linear solver that is not bit-reproducible (cuDSS's
# uniform batches on a GPU) makes replays differ by rounding, which the step-size controller turns
# into step sizes differing by ~1e-8 relative: measured on an oscillating Brusselator with solves
# perturbed by 1e-15 relative, replays of 128 steps ended 3e-5 steps off in time and 5e-5 tolerances
# off in state (tests/test_replay_check.py); perturbations of 1e-11 missed by 0.03 steps and 7
# tolerances. Zero for both asks for bit-for-bit equality.
REPLAY_TIME_SHARE = 1e-2
REPLAY_STATE_SHARE = 0.1


def replay_landed(problem, p, t, y, record: StepRecord, cfg):
    """Whether a replay that ended at ``(t, y)`` after the record's step count reached ``record``."""
    dt = record.t - t
    near_t = jnp.abs(dt) <= REPLAY_TIME_SHARE * jnp.abs(record.arrival.h)
    moved = y + dt * problem.rhs(t, y, p).astype(y.dtype)
    scale = cfg.atol + cfg.rtol * jnp.maximum(jnp.abs(y), jnp.abs(record.y))
    return near_t & jnp.all(jnp.abs(moved - record.y) <= REPLAY_STATE_SHARE * scale)


def _solve_bwd(static, residuals, cotangents):
    (records, stride, n_total, forward_status), cfg, y0, p, t0, t_eval, discs = residuals
    ct_ys = cotangents[0]
    problem, capacity = static.problem, static.checkpoints
    method = cfg.method
    prepared = problem.prepared
    modes = cfg.modes
    adjoint_dtype = jnp.dtype(problem.precision.effective_adjoint_compute_dtype)
    step_modes = SolveModes(modes.primal, modes.primal, modes.reverse, modes.reverse_ir_tol)
    dtype = y0.dtype
    ct_ys = jnp.asarray(ct_ys, dtype)

    workspace = begin_workspace(problem, step_modes.with_reverse, y0, p, t0, t_eval)
    # The replays' carry: its structure, and values that every replay overwrites.
    template = init_carry(problem, cfg, y0, p, t0, t_eval, discs, workspace, evaluate=False)
    template = _with_recorder(method, template, capacity)
    count = jnp.where(n_total > 0, (n_total - 1) // stride + 1, 0)

    steady = cfg.steady is not None

    # A multistep method's history (AbstractReversibleIntegrator.history) has a cotangent too.
    history_template = method.history(template.method)
    has_history = bool(jax.tree_util.tree_leaves(history_template))

    def step_vjp(rec: StepRecord, lam, pbar):
        """Adjoint of the accepted step of ``rec``: outputs it wrote, then the step itself."""
        lam, lam_history = lam
        wrote = (t_eval == rec.t_new) & (t_eval > t0)
        if steady:
            # The steady state (+inf outputs) is the state after the last accepted step.
            wrote = wrote | (jnp.isposinf(t_eval) & (rec.n_steps == n_total - 1))
        lam = lam + jnp.sum(jnp.where(wrote[:, None], ct_ys, 0.0), axis=0).astype(lam.dtype)
        t, h, cap = (x.astype(adjoint_dtype) for x in (rec.t, rec.acc_h, rec.acc_cap))

        if not has_history:

            def one_step(y, pp):
                return method.reverse_step(problem, step_modes, workspace, t, y, h, pp, cap)

            y_new, vjp = jax.vjp(one_step, rec.y.astype(adjoint_dtype), p.astype(adjoint_dtype))
            # The transposed solves read the factors' workspace too: start them after the recomputed
            # step's own solves (the last stage's transpose needs only the incoming cotangent).
            ybar, pb = vjp(depends_on(lam, y_new))
            return (ybar, lam_history), pbar + pb

        arrival = method.resume(template.method, rec.arrival.method)
        history = jax.tree_util.tree_map(lambda v: v.astype(adjoint_dtype), method.history(arrival))

        def transition(y, hist, pp):
            return method.reverse_transition(problem, cfg, step_modes, workspace, arrival, hist, t, y, h, pp, cap)

        (y_new, _), vjp = jax.vjp(transition, rec.y.astype(adjoint_dtype), history, p.astype(adjoint_dtype))
        after = jax.tree_util.tree_map(lambda v: depends_on(v, y_new), lam_history)
        ybar, history_bar, pb = vjp((depends_on(lam, y_new), after))
        return (ybar, history_bar), pbar + pb

    def segment(state):
        """The adjoint of the steps of segment ``k``, last step first. One replay serves both
        needs of a step (one copy of the attempt code in the program): the first replay runs the
        segment from its record, filling the inner records; a later step starts from the inner
        record at or before it, and replays only when that record is not its own (inner stride
        above 1). A step whose record is at hand replays nothing: the replay's loop ends at once,
        also for lanes that run in lock-step under vmap."""
        k, lam, pbar, bad = state
        base = k * stride
        length = jnp.minimum(stride, n_total - base)
        top = _pick(records, k)
        s2 = jnp.maximum((length + capacity - 1) // capacity, 1)
        inner0 = jax.tree_util.tree_map(lambda v, r: v.at[0].set(r), template.recorder.records, top)
        nxt = _pick(records, jnp.minimum(k + 1, capacity - 1))
        last_j = base + length - 1

        def step_body(st):
            j, lam, pbar, inner, bad = st
            first = j == last_j  # the segment has not been replayed yet: start from its own record
            q = jnp.where(first, 0, (j - base) // s2)
            start = _pick(inner, q)
            exact = start.n_steps == j
            c = _carry_from_record(method, start, workspace, template)
            c = c._replace(recorder=c.recorder._replace(records=inner))
            c = run_loop(problem, cfg, p, t_eval, discs, c, on_accept=_inner_recorder(method, base, s2),
                         until_steps=jnp.where(exact, j, j + 1))  # fmt: skip
            rec = jax.tree_util.tree_map(lambda a, b: jnp.where(exact, a, b), start, c.recorder.last)
            # The first replay must end where the forward pass recorded the next segment's start.
            ends_ok = jnp.where(k + 1 < count, replay_landed(problem, p, c.t, c.y, nxt, cfg), True)
            mismatch = first & ~exact & ~((c.counters.n_steps == base + length) & ends_ok)
            lam, pbar = step_vjp(rec, lam, pbar)
            return j - 1, lam, pbar, c.recorder.records, bad | mismatch

        # Every lane sweeps about as many segments (the checkpoints); a lane of many steps has long
        # ones, so this loop is where lanes finish at different times: regrouped as they do.
        _, lam, pbar, _, bad = lane_while_loop(
            lambda st: st[0] >= base, step_body, (last_j, lam, pbar, inner0, bad), regrouping(cfg, workspace)
        )
        return k - 1, lam, pbar, bad

    lam0 = (
        jnp.zeros(y0.shape, adjoint_dtype),
        jax.tree_util.tree_map(lambda v: jnp.zeros(jnp.shape(v), adjoint_dtype), history_template),
    )
    pbar0 = jnp.zeros(p.shape, adjoint_dtype)
    _, (lam, lam_history), pbar, bad = jax.lax.while_loop(
        lambda st: st[0] >= 0, segment, (count - 1, lam0, pbar0, jnp.zeros((), bool))
    )
    at_start = t_eval <= t0
    if steady:
        at_start = at_start | (jnp.isposinf(t_eval) & (n_total == 0))
    lam = lam + jnp.sum(jnp.where(at_start[:, None], ct_ys, 0.0), axis=0).astype(adjoint_dtype)
    if has_history:
        # The history before the first step, from (y0, p).
        _, vjp0 = jax.vjp(
            lambda y, pp: method.initial_history(problem, t0.astype(adjoint_dtype), y, pp),
            y0.astype(adjoint_dtype), p.astype(adjoint_dtype),
        )  # fmt: skip
        ybar0, pbar_start = vjp0(lam_history)
        lam, pbar = lam + ybar0, pbar + pbar_start
    token = prepared.end(workspace, (lam, pbar))
    del token  # the release is ordered after the cotangents; its value is not needed
    failed = bad | (forward_status != Status.SUCCESS)
    nan = jnp.asarray(jnp.nan, adjoint_dtype)
    ybar = jnp.where(failed, nan, lam).astype(y0.dtype)
    pbar = jnp.where(failed, nan, pbar).astype(p.dtype)
    # No cotangent for the settings (tolerances are not differentiated), the times or the discontinuities.
    return None, ybar, pbar, jnp.zeros_like(t0), jnp.zeros_like(t_eval), jnp.zeros_like(discs)


_solve.defvjp(_solve_fwd, _solve_bwd)
