"""The client's side of a distributed lowered study: :class:`DistributedStudy`, an
``AbstractLoweredStudy`` whose evaluations a backend (Dask tasks or the processes of a run) sends
shard by shard, and whose parts it combines (``combine_parts``) and finishes as a local
``LoweredStudy`` does."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..inference.objective._abstract_lowered import AbstractLoweredStudy
from ..inference.objective._lower import LoweredStudy
from ..inference.objective._parts import AbstractPart, combine_parts

DEFAULT_COMPILE_MODES = ("value", "value_and_grad", "jacobian")

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
