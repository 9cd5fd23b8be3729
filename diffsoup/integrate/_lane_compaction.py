"""Lanes that finish early leave the loop: :func:`lane_while_loop` and :class:`LaneCompaction`.

Under ``jax.vmap`` a ``lax.while_loop`` runs its lanes in lock-step: every iteration computes the
body for every lane and keeps the result where that lane's condition still holds, until no lane's
does. A study whose lanes need very different numbers of steps pays its slowest lane's steps for
every lane: on the H200, a 10,000-experiment study whose every tenth experiment takes ten times the
steps cost 8.6x the same study without that tenth (issue 42).

:func:`lane_while_loop` is ``lax.while_loop`` for one lane. Vmapped while a :class:`LaneCompaction`
is in force (:func:`compacting_lanes`, which ``ds.lower(lane_mode="compact")`` sets around the
tracing of its chunk programs), it runs the lanes at full width only while more lanes are unfinished
than the next, narrower width holds (``lanes / shrink``, rounded up); then it gathers the unfinished
lanes into a program of that width, runs them there (and so on for ``levels`` widths), and scatters
their final states back. Every lane computes what it computes in lock-step (the same operations on
the same values, so the same results); what changes is how many lanes each iteration computes.

Each narrower width is one more copy of the loop body in the compiled program (compile time), so
the widths are few. Nothing is regrouped while a lane's carry holds state other lanes' computations
depend on in order (a linear solver's handles, ``Workspace`` leaves: KLU, cuDSS); the dense solver
keeps nothing across steps.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class LaneCompaction:
    """How a vmapped :func:`lane_while_loop` regroups its unfinished lanes.

    Args:
        shrink: each narrower program holds ``1 / shrink`` of the lanes of the one before (rounded
            up); the loop moves to it once no more lanes than that are unfinished.
        levels: how many narrower programs (each one more copy of the loop body to compile).
        min_lanes: loops over fewer lanes run in lock-step as they are: few lanes gain little
            (on a GPU machine ``ds.lower`` runs programs of fewer than 64 lanes on its CPU).
    """

    shrink: int = 8
    levels: int = 1
    min_lanes: int = 64

    def __post_init__(self):
        for name, low in (("shrink", 2), ("levels", 1), ("min_lanes", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"LaneCompaction.{name}={value!r} must be an integer of at least {low}.")

    def widths(self, lanes: int) -> tuple[int, ...]:
        """The lanes of each program, widest first: ``(lanes,)`` alone below ``min_lanes``."""
        out = [lanes]
        if lanes >= self.min_lanes:
            for _ in range(self.levels):
                narrower = -(-out[-1] // self.shrink)
                if narrower >= out[-1]:
                    break
                out.append(narrower)
        return tuple(out)


_IN_FORCE: contextvars.ContextVar = contextvars.ContextVar("diffsoup_lane_compaction", default=None)


@contextlib.contextmanager
def compacting_lanes(compaction: LaneCompaction | None) -> Iterator[None]:
    """Loops traced inside (by ``ds.simulate``, into its ``LoopConfig``) regroup their lanes as
    ``compaction`` says when vmapped; None: lock-step."""
    token = _IN_FORCE.set(compaction)
    try:
        yield
    finally:
        _IN_FORCE.reset(token)


def compaction_in_force() -> LaneCompaction | None:
    """The :class:`LaneCompaction` of the innermost :func:`compacting_lanes`, or None."""
    return _IN_FORCE.get()


def lane_while_loop(cond: Callable, body: Callable, carry: Any, compaction: LaneCompaction | None) -> Any:
    """``jax.lax.while_loop(cond, body, carry)`` for one lane; under ``jax.vmap`` with a
    ``compaction``, the unfinished lanes are regrouped into narrower programs as lanes finish
    (module docstring). With ``compaction`` None it is ``lax.while_loop`` itself."""
    if compaction is None:
        return jax.lax.while_loop(cond, body, carry)
    tree = jax.tree.structure(carry)
    # The functions' closures (a vmapped lane's parameters, say) become explicit operands, so that
    # the batching rule knows which are per lane and gathers them with the lanes.
    cond_jaxpr = jax.make_jaxpr(cond)(carry)
    body_jaxpr = jax.make_jaxpr(body)(carry)

    def cond_of(consts, c):
        return jax.core.eval_jaxpr(cond_jaxpr.jaxpr, consts, *jax.tree.leaves(c))[0]

    def body_of(consts, c):
        return jax.tree.unflatten(tree, jax.core.eval_jaxpr(body_jaxpr.jaxpr, consts, *jax.tree.leaves(c)))

    @jax.custom_batching.custom_vmap
    def loop(cond_consts, body_consts, c):
        return jax.lax.while_loop(functools.partial(cond_of, cond_consts), functools.partial(body_of, body_consts), c)

    @loop.def_vmap
    def regrouped(lanes, in_batched, cond_consts, body_consts, c):
        cond_batched, body_batched, carry_batched = in_batched
        c = jax.tree.map(lambda x, b: x if b else jnp.broadcast_to(x, (lanes,) + jnp.shape(x)), c, carry_batched)
        out = _run_levels(cond_of, body_of, (cond_consts, cond_batched), (body_consts, body_batched), c,
                          compaction.widths(lanes))  # fmt: skip
        return out, jax.tree.map(lambda _: True, out)

    return loop(list(cond_jaxpr.consts), list(body_jaxpr.consts), carry)


def _run_levels(cond_of, body_of, cond_in, body_in, carry, widths):
    """The lanes of ``carry`` (leading axis ``widths[0]``) until none is unfinished: lock-step at
    this width while more than ``widths[1]`` are, then the unfinished ones gathered into the next."""
    (cond_consts, cond_batched), (body_consts, body_batched) = cond_in, body_in
    active_of = jax.vmap(cond_of, in_axes=([0 if b else None for b in cond_batched], 0))
    step_of = jax.vmap(body_of, in_axes=([0 if b else None for b in body_batched], 0))
    narrower = widths[1] if len(widths) > 1 else 0

    def more_than_narrower(c):
        return jnp.sum(active_of(cond_consts, c)) > narrower

    def step(c):
        # As vmap runs a while loop: every lane computed, the result kept where its condition holds.
        active = active_of(cond_consts, c)
        new = step_of(body_consts, c)
        return jax.tree.map(lambda n, o: jnp.where(active.reshape((-1,) + (1,) * (n.ndim - 1)), n, o), new, c)

    carry = jax.lax.while_loop(more_than_narrower, step, carry)
    if not narrower:
        return carry
    active = active_of(cond_consts, carry)
    # The unfinished lanes first; the rest of the narrower program's lanes repeat a finished lane,
    # whose condition is false, so it computes nothing and is written back unchanged.
    picked = jnp.nonzero(active, size=narrower, fill_value=-1)[0]
    picked = jnp.where(picked < 0, jnp.argmin(active), picked)

    def gather(consts, batched):
        return [x[picked] if b else x for x, b in zip(consts, batched)]

    sub = _run_levels(cond_of, body_of, (gather(cond_consts, cond_batched), cond_batched),
                      (gather(body_consts, body_batched), body_batched), jax.tree.map(lambda x: x[picked], carry),
                      widths[1:])  # fmt: skip
    return jax.tree.map(lambda x, s: x.at[picked].set(s), carry, sub)
