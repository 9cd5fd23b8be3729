"""``ds.lower``: a study compiled into chunked, sharded objective programs (a ``LoweredStudy``).

The tiled-objective pattern (DESIGN.md, ``reference/seeds/004``) with chunks of experiments as the
tiles. Experiments of one :class:`~diffsoup.inference._problem.Group` (same observables, noise and
observable count; measurement times padded with the last time and masked) are stacked and
vmapped, ``lanes`` of them per chunk. Each evaluation mode has its own program:

============== =============================================== ================================
mode           program (per chunk)                             derivative
============== =============================================== ================================
value          sum of the experiments' terms                   none (forward solve)
value_and_grad value and gradient                              checkpointed adjoint (reverse)
residuals      the residuals                                   none
jacobian       residuals and their Jacobian                    forward sensitivities (jacfwd)
hessian        ``"exact"``: jacfwd of the gradient (HVPs);      forward over reverse, or
               ``"fd"``: the gradient program, differenced      central differences of gradients
============== =============================================== ================================

A mode's chunk size is chosen the first time the mode is used (or by :meth:`LoweredStudy.compile`):
starting from ``chunk_size`` (default 256 experiments) the program is lowered and compiled, its
scratch (``compiled.memory_analysis().temp_size_in_bytes``, the single block XLA asks for) is
compared with the block limit, and the chunk is halved until it fits -- nothing is run to find
out. ``hessian="auto"`` tries the exact Hessian, then differences of gradients, at each size. The
compiled program of the chosen size is the one evaluations run. Chunk results are summed (or
concatenated) on the device and brought to the host with one transfer per evaluation.

With ``layout=ds.Layout(mesh=ds.global_mesh(("data",)))`` each chunk is split over the data axis
(``shard_map``: every device runs its own lanes' solves, the sums are ``psum``-ed). Each device owns a
fixed block of experiments, the same for every mode and chunk size; with ``balance_steps=True`` the
blocks are chosen by :func:`balance_owners` weighted by the step counts measured at the nominal
point, and within a block experiments are sorted by step count so that lanes that run in lock-step
take similar numbers of steps. That pays when each device runs several chunks: with one chunk per
device, a device holding one slow experiment runs as long as one holding only slow ones (lanes run
in lock-step), so balancing evens the step totals without shortening the evaluation; give a
``chunk_size`` that makes several chunks per device when step counts differ widely.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Mapping, Sequence

import numpy as np

from ._problem import InferenceProblem, SolverOptions
from ._study import Study

MODES = ("value", "value_and_grad", "residuals", "jacobian", "hessian")
HESSIANS = ("auto", "exact", "fd")
DEFAULT_CHUNK = 256
BFC_BLOCK_CAP = 3.5e9
CPU_BLOCK_CAP = 2**31


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
class Program:
    """A compiled chunk program: ``lanes`` experiments per device per chunk, its scratch bytes."""

    mode: str
    kind: str
    lanes: int
    compiled: Any
    scratch: int


class LoweredStudy:
    """An inference problem compiled chunk by chunk; make it with :func:`lower`.

    ``theta`` is the vector of estimated parameters on their scales, in ``theta_names`` order.
    Every evaluation returns numpy values; an experiment whose solve failed makes the value (and
    its residuals) NaN and is listed in ``last_failures``.

    Attributes:
        problem: the :class:`InferenceProblem`.
        theta_names, lower, upper, nominal: of the problem.
        scale, offset: ``value = scale * ||residuals||^2 + offset``.
        block_limit_bytes: the scratch limit per program.
        hessian_mode: ``"auto"``, ``"exact"`` or ``"fd"`` as asked; ``hessian_kind`` what was chosen.
        last_failures: experiment id -> ``ds.Status`` of the last evaluation's failed solves.
        steps: accepted steps per experiment (study order) at the last evaluation (-1 before any).
        search_log: ``(mode, group, lanes, kind, scratch_bytes, fits)`` of every program compiled
            while choosing chunk sizes.
    """

    def __init__(
        self,
        problem: InferenceProblem,
        *,
        layout: Any = None,
        hessian: str = "auto",
        chunk_size: int | None = None,
        block_limit_bytes: float | None = None,
        fd_step: float = 1e-3,
    ):
        import jax

        from .._layout import Layout

        if hessian not in HESSIANS:
            raise ValueError(f"lower: hessian={hessian!r} must be one of {HESSIANS}.")
        if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
            raise ValueError(f"lower: chunk_size={chunk_size!r} must be a positive integer (experiments per chunk).")
        if block_limit_bytes is not None and not (float(block_limit_bytes) > 0):
            raise ValueError(f"lower: block_limit_bytes={block_limit_bytes!r} must be positive.")
        if not (float(fd_step) > 0 and math.isfinite(fd_step)):
            raise ValueError(f"lower: fd_step={fd_step!r} must be positive (a step in theta's units).")
        layout = layout if layout is not None else Layout()
        if not isinstance(layout, Layout):
            raise TypeError(f"lower: layout must be a ds.Layout, not {type(layout).__name__}.")
        self.problem = problem
        self.layout = layout
        self.hessian_mode = hessian
        self.hessian_kind: str | None = None if hessian == "auto" else hessian
        self.chunk_size = chunk_size or DEFAULT_CHUNK
        self.fd_step = float(fd_step)
        self.n_devices = layout.data_size
        self.mesh = layout.mesh if self.n_devices > 1 else None
        devices = self.mesh.devices.reshape(-1) if self.mesh is not None else jax.devices()[:1]
        self.block_limit_bytes = float(block_limit_bytes) if block_limit_bytes is not None else float(
            default_block_limit(devices[0])
        )
        self.theta_names = problem.theta_names
        self.lower, self.upper, self.nominal = problem.lower, problem.upper, problem.nominal
        self.scale, self.offset = problem.scale, problem.offset
        self.groups = problem.groups
        n_exp = len(problem.study.experiments)
        self.steps = np.full(n_exp, -1, dtype=np.int64)
        self.last_failures: dict = {}
        self.search_log: list = []
        self._programs: dict = {}
        self._chunks: dict = {}
        self._fns: dict = {}
        D = self.n_devices
        self._blocks = []
        for g in self.groups:
            members = np.asarray(g.members)
            B = math.ceil(len(members) / D)
            blocks = np.full((D, B), -1, dtype=np.int64)
            for d in range(D):
                part = members[d * B : (d + 1) * B]
                blocks[d, : part.size] = part
            self._blocks.append(blocks)
        # Residual layout in study order.
        group_of = {i: gi for gi, g in enumerate(self.groups) for i in g.members}
        self._group_of = group_of
        sizes = [self.groups[group_of[i]].n_residuals for i in range(n_exp)]
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        ids = [e.id for e in problem.study.experiments]
        self.residual_slices = {ids[i]: slice(int(starts[i]), int(starts[i + 1])) for i in range(n_exp)}
        self.n_residuals = int(starts[-1])
        if layout.balance_steps and D > 1:
            self.balance()

    # -- placement ------------------------------------------------------------------------------
    @property
    def placement(self) -> dict:
        """Experiment id -> index of the device (along the data axis) that solves it."""
        ids = [e.id for e in self.problem.study.experiments]
        return {ids[i]: d for blocks in self._blocks for d in range(blocks.shape[0]) for i in blocks[d] if i >= 0}

    def device_loads(self) -> np.ndarray:
        """Accepted steps per device at the last evaluation (the sum over its experiments)."""
        if np.any(self.steps < 0):
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
        for gi, g in enumerate(self.groups):
            ordered = balance_owners(tuple(exps[i] for i in g.members), D, weight=lambda e: float(steps[index[e.id]]))
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
    def _fn(self, kind: str, gi: int):
        """The chunk function of ``kind`` (a mode, or ``"exact"`` for the exact Hessian)."""
        key = (kind, gi)
        if key in self._fns:
            return self._fns[key]
        import jax
        import jax.numpy as jnp

        ip, group = self.problem, self.groups[gi]
        sharded = self.mesh is not None

        def reduce(x):
            return jax.lax.psum(x, "data") if sharded else x

        def lanes(theta, arrs, *, forward, residuals):
            full = ip.full_vector(theta)
            return jax.vmap(
                lambda a: ip.lane(group, full, a, forward=forward, residuals=residuals, theta=theta)
            )(arrs)

        def total(theta, arrs):
            v, st, steps = lanes(theta, arrs, forward=False, residuals=False)
            return jnp.sum(v), (st, steps)

        def resid(theta, arrs):
            r, st, steps = lanes(theta, arrs, forward=True, residuals=True)
            return r, (r, st, steps)

        if kind == "value":
            def local(theta, arrs):
                v, st, steps = lanes(theta, arrs, forward=True, residuals=False)
                return reduce(jnp.sum(v)), st, steps
            specs = ("sum", "lane", "lane")
        elif kind == "value_and_grad":
            def local(theta, arrs):
                (v, (st, steps)), g = jax.value_and_grad(total, has_aux=True)(theta, arrs)
                return reduce(v), reduce(g), st, steps
            specs = ("sum", "sum", "lane", "lane")
        elif kind == "residuals":
            def local(theta, arrs):
                r, st, steps = lanes(theta, arrs, forward=True, residuals=True)
                return r, st, steps
            specs = ("lane", "lane", "lane")
        elif kind == "jacobian":
            def local(theta, arrs):
                J, (r, st, steps) = jax.jacfwd(resid, has_aux=True)(theta, arrs)
                return r, J, st, steps
            specs = ("lane", "lane", "lane", "lane")
        elif kind == "exact":
            def grad_fn(theta, arrs):
                return jax.grad(total, has_aux=True)(theta, arrs)

            def local(theta, arrs):
                H, (st, steps) = jax.jacfwd(grad_fn, has_aux=True)(theta, arrs)
                return reduce(H), st, steps
            specs = ("sum", "lane", "lane")
        else:  # pragma: no cover (internal)
            raise ValueError(kind)
        fn = local
        if sharded:
            from jax.sharding import PartitionSpec as P

            out_specs = tuple(P() if s == "sum" else P("data") for s in specs)
            fn = jax.shard_map(local, mesh=self.mesh, in_specs=(P(), P("data")), out_specs=out_specs, check_vma=False)
        self._fns[key] = fn
        return fn

    def _compile(self, mode: str, kind: str, gi: int, lanes: int) -> Program:
        import jax

        if mode == "hessian" and kind == "fd":
            cached = self._programs.get(("value_and_grad", gi))
            if cached is not None and cached.lanes == lanes:
                return Program("hessian", "fd", lanes, cached.compiled, cached.scratch)
        fn_kind = {"exact": "exact", "fd": "value_and_grad"}.get(kind, mode) if mode == "hessian" else mode
        fn = self._fn(fn_kind, gi)
        group = self.groups[gi]
        example = self.problem.pack(group, [group.members[0]] * (lanes * self.n_devices))
        if self.mesh is not None:
            from jax.sharding import NamedSharding, PartitionSpec

            lane_sh = NamedSharding(self.mesh, PartitionSpec("data"))
            rep = NamedSharding(self.mesh, PartitionSpec())
            arr_spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=lane_sh), example)
            theta_spec = jax.ShapeDtypeStruct((self.problem.n_theta,), np.float64, sharding=rep)
        else:
            arr_spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), example)
            theta_spec = jax.ShapeDtypeStruct((self.problem.n_theta,), np.float64)
        compiled = jax.jit(fn).lower(theta_spec, arr_spec).compile()
        stats = compiled.memory_analysis()
        scratch = int(getattr(stats, "temp_size_in_bytes", 0) or 0) if stats is not None else 0
        return Program(mode, kind, lanes, compiled, scratch)

    def _program(self, mode: str, gi: int) -> Program:
        key = (mode, gi)
        if key in self._programs:
            return self._programs[key]
        if mode == "hessian":
            kinds = ("exact", "fd") if self.hessian_mode == "auto" else (self.hessian_mode,)
        else:
            kinds = (mode,)
        B = self._blocks[gi].shape[1]
        first = min(math.ceil(self.chunk_size / self.n_devices), B)
        n_chunks = math.ceil(B / first)
        while True:
            lanes = math.ceil(B / n_chunks)
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
            n_chunks *= 2

    def compile(self, modes: Sequence[str] = ("value", "value_and_grad", "jacobian")) -> "LoweredStudy":
        """Choose chunk sizes and compile the programs of ``modes`` now (otherwise on first use)."""
        for mode in modes:
            if mode not in MODES:
                raise ValueError(f"compile: unknown mode {mode!r}; modes are {MODES}.")
            for gi in range(len(self.groups)):
                self._program(mode, gi)
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
        """Mode -> experiments per chunk (all devices together), one entry per group."""
        out: dict = {}
        for (mode, gi), prog in sorted(self._programs.items(), key=lambda kv: kv[0]):
            out.setdefault(mode, []).append(prog.lanes * self.n_devices)
        return out

    # -- evaluation -----------------------------------------------------------------------------
    def _theta(self, theta) -> np.ndarray:
        theta = np.asarray(theta, dtype=np.float64)
        if theta.shape != (self.problem.n_theta,):
            raise ValueError(f"theta has shape {theta.shape}; expected ({self.problem.n_theta},) for {list(self.theta_names)}.")
        return theta

    def _dispatch(self, mode: str, theta: np.ndarray, groups: Sequence[int] | None = None):
        """Run every chunk of ``mode`` (of ``groups``, default all); return (per-chunk outputs,
        orders) without transferring anything to the host."""
        outs, orders = [], []
        for gi in range(len(self.groups)) if groups is None else groups:
            prog = self._program(mode, gi)
            for order, data in self._chunk_data(gi, prog.lanes):
                outs.append(prog.compiled(theta, data))
                orders.append(order)
        return outs, orders

    def _record(self, orders, statuses, steps):
        from ..integrate import Status

        ids = [e.id for e in self.problem.study.experiments]
        failures = {}
        for order, st, ns in zip(orders, statuses, steps):
            st, ns = np.asarray(st), np.asarray(ns)
            real = order >= 0
            self.steps[order[real]] = ns[real]
            for i, s in zip(order[real], st[real]):
                if int(s) != 0:
                    failures[ids[i]] = Status(int(s))
        self.last_failures = failures

    def value(self, theta) -> float:
        """The objective at ``theta`` (NaN if a solve failed)."""
        import jax

        theta = self._theta(theta)
        outs, orders = self._dispatch("value", theta)
        total = outs[0][0]
        for o in outs[1:]:
            total = total + o[0]
        v, st, ns = jax.device_get((total, [o[1] for o in outs], [o[2] for o in outs]))
        self._record(orders, st, ns)
        return float(v)

    def value_and_grad(self, theta) -> tuple[float, np.ndarray]:
        """The objective and its gradient (checkpointed adjoint) at ``theta``."""
        import jax

        theta = self._theta(theta)
        outs, orders = self._dispatch("value_and_grad", theta)
        v = outs[0][0]
        g = outs[0][1]
        for o in outs[1:]:
            v, g = v + o[0], g + o[1]
        v, g, st, ns = jax.device_get((v, g, [o[2] for o in outs], [o[3] for o in outs]))
        self._record(orders, st, ns)
        return float(v), np.asarray(g)

    def _assemble(self, orders, per_chunk) -> np.ndarray:
        """Per-chunk lane arrays (lanes, R, ...) -> one array in study order (concatenated over experiments)."""
        rows = {}
        for order, arr in zip(orders, per_chunk):
            for lane, i in enumerate(order):
                if i >= 0:
                    rows[int(i)] = arr[lane]
        return np.concatenate([rows[i] for i in range(len(rows))], axis=0)

    def residuals(self, theta) -> np.ndarray:
        """Residuals in study order (``residual_slices`` maps each experiment to its part)."""
        import jax

        theta = self._theta(theta)
        outs, orders = self._dispatch("residuals", theta)
        r, st, ns = jax.device_get(([o[0] for o in outs], [o[1] for o in outs], [o[2] for o in outs]))
        self._record(orders, st, ns)
        return self._assemble(orders, r)

    def residuals_and_jacobian(self, theta) -> tuple[np.ndarray, np.ndarray]:
        """Residuals and their Jacobian ``(n_residuals, n_theta)`` by forward sensitivities."""
        import jax

        theta = self._theta(theta)
        outs, orders = self._dispatch("jacobian", theta)
        r, J, st, ns = jax.device_get(tuple([o[i] for o in outs] for i in range(4)))
        self._record(orders, st, ns)
        return self._assemble(orders, r), self._assemble(orders, J)

    def gauss_newton(self, theta) -> tuple[float, np.ndarray, np.ndarray]:
        """Value, gradient and Gauss-Newton Hessian ``2 scale J^T J`` from the residual Jacobian.

        The products are formed on the device chunk by chunk; only ``(n_theta, n_theta)`` comes back.
        """
        import jax
        import jax.numpy as jnp

        theta = self._theta(theta)
        outs, orders = self._dispatch("jacobian", theta)
        k = self.problem.n_theta
        ss, g, H = 0.0, jnp.zeros(k), jnp.zeros((k, k))
        for r, J, *_ in outs:
            r2, J2 = r.reshape(-1), J.reshape(-1, k)
            ss = ss + jnp.dot(r2, r2)
            g = g + J2.T @ r2
            H = H + J2.T @ J2
        c = 2.0 * self.scale
        ss, g, H, st, ns = jax.device_get((ss, g, H, [o[2] for o in outs], [o[3] for o in outs]))
        self._record(orders, st, ns)
        return float(self.scale * ss + self.offset), c * np.asarray(g), c * np.asarray(H)

    def hessian(self, theta) -> np.ndarray:
        """The Hessian of the objective: exact (forward over reverse) or central differences of
        gradients (step ``fd_step`` in theta's units), as chosen; symmetrised."""
        import jax
        import jax.numpy as jnp

        theta = self._theta(theta)
        k, h = self.problem.n_theta, self.fd_step
        H = None
        statuses, steps, all_orders = [], [], []
        for gi in range(len(self.groups)):
            if self._program("hessian", gi).kind == "exact":
                outs, orders = self._dispatch("hessian", theta, [gi])
                part = outs[0][0]
                for o in outs[1:]:
                    part = part + o[0]
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
                        g = outs[0][1]
                        for o in outs[1:]:
                            g = g + o[1]
                        grads.append(g)
                        statuses += [o[2] for o in outs]
                        steps += [o[3] for o in outs]
                        all_orders += orders
                    cols.append((grads[0] - grads[1]) / (2 * h))
                part = jnp.stack(cols, axis=1)
            H = part if H is None else H + part
        H, st, ns = jax.device_get((H, statuses, steps))
        self._record(all_orders, st, ns)
        H = np.asarray(H)
        return 0.5 * (H + H.T)

    def __repr__(self) -> str:
        return (
            f"LoweredStudy({len(self.problem.study.experiments)} experiments, theta={self.problem.n_theta}, "
            f"devices={self.n_devices}, chunks={self.chunk_sizes})"
        )


def lower(
    study: Study | InferenceProblem,
    *,
    objective: str | None = None,
    parameters: Sequence[str] | None = None,
    values: Mapping[str, float] | None = None,
    solver: SolverOptions | None = None,
    layout: Any = None,
    hessian: str = "auto",
    chunk_size: int | None = None,
    block_limit_bytes: float | None = None,
    fd_step: float = 1e-3,
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
        chunk_size: experiments per chunk to start the search from (default 256, capped at the
            group's size); halved until the program fits.
        block_limit_bytes: the largest scratch block a program may ask for; None reads
            :func:`default_block_limit` from the device.
        fd_step: the difference step for ``hessian="fd"``, in theta's units (scaled parameters).

    Returns:
        A :class:`LoweredStudy`; programs compile on first use of each mode (or ``.compile()``).

    Raises:
        ValueError, TypeError: for bad options, or problem options given with an InferenceProblem.
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
    return LoweredStudy(problem, layout=layout, hessian=hessian, chunk_size=chunk_size,
                        block_limit_bytes=block_limit_bytes, fd_step=fd_step)  # fmt: skip
