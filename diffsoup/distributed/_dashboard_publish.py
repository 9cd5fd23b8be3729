"""Publishing a run's state to the Dask scheduler for diffsoup's dashboard page and JSON routes.

Three kinds of runs publish, each under its own metadata key of the scheduler
(``client.set_metadata``), as typed, versioned JSON (the schemas are documented in
:mod:`diffsoup.distributed._dashboard`):

- studies of ``ds.distributed.run`` (``("diffsoup", "studies", <fingerprint>)``, published by the
  study's Dask backend through :func:`publish_study`);
- campaigns of ``checkpointed_map`` (multistart fits, profiles; ``("diffsoup", "campaigns",
  <id>)``, :class:`CampaignPublisher`, fed by the campaign's ledger after every write);
- ensembles written to Zarr (``("diffsoup", "ensembles", <id>)``, :func:`ensemble_reporter`).

Publishing never slows a run: a :class:`Publisher` sends at most once per ``interval`` seconds
(building records takes at most 1 % of the wall time: the interval grows with their cost),
asynchronously (the message is queued on the client's event loop; the run does not wait for the
scheduler), and a change that arrives in between is sent once the interval has passed. The last
state of a run (closed, finished) is sent at once and waited for, so the page ends on it.
Publishing never fails a run: errors are logged at debug level and dropped.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ..store._ledger import now_iso
from ._dashboard import install

logger = logging.getLogger("diffsoup.dashboard")

PREFIX = "diffsoup"
STUDIES, CAMPAIGNS, ENSEMBLES = "studies", "campaigns", "ensembles"
CAMPAIGN_SCHEMA = "diffsoup.campaign/1"
ENSEMBLE_SCHEMA = "diffsoup.ensemble/1"

INTERVAL = 0.5
"""Seconds between two sends of one run's state (at least; see :class:`Publisher`)."""
COST_FACTOR = 100.0
"""The interval is at least this many times the seconds building the last record took."""

# Clients that published a study: a campaign run beside a study (a multistart fit whose study runs
# on Dask, its campaign serial) publishes to the same schedulers.
_CLIENTS: "weakref.WeakSet[Any]" = weakref.WeakSet()
_INSTALLED: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _now() -> str:
    return now_iso()


def _live(client: Any) -> bool:
    return client is not None and getattr(client, "status", "closed") in ("running", "connecting", "newly-created")


def clients_for(client: Any = None) -> list:
    """The clients to publish to: ``client`` if given, else the default Dask client and the clients
    studies publish through (none when Dask was never imported: publishing then costs nothing)."""
    if client is not None:
        return [client] if _live(client) else []
    if "distributed" not in sys.modules:
        return []
    found = [c for c in list(_CLIENTS) if _live(c)]
    try:
        from distributed import default_client

        default = default_client()
        if _live(default) and default not in found:
            found.append(default)
    except Exception:  # noqa: BLE001 (no default client)
        pass
    return found


def ensure_installed(client: Any) -> None:
    """Install diffsoup's routes and page on ``client``'s scheduler once (see ``_dashboard.install``)."""
    if client in _INSTALLED or getattr(client, "asynchronous", False):  # an asynchronous client's run does it
        return
    _INSTALLED.add(client)
    try:
        client.run_on_scheduler(install)
    except Exception as exc:  # noqa: BLE001 (a scheduler without HTTP: the run still runs)
        logger.info("diffsoup dashboard not installed: %s", exc)


class Publisher:
    """Sends one run's record to the schedulers of ``clients`` under ``keys``, throttled.

    Args:
        clients: the Dask clients to publish through.
        keys: the metadata key (``["diffsoup", kind, id]``).
        interval: least seconds between two sends (:data:`INTERVAL`).

    Call :meth:`update` with a function building the record whenever the run's state changes;
    the function is called only when a send is due (so building costs nothing in between).
    """

    def __init__(self, clients: list, keys: list[str], interval: float = INTERVAL):
        self.clients, self.keys, self.interval = list(clients), list(keys), float(interval)
        self.sent = 0
        self._last = -math.inf
        self._cost = 0.0
        self._build: Callable[[], dict] | None = None
        self._trailing = False
        self._lock = threading.Lock()
        self._pumps: dict[int, dict] = {}  # per client, on its event loop: the record to send next

    @property
    def period(self) -> float:
        """Seconds between sends now: the interval, or more where building a record is slow."""
        return max(self.interval, COST_FACTOR * self._cost)

    def update(self, build: Callable[[], dict], final: bool = False) -> None:
        """Publish the record ``build()`` now if due (or ``final``), else once it is due."""
        if not self.clients:
            return
        schedule = None
        with self._lock:
            self._build = build
            wait = self._last + self.period - time.monotonic()
            if final or wait <= 0:
                due = self._take()
            else:
                due = None
                if not self._trailing:
                    self._trailing, schedule = True, wait
        # Sent outside the lock: a final send waits for the event loop, which may be in _flush.
        if due is not None:  # the first record too is waited for: the routes answer once a run starts
            self._send(due, wait_for_it=final or self.sent == 0)
        elif schedule is not None:
            loop = self.clients[0].loop  # one trailing send suffices (it sends to every client)
            loop.add_callback(lambda: loop.call_later(schedule, self._flush))

    def _take(self) -> Callable[[], dict] | None:
        build, self._build = self._build, None
        self._last = time.monotonic()
        return build

    def _flush(self) -> None:
        with self._lock:
            self._trailing = False
            build = self._take() if self._build is not None else None
        if build is not None:
            self._send(build)

    def _send(self, build: Callable[[], dict], wait_for_it: bool = False) -> None:
        t0 = time.perf_counter()
        try:
            record = build()
        except Exception as exc:  # noqa: BLE001 (a run's state read mid-change: skip this send)
            logger.debug("could not build the dashboard record %s: %s", self.keys, exc)
            return
        self._cost = time.perf_counter() - t0
        self.sent += 1
        for client in self.clients:
            try:
                if wait_for_it and not getattr(client, "asynchronous", False):
                    client.sync(self._pump, client, record, True)
                else:
                    client.loop.add_callback(self._pump, client, record)
            except Exception as exc:  # noqa: BLE001 (a closing client: the dashboard must never fail a run)
                logger.debug("could not publish %s: %s", self.keys, exc)

    async def _pump(self, client: Any, record: dict, wait: bool = False) -> None:
        """On ``client``'s event loop: send ``record``, one message at a time per client, in order
        (a record waiting behind a message in flight is replaced by a newer one). ``wait`` returns
        once ``record`` has reached the scheduler."""
        state = self._pumps.setdefault(id(client), {"next": None, "running": False, "done": []})
        state["next"] = record
        if state["running"]:
            if wait:
                future = asyncio.get_running_loop().create_future()
                state["done"].append(future)
                await future
            return
        state["running"] = True
        try:
            while state["next"] is not None:
                record, state["next"] = state["next"], None
                try:
                    await client.scheduler.set_metadata(keys=self.keys, value=record)
                except Exception as exc:  # noqa: BLE001
                    logger.debug("could not publish %s: %s", self.keys, exc)
        finally:
            state["running"] = False
            for future in state["done"]:
                if not future.done():
                    future.set_result(None)
            state["done"].clear()


# --------------------------------------------------------------------------------------------
# Studies
# --------------------------------------------------------------------------------------------

_STUDY_PUBLISHERS: dict[tuple[int, str], Publisher] = {}


def publish_study(client: Any, fp: str, build: Callable[[], dict], final: bool = False) -> None:
    """Publish the state of study ``fp`` (``ds.distributed.run``) through ``client``, throttled;
    ``final`` (the study closed) sends at once and forgets the study."""
    _CLIENTS.add(client)
    key = (id(client), fp)
    publisher = _STUDY_PUBLISHERS.get(key)
    if publisher is None:
        publisher = _STUDY_PUBLISHERS[key] = Publisher([client], [PREFIX, STUDIES, fp])
    publisher.update(build, final=final)
    if final:
        _STUDY_PUBLISHERS.pop(key, None)


def study_record(backend: Any) -> dict:
    """The record of a study's Dask backend (``_run.DaskBackend``): its status, shards and a copy
    of its per-experiment states (schema ``diffsoup.studies/1``, see ``_dashboard``)."""
    shards = [{"shard": sid, "worker": backend.pin[sid], "experiments": len(m)}
              for sid, m in enumerate(backend.members)]  # fmt: skip
    experiments = {eid: dict(state) for eid, state in list(backend.exp_state.items())}
    return dict(backend.status, shards=shards, experiments=experiments)


# --------------------------------------------------------------------------------------------
# Campaigns
# --------------------------------------------------------------------------------------------


def campaign_id(path: Any) -> str:
    """The key of a campaign on the dashboard: 16 hex digits of SHA-256 of its ledger's path."""
    return hashlib.sha256(str(path).encode()).hexdigest()[:16]


def objective_of(result: Any) -> float | None:
    """A finished task's objective: its result's ``"objective"`` (multistart starts), or the result
    itself when it is a number; None otherwise (or not finite)."""
    value = result.get("objective") if isinstance(result, dict) else result
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


class CampaignPublisher:
    """Publishes a ``checkpointed_map`` campaign from its ledger bookkeeping (a ``CampaignLedger``).

    The record (schema ``diffsoup.campaign/1``)::

        {"schema": "diffsoup.campaign/1", "name": str (the task function), "ledger": str (path),
         "state": "running" | "finished", "started": str, "updated": str (ISO 8601 UTC),
         "tasks": int, "counts": {"accepted": int, "failed": int, "running": int, "queued": int},
         "objectives": [[task_id, float], ...],     # accepted tasks with an objective, by finish time
         "best": float | null, "at_best": int,       # tasks within 1e-6 (relative) of the best
         "failed": [[task_id, str], ...]}            # failed tasks and their errors' first lines

    Args:
        campaign: the ``CampaignLedger``.
        client: the Dask client of the campaign (None: see :func:`clients_for`).
    """

    def __init__(self, campaign: Any, client: Any = None):
        self.campaign, self.client = campaign, client
        function = campaign.ledger.function or "task"
        self.name = function.rsplit(".", 1)[-1]
        self.path = str(campaign.ledger.path)
        self.started = _now()
        self.publisher = Publisher([], [PREFIX, CAMPAIGNS, campaign_id(self.path)])
        self._looked = -math.inf

    def update(self) -> None:
        """Publish the campaign's state (throttled; its end at once)."""
        if not self.publisher.clients:
            now = time.monotonic()
            if now - self._looked < INTERVAL:
                return
            self._looked = now
            self.publisher.clients = clients_for(self.client)
            for c in self.publisher.clients:
                ensure_installed(c)
        states = self.campaign._states.values()
        final = not any(s in ("running", "queued") for s in states)
        self.publisher.update(self.record, final=final)

    def record(self) -> dict:
        """The campaign's record now."""
        c = self.campaign
        states = dict(c._states)
        counts = {k: 0 for k in ("accepted", "failed", "running", "queued")}
        objectives, failed = [], []
        for task_id, s in states.items():
            counts[s if s in counts else "queued"] += 1
            if s in ("accepted", "failed"):
                record = c.ledger.get(task_id)
                if s == "accepted":
                    value = objective_of(record.get("result"))
                    if value is not None:
                        objectives.append((record.get("finished") or "", task_id, value))
                else:
                    failed.append([task_id, str(record.get("error") or "").split("\n", 1)[0][:200]])
        objectives.sort()
        values = [v for _, _, v in objectives]
        best = min(values) if values else None
        at_best = sum(v <= best + 1e-6 * max(1.0, abs(best)) for v in values) if values else 0
        done = counts["running"] == 0 and counts["queued"] == 0
        return {"schema": CAMPAIGN_SCHEMA, "name": self.name, "ledger": self.path,
                "state": "finished" if done else "running", "started": self.started, "updated": _now(),
                "tasks": len(states), "counts": counts, "objectives": [[t, v] for _, t, v in objectives],
                "best": best, "at_best": int(at_best), "failed": failed}  # fmt: skip


_CAMPAIGNS: "weakref.WeakKeyDictionary[Any, CampaignPublisher]" = weakref.WeakKeyDictionary()


def publish_campaign(campaign: Any, client: Any = None) -> None:
    """Publish a campaign's state (a ``CampaignLedger``), throttled: called after every ledger
    write, and by the Dask runner with its client. Publishes nothing (at no cost) where no Dask
    scheduler is there; never raises."""
    try:
        publisher = _CAMPAIGNS.get(campaign)
        if publisher is None or (client is not None and publisher.client is not client):
            publisher = _CAMPAIGNS[campaign] = CampaignPublisher(campaign, client)
        publisher.update()
    except Exception as exc:  # noqa: BLE001 (the dashboard must never fail a campaign)
        logger.debug("campaign not published: %s", exc)


# --------------------------------------------------------------------------------------------
# Ensembles
# --------------------------------------------------------------------------------------------


class EnsemblePublisher:
    """Publishes an ensemble's write into Zarr (``Ensemble.to_zarr``), polled about once a second.

    The record (schema ``diffsoup.ensemble/1``)::

        {"schema": "diffsoup.ensemble/1", "store": str (path), "state": "running" | "finished",
         "started": str, "updated": str, "chunks": int, "chunks_done": int,
         "chunks_this_run": int, "simulations_per_second": float | null,
         "simulations": int, "status": {ds.Status name: count}}   # over the chunks written

    Failures are counted from the ``status`` array of each chunk once it is written (each chunk
    read once).
    """

    def __init__(self, target: Any, total: int, to_write: int, client: Any = None):
        self.target, self.total, self.to_write = target, int(total), int(to_write)
        clients = clients_for(client)
        for c in clients:
            ensure_installed(c)
        self.publisher = Publisher(clients, [PREFIX, ENSEMBLES, campaign_id(target.path)], interval=1.0)
        self.started, self.t0 = _now(), time.perf_counter()
        self.seen: set[int] = set()
        self.status: dict[str, int] = {}
        self.done_before = total - to_write

    def _count_new_chunks(self) -> int:
        runs = self.target.chunk_runs()
        names = {int(k): v for k, v in self.target.layout.status_codes.items()}
        for i in (int(i) for i in np.flatnonzero(runs > 0)):
            if i in self.seen:
                continue
            codes, counts = np.unique(self.target.chunk_status(i), return_counts=True)
            for code, n in zip(codes, counts):
                name = names.get(int(code), str(int(code)))
                self.status[name] = self.status.get(name, 0) + int(n)
            self.seen.add(i)
        return len(self.seen)

    def record(self, final: bool = False) -> dict:
        """The ensemble's record now."""
        done = self._count_new_chunks()
        seconds = time.perf_counter() - self.t0
        this_run = max(0, done - self.done_before)
        rows = self.target.layout.chunk_rows
        return {"schema": ENSEMBLE_SCHEMA, "store": str(self.target.path),
                "state": "finished" if final else "running", "started": self.started, "updated": _now(),
                "chunks": self.total, "chunks_done": done, "chunks_this_run": this_run,
                "simulations_per_second": this_run * rows / seconds if seconds > 0 and this_run else None,
                "simulations": sum(self.status.values()), "status": dict(self.status)}  # fmt: skip

    def __call__(self, done: int | None = None, final: bool = False) -> None:
        self.publisher.update(lambda: self.record(final), final=final)


def ensemble_reporter(target: Any, total: int, to_write: int, report: Callable[[int], None] | None,
                      client: Any = None) -> Callable[[int], None] | None:  # fmt: skip
    """``report`` (the progress callback of ``Ensemble.to_zarr``, or None), extended to publish
    the write on the dashboard when a Dask scheduler is there; ``report`` itself otherwise."""
    if not clients_for(client):
        return report
    try:
        publisher = EnsemblePublisher(target, total, to_write, client)
    except Exception as exc:  # noqa: BLE001
        logger.debug("ensemble not published: %s", exc)
        return report

    def both(done: int) -> None:
        if report is not None:
            report(done)
        publisher(done, final=done >= total)

    return both
