"""Dask clusters for diffsoup: the embedded default (a LocalCluster here) and SLURM clusters
(dask-jobqueue's ``SLURMCluster``) from a profile (:class:`~diffsoup.distributed.SlurmProfile`).

Both start workers the way diffsoup's tasks need them: the worker resources
``diffsoup.cluster.resources`` (``GPU=1``) per process (a lane token on CPU workers), so that one
task holding them runs at a time, ``diffsoup.cluster.threads-per-worker`` threads per process (2:
the second runs tasks asking for no resources, an ensemble's input draws and Zarr writes, beside
the solve; see :func:`worker_threads`), and the preload ``diffsoup.distributed._worker`` (float64,
XLA settings, a shared JAX compilation cache, one GPU per worker process, a clear failure when a
GPU worker has no usable GPU).

Nothing here changes this process's environment: what the workers need travels in their own
environment (the embedded cluster's ``env=``, the SLURM job script's prologue).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any, Iterator, Mapping

from .._settings import settings
from ._config import get
from ._dashboard import dashboard_url
from ._gpus import visible_gpus
from ._slurm_profile import SlurmProfile, read_slurm_profile

WORKER_PRELOAD = "diffsoup.distributed._worker"
# The embedded cluster's workers also ignore Ctrl-C: the command that started them handles it.
QUIET_PRELOAD = "diffsoup.distributed._quiet_worker"
# Dask's loggers, silenced while a cluster closes (lost connections, cancelled tasks: nothing to act on).
DASK_LOGGERS = ("distributed", "tornado", "asyncio")


class ClusterConnectionError(RuntimeError, ConnectionError):
    """No Dask scheduler answered at the address given (``cluster_client(scheduler=...)``,
    ``diffsoup fit|campaign --scheduler``) within ``diffsoup.cluster.connect-timeout`` seconds.

    A ``RuntimeError``, and a ``ConnectionError`` (an ``OSError``) as Dask's own connection failure
    is, so that either kind of handler catches it.
    """


def scheduler_connect_timeout(seconds: Any = None) -> float:
    """``seconds``, or the setting ``diffsoup.cluster.connect-timeout`` when None, checked.

    Raises:
        ValueError: for anything but a positive number, naming where it came from.
    """
    where = "connect_timeout" if seconds is not None else "the setting diffsoup.cluster.connect-timeout"
    value = get("cluster.connect-timeout", seconds)
    if isinstance(value, str):  # DASK_DIFFSOUP__CLUSTER__CONNECT_TIMEOUT=5 may arrive as text
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValueError(f"{where}={value!r} must be a positive, finite number of seconds.")
    return float(value)


def _probe_scheduler(address: str, timeout: float) -> None:
    """Open (and close) one connection to the scheduler at ``address``, Dask's handshake included.

    Raises:
        ValueError: for an address Dask cannot parse, naming it and the expected form.
        ClusterConnectionError: when nothing answers within ``timeout`` seconds.
    """
    from distributed.comm import connect

    async def probe() -> None:
        comm = await connect(address, timeout=timeout)
        await comm.close()

    # A thread of its own: asyncio.run needs a thread without a running event loop (a notebook's has one).
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="diffsoup-probe") as pool:
        try:
            pool.submit(asyncio.run, probe()).result()
        except ValueError as exc:  # unknown scheme, missing port, ...
            raise ValueError(
                f"scheduler={address!r} is not a Dask scheduler address ({exc}); give tcp://HOST:PORT, "
                "e.g. tcp://10.0.0.5:8786 (what `dask scheduler` prints)."
            ) from None
        except (OSError, TimeoutError) as exc:
            raise _unreachable(address, timeout, exc) from None


def _unreachable(address: str, timeout: float, exc: BaseException) -> ClusterConnectionError:
    return ClusterConnectionError(
        f"cannot connect to the Dask scheduler at {address} within {timeout:g} s ({type(exc).__name__}: {exc}). "
        "Check that a scheduler runs there (`dask scheduler`) and that its address and port are right and "
        "reachable from this machine (firewall, network interface); or raise the setting "
        "diffsoup.cluster.connect-timeout; or leave the scheduler out to run on the embedded cluster."
    )


def worker_environment() -> dict[str, str]:
    """Environment variables diffsoup's workers start with (only what the caller has not set)."""

    env = {} if "JAX_ENABLE_X64" in os.environ else {"JAX_ENABLE_X64": "1"}
    env["DIFFSOUP_CACHE_DIR"] = str(settings().cache_dir)
    return env


def _resources_argument(resources: Mapping[str, float]) -> str:
    """``GPU=1`` for ``dask worker --resources``."""
    return ",".join(f"{name}={amount:g}" for name, amount in resources.items())


def worker_threads(resources: Mapping[str, float], threads: int | None = None) -> int:
    """Threads of each worker process offering ``resources``: ``threads`` if given, else the
    setting ``diffsoup.cluster.threads-per-worker`` (2) where ``resources`` is not empty, else 1.

    Every diffsoup task that uses a GPU asks for the resource, so one runs at a time on a worker
    however many threads it has; the other threads run tasks asking for nothing (an ensemble's
    input draws and Zarr writes overlap the next chunk's solve). Workers that offer no resources
    get one thread, since then nothing would keep two solves from sharing a GPU.

    Raises:
        ValueError: for anything but a positive integer, naming where it came from.
    """
    if threads is None and not resources:
        return 1
    where = "threads_per_worker" if threads is not None else "the setting diffsoup.cluster.threads-per-worker"
    value = get("cluster.threads-per-worker", threads)  # Dask parses an environment variable's 3 as a number
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}={value!r} must be a positive integer (threads per worker process).")
    return value


def embedded_cluster(resources: Mapping[str, float] | None = None, *, n_workers: int | None = None,
                     threads_per_worker: int | None = None):  # fmt: skip
    """Start the embedded default cluster: a Dask cluster on 127.0.0.1 with one worker process per
    visible GPU (``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi -L``), each pinned to its GPU, or else
    ``n_workers`` CPU worker processes. The dashboard listens on a free port.

    Args:
        resources: what each worker offers; None reads ``diffsoup.cluster.resources`` (``{"GPU":
            1}``: one task at a time each).
        n_workers: CPU workers when no GPU is visible; None reads ``diffsoup.cluster.n-workers`` (2).
        threads_per_worker: threads of each worker process; None follows :func:`worker_threads`
            (2 where the workers offer resources, else 1).

    Returns:
        ``(cluster, client)``; close both when done (or use :func:`cluster_client`).
    """
    from distributed import Client, LocalCluster, Nanny, Scheduler, SpecCluster

    resources = dict(get("cluster.resources", resources))
    threads = worker_threads(resources, threads_per_worker)
    env = worker_environment()
    gpus = visible_gpus()
    if gpus:
        platforms = os.environ.get("JAX_PLATFORMS", "cuda")
        workers = {f"gpu-{g}": {"cls": Nanny, "options": {
            "nthreads": threads, "resources": resources, "host": "127.0.0.1", "preload": [WORKER_PRELOAD, QUIET_PRELOAD],
            "env": {**env, "CUDA_VISIBLE_DEVICES": g, "JAX_PLATFORMS": platforms}}} for g in gpus}  # fmt: skip
        scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"}}
        cluster = SpecCluster(workers=workers, scheduler=scheduler, name="diffsoup-embedded")
    else:
        cluster = LocalCluster(n_workers=int(get("cluster.n-workers", n_workers)), threads_per_worker=threads,
                               processes=True, resources=resources or None, host="127.0.0.1",
                               dashboard_address="127.0.0.1:0", env=env, preload=[WORKER_PRELOAD, QUIET_PRELOAD])  # fmt: skip
    try:
        client = Client(cluster, set_as_default=False)
    except BaseException:
        cluster.close()
        raise
    return cluster, client


def jobqueue_options(profile: SlurmProfile) -> dict[str, Any]:
    """The keyword arguments of dask-jobqueue's ``SLURMCluster`` for ``profile``.

    Each job runs ``processes`` worker processes with :func:`worker_threads` threads each and the
    resources ``diffsoup.cluster.resources`` each, asks for ``gpus`` generic GPUs (``--gres=gpu:N``), and,
    holding several GPUs, has each worker process keep its own (``DIFFSOUP_GPUS_PER_WORKER``:
    dask-jobqueue gives every process of a job all of the job's GPUs). ``shared_dir`` becomes the
    workers' ``DIFFSOUP_CACHE_DIR`` (window-start store) and holds their JAX compilation cache.
    """
    processes, gpus = profile.processes, profile.gpus
    prologue = ["export JAX_ENABLE_X64=${JAX_ENABLE_X64:-1}", *profile.prologue]
    if profile.shared_dir is not None:
        shared = profile.shared_dir.resolve()
        prologue += [f"export DIFFSOUP_CACHE_DIR={shared}"]
    platforms = profile.jax_platforms or ("cuda" if gpus else None)
    if platforms:
        prologue.append(f"export JAX_PLATFORMS={platforms}")
    if gpus:
        prologue.append("export XLA_PYTHON_CLIENT_PREALLOCATE=false")
        if gpus > processes or processes > 1:
            prologue.append(f"export DIFFSOUP_GPUS_PER_WORKER={profile.gpus_per_worker}")
    job_extra = list(profile.job_extra)
    if gpus:
        job_extra.append(f"--gres=gpu:{gpus}")
    offered = dict(get("cluster.resources"))
    resources = _resources_argument(offered)
    options: dict[str, Any] = dict(
        # dask-jobqueue gives each worker process cores / processes threads; the resources keep
        # one diffsoup task per GPU at a time. The job still books all of ``cores`` for XLA's own threads.
        cores=processes * worker_threads(offered), job_cpu=profile.job_cores, processes=processes, memory=profile.memory,
        walltime=profile.walltime, job_extra_directives=job_extra,
        worker_extra_args=(["--resources", resources] if resources else []) + ["--preload", WORKER_PRELOAD],
        job_script_prologue=prologue, python=profile.python or sys.executable,
    )  # fmt: skip
    for name in ("queue", "account", "interface"):
        if getattr(profile, name):
            options[name] = getattr(profile, name)
    return options


def slurm_cluster(profile: Any, **overrides: Any):
    """A dask-jobqueue ``SLURMCluster`` from a SLURM profile, scaled with ``adapt()``.

    Each job runs ``processes`` worker processes with ``GPU=1`` and two threads each (see
    :func:`worker_threads`), asks for ``gpus`` generic GPUs (``--gres=gpu:N``), and, holding several
    GPUs, pins one GPU per worker process (dask-jobqueue gives every process of a job all of the
    job's GPUs). ``shared_dir`` (created here) holds the workers' JAX compilation cache and, as
    their ``DIFFSOUP_CACHE_DIR``, the window-start store. This process's environment is left as it is: to share the store with
    the workers, give the driver the profile's ``shared_dir`` too (``read_slurm_profile(path).shared_dir``,
    e.g. as its ``DIFFSOUP_CACHE_DIR`` before it prepares windows).

    Args:
        profile: the profile (a TOML path, a mapping or a :class:`SlurmProfile`; see
            :mod:`diffsoup.distributed._slurm_profile`).
        **overrides: profile keys to replace.

    Returns:
        The ``SLURMCluster``, already adapting between ``minimum_jobs`` and ``maximum_jobs`` jobs.

    Raises:
        ValueError: for a bad profile or override, naming the key.
    """
    from dask_jobqueue import SLURMCluster

    profile = read_slurm_profile(profile)
    if overrides:
        profile = profile.replace(**overrides)
    if profile.shared_dir is not None:
        Path(profile.shared_dir).resolve().mkdir(parents=True, exist_ok=True)
    cluster = SLURMCluster(**jobqueue_options(profile))
    cluster.adapt(minimum_jobs=profile.minimum_jobs, maximum_jobs=profile.maximum_jobs)
    return cluster


@contextlib.contextmanager
def cluster_client(*, scheduler: str | None = None, slurm: Any = None, n_workers: int | None = None,
                   connect_timeout: float | None = None) -> Iterator:  # fmt: skip
    """A Dask client on the cluster the ``diffsoup`` command and the job scripts choose: a
    scheduler address, a SLURM profile, or else the embedded default; closed at the end.

    Args:
        scheduler: the address of a running Dask scheduler (``tcp://host:8786``).
        slurm: a SLURM profile (see :func:`slurm_cluster`), used without ``scheduler``.
        n_workers: CPU workers of the embedded default.
        connect_timeout: seconds to wait for the scheduler at ``scheduler`` to answer; None reads
            the setting ``diffsoup.cluster.connect-timeout`` (10 s).

    Yields:
        ``(client, dashboard)``: the client and the dashboard's address (or None).

    Raises:
        ClusterConnectionError: if no scheduler answers at ``scheduler`` in time; the one-line
            message names the address and what to check.
        ValueError: for a ``scheduler`` that is not an address, or a bad ``connect_timeout``.
    """
    from distributed import Client

    closers: list = []
    try:
        if scheduler:
            timeout = scheduler_connect_timeout(connect_timeout)
            # Probed first: a Client that fails to connect prints a traceback again when collected.
            _probe_scheduler(scheduler, timeout)
            try:
                client = Client(scheduler, set_as_default=False, timeout=timeout)
            except OSError as exc:  # gone between the probe and now
                raise _unreachable(scheduler, timeout, exc) from None
            closers.append(client)
        elif slurm is not None:
            cluster = slurm_cluster(slurm)
            closers.append(cluster)
            client = Client(cluster, set_as_default=False)
            closers.insert(0, client)
        else:
            cluster, client = embedded_cluster(n_workers=n_workers)
            closers += [client, cluster]
        yield client, dashboard_url(client)
    finally:
        with quiet_dask_logs():  # closed quietly, after a run as after Ctrl-C
            for thing in closers:
                with contextlib.suppress(Exception):
                    thing.close()


@contextlib.contextmanager
def quiet_dask_logs() -> Iterator[None]:
    """Silence Dask's loggers (:data:`DASK_LOGGERS`: lost connections, cancelled tasks) for the
    duration, then give them their levels back.

    Their children with a level of their own are silenced too: Dask's configuration gives
    ``tornado.application`` one (ERROR), and through it the loop thread logs a traceback when a
    Ctrl-C lands before Dask's ``sync`` has started its future (a ``NameError`` in its ``cancel``).
    """
    names = set(DASK_LOGGERS)
    names |= {name for name, lg in list(logging.root.manager.loggerDict.items())
              if isinstance(lg, logging.Logger) and name.split(".")[0] in DASK_LOGGERS}  # fmt: skip
    loggers = [logging.getLogger(name) for name in sorted(names)]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
