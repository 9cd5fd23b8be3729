"""The tables diffsoup's dashboard page shows, computed from the published records (plain dicts
of column lists; no bokeh here, so they are tested without it).

A study of 100,000 experiments is shown aggregated: one row per study, one per (study, shard) with
its counts by ``ds.Status``, and the failing experiments alone, at most :data:`MAX_ROWS` of them
(the count of all is in the study's row and in :func:`summary_text`).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

def published(scheduler: Any, kind: str = "studies") -> dict:
    """The records of ``kind`` ("studies", "campaigns", "ensembles") in the scheduler's metadata."""
    try:
        return dict(scheduler.get_metadata(keys=["diffsoup", kind], default={}) or {})
    except Exception:  # noqa: BLE001 (metadata missing or malformed: show nothing)
        return {}


MAX_ROWS = 500
"""Rows at most in the failing-experiments and failed-tasks tables."""

STUDY_COLUMNS = ("study", "name", "state", "experiments", "ok", "failed", "pending", "evaluations",
                 "last_mode", "last_seconds", "rebuilds", "workers", "updated")  # fmt: skip
SHARD_COLUMNS = ("study", "shard", "worker", "experiments", "ok", "failed", "pending", "statuses")
FAILING_COLUMNS = ("study", "experiment", "shard", "worker", "status", "steps")
CAMPAIGN_COLUMNS = ("campaign", "name", "state", "tasks", "accepted", "running", "queued", "failed",
                    "best", "at_best", "ledger", "updated")  # fmt: skip
FAILED_TASK_COLUMNS = ("campaign", "task", "error")
WATERFALL_COLUMNS = ("campaign", "rank", "objective", "task")
ENSEMBLE_COLUMNS = ("ensemble", "store", "state", "chunks_done", "chunks", "simulations",
                    "simulations_per_second", "failures", "updated")  # fmt: skip


def _columns(names: tuple[str, ...], rows: list[tuple]) -> dict[str, list]:
    return {name: [row[i] for row in rows] for i, name in enumerate(names)}


def _natural(text: str) -> tuple:
    """Sort key reading digit runs as numbers ("e2" before "e10")."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def _statuses(counter: Counter) -> str:
    return ", ".join(f"{name}: {n}" for name, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


def study_tables(studies: dict[str, dict]) -> dict[str, dict[str, list]]:
    """``{"studies": columns, "shards": columns, "failing": columns}`` of the published studies
    (failing experiments: at most :data:`MAX_ROWS`, in study then id order)."""
    study_rows, shard_rows, failing = [], [], []
    for fp, s in sorted(studies.items(), key=lambda kv: str(kv[1].get("name"))):
        experiments = s.get("experiments") or {}
        fails: list[tuple] = []
        states: Counter = Counter()
        per_shard: dict[int, dict] = {}
        for eid, e in experiments.items():
            state = e.get("state", "pending")
            states[state] += 1
            shard = per_shard.setdefault(int(e.get("shard", -1)), {"worker": e.get("worker"), "states": Counter(),
                                                                   "statuses": Counter(), "n": 0})  # fmt: skip
            shard["n"] += 1
            shard["states"][state] += 1
            shard["worker"] = e.get("worker") or shard["worker"]
            if e.get("status"):
                shard["statuses"][e["status"]] += 1
            if state == "failed":
                fails.append((fp, str(eid), int(e.get("shard", -1)), e.get("worker") or "", e.get("status") or "",
                                int(e.get("steps", -1))))  # fmt: skip
        failing += sorted(fails, key=lambda row: _natural(row[1]))[: MAX_ROWS - len(failing)]
        workers = sorted({sh["worker"] for sh in per_shard.values() if sh["worker"]})
        study_rows.append((fp, s.get("name", ""), s.get("state", ""), len(experiments), states["ok"], states["failed"],
                           states["pending"], int(s.get("evaluations") or 0), s.get("last_mode") or "",
                           s.get("last_seconds") if s.get("last_seconds") is not None else float("nan"),
                           int(s.get("rebuilds") or 0), len(workers), s.get("updated", "")))  # fmt: skip
        for sid in sorted(per_shard):
            sh = per_shard[sid]
            shard_rows.append((fp, sid, sh["worker"] or "", sh["n"], sh["states"]["ok"], sh["states"]["failed"],
                               sh["states"]["pending"], _statuses(sh["statuses"])))  # fmt: skip
    return {"studies": _columns(STUDY_COLUMNS, study_rows), "shards": _columns(SHARD_COLUMNS, shard_rows),
            "failing": _columns(FAILING_COLUMNS, failing)}  # fmt: skip


def campaign_tables(campaigns: dict[str, dict]) -> dict[str, dict[str, list]]:
    """``{"campaigns": columns, "failed": columns, "waterfall": columns}`` of the published
    campaigns; the waterfall holds each campaign's objectives sorted (rank 1 = best)."""
    rows, failed, fall = [], [], []
    for cid, c in sorted(campaigns.items(), key=lambda kv: str(kv[1].get("started"))):
        counts = c.get("counts") or {}
        best = c.get("best")
        rows.append((cid, c.get("name", ""), c.get("state", ""), int(c.get("tasks") or 0),
                     int(counts.get("accepted", 0)),
                     int(counts.get("running", 0)), int(counts.get("queued", 0)), int(counts.get("failed", 0)),
                     float("nan") if best is None else float(best), int(c.get("at_best") or 0), c.get("ledger", ""),
                     c.get("updated", "")))  # fmt: skip
        for task, error in (c.get("failed") or [])[: MAX_ROWS - len(failed)]:
            failed.append((cid, task, error))
        for rank, (task, value) in enumerate(sorted(c.get("objectives") or [], key=lambda tv: tv[1]), start=1):
            fall.append((cid, rank, float(value), task))
    return {"campaigns": _columns(CAMPAIGN_COLUMNS, rows), "failed": _columns(FAILED_TASK_COLUMNS, failed),
            "waterfall": _columns(WATERFALL_COLUMNS, fall)}  # fmt: skip


def ensemble_table(ensembles: dict[str, dict]) -> dict[str, list]:
    """The columns of the published ensembles (failures: the simulations whose status is not
    ``SUCCESS``, by status)."""
    rows = []
    for eid, e in sorted(ensembles.items(), key=lambda kv: str(kv[1].get("started"))):
        status = Counter({k: int(v) for k, v in (e.get("status") or {}).items() if k != "SUCCESS"})
        rate = e.get("simulations_per_second")
        rows.append((eid, e.get("store", ""), e.get("state", ""), int(e.get("chunks_done") or 0),
                     int(e.get("chunks") or 0),
                     int(e.get("simulations") or 0), float("nan") if rate is None else float(rate),
                     _statuses(status) or "none", e.get("updated", "")))  # fmt: skip
    return _columns(ENSEMBLE_COLUMNS, rows)


def summary_text(study: dict, campaigns: dict, ensembles: dict) -> str:
    """The page's headline, one line per run (HTML): experiments and failures of each study with
    the failing ids (the first 20), starts and the best objective of each campaign, chunks of each
    ensemble.

    Args:
        study: :func:`study_tables` of the studies.
        campaigns, ensembles: the published records.
    """
    lines = []
    cols, fails = study["studies"], study["failing"]
    for i, fp in enumerate(cols["study"]):
        ids = [e for s, e in zip(fails["study"], fails["experiment"]) if s == fp]
        more = f" (+{cols['failed'][i] - 20} more)" if cols["failed"][i] > 20 else ""
        failing = f"; failed: {', '.join(ids[:20])}{more}" if ids else ""
        lines.append(f"<b>study {cols['name'][i]}</b> ({cols['state'][i]}): {cols['experiments'][i]} experiments, "
                     f"{cols['ok'][i]} ok, {cols['failed'][i]} failed, {cols['pending'][i]} pending, "
                     f"{cols['evaluations'][i]} evaluations{failing}")  # fmt: skip
    for c in sorted(campaigns.values(), key=lambda c: str(c.get("started"))):
        counts = c.get("counts") or {}
        best = c.get("best")
        best_text = "none yet" if best is None else f"{best:.8g} (reached by {c.get('at_best', 0)})"
        lines.append(f"<b>campaign {c.get('name', '')}</b> ({c.get('state', '')}): {c.get('tasks', 0)} tasks, "
                     f"{counts.get('accepted', 0)} done, {counts.get('running', 0)} running, "
                     f"{counts.get('queued', 0)} pending, {counts.get('failed', 0)} failed; best objective "
                     f"{best_text}; ledger {c.get('ledger', '')}")  # fmt: skip
    for e in sorted(ensembles.values(), key=lambda e: str(e.get("started"))):
        rate = e.get("simulations_per_second")
        lines.append(f"<b>ensemble {e.get('store', '')}</b> ({e.get('state', '')}): {e.get('chunks_done', 0)} of "
                     f"{e.get('chunks', 0)} chunks written"
                     + (f", {rate:.4g} simulations/s" if rate else ""))  # fmt: skip
    return "<br>".join(lines) or "No diffsoup run has published its state on this scheduler yet."
