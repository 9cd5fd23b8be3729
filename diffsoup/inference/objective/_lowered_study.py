"""The :class:`LoweredStudy`: an inference problem compiled chunk by chunk on this process's
devices -- its experiments placed on the devices (and balanced by step counts), chunk sizes chosen
against the block limit, chunks packed and put on the devices once, every evaluation mode run
chunk by chunk into a typed part, and ``restrict`` to a subset of the experiments. Made by
``ds.lower`` (``_lower``, whose docstring describes the design); the programs it runs are
``_chunk_programs``'."""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..._deprecated import renamed_keyword
from ...integrate import Status
from ...linear import CuDSS
from . import _program_device as program_devices
from ._abstract_lowered import AbstractLoweredStudy, experiment_indices
from ._balance import balance_owners
from ._chunk_programs import (
    Program,
    ProgramKey,
    cached_program,
    chunk_function,
    compile_lock,
    compile_program,
    device_blocks,
    device_sum,
    gauss_newton_sums,
    over_points,
    platform_signature,
    remember_program,
    stacked_over_points,
)
from ._lane_mode_rule import lane_mode_costs, next_lane_mode
from ._lowering_options import (
    DEFAULT_CHUNK,
    FORWARD_GRADIENT_MAX_THETA,
    GPU_FILL,
    PROBE_LANES,
    check_lowering_options,
    default_block_limit,
)
from ._parts import (EVALUATION_MODES, AbstractPart, GaussNewtonPart, GradientPart, HessianPart, JacobianPart,
                     ResidualsPart, ValuePart)
from ._problem import InferenceProblem


class LoweredStudy(AbstractLoweredStudy):
    """An inference problem compiled chunk by chunk on this process's devices; make it with
    :func:`lower` (or :meth:`restrict` one to a subset of its experiments).

    Args:
        problem: the :class:`InferenceProblem`.
        layout, hessian, experiments_per_chunk, block_limit_bytes, fd_step, gradient, lane_mode, device:
            as for :func:`lower` (``chunk_size`` too: the deprecated name of ``experiments_per_chunk``).
        experiments: study indices or ids of the experiments to evaluate (None: all).
        share_programs_with: a lowered study of the same problem and layout whose compiled programs
            this one reuses and adds to (what :meth:`restrict` passes).

    Besides :class:`AbstractLoweredStudy`'s attributes:

    Attributes:
        layout: the ``ds.Layout``; n_devices: devices along its data axis.
        groups: the problem's groups that hold experiments of this study.
        block_limit_bytes: the scratch limit per program (of the evaluations' device).
        device_option: ``"auto"``, ``"default"`` or a ``jax.Device``, as asked; ``device`` the
            ``jax.Device`` evaluations run on (None: the default device or mesh); ``devices_used``
            maps each mode run so far to where it ran (points as lanes: ``"jacobian (points)"``).
        hessian_mode: ``"auto"``, ``"exact"`` or ``"fd"`` as asked; ``hessian_kind`` what was chosen.
        gradient_mode: ``"auto"``, ``"adjoint"`` or ``"forward"`` as asked; ``gradient_kind`` what
            ``value_and_grad`` (and differenced Hessians) use.
        lane_mode: ``"auto"``, ``"vmap"``, ``"compact"`` or ``"map"`` as asked; ``lane_modes`` maps
            ``(mode, group)`` to how that mode's lanes ran at its last evaluation.
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
        device: Any = "auto",
    ):
        experiments_per_chunk = renamed_keyword("LoweredStudy", "chunk_size", chunk_size, "experiments_per_chunk",
                                                experiments_per_chunk)  # fmt: skip

        layout = check_lowering_options(hessian=hessian, gradient=gradient, lane_mode=lane_mode,
                                        experiments_per_chunk=experiments_per_chunk,
                                        block_limit_bytes=block_limit_bytes, fd_step=fd_step, layout=layout)
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
        self.platform = devices[0].platform  # of the default placement (_platform: of a program's device)
        self._default_device = devices[0]
        self.lane_mode = lane_mode
        self.device_option = program_devices.check_device_option(device, self.n_devices)
        self._block_limit_asked = block_limit_bytes
        self.devices_used: dict = {}  # mode -> where its programs ran
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
        self._variants: dict = {}  # lane_mode="auto": (mode, group, device, lane mode) -> the chunk's other program
        self.lane_modes: dict = {}  # (mode, group) -> how its lanes ran at its last evaluation
        # ProgramKey -> (compiled, scratch bytes), shared by restrictions (beside the process's cache).
        self._compiled: dict = other._compiled if other is not None else {}
        self._chunks: dict = {}
        self._device_operands: dict = {}  # device (None: default placement) -> operands there
        self._blocks = [device_blocks(mine, self.n_devices) for mine in members]
        lanes = self._lanes_per_program()
        self.device = self._device_for(lanes)  # where evaluations run; points as lanes only add lanes
        if self.device_option == "auto" and self.device is not None:
            program_devices.announce_host(problem.study.problem.spec.name, lanes)
        self.block_limit_bytes = self._block_limit(self.device)
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
                            block_limit_bytes=self._block_limit_asked, fd_step=self.fd_step,
                            gradient=self.gradient_mode, lane_mode=self.lane_mode, experiments=chosen,
                            share_programs_with=self, device=self.device_option)  # fmt: skip

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

    # -- devices (_program_device) ---------------------------------------------------------------
    def _lanes_per_program(self, points: int = 1) -> int:
        """The most lanes one program of an evaluation runs at once: the largest group's
        experiments (at most ``experiments_per_chunk``), times ``points`` where points are lanes."""
        most = max(b.shape[1] * self.n_devices for b in self._blocks)
        return points * min(most, self.experiments_per_chunk or most)

    def _device_for(self, lanes: int) -> jax.Device | None:
        """Where programs of ``lanes`` lanes run (``program_device``); None: the default placement."""
        solver = getattr(self.problem.study.problem, "linear_solver", None)
        choice = program_devices.program_device(program_devices.default_backend(), lanes, self.mesh,
                                                self.device_option, host_can_run=not isinstance(solver, CuDSS))
        return program_devices.resolve_device(choice)

    def _platform(self, device: jax.Device | None) -> str:  # of a program's device
        return device.platform if device is not None else self.platform

    def _block_limit(self, device: jax.Device | None) -> float:
        asked = self._block_limit_asked
        return float(asked) if asked is not None else float(default_block_limit(device or self._default_device))

    def _orders(self, gi: int, lanes: int) -> list[np.ndarray]:
        blocks = self._blocks[gi]
        D, B = blocks.shape
        n_chunks = math.ceil(B / lanes)
        padded = np.full((D, n_chunks * lanes), -1, dtype=np.int64)
        padded[:, :B] = blocks
        return [padded[:, j * lanes : (j + 1) * lanes].reshape(-1) for j in range(n_chunks)]

    def _lane_orders(self, gi: int, lanes: int) -> np.ndarray:
        """``(chunk, device, lane)`` experiment indices of group ``gi`` (-1: padding)."""
        return np.stack(self._orders(gi, lanes)).reshape(-1, self.n_devices, lanes)

    def _chunk_data(self, gi: int, lanes: int, device: jax.Device | None) -> list:
        key = (gi, lanes, device)
        if key not in self._chunks:
            out = []
            lane_sharding = program_devices.program_shardings(device, self.mesh)[0]
            for order in self._orders(gi, lanes):
                arrs = self.problem.pack(self.groups[gi], order)
                out.append((order, jax.device_put(arrs, lane_sharding)))
            self._chunks[key] = out
        return self._chunks[key]

    # -- programs -------------------------------------------------------------------------------
    def _operands(self, device: jax.Device | None):
        """The problem's :class:`TermOperands` on ``device`` (replicated over the mesh), put once."""
        if device not in self._device_operands:
            replicated = program_devices.program_shardings(device, self.mesh)[1]
            self._device_operands[device] = jax.device_put(self.problem.operands(), replicated)
        return self._device_operands[device]

    def _function_kind(self, mode: str, kind: str) -> str:
        """The :class:`ProgramKey` kind that runs ``mode`` (``kind``: the Hessian's, for that mode)."""
        fn_kind = {"exact": "exact", "fd": "value_and_grad"}.get(kind, mode) if mode == "hessian" else mode
        if fn_kind == "value_and_grad" and self.gradient_kind == "forward":
            fn_kind = "forward_gradient"
        return fn_kind

    def _compile(self, mode: str, kind: str, gi: int, lanes: int, device: jax.Device | None,
                 lane_mode: str | None = None) -> Program:  # fmt: skip
        fn_kind = self._function_kind(mode, kind)
        # "auto" adds the other program of the chosen size when an evaluation asks for it (_variant).
        lane_mode = lane_mode or (self.lane_mode if self.lane_mode in ("map", "compact") else "vmap")
        # Differenced Hessians run the gradient program; a program is shared by every study with the
        # same key: restrictions of this one, and lowerings of the same study with other numbers.
        key = ProgramKey(fn_kind, self.problem.terms(self.groups[gi]), lanes, lane_mode, self.mesh,
                         platform_signature(), device)  # fmt: skip
        with compile_lock(key):  # a program asked for by several threads at once is compiled once
            hit = self._compiled.get(key) or cached_program(key)
            if hit is None:
                hit = self._compile_new(key, gi, device)
                remember_program(key, hit)
        self._compiled[key] = hit
        return Program(mode, kind, lanes, hit[0], hit[1], lane_mode)

    def _compile_new(self, key: ProgramKey, gi: int, device: jax.Device | None) -> tuple:
        """Compile the chunk program of ``key`` (group ``gi``, on ``device``), announced to the
        compile log (:func:`compile_program`); returns ``(compiled, scratch bytes)``."""
        lanes, lane_mode, fn_kind = key.lanes, key.lane_mode, key.kind
        group = self.groups[gi]
        example = self.problem.pack(group, [self._members[gi][0]] * (lanes * self.n_devices))
        ops = self.problem.operands()
        lane_sh, rep = program_devices.program_shardings(device, self.mesh)
        arr_spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=lane_sh), example)
        theta_spec = jax.ShapeDtypeStruct((self.problem.n_theta,), np.float64, sharding=rep)
        ops_spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=rep), ops)
        label = {"value_and_grad": "value_and_grad (adjoint)",
                 "forward_gradient": "value_and_grad (forward sensitivities)"}.get(fn_kind, fn_kind)  # fmt: skip
        one_by_one = {"map": ", one after the other", "compact": ", lanes regrouped as they finish"}.get(
            lane_mode, "") if lanes > 1 else ""  # fmt: skip
        one_by_one += f", on {device}" if device is not None else ""
        what = f"{label} program of {self.problem.study.problem.spec.name!r}, group {gi}, " \
               f"{lanes * self.n_devices} experiment(s) per chunk{one_by_one}"  # fmt: skip
        return compile_program(key, (theta_spec, arr_spec, ops_spec), what)

    def _variant(self, prog: Program, gi: int, device: jax.Device | None, lane_mode: str) -> Program:
        """``prog`` with its lanes run as ``lane_mode`` (compiled on first use); ``prog`` itself where
        that program's scratch is above the block limit."""
        if prog.lane_mode == lane_mode:
            return prog
        key = (prog.mode, gi, device, lane_mode)
        if key not in self._variants:
            other = self._compile(prog.mode, prog.kind, gi, prog.lanes, device, lane_mode)
            self._variants[key] = other if other.scratch <= self._block_limit(device) else prog
        return self._variants[key]

    def _next_lane_mode(self, prog: Program, gi: int) -> str:
        """``lane_mode="auto"``: how the next evaluation of ``prog``'s chunks runs their lanes."""
        last = self.lane_modes.get((prog.mode, gi), prog.lane_mode)
        costs = self._lane_mode_costs(prog.mode, prog.kind, prog.lanes, gi, self.device)
        return next_lane_mode(last, costs, lambda way: prog.lane_mode == way or (
            prog.mode, gi, self.device, way) in self._variants)  # fmt: skip

    def _lane_mode_costs(self, mode: str, kind: str, lanes: int, gi: int, device: jax.Device | None):
        """``lane_mode="auto"``: what each way of running group ``gi``'s lanes in chunks of
        ``lanes`` costs at the last step counts (:func:`lane_mode_costs`; None while unknown)."""
        if self.lane_mode != "auto" or lanes == 1:
            return None
        return lane_mode_costs(self.steps, self._lane_orders(gi, lanes), self._function_kind(mode, kind),
                               on_cpu=self._platform(device) == "cpu")  # fmt: skip

    def _program(self, mode: str, gi: int, device: Any = "evaluations") -> Program:
        """The program of ``mode`` for group ``gi`` on ``device`` (default: the evaluations'),
        its chunk size chosen on first use."""
        device = self.device if isinstance(device, str) else device
        key = (mode, gi) if device == self.device else (mode, gi, device)
        if key in self._programs:
            return self._programs[key]
        if mode == "hessian":
            kinds = ("exact", "fd") if self.hessian_mode == "auto" else (self.hessian_mode,)
        else:
            kinds = (mode,)
        B = self._blocks[gi].shape[1]
        fill_device = self._platform(device) != "cpu" and self.experiments_per_chunk is None
        limit = self._block_limit(device)
        first = self._largest_fitting_lanes(mode, kinds[0], gi, B, device) if fill_device else (
            min(math.ceil((self.experiments_per_chunk or DEFAULT_CHUNK) / self.n_devices), B))  # fmt: skip
        n_chunks = math.ceil(B / first)
        while True:
            lanes = math.ceil(B / n_chunks)  # chunks of equal size: no chunk mostly padding
            for kind in kinds:
                # Known step counts choose which program is compiled first (another when asked).
                costs = self._lane_mode_costs(mode, kind, lanes, gi, device)
                prog = self._compile(mode, kind, gi, lanes, device, costs and min(costs, key=costs.__getitem__))
                fits = prog.scratch <= limit
                self.search_log.append((mode, gi, lanes * self.n_devices, kind, prog.scratch, fits))
                if fits:
                    self._programs[key] = prog
                    if mode == "hessian":
                        self.hessian_kind = kind
                    return prog
            if lanes == 1:
                raise RuntimeError(
                    f"lower: the {mode!r} program of one experiment per device needs {prog.scratch} bytes of "
                    f"scratch, above block_limit_bytes={limit:.0f}; raise the limit, loosen "
                    "max_steps/checkpoints, or use more devices."
                )
            if fill_device:  # the extrapolation erred: shrink in proportion (at least one chunk more)
                shrunk = max(1, int(lanes * GPU_FILL * limit / max(prog.scratch, 1)))
                n_chunks = max(n_chunks + 1, math.ceil(B / shrunk))
            else:
                n_chunks *= 2

    def _largest_fitting_lanes(self, mode: str, kind: str, gi: int, B: int, device: jax.Device | None) -> int:
        """Lanes per device of the largest chunk of group ``gi`` whose scratch fits the block
        limit, extrapolated from the scratch of a probe program of ``PROBE_LANES`` lanes."""
        probe_lanes = min(PROBE_LANES, B)
        probe = self._compile(mode, kind, gi, probe_lanes, device)
        self.search_log.append((mode, gi, probe_lanes * self.n_devices, kind, probe.scratch, "probe"))
        if probe_lanes == B:
            return B
        per_lane = max(probe.scratch, 1) / probe_lanes
        return max(1, min(B, int(GPU_FILL * self._block_limit(device) / per_lane)))

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
                if self.lane_mode == "auto" and self._platform(self.device) == "cpu" and prog.lanes > 1:
                    self._variant(prog, gi, self.device, "vmap" if prog.lane_mode == "map" else "map")
        return self

    @property
    def scratch_bytes(self) -> dict:
        """Mode -> scratch bytes of its largest chunk program (modes compiled so far)."""
        out: dict = {}
        for (mode, *_), prog in self._programs.items():
            out[mode] = max(out.get(mode, 0), prog.scratch)
        return out

    @property
    def chunk_sizes(self) -> dict:
        """Mode -> experiments per chunk (all devices together), one entry per group: the sizes
        chosen (``experiments_per_chunk`` is the size asked for)."""
        out: dict = {}
        for (mode, gi), prog in sorted((k, p) for k, p in self._programs.items() if len(k) == 2):
            out.setdefault(mode, []).append(prog.lanes * self.n_devices)
        return out

    # -- evaluation -----------------------------------------------------------------------------
    def _dispatch(self, mode: str, theta: np.ndarray, groups: Sequence[int] | None = None):
        """Run every chunk of ``mode`` (of ``groups``, default all); return (per-chunk outputs,
        orders) without transferring anything to the host."""
        outs, orders = [], []
        for gi in range(len(self.groups)) if groups is None else groups:
            prog = self._program(mode, gi)
            if self.lane_mode == "auto":
                prog = self._variant(prog, gi, self.device, self._next_lane_mode(prog, gi))
            self.lane_modes[(mode, gi)] = prog.lane_mode
            self.devices_used[mode] = program_devices.device_label(self.device, self.mesh)
            for order, data in self._chunk_data(gi, prog.lanes, self.device):
                outs.append(prog.compiled(theta, data, self._operands(self.device)))
                orders.append(order)
        return outs, orders

    def _bookkeeping(self, orders, statuses, steps) -> dict:
        """``failures`` (id -> Status) and ``steps`` (index -> steps) of the chunks' real lanes; a
        later chunk of the same experiment (differenced Hessians) overwrites an earlier one."""
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
        if mode == "value":
            outs, orders = self._dispatch("value", theta)
            v, st, ns = jax.device_get((device_sum([o[0] for o in outs]), [o[1] for o in outs], [o[2] for o in outs]))
            return ValuePart(value=float(v), **self._bookkeeping(orders, st, ns))
        if mode == "value_and_grad":
            outs, orders = self._dispatch("value_and_grad", theta)
            v, g = device_sum([o[0] for o in outs]), device_sum([o[1] for o in outs])
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
        k, h = self.problem.n_theta, self.fd_step
        H = None
        statuses, steps, all_orders = [], [], []
        for gi in range(len(self.groups)):
            if self._program("hessian", gi).kind == "exact":
                outs, orders = self._dispatch("hessian", theta, [gi])
                part = device_sum([o[0] for o in outs])
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
                        grads.append(device_sum([o[1] for o in outs]))
                        statuses += [o[2] for o in outs]
                        steps += [o[3] for o in outs]
                        all_orders += orders
                    cols.append((grads[0] - grads[1]) / (2 * h))
                part = jnp.stack(cols, axis=1)
            H = part if H is None else H + part
        H, st, ns = jax.device_get((H, statuses, steps))
        return HessianPart(hessian=np.asarray(H), **self._bookkeeping(all_orders, st, ns))

    def residuals_and_jacobians(self, thetas, active=None, *, max_steps: int | None = None,
                                ) -> tuple[np.ndarray, np.ndarray, tuple]:  # fmt: skip
        """Residuals and Jacobians at ``s`` points at once (``AbstractLoweredStudy``'s contract):
        each chunk's Jacobian program over the points in one program (compiled once per number of
        points). The points are lanes as the experiments are: in lock-step (``vmap``) on a GPU or
        with ``lane_mode="vmap"``; one after the other (``lax.map``, each point's experiments too)
        on a CPU under ``"auto"`` and with ``"map"`` (lock-step: every point takes the stiffest
        one's steps), where a point ``active`` marks False is skipped (NaN residuals).
        ``max_steps`` (None: ``SolverOptions.max_steps``) is an operand: no new compile.

        Raises:
            ValueError: for a bad shape of ``thetas``, a data mesh, or a ``max_steps`` that is not a
                positive integer.
        """
        thetas = np.atleast_2d(np.asarray(thetas, dtype=np.float64))
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer))
                                      or max_steps < 1):  # fmt: skip
            raise ValueError(f"residuals_and_jacobians: max_steps={max_steps!r} must be a positive integer (or None).")
        if thetas.ndim != 2 or thetas.shape[1] != self.problem.n_theta:
            raise ValueError(f"residuals_and_jacobians: thetas has shape {thetas.shape}; expected (s, {self.problem.n_theta}).")
        if self.mesh is not None:
            raise ValueError("residuals_and_jacobians: points as lanes need a lowered study on one device; lower it "
                             "without a data mesh (layout=None) for method='batched'.")  # fmt: skip
        active = np.ones(len(thetas), dtype=bool) if active is None else np.asarray(active, dtype=bool)
        outs, orders = [], []
        device = self._device_for(self._lanes_per_program(len(thetas)))  # the points are lanes too
        for gi in range(len(self.groups)):
            prog = self._program("jacobian", gi, device)
            self.devices_used["jacobian (points)"] = program_devices.device_label(device, self.mesh)
            on_gpu = self._platform(device) != "cpu"
            lockstep = self.lane_mode in ("vmap", "compact") or (self.lane_mode == "auto" and on_gpu)
            # One after the other over the points, and over each point's experiments as well (a
            # chunk of Bruno's 6 experiments in lock-step took 21 ms per point, 12 ms alone).
            key = ("points", lockstep, ProgramKey("jacobian", self.problem.terms(self.groups[gi]), prog.lanes,
                                                  "vmap" if lockstep else "map", None,
                                                  platform_signature(), device))  # fmt: skip
            if key not in self._compiled:  # jit compiles it once per number of points
                self._compiled[key] = jax.jit(over_points(chunk_function(key[2]), lockstep))
            operands = self._operands(device)
            if max_steps is not None:
                operands = operands._replace(max_steps=np.int32(max_steps))
            for order, data in self._chunk_data(gi, prog.lanes, device):
                outs.append(self._compiled[key](thetas, active, data, operands))
                orders.append(order)
        r, J, st, ns = jax.device_get(tuple([o[i] for o in outs] for i in range(4)))
        residuals, jacobians = stacked_over_points(orders, self.experiment_indices, r, J)
        residuals = residuals.astype(np.float64)
        failed = np.any([np.any((np.asarray(s) != 0) & (o >= 0)[None, :], axis=1) for o, s in zip(orders, st)], axis=0)
        failures = tuple(self._bookkeeping(orders, [x[p] for x in st], [x[p] for x in ns])["failures"] if failed[p] else {}
                         for p in range(thetas.shape[0]))  # fmt: skip
        if active.any():  # last_failures and steps: the last wanted point's (the abstract contract)
            p = int(np.flatnonzero(active)[-1])
            self._record(**self._bookkeeping(orders, [x[p] for x in st], [x[p] for x in ns]))
        residuals[failed | ~active] = np.nan
        return residuals, jacobians, failures

    def __repr__(self) -> str:
        n, total = len(self.experiment_indices), len(self.problem.study.experiments)
        which = f"{n} experiments" if n == total else f"{n} of {total} experiments"
        on = f", device={self.device}" if self.device is not None else ""
        return f"LoweredStudy({which}, theta={self.problem.n_theta}, devices={self.n_devices}{on}, " \
               f"chunks={self.chunk_sizes})"  # fmt: skip
