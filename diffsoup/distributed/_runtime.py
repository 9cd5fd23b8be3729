"""The multi-process runtime: ``configure``, ``initialize`` and the helpers of a run of several
JAX processes (``is_primary``, ``owns``, ``local_value``, ``from_local_data``, ``key``,
``any_process``).

This module imports no Dask, and JAX only inside the functions that need it, so that
``import diffsoup`` can call :func:`configure` before JAX starts.

A run of several processes is started by ``python -m diffsoup.distributed.launch -n N script.py``
(one machine), by ``srun`` under Slurm (several tasks), or by an MPI launcher with
``DIFFSOUP_COORDINATOR=host:port`` set; each process calls :func:`initialize` with no arguments.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .._settings import DEFAULT_ALLOCATOR_ENV as DEFAULT_ALLOCATOR_ENV
from .._settings import DEFAULT_XLA_GPU_FLAGS as DEFAULT_XLA_GPU_FLAGS
from .._settings import configure as configure
from .._settings import configure_environment as _configure_env
from .._settings import has_cuda_plugin as _has_cuda_plugin
from .._settings import settings
from ._kv import is_initialized as is_initialized
from ._world import _MPI_RANK_VARIABLES, _MPI_SIZE_VARIABLES

# Variables `python -m diffsoup.distributed.launch` sets in each process it starts (read back
# through diffsoup._settings: launch_coordinator, launch_num_processes, launch_process_id).
LAUNCH_COORDINATOR = "DIFFSOUP_LAUNCH_COORDINATOR"
LAUNCH_NUM_PROCESSES = "DIFFSOUP_LAUNCH_NUM_PROCESSES"
LAUNCH_PROCESS_ID = "DIFFSOUP_LAUNCH_PROCESS_ID"
MPI_COORDINATOR = "DIFFSOUP_COORDINATOR"

_state = {"debug": False, "initialized_by_us": False}


# --------------------------------------------------------------------------------------------
# initialize
# --------------------------------------------------------------------------------------------


def _int_env(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    try:
        return int(value) if value else None
    except ValueError:
        return None


def _detect() -> dict[str, Any] | None:
    """How this process was launched: arguments for jax.distributed.initialize, {} for JAX's own
    Slurm detection, or None for a single process."""
    given = settings()
    if given.launch_coordinator:
        n, pid = given.launch_num_processes, given.launch_process_id
        if n is None or pid is None:
            raise RuntimeError(
                f"{LAUNCH_COORDINATOR} is set but {LAUNCH_NUM_PROCESSES}/{LAUNCH_PROCESS_ID} are not: start "
                "the script with python -m diffsoup.distributed.launch -n N script.py."
            )
        if n <= 1:
            return None
        return {"coordinator_address": given.launch_coordinator, "num_processes": n, "process_id": pid}
    if (_int_env("SLURM_NTASKS") or _int_env("SLURM_NPROCS") or 1) > 1 and os.environ.get("SLURM_STEP_ID"):
        return {}  # jax.distributed.initialize reads Slurm's variables itself
    if given.coordinator:
        size = next((_int_env(v) for v in _MPI_SIZE_VARIABLES if _int_env(v) is not None), None)
        rank = next((_int_env(v) for v in _MPI_RANK_VARIABLES if _int_env(v) is not None), None)
        if size is None or rank is None:
            raise RuntimeError(
                f"{MPI_COORDINATOR} is set but no MPI launcher variable gives this process's rank and the "
                "number of processes (OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE, ...): launch with mpirun/srun, "
                f"or unset {MPI_COORDINATOR}."
            )
        if size <= 1:
            return None
        return {"coordinator_address": given.coordinator, "num_processes": size, "process_id": rank}
    return None


def initialize(
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    debug: bool = False,
    **kwargs: Any,
) -> None:
    """Start JAX's multi-process runtime for a run of several processes.

    Call it before any array is created. Without arguments it detects a Slurm launch with several
    tasks, ``python -m diffsoup.distributed.launch``, or an MPI launch with ``DIFFSOUP_COORDINATOR``
    set, and otherwise does nothing. It runs :func:`configure` first. On CPU, collectives across
    processes use gloo. Calling it again once the runtime runs does nothing.

    Args:
        coordinator_address: ``host:port`` of process 0, given together with ``num_processes``
            and ``process_id``.
        num_processes: number of processes in the run.
        process_id: rank of this process.
        debug: if True, check that optimizer decisions agree across processes (the commands of
            ``ds.distributed.run`` and the flags of :func:`any_process`); a disagreement raises
            ``RuntimeError``.
        **kwargs: passed to ``jax.distributed.initialize``.

    Raises:
        ValueError: if only some of ``coordinator_address``, ``num_processes`` and ``process_id``
            are given.
    """
    given = {"coordinator_address": coordinator_address, "num_processes": num_processes, "process_id": process_id}
    present = [k for k, v in given.items() if v is not None]
    if present and len(present) != 3:
        missing = [k for k in given if k not in present]
        raise ValueError(
            f"initialize: {present} given without {missing}; give coordinator_address, num_processes and "
            "process_id together, or none of them to detect the launch."
        )
    if present:
        if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
            raise ValueError(f"initialize: num_processes={num_processes!r} must be a positive integer.")
        if isinstance(process_id, bool) or not isinstance(process_id, int) or not 0 <= process_id < num_processes:
            raise ValueError(f"initialize: process_id={process_id!r} must be an integer in [0, {num_processes}).")
    _state["debug"] = bool(debug)
    configure()
    if is_initialized():
        return
    args = dict(given) if present else _detect()
    if args is None:
        return
    try:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except (AttributeError, ValueError):  # pragma: no cover (older or newer JAX)
        pass
    jax.distributed.initialize(**args, **kwargs)
    _state["initialized_by_us"] = True


def process_count() -> int:
    """Number of processes of the run (1 when the multi-process runtime is not running)."""
    if not is_initialized():
        return 1
    return int(jax.process_count())


def process_index() -> int:
    """This process's rank (0 when the multi-process runtime is not running)."""
    if not is_initialized():
        return 0
    return int(jax.process_index())


def _launch_rank() -> int:
    """This process's rank as its launcher tells it (before initialize), else 0."""
    detected = _detect()
    if detected:
        return int(detected["process_id"])
    if detected == {}:  # Slurm with several tasks
        return _int_env("SLURM_PROCID") or 0
    return 0


def is_primary() -> bool:
    """Return whether this process is process 0.

    Before :func:`initialize` it reads the rank the launcher gave (``launch``, Slurm, MPI with
    ``DIFFSOUP_COORDINATOR``).

    Returns:
        True on process 0 (and in a single-process run).
    """
    if not is_initialized():
        try:
            return _launch_rank() == 0
        except (RuntimeError, ValueError):  # a half-set or malformed launch: say primary, as one process
            return True
    return process_index() == 0


def owns(mesh: Any) -> bool:
    """Return whether any device of ``mesh`` belongs to this process.

    Args:
        mesh: a ``jax.sharding.Mesh``.

    Returns:
        True when this process holds a device of ``mesh``.

    Raises:
        TypeError: if ``mesh`` is not a Mesh.
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"owns: mesh must be a jax.sharding.Mesh, not {type(mesh).__name__}.")
    me = jax.process_index()
    return any(d.process_index == me for d in mesh.devices.flat)


def local_value(value: Any, dtype: Any = None):
    """Read a value as a NumPy array on this process.

    A global array that this process cannot fully address must be replicated, and its first
    local shard is read.

    Args:
        value: array or array-like to read.
        dtype: optional NumPy dtype of the result.

    Returns:
        A host ``numpy.ndarray``.

    Raises:
        ValueError: if ``value`` is a partitioned global array (not fully addressable and not
            replicated).
    """
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        if not value.sharding.is_fully_replicated:
            raise ValueError(
                f"local_value: the array of shape {value.shape} is partitioned across processes "
                f"({value.sharding}); this process holds only part of it. Replicate it first (for "
                "example jax.jit(lambda x: x, out_shardings=NamedSharding(mesh, P()))(value)) or read "
                "its addressable_shards."
            )
        value = value.addressable_shards[0].data
    return np.asarray(jax.device_get(value) if isinstance(value, jax.Array) else value, dtype=dtype)


def from_local_data(data: Any, mesh: Any, spec: Any, *, global_shape: Any = None):
    """Assemble a global array from the piece of it each process holds.

    Args:
        data: this process's local piece.
        mesh: mesh the array is placed on.
        spec: ``PartitionSpec`` of the array over ``mesh``.
        global_shape: shape of the global array, inferred from the local pieces when None.

    Returns:
        A ``jax.Array`` sharded by ``NamedSharding(mesh, spec)``.

    Raises:
        TypeError: if ``mesh`` is not a Mesh or ``spec`` not a PartitionSpec.
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"from_local_data: mesh must be a jax.sharding.Mesh, not {type(mesh).__name__}.")
    if not isinstance(spec, PartitionSpec):
        raise TypeError(f"from_local_data: spec must be a jax.sharding.PartitionSpec, not {type(spec).__name__}.")
    shape = None if global_shape is None else tuple(int(s) for s in global_shape)
    return jax.make_array_from_process_local_data(NamedSharding(mesh, spec), np.asarray(data), shape)


def key(seed: int):
    """Return ``jax.random.key(seed)``.

    Pass the same seed on every process so they draw the same random numbers.

    Args:
        seed: integer seed.

    Returns:
        A typed JAX random key.

    Raises:
        TypeError: if ``seed`` is not an integer.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"key: seed must be an integer, not {type(seed).__name__}.")
    return jax.random.key(int(seed))


def _allgather(values):
    """``values`` (a 1-D NumPy array of the same shape on every process) from every process,
    stacked ``(process_count, n)``."""
    return np.asarray(multihost_utils.process_allgather(np.asarray(values), tiled=False))


def check_agree(values: Any, what: str) -> None:
    """With ``initialize(debug=True)``: raise RuntimeError unless ``values`` agree on every process."""
    if not _state["debug"] or process_count() == 1:
        return
    mine = np.atleast_1d(np.asarray(values, dtype=np.float64))
    every = _allgather(mine)
    same = np.all((every == every[0]) | (np.isnan(every) & np.isnan(every[0])), axis=1)
    if not np.all(same):
        raise RuntimeError(
            f"debug: {what} disagrees across processes (processes {np.flatnonzero(~same).tolist()} differ from "
            "process 0); every process must take the same optimizer decisions."
        )


def any_process(flag: Any) -> bool:
    """Return whether ``flag`` is true on any process.

    It is a collective, so every process taking part must call it. In one process it returns
    ``flag``.

    Args:
        flag: boolean, or a scalar array read with :func:`local_value`.

    Returns:
        True when ``flag`` is true on at least one process.

    Raises:
        ValueError: if ``flag`` is an array of more than one element (or a partitioned one).
    """
    value = local_value(flag)
    if value.size != 1:
        raise ValueError(f"any_process: flag must be a boolean or a scalar array, not shape {value.shape}.")
    mine = bool(value.reshape(()))
    if process_count() == 1:
        return mine
    return bool(np.any(_allgather(np.array([mine], dtype=np.int32))))
