"""``ds.lower``: a study compiled into chunked, sharded objective programs (a ``LoweredStudy``).

The tiled-objective pattern (DESIGN.md, ``reference/seeds/004``) with chunks of experiments as the
tiles. Experiments of one :class:`~diffsoup.inference.objective._problem.Group` (same observables, noise and
observable count; measurement times padded with the last time and masked) are stacked and
vmapped, ``lanes`` of them per chunk. Each evaluation mode has its own program:

============== =============================================== ================================
mode           program (per chunk)                             derivative
============== =============================================== ================================
value          sum of the experiments' terms                   none (forward solve)
value_and_grad value and gradient                              forward sensitivities (jacfwd) up
                                                               to 16 entries of theta, else the
                                                               checkpointed adjoint (reverse)
residuals      the residuals                                   none
jacobian       residuals and their Jacobian                    forward sensitivities (jacfwd)
hessian        ``"exact"``: jacfwd of the gradient (HVPs);      forward over reverse, or
               ``"fd"``: the gradient program, differenced      central differences of gradients
============== =============================================== ================================

Forward sensitivities carry tangents through the solves only for the entries of theta that reach
them (``LaneTerms.solve_theta``: model parameters, initial states, window starts); offsets,
scalings and spreads enter only the observation, which is differentiated in all of theta with the
solves' sensitivities as a linear term. On the benchmark collection's problems this took a
Gauss-Newton evaluation from 108 to 77 ms (Weber: 26 of 36 entries reach the solves), 89 to 72 ms
(Brannmark, 15 of 22) and 79 to 70 ms (Fujita, 16 of 19), with the same numbers to the last bit.

The compiled programs take the problem's numbers -- tolerances, step budget, fixed parameter values
(:class:`~diffsoup.inference.objective._problem.TermOperands`) -- as arguments, not constants. A program is a
function of its :class:`ProgramKey` alone (:func:`chunk_function` builds it from the key's fields),
and the process keeps its recent programs by key: lowering the same study again with another
``SolverOptions(rtol=...)``, ``max_steps`` or ``values`` traces and compiles nothing.

A mode's chunk size is chosen the first time the mode is used (or by :meth:`LoweredStudy.compile`)
from the program's scratch (``compiled.memory_analysis().temp_size_in_bytes``, the single block XLA
asks for) against the block limit -- nothing is run to find out:

* on a GPU, by default, the largest chunk that fits: a probe program of ``PROBE_LANES`` lanes is
  compiled, its scratch per lane extrapolated to the block limit (scratch grows linearly in the
  lanes; the probe's share of fixed scratch makes the estimate err small), and the program of that
  size compiled; should it not fit after all, the lanes shrink in proportion and it compiles again.
  A GPU runs lanes in parallel until it is full, so one large chunk beats many small ones
  (issue 22: 10,000 experiments in one chunk 15x faster than 40 of 250);
* on a CPU, and wherever ``experiments_per_chunk`` is given, from it (CPU default 256
  experiments), halved until it fits: a CPU core runs lanes one after the other, so beyond a few
  hundred lanes larger chunks gain nothing and only cost host memory.

``hessian="auto"`` tries the exact Hessian, then differences of gradients, at each size. The
compiled program of the chosen size is the one evaluations run. Chunk results are summed (or
concatenated) on the device and brought to the host with one transfer per evaluation.

Every evaluation first forms a typed *part* (``diffsoup.inference.objective._parts``: sums before the
objective's scale and offset, residual rows by experiment), which the public methods of
:class:`~diffsoup.inference.objective._abstract_lowered.AbstractLoweredStudy` finish. ``restrict(experiments)``
gives a lowered study of the same problem that evaluates a subset of the experiments; the parts of
the studies of a split combine (``combine_parts``) into the part of the whole, which is how
``ds.distributed.run`` spreads a study over Dask workers or processes. ``gauss_newton`` forms
``J^T J`` and ``J^T r`` on the device chunk by chunk (:func:`gauss_newton_sums`), for a whole study and
for each shard alike.

With ``layout=ds.Layout(mesh=ds.global_mesh(("data",)))`` each chunk is split over the data axis
(``shard_map``: every device runs its own lanes' solves, the sums are ``psum``-ed). Each device owns a
fixed block of experiments, the same for every mode and chunk size; with ``balance_steps=True`` the
blocks are chosen by :func:`balance_owners` weighted by the step counts measured at the nominal
point, and within a block experiments are sorted by step count so that lanes that run in lock-step
take similar numbers of steps. That pays when each device runs several chunks: with one chunk per
device, a device holding one slow experiment runs as long as one holding only slow ones (lanes run
in lock-step), so balancing evens the step totals without shortening the evaluation; give a
``experiments_per_chunk`` that makes several chunks per device when step counts differ widely.

Chunk sizes count experiments (all devices together): ``experiments_per_chunk=`` (``chunk_size=``
is its deprecated name) and :attr:`LoweredStudy.chunk_sizes`, the sizes chosen, per mode and group.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import math
import os
import threading
import time
from typing import Any, Mapping, Sequence

import numpy as np

from ..._deprecated import renamed_keyword
from ._abstract_lowered import AbstractLoweredStudy, experiment_indices
from ._parts import (
    EVALUATION_MODES,
    AbstractPart,
    GaussNewtonPart,
    GradientPart,
    HessianPart,
    JacobianPart,
    ResidualsPart,
    ValuePart,
)
from ._same_functions import DEFAULT_MAX_PROGRAM_GROUPS, check_program_groups
from ._problem import InferenceProblem, LaneTerms, SolverOptions
from ..study._study import Study
from ._terms import member_array

# The programs' modes (``gauss_newton`` evaluations run the ``jacobian`` program).
MODES = ("value", "value_and_grad", "residuals", "jacobian", "hessian")
# How the exact Hessian is computed (not which Hessian an optimizer runs on: fitting._hessians).
HESSIAN_COMPUTATIONS = ("auto", "exact", "fd")
GRADIENTS = ("auto", "adjoint", "forward")
# How a chunk's lanes run: "vmap" in lock-step (one vectorized loop, as long as its slowest lane),
# "map" one after the other inside the program (each lane takes its own steps), "auto" chosen per
# evaluation on a CPU (below), vmap elsewhere (a GPU runs lanes in parallel).
LANE_MODES = ("auto", "vmap", "map")
# lane_mode="auto" on a CPU: a lane's step run alone costs up to `cap` times its share of a step of L
# lanes in lock-step (lanes vectorize the step's small operations and share its fixed costs), about
# 1 + slope (L - 1) for few lanes. The next evaluation runs the lanes one after the other when, at the
# step counts of the last evaluation, lock-step would cost more: sum over chunks of L x (most steps)
# > min(cap, 1 + slope (L - 1)) x (sum of steps). (slope, cap) measured on the 2-core CPU (PEtab
# problems of 2-8 experiments, 5 points each): programs that carry forward tangents (0.06, 1.3) --
# the tangents vectorize each lane's step already -- values and adjoint gradients (0.25, 2.2).
SEQUENTIAL_COST = {"jacobian": (0.06, 1.3), "forward_gradient": (0.06, 1.3)}
SEQUENTIAL_COST_OTHERS = (0.25, 2.2)
# gradient="auto": forward sensitivities up to this many entries of theta, the adjoint above. Forward
# mode carries one tangent per entry through every step (their solves reuse the step's factors); the
# adjoint costs a replay and a reverse step per step whatever theta's size, and its program (a second
# loop and a step differentiated to second order) takes about twice as long to compile.
FORWARD_GRADIENT_MAX_THETA = 16
DEFAULT_CHUNK = 256  # CPU start of the chunk search (experiments); GPUs take the largest that fits
PROBE_LANES = 32  # lanes of the GPU probe program whose scratch per lane sizes the chunk
GPU_FILL = 0.9  # share of the block limit a GPU chunk is planned to fill (the estimate's margin)
BFC_BLOCK_CAP = 3.5e9
CPU_BLOCK_CAP = 2**31

# Compilation start/end records (``extra["diffsoup_compile"] = (event, what, seconds)``).
_compile_log = logging.getLogger("diffsoup.compile")


def default_block_limit(device: Any = None) -> int:
    """Largest single scratch block to plan a chunk for, in bytes.

    GPU: 3.5 GB under the BFC (JAX's default) and ``platform`` allocators, which may fail to grant
    one larger block however much memory is free (``XLA_PYTHON_CLIENT_ALLOCATOR``); otherwise 80 %
    of the device memory (never more than that in either case). CPU: 10 % of the physical memory,
    at most 2 GiB: the host's memory is shared with everything else the process holds, and chunks
    beyond that size gain nothing on a CPU.

    Args:
        device: a JAX device; None takes the first.

    Returns:
        Bytes.
    """
    import jax

    dev = device if device is not None else jax.devices()[0]
    if dev.platform == "cpu":
        try:
            phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            phys = 8 * 2**30
        return int(min(CPU_BLOCK_CAP, 0.1 * phys))
    stats = dev.memory_stats() or {}
    total = float(stats.get("bytes_limit", BFC_BLOCK_CAP / 0.8))
    allocator = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default").lower()
    share = 0.8 * total
    if allocator in ("default", "bfc", "platform"):
        return int(min(BFC_BLOCK_CAP, share))
    return int(share)


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
        lane_mode: ``"vmap"`` (the lanes in lock-step) or ``"map"`` (one after the other).
        mesh: the mesh split over its ``"data"`` axis, or None for one device.
        platform: the default device and the x64 flag the program was traced under.
    """

    kind: str
    terms: LaneTerms
    lanes: int
    lane_mode: str
    mesh: Any
    platform: tuple


# The process's compiled chunk programs, most recently used last: lowering a study again with other
# tolerances, step budget or fixed values (operands, not constants, of the programs) reuses them.
# Bounded, so that programs of studies no longer used do not accumulate; a live LoweredStudy keeps
# its own programs whatever this holds.
PROGRAM_CACHE_SIZE = 32
_PROGRAMS: collections.OrderedDict = collections.OrderedDict()
_PROGRAMS_LOCK = threading.Lock()  # studies may be lowered from several threads (a Dask worker's)


def _cached_program(key: ProgramKey):
    with _PROGRAMS_LOCK:
        hit = _PROGRAMS.get(key)
        if hit is not None:
            _PROGRAMS.move_to_end(key)
        return hit


def _remember_program(key: ProgramKey, program) -> None:
    with _PROGRAMS_LOCK:
        _PROGRAMS[key] = program
        _PROGRAMS.move_to_end(key)
        while len(_PROGRAMS) > PROGRAM_CACHE_SIZE:
            _PROGRAMS.popitem(last=False)


def clear_program_cache() -> None:
    """Forget the process's compiled chunk programs (live lowered studies keep theirs)."""
    with _PROGRAMS_LOCK:
        _PROGRAMS.clear()


def _platform_signature() -> tuple:
    import jax

    return (str(jax.config.jax_default_device), jax.default_backend(), bool(jax.config.jax_enable_x64))


def chunk_function(key: ProgramKey):
    """The chunk program of ``key``: ``(theta, arrays, operands) -> outputs`` (see the module's
    table), a function of the key's fields only (the :class:`TermOperands` are arguments)."""
    import jax
    import jax.numpy as jnp

    terms, kind, mesh = key.terms, key.kind, key.mesh
    sharded = mesh is not None

    def reduce(x):
        return jax.lax.psum(x, "data") if sharded else x

    def over_lanes(fn, *per_lane):
        """``fn`` applied to every lane of ``per_lane`` (arrays with a leading lane axis)."""
        if key.lane_mode == "vmap":
            return jax.vmap(fn)(*per_lane)
        return jax.lax.map(lambda xs: fn(*xs), per_lane)

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
    from jax.sharding import PartitionSpec as P

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


class LoweredStudy(AbstractLoweredStudy):
    """An inference problem compiled chunk by chunk on this process's devices; make it with
    :func:`lower` (or :meth:`restrict` one to a subset of its experiments).

    Args:
        problem: the :class:`InferenceProblem`.
        layout, hessian, experiments_per_chunk, block_limit_bytes, fd_step, gradient, lane_mode:
            as for :func:`lower` (``chunk_size`` too: the deprecated name of ``experiments_per_chunk``).
        experiments: study indices or ids of the experiments to evaluate (None: all).
        share_programs_with: a lowered study of the same problem and layout whose compiled programs
            this one reuses and adds to (what :meth:`restrict` passes).

    Besides :class:`AbstractLoweredStudy`'s attributes:

    Attributes:
        layout: the ``ds.Layout``; n_devices: devices along its data axis.
        groups: the problem's groups that hold experiments of this study.
        block_limit_bytes: the scratch limit per program.
        hessian_mode: ``"auto"``, ``"exact"`` or ``"fd"`` as asked; ``hessian_kind`` what was chosen.
        gradient_mode: ``"auto"``, ``"adjoint"`` or ``"forward"`` as asked; ``gradient_kind`` what
            ``value_and_grad`` (and differenced Hessians) use.
        lane_mode: ``"auto"``, ``"vmap"`` or ``"map"`` as asked; ``lane_modes`` maps ``(mode,
            group)`` to ``"vmap"`` or ``"map"``, how that mode's lanes ran at its last evaluation.
        search_log: ``(mode, group, lanes, kind, scratch_bytes, fits)`` of every program compiled
            while choosing chunk sizes.
    """

    def __init__(
        self,
        problem: InferenceProblem,
        *,
        layout: Any = None,
        hessian: str = "auto",
        experiments_per_chunk: int | None = None,
        block_limit_bytes: float | None = None,
        fd_step: float = 1e-3,
        gradient: str = "auto",
        lane_mode: str = "auto",
        experiments: Sequence[int | str] | None = None,
        share_programs_with: "LoweredStudy | None" = None,
        chunk_size: int | None = None,
    ):
        import jax

        from ..._layout import Layout

        experiments_per_chunk = renamed_keyword("LoweredStudy", "chunk_size", chunk_size, "experiments_per_chunk",
                                                experiments_per_chunk)  # fmt: skip

        if hessian not in HESSIAN_COMPUTATIONS:
            raise ValueError(f"lower: hessian={hessian!r} must be one of {HESSIAN_COMPUTATIONS}.")
        if gradient not in GRADIENTS:
            raise ValueError(f"lower: gradient={gradient!r} must be one of {GRADIENTS}.")
        if lane_mode not in LANE_MODES:
            raise ValueError(f"lower: lane_mode={lane_mode!r} must be one of {LANE_MODES}.")
        per_chunk = experiments_per_chunk
        if per_chunk is not None and (isinstance(per_chunk, bool) or not isinstance(per_chunk, int) or per_chunk < 1):
            raise ValueError(f"lower: experiments_per_chunk={per_chunk!r} must be a positive integer (experiments "
                             "per chunk, all devices together).")  # fmt: skip
        if block_limit_bytes is not None and not (float(block_limit_bytes) > 0):
            raise ValueError(f"lower: block_limit_bytes={block_limit_bytes!r} must be positive.")
        if not (float(fd_step) > 0 and math.isfinite(fd_step)):
            raise ValueError(f"lower: fd_step={fd_step!r} must be positive (a step in theta's units).")
        layout = layout if layout is not None else Layout()
        if not isinstance(layout, Layout):
            raise TypeError(f"lower: layout must be a ds.Layout, not {type(layout).__name__}.")
        other = share_programs_with
        if other is not None and not (isinstance(other, LoweredStudy) and other.problem is problem
                                      and other.layout == layout):  # fmt: skip
            raise ValueError("LoweredStudy: share_programs_with must be a LoweredStudy of the same problem and layout.")
        super().__init__(problem, experiments)
        self.layout = layout
        self.hessian_mode = hessian
        self.gradient_mode = gradient
        self.gradient_kind = gradient if gradient != "auto" else (
            "forward" if problem.n_theta <= FORWARD_GRADIENT_MAX_THETA else "adjoint"
        )
        self.hessian_kind: str | None = None if hessian == "auto" else hessian
        # None: chosen (GPUs: from device memory; CPUs: searched from DEFAULT_CHUNK).
        self.experiments_per_chunk = experiments_per_chunk
        self.fd_step = float(fd_step)
        self.n_devices = layout.data_size
        self.mesh = layout.mesh if self.n_devices > 1 else None
        devices = self.mesh.devices.reshape(-1) if self.mesh is not None else jax.devices()[:1]
        self.platform = devices[0].platform
        self.lane_mode = lane_mode
        self.block_limit_bytes = float(block_limit_bytes) if block_limit_bytes is not None else float(
            default_block_limit(devices[0])
        )
        everything = len(self.experiment_indices) == len(problem.study.experiments)
        keep = None if everything else set(self.experiment_indices)
        groups, members, group_index = [], [], []
        for index, g in enumerate(problem.groups):
            mine = g.members if everything else tuple(i for i in g.members if i in keep)
            if mine:
                groups.append(g)
                members.append(mine)
                group_index.append(index)
        self.groups = tuple(groups)
        self._members = members  # this study's experiments of each group (study indices)
        self._group_index = group_index  # each group's index in problem.groups
        self.search_log: list = []
        self._programs: dict = {}
        self._sequential_programs: dict = {}  # lane_mode="auto": (mode, group) -> lanes one after the other
        self.lane_modes: dict = {}  # (mode, group) -> how its lanes ran at its last evaluation
        # ProgramKey -> (compiled, scratch bytes), shared by restrictions (beside the process's cache).
        self._compiled: dict = other._compiled if other is not None else {}
        self._chunks: dict = {}
        self._device_operands = None
        self._blocks = [device_blocks(mine, self.n_devices) for mine in members]
        if layout.balance_steps and self.n_devices > 1:
            self.balance()

    def restrict(self, experiments: Sequence[int | str]) -> "LoweredStudy":
        """A lowered study of the same problem (the same theta, bounds and options) that evaluates
        only ``experiments`` (study indices or experiment ids). Its programs are chosen on first use;
        a program of the same group and chunk size as one this study (or another restriction of
        it) compiled is shared, not compiled again.
        Its parts (:meth:`evaluate`) combine with those of the other experiments' studies into the
        parts of the whole study.

        Raises:
            ValueError: for an experiment unknown to the study or not evaluated by this one.
        """
        chosen = experiment_indices(self.problem, experiments)
        outside = sorted(set(chosen) - set(self.experiment_indices))
        if outside:
            ids = [self.problem.study.ids[i] for i in outside]
            raise ValueError(f"restrict: experiments {ids} are not evaluated by this lowered study.")
        return LoweredStudy(self.problem, layout=self.layout, hessian=self.hessian_mode,
                            experiments_per_chunk=self.experiments_per_chunk,
                            block_limit_bytes=self.block_limit_bytes, fd_step=self.fd_step,
                            gradient=self.gradient_mode, lane_mode=self.lane_mode, experiments=chosen,
                            share_programs_with=self)  # fmt: skip

    # -- placement ------------------------------------------------------------------------------
    @property
    def placement(self) -> dict:
        """Experiment id -> index of the device (along the data axis) that solves it."""
        ids = self.problem.study.ids
        return {ids[i]: d for blocks in self._blocks for d in range(blocks.shape[0]) for i in blocks[d] if i >= 0}

    def device_loads(self) -> np.ndarray:
        """Accepted steps per device at the last evaluation (the sum over its experiments)."""
        if np.any(self.steps[list(self.experiment_indices)] < 0):
            self.value(self.nominal)
        loads = np.zeros(self.n_devices, dtype=np.int64)
        for blocks in self._blocks:
            for d in range(blocks.shape[0]):
                idx = blocks[d][blocks[d] >= 0]
                loads[d] += int(self.steps[idx].sum())
        return loads

    def balance(self, theta: Any = None) -> np.ndarray:
        """Move experiments between devices by their step counts at ``theta`` (default nominal).

        The step counts are measured by one evaluation of the value program; the experiments are
        then placed with :func:`balance_owners` (``lanes`` = devices, weight = steps) and sorted by
        steps within each device. Compiled programs stay valid (same shapes).

        Returns:
            The device loads (steps) after the move.
        """
        from ._balance import balance_owners

        self.value(self.nominal if theta is None else theta)
        exps = self.problem.study.experiments
        index = {e.id: i for i, e in enumerate(exps)}
        steps = self.steps
        D = self.n_devices
        for gi, mine in enumerate(self._members):
            ordered = balance_owners(tuple(exps[i] for i in mine), D, weight=lambda e: float(steps[index[e.id]]))
            B = self._blocks[gi].shape[1]
            blocks = np.full((D, B), -1, dtype=np.int64)
            for d in range(D):
                part = [index[e.id] for e in ordered[d * B : (d + 1) * B]]
                part.sort(key=lambda i: -steps[i])
                blocks[d, : len(part)] = part
            self._blocks[gi] = blocks
        self._chunks.clear()
        return self.device_loads()

    def _orders(self, gi: int, lanes: int) -> list[np.ndarray]:
        blocks = self._blocks[gi]
        D, B = blocks.shape
        n_chunks = math.ceil(B / lanes)
        padded = np.full((D, n_chunks * lanes), -1, dtype=np.int64)
        padded[:, :B] = blocks
        return [padded[:, j * lanes : (j + 1) * lanes].reshape(-1) for j in range(n_chunks)]

    def _chunk_data(self, gi: int, lanes: int) -> list:
        key = (gi, lanes)
        if key not in self._chunks:
            import jax

            out = []
            for order in self._orders(gi, lanes):
                arrs = self.problem.pack(self.groups[gi], order)
                if self.mesh is not None:
                    from jax.sharding import NamedSharding, PartitionSpec

                    data = jax.device_put(arrs, NamedSharding(self.mesh, PartitionSpec("data")))
                else:
                    data = jax.device_put(arrs)
                out.append((order, data))
            self._chunks[key] = out
        return self._chunks[key]

    # -- programs -------------------------------------------------------------------------------
    def _operands(self):
        """The problem's :class:`TermOperands` on the devices (replicated over the mesh), put once."""
        if self._device_operands is None:
            import jax

            ops = self.problem.operands()
            if self.mesh is not None:
                from jax.sharding import NamedSharding, PartitionSpec

                self._device_operands = jax.device_put(ops, NamedSharding(self.mesh, PartitionSpec()))
            else:
                self._device_operands = jax.device_put(ops)
        return self._device_operands

    def _function_kind(self, mode: str, kind: str) -> str:
        """The :class:`ProgramKey` kind that runs ``mode`` (``kind``: the Hessian's, for that mode)."""
        fn_kind = {"exact": "exact", "fd": "value_and_grad"}.get(kind, mode) if mode == "hessian" else mode
        if fn_kind == "value_and_grad" and self.gradient_kind == "forward":
            fn_kind = "forward_gradient"
        return fn_kind

    def _compile(self, mode: str, kind: str, gi: int, lanes: int, lane_mode: str | None = None) -> Program:
        import jax

        fn_kind = self._function_kind(mode, kind)
        # Chunk sizes are searched with the lanes in lock-step; "auto" adds the sequential program of
        # the chosen size when an evaluation asks for it (_sequential_program).
        lane_mode = lane_mode or ("map" if self.lane_mode == "map" else "vmap")
        # Differenced Hessians run the gradient program; a program is shared by every study with the
        # same key: restrictions of this one, and lowerings of the same study with other numbers.
        key = ProgramKey(fn_kind, self.problem.terms(self.groups[gi]), lanes, lane_mode, self.mesh,
                         _platform_signature())  # fmt: skip
        hit = self._compiled.get(key) or _cached_program(key)
        if hit is None:
            group = self.groups[gi]
            example = self.problem.pack(group, [self._members[gi][0]] * (lanes * self.n_devices))
            ops = self.problem.operands()
            if self.mesh is not None:
                from jax.sharding import NamedSharding, PartitionSpec

                lane_sh = NamedSharding(self.mesh, PartitionSpec("data"))
                rep = NamedSharding(self.mesh, PartitionSpec())
            else:
                lane_sh = rep = None
            arr_spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=lane_sh), example)
            theta_spec = jax.ShapeDtypeStruct((self.problem.n_theta,), np.float64, sharding=rep)
            ops_spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=rep), ops)
            label = {"value_and_grad": "value_and_grad (adjoint)",
                     "forward_gradient": "value_and_grad (forward sensitivities)"}.get(fn_kind, fn_kind)  # fmt: skip
            one_by_one = ", one after the other" if lane_mode == "map" and lanes > 1 else ""
            what = f"{label} program of {self.problem.study.problem.spec.name!r}, group {gi}, " \
                   f"{lanes * self.n_devices} experiment(s) per chunk{one_by_one}"  # fmt: skip
            started = time.perf_counter()
            # A listener (the command's progress lines) hears when a compilation starts and ends.
            _compile_log.info("compiling the %s", what, extra={"diffsoup_compile": ("start", what, 0.0)})
            compiled = jax.jit(chunk_function(key)).lower(theta_spec, arr_spec, ops_spec).compile()
            elapsed = time.perf_counter() - started
            _compile_log.info("compiled the %s in %.1f s", what, elapsed,
                              extra={"diffsoup_compile": ("end", what, elapsed)})  # fmt: skip
            stats = compiled.memory_analysis()
            scratch = int(getattr(stats, "temp_size_in_bytes", 0) or 0) if stats is not None else 0
            hit = (compiled, scratch)
            _remember_program(key, hit)
        self._compiled[key] = hit
        return Program(mode, kind, lanes, hit[0], hit[1], lane_mode)

    def _sequential_program(self, prog: Program, gi: int) -> Program:
        """``prog`` with its lanes run one after the other (compiled on first use)."""
        key = (prog.mode, gi)
        if key not in self._sequential_programs:
            self._sequential_programs[key] = self._compile(prog.mode, prog.kind, gi, prog.lanes, "map")
        return self._sequential_programs[key]

    def _runs_sequentially(self, prog: Program, gi: int) -> bool:
        """``lane_mode="auto"`` on a CPU: whether the next evaluation of group ``gi`` runs its lanes
        one after the other, judged from the step counts of the last evaluation
        (``SEQUENTIAL_COST``); lock-step while any is unknown."""
        if self.lane_mode != "auto" or self.platform != "cpu" or prog.lanes == 1:
            return False
        orders = np.stack(self._orders(gi, prog.lanes)).reshape(-1, self.n_devices, prog.lanes)  # chunk, device, lane
        real = orders >= 0
        steps = np.where(real, self.steps[np.maximum(orders, 0)], 0).astype(np.float64)
        if np.any(steps[real] < 0):
            return False
        steps[~real] = steps[real].mean()  # a padding lane solves a copy of some experiment
        # A chunk takes as long as its busiest device.
        lockstep = float(np.sum(np.max(prog.lanes * steps.max(axis=2), axis=1)))
        sequential = float(np.sum(np.max(steps.sum(axis=2), axis=1)))
        slope, cap = SEQUENTIAL_COST.get(self._function_kind(prog.mode, prog.kind), SEQUENTIAL_COST_OTHERS)
        return lockstep > min(cap, 1.0 + slope * (prog.lanes - 1)) * sequential

    def _program(self, mode: str, gi: int) -> Program:
        key = (mode, gi)
        if key in self._programs:
            return self._programs[key]
        if mode == "hessian":
            kinds = ("exact", "fd") if self.hessian_mode == "auto" else (self.hessian_mode,)
        else:
            kinds = (mode,)
        B = self._blocks[gi].shape[1]
        fill_device = self.platform != "cpu" and self.experiments_per_chunk is None
        first = self._largest_fitting_lanes(mode, kinds[0], gi, B) if fill_device else (
            min(math.ceil((self.experiments_per_chunk or DEFAULT_CHUNK) / self.n_devices), B))  # fmt: skip
        n_chunks = math.ceil(B / first)
        while True:
            lanes = math.ceil(B / n_chunks)  # chunks of equal size: no chunk mostly padding
            for kind in kinds:
                prog = self._compile(mode, kind, gi, lanes)
                fits = prog.scratch <= self.block_limit_bytes
                self.search_log.append((mode, gi, lanes * self.n_devices, kind, prog.scratch, fits))
                if fits:
                    self._programs[key] = prog
                    if mode == "hessian":
                        self.hessian_kind = kind
                    return prog
            if lanes == 1:
                raise RuntimeError(
                    f"lower: the {mode!r} program of one experiment per device needs {prog.scratch} bytes of "
                    f"scratch, above block_limit_bytes={self.block_limit_bytes:.0f}; raise the limit, loosen "
                    "max_steps/checkpoints, or use more devices."
                )
            if fill_device:  # the extrapolation erred: shrink in proportion (at least one chunk more)
                shrunk = max(1, int(lanes * GPU_FILL * self.block_limit_bytes / max(prog.scratch, 1)))
                n_chunks = max(n_chunks + 1, math.ceil(B / shrunk))
            else:
                n_chunks *= 2

    def _largest_fitting_lanes(self, mode: str, kind: str, gi: int, B: int) -> int:
        """Lanes per device of the largest chunk of group ``gi`` whose scratch fits the block
        limit, extrapolated from the scratch of a probe program of ``PROBE_LANES`` lanes."""
        probe_lanes = min(PROBE_LANES, B)
        probe = self._compile(mode, kind, gi, probe_lanes)
        self.search_log.append((mode, gi, probe_lanes * self.n_devices, kind, probe.scratch, "probe"))
        if probe_lanes == B:
            return B
        per_lane = max(probe.scratch, 1) / probe_lanes
        return max(1, min(B, int(GPU_FILL * self.block_limit_bytes / per_lane)))

    def compile(self, modes: Sequence[str] = ("value", "value_and_grad", "jacobian")) -> "LoweredStudy":
        """Choose chunk sizes and compile the programs of ``modes`` now (otherwise on first use).

        With ``lane_mode="auto"`` on a CPU this includes each chunk's program with its lanes one
        after the other, so that no later evaluation of these modes compiles."""
        for mode in modes:
            if mode not in EVALUATION_MODES:
                raise ValueError(f"compile: unknown mode {mode!r}; modes are {EVALUATION_MODES}.")
            mode = "jacobian" if mode == "gauss_newton" else mode  # Gauss-Newton runs the Jacobian program
            for gi in range(len(self.groups)):
                prog = self._program(mode, gi)
                if self.lane_mode == "auto" and self.platform == "cpu" and prog.lanes > 1:
                    self._sequential_program(prog, gi)
        return self

    @property
    def scratch_bytes(self) -> dict:
        """Mode -> scratch bytes of its largest chunk program (modes compiled so far)."""
        out: dict = {}
        for (mode, _), prog in self._programs.items():
            out[mode] = max(out.get(mode, 0), prog.scratch)
        return out

    @property
    def chunk_sizes(self) -> dict:
        """Mode -> experiments per chunk (all devices together), one entry per group: the sizes
        chosen (``experiments_per_chunk`` is the size asked for)."""
        out: dict = {}
        for (mode, gi), prog in sorted(self._programs.items(), key=lambda kv: kv[0]):
            out.setdefault(mode, []).append(prog.lanes * self.n_devices)
        return out

    # -- evaluation -----------------------------------------------------------------------------
    def _dispatch(self, mode: str, theta: np.ndarray, groups: Sequence[int] | None = None):
        """Run every chunk of ``mode`` (of ``groups``, default all); return (per-chunk outputs,
        orders) without transferring anything to the host."""
        outs, orders = [], []
        for gi in range(len(self.groups)) if groups is None else groups:
            prog = self._program(mode, gi)
            if self._runs_sequentially(prog, gi):
                prog = self._sequential_program(prog, gi)
            self.lane_modes[(mode, gi)] = prog.lane_mode
            for order, data in self._chunk_data(gi, prog.lanes):
                outs.append(prog.compiled(theta, data, self._operands()))
                orders.append(order)
        return outs, orders

    def _bookkeeping(self, orders, statuses, steps) -> dict:
        """``failures`` (id -> Status) and ``steps`` (index -> steps) of the chunks' real lanes; a
        later chunk of the same experiment (differenced Hessians) overwrites an earlier one."""
        from ...integrate import Status

        failures: dict = {}
        counts: dict = {}
        ids = None
        for order, st, ns in zip(orders, statuses, steps):
            st, ns = np.asarray(st), np.asarray(ns)
            real = order >= 0
            counts.update(zip(order[real].tolist(), ns[real].tolist()))
            bad = real & (st != 0)
            if bad.any():
                ids = self.problem.study.ids if ids is None else ids
                failures.update((ids[i], Status(s)) for i, s in zip(order[bad].tolist(), st[bad].tolist()))
        return {"failures": failures, "steps": counts}

    @staticmethod
    def _rows(orders, per_chunk) -> dict:
        """Per-chunk lane arrays ``(lanes, R, ...)`` -> experiment index -> its ``(R, ...)``."""
        rows = {}
        for order, arr in zip(orders, per_chunk):
            for lane, i in enumerate(order):
                if i >= 0:
                    rows[int(i)] = np.asarray(arr[lane])
        return rows

    def compute(self, mode: str, theta: np.ndarray) -> AbstractPart:
        """The part of ``mode`` at ``theta``: every chunk runs on the device, the chunks' sums are
        formed there, and one transfer brings the part to the host."""
        import jax

        if mode == "value":
            outs, orders = self._dispatch("value", theta)
            v, st, ns = jax.device_get((_device_sum([o[0] for o in outs]), [o[1] for o in outs], [o[2] for o in outs]))
            return ValuePart(value=float(v), **self._bookkeeping(orders, st, ns))
        if mode == "value_and_grad":
            outs, orders = self._dispatch("value_and_grad", theta)
            v, g = _device_sum([o[0] for o in outs]), _device_sum([o[1] for o in outs])
            v, g, st, ns = jax.device_get((v, g, [o[2] for o in outs], [o[3] for o in outs]))
            return GradientPart(value=float(v), grad=np.asarray(g), **self._bookkeeping(orders, st, ns))
        if mode == "residuals":
            outs, orders = self._dispatch("residuals", theta)
            r, st, ns = jax.device_get(tuple([o[i] for o in outs] for i in range(3)))
            return ResidualsPart(residuals=self._rows(orders, r), **self._bookkeeping(orders, st, ns))
        if mode == "jacobian":
            outs, orders = self._dispatch("jacobian", theta)
            r, J, st, ns = jax.device_get(tuple([o[i] for o in outs] for i in range(4)))
            return JacobianPart(residuals=self._rows(orders, r), jacobian=self._rows(orders, J),
                                **self._bookkeeping(orders, st, ns))  # fmt: skip
        if mode == "gauss_newton":
            outs, orders = self._dispatch("jacobian", theta)
            sums = gauss_newton_sums([(o[0], o[1]) for o in outs])
            (ss, jtr, jtj), st, ns = jax.device_get((sums, [o[2] for o in outs], [o[3] for o in outs]))
            return GaussNewtonPart(sum_sq=float(ss), jtr=np.asarray(jtr), jtj=np.asarray(jtj),
                                   **self._bookkeeping(orders, st, ns))  # fmt: skip
        if mode == "hessian":
            return self._hessian_part(theta)
        raise ValueError(f"evaluate: unknown mode {mode!r}; modes are {EVALUATION_MODES}.")

    def _hessian_part(self, theta: np.ndarray) -> HessianPart:
        """Exact (forward over reverse) or central differences of gradients (step ``fd_step`` in
        theta's units), group by group as each group's program was chosen; not symmetrised."""
        import jax
        import jax.numpy as jnp

        k, h = self.problem.n_theta, self.fd_step
        H = None
        statuses, steps, all_orders = [], [], []
        for gi in range(len(self.groups)):
            if self._program("hessian", gi).kind == "exact":
                outs, orders = self._dispatch("hessian", theta, [gi])
                part = _device_sum([o[0] for o in outs])
                statuses += [o[1] for o in outs]
                steps += [o[2] for o in outs]
                all_orders += orders
            else:
                cols = []
                for i in range(k):
                    e = np.zeros(k)
                    e[i] = h
                    grads = []
                    for sign in (1.0, -1.0):
                        outs, orders = self._dispatch("hessian", theta + sign * e, [gi])
                        grads.append(_device_sum([o[1] for o in outs]))
                        statuses += [o[2] for o in outs]
                        steps += [o[3] for o in outs]
                        all_orders += orders
                    cols.append((grads[0] - grads[1]) / (2 * h))
                part = jnp.stack(cols, axis=1)
            H = part if H is None else H + part
        H, st, ns = jax.device_get((H, statuses, steps))
        return HessianPart(hessian=np.asarray(H), **self._bookkeeping(all_orders, st, ns))

    def residuals_and_jacobians(self, thetas, active=None) -> tuple[np.ndarray, np.ndarray, tuple]:
        """Residuals and Jacobians at ``s`` points at once (``AbstractLoweredStudy``'s contract):
        each chunk's Jacobian program run over the points within one program (compiled once per
        number of points), one transfer for all of them. The points are lanes as the experiments
        are: in lock-step (``vmap``) on a GPU or with ``lane_mode="vmap"``; one after the other
        (``lax.map``, each point's experiments too) on a CPU under ``"auto"`` and with ``"map"``,
        where lock-step makes every point take as many steps as the stiffest one (Boehm, 8 points
        of 21 to 251 steps: 37 ms of CPU in lock-step, 29 ms one after the other), and where a
        point that ``active`` marks False is skipped (NaN residuals)."""
        import jax

        thetas = np.atleast_2d(np.asarray(thetas, dtype=np.float64))
        if thetas.ndim != 2 or thetas.shape[1] != self.problem.n_theta:
            raise ValueError(f"residuals_and_jacobians: thetas has shape {thetas.shape}; expected (s, {self.problem.n_theta}).")
        if self.mesh is not None:
            raise ValueError("residuals_and_jacobians: points as lanes need a lowered study on one device; lower it "
                             "without a data mesh (layout=None) for method='batched'.")  # fmt: skip
        active = np.ones(len(thetas), dtype=bool) if active is None else np.asarray(active, dtype=bool)
        outs, orders = [], []
        for gi in range(len(self.groups)):
            prog = self._program("jacobian", gi)
            lockstep = self.lane_mode == "vmap" or (self.lane_mode == "auto" and self.platform != "cpu")
            # One after the other over the points, and over each point's experiments as well (a
            # chunk of Bruno's 6 experiments in lock-step took 21 ms per point, 12 ms alone).
            key = ("points", lockstep, ProgramKey("jacobian", self.problem.terms(self.groups[gi]), prog.lanes,
                                                  prog.lane_mode if lockstep else "map", None,
                                                  _platform_signature()))  # fmt: skip
            if key not in self._compiled:  # jit compiles it once per number of points
                self._compiled[key] = jax.jit(_over_points(chunk_function(key[2]), lockstep))
            for order, data in self._chunk_data(gi, prog.lanes):
                outs.append(self._compiled[key](thetas, active, data, self._operands()))
                orders.append(order)
        r, J, st, ns = jax.device_get(tuple([o[i] for o in outs] for i in range(4)))
        residuals, jacobians, failures = [], [], []
        for p in range(thetas.shape[0]):
            residuals.append(self._stacked(self._rows(orders, [x[p] for x in r])))
            jacobians.append(self._stacked(self._rows(orders, [x[p] for x in J])))
            failures.append(self._bookkeeping(orders, [x[p] for x in st], [x[p] for x in ns])["failures"])
            if failures[-1] or not active[p]:
                residuals[-1] = np.full_like(residuals[-1], np.nan)
        return np.stack(residuals), np.stack(jacobians), tuple(failures)

    def __repr__(self) -> str:
        n, total = len(self.experiment_indices), len(self.problem.study.experiments)
        which = f"{n} experiments" if n == total else f"{n} of {total} experiments"
        return f"LoweredStudy({which}, theta={self.problem.n_theta}, devices={self.n_devices}, chunks={self.chunk_sizes})"


def _over_points(fn, lockstep: bool):
    """``(thetas, active, arrays, operands) -> fn``'s outputs with a leading point axis: ``fn``
    vmapped over the points (lock-step; ``active`` unused), or mapped one after the other with
    the inactive points skipped (zeros)."""
    import jax
    import jax.numpy as jnp

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


def device_blocks(members, n_devices: int) -> np.ndarray:
    """``(devices, B)`` study indices of a group's ``members`` split in order over the devices
    (-1: padding)."""
    mine = member_array(members)
    B = math.ceil(mine.size / n_devices)
    blocks = np.full(n_devices * B, -1, dtype=np.int64)
    blocks[: mine.size] = mine
    return blocks.reshape(n_devices, B)


def _device_sum(values):
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
    import jax
    import jax.numpy as jnp

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


def lower(
    study: Study | InferenceProblem,
    *,
    objective: str | None = None,
    parameters: Sequence[str] | None = None,
    values: Mapping[str, float] | None = None,
    solver: SolverOptions | None = None,
    layout: Any = None,
    hessian: str = "auto",
    experiments_per_chunk: int | None = None,
    block_limit_bytes: float | None = None,
    fd_step: float = 1e-3,
    gradient: str = "auto",
    lane_mode: str = "auto",
    chunk_size: int | None = None,
    max_program_groups: int = DEFAULT_MAX_PROGRAM_GROUPS,
) -> LoweredStudy:
    """Lower a study (or an :class:`InferenceProblem`) into chunked, sharded objective programs.

    Args:
        study: a ``ds.Study`` or an ``InferenceProblem``.
        objective: ``"nll"`` (default) or ``"chi2"``; with an ``InferenceProblem``, leave it None.
        parameters, values, solver: as for :class:`InferenceProblem` (Study only).
        layout: ``ds.Layout(mesh=ds.global_mesh(("data",)), balance_steps=...)`` to shard
            experiments over the data axis; None for one device.
        hessian: ``"exact"`` (forward-over-reverse products), ``"fd"`` (central differences of
            gradients) or ``"auto"`` (exact where it fits under the block limit).
        experiments_per_chunk: experiments per chunk (all devices together) to start the search
            from, capped at the group's size and halved until the program fits. Default: on a GPU
            the largest chunk that fits the block limit (extrapolated from a probe program's
            scratch), on a CPU 256.
        block_limit_bytes: the largest scratch block a program may ask for; None reads
            :func:`default_block_limit` from the device.
        fd_step: the difference step for ``hessian="fd"``, in theta's units (scaled parameters).
        gradient: how ``value_and_grad`` differentiates the solves: ``"adjoint"`` (the checkpointed
            adjoint), ``"forward"`` (forward sensitivities, one tangent per entry of theta) or
            ``"auto"`` (forward up to ``FORWARD_GRADIENT_MAX_THETA`` entries, where it runs and
            compiles faster, the adjoint above). Both are exact derivatives of the discrete
            solution; they agree to rounding.
        lane_mode: how the experiments of a chunk run: ``"vmap"`` in lock-step (one vectorized
            loop, which runs until its slowest experiment is done), ``"map"`` one after the other
            within the program (each takes only its own steps), or ``"auto"`` (default): on a GPU,
            which runs lanes in parallel, ``"vmap"``; on a CPU, per evaluation, ``"map"`` when the
            step counts of the last evaluation differ so much between lanes that lock-step would
            cost more (``SEQUENTIAL_COST``; the second program compiles when first
            needed, or with ``.compile()``). The same numbers either way, to rounding.
        chunk_size: the deprecated name of ``experiments_per_chunk`` (warns).
        max_program_groups: the most groups of experiments (each compiles its own program per
            mode) the lowering accepts; past it ``lower`` raises before compiling anything.
            Experiments given equivalent functions (the same code with the same constants) share a
            group.

    Returns:
        A :class:`LoweredStudy`; programs compile on first use of each mode (or ``.compile()``).

    Raises:
        ValueError, TypeError: for bad options, problem options given with an InferenceProblem, or
            more groups than ``max_program_groups``.
    """
    if isinstance(study, InferenceProblem):
        given = [n for n, v in (("objective", objective), ("parameters", parameters), ("values", values),
                                ("solver", solver)) if v is not None]  # fmt: skip
        if given:
            raise ValueError(f"lower: {given} belong to the InferenceProblem; set them there, not on lower().")
        problem = study
    elif isinstance(study, Study):
        problem = InferenceProblem(study, parameters, objective=objective or "nll", values=values,
                                   solver=solver or SolverOptions())  # fmt: skip
    else:
        raise TypeError(f"lower: study must be a ds.Study or ds.inference.InferenceProblem, not {type(study).__name__}.")
    check_program_groups(problem, max_program_groups)
    experiments_per_chunk = renamed_keyword("lower", "chunk_size", chunk_size, "experiments_per_chunk",
                                            experiments_per_chunk)  # fmt: skip
    return LoweredStudy(problem, layout=layout, hessian=hessian, experiments_per_chunk=experiments_per_chunk,
                        block_limit_bytes=block_limit_bytes, fd_step=fd_step, gradient=gradient,
                        lane_mode=lane_mode)  # fmt: skip
