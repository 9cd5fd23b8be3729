"""``ds.distributed.run``: a study lowered over the workers of a Dask cluster (or the processes of
a multi-process JAX run), used as ``with ds.distributed.run(study) as lowered:``.

The options of ``run`` are of two kinds, kept apart: *execution* options (:class:`RunOptions`:
cluster, resources, name, n_workers, retries, worker_timeout; a field left None reads the
``diffsoup`` Dask configuration, ``run.*`` in ``diffsoup.yaml``) and *lowering* options (what
``ds.lower`` takes). An unknown keyword raises at once, naming both lists.

The run goes through the public seam of a lowered study and nothing else: each shard of the
experiments is ``lower(study, ...).restrict(shard)``; it returns typed parts
(``shard.evaluate(mode, theta)``), and the :class:`DistributedStudy` the block receives combines them
(``combine_parts``) and finishes them as a local ``LoweredStudy`` does -- both implement
``AbstractLoweredStudy``, which is what ``ds.inference.fit`` takes.

Dask execution: the study's experiments are split into one shard per worker lane (the workers
offering ``resources``, ``{"GPU": 1}`` by default) with ``balance_owners`` (owners -- the members
of the outermost level, or the experiments -- stay together; weights are measured values). The
study and the lowering options are scattered once to every worker. Each evaluation is a small graph
of Dask tasks, one per shard, keyed ``diffsoup-<mode>-<name>-shard<k>-<hex>``, asking for
``resources`` and pinned to the worker holding the shard (a loose restriction: when that worker is
gone the task runs on another one, which compiles the shard anew). A worker keeps its shard -- a
``LoweredStudy`` restricted to the shard's experiments, programs compiled on first use -- in
the process's cache of lowered studies (:mod:`._lowered_cache`), keyed by the study's fingerprint and
the shard's experiments, so a task carries parameters in and a part out. The client combines the parts in a fixed shard order. A failed evaluation (a worker
lost twice under it, lost scattered data) is retried whole, up to ``retries`` times.

Multi-process JAX execution (after ``ds.distributed.initialize`` with several processes): each
process holds one shard; process 0 runs the block, sending each evaluation's mode and parameters
through the JAX coordinator's key-value store (:class:`~diffsoup.distributed._kv.KeyValueStore`),
and the other processes evaluate their shard and send its part back until process 0 leaves the
block, then raise ``SystemExit(0)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import io
import logging
import math
import numbers
import pickle
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ..inference.objective._abstract_lowered import AbstractLoweredStudy
from ..inference.objective._lower import LoweredStudy, lower
from ..inference.objective._parts import AbstractPart, combine_parts
from ..inference.study._study import Study
from ._dashboard import dashboard_url
from ._lowered_cache import LOWERED
from ._runtime import is_initialized, process_count, process_index

logger = logging.getLogger("diffsoup.distributed")

DEFAULT_NAME = "study"
DEFAULT_COMPILE_MODES = ("value", "value_and_grad", "jacobian")
# The keywords of ds.lower: run() passes them on.
LOWER_OPTIONS = tuple(n for n, p in inspect.signature(lower).parameters.items() if p.kind is p.KEYWORD_ONLY)



# --------------------------------------------------------------------------------------------
# Execution options
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How ``ds.distributed.run`` executes a study on a Dask cluster (how it is lowered is
    ``ds.lower``'s business). A field left None reads the ``diffsoup`` Dask configuration when the
    run starts (``run.resources``, ``run.n-workers``, ``run.retries``, ``run.worker-timeout``;
    ``dask.config.set({"diffsoup.run.retries": 5})``, ``DASK_DIFFSOUP__RUN__RETRIES=5``, or a YAML
    file), except ``cluster`` (None: the active client, else an embedded cluster) and ``name``
    (None: ``"study"``).

    Attributes:
        cluster: None, a ``distributed.Client``, a scheduler address, or a cluster object
            (LocalCluster, a dask-jobqueue cluster, ...).
        resources: what each shard's task asks of a worker (``{"GPU": 1}`` as shipped); the shards
            are spread over the workers that offer it.
        name: letters and underscores naming the tasks and span.
        n_workers: workers of the embedded CPU cluster (2 as shipped).
        retries: whole-evaluation retries after a failure (2 as shipped).
        worker_timeout: seconds to wait for a worker offering ``resources`` (60 as shipped).
    """

    cluster: Any = None
    resources: Mapping[str, float] | None = None
    name: str | None = None
    n_workers: int | None = None
    retries: int | None = None
    worker_timeout: float | None = None

    def __post_init__(self):
        if self.resources is not None:
            if not isinstance(self.resources, Mapping) or not all(
                isinstance(k, str) and isinstance(v, numbers.Real) and not isinstance(v, bool) and v >= 0
                for k, v in self.resources.items()
            ):
                raise ValueError(f"RunOptions.resources={self.resources!r} must map resource names to non-negative "
                                 'numbers, e.g. {"GPU": 1} (or {} to ask for nothing).')  # fmt: skip
            object.__setattr__(self, "resources", dict(self.resources))
        if self.name is not None and not (isinstance(self.name, str) and self.name.replace("_", "").isalpha()):
            raise ValueError(f"RunOptions.name={self.name!r} must be letters and underscores (it names Dask tasks).")
        if self.n_workers is not None and (isinstance(self.n_workers, bool) or not isinstance(self.n_workers, int)
                                           or self.n_workers < 1):  # fmt: skip
            raise ValueError(f"RunOptions.n_workers={self.n_workers!r} must be a positive integer.")
        if self.retries is not None and (isinstance(self.retries, bool) or not isinstance(self.retries, int)
                                         or self.retries < 0):  # fmt: skip
            raise ValueError(f"RunOptions.retries={self.retries!r} must be a non-negative integer.")
        if self.worker_timeout is not None and (isinstance(self.worker_timeout, bool)
                                                or not isinstance(self.worker_timeout, numbers.Real)
                                                or not self.worker_timeout > 0):  # fmt: skip
            raise ValueError(f"RunOptions.worker_timeout={self.worker_timeout!r} must be a positive number of seconds.")

    def given(self) -> tuple[str, ...]:
        """Names of the fields set (not None)."""
        return tuple(f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None)

    def resolved(self) -> "RunOptions":
        """These options with every field left None read from the ``diffsoup`` Dask configuration
        (and ``name`` defaulted)."""
        from ._config import get

        return dataclasses.replace(
            self,
            resources=get("run.resources", self.resources),
            name=self.name if self.name is not None else DEFAULT_NAME,
            n_workers=int(get("run.n-workers", self.n_workers)),
            retries=int(get("run.retries", self.retries)),
            worker_timeout=float(get("run.worker-timeout", self.worker_timeout)),
        )


RUN_OPTIONS = tuple(f.name for f in dataclasses.fields(RunOptions))


def split_options(options: Mapping[str, Any]) -> tuple[RunOptions, dict[str, Any]]:
    """``run``'s keywords -> (execution options, lowering options for ``ds.lower``).

    Raises:
        TypeError: for a keyword that is neither, or ``execution=`` that is not a RunOptions.
        ValueError: for execution options given both as keywords and as ``execution=``.
    """
    options = dict(options)
    execution = options.pop("execution", None)
    unknown = sorted(k for k in options if k not in RUN_OPTIONS and k not in LOWER_OPTIONS)
    if unknown:
        raise TypeError(
            f"ds.distributed.run: unknown keyword{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}. "
            f"Execution options: {', '.join(RUN_OPTIONS)} (or execution=ds.distributed.RunOptions(...)); "
            f"lowering options (passed to ds.lower): {', '.join(LOWER_OPTIONS)}."
        )
    given = {k: options.pop(k) for k in RUN_OPTIONS if k in options}
    if execution is None:
        return RunOptions(**given), options
    if not isinstance(execution, RunOptions):
        raise TypeError(f"ds.distributed.run: execution= must be a ds.distributed.RunOptions, not "
                        f"{type(execution).__name__}.")  # fmt: skip
    if given:
        raise ValueError(f"ds.distributed.run: {sorted(given)} given both as keywords and in execution=; give "
                         "them in one place.")  # fmt: skip
    return execution, options


# --------------------------------------------------------------------------------------------
# Shards
# --------------------------------------------------------------------------------------------


def study_fingerprint(study: Study, options: Mapping[str, Any]) -> str:
    """A 16-hex-digit SHA-256 of the study (pickled) and the lowering options."""
    import cloudpickle

    h = hashlib.sha256()
    h.update(cloudpickle.dumps((study, sorted(options.items(), key=lambda kv: kv[0]))))
    return h.hexdigest()[:16]


def shard_members(study: Study, lanes: int) -> list[list[int]]:
    """Experiment indices (study order) of each shard, by ``balance_owners`` over ``lanes``; empty
    shards are dropped."""
    from ..inference.objective._balance import balance_owners

    exps = study.experiments
    index = {e.id: i for i, e in enumerate(exps)}
    ordered = balance_owners(study, lanes).experiments
    owners: list[list[int]] = []
    seen: dict[Any, int] = {}
    for e in ordered:
        k = e.groups[study.levels[0]] if study.levels else e.id
        if k not in seen:
            seen[k] = len(owners)
            owners.append([])
        owners[seen[k]].append(index[e.id])
    c = math.ceil(len(owners) / lanes)
    shards = [sorted(i for o in owners[b * c : (b + 1) * c] for i in o) for b in range(lanes)]
    return [s for s in shards if s]


def shard_lowering_options(options: Mapping[str, Any]) -> dict:
    """Lowering options for a shard: one device (the shard's process owns its devices)."""
    out = dict(options)
    layout = out.get("layout")
    if layout is not None:
        out["layout"] = dataclasses.replace(layout, mesh=None, processes=None)
    return out


def build_shard(study: Study, options: Mapping[str, Any], members: Sequence[int]) -> LoweredStudy:
    """A ``LoweredStudy`` of the whole problem (the same theta) evaluating only ``members``."""
    return lower(study, **shard_lowering_options(options)).restrict(members)


def serve_request(shard: LoweredStudy, mode: str, argument: Any) -> AbstractPart | None:
    """One request to a shard: ``("compile", modes)`` compiles (None back); an evaluation mode
    with theta gives the shard's part."""
    if mode == "compile":
        shard.compile(argument)
        return None
    return shard.evaluate(mode, argument)


# --------------------------------------------------------------------------------------------
# The client-side lowered study
# --------------------------------------------------------------------------------------------

# A backend: (mode, theta) -> the shards' parts, in shard order; ("compile", modes) -> Nones.
Backend = Callable[[str, Any], Sequence[AbstractPart | None]]


class DistributedStudy(AbstractLoweredStudy):
    """A lowered study whose evaluations run shard by shard elsewhere (Dask workers or the
    processes of a run); ``ds.inference.fit`` uses it as it uses a local ``LoweredStudy``.

    It wraps ``base`` (a local ``LoweredStudy`` of the same problem and experiments: its metadata,
    never evaluated here) and combines the parts ``backend`` returns.

    Attributes (besides :class:`AbstractLoweredStudy`'s):
        base: the wrapped ``LoweredStudy``.
        backend: ``(mode, theta) -> parts`` of the shards.
        shards: experiment ids of each shard.
        fingerprint: the study's fingerprint (the key of the shards' worker-local state).
        evaluations: evaluations sent so far.
        client, dashboard: the Dask client and the scheduler's HTTP address (Dask runs; else None).
    """

    def __init__(self, base: LoweredStudy, backend: Backend, shards: Sequence[Sequence[int]], fingerprint: str):
        if not isinstance(base, LoweredStudy):
            raise TypeError(f"DistributedStudy wraps a ds.inference.LoweredStudy, not {type(base).__name__}.")
        super().__init__(base.problem, base.experiment_indices)
        covered = sorted(int(i) for s in shards for i in s)
        if covered != list(self.experiment_indices):
            raise ValueError("DistributedStudy: the shards must split the base study's experiments (each exactly once).")
        self.base = base
        self.backend = backend
        ids = self.problem.study.ids
        self.shards = tuple(tuple(ids[i] for i in s) for s in shards)
        self.fingerprint = fingerprint
        self.evaluations = 0
        self.client: Any = None
        self.dashboard: str | None = None

    @property
    def placement(self) -> dict:
        """Experiment id -> shard index."""
        return {eid: s for s, members in enumerate(self.shards) for eid in members}

    def compute(self, mode: str, theta: np.ndarray) -> AbstractPart:
        parts = self.backend(mode, theta)
        self.evaluations += 1
        return combine_parts(parts)

    def compile(self, modes: Sequence[str] = DEFAULT_COMPILE_MODES) -> "DistributedStudy":
        """Compile the shards' programs of ``modes`` on the workers now (otherwise on first use)."""
        self.backend("compile", tuple(modes))
        return self

    def __repr__(self) -> str:
        return (f"DistributedStudy({len(self.experiment_indices)} experiments, theta={self.problem.n_theta}, "
                f"shards={[len(s) for s in self.shards]}, fingerprint={self.fingerprint})")  # fmt: skip


# --------------------------------------------------------------------------------------------
# Dask
# --------------------------------------------------------------------------------------------


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


def shard_key(members: Sequence[int]) -> tuple:
    """The options part of a shard's key in the worker's cache of lowered studies (the study's
    fingerprint is the other part): the experiments it evaluates."""
    return ("restrict", tuple(int(m) for m in members))


def _release(fp: str) -> int:
    """Run on every worker: drop the shards of study ``fp``; returns how many were dropped."""
    return LOWERED.discard(fp)


def _now() -> str:
    from ..store._ledger import now_iso

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
        import cloudpickle

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
        from ._dashboard_publish import publish_study, study_record

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
        from ..integrate import Status

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
        from ._clusters import embedded_cluster

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
def _run_dask(study: Study, options: dict, execution: RunOptions) -> Iterator[DistributedStudy]:
    from distributed.spans import span

    from ._dashboard import install

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


# --------------------------------------------------------------------------------------------
# Multi-process JAX
# --------------------------------------------------------------------------------------------

_RUN_COUNTER = [0]
_WAIT_MS = 3_600_000


class ProcessBackend:
    """Process 0's side of a multi-process run: send (mode, theta) through the coordinator's
    key-value store, serve its own shard, collect the other processes' parts."""

    def __init__(self, prefix: str, shard: LoweredStudy, members: list[list[int]]):
        from ._kv import KeyValueStore

        self.kv = KeyValueStore()
        self.prefix, self.shard, self.members = prefix, shard, members
        self.n = 0

    def __call__(self, mode: str, argument: Any) -> list[AbstractPart | None]:
        from ._runtime import check_agree

        n, self.n = self.n, self.n + 1
        self.kv.set(f"{self.prefix}/cmd/{n}", pickle.dumps((mode, argument)))
        if mode != "compile":
            check_agree(np.asarray(argument, dtype=np.float64), f"the parameters of evaluation {n}")
        parts = [serve_request(self.shard, mode, argument)]
        for p in range(1, len(self.members)):
            key = f"{self.prefix}/out/{n}/{p}"
            blob = self.kv.get(key, _WAIT_MS)
            self.kv.delete(key)
            result = pickle.loads(blob)
            if isinstance(result, BaseException):
                raise RuntimeError(f"process {p} failed to evaluate {mode}") from result
            parts.append(result)
        return parts

    def stop(self) -> None:
        self.kv.set(f"{self.prefix}/cmd/{self.n}", pickle.dumps(("stop", None)))


def _serve(prefix: str, shard: LoweredStudy, me: int) -> None:
    """Processes above 0: serve this process's shard for every command until 'stop'."""
    from ._kv import KeyValueStore
    from ._runtime import check_agree

    kv = KeyValueStore()
    n = 0
    while True:
        mode, argument = pickle.loads(kv.get(f"{prefix}/cmd/{n}", _WAIT_MS))
        if mode == "stop":
            return
        if mode != "compile":
            check_agree(np.asarray(argument, dtype=np.float64), f"the parameters of evaluation {n}")
        try:
            result: Any = serve_request(shard, mode, argument)
        except Exception as exc:  # noqa: BLE001 (process 0 raises it)
            result = RuntimeError(f"{type(exc).__name__}: {exc}")
        kv.set(f"{prefix}/out/{n}/{me}", pickle.dumps(result))
        n += 1


@contextlib.contextmanager
def _run_processes(study: Study, options: dict) -> Iterator[DistributedStudy]:
    nproc, me = process_count(), process_index()
    counter = _RUN_COUNTER[0]
    _RUN_COUNTER[0] += 1
    fp = study_fingerprint(study, options)
    prefix = f"diffsoup/run/{counter}/{fp}"
    members = shard_members(study, nproc)
    if len(members) < nproc:
        raise ValueError(f"ds.distributed.run: {len(study.experiments)} experiments (owners) cannot give each of "
                         f"the {nproc} processes a shard; use fewer processes.")  # fmt: skip
    base = lower(study, **shard_lowering_options(options))
    shard = base.restrict(members[me])
    if me != 0:
        _serve(prefix, shard, me)
        raise SystemExit(0)
    backend = ProcessBackend(prefix, shard, members)
    try:
        yield DistributedStudy(base, backend, members, fp)
    finally:
        backend.stop()


# --------------------------------------------------------------------------------------------
# run
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def run(study: Any, **options: Any) -> Iterator[Any]:
    """Lower a study over the processes of a run, and close it when the block ends.

    Use it as ``with ds.distributed.run(study) as lowered:``. The lowered study (a
    :class:`DistributedStudy`, an ``AbstractLoweredStudy`` like ``ds.lower``'s) evaluates shard by
    shard on the Dask workers -- or, in a multi-process JAX run, on the processes -- and
    ``ds.inference.fit`` takes it as it is. In a run of several processes, process 0 runs the block
    and the others evaluate their experiments until it ends, so write results inside the block.

    Args:
        study: the ``ds.Study`` to lower.
        **options: passed to ``ds.lower`` (``objective=``, ``layout=``, ``hessian=``, ...), except
            these execution options (Dask runs; the fields of :class:`RunOptions`, also accepted
            together as ``execution=RunOptions(...)``). Left None, they read the ``diffsoup`` Dask
            configuration (``diffsoup.run.*``):

            - ``cluster``: None (the active Dask client, else an embedded LocalCluster on
              127.0.0.1: one worker per visible GPU, or ``n_workers`` CPU workers carrying the
              resources), a ``distributed.Client``, a scheduler address, or a cluster object
              (LocalCluster, a dask-jobqueue cluster, ...).
            - ``resources``: what each shard's task asks of a worker (default ``{"GPU": 1}``);
              the shards are spread over the workers that offer it.
            - ``name``: letters and underscores naming the tasks and span (default ``"study"``).
            - ``n_workers``: workers of the embedded CPU cluster (default 2).
            - ``retries``: whole-evaluation retries after a failure (default 2).
            - ``worker_timeout``: seconds to wait for a worker offering ``resources`` (default 60).

    Yields:
        The lowered study. Its ``dashboard`` attribute (Dask runs) is the scheduler's HTTP address;
        ``<dashboard>/diffsoup/studies.json`` shows per-experiment states.

    Raises:
        TypeError: if ``study`` is not a Study, or for a keyword that is neither an execution nor a
            lowering option.
        ValueError: if ``layout=`` is a ``Layout(processes=N)`` and the run has another number of
            processes, or for execution options in a multi-process JAX run.
        SystemExit: with status 0, on every process above 0 once process 0 leaves the block.
    """
    if not isinstance(study, Study):
        raise TypeError(f"ds.distributed.run: study must be a ds.Study, not {type(study).__name__}.")
    execution, lowering = split_options(options)
    layout = lowering.get("layout")
    nproc = process_count()
    if layout is not None and getattr(layout, "processes", None) is not None and layout.processes != nproc:
        raise ValueError(
            f"ds.distributed.run: layout=Layout(processes={layout.processes}) but this run has {nproc} "
            f"process{'es' if nproc != 1 else ''}; start it with python -m diffsoup.distributed.launch -n "
            f"{layout.processes} (or srun/mpirun with as many tasks), or set processes=None."
        )
    if is_initialized() and nproc > 1:
        if execution.given():
            raise ValueError(f"ds.distributed.run: {sorted(execution.given())} apply to Dask runs, not to a "
                             "multi-process JAX run.")  # fmt: skip
        with _run_processes(study, lowering) as lowered:
            yield lowered
        return
    with _run_dask(study, lowering, execution.resolved()) as lowered:
        yield lowered
