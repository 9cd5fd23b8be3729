"""Dask worker set-up for diffsoup: a preload module and a worker plugin doing the same thing.

Start your own workers with ``dask worker ... --nthreads 1 --resources GPU=1 --preload
diffsoup.distributed._worker`` (one worker process per GPU); ``ds.distributed.run`` passes the
preload to the workers it starts and registers :class:`DiffsoupWorkerPlugin` on any cluster.

The set-up, before the worker's JAX starts where possible:

- ``JAX_ENABLE_X64=1`` unless set (float64 is diffsoup's default policy);
- :func:`diffsoup.distributed.configure` (XLA flags and allocator settings, only what is unset);
- JAX's persistent compilation cache shared by the workers, through
  :func:`diffsoup.enable_compilation_cache`: ``jax/`` under ``DIFFSOUP_CACHE_DIR`` (default
  ``~/.cache/diffsoup``), unless JAX's own ``JAX_COMPILATION_CACHE_DIR`` is set; the setting
  ``diffsoup.worker.cache-min-compile-seconds`` (null: diffsoup's default, 0.1 s, or JAX's own
  ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS``) is the shortest compilation written to it;
- with ``DIFFSOUP_GPUS_PER_WORKER=g`` (set by :func:`diffsoup.distributed.slurm_cluster` for jobs
  holding several GPUs), the worker keeps ``g`` of the job's GPUs: worker process ``i`` of the job
  (its name ends in ``-i``, as ``dask worker --nworkers N`` names them) takes the ``i``-th block of
  ``CUDA_VISIBLE_DEVICES``, so that two workers never share a GPU;
- with ``JAX_PLATFORMS`` naming cuda or gpu, JAX's devices are listed at start, so a worker whose
  GPU cannot be used fails at start with a clear error instead of computing on CPU.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import jax

from .._compilation_cache import enable_compilation_cache
from .._settings import settings
from ._config import get
from ._runtime import configure

PLUGIN_NAME = "diffsoup-worker"


def default_cache_dir() -> str:
    """The persistent JAX compilation cache directory shared by diffsoup's workers when JAX's own
    is not set (the settings' ``jax_cache_dir``: ``$DIFFSOUP_CACHE_DIR/jax``)."""
    return str(settings().jax_cache_dir)


class GPUUnavailableError(RuntimeError):
    """A worker asked for a GPU platform (``JAX_PLATFORMS``) that JAX cannot start."""


def setup_worker_environment(cache_dir: str | None = None) -> None:
    """Prepare this process to run diffsoup's tasks (see the module docstring).

    Raises:
        GPUUnavailableError: if ``JAX_PLATFORMS`` names cuda/gpu and JAX cannot start it.
    """
    os.environ.setdefault("JAX_ENABLE_X64", "1")
    configure()
    if os.environ["JAX_ENABLE_X64"].strip().lower() in ("1", "true", "yes", "on"):
        jax.config.update("jax_enable_x64", True)
    platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    if any(p in platforms for p in ("cuda", "gpu")):
        try:
            devices = jax.devices()
        except Exception as exc:  # RuntimeError, or an AssertionError from a backend that failed to start
            raise GPUUnavailableError(
                f"diffsoup worker: JAX_PLATFORMS={os.environ['JAX_PLATFORMS']!r} asks for a GPU, but JAX cannot "
                f"start one on this machine ({type(exc).__name__}: {exc}). Check the GPU, CUDA_VISIBLE_DEVICES and the jax CUDA plugin, "
                "or start CPU workers without JAX_PLATFORMS=cuda."
            ) from exc
        if not any(d.platform == "gpu" for d in devices):
            raise GPUUnavailableError(
                f"diffsoup worker: JAX_PLATFORMS={os.environ['JAX_PLATFORMS']!r} but JAX sees only {devices}."
            )
    enable_compilation_cache(cache_dir, min_compile_seconds=get("worker.cache-min-compile-seconds"))


def pin_gpus(worker_name: Any, visible: str | None, per_worker: int) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` of worker process ``i`` (the trailing ``-i`` of its name) of a
    job whose processes share ``visible``: its own block of ``per_worker`` ids, or None to leave
    it (no list, or a list no longer than one block).

    Raises:
        GPUUnavailableError: if the job holds fewer GPUs than its worker processes need.
    """
    if not visible:
        return None
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if len(ids) <= per_worker:
        return None
    tail = str(worker_name).rsplit("-", 1)[-1]
    index = int(tail) if tail.isdigit() else 0
    block = ids[index * per_worker : (index + 1) * per_worker]
    if len(block) < per_worker:
        raise GPUUnavailableError(
            f"diffsoup worker {worker_name!r}: worker process {index} needs GPUs {index * per_worker}.."
            f"{(index + 1) * per_worker - 1} of CUDA_VISIBLE_DEVICES={visible!r}, which has {len(ids)}; ask the job "
            "for as many GPUs as processes (slurm profile: gpus = processes)."
        )
    return ",".join(block)


def dask_setup(worker: Any = None) -> None:
    """Dask's preload hook: runs in the worker process before the worker starts.

    Dask logs a preload's exception and starts the worker anyway; a worker whose GPU is unusable
    must not compute on CPU, so this ends the worker process (``SystemExit`` with the message).
    """
    try:
        per_worker = settings().gpus_per_worker
        if per_worker > 0 and worker is not None:
            pinned = pin_gpus(getattr(worker, "name", ""), os.environ.get("CUDA_VISIBLE_DEVICES"), per_worker)
            if pinned is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = pinned
        setup_worker_environment()
    except GPUUnavailableError as exc:
        print(f"{exc}", file=sys.stderr, flush=True)
        raise SystemExit(f"diffsoup worker not started: {exc}") from exc


try:  # the plugin class needs distributed; this module is only imported on a Dask path
    from distributed.diagnostics.plugin import WorkerPlugin
except ImportError:  # pragma: no cover
    WorkerPlugin = object  # type: ignore[assignment,misc]


class DiffsoupWorkerPlugin(WorkerPlugin):  # type: ignore[misc,valid-type]
    """Worker plugin running :func:`setup_worker_environment` on every worker, present and future."""

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, cache_dir: str | None = None):
        self.cache_dir = cache_dir

    def setup(self, worker: Any) -> None:
        setup_worker_environment(self.cache_dir)
