"""``lane_mode="auto"``: how a chunk's lanes run, chosen from the step counts of the last evaluation
by what each way would cost at those counts (the costs' constants: ``_lowering_options``): in
lock-step (``"vmap"``), in lock-step with the unfinished lanes regrouped as lanes finish
(``"compact"``), or, on a CPU, one after the other (``"map"``)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ...integrate import LaneCompaction
from ._lowering_options import COMPACT_OFF_CPU_COST, LANE_MODE_SWITCH_MARGIN, SEQUENTIAL_COST, SEQUENTIAL_COST_OTHERS


def compacted_lane_steps(counts: np.ndarray, widths: tuple[int, ...]) -> float:
    """Lane-steps one device computes for lanes of step counts ``counts`` regrouped through
    ``widths`` (``LaneCompaction.widths``): each width runs until no more lanes are unfinished than
    the next one holds."""
    slowest_first = np.sort(np.asarray(counts, np.float64))[::-1]
    cost, done = 0.0, 0.0
    for level, width in enumerate(widths):
        narrower = widths[level + 1] if level + 1 < len(widths) else 0
        until = slowest_first[narrower] if narrower < slowest_first.size else 0.0
        cost += width * max(until - done, 0.0)
        done = max(done, until)
    return cost


def lane_mode_costs(steps: np.ndarray, orders: np.ndarray, fn_kind: str, on_cpu: bool,
                    compaction: LaneCompaction = LaneCompaction()) -> dict[str, float] | None:  # fmt: skip
    """What an evaluation of the chunks ``orders`` ``(chunk, device, lane)`` of experiment indices
    (-1: padding) costs in each lane mode at the experiments' last step counts ``steps``, in
    lane-steps of lock-step (None while a step count is unknown). A chunk takes as long as its
    busiest device. Lock-step computes ``lanes x`` the slowest lane's steps; regrouped, what
    :func:`compacted_lane_steps` counts (times ``COMPACT_OFF_CPU_COST`` off the CPU, where a
    narrower program is not proportionally faster; absent where the chunk is too small to regroup);
    one after the other (CPU only), the sum of the steps times ``SEQUENTIAL_COST``'s factor."""
    lanes = orders.shape[2]
    real = orders >= 0
    counts = np.where(real, steps[np.maximum(orders, 0)], 0).astype(np.float64)
    if np.any(counts[real] < 0):
        return None
    counts[~real] = counts[real].mean()  # a padding lane solves a copy of some experiment
    costs = {"vmap": float(np.sum(np.max(lanes * counts.max(axis=2), axis=1)))}
    widths = compaction.widths(lanes)
    if len(widths) > 1:
        regrouped = np.array([[compacted_lane_steps(device, widths) for device in chunk] for chunk in counts])
        costs["compact"] = float(np.sum(regrouped.max(axis=1))) * (1.0 if on_cpu else COMPACT_OFF_CPU_COST)
    if on_cpu and lanes > 1:
        slope, cap = SEQUENTIAL_COST.get(fn_kind, SEQUENTIAL_COST_OTHERS)
        costs["map"] = min(cap, 1.0 + slope * (lanes - 1)) * float(np.sum(np.max(counts.sum(axis=2), axis=1)))
    return costs


def next_lane_mode(last: str, costs: dict[str, float] | None, compiled: Callable[[str], bool]) -> str:
    """How a chunk that last ran as ``last`` runs next: the cheapest way by ``costs``
    (:func:`lane_mode_costs`; ``last`` while they are unknown), where a switch to a way whose
    program is not compiled yet must be ``LANE_MODE_SWITCH_MARGIN`` times cheaper than ``last``:
    near the boundary, step counts that move from point to point would otherwise compile both
    programs (seconds) to save a fraction of an evaluation (milliseconds)."""
    if costs is None:
        return last
    best = min(costs, key=costs.__getitem__)  # ties: the first listed, lock-step
    margin = 1.0 if compiled(best) else LANE_MODE_SWITCH_MARGIN
    return best if costs[best] * margin < costs.get(last, np.inf) else last
