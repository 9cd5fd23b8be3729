"""Dask clusters for diffsoup: the embedded default (a LocalCluster here) and SLURM clusters
(dask-jobqueue's ``SLURMCluster``) from a profile.

Both start workers the way diffsoup's tasks need them: one thread per worker process, the worker
resource ``GPU=1`` per process (a lane token on CPU workers), and the preload
``diffsoup.distributed._worker`` (float64, XLA settings, a shared JAX compilation cache, one GPU
per worker process, a clear failure when a GPU worker has no usable GPU).

A SLURM profile is a TOML file (or a mapping) with a ``[slurm]`` table::

    [slurm]
    queue = "gpu"                  # partition (-p); optional
    account = "my-project"         # optional
    walltime = "02:00:00"
    memory = "32GB"                # per job
    cores = 2                      # CPU cores per job
    processes = 2                  # worker processes per job: one per GPU
    gpus = 2                       # generic GPUs per job (--gres=gpu:N); 0 for CPU workers
    minimum_jobs = 1               # adapt() bounds, in jobs
    maximum_jobs = 4
    shared_dir = "/scratch/me/diffsoup"   # on a file system every node sees: JAX cache, window store
    job_extra = ["--constraint=h200"]     # more #SBATCH lines; optional
    prologue = ["module load cuda/13"]    # shell lines run before the workers; optional
    python = "/path/to/.venv/bin/python"  # the workers' interpreter (default: this one)
    interface = "ib0"                     # network interface of the workers; optional
    jax_platforms = "cuda"                # the workers' JAX_PLATFORMS (default: cuda with gpus, else unset)
"""

from __future__ import annotations

import contextlib
import os
import sys
import tomllib
from pathlib import Path
from typing import Any, Iterator, Mapping

WORKER_PRELOAD = "diffsoup.distributed._worker"
PROFILE_KEYS = ("queue", "account", "walltime", "memory", "cores", "processes", "gpus", "minimum_jobs",
                "maximum_jobs", "shared_dir", "job_extra", "prologue", "python", "interface", "jax_platforms")  # fmt: skip


def worker_environment() -> dict[str, str]:
    """Environment variables diffsoup's workers start with (only what the caller has not set)."""
    from ._worker import default_cache_dir

    env = {} if "JAX_ENABLE_X64" in os.environ else {"JAX_ENABLE_X64": "1"}
    env["DIFFSOUP_JAX_CACHE_DIR"] = default_cache_dir()
    return env


def embedded_cluster(resources: Mapping[str, float] | None = None, *, n_workers: int | None = None):
    """Start the embedded default cluster: a Dask cluster on 127.0.0.1 with one worker process per
    visible GPU (``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi -L``), each pinned to its GPU, or else
    ``n_workers`` (default 2) CPU worker processes. The dashboard listens on a free port.

    Args:
        resources: what each worker offers (default ``{"GPU": 1}``, one task at a time each).
        n_workers: CPU workers when no GPU is visible.

    Returns:
        ``(cluster, client)``; close both when done (or use :func:`cluster_client`).
    """
    from distributed import Client, LocalCluster, Nanny, Scheduler, SpecCluster

    from ._campaign import _visible_gpus

    resources = {"GPU": 1} if resources is None else dict(resources)
    env = worker_environment()
    gpus = _visible_gpus()
    if gpus:
        platforms = os.environ.get("JAX_PLATFORMS", "cuda")
        workers = {f"gpu-{g}": {"cls": Nanny, "options": {
            "nthreads": 1, "resources": resources, "host": "127.0.0.1", "preload": [WORKER_PRELOAD],
            "env": {**env, "CUDA_VISIBLE_DEVICES": g, "JAX_PLATFORMS": platforms}}} for g in gpus}  # fmt: skip
        scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"}}
        cluster = SpecCluster(workers=workers, scheduler=scheduler, name="diffsoup-embedded")
    else:
        cluster = LocalCluster(n_workers=n_workers or 2, threads_per_worker=1, processes=True,
                               resources=resources or None, host="127.0.0.1", dashboard_address="127.0.0.1:0",
                               env=env, preload=[WORKER_PRELOAD])  # fmt: skip
    try:
        client = Client(cluster, set_as_default=False)
    except BaseException:
        cluster.close()
        raise
    return cluster, client


def read_profile(profile: Any) -> dict:
    """The ``[slurm]`` table of a SLURM profile (a TOML path or a mapping), checked.

    Raises:
        ValueError: naming the file and the key: an unknown key, a wrong type, ``processes`` that
            does not divide the GPUs.
    """
    where = "SLURM profile"
    if isinstance(profile, (str, os.PathLike)):
        where = f"SLURM profile {profile}"
        with open(profile, "rb") as f:
            try:
                profile = tomllib.load(f)
            except tomllib.TOMLDecodeError as exc:
                raise ValueError(f"{where}: not valid TOML: {exc}") from None
    table = dict(profile.get("slurm", profile))
    unknown = sorted(set(table) - set(PROFILE_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown} in [slurm]; known: {', '.join(PROFILE_KEYS)}.")
    for key in ("cores", "processes", "gpus", "minimum_jobs", "maximum_jobs"):
        if key in table and (isinstance(table[key], bool) or not isinstance(table[key], int) or table[key] < 0):
            raise ValueError(f"{where}: slurm.{key} = {table[key]!r} must be a non-negative integer.")
    for key in ("queue", "account", "walltime", "memory", "shared_dir", "python", "interface", "jax_platforms"):
        if key in table and not (isinstance(table[key], str) and table[key]):
            raise ValueError(f"{where}: slurm.{key} = {table[key]!r} must be a non-empty string.")
    for key in ("job_extra", "prologue"):
        if key in table and not (isinstance(table[key], list) and all(isinstance(x, str) for x in table[key])):
            raise ValueError(f"{where}: slurm.{key} must be a list of strings.")
    processes, gpus = table.get("processes", 1), table.get("gpus", 0)
    if processes < 1:
        raise ValueError(f"{where}: slurm.processes must be at least 1.")
    if gpus and gpus % processes:
        raise ValueError(f"{where}: slurm.gpus = {gpus} is not a multiple of slurm.processes = {processes}; "
                         "each worker process gets the same number of GPUs (one, usually).")  # fmt: skip
    if table.get("cores", processes) < processes:
        raise ValueError(f"{where}: slurm.cores = {table['cores']} is fewer than slurm.processes = {processes}.")
    return table


def slurm_cluster(profile: Any, **overrides: Any):
    """A dask-jobqueue ``SLURMCluster`` from a SLURM profile, scaled with ``adapt()``.

    Each job runs ``processes`` worker processes with one thread each and ``GPU=1`` each, asks for
    ``gpus`` generic GPUs (``--gres=gpu:N``), and, holding several GPUs, pins one GPU per worker
    process (dask-jobqueue gives every process of a job all of the job's GPUs). ``shared_dir``
    holds the JAX compilation cache and, as ``DIFFSOUP_CACHE_DIR``, the window-start store (for
    the workers, and for this process unless it has its own ``DIFFSOUP_CACHE_DIR``).

    Args:
        profile: the profile (a TOML path or a mapping; see the module documentation).
        **overrides: profile keys to replace.

    Returns:
        The ``SLURMCluster``, already adapting between ``minimum_jobs`` and ``maximum_jobs`` jobs.
    """
    from dask_jobqueue import SLURMCluster

    table = {**read_profile(profile), **overrides}
    processes = table.get("processes", 1)
    gpus = table.get("gpus", 0)
    prologue = ["export JAX_ENABLE_X64=${JAX_ENABLE_X64:-1}", *table.get("prologue", [])]
    if table.get("shared_dir"):
        shared = Path(table["shared_dir"]).expanduser().resolve()
        shared.mkdir(parents=True, exist_ok=True)
        # This process (the driver) shares the window-start store with its workers.
        os.environ.setdefault("DIFFSOUP_CACHE_DIR", str(shared))
        prologue += [f"export DIFFSOUP_CACHE_DIR={shared}", f"export DIFFSOUP_JAX_CACHE_DIR={shared / 'jax'}"]
    platforms = table.get("jax_platforms", "cuda" if gpus else None)
    if platforms:
        prologue.append(f"export JAX_PLATFORMS={platforms}")
    if gpus:
        prologue.append("export XLA_PYTHON_CLIENT_PREALLOCATE=false")
        if gpus > processes or processes > 1:
            prologue.append(f"export DIFFSOUP_GPUS_PER_WORKER={gpus // processes}")
    job_extra = list(table.get("job_extra", []))
    if gpus:
        job_extra.append(f"--gres=gpu:{gpus}")
    options = dict(
        # One thread per worker process (one diffsoup task per GPU at a time); the job still books
        # all of ``cores`` for XLA's own threads.
        cores=processes, job_cpu=table.get("cores", processes), processes=processes, memory=table.get("memory", "4GB"),
        walltime=table.get("walltime", "01:00:00"), job_extra_directives=job_extra,
        worker_extra_args=["--resources", "GPU=1", "--preload", WORKER_PRELOAD],
        job_script_prologue=prologue, python=table.get("python", sys.executable),
    )  # fmt: skip
    for key, name in (("queue", "queue"), ("account", "account"), ("interface", "interface")):
        if table.get(key):
            options[name] = table[key]
    cluster = SLURMCluster(**options)
    cluster.adapt(minimum_jobs=table.get("minimum_jobs", 1), maximum_jobs=table.get("maximum_jobs", 1))
    return cluster


@contextlib.contextmanager
def cluster_client(*, scheduler: str | None = None, slurm: Any = None, n_workers: int | None = None) -> Iterator:
    """A Dask client on the cluster the ``diffsoup`` command and the job scripts choose: a
    scheduler address, a SLURM profile, or else the embedded default; closed at the end.

    Yields:
        ``(client, dashboard)``: the client and the dashboard's address (or None).
    """
    from distributed import Client

    closers: list = []
    try:
        if scheduler:
            client = Client(scheduler, set_as_default=False)
            closers.append(client)
        elif slurm is not None:
            cluster = slurm_cluster(slurm)
            closers.append(cluster)
            client = Client(cluster, set_as_default=False)
            closers.insert(0, client)
        else:
            cluster, client = embedded_cluster(n_workers=n_workers)
            closers += [client, cluster]
        from ._run import dashboard_url

        yield client, dashboard_url(client)
    finally:
        for thing in closers:
            with contextlib.suppress(Exception):
                thing.close()
