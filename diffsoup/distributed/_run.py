"""``ds.distributed.run``: a study lowered over the workers of a Dask cluster (or the processes of
a multi-process JAX run), used as ``with ds.distributed.run(study) as lowered:``.

Dask execution: the study's experiments are split into one shard per worker lane (the workers
offering ``resources``, ``{"GPU": 1}`` by default) with ``balance_owners`` (owners -- the members
of the outermost level, or the experiments -- stay together; weights are measured values). The
study and the lowering options are scattered once to every worker. Each evaluation is a small graph
of Dask tasks, one per shard, keyed ``diffsoup-<mode>-<name>-shard<k>-<hex>``, asking for
``resources`` and pinned to the worker holding the shard (a loose restriction: when that worker is
gone the task runs on another one, which compiles the shard anew). A worker keeps its shard -- a
``LoweredStudy`` of the whole problem restricted to the shard's experiments, programs compiled on
first use -- in process-local state keyed by the study's fingerprint and the shard, so a task
carries parameters in and values, gradients, residual rows or Gauss-Newton blocks out. The client
sums (or places) the shards' parts in a fixed shard order. A failed evaluation (a worker lost
twice under it, lost scattered data) is retried whole, up to ``retries`` times.

Multi-process JAX execution (after ``ds.distributed.initialize`` with several processes): each
process holds one shard; process 0 runs the block, sending each evaluation's mode and parameters
through the JAX coordinator's key-value store, and the other processes evaluate their shard until
process 0 leaves the block, then raise ``SystemExit(0)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import logging
import math
import pickle
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ..inference._lower import LoweredStudy, lower
from ..inference._study import Study
from ._runtime import is_initialized, process_count, process_index

logger = logging.getLogger("diffsoup.distributed")

DEFAULT_RESOURCES: Mapping[str, float] = {"GPU": 1}
RUN_OPTIONS = ("cluster", "resources", "name", "n_workers", "retries", "worker_timeout")

# Worker-local (or process-local) shards: (fingerprint, shard) -> LoweredStudy restricted to it.
_SHARDS: dict[tuple[str, int], LoweredStudy] = {}


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
    from ..inference._balance import balance_owners

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


def _worker_options(options: Mapping[str, Any]) -> dict:
    """Lowering options for a shard: one device (the shard's process owns its devices)."""
    out = dict(options)
    layout = out.get("layout")
    if layout is not None:
        out["layout"] = dataclasses.replace(layout, mesh=None, processes=None)
    return out


def build_shard(study: Study, options: Mapping[str, Any], members: list[int]) -> LoweredStudy:
    """A ``LoweredStudy`` of the whole problem (the same theta) evaluating only ``members``."""
    low = lower(study, **_worker_options(options))
    keep = set(members)
    groups, blocks = [], []
    for g in low.groups:
        m = [i for i in g.members if i in keep]
        if m:
            groups.append(g)
            blocks.append(np.asarray([m], dtype=np.int64))
    low.groups = tuple(groups)
    low._blocks = blocks
    low._chunks.clear()
    return low


def shard_outputs(low: LoweredStudy, members: list[int], mode: str, theta: Any) -> dict:
    """Evaluate one shard; the parts the client combines (raw sums, rows by experiment)."""
    import jax
    import jax.numpy as jnp

    theta = np.asarray(theta, dtype=np.float64)
    out: dict[str, Any] = {}
    if mode == "value":
        out["v"] = low.value(theta)
    elif mode == "value_and_grad":
        out["v"], out["g"] = low.value_and_grad(theta)
    elif mode == "hessian":
        out["H"] = low.hessian(theta)
    elif mode in ("residuals", "jacobian", "gauss_newton"):
        prog_mode = "residuals" if mode == "residuals" else "jacobian"
        outs, orders = low._dispatch(prog_mode, theta)
        n = len(outs[0])
        if mode == "gauss_newton":
            k = low.problem.n_theta
            ss, g, H = 0.0, jnp.zeros(k), jnp.zeros((k, k))
            for r, J, *_ in outs:
                r2, J2 = r.reshape(-1), J.reshape(-1, k)
                ss, g, H = ss + jnp.dot(r2, r2), g + J2.T @ r2, H + J2.T @ J2
            ss, g, H, st, ns = jax.device_get((ss, g, H, [o[n - 2] for o in outs], [o[n - 1] for o in outs]))
            out.update(ss=float(ss), g=np.asarray(g), H=np.asarray(H))
        else:
            parts = jax.device_get(tuple([o[i] for o in outs] for i in range(n)))
            st, ns = parts[-2], parts[-1]
            rows: dict[int, Any] = {}
            for c, order in enumerate(orders):
                for lane, i in enumerate(order):
                    if i >= 0:
                        rows[int(i)] = tuple(np.asarray(parts[j][c][lane]) for j in range(n - 2))
            out["rows"] = rows
        low._record(orders, st, ns)
    elif mode == "compile":
        low.compile()
    else:  # pragma: no cover (internal)
        raise ValueError(f"unknown mode {mode!r}")
    ids = [e.id for e in low.problem.study.experiments]
    out["failures"] = {eid: int(s) for eid, s in low.last_failures.items()}
    out["steps"] = {ids[i]: int(low.steps[i]) for i in members}
    return out


# --------------------------------------------------------------------------------------------
# The client-side lowered study
# --------------------------------------------------------------------------------------------


class DistributedStudy(LoweredStudy):
    """A :class:`LoweredStudy` whose evaluations run shard by shard elsewhere (Dask workers or
    the processes of a run); ``ds.inference.fit`` uses it as it uses a local one.

    Attributes (besides a LoweredStudy's):
        shards: experiment ids of each shard.
        fingerprint: the study's fingerprint (the key of the shards' worker-local state).
        evaluations: evaluations sent so far.
    """

    def __init__(self, base: LoweredStudy, backend: Any, shards: list[list[int]], fingerprint: str):
        self.__dict__.update(base.__dict__)
        self._backend = backend
        ids = [e.id for e in self.problem.study.experiments]
        self._members = shards
        self.shards = tuple(tuple(ids[i] for i in s) for s in shards)
        self.fingerprint = fingerprint
        self.evaluations = 0
        self._index = {eid: i for i, eid in enumerate(ids)}

    @property
    def placement(self) -> dict:
        """Experiment id -> shard index."""
        return {eid: s for s, members in enumerate(self.shards) for eid in members}

    def balance(self, theta: Any = None):
        raise NotImplementedError("balance() moves experiments between local devices; a distributed study's "
                                  "shards are placed by ds.distributed.run (balance_owners over worker lanes).")  # fmt: skip

    def compile(self, modes=("value", "value_and_grad", "jacobian")) -> "DistributedStudy":
        self._collect("compile", self.nominal)
        return self

    def _collect(self, mode: str, theta: Any) -> list[dict]:
        from ..integrate import Status

        theta = self._theta(theta) if mode != "compile" else np.asarray(theta, dtype=np.float64)
        outs = self._backend(mode, theta)
        self.evaluations += 1
        failures = {}
        for o in outs:
            failures.update({eid: Status(s) for eid, s in o["failures"].items()})
            for eid, n in o["steps"].items():
                self.steps[self._index[eid]] = n
        if mode != "compile":
            self.last_failures = failures
        return outs

    def value(self, theta) -> float:
        return float(sum(o["v"] for o in self._collect("value", theta)))

    def value_and_grad(self, theta):
        outs = self._collect("value_and_grad", theta)
        return float(sum(o["v"] for o in outs)), np.sum([np.asarray(o["g"]) for o in outs], axis=0)

    def _rows(self, outs, width: int):
        rows = {}
        for o in outs:
            rows.update(o["rows"])
        n = len(self.problem.study.experiments)
        return [np.concatenate([rows[i][j] for i in range(n)], axis=0) for j in range(width)]

    def residuals(self, theta) -> np.ndarray:
        return self._rows(self._collect("residuals", theta), 1)[0]

    def residuals_and_jacobian(self, theta):
        r, J = self._rows(self._collect("jacobian", theta), 2)
        return r, J

    def gauss_newton(self, theta):
        outs = self._collect("gauss_newton", theta)
        ss = sum(o["ss"] for o in outs)
        g = np.sum([o["g"] for o in outs], axis=0)
        H = np.sum([o["H"] for o in outs], axis=0)
        c = 2.0 * self.scale
        return float(self.scale * ss + self.offset), c * g, c * H

    def hessian(self, theta) -> np.ndarray:
        H = np.sum([o["H"] for o in self._collect("hessian", theta)], axis=0)
        return 0.5 * (H + H.T)

    def __repr__(self) -> str:
        return (f"DistributedStudy({len(self.problem.study.experiments)} experiments, theta={self.problem.n_theta}, "
                f"shards={[len(s) for s in self.shards]}, fingerprint={self.fingerprint})")  # fmt: skip


# --------------------------------------------------------------------------------------------
# Dask
# --------------------------------------------------------------------------------------------


def _shard_task(payload: bytes, fp: str, sid: int, members: list[int], mode: str, theta: np.ndarray) -> dict:
    """The Dask task of one shard: build the shard once per worker, then evaluate it."""
    from distributed import get_worker

    t0 = time.perf_counter()
    key = (fp, sid)
    built = key not in _SHARDS
    if built:
        study, options = pickle.loads(payload)
        _SHARDS[key] = build_shard(study, options, members)
    out = shard_outputs(_SHARDS[key], members, mode, theta)
    out.update(worker=get_worker().address, built=built, seconds=time.perf_counter() - t0)
    return out


def _release(fp: str) -> int:
    """Run on every worker: drop the shards of study ``fp``; returns how many were dropped."""
    keys = [k for k in _SHARDS if k[0] == fp]
    for k in keys:
        del _SHARDS[k]
    return len(keys)


def _now() -> str:
    from ..store._ledger import now_iso

    return now_iso()


class _DaskBackend:
    def __init__(self, client, study, options, fp, name, resources, retries, worker_timeout):
        from ._worker import DiffsoupWorkerPlugin, PLUGIN_NAME

        self.client, self.fp, self.name = client, fp, name
        self.resources = dict(resources)
        self.retries = retries
        client.register_plugin(DiffsoupWorkerPlugin(), name=PLUGIN_NAME)
        workers = self._lanes(worker_timeout)
        self.members = shard_members(study, len(workers))
        self.pin = {sid: workers[sid % len(workers)] for sid in range(len(self.members))}
        buf = io.BytesIO()
        import cloudpickle

        cloudpickle.dump((study, dict(options)), buf)
        self.payload_bytes = buf.getvalue()
        self.payload = client.scatter(self.payload_bytes, broadcast=True, hash=False)
        self.rebuilds = 0
        self.ids = [e.id for e in study.experiments]
        self.status = {"name": name, "state": "running", "evaluations": 0, "last_mode": None, "last_seconds": None,
                       "rebuilds": 0, "updated": _now()}  # fmt: skip
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
                    "that your workers carry, or raise worker_timeout."
                )
            time.sleep(0.2)

    def _publish(self) -> None:
        from ._dashboard import METADATA_KEY

        shards = [{"shard": sid, "worker": self.pin[sid], "experiments": len(m)} for sid, m in enumerate(self.members)]
        record = dict(self.status, shards=shards, experiments=self.exp_state)
        try:
            self.client.set_metadata([*METADATA_KEY, self.fp], record)
        except Exception as exc:  # noqa: BLE001 (the dashboard must never fail a fit)
            logger.debug("could not publish the study state: %s", exc)

    def _submit(self, mode: str, theta: np.ndarray) -> list:
        suffix = uuid.uuid4().hex[:8]
        return [
            self.client.submit(
                _shard_task, self.payload, self.fp, sid, m, mode, theta,
                key=f"diffsoup-{mode}-{self.name}-shard{sid}-{suffix}",
                workers=[self.pin[sid]], allow_other_workers=True,
                resources=self.resources or None, pure=False,
            )
            for sid, m in enumerate(self.members)
        ]  # fmt: skip

    def __call__(self, mode: str, theta: np.ndarray) -> list[dict]:
        t0 = time.perf_counter()
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            futures = self._submit(mode, theta)
            try:
                outs = self.client.gather(futures)
                break
            except Exception as exc:  # a worker lost repeatedly, scattered data lost, ...
                last = exc
                logger.warning("evaluation %s failed on attempt %d (%s: %s); retrying", mode, attempt + 1,
                               type(exc).__name__, exc)  # fmt: skip
                self.client.cancel(futures)
                self.payload = self.client.scatter(self.payload_bytes, broadcast=True, hash=False)
        else:
            raise RuntimeError(f"ds.distributed.run: the {mode} evaluation failed {self.retries + 1} times") from last
        for sid, o in enumerate(outs):
            if o["built"] and self.status["evaluations"] > 0 and o["worker"] != self.pin[sid]:
                self.rebuilds += 1
            self.pin[sid] = o["worker"]
        self.status.update(evaluations=self.status["evaluations"] + 1, last_mode=mode, updated=_now(),
                           last_seconds=time.perf_counter() - t0, rebuilds=self.rebuilds)  # fmt: skip
        from ..integrate import Status

        for sid, o in enumerate(outs):
            for eid, n in o["steps"].items():
                fail = o["failures"].get(eid)
                self.exp_state[eid].update(worker=o["worker"], steps=n, state="failed" if fail else "ok",
                                           status=Status(fail).name if fail else Status(0).name)  # fmt: skip
        self._publish()
        return outs

    def close(self) -> None:
        self.status.update(state="closed", updated=_now())
        self._publish()
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


def dashboard_url(client: Any) -> str | None:
    """``http://host:port`` of the scheduler's HTTP server (the Dask dashboard), or None."""
    info = client.scheduler_info()
    port = (info.get("services") or {}).get("dashboard")
    if port is None:
        return None
    host = info["address"].split("://", 1)[-1].rsplit(":", 1)[0]
    return f"http://{host}:{port}"


@contextlib.contextmanager
def _run_dask(study: Study, options: dict, run_options: dict) -> Iterator[DistributedStudy]:
    from distributed.spans import span

    from ._dashboard import install

    resources = DEFAULT_RESOURCES if run_options.get("resources") is None else run_options["resources"]
    name = str(run_options.get("name") or "study")
    if not name.replace("_", "").isalpha():
        raise ValueError(f"ds.distributed.run: name={name!r} must be letters and underscores (it names Dask tasks).")
    client, owned = _connect(run_options.get("cluster"), resources, run_options.get("n_workers"))
    backend = None
    try:
        try:
            client.run_on_scheduler(install)
        except Exception as exc:  # noqa: BLE001 (no HTTP server: the fit still runs)
            logger.info("diffsoup dashboard route not installed: %s", exc)
        base = lower(study, **options)
        fp = study_fingerprint(study, options)
        with span(f"diffsoup-run-{name}"):
            backend = _DaskBackend(client, study, options, fp, name, resources, int(run_options.get("retries", 2)),
                                   float(run_options.get("worker_timeout", 60.0)))  # fmt: skip
            lowered = DistributedStudy(base, backend, backend.members, fp)
            lowered.client = client
            lowered.dashboard = dashboard_url(client)
            lowered._dask_backend = backend
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


class _ProcessBackend:
    """Process 0's side: send (mode, theta) through the coordinator's key-value store, evaluate its
    own shard, collect the others' outputs."""

    def __init__(self, prefix: str, low: LoweredStudy, members: list[list[int]]):
        from jax._src import distributed as _jd

        self.kv = _jd.global_state.client
        self.prefix, self.low, self.members = prefix, low, members
        self.n = 0

    def __call__(self, mode: str, theta: np.ndarray) -> list[dict]:
        from ._runtime import check_agree

        n, self.n = self.n, self.n + 1
        self.kv.key_value_set_bytes(f"{self.prefix}/cmd/{n}", pickle.dumps((mode, np.asarray(theta))))
        check_agree(np.asarray(theta, dtype=np.float64), f"the parameters of evaluation {n}")
        outs = [shard_outputs(self.low, self.members[0], mode, theta)]
        for p in range(1, len(self.members)):
            key = f"{self.prefix}/out/{n}/{p}"
            blob = self.kv.blocking_key_value_get_bytes(key, _WAIT_MS)
            self.kv.key_value_delete(key)
            result = pickle.loads(blob)
            if isinstance(result, BaseException):
                raise RuntimeError(f"process {p} failed to evaluate {mode}") from result
            outs.append(result)
        return outs

    def stop(self) -> None:
        self.kv.key_value_set_bytes(f"{self.prefix}/cmd/{self.n}", pickle.dumps(("stop", None)))


def _serve(prefix: str, low: LoweredStudy, members: list[int], me: int) -> None:
    """Processes above 0: evaluate this process's shard for every command until 'stop'."""
    from jax._src import distributed as _jd

    from ._runtime import check_agree

    kv = _jd.global_state.client
    n = 0
    while True:
        mode, theta = pickle.loads(kv.blocking_key_value_get_bytes(f"{prefix}/cmd/{n}", _WAIT_MS))
        if mode == "stop":
            return
        check_agree(np.asarray(theta, dtype=np.float64), f"the parameters of evaluation {n}")
        try:
            result: Any = shard_outputs(low, members, mode, theta)
        except Exception as exc:  # noqa: BLE001 (process 0 raises it)
            result = RuntimeError(f"{type(exc).__name__}: {exc}")
        kv.key_value_set_bytes(f"{prefix}/out/{n}/{me}", pickle.dumps(result))
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
    low = build_shard(study, options, members[me])
    if me != 0:
        _serve(prefix, low, members[me], me)
        raise SystemExit(0)
    backend = _ProcessBackend(prefix, low, members)
    base = lower(study, **_worker_options(options))
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
    :class:`DistributedStudy`, a ``LoweredStudy``) evaluates shard by shard on the Dask workers --
    or, in a multi-process JAX run, on the processes -- and ``ds.inference.fit`` takes it as it is.
    In a run of several processes, process 0 runs the block and the others evaluate their
    experiments until it ends, so write results inside the block.

    Args:
        study: the ``ds.Study`` to lower.
        **options: passed to ``ds.lower`` (``objective=``, ``layout=``, ``hessian=``, ...), except
            these execution options (Dask runs):

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
        TypeError: if ``study`` is not a Study.
        ValueError: if ``layout=`` is a ``Layout(processes=N)`` and the run has another number of
            processes.
        SystemExit: with status 0, on every process above 0 once process 0 leaves the block.
    """
    if not isinstance(study, Study):
        raise TypeError(f"ds.distributed.run: study must be a ds.Study, not {type(study).__name__}.")
    run_options = {k: options.pop(k) for k in RUN_OPTIONS if k in options}
    layout = options.get("layout")
    nproc = process_count()
    if layout is not None and getattr(layout, "processes", None) is not None and layout.processes != nproc:
        raise ValueError(
            f"ds.distributed.run: layout=Layout(processes={layout.processes}) but this run has {nproc} "
            f"process{'es' if nproc != 1 else ''}; start it with python -m diffsoup.distributed.launch -n "
            f"{layout.processes} (or srun/mpirun with as many tasks), or set processes=None."
        )
    if is_initialized() and nproc > 1:
        if run_options:
            raise ValueError(f"ds.distributed.run: {sorted(run_options)} apply to Dask runs, not to a "
                             "multi-process JAX run.")  # fmt: skip
        with _run_processes(study, options) as lowered:
            yield lowered
        return
    with _run_dask(study, options, run_options) as lowered:
        yield lowered
