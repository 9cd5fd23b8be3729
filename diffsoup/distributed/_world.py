"""This process's place in a multi-process launch: ``world()`` and ``World``."""

from __future__ import annotations

import os
from typing import NamedTuple

# Variables that MPI launchers set in every process they start, size first. mpi4py is imported
# only when one of them is present: MPI_Init is slow, and under some launchers it fails in a
# process that was not started by mpirun.
_MPI_SIZE_VARIABLES = (
    "OMPI_COMM_WORLD_SIZE",  # Open MPI
    "PMI_SIZE",  # MPICH, Intel MPI (Hydra), Slurm's PMI-2
    "MV2_COMM_WORLD_SIZE",  # MVAPICH2
    "PMIX_SIZE",  # some PMIx launchers
)
_MPI_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK", "PMIX_RANK")


class World(NamedTuple):
    """This process's rank and the number of processes in the run.

    Attributes:
        rank: 0 to ``size - 1``.
        size: the number of processes; 1 outside an MPI launch.
    """

    rank: int
    size: int


def _mpi_launch() -> tuple[str, str] | None:
    """The (variable, value) that says this process was started by an MPI launcher, or None."""
    for name in _MPI_SIZE_VARIABLES + _MPI_RANK_VARIABLES:
        value = os.environ.get(name)
        if value not in (None, ""):
            return name, value
    return None


def world() -> World:
    """Return this process's rank and the number of processes in the run.

    A process not launched under MPI, or one using ``jax.distributed``, is process 0 of 1. Launch
    several processes with ``mpirun -n N python -m mpi4py script.py``, which needs mpi4py
    installed. The launch is recognised by the variables MPI launchers set (``OMPI_COMM_WORLD_SIZE``,
    ``PMI_SIZE``, ``PMIX_RANK``, ...) before mpi4py is imported, so a plain run never starts MPI.

    Returns:
        A named tuple ``World(rank, size)``.

    Raises:
        ImportError: if the process was launched under MPI with more than one process but mpi4py
            is not installed (installing it is the fix: ``pip install mpi4py``).
    """
    launch = _mpi_launch()
    if launch is None:
        return World(0, 1)
    try:
        from mpi4py import MPI
    except ImportError as exc:
        sizes = [os.environ.get(name) for name in _MPI_SIZE_VARIABLES]
        if all(size in (None, "", "1") for size in sizes) and any(size == "1" for size in sizes):
            # mpirun -n 1: one process whatever MPI would say.
            return World(0, 1)
        name, value = launch
        raise ImportError(
            f"this process was launched under MPI ({name}={value}) but mpi4py is not installed, "
            "so diffsoup cannot learn its rank. Install it (pip install mpi4py) in the environment "
            "the launcher runs, or start a single process without mpirun."
        ) from exc
    comm = MPI.COMM_WORLD
    return World(int(comm.Get_rank()), int(comm.Get_size()))
