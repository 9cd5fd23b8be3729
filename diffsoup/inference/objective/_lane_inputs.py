"""The packed inputs of a chunk's lanes: :class:`LaneInputs`, one typed pytree, and its producer.

A group's experiments become the numbers their compiled term reads (:class:`~diffsoup.inference.
objective._terms.LaneTerms`): arrays with a leading lane axis ``L``. :func:`allocate` is the one
place that says which fields a group has and their shapes and dtypes; :func:`pack_experiments` (a
study of ``Experiment`` objects, lane by lane) and :func:`pack_arrays` (a study held as arrays, by
fancy indexing) fill what it allocates, once per problem for all of a group's members
(:mod:`._study_rows`: the group's block); ``InferenceProblem.pack`` takes a chunk's lanes from that
block. Inside a program one lane's inputs (``vmap`` over ``L``) have the same fields without the
lane axis.

A field a group does not use is None (an empty pytree: no argument of the program).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from ..study._multishoot import window_layout
from ..study._noise import SIGMA_CELLS


class LaneInputs(NamedTuple):
    """The packed inputs of ``L`` lanes of one group (shapes with the lane axis first; ``m``
    times, ``k`` observables, ``n`` states, ``P`` model parameters; an ``entry`` field holds a
    study entry index, -1 where the matching ``fixed`` number holds).

    Attributes:
        times: ``(L, m)`` measurement times, padded with the experiment's last time.
        t0: ``(L,)`` initial times.
        data: ``(L, m, k)`` measured values (1 where not measured).
        mask: ``(L, m, k)`` bool, measured.
        sigma: ``(L, m, k)`` the known spreads (1 where not known).
        sigma_entry: ``(L,)`` int32, the entry of a group's one named spread per experiment.
        y0: ``(L, n)`` initial states (the numbers; a ``y0`` function computes them instead).
        p_entry, p_fixed: ``(L, P)`` where each model parameter's value comes from.
        const: ``(L,)`` the nll terms no parameter changes (``InferenceProblem.offset_of``).
        valid: ``(L,)`` bool, a real experiment (a padding lane adds nothing).
        sigma_entries: ``(L, m, k)`` int32 entries of named spreads per cell (group sigma
            ``"cells"``), else None.
        y0_entry: ``(L, n)`` int32 entries of estimated initial states, else None.
        op_entry, op_fixed: ``(L, n_op)`` the observable parameters' values, else None.
        y0_set, pre_keep, pre_entry, pre_fixed, pre_y0, pre_y0_entry: pre-equilibration: the
            states ``y0`` re-sets ``(L, n)`` bool, the model parameters it keeps ``(L, P)`` bool
            (else ``pre_entry``/``pre_fixed``), its start ``(L, n)`` and estimated start entries
            (``pre_y0_entry``, with ``y0`` entries) -- None without pre-equilibration.
        reset_times: ``(L, R)`` times of the resets given as numbers, else None.
        discs: ``(L, D)`` discontinuity times (padded with +inf), else None.
        win_t0, win_times, win_of, win_pos, win_idx, cont_w: multiple shooting: window starts
            ``(L, W)``, output times per window ``(L, W, points)``, each measurement's window
            and position ``(L, m)`` int32, the ``theta`` indices of the window starts ``(L,
            W-1, n)`` int32 and the continuity weights ``(L, n)`` -- None for single shooting.
    """

    times: Any
    t0: Any
    data: Any
    mask: Any
    sigma: Any
    sigma_entry: Any
    y0: Any
    p_entry: Any
    p_fixed: Any
    const: Any
    valid: Any
    sigma_entries: Any = None
    y0_entry: Any = None
    op_entry: Any = None
    op_fixed: Any = None
    y0_set: Any = None
    pre_keep: Any = None
    pre_entry: Any = None
    pre_fixed: Any = None
    pre_y0: Any = None
    pre_y0_entry: Any = None
    reset_times: Any = None
    discs: Any = None
    win_t0: Any = None
    win_times: Any = None
    win_of: Any = None
    win_pos: Any = None
    win_idx: Any = None
    cont_w: Any = None

    def items(self):
        """``(field, array)`` of the fields present (not None)."""
        return ((name, value) for name, value in zip(self._fields, self) if value is not None)


def allocate(group: Any, n_lanes: int, n_states: int, n_parameters: int) -> LaneInputs:
    """The :class:`LaneInputs` of ``n_lanes`` lanes of ``group``, at their defaults (padding lanes:
    not valid, nothing measured, every entry -1): the fields the group's features use, each of its
    shape and dtype."""
    L, m, k, n, P = n_lanes, group.n_times, group.k, n_states, n_parameters
    fields: dict = {}
    if group.sigma == SIGMA_CELLS:
        fields["sigma_entries"] = np.full((L, m, k), -1, dtype=np.int32)
    if group.y0_entries:
        fields["y0_entry"] = np.full((L, n), -1, dtype=np.int32)
    n_op = len(group.observable_parameters)
    if n_op:
        fields.update(op_entry=np.full((L, n_op), -1, dtype=np.int32), op_fixed=np.zeros((L, n_op)))
    pre = group.preequilibration
    if pre is not None:
        fields.update(y0_set=np.zeros((L, n), dtype=bool), pre_keep=np.ones((L, P), dtype=bool),
                      pre_entry=np.full((L, P), -1, dtype=np.int32), pre_fixed=np.zeros((L, P)),
                      pre_y0=np.zeros((L, n)))  # fmt: skip
        if pre.y0_entries:
            fields["pre_y0_entry"] = np.full((L, n), -1, dtype=np.int32)
    if group.resets:
        fields["reset_times"] = np.zeros((L, len(group.resets)))
    if not callable(group.discontinuities) and group.discontinuities:
        fields["discs"] = np.full((L, group.discontinuities), np.inf)
    W = group.windows
    if W:
        fields.update(win_t0=np.zeros((L, W)), win_times=np.zeros((L, W, group.window_points)),
                      win_of=np.zeros((L, m), dtype=np.int32), win_pos=np.zeros((L, m), dtype=np.int32),
                      win_idx=np.zeros((L, W - 1, n), dtype=np.int32), cont_w=np.zeros((L, n)))  # fmt: skip
    return LaneInputs(
        times=np.zeros((L, m)), t0=np.zeros(L), data=np.ones((L, m, k)), mask=np.zeros((L, m, k), dtype=bool),
        sigma=np.ones((L, m, k)), sigma_entry=np.zeros(L, dtype=np.int32), y0=np.zeros((L, n)),
        p_entry=np.full((L, P), -1, dtype=np.int32), p_fixed=np.zeros((L, P)), const=np.zeros(L),
        valid=np.zeros(L, dtype=bool), **fields,
    )  # fmt: skip


def pack_experiments(study: Any, group: Any, order: Sequence[int], constants: Sequence[float],
                     window_offset: dict) -> LaneInputs:  # fmt: skip
    """The lanes of the experiments ``order`` (study indices of ``Experiment`` objects; -1: a padding
    lane, which repeats the group's first member), one lane at a time; ``constants`` per experiment
    (``const``), ``window_offset``: experiment id -> its first window start in ``theta``."""
    n_lanes, n = len(order), study.problem.n_states
    a = allocate(group, n_lanes, n, len(study.problem.parameter_names))
    pad_source = group.members[0]
    W = group.windows
    for lane, idx in enumerate(order):
        real = idx >= 0
        e = study.experiments[idx if real else pad_source]
        r = study.resolved[e.id]
        mi = e.times.shape[0]
        a.times[lane, :mi] = e.times
        a.times[lane, mi:] = e.times[-1]
        a.t0[lane] = e.t0
        if real:
            fin = np.isfinite(e.data)
            a.mask[lane, :mi] = fin
            a.data[lane, :mi] = np.where(fin, e.data, 1.0)
            a.const[lane] = constants[idx]
            a.valid[lane] = True
        if e.sigma is not None:
            a.sigma[lane, :mi] = e.sigma
        else:
            a.sigma[lane, :mi] = np.where(np.isfinite(e.sigma_values), e.sigma_values, 1.0)
        a.sigma_entry[lane] = max(r["sigma_entry"], 0)
        if a.sigma_entries is not None:
            a.sigma_entries[lane, :mi] = r["sigma_entries"]
        if r["y0"] is not None:
            a.y0[lane] = np.where(np.isfinite(r["y0"]), r["y0"], 0.0)
        if a.y0_entry is not None:
            a.y0_entry[lane] = r["y0_entry"]
        for j, (_, (kind, v)) in enumerate(r["observable_plan"]):
            (a.op_entry if kind == "entry" else a.op_fixed)[lane, j] = v
        if group.preequilibration is not None:
            pr = r["pre"]
            a.y0_set[lane] = r["y0_set"]
            if pr["y0"] is not None:
                a.pre_y0[lane] = np.where(np.isfinite(pr["y0"]), pr["y0"], 0.0)
            if a.pre_y0_entry is not None:
                a.pre_y0_entry[lane] = pr["y0_entry"]
            for j, (kind, v) in enumerate(pr["plan"]):
                if kind != "keep":
                    a.pre_keep[lane, j] = False
                    (a.pre_entry if kind == "entry" else a.pre_fixed)[lane, j] = v
        for i, x in enumerate(e.resets):
            if not callable(x.time):
                a.reset_times[lane, i] = float(x.time)
        if a.discs is not None:
            a.discs[lane, : len(e.discontinuities)] = e.discontinuities
        if W:
            edges, wof, pos, wt = window_layout(e, e.trajectory)
            a.win_t0[lane] = edges[:-1]
            a.win_times[lane] = wt[:, -1:]
            a.win_times[lane, :, : wt.shape[1]] = wt
            a.win_of[lane, :mi] = wof
            a.win_pos[lane, :mi] = pos
            o = window_offset[e.id]
            a.win_idx[lane] = np.arange(o, o + (W - 1) * n).reshape(W - 1, n)
            a.cont_w[lane] = e.trajectory.continuity_weight / e.trajectory.scales(n)
        for j, (kind, v) in enumerate(r["plan"]):
            (a.p_entry if kind == "entry" else a.p_fixed)[lane, j] = v
    return a


def _rows(x: Any, idx: np.ndarray, E: int):
    """``x[idx]`` of a per-row array, or ``x`` itself when it is shared (a number or one row)."""
    if np.ndim(x) == 0 or np.shape(x)[0] != E:
        return x
    return np.asarray(x)[idx]


def pack_arrays(study: Any, group: Any, order: Any, constants: np.ndarray) -> LaneInputs:
    """The lanes of rows ``order`` of a study held as arrays (-1: a padding lane, which repeats the
    group's first member, is not valid and adds nothing), by fancy indexing; ``constants`` per row."""
    arrays, prob, plan = study.arrays, study.problem, study.array_plan
    order = np.asarray(order, dtype=np.int64)
    real = order >= 0
    idx = np.where(real, order, group.members[0])
    E, m, k = arrays.shape
    L = idx.size
    a = allocate(group, L, prob.n_states, len(prob.parameter_names))
    data = arrays.data[idx]
    a.mask[:] = np.isfinite(data) & real[:, None, None]
    a.times[:] = arrays.times[idx]
    a.t0[:] = np.broadcast_to(_rows(arrays.t0, idx, E), (L,))
    a.data[:] = np.where(a.mask, data, 1.0)
    a.const[:] = np.where(real, constants[idx], 0.0)
    a.valid[:] = real
    if arrays.sigma is not None:
        s = np.broadcast_to(_rows(arrays.sigma, idx, E), (L, m, k))
        a.sigma[:] = np.where(np.isfinite(s), s, 1.0)
    if np.ndim(plan.sigma_entry) or plan.sigma_entry >= 0:
        a.sigma_entry[:] = _rows(plan.sigma_entry, idx, E)
    if a.sigma_entries is not None:
        a.sigma_entries[:] = np.broadcast_to(_rows(plan.sigma_cells, idx, E), (L, m, k))
    if arrays.y0_function is None:  # (a y0 function computes it from the parameters)
        y0 = arrays.y0 if arrays.y0 is not None else np.asarray(prob.spec.y0, dtype=np.float64)
        a.y0[:] = _rows(y0, idx, E) if y0.ndim == 2 else y0
    _plan_lanes(plan.columns, idx, E, a.p_entry, a.p_fixed)
    if a.op_entry is not None:
        _plan_lanes(plan.observable_columns, idx, E, a.op_entry, a.op_fixed)
    if a.reset_times is not None:
        fixed = [i for i, x in enumerate(arrays.resets) if not callable(x.time)]
        a.reset_times[:, fixed] = [float(arrays.resets[i].time) for i in fixed]
    if a.discs is not None:
        a.discs[:] = np.asarray(arrays.discontinuities)
    return a


def _plan_lanes(columns: tuple, idx: np.ndarray, E: int, entries: np.ndarray, fixed: np.ndarray) -> None:
    """Fill ``entries (L, P)`` and ``fixed (L, P)`` of the lanes ``idx`` from ``(entry, fixed)`` columns."""
    for j, (entry, value) in enumerate(columns):
        entries[:, j] = _rows(entry, idx, E)
        fixed[:, j] = _rows(value, idx, E)
