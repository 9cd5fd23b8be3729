"""The options of ``ds.distributed.run``, kept in two kinds: *execution* options
(:class:`RunOptions`: cluster, resources, name, n_workers, retries, worker_timeout; a field left
None reads the ``diffsoup`` Dask configuration) and *lowering* options (``LOWER_OPTIONS``: what
``ds.lower`` takes), told apart by :func:`split_options`, which rejects a keyword of neither kind."""

from __future__ import annotations

import dataclasses
import inspect
import numbers
from collections.abc import Mapping
from typing import Any

from ..inference.objective._lower import lower
from ._config import get

DEFAULT_NAME = "study"
# The keywords of ds.lower: run() passes them on.
LOWER_OPTIONS = tuple(n for n, p in inspect.signature(lower).parameters.items() if p.kind is p.KEYWORD_ONLY)


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
