"""``ds.distributed.run``: a study lowered over the workers of a Dask cluster (or the processes of
a multi-process JAX run), used as ``with ds.distributed.run(study) as lowered:``.

The options of ``run`` are of two kinds, kept apart: *execution* options (:class:`RunOptions`:
cluster, resources, name, n_workers, retries, worker_timeout; a field left None reads the
``diffsoup`` Dask configuration, ``run.*`` in ``diffsoup.yaml``) and *lowering* options (what
``ds.lower`` takes). An unknown keyword raises at once, naming both lists.

The run goes through the public seam of a lowered study and nothing else: each shard of the
experiments is ``lower(study, ...).restrict(shard)``; it returns typed parts
(``shard.evaluate(mode, theta)``), and the :class:`DistributedStudy` the block receives combines them
(``combine_parts``) and finishes them as a local ``LoweredStudy`` does -- both implement
``AbstractLoweredStudy``, which is what ``ds.inference.fit`` takes.

Dask execution: the study's experiments are split into one shard per worker lane (the workers
offering ``resources``, ``{"GPU": 1}`` by default) with ``balance_owners`` (owners -- the members
of the outermost level, or the experiments -- stay together; weights are measured values). The
study and the lowering options are scattered once to every worker. Each evaluation is a small graph
of Dask tasks, one per shard, keyed ``diffsoup-<mode>-<name>-shard<k>-<hex>``, asking for
``resources`` and pinned to the worker holding the shard (a loose restriction: when that worker is
gone the task runs on another one, which compiles the shard anew). A worker keeps its shard -- a
``LoweredStudy`` restricted to the shard's experiments, programs compiled on first use -- in
the process's cache of lowered studies (:mod:`._lowered_cache`), keyed by the study's fingerprint and
the shard's experiments, so a task carries parameters in and a part out. The client combines the parts in a fixed shard order. A failed evaluation (a worker
lost twice under it, lost scattered data) is retried whole, up to ``retries`` times.

Multi-process JAX execution (after ``ds.distributed.initialize`` with several processes): each
process holds one shard; process 0 runs the block, sending each evaluation's mode and parameters
through the JAX coordinator's key-value store (:class:`~diffsoup.distributed._kv.KeyValueStore`),
and the other processes evaluate their shard and send its part back until process 0 leaves the
block, then raise ``SystemExit(0)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..inference.study._study import Study
from ._dask_backend import DaskBackend as DaskBackend
from ._dask_backend import ShardReply as ShardReply
from ._dask_backend import run_dask
from ._distributed_study import DEFAULT_COMPILE_MODES as DEFAULT_COMPILE_MODES
from ._distributed_study import Backend as Backend
from ._distributed_study import DistributedStudy as DistributedStudy
from ._process_backend import ProcessBackend as ProcessBackend
from ._process_backend import run_processes
from ._run_options import DEFAULT_NAME as DEFAULT_NAME
from ._run_options import LOWER_OPTIONS as LOWER_OPTIONS
from ._run_options import RUN_OPTIONS as RUN_OPTIONS
from ._run_options import RunOptions as RunOptions
from ._run_options import split_options
from ._runtime import is_initialized, process_count
from ._shards import build_shard as build_shard
from ._shards import serve_request as serve_request
from ._shards import shard_key as shard_key
from ._shards import shard_lowering_options as shard_lowering_options
from ._shards import shard_members as shard_members
from ._shards import study_fingerprint as study_fingerprint


@contextlib.contextmanager
def run(study: Any, **options: Any) -> Iterator[Any]:
    """Lower a study over the processes of a run, and close it when the block ends.

    Use it as ``with ds.distributed.run(study) as lowered:``. The lowered study (a
    :class:`DistributedStudy`, an ``AbstractLoweredStudy`` like ``ds.lower``'s) evaluates shard by
    shard on the Dask workers -- or, in a multi-process JAX run, on the processes -- and
    ``ds.inference.fit`` takes it as it is. In a run of several processes, process 0 runs the block
    and the others evaluate their experiments until it ends, so write results inside the block.

    Args:
        study: the ``ds.Study`` to lower.
        **options: passed to ``ds.lower`` (``objective=``, ``layout=``, ``hessian=``, ...), except
            these execution options (Dask runs; the fields of :class:`RunOptions`, also accepted
            together as ``execution=RunOptions(...)``). Left None, they read the ``diffsoup`` Dask
            configuration (``diffsoup.run.*``):

            - ``cluster``: None (the active Dask client, else an embedded LocalCluster on
              127.0.0.1: one worker per visible GPU, or ``n_workers`` CPU workers carrying the
              resources), a ``distributed.Client``, a scheduler address, or a cluster object
              (LocalCluster, a dask-jobqueue cluster, ...).
            - ``resources``: what each shard's task asks of a worker (default ``{"GPU": 1}``);
              the shards are spread over the workers that offer it.
            - ``name``: letters and underscores naming the tasks and span (default ``"study"``).
            - ``n_workers``: workers of the embedded CPU cluster (default 2).
            - ``retries``: whole-evaluation retries after a failure (default 2).
            - ``worker_timeout``: seconds to wait for a worker offering ``resources`` (default 60).

    Yields:
        The lowered study. Its ``dashboard`` attribute (Dask runs) is the scheduler's HTTP address;
        ``<dashboard>/diffsoup/studies.json`` shows per-experiment states.

    Raises:
        TypeError: if ``study`` is not a Study, or for a keyword that is neither an execution nor a
            lowering option.
        ValueError: if ``layout=`` is a ``Layout(processes=N)`` and the run has another number of
            processes, or for execution options in a multi-process JAX run.
        SystemExit: with status 0, on every process above 0 once process 0 leaves the block.
    """
    if not isinstance(study, Study):
        raise TypeError(f"ds.distributed.run: study must be a ds.Study, not {type(study).__name__}.")
    execution, lowering = split_options(options)
    layout = lowering.get("layout")
    nproc = process_count()
    if layout is not None and getattr(layout, "processes", None) is not None and layout.processes != nproc:
        raise ValueError(
            f"ds.distributed.run: layout=Layout(processes={layout.processes}) but this run has {nproc} "
            f"process{'es' if nproc != 1 else ''}; start it with python -m diffsoup.distributed.launch -n "
            f"{layout.processes} (or srun/mpirun with as many tasks), or set processes=None."
        )
    if is_initialized() and nproc > 1:
        if execution.given():
            raise ValueError(f"ds.distributed.run: {sorted(execution.given())} apply to Dask runs, not to a "
                             "multi-process JAX run.")  # fmt: skip
        with run_processes(study, lowering) as lowered:
            yield lowered
        return
    with run_dask(study, lowering, execution.resolved()) as lowered:
        yield lowered
