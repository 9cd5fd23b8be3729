"""The multi-process JAX execution of ``ds.distributed.run`` (after ``ds.distributed.initialize``
with several processes): each process holds one shard; process 0 runs the block and sends each
evaluation through the JAX coordinator's key-value store (:class:`ProcessBackend`), the others
serve their shard (:func:`_serve`) until process 0 leaves the block (:func:`run_processes`)."""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..inference.objective._lower import LoweredStudy, lower
from ..inference.objective._parts import AbstractPart
from ..inference.study._study import Study
from ._distributed_study import DistributedStudy
from ._kv import KeyValueStore
from ._runtime import check_agree, process_count, process_index
from ._shards import serve_request, shard_lowering_options, shard_members, study_fingerprint

_RUN_COUNTER = [0]
_WAIT_MS = 3_600_000


class ProcessBackend:
    """Process 0's side of a multi-process run: send (mode, theta) through the coordinator's
    key-value store, serve its own shard, collect the other processes' parts."""

    def __init__(self, prefix: str, shard: LoweredStudy, members: list[list[int]]):
        self.kv = KeyValueStore()
        self.prefix, self.shard, self.members = prefix, shard, members
        self.n = 0

    def __call__(self, mode: str, argument: Any) -> list[AbstractPart | None]:
        n, self.n = self.n, self.n + 1
        self.kv.set(f"{self.prefix}/cmd/{n}", pickle.dumps((mode, argument)))
        if mode != "compile":
            check_agree(np.asarray(argument, dtype=np.float64), f"the parameters of evaluation {n}")
        parts = [serve_request(self.shard, mode, argument)]
        for p in range(1, len(self.members)):
            key = f"{self.prefix}/out/{n}/{p}"
            blob = self.kv.get(key, _WAIT_MS)
            self.kv.delete(key)
            result = pickle.loads(blob)
            if isinstance(result, BaseException):
                raise RuntimeError(f"process {p} failed to evaluate {mode}") from result
            parts.append(result)
        return parts

    def stop(self) -> None:
        self.kv.set(f"{self.prefix}/cmd/{self.n}", pickle.dumps(("stop", None)))


def _serve(prefix: str, shard: LoweredStudy, me: int) -> None:
    """Processes above 0: serve this process's shard for every command until 'stop'."""
    kv = KeyValueStore()
    n = 0
    while True:
        mode, argument = pickle.loads(kv.get(f"{prefix}/cmd/{n}", _WAIT_MS))
        if mode == "stop":
            return
        if mode != "compile":
            check_agree(np.asarray(argument, dtype=np.float64), f"the parameters of evaluation {n}")
        try:
            result: Any = serve_request(shard, mode, argument)
        except Exception as exc:  # noqa: BLE001 (process 0 raises it)
            result = RuntimeError(f"{type(exc).__name__}: {exc}")
        kv.set(f"{prefix}/out/{n}/{me}", pickle.dumps(result))
        n += 1


@contextlib.contextmanager
def run_processes(study: Study, options: dict) -> Iterator[DistributedStudy]:
    nproc, me = process_count(), process_index()
    counter = _RUN_COUNTER[0]
    _RUN_COUNTER[0] += 1
    fp = study_fingerprint(study, options)
    prefix = f"diffsoup/run/{counter}/{fp}"
    members = shard_members(study, nproc)
    if len(members) < nproc:
        raise ValueError(f"ds.distributed.run: {len(study.experiments)} experiments (owners) cannot give each of "
                         f"the {nproc} processes a shard; use fewer processes.")  # fmt: skip
    base = lower(study, **shard_lowering_options(options))
    shard = base.restrict(members[me])
    if me != 0:
        _serve(prefix, shard, me)
        raise SystemExit(0)
    backend = ProcessBackend(prefix, shard, members)
    try:
        yield DistributedStudy(base, backend, members, fp)
    finally:
        backend.stop()
