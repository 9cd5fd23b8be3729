"""Process-wide settings: the environment variables diffsoup reads, their defaults, and the XLA and
allocator defaults it adds to a process.

This is the ground floor of the package: it imports nothing of diffsoup, and neither JAX nor Dask,
so ``import diffsoup`` can call :func:`configure` before JAX starts. Every ``DIFFSOUP_*`` variable
is read here (the C++ cuDSS handler reads its own debugging switches, listed in
:data:`ENVIRONMENT` too); execution settings of clusters, campaigns and runs live in the
``diffsoup`` Dask config namespace instead (``diffsoup.distributed``), read only by the execution
layer.

Settings are read when asked for (:func:`settings`), not cached at import, so a test or a launcher
that sets a variable before the first use is obeyed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import tempfile
import warnings
from collections.abc import Mapping, MutableMapping
from pathlib import Path

# Every environment variable diffsoup reads, with what it does (the README's settings table).
ENVIRONMENT: Mapping[str, str] = {
    "DIFFSOUP_CACHE_DIR": "Root of diffsoup's caches: the window-start store, the JAX compilation cache "
    "(`jax/`), the cuDSS build (`cudss-build/`). Default: `$XDG_CACHE_HOME/diffsoup` or `~/.cache/diffsoup`. "
    "Put it on a shared file system for SLURM runs.",
    "DIFFSOUP_COORDINATOR": "`host:port` of process 0 for a multi-process run started by an MPI launcher.",
    "DIFFSOUP_JAX_CACHE_DIR": "Deprecated: set `DIFFSOUP_CACHE_DIR` (the JAX compilation cache is its `jax/` folder). "
    "Still honoured as the JAX cache's folder, with a DeprecationWarning.",
    "DIFFSOUP_PYTHON": "The interpreter `./run` makes `.venv` with (default: a Python 3.12 it finds).",
    "DIFFSOUP_TRACEBACK": "`1`: the `diffsoup` command prints the whole traceback of its own errors.",
    "DIFFSOUP_LAUNCH_COORDINATOR": "Set by `python -m diffsoup.distributed.launch` in each process it starts.",
    "DIFFSOUP_LAUNCH_NUM_PROCESSES": "Set by `python -m diffsoup.distributed.launch`.",
    "DIFFSOUP_LAUNCH_PROCESS_ID": "Set by `python -m diffsoup.distributed.launch`.",
    "DIFFSOUP_GPUS_PER_WORKER": "Set by `slurm_cluster` in jobs of several GPUs: GPUs each worker process keeps.",
    "DIFFSOUP_CUDSS_NVCC_FLAGS": "Extra nvcc flags for building the cuDSS handler.",
    "DIFFSOUP_CUDSS_CHECK_INFO": "`0`: skip cuDSS's per-factorization info check (debugging).",
    "DIFFSOUP_CUDSS_TRANSPOSE": "Read by the cuDSS handler: how transposed solves run (debugging).",
    "DIFFSOUP_CUDSS_PIVOT_FAIL": "Read by the cuDSS handler: pivot threshold below which a factor fails (debugging).",
    "DIFFSOUP_CUDSS_DETERMINISTIC": "Read by the cuDSS handler: deterministic cuDSS algorithms (debugging).",
    "DIFFSOUP_CUDSS_VERBOSE": "Read by the cuDSS handler: print its calls (debugging).",
}

# XLA flags diffsoup adds on GPU machines (each only when XLA_FLAGS does not name it already).
DEFAULT_XLA_GPU_FLAGS: tuple[str, ...] = (
    # Overlap the collectives of a sharded chunk with its compute.
    "--xla_gpu_enable_latency_hiding_scheduler=true",
)
# JAX's client grows its GPU pool on demand and keeps at most this share of the GPU, so that cuDSS
# (which allocates its factors with cudaMalloc, outside JAX's pool) has room.
XLA_MEM_FRACTION = 0.75
DEFAULT_ALLOCATOR_ENV: Mapping[str, str] = {
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    "XLA_PYTHON_CLIENT_MEM_FRACTION": str(XLA_MEM_FRACTION),
}
_MEM_FRACTION_VARIABLES = ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION")
_CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")
_TRUE = ("1", "true", "yes", "on")


@dataclasses.dataclass(frozen=True)
class Settings:
    """The process-wide settings as the environment gives them now.

    Attributes:
        cache_dir: root of the caches (``DIFFSOUP_CACHE_DIR``).
        jax_cache_dir: JAX's persistent compilation cache, ``jax/`` under ``cache_dir`` (the
            deprecated ``DIFFSOUP_JAX_CACHE_DIR`` still wins, with a DeprecationWarning).
        coordinator: ``DIFFSOUP_COORDINATOR`` (MPI launches), or None.
        launch_coordinator, launch_num_processes, launch_process_id: what
            ``python -m diffsoup.distributed.launch`` set, or None.
        gpus_per_worker: ``DIFFSOUP_GPUS_PER_WORKER`` (0: keep every visible GPU).
        traceback: ``DIFFSOUP_TRACEBACK`` is set to a true value.
        cudss_check_info: ``DIFFSOUP_CUDSS_CHECK_INFO`` is not ``0``.
        cudss_nvcc_flags: ``DIFFSOUP_CUDSS_NVCC_FLAGS`` split into words, or None.
    """

    cache_dir: Path
    jax_cache_dir: Path
    coordinator: str | None
    launch_coordinator: str | None
    launch_num_processes: int | None
    launch_process_id: int | None
    gpus_per_worker: int
    traceback: bool
    cudss_check_info: bool
    cudss_nvcc_flags: tuple[str, ...] | None


def _text(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def _int(environ: Mapping[str, str], name: str) -> int | None:
    value = _text(environ, name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} must be an integer; unset it or give a whole number.") from None


def default_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``DIFFSOUP_CACHE_DIR``, else ``$XDG_CACHE_HOME/diffsoup``, else ``~/.cache/diffsoup``."""
    environ = os.environ if environ is None else environ
    given = _text(environ, "DIFFSOUP_CACHE_DIR")
    if given:
        return Path(given)
    xdg = _text(environ, "XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "diffsoup"
    try:
        return Path.home() / ".cache" / "diffsoup"
    except RuntimeError:  # no home directory (some batch systems)
        uid = os.getuid() if hasattr(os, "getuid") else "user"
        return Path(tempfile.gettempdir()) / f"diffsoup-cache-{uid}"


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings from ``environ`` (default ``os.environ``) and the defaults.

    Raises:
        ValueError: for a variable that must be an integer and is not, naming it.
    """
    environ = os.environ if environ is None else environ
    cache = default_cache_dir(environ)
    flags = _text(environ, "DIFFSOUP_CUDSS_NVCC_FLAGS")
    return Settings(
        cache_dir=cache,
        jax_cache_dir=_jax_cache_dir(environ, cache),
        coordinator=_text(environ, "DIFFSOUP_COORDINATOR"),
        launch_coordinator=_text(environ, "DIFFSOUP_LAUNCH_COORDINATOR"),
        launch_num_processes=_int(environ, "DIFFSOUP_LAUNCH_NUM_PROCESSES"),
        launch_process_id=_int(environ, "DIFFSOUP_LAUNCH_PROCESS_ID"),
        gpus_per_worker=_int(environ, "DIFFSOUP_GPUS_PER_WORKER") or 0,
        traceback=(_text(environ, "DIFFSOUP_TRACEBACK") or "").lower() in _TRUE,
        cudss_check_info=(_text(environ, "DIFFSOUP_CUDSS_CHECK_INFO") or "1") not in ("0", "false", "False"),
        cudss_nvcc_flags=tuple(flags.split()) if flags else None,
    )


def _jax_cache_dir(environ: Mapping[str, str], cache: Path) -> Path:
    """``cache/jax``, or the deprecated ``DIFFSOUP_JAX_CACHE_DIR`` where it is still set."""
    old = _text(environ, "DIFFSOUP_JAX_CACHE_DIR")
    if old is None:
        return cache / "jax"
    warnings.warn(
        f"DIFFSOUP_JAX_CACHE_DIR={old!r} is deprecated: set DIFFSOUP_CACHE_DIR instead (JAX's compilation cache "
        "is its jax/ folder). It is still honoured for now.",
        DeprecationWarning,
        stacklevel=3,
    )
    return Path(old)


def cache_dir(path: str | os.PathLike | None = None) -> Path:
    """``path`` if given, else the settings' cache directory."""
    return Path(path) if path is not None else settings().cache_dir


# ------------------------------------------------------------------------------------------------
# XLA and allocator defaults
# ------------------------------------------------------------------------------------------------


def _flag_name(flag: str) -> str:
    return flag.split("=", 1)[0].strip()


def has_cuda_plugin() -> bool:
    """Whether a JAX CUDA plugin is installed (without importing JAX)."""
    for name in _CUDA_PLUGINS:
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except (ImportError, ValueError):
            continue
    return False


def configure_environment(environ: MutableMapping[str, str], gpu: bool) -> None:
    """Add diffsoup's defaults to ``environ``, keeping every setting already there."""
    if gpu:
        present = environ.get("XLA_FLAGS", "").split()
        names = {_flag_name(f) for f in present}
        added = [f for f in DEFAULT_XLA_GPU_FLAGS if _flag_name(f) not in names]
        if added:
            environ["XLA_FLAGS"] = " ".join(present + added)
    environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", DEFAULT_ALLOCATOR_ENV["XLA_PYTHON_CLIENT_PREALLOCATE"])
    # Setting both fraction variables makes the CUDA plugin fail to start: set ours only if
    # neither is set.
    if not any(name in environ for name in _MEM_FRACTION_VARIABLES):
        environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = DEFAULT_ALLOCATOR_ENV["XLA_PYTHON_CLIENT_MEM_FRACTION"]


def configure() -> None:
    """Add diffsoup's default XLA GPU flags to ``XLA_FLAGS``, keeping any flag already set.

    Also sets the allocator variables that leave room for cuDSS (no preallocation, a 75 % cap),
    each only when unset. GPU flags are added only where a JAX CUDA plugin is installed (a CPU
    install's environment is left as it is, apart from the allocator variables, which CPU JAX
    ignores). It runs when diffsoup is imported, again in ``ds.distributed.initialize``, and when a
    Dask worker that diffsoup starts sets up. Settings read by a JAX that has already started its
    backends take effect only in new processes.
    """
    configure_environment(os.environ, gpu=has_cuda_plugin())
