"""The integration loop: step attempts, error control, outputs at requested times.

Every output time and every discontinuity is a step endpoint: a step that would pass one is
shortened to land on it exactly. Outputs are therefore exact step endpoints (no interpolation),
and across a discontinuity the step that ends there evaluates the right-hand side just below it.

One loop iteration is one *attempt*: the method (an :class:`~diffsoup.integrate.AbstractIntegrator`)
proposes a step and an error estimate; the loop accepts or rejects it, picks the next step size,
writes outputs and sets the status. The loop's carry is a typed :class:`LoopState` holding the
method's own state. The same :func:`attempt` function drives the forward pass and the adjoint's
replays, so a replay from a checkpoint retraces the same accepted steps.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..linear import Workspace
from ._lane_compaction import LaneCompaction, lane_while_loop
from ._linear_solve import SolveModes
from ._method import AbstractIntegrator
from ._status import RUNNING, Status
from ._steady_state import SteadyCriterion, is_steady


@dataclasses.dataclass(frozen=True)
class PIController:
    """Proportional-integral step-size control (Gustafsson; Hairer and Wanner's form).

    ``h_new = h * clip(safety * err^-beta1 * err_prev^beta2, factor_min, factor_max)`` with the
    weighted RMS error ``err`` of the embedded estimate; after a rejection the step does not grow.
    Its numbers are operands of the compiled solve (new values compile nothing).
    """

    safety: float = 0.9
    beta1: float = 0.7 / 5
    beta2: float = 0.4 / 5
    factor_min: float = 0.2
    factor_max: float = 10.0

    def __post_init__(self):
        for name in ("safety", "beta1", "beta2", "factor_min", "factor_max"):
            value = getattr(self, name)
            if _is_traced(value):
                continue
            try:
                finite = np.isfinite(float(value))
            except (TypeError, ValueError):
                finite = False
            if not finite:
                raise ValueError(f"PIController.{name}={value!r} must be a finite number.")
        numbers = [getattr(self, n) for n in ("safety", "factor_min", "factor_max")]
        if not any(_is_traced(v) for v in numbers):
            safety, fmin, fmax = (float(v) for v in numbers)
            if not (0.0 < safety <= 1.0 and 0.0 < fmin <= 1.0 <= fmax):
                raise ValueError(
                    f"PIController: need 0 < safety <= 1 and 0 < factor_min <= 1 <= factor_max; got safety={safety}, "
                    f"factor_min={fmin}, factor_max={fmax}."
                )

    def control(self, dtype) -> "StepControl":
        """The numbers as arrays of ``dtype`` (the compiled solve's operands)."""
        values = (self.safety, self.beta1, self.beta2, self.factor_min, self.factor_max, np.nan)
        return StepControl(*(_operand(v, dtype) for v in values))


@dataclasses.dataclass(frozen=True)
class ConstantStep:
    """Fixed steps of size ``h`` (shortened only to land on output times and discontinuities);
    no error control, for convergence-order tests and reproducible step sequences. ``h`` is an
    operand of the compiled solve (another ``h`` compiles nothing)."""

    h: float

    def __post_init__(self):
        if not _is_traced(self.h) and not (float(self.h) > 0.0 and np.isfinite(self.h)):
            raise ValueError(f"ConstantStep.h={self.h!r} must be a positive finite step size.")

    def control(self, dtype) -> "StepControl":
        """The step size as the compiled solve's operand (the PI constants unused)."""
        return StepControl(*(_operand(v, dtype) for v in (1.0, 1.0, 1.0, 1.0, 1.0, self.h)))


def _is_traced(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def _operand(x, dtype):
    """A scalar operand of the compiled solve: numpy when concrete (no device work), else traced."""
    return jnp.asarray(x).astype(dtype) if _is_traced(x) else np.asarray(x, dtype)


class StepControl(NamedTuple):
    """The step-size controller's numbers, traced (scalars of the compute dtype): the PI
    constants, and ``h`` for fixed steps."""

    safety: Any
    beta1: Any
    beta2: Any
    factor_min: Any
    factor_max: Any
    h: Any


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["rtol", "atol", "h0", "max_steps", "control", "steady"],
    meta_fields=["method", "modes", "fixed_step", "lanes"],
)
@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """The settings of one integration, a pytree: its numbers are traced operands of the compiled
    solve (a new tolerance, first step, step budget or controller constant compiles nothing); the
    method, the solve modes and the kind of controller are its static part (in the pytree's
    structure, so part of the program's cache key).

    Attributes:
        rtol: relative tolerance (scalar of the compute dtype).
        atol: absolute tolerances, one per state ``(n,)`` (a scalar ``atol`` broadcast).
        h0: first step size; NaN: chosen from the problem (:func:`initial_step`).
        max_steps: most step attempts (int32 scalar).
        control: :class:`StepControl`.
        method: the :class:`~diffsoup.integrate.AbstractIntegrator` (static).
        modes: the :class:`SolveModes` (static).
        fixed_step: True for ``ConstantStep`` (no error control), False for ``PIController`` (static).
        steady: a :class:`SteadyCriterion` when ``+inf`` outputs are steady states, else None; None
            or not is part of the pytree's structure, so only programs that look for a steady
            state contain its test.
        lanes: a :class:`LaneCompaction`: vmapped, the forward pass and the adjoint's sweeps regroup
            their unfinished lanes as lanes finish (static; None: lock-step).
    """

    rtol: Any
    atol: Any
    h0: Any
    max_steps: Any
    control: StepControl
    method: AbstractIntegrator
    modes: SolveModes
    fixed_step: bool
    steady: SteadyCriterion | None = None
    lanes: LaneCompaction | None = None


class Counters(NamedTuple):
    """Counters of one solve (int32); :attr:`Solution.stats` reports those of ``STAT_FIELDS``,
    and ``NEWTON_STAT_FIELDS`` for a method with ``newton_stats``."""

    n_steps: Any  # accepted
    n_rejected: Any
    n_jac: Any  # Jacobian evaluations
    n_factor: Any  # factorizations
    n_solves: Any
    n_ir_steps: Any  # refinement steps
    n_fallbacks: Any  # adaptive float64 fallbacks
    n_rhs: Any  # right-hand-side evaluations, Jacobian colors included
    n_attempts: Any  # accepted and rejected (max_steps bounds it)
    n_newton_iters: Any  # Newton iterations (methods that iterate)
    n_newton_failures: Any  # step attempts whose Newton iteration did not converge

    def stats(self, method: AbstractIntegrator | None = None) -> dict:
        """The counters ``Solution.stats`` reports for ``method``, by name."""
        names = STAT_FIELDS + (NEWTON_STAT_FIELDS if method is not None and method.newton_stats else ())
        return {name: getattr(self, name) for name in names}


STAT_FIELDS = ("n_steps", "n_rejected", "n_jac", "n_factor", "n_solves", "n_ir_steps", "n_fallbacks", "n_rhs")
NEWTON_STAT_FIELDS = ("n_newton_iters", "n_newton_failures")


class LastStep(NamedTuple):
    """The accepted step just taken: its start, state, size and stage-time cap (for the adjoint)."""

    t: Any
    y: Any
    h: Any
    cap: Any


class LoopState(NamedTuple):
    """The loop's carry.

    Attributes:
        t, y: where the solution is (the last accepted step's end).
        h: the next step size to try.
        err_prev: the last accepted step's error (the controller's memory).
        rejected_last: whether the last attempt was rejected (the step does not grow then).
        i_out, i_disc: outputs written, discontinuities passed.
        ys: the outputs ``(m, n)``.
        status: ``RUNNING`` inside the loop, then a :class:`Status`.
        method: the method's own state (:meth:`AbstractIntegrator.init`).
        counters: :class:`Counters`.
        workspace: the linear solver's workspace.
        last: :class:`LastStep`.
        recorder: what the checkpointed adjoint records (None in a plain forward pass).
    """

    t: Any
    y: Any
    h: Any
    err_prev: Any
    rejected_last: Any
    i_out: Any
    i_disc: Any
    ys: Any
    status: Any
    method: Any
    counters: Counters
    workspace: Workspace
    last: LastStep
    recorder: Any = None


def batched_zeros(like, y0, p, t0, t_eval):
    """Zeros shaped like ``like`` that are batched whenever any input is (under vmap), so that
    per-experiment solver state (KLU handles) is allocated per experiment."""
    anchor = jax.lax.stop_gradient(y0[0] + jnp.sum(p) + t0 + t_eval[0])
    return jnp.zeros(like.shape, like.dtype) + 0.0 * jnp.nan_to_num(anchor).astype(like.dtype)


def begin_workspace(problem, modes, y0, p, t0, t_eval) -> Workspace:
    """The linear solver's workspace for one solve in ``modes`` (batched as the inputs are)."""
    jac0 = jax.eval_shape(problem.jacobian_values, t0, y0, p)
    return problem.prepared.begin(batched_zeros(jac0, y0, p, t0, t_eval), modes)


def error_norm(err, y, y_new, rtol, atol):
    """Weighted RMS norm of the error estimate (Hairer and Wanner's)."""
    scale = atol + rtol * jnp.maximum(jnp.abs(y), jnp.abs(y_new))
    return jnp.sqrt(jnp.mean(jnp.square(err / scale)))


def initial_step(problem, cfg: LoopConfig, t0, y0, p, f0, t_end):
    """The first step size: ``ConstantStep``'s ``h``, the given ``h0``, or (``h0`` NaN) Hairer and
    Wanner's starting step (II.4), from the sizes of ``f`` and its variation."""
    if cfg.fixed_step:
        return cfg.control.h.astype(y0.dtype)
    y0, f0, p = jax.lax.stop_gradient((y0, f0, p))
    scale = cfg.atol + cfg.rtol * jnp.abs(y0)
    d0 = jnp.sqrt(jnp.mean(jnp.square(y0 / scale)))
    d1 = jnp.sqrt(jnp.mean(jnp.square(f0 / scale)))
    h_a = jnp.where((d0 < 1e-5) | (d1 < 1e-5), 1e-6, 0.01 * d0 / d1)
    span = jnp.abs(t_end - t0)
    h_a = jnp.minimum(h_a, span)
    f1 = problem.rhs(t0 + h_a, y0 + h_a * f0, p)
    d2 = jnp.sqrt(jnp.mean(jnp.square((f1 - f0) / scale))) / h_a
    big = jnp.maximum(d1, d2)
    # The local error of the error estimate grows as h^(error_order + 1).
    h_b = jnp.where(big <= 1e-15, jnp.maximum(1e-6, h_a * 1e-3), (0.01 / big) ** (1.0 / (cfg.method.error_order + 1)))
    h = jnp.minimum(100.0 * h_a, h_b)
    h = jnp.where(jnp.isfinite(h) & (h > 0), h, 1e-6 * jnp.maximum(span, 1.0))
    h = jnp.minimum(h, span).astype(y0.dtype)
    return jnp.where(jnp.isnan(cfg.h0), h, cfg.h0).astype(y0.dtype)


def init_carry(problem, cfg: LoopConfig, y0, p, t0, t_eval, discs, workspace, *, evaluate: bool = True) -> LoopState:
    """The carry before the first attempt from ``(t0, y0)``. ``evaluate=False`` leaves out the
    right-hand side and the first step size (zeros): a template whose values a replay from a
    record overwrites."""
    dtype = y0.dtype
    n, m = y0.shape[0], t_eval.shape[0]
    done = t_eval <= t0
    # Outputs not reached (a failed solve) stay NaN: no plausible-looking value.
    ys = jnp.where(done[:, None], y0[None, :], jnp.full((m, n), jnp.nan, dtype))
    i_out = jnp.sum(done).astype(jnp.int32)
    t_end = t_eval[-1]
    if cfg.steady is not None:
        t_end = jnp.where(jnp.isposinf(t_end), cfg.steady.t_end, t_end)
    if evaluate:
        f0 = problem.rhs(t0, y0, p)
        h = initial_step(problem, cfg, t0, y0, p, f0, t_end)
        if cfg.steady is not None:
            # Steady already at t0 (every finite output at or before it): the +inf outputs are y0.
            searching = (i_out < m) & jnp.isposinf(t_eval[jnp.minimum(i_out, m - 1)])
            reached = searching & is_steady(cfg.steady, f0, y0)
            ys = jnp.where((reached & (jnp.arange(m) >= i_out))[:, None], y0[None, :], ys)
            i_out = jnp.where(reached, m, i_out).astype(jnp.int32)
    else:
        f0, h = jnp.zeros_like(y0), jnp.zeros((), dtype)
    finite = jnp.all(jnp.isfinite(y0)) & jnp.all(jnp.isfinite(p))
    status = jnp.where(i_out >= m, Status.SUCCESS, RUNNING)
    status = jnp.where(finite, status, Status.NONFINITE_STATE).astype(jnp.int32)
    zero = jnp.zeros((), jnp.int32)
    counters = Counters(*([zero] * len(Counters._fields)))._replace(n_rhs=jnp.asarray(2, jnp.int32))
    return LoopState(
        t=t0, y=y0, h=h, err_prev=jnp.ones((), dtype), rejected_last=jnp.zeros((), bool), i_out=i_out,
        i_disc=jnp.sum(discs <= t0).astype(jnp.int32), ys=ys, status=status,
        method=cfg.method.start(problem, cfg, workspace, t0, y0, p, f0), counters=counters, workspace=workspace,
        last=LastStep(t0, y0, h, jnp.asarray(jnp.inf, dtype)),
    )  # fmt: skip


def attempt(problem, cfg: LoopConfig, p, t_eval, discs, c: LoopState) -> LoopState:
    """One step attempt; returns the new carry (its ``recorder`` unchanged)."""
    method = cfg.method
    dtype = c.y.dtype
    m, d = t_eval.shape[0], discs.shape[0]
    t, y, h = c.t, c.y, c.h
    fixed = cfg.fixed_step

    t_out = t_eval[jnp.minimum(c.i_out, m - 1)]
    steady = cfg.steady
    if steady is not None:
        # Past the last finite output: step on (towards the horizon) until the state is steady.
        searching = jnp.isposinf(t_out)
        t_out = jnp.where(searching, steady.t_end, t_out)
    if d:
        has_disc = c.i_disc < d
        t_disc = jnp.where(has_disc, discs[jnp.minimum(c.i_disc, d - 1)], jnp.inf)
    else:
        t_disc = jnp.asarray(jnp.inf, dtype)
    t_target = jnp.minimum(t_out, t_disc)
    remaining = t_target - t
    # Land when within round-off of the target (no sliver of a step left behind).
    lands = h >= remaining - 64 * jnp.finfo(dtype).eps * jnp.abs(t_target)
    h_try = jnp.where(lands, remaining, h)
    if method.lands_evenly and not fixed:
        # Between one and two steps from the target: two equal steps rather than a step and a sliver.
        h_try = jnp.where(~lands & (2.0 * h >= remaining), 0.5 * remaining, h_try)
    t_new = jnp.where(lands, t_target, t + h_try)
    lands_disc = lands & (t_disc <= t_out)
    t_cap = jnp.where(lands_disc, jnp.nextafter(t_target, t), jnp.inf).astype(dtype)

    proposal = method.attempt(problem, cfg, c.workspace, c.method, t, y, h_try, p, t_cap)
    y_new = proposal.y

    err = jax.lax.stop_gradient(error_norm(proposal.error, y, y_new, cfg.rtol, cfg.atol))
    finite = jnp.all(jnp.isfinite(y_new)) & jnp.isfinite(err)
    healthy = finite & proposal.linear_ok & proposal.converged
    accept = healthy if fixed else healthy & (err <= 1.0)

    if fixed:
        h_next = jnp.where(accept, cfg.control.h, 0.0)
    else:
        ctl = cfg.control
        err_safe = jnp.maximum(err, 1e-10)
        grow = ctl.safety * err_safe ** (-ctl.beta1) * c.err_prev**ctl.beta2
        fmax = jnp.where(c.rejected_last, jnp.ones((), dtype), ctl.factor_max)
        h_acc = h_try * jnp.clip(grow, ctl.factor_min, fmax)
        h_acc = jnp.where(lands, jnp.maximum(h_acc, h), h_acc)  # landing shortened the step: don't shrink for it
        shrink = jnp.where(
            healthy, jnp.clip(ctl.safety * err_safe ** (-1.0 / method.error_order), ctl.factor_min, 0.9), 0.25
        )
        h_next = jnp.where(accept, h_acc, h_try * shrink)
    method_state = method.conclude(proposal.state, accept)
    own_step = None if fixed else method.proposed_step(method_state)
    if own_step is not None:
        h_next = own_step
    h_next = jax.lax.stop_gradient(h_next).astype(dtype)

    # Outputs at t_new (all output times equal to it), discontinuities passed.
    idx = jnp.arange(m)
    write = accept & (t_eval == t_new) & (idx >= c.i_out)
    ys = jnp.where(write[:, None], y_new[None, :], c.ys)
    i_out = c.i_out + jnp.sum(write).astype(jnp.int32)
    i_disc = c.i_disc + (accept & lands_disc).astype(jnp.int32)

    n = c.counters
    work = proposal.work
    if steady is not None:
        # The test at each accepted step of the search: one right-hand side (none otherwise).
        check = accept & searching
        f_new = jax.lax.cond(
            check, lambda: problem.rhs(*jax.lax.stop_gradient((t_new, y_new, p))), lambda: jnp.zeros_like(y_new)
        )
        reached = check & is_steady(steady, f_new, y_new)
        ys = jnp.where((reached & (idx >= c.i_out))[:, None], y_new[None, :], ys)
        i_out = jnp.where(reached, m, i_out).astype(jnp.int32)
        gave_up = check & ~reached & (t_new >= steady.t_end)
        work = work._replace(n_rhs=work.n_rhs + check.astype(jnp.int32))
    counters = Counters(
        n_steps=n.n_steps + accept.astype(jnp.int32),
        n_rejected=n.n_rejected + (~accept).astype(jnp.int32),
        n_jac=n.n_jac + work.n_jac,
        n_factor=n.n_factor + work.n_factor,
        n_solves=n.n_solves + work.n_solves,
        n_ir_steps=n.n_ir_steps + work.n_ir_steps,
        n_fallbacks=n.n_fallbacks + work.n_fallbacks,
        n_rhs=n.n_rhs + work.n_rhs,
        n_attempts=n.n_attempts + 1,
        n_newton_iters=n.n_newton_iters + work.n_newton_iters,
        n_newton_failures=n.n_newton_failures + work.n_newton_failures,
    )

    tiny = 16 * jnp.finfo(dtype).eps * jnp.maximum(jnp.abs(t), jnp.abs(t_new))
    status = jnp.where(i_out >= m, Status.SUCCESS, RUNNING)
    status = jnp.where((status == RUNNING) & (counters.n_attempts >= cfg.max_steps), Status.MAX_STEPS, status)
    stuck = (status == RUNNING) & ~accept & ((h_next <= tiny) | fixed)
    cause = jnp.where(
        ~finite, Status.NONFINITE_STATE, jnp.where(~proposal.linear_ok, Status.LINEAR_SOLVE_FAILED, Status.STEP_TOO_SMALL)
    )
    status = jnp.where(stuck, cause, status).astype(jnp.int32)
    if steady is not None:
        # Out of time or out of steps while looking for it: no steady state.
        no_steady = ((status == RUNNING) & gave_up) | (searching & (status == Status.MAX_STEPS))
        status = jnp.where(no_steady, Status.STEADY_STATE_NOT_REACHED, status).astype(jnp.int32)

    def pick(new, old):
        return jnp.where(accept, new, old)

    return c._replace(
        t=pick(t_new, t), y=pick(y_new, y), h=h_next,
        err_prev=pick(jnp.maximum(err, 1e-4), c.err_prev).astype(dtype), rejected_last=~accept,
        i_out=i_out, i_disc=i_disc, ys=ys, status=status,
        method=method_state, counters=counters,
        last=LastStep(pick(t, c.last.t), pick(y, c.last.y), pick(h_try, c.last.h), pick(t_cap, c.last.cap)),
    )  # fmt: skip


def run_loop(problem, cfg, p, t_eval, discs, carry: LoopState, *, on_accept=None, until_steps=None,
             regroup: bool = False) -> LoopState:  # fmt: skip
    """Attempts until the status leaves RUNNING (or ``n_steps`` reaches ``until_steps``).

    ``on_accept(carry) -> carry`` runs after each attempt that was accepted (checkpointing).
    ``regroup``: vmapped, the lanes are regrouped as they finish where ``cfg.lanes`` says
    (:func:`regrouping`); the adjoint's short replays run in lock-step.
    """

    def cond(c: LoopState):
        go = c.status == RUNNING
        if until_steps is not None:
            go = go & (c.counters.n_steps < until_steps)
        return go

    def body(c: LoopState):
        new = attempt(problem, cfg, p, t_eval, discs, c)
        if on_accept is not None:
            accepted = new.counters.n_steps > c.counters.n_steps
            new = jax.lax.cond(accepted, on_accept, lambda x: x, new)
        return new

    return lane_while_loop(cond, body, carry, regrouping(cfg, carry.workspace) if regroup else None)


def regrouping(cfg: LoopConfig, workspace) -> LaneCompaction | None:
    """``cfg.lanes``, unless the linear solver keeps state across steps (``workspace`` leaves:
    handles whose lanes stay where they are)."""
    return None if jax.tree_util.tree_leaves(workspace) else cfg.lanes


def forward_solve(problem, cfg: LoopConfig, y0, p, t0, t_eval, discs):
    """The forward pass without records: begin (allocate factors), loop, end (release after the
    outputs). Returns ``(ys, status, stats)``."""
    workspace = begin_workspace(problem, cfg.modes.all, y0, p, t0, t_eval)
    carry = init_carry(problem, cfg, y0, p, t0, t_eval, discs, workspace)
    carry = run_loop(problem, cfg, p, t_eval, discs, carry, regroup=True)
    token = problem.prepared.end(workspace, carry.ys)
    status = carry.status + 0 * token
    return carry.ys, status, carry.counters.stats(cfg.method)
