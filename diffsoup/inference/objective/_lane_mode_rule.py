"""``lane_mode="auto"`` on a CPU: whether a chunk's lanes run in lock-step or one after the other,
from the step counts of the last evaluation (the rule and its constants: ``_lowering_options``)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ._lowering_options import LANE_MODE_SWITCH_MARGIN, SEQUENTIAL_COST, SEQUENTIAL_COST_OTHERS


def lockstep_costs_more(steps: np.ndarray, orders: np.ndarray, fn_kind: str, margin: float = 1.0) -> bool:
    """Whether lock-step costs more than ``margin`` times running the lanes one after the other
    (``SEQUENTIAL_COST``), for chunks ``orders`` ``(chunk, device, lane)`` of experiment indices
    (-1: padding) and the experiments' last step counts ``steps`` (False while any is unknown)."""
    lanes = orders.shape[2]
    real = orders >= 0
    counts = np.where(real, steps[np.maximum(orders, 0)], 0).astype(np.float64)
    if np.any(counts[real] < 0):
        return False
    counts[~real] = counts[real].mean()  # a padding lane solves a copy of some experiment
    # A chunk takes as long as its busiest device.
    lockstep = float(np.sum(np.max(lanes * counts.max(axis=2), axis=1)))
    sequential = float(np.sum(np.max(counts.sum(axis=2), axis=1)))
    slope, cap = SEQUENTIAL_COST.get(fn_kind, SEQUENTIAL_COST_OTHERS)
    return lockstep > margin * min(cap, 1.0 + slope * (lanes - 1)) * sequential


def next_lane_mode(last: str, other_compiled: bool, sequential: Callable[[float], bool]) -> str:
    """How a chunk that last ran as ``last`` runs next: ``sequential(margin)`` says whether lock-step
    costs more than ``margin`` times one after the other; a switch that would compile the other
    program needs ``LANE_MODE_SWITCH_MARGIN``."""
    margin = 1.0 if other_compiled else LANE_MODE_SWITCH_MARGIN
    if last == "map":  # back to lock-step where one after the other costs margin times more
        stays = sequential(1.0 / margin)
    else:
        stays = not sequential(margin)
    return last if stays else ("vmap" if last == "map" else "map")
