"""The compiled chunk programs of a lowered study: :class:`ProgramKey` (everything a program is a
function of), :func:`chunk_function` (the program of a key: value, gradient by the adjoint or by
forward sensitivities, residuals, Jacobian, exact Hessian; sharded over a data mesh with
``shard_map``), the process's bounded cache of compiled programs, the chunk programs run over
several points at once (:func:`over_points`), and the sums formed on the device
(:func:`device_sum`, :func:`gauss_newton_sums`). See ``_lower``'s docstring for the whole design."""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import math
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from ...integrate import LaneCompaction, compacting_lanes
from ._problem import LaneTerms
from ._terms import member_array

# Compilation start/end records (``extra["diffsoup_compile"] = (event, what, seconds)``).
_compile_log = logging.getLogger("diffsoup.compile")


@dataclasses.dataclass(frozen=True)
class ProgramKey:
    """Everything a compiled chunk program is a function of: :func:`chunk_function` builds it from
    these fields alone, so two studies with equal keys run the same program.

    Attributes:
        kind: ``"value"``, ``"value_and_grad"`` (the adjoint's gradient), ``"forward_gradient"``,
            ``"residuals"``, ``"jacobian"`` or ``"exact"`` (the exact Hessian).
        terms: the group's :class:`~diffsoup.inference.objective._problem.LaneTerms` (problem, group,
            objective scale, estimated entries and their scales, adjoint checkpoints).
        lanes: experiments per device per chunk.
        lane_mode: ``"vmap"`` (the lanes in lock-step), ``"compact"`` (lock-step, the unfinished
            lanes regrouped as lanes finish) or ``"map"`` (one after the other).
        mesh: the mesh split over its ``"data"`` axis, or None for one device.
        platform: the default device and the x64 flag the program was traced under.
        device: the one ``jax.Device`` the program is pinned to (``ds.lower(device=...)``), or None
            for the default placement (the default device, or the mesh): host and GPU programs of
            the same study never share a key.
    """

    kind: str
    terms: LaneTerms
    lanes: int
    lane_mode: str
    mesh: Any
    platform: tuple
    device: Any = None


# The process's compiled chunk programs, most recently used last: lowering a study again with other
# tolerances, step budget or fixed values (operands, not constants, of the programs) reuses them.
# Bounded, so that programs of studies no longer used do not accumulate; a live LoweredStudy keeps
# its own programs whatever this holds.
PROGRAM_CACHE_SIZE = 32
_PROGRAMS: collections.OrderedDict = collections.OrderedDict()
_PROGRAMS_LOCK = threading.Lock()  # studies may be lowered from several threads (a Dask worker's)


def cached_program(key: ProgramKey):
    with _PROGRAMS_LOCK:
        hit = _PROGRAMS.get(key)
        if hit is not None:
            _PROGRAMS.move_to_end(key)
        return hit


def remember_program(key: ProgramKey, program) -> None:
    with _PROGRAMS_LOCK:
        _PROGRAMS[key] = program
        _PROGRAMS.move_to_end(key)
        while len(_PROGRAMS) > PROGRAM_CACHE_SIZE:
            _PROGRAMS.popitem(last=False)


# One lock per key being compiled: threads that ask for the same program at once (the batched fit's
# concurrent polishes, a Dask worker's tasks) compile it once; different programs compile in parallel.
_COMPILING: dict = {}


def compile_lock(key: ProgramKey) -> threading.Lock:
    """The lock held while the program of ``key`` is looked up and, if missing, compiled."""
    with _PROGRAMS_LOCK:
        return _COMPILING.setdefault(key, threading.Lock())


def clear_program_cache() -> None:
    """Forget the process's compiled chunk programs (live lowered studies keep theirs)."""
    with _PROGRAMS_LOCK:
        _PROGRAMS.clear()
        _COMPILING.clear()


def compile_program(key: ProgramKey, specs: tuple, what: str) -> tuple:
    """Compile :func:`chunk_function` of ``key`` for the argument ``specs`` ``(theta, arrays,
    operands)``; the compile log hears when it starts and ends (``what`` names the program: the
    command's progress lines show it). Returns ``(compiled, scratch bytes)``."""
    started = time.perf_counter()
    _compile_log.info("compiling the %s", what, extra={"diffsoup_compile": ("start", what, 0.0)})
    compiled = jax.jit(chunk_function(key)).lower(*specs).compile()
    elapsed = time.perf_counter() - started
    _compile_log.info("compiled the %s in %.1f s", what, elapsed, extra={"diffsoup_compile": ("end", what, elapsed)})
    stats = compiled.memory_analysis()
    scratch = int(getattr(stats, "temp_size_in_bytes", 0) or 0) if stats is not None else 0
    return compiled, scratch


def device_blocks(members, n_devices: int) -> np.ndarray:
    """``(devices, B)`` study indices of a group's ``members`` split in order over the devices
    (-1: padding)."""
    mine = member_array(members)
    B = math.ceil(mine.size / n_devices)
    blocks = np.full(n_devices * B, -1, dtype=np.int64)
    blocks[: mine.size] = mine
    return blocks.reshape(n_devices, B)


def platform_signature() -> tuple:
    return (str(jax.config.jax_default_device), jax.default_backend(), bool(jax.config.jax_enable_x64))


def chunk_function(key: ProgramKey):
    """The chunk program of ``key``: ``(theta, arrays, operands) -> outputs`` (see the module's
    table), a function of the key's fields only (the :class:`TermOperands` are arguments)."""
    terms, kind, mesh = key.terms, key.kind, key.mesh
    sharded = mesh is not None

    def reduce(x):
        return jax.lax.psum(x, "data") if sharded else x

    def over_lanes(fn, *per_lane):
        """``fn`` applied to every lane of ``per_lane`` (arrays with a leading lane axis)."""
        if key.lane_mode == "map":
            return jax.lax.map(lambda xs: fn(*xs), per_lane)
        # The solves traced here take the compaction into their loop settings (their adjoint too).
        with compacting_lanes(LaneCompaction() if key.lane_mode == "compact" else None):
            return jax.vmap(fn)(*per_lane)

    def lanes(theta, arrs, ops, *, forward, residuals):
        full = terms.full_vector(theta, ops)
        return over_lanes(lambda a: terms.lane(ops, full, a, forward=forward, residuals=residuals, theta=theta), arrs)

    def lanes_and_tangents(theta, arrs, ops, *, residuals):
        """The lanes' ``(outputs, their Jacobian in theta (lanes, ..., k), status, steps)`` by
        forward sensitivities. Only the entries of theta that reach the solves
        (``terms.solve_theta``) carry tangents through them; the observation is then
        differentiated in all of theta, the solves' sensitivities entering as a linear term."""
        k = theta.shape[0]
        through = terms.solve_theta
        if through is None or len(through) == k:
            def out(theta_):
                o, st, steps = lanes(theta_, arrs, ops, forward=True, residuals=residuals)
                return o, (o, st, steps)

            J, (o, st, steps) = jax.jacfwd(out, has_aux=True)(theta)
            return o, J, st, steps
        D = np.asarray(through, dtype=np.int64)

        def solved(u):
            th = theta.at[D].set(u)
            full = terms.full_vector(th, ops)
            ys, st, steps, cont = over_lanes(lambda a: terms.states(ops, full, a, th, forward=True), arrs)
            return (ys, cont), (ys, cont, st, steps)

        if D.size:
            (dys, dcont), (ys, cont, st, steps) = jax.jacfwd(solved, has_aux=True)(theta[D])
        else:  # nothing estimated reaches the solves
            (ys, cont), (_, _, st, steps) = solved(theta[D])
            dys, dcont = jax.tree.map(lambda x: jnp.zeros(x.shape + (0,), x.dtype), (ys, cont))

        def observed(theta_):
            # Equal to the solves' outputs, with their sensitivities as derivative in theta[D].
            du = theta_[D] - jax.lax.stop_gradient(theta_[D])
            ys_, cont_ = jax.tree.map(lambda x, dx: x + jnp.tensordot(dx, du, axes=1), (ys, cont), (dys, dcont))
            full = terms.full_vector(theta_, ops)
            o, _, _ = jax.vmap(lambda a, y, s, n, c: terms.from_states(ops, full, a, y, s, n, c, residuals=residuals))(
                arrs, ys_, st, steps, cont_)
            return o, o

        J, o = jax.jacfwd(observed, has_aux=True)(theta)
        return o, J, st, steps

    def total(theta, arrs, ops):
        v, st, steps = lanes(theta, arrs, ops, forward=False, residuals=False)
        return jnp.sum(v), (st, steps)

    if kind == "value":
        def local(theta, arrs, ops):
            v, st, steps = lanes(theta, arrs, ops, forward=True, residuals=False)
            return reduce(jnp.sum(v)), st, steps
        specs = ("sum", "lane", "lane")
    elif kind == "value_and_grad":
        def local(theta, arrs, ops):
            (v, (st, steps)), g = jax.value_and_grad(total, has_aux=True)(theta, arrs, ops)
            return reduce(v), reduce(g), st, steps
        specs = ("sum", "sum", "lane", "lane")
    elif kind == "forward_gradient":
        def local(theta, arrs, ops):
            v, g, st, steps = lanes_and_tangents(theta, arrs, ops, residuals=False)
            return reduce(jnp.sum(v)), reduce(jnp.sum(g, axis=0)), st, steps
        specs = ("sum", "sum", "lane", "lane")
    elif kind == "residuals":
        def local(theta, arrs, ops):
            return lanes(theta, arrs, ops, forward=True, residuals=True)
        specs = ("lane", "lane", "lane")
    elif kind == "jacobian":
        def local(theta, arrs, ops):
            return lanes_and_tangents(theta, arrs, ops, residuals=True)
        specs = ("lane", "lane", "lane", "lane")
    elif kind == "exact":
        def grad_fn(theta, arrs, ops):
            return jax.grad(total, has_aux=True)(theta, arrs, ops)

        def local(theta, arrs, ops):
            H, (st, steps) = jax.jacfwd(grad_fn, has_aux=True)(theta, arrs, ops)
            return reduce(H), st, steps
        specs = ("sum", "lane", "lane")
    else:  # pragma: no cover (internal)
        raise ValueError(kind)
    if not sharded:
        return local

    out_specs = tuple(P() if s == "sum" else P("data") for s in specs)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data"), P()), out_specs=out_specs, check_vma=False)


@dataclasses.dataclass(frozen=True)
class Program:
    """A compiled chunk program: ``lanes`` experiments per device per chunk (run as ``lane_mode``
    says), its scratch bytes."""

    mode: str
    kind: str
    lanes: int
    compiled: Any
    scratch: int
    lane_mode: str


def over_points(fn, lockstep: bool):
    """``(thetas, active, arrays, operands) -> fn``'s outputs with a leading point axis: ``fn``
    vmapped over the points (lock-step; ``active`` unused), or mapped one after the other with
    the inactive points skipped (zeros)."""
    if lockstep:
        return lambda thetas, active, arrs, ops: jax.vmap(fn, in_axes=(0, None, None))(thetas, arrs, ops)

    def one_by_one(thetas, active, arrs, ops):
        shapes = jax.eval_shape(fn, thetas[0], arrs, ops)

        def point(args):
            theta, on = args
            return jax.lax.cond(on, lambda: fn(theta, arrs, ops),
                                lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes))  # fmt: skip

        return jax.lax.map(point, (thetas, active))

    return one_by_one


def stacked_over_points(orders, experiment_indices, *per_chunk) -> tuple[np.ndarray, ...]:
    """Host arrays ``(points, lanes, R, ...)`` of the chunks (``orders``: each lane's experiment,
    -1 for padding) -> ``(points, rows, ...)``, the experiments' rows in ``experiment_indices``
    order (a later chunk of the same experiment wins), for every point at once, one result per
    array of ``per_chunk`` (the lanes found once for all): a loop over the points cost 66 us per
    point on the host, a quarter of a GPU iteration at 4,000 points."""
    where = {}
    for c, order in enumerate(orders):
        for lane in np.flatnonzero(order >= 0):
            where[int(order[lane])] = (c, int(lane))
    at = [where[i] for i in experiment_indices]
    return tuple(np.concatenate([np.asarray(chunks[c])[:, lane] for c, lane in at], axis=1) for chunks in per_chunk)


def device_sum(values):
    """The sum of per-chunk device arrays, formed on the device (in chunk order)."""
    total = values[0]
    for v in values[1:]:
        total = total + v
    return total


def gauss_newton_sums(chunks):
    """``(r^T r, J^T r, J^T J)`` over chunks of residuals ``(lanes, R)`` and their Jacobians
    ``(lanes, R, n_theta)``, formed on the device chunk by chunk (only ``(n_theta, n_theta)``
    comes back); padding lanes hold zeros and add nothing. One jitted call: the dozen eager
    operations it replaces cost about 7 % of a small study's Gauss-Newton evaluation (Bruno's)."""
    return _gauss_newton_sums_program()(tuple((r, J) for r, J in chunks))


@functools.cache
def _gauss_newton_sums_program():
    @jax.jit
    def sums(chunks):
        n_theta = chunks[0][1].shape[-1]
        ss, jtr, jtj = jnp.zeros(()), jnp.zeros(n_theta), jnp.zeros((n_theta, n_theta))
        for r, J in chunks:  # per chunk, not concatenated: a GPU study's chunks are large
            r2, J2 = r.reshape(-1), J.reshape(-1, n_theta)
            ss = ss + jnp.dot(r2, r2)
            jtr = jtr + J2.T @ r2
            jtj = jtj + J2.T @ J2
        return ss, jtr, jtj

    return sums

