"""``multistart(method="batched")``: blocks of starts as campaign tasks, each block the lanes of the
batched optimizer on one worker.

The starts ``0 .. N-1`` of the start stream (:func:`~diffsoup.inference.fitting._starts.start_points`:
start ``i`` depends on ``(seed, i)`` alone) are cut into blocks of ``starts_per_block`` (by default
the optimizer's lanes on the platform the blocks run on: 1,024 on a GPU, 16 elsewhere, where the
optimizer names none); block ``b`` holds starts ``b * starts_per_block`` onwards and is the
task ``block-0000``, ``block-0001``, ... of a ``checkpointed_map`` campaign. Its item holds the
range (``first``, ``count``), the seed, ``starts_per_block``, the optimizer's lane settings
(:meth:`~diffsoup.inference.BatchedTrustRegion.lane_settings`: its options but the polish's) and a
digest of the block's start points, so a rerun with the same settings resumes (finished blocks are
kept; another ``polish`` polishes anew), and a rerun with another seed, block size, lane setting or
study is a ledger conflict.

A task (:class:`BlockTask`) lowers the study once per process (the cache of lowered studies,
:mod:`._lowered_cache`), runs the batched phase over its block
(:func:`~diffsoup.inference.fitting._batched_fit.run_block`, on the worker's device: on a Dask
cluster the tasks ask for the campaign's resources, ``{"GPU": 1}`` by default, like every campaign
task) and returns every start's end state as JSON (:func:`start_record`). The host then gathers
the blocks in start order, clusters the end states into distinct optima and polishes the best ones
with fides (:func:`~diffsoup.inference.fitting._batched_fit.polish_ends`; in
:func:`~diffsoup.distributed._start_runs.fit_of`).

Growing the number of starts keeps every block already accepted: given the ledger, the blocks it
holds (with the same seed, ``starts_per_block`` and optimizer) keep their ranges, a partial last
block included, and the new starts follow in new blocks (:func:`recorded_blocks`). So block ``b``
starts at ``b * starts_per_block`` unless an earlier, smaller run left a partial block before it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..inference import AbstractLoweredStudy, StartResult, window_solves
from ..inference.fitting._batched_fit import run_block
from ..inference.fitting._batched_trust_region import BatchedTrustRegion
from ..inference.fitting._starts import start_points
from ..store import Ledger
from ._analytic_memo import analytic_once
from ._lowered_cache import fingerprint_of, lowered_from

# What an item of a block holds besides its tags.
BLOCK_KEYS = ("task_id", "block", "first", "count", "seed", "starts_per_block", "optimizer", "points",
              "resample_failed_starts", "analytic")  # fmt: skip


def block_task_id(block: int) -> str:
    """The ``task_id`` of block ``block``: ``block-0000``, ``block-0001``, ..."""
    return f"block-{block:04d}"


def points_digest(points: np.ndarray) -> str:
    """A SHA-256 (16 hex digits) of start points (float64, C order): what a block's item holds of them."""
    return hashlib.sha256(np.ascontiguousarray(points, dtype=np.float64).tobytes()).hexdigest()[:16]


def check_starts_per_block(starts_per_block: Any, optimizer: BatchedTrustRegion, platform: str) -> int:
    """``starts_per_block`` as a positive count (None: the optimizer's lanes on ``platform``, the JAX
    platform the blocks run on: ``BatchedTrustRegion.lanes_on``).

    Raises:
        ValueError: for anything else, naming it.
    """
    if starts_per_block is None:
        return optimizer.lanes_on(platform)
    if isinstance(starts_per_block, bool) or not isinstance(starts_per_block, (int, np.integer)) or starts_per_block < 1:
        raise ValueError(f"multistart: starts_per_block={starts_per_block!r} must be a positive count of starts (None: "
                         "the optimizer's lanes).")  # fmt: skip
    return int(starts_per_block)


def start_record(start: StartResult, index: int, status: str) -> dict:
    """A start's end state as JSON (its index in the start stream and the status that ended it
    added); :func:`~diffsoup.distributed._start_runs.start_of` reads it back."""
    return {"index": int(index), "x0": start.x0, "x": start.x,
            "objective": float(start.objective) if np.isfinite(start.objective) else None, "success": bool(start.success),
            "status": status, "message": start.message, "n_evaluations": int(start.n_evaluations),
            "n_iterations": int(start.n_iterations), "seconds": float(start.seconds),
            "failures": [list(f) for f in start.failures], "resampled": int(start.resampled)}  # fmt: skip


class BlockTask:
    """A campaign task: the batched phase over one block of starts (the item carries its range).

    Args:
        lowered: the lowered study, or a picklable zero-argument factory returning one (lowered
            once per worker process, in the process's cache under the factory's fingerprint).
        optimizer: the batched optimizer (its ``lanes``: the starts advanced together).
        analytic: the names of the parameters optimized analytically at each evaluation (as the
            driver found them; empty for none): noise levels alone are optimized in the lanes.

    Its result (JSON) holds ``starts`` (:func:`start_record` of each start, in order), the block's
    settings (``seed``, ``starts_per_block``, ``optimizer``, ``analytic``: a conflict names the changed ones)
    and where it ran: ``window_solves``, ``built_here``, ``host``, ``pid``, ``slurm_job``.
    """

    def __init__(self, lowered: AbstractLoweredStudy | Callable[[], AbstractLoweredStudy], optimizer: BatchedTrustRegion,
                 analytic: Sequence[str] = ()):  # fmt: skip
        self.lowered, self.optimizer = lowered, optimizer
        self.analytic = tuple(analytic)
        self.fingerprint = None if isinstance(lowered, AbstractLoweredStudy) else fingerprint_of(lowered)

    def __call__(self, item: Mapping[str, Any]) -> dict:
        solves_before = window_solves()
        low, built = lowered_from(self.lowered, self.fingerprint)
        first, count, seed = int(item["first"]), int(item["count"]), int(item["seed"])
        points = start_points(low, count, seed, first=first)
        if points_digest(points) != item["points"]:
            raise ValueError(f"{item['task_id']}: the study lowered here gives other start points than the driver's "
                             "(another study file or lowering options on this worker?); run the driver and the "
                             "workers on the same study.")  # fmt: skip
        attempts = int(item["resample_failed_starts"])
        block = run_block(low, self.optimizer, points, [True] * count, seed=seed, first=first, attempts=attempts,
                          analytic=analytic_once(low, self.analytic))  # fmt: skip
        return {"starts": [start_record(s, first + i, status) for i, (s, status) in enumerate(zip(*block))],
                "seed": seed, "starts_per_block": int(item["starts_per_block"]), "optimizer": item["optimizer"],
                "analytic": list(self.analytic), "window_solves": window_solves() - solves_before, "built_here": built,
                "host": os.uname().nodename, "pid": os.getpid(), "slurm_job": os.environ.get("SLURM_JOB_ID")}  # fmt: skip


def recorded_blocks(ledger_path: Any, *, seed: int, starts_per_block: int, optimizer: BatchedTrustRegion) -> dict:
    """Block index -> ``(first, count)`` of the blocks a ledger holds as accepted, run with this
    ``seed``, ``starts_per_block`` and optimizer, in an unbroken run from block 0 (empty without a
    ledger or with other settings: those conflict as before)."""
    if ledger_path is None or not os.path.isfile(ledger_path):
        return {}
    try:
        ledger = Ledger.load(ledger_path)
    except Exception:  # noqa: BLE001 (an unreadable ledger is the campaign's to report)
        return {}
    out, first = {}, 0
    for b in range(len(ledger)):
        record = ledger.get(block_task_id(b))
        result = record.get("result") if record and record.get("state") == "accepted" else None
        if not isinstance(result, Mapping):
            break
        if (result.get("seed"), result.get("starts_per_block"), result.get("optimizer")) != (
                seed, starts_per_block, optimizer.lane_settings()):  # fmt: skip
            break
        indices = [int(r["index"]) for r in result.get("starts", [])]
        if not indices or indices != list(range(first, first + len(indices))):
            break
        out[b] = (first, len(indices))
        first += len(indices)
    return out


def block_items(lowered: AbstractLoweredStudy, optimizer: BatchedTrustRegion, *, starts: int, seed: int,
                starts_per_block: int, resample_failed_starts: int, tags: Mapping[str, Any],
                recorded: Mapping[int, tuple[int, int]] | None = None, analytic: Sequence[str] = ()) -> list[dict]:  # fmt: skip
    """One item per block of ``starts_per_block`` starts (the last one may hold fewer); the blocks
    ``recorded`` (:func:`recorded_blocks`) keep their ranges where they lie within ``starts``. An
    item names the ``analytic`` parameters where there are any (blocks recorded without them, or
    with others, conflict: their lanes ran on another objective)."""
    starts = int(starts)
    points = start_points(lowered, starts, int(seed))
    items, first, b = [], 0, 0
    while first < starts:
        kept = (recorded or {}).get(b)
        if kept is not None and kept[0] == first and first + kept[1] <= starts:
            count = kept[1]
        else:
            count = min(starts_per_block, starts - first)
        items.append({"task_id": block_task_id(b), "block": b, "first": first, "count": count, "seed": int(seed),
                      "starts_per_block": starts_per_block, "optimizer": optimizer.lane_settings(),
                      "points": points_digest(points[first : first + count]),
                      "resample_failed_starts": int(resample_failed_starts),
                      **({"analytic": list(analytic)} if analytic else {}), **tags})  # fmt: skip
        first, b = first + count, b + 1
    return items


def block_starts(items: Sequence[Mapping[str, Any]], results: Mapping[str, Any]) -> list[tuple[int, dict]]:
    """``(start index, record)`` of every start of the accepted blocks, in start order."""
    out = []
    for item in items:
        if item["task_id"] in results:
            out.extend((int(r["index"]), r) for r in results[item["task_id"]]["starts"])
    return sorted(out, key=lambda pair: pair[0])


def conflict_detail(ledger_path: Any, items: Sequence[Mapping[str, Any]]) -> str:
    """What changed between the blocks recorded in the ledger and ``items`` (their ``seed``,
    ``starts_per_block``, optimizer, analytic parameters), in words; empty when the ledger does not say."""
    try:
        ledger = Ledger.load(ledger_path)
    except Exception:  # noqa: BLE001 (the detail must not hide the conflict itself)
        return ""
    changes = []
    for item in items:
        record = ledger.get(item["task_id"])
        result = record.get("result") if record else None
        if not isinstance(result, Mapping):
            continue
        for key in ("seed", "starts_per_block", "optimizer"):
            if key in result and result[key] != item[key]:
                changes.append(f"{key} {result[key]!r}, now {item[key]!r}")
        if result.get("analytic", []) != item.get("analytic", []):  # the lanes' objective (noise levels in closed form)
            changes.append(f"analytic parameters {result.get('analytic', [])!r}, now {item.get('analytic', [])!r}")
        if changes:
            return f"{item['task_id']} ran with " + "; ".join(changes)
    return ""
