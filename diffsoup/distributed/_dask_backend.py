"""The Dask execution of ``ds.distributed.run``: :class:`DaskBackend` (one task per shard per
request, pinned to the worker holding the shard, retried whole; the study's state published for
the dashboard), the shard's task run on a worker (:func:`_shard_task`, which keeps the shard in the
process's cache of lowered studies), the connection to the cluster asked for, and
:func:`run_dask`, the context manager that ties them to a :class:`DistributedStudy`."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import pickle
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import cloudpickle

from ..inference.objective._lower import LoweredStudy, lower
from ..inference.objective._parts import AbstractPart
from ..inference.study._study import Study
from ..integrate import Status
from ..store._ledger import now_iso
from ._clusters import embedded_cluster
from ._dashboard import dashboard_url, install
from ._dashboard_publish import publish_study, study_record
from ._distributed_study import DistributedStudy
from ._lowered_cache import LOWERED
from ._run_options import RunOptions
from ._shards import build_shard, serve_request, shard_key, shard_members, study_fingerprint

logger = logging.getLogger("diffsoup.distributed")


@dataclasses.dataclass(frozen=True)
class ShardReply:
    """What one shard's Dask task returns: its part (None for a compile request), the worker that
    ran it, whether the shard was built (compiled anew) there, and the task's seconds."""

    part: AbstractPart | None
    worker: str
    built: bool
    seconds: float


def _shard_task(payload: bytes, fp: str, sid: int, members: list[int], mode: str, argument: Any) -> ShardReply:
    """The Dask task of one shard: build the shard once per worker, then serve the request."""
    from distributed import get_worker

    t0 = time.perf_counter()

    def build() -> LoweredStudy:
        study, options = pickle.loads(payload)
        return build_shard(study, options, members)

    shard, built = LOWERED.get(fp, shard_key(members), build)
    part = serve_request(shard, mode, argument)
    return ShardReply(part, get_worker().address, built, time.perf_counter() - t0)


def _release(fp: str) -> int:
    """Run on every worker: drop the shards of study ``fp``; returns how many were dropped."""
    return LOWERED.discard(fp)


def _now() -> str:
    return now_iso()


class DaskBackend:
    """The client's side of a Dask run: one task per shard per request, pinned to the shard's
    worker, retried whole; publishes the study's state for the dashboard route.

    Attributes:
        members: study indices of each shard; pin: shard -> worker address.
        retries: whole-evaluation retries; rebuilds: shards compiled again after a worker was lost.
        exp_state: experiment id -> its dashboard record.
        last_seconds: each shard task's seconds in the last request.
    """

    def __init__(self, client: Any, study: Study, options: Mapping[str, Any], fp: str, execution: RunOptions):
        from ._worker import PLUGIN_NAME, DiffsoupWorkerPlugin

        self.client, self.fp, self.name = client, fp, execution.name
        self.resources = dict(execution.resources)
        self.retries = execution.retries
        client.register_plugin(DiffsoupWorkerPlugin(), name=PLUGIN_NAME)
        workers = self._lanes(execution.worker_timeout)
        self.members = shard_members(study, len(workers))
        self.pin = {sid: workers[sid % len(workers)] for sid in range(len(self.members))}
        buf = io.BytesIO()
        cloudpickle.dump((study, dict(options)), buf)
        self.payload_bytes = buf.getvalue()
        self.payload = client.scatter(self.payload_bytes, broadcast=True, hash=False)
        self.rebuilds = 0
        self.last_seconds: list[float] = []
        self.ids = list(study.ids)
        self.status = {"name": self.name, "state": "running", "evaluations": 0, "last_mode": None,
                       "last_seconds": None, "rebuilds": 0, "updated": _now()}  # fmt: skip
        self.exp_state = {
            self.ids[i]: {"shard": sid, "worker": self.pin[sid], "state": "pending", "status": None, "steps": -1}
            for sid, m in enumerate(self.members) for i in m
        }  # fmt: skip
        self._publish()

    def _lanes(self, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            info = self.client.scheduler_info(n_workers=-1)["workers"]
            lanes = sorted(a for a, w in info.items()
                           if all((w.get("resources") or {}).get(r, 0) >= v for r, v in self.resources.items()))  # fmt: skip
            if lanes:
                return lanes
            if time.monotonic() > deadline:
                offered = {a: w.get("resources") or {} for a, w in info.items()}
                raise RuntimeError(
                    f"ds.distributed.run: no worker offers resources {self.resources} after {timeout:g} s "
                    f"(workers: {offered or 'none'}). Start workers with --resources \"GPU=1\", pass resources= "
                    "that your workers carry, or raise worker_timeout (diffsoup.run.worker-timeout)."
                )
            time.sleep(0.2)

    def _publish(self, final: bool = False) -> None:
        publish_study(self.client, self.fp, lambda: study_record(self), final=final)

    def _submit(self, mode: str, argument: Any) -> list:
        suffix = uuid.uuid4().hex[:8]
        return [
            self.client.submit(
                _shard_task, self.payload, self.fp, sid, m, mode, argument,
                key=f"diffsoup-{mode}-{self.name}-shard{sid}-{suffix}",
                workers=[self.pin[sid]], allow_other_workers=True,
                resources=self.resources or None, pure=False,
            )
            for sid, m in enumerate(self.members)
        ]  # fmt: skip

    def __call__(self, mode: str, argument: Any) -> list[AbstractPart | None]:
        t0 = time.perf_counter()
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            futures = self._submit(mode, argument)
            try:
                replies: list[ShardReply] = self.client.gather(futures)
                break
            except Exception as exc:  # a worker lost repeatedly, scattered data lost, ...
                last = exc
                logger.warning("evaluation %s failed on attempt %d (%s: %s); retrying", mode, attempt + 1,
                               type(exc).__name__, exc)  # fmt: skip
                self.client.cancel(futures)
                self.payload = self.client.scatter(self.payload_bytes, broadcast=True, hash=False)
        else:
            raise RuntimeError(f"ds.distributed.run: the {mode} evaluation failed {self.retries + 1} times") from last
        for sid, reply in enumerate(replies):
            if reply.built and self.status["evaluations"] > 0 and reply.worker != self.pin[sid]:
                self.rebuilds += 1
            self.pin[sid] = reply.worker
        self.last_seconds = [reply.seconds for reply in replies]
        if mode != "compile":
            self.status.update(evaluations=self.status["evaluations"] + 1, last_mode=mode,
                               last_seconds=time.perf_counter() - t0)  # fmt: skip
            for reply in replies:
                for i, n in reply.part.steps.items():
                    eid = self.ids[i]
                    fail = reply.part.failures.get(eid)
                    self.exp_state[eid].update(worker=reply.worker, steps=int(n), state="failed" if fail else "ok",
                                               status=Status(fail).name if fail else Status(0).name)  # fmt: skip
        self.status.update(updated=_now(), rebuilds=self.rebuilds)
        self._publish()
        return [reply.part for reply in replies]

    def close(self) -> None:
        self.status.update(state="closed", updated=_now())
        self._publish(final=True)
        try:
            self.client.run(_release, self.fp)
        except Exception as exc:  # noqa: BLE001
            logger.debug("releasing shards failed: %s", exc)
        try:
            self.client.cancel([self.payload])
        except Exception:  # noqa: BLE001
            pass


def _connect(cluster: Any, resources: Mapping[str, float], n_workers: int | None):
    """(client, things to close) for ``cluster=``: None, a Client, an address, or a Cluster."""
    from distributed import Client, default_client

    if cluster is None:
        try:
            return default_client(), []
        except ValueError:
            pass
        local, client = embedded_cluster(resources, n_workers=n_workers)
        return client, [client, local]
    if isinstance(cluster, Client):
        return cluster, []
    if isinstance(cluster, str):
        client = Client(cluster, set_as_default=False)
        return client, [client]
    if hasattr(cluster, "scheduler_address"):  # LocalCluster, SpecCluster, dask-jobqueue clusters
        client = Client(cluster, set_as_default=False)
        return client, [client]
    raise TypeError(
        f"ds.distributed.run: cluster= must be None (the active client, else an embedded LocalCluster), a "
        f"distributed.Client, a scheduler address or a Dask cluster object, not {type(cluster).__name__}."
    )


@contextlib.contextmanager
def run_dask(study: Study, options: dict, execution: RunOptions) -> Iterator[DistributedStudy]:
    from distributed.spans import span

    base = lower(study, **options)  # bad lowering options raise before any cluster starts
    client, owned = _connect(execution.cluster, execution.resources, execution.n_workers)
    backend = None
    try:
        try:
            client.run_on_scheduler(install)
        except Exception as exc:  # noqa: BLE001 (no HTTP server: the fit still runs)
            logger.info("diffsoup dashboard route not installed: %s", exc)
        fp = study_fingerprint(study, options)
        with span(f"diffsoup-run-{execution.name}"):
            backend = DaskBackend(client, study, options, fp, execution)
            lowered = DistributedStudy(base, backend, backend.members, fp)
            lowered.client = client
            lowered.dashboard = dashboard_url(client)
            yield lowered
    finally:
        if backend is not None:
            backend.close()
        for thing in owned:
            try:
                thing.close()
            except Exception:  # noqa: BLE001
                pass
