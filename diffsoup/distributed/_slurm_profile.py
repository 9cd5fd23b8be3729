"""SLURM profiles: what each dask-jobqueue ``SLURMCluster`` job of diffsoup asks for.

A profile is a TOML file (or a mapping) with a ``[slurm]`` table::

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

A key the table leaves out reads the setting ``diffsoup.slurm.<key>`` of Dask's configuration
(defaults in ``diffsoup.yaml``; a site can set its own in ``~/.config/dask/``, as with
dask-jobqueue's ``jobqueue.yaml``).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._config import get

_INTEGERS = ("cores", "processes", "gpus", "minimum_jobs", "maximum_jobs")
_STRINGS = ("queue", "account", "walltime", "memory", "python", "interface", "jax_platforms")
_STRING_LISTS = ("job_extra", "prologue")


@dataclasses.dataclass(frozen=True)
class SlurmProfile:
    """What each SLURM job of a diffsoup cluster asks for, checked.

    Every field left None reads the setting ``diffsoup.slurm.<field>`` (hyphens for
    underscores) when the profile is made; the fields below say the shipped defaults.

    Attributes:
        queue: the partition (``-p``); None leaves it to SLURM.
        account: the account (``-A``); None leaves it to SLURM.
        walltime: per job (default ``"01:00:00"``).
        memory: per job (default ``"4GB"``).
        cores: CPU cores per job, at least ``processes``; None books one per worker process
            (:attr:`job_cores`).
        processes: worker processes per job, one per GPU (default 1).
        gpus: generic GPUs per job (``--gres=gpu:N``), a multiple of ``processes``; 0 (the
            default) for CPU workers.
        minimum_jobs, maximum_jobs: the bounds of ``adapt()``, in jobs (default 1 and 1).
        shared_dir: a directory every node sees, for the JAX compilation cache and the window-start
            store (``~`` expanded); None keeps each worker's own cache.
        job_extra: more ``#SBATCH`` lines (default none).
        prologue: shell lines run before the workers start (default none).
        python: the workers' interpreter; None is the driver's.
        interface: the network interface the workers listen on; None is Dask's choice.
        jax_platforms: the workers' ``JAX_PLATFORMS``; None is ``cuda`` with GPUs, else unset.

    Raises:
        ValueError: naming the field and the fix: a wrong type, a negative count, no process,
            GPUs that do not divide among the processes, fewer cores than processes, or
            ``minimum_jobs`` above ``maximum_jobs``.
    """

    queue: str | None = None
    account: str | None = None
    walltime: str | None = None
    memory: str | None = None
    cores: int | None = None
    processes: int | None = None
    gpus: int | None = None
    minimum_jobs: int | None = None
    maximum_jobs: int | None = None
    shared_dir: Path | None = None
    job_extra: tuple[str, ...] | None = None
    prologue: tuple[str, ...] | None = None
    python: str | None = None
    interface: str | None = None
    jax_platforms: str | None = None

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        for field in dataclasses.fields(self):
            if getattr(self, field.name) is None:
                put(field.name, get(f"slurm.{field.name.replace('_', '-')}"))
        for name in _INTEGERS:
            value = getattr(self, name)
            if name == "cores" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"slurm.{name} = {value!r} must be a non-negative integer (e.g. {name} = 1).")
        for name in _STRINGS:
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value.strip()):
                raise ValueError(f"slurm.{name} = {value!r} must be a non-empty string (quoted in TOML), or left out.")
        for name in _STRING_LISTS:
            value = getattr(self, name)
            strings = isinstance(value, (list, tuple)) and all(isinstance(x, str) for x in value)
            if not strings:
                raise ValueError(f"slurm.{name} = {value!r} must be a list of strings (e.g. {name} = [\"...\"]).")
            put(name, tuple(value))
        if self.shared_dir is not None:
            if not isinstance(self.shared_dir, (str, os.PathLike)) or not str(self.shared_dir).strip():
                raise ValueError(f"slurm.shared_dir = {self.shared_dir!r} must be a directory path (a string), "
                                 "or left out.")  # fmt: skip
            put("shared_dir", Path(self.shared_dir).expanduser())
        if self.processes < 1:
            raise ValueError("slurm.processes = 0: a job needs at least 1 worker process (one per GPU).")
        if self.gpus % self.processes:
            raise ValueError(f"slurm.gpus = {self.gpus} is not a multiple of slurm.processes = {self.processes}; "
                             "each worker process gets the same number of GPUs (one, usually).")  # fmt: skip
        if self.cores is not None and self.cores < self.processes:
            raise ValueError(f"slurm.cores = {self.cores} is fewer than slurm.processes = {self.processes}; "
                             "give each worker process at least one core.")  # fmt: skip
        if self.minimum_jobs > self.maximum_jobs:
            raise ValueError(f"slurm.minimum_jobs = {self.minimum_jobs} is more than slurm.maximum_jobs = "
                             f"{self.maximum_jobs}; raise maximum_jobs or lower minimum_jobs.")  # fmt: skip

    @property
    def job_cores(self) -> int:
        """CPU cores each job books: ``cores``, or one per worker process."""
        return self.processes if self.cores is None else self.cores

    @property
    def gpus_per_worker(self) -> int:
        """GPUs each worker process keeps."""
        return self.gpus // self.processes

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any], *, where: str = "SLURM profile") -> SlurmProfile:
        """The profile of a mapping: a ``{"slurm": {...}}`` document or the ``[slurm]`` table itself.

        Raises:
            TypeError: for something other than a mapping.
            ValueError: for an unknown key (naming the nearest known one) or a bad value, the
                message starting with ``where``.
        """
        if not isinstance(table, Mapping):
            raise TypeError(f"{where}: a SLURM profile is a mapping or a TOML file, not {type(table).__name__}.")
        table = table.get("slurm", table)
        if not isinstance(table, Mapping):
            raise ValueError(f"{where}: [slurm] must be a table, not {table!r}.")
        _check_keys(table, where)
        try:
            return cls(**table)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None

    @classmethod
    def from_toml(cls, path: str | os.PathLike) -> SlurmProfile:
        """The profile of a TOML file.

        Raises:
            OSError: when the file cannot be read.
            ValueError: for invalid TOML, an unknown key or a bad value, naming the file.
        """
        where = f"SLURM profile {path}"
        with open(path, "rb") as f:
            try:
                document = tomllib.load(f)
            except tomllib.TOMLDecodeError as exc:
                raise ValueError(f"{where}: not valid TOML: {exc}") from None
        return cls.from_mapping(document, where=where)

    def replace(self, **changes: Any) -> SlurmProfile:
        """This profile with ``changes`` (profile keys), checked as a table is.

        Raises:
            ValueError: for an unknown key or a bad value.
        """
        _check_keys(changes, "SLURM profile overrides")
        table = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return SlurmProfile.from_mapping({**table, **changes}, where="SLURM profile overrides")


def _check_keys(table: Mapping[str, Any], where: str) -> None:
    """Raise ValueError for keys that are not profile fields, naming the nearest known ones."""
    known = [f.name for f in dataclasses.fields(SlurmProfile)]
    unknown = sorted((key for key in table if key not in known), key=str)
    if not unknown:
        return
    hints = []
    for key in unknown:
        near = difflib.get_close_matches(str(key).replace("-", "_"), known, n=1)
        if near:
            hints.append(f"{key!r}: did you mean {near[0]!r}?")
    hint = f" ({'; '.join(hints)})" if hints else ""
    raise ValueError(f"{where}: unknown key(s) {unknown} in [slurm]{hint}; known: {', '.join(known)}.")


def read_slurm_profile(profile: Any) -> SlurmProfile:
    """A SLURM profile (a TOML path, a mapping, or a :class:`SlurmProfile`), checked.

    Raises:
        TypeError: for anything else.
        ValueError: naming the file and the key: invalid TOML, an unknown key (with the nearest
            known one), a wrong type, ``processes`` that does not divide the GPUs.
    """
    if isinstance(profile, SlurmProfile):
        return profile
    if isinstance(profile, (str, os.PathLike)):
        return SlurmProfile.from_toml(profile)
    return SlurmProfile.from_mapping(profile)


def read_profile(profile: Any) -> SlurmProfile:
    """Deprecated name of :func:`read_slurm_profile` (a SLURM profile, not a likelihood profile)."""
    warnings.warn("ds.distributed.read_profile is deprecated: call ds.distributed.read_slurm_profile "
                  "(same arguments, same result).", DeprecationWarning, stacklevel=2)  # fmt: skip
    return read_slurm_profile(profile)
