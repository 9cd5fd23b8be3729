"""Campaigns of independent tasks with a JSON ledger: ``checkpointed_map``.

A campaign maps a function over items (multistarts, profile points, per-experiment fits, sweep
points). Every change of a task's state is written to the ledger (see
:mod:`diffsoup.store._ledger`) by one process alone, so a campaign killed at any moment (an
allocation ending, SIGKILL, a lost node) resumes on rerun: accepted tasks are kept, failed and
interrupted ones run again.

The pieces, one per module: the task model (``_tasks``: :class:`TaskRecord`,
:class:`CampaignResult`, running one task), the ledger's bookkeeping (``_campaign_ledger``), and
one runner per ``execution=`` behind :class:`~diffsoup.distributed._runner.CampaignRunner`:
``"serial"`` (``_serial_campaign``), ``"dask"`` (``_dask_campaign``), ``"processes"``
(``_process_campaign``). Dask is imported only by the Dask runner, when it runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._campaign_ledger import CONFLICT_POLICIES, CampaignPlan
from ._config import default
from ._dask_campaign import DaskRunner, check_timeout
from ._process_campaign import ProcessRunner, check_device_groups
from ._runner import CampaignRunner
from ._serial_campaign import SerialRunner
from ._tasks import CampaignResult, fingerprint_items, index_items

if TYPE_CHECKING:  # pragma: no cover
    from distributed import Client

EXECUTIONS = ("serial", "dask", "processes")
DEFAULT_NO_WORKER_TIMEOUT: float = float(default("campaign.no-worker-timeout"))
"""Seconds a Dask task may wait in the scheduler's ``no-worker`` state before it is failed: the
shipped default of the setting ``diffsoup.campaign.no-worker-timeout`` (60), which
``no_worker_timeout=None`` reads (a Dask config file or ``dask.config.set`` may change it)."""


def checkpointed_map(
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    *,
    ledger_path: str | os.PathLike,
    resume: bool = True,
    execution: str = "serial",
    device_groups: Any = None,
    on_conflict: str = "error",
    client: Client | None = None,
    resources: Mapping[str, float] | None = None,
    no_worker_timeout: float | None = None,
    progress: bool = True,
) -> CampaignResult:
    """Map a function over independent tasks, recording each outcome in a JSON ledger so a rerun resumes.

    Each item carries a ``task_id`` that stays the same across restarts. A result is stored as
    JSON and comes back in that form. A task that raises is recorded as failed, and the others
    still run. The ledger is written whole, durably, after every change, by this process only;
    another process running a campaign on the same ledger is refused (an advisory lock on
    ``<ledger>.lock``, which the kernel releases when a process dies, even by SIGKILL).

    Args:
        fn: the task, a function of one item returning its result (JSON: numbers, strings, bools,
            None, lists, dicts with string keys; NumPy/JAX arrays become lists).
        items: the tasks, mappings or objects with a unique non-empty string ``task_id``. An item's
            fingerprint (:func:`diffsoup.store.fingerprint`) identifies it across restarts.
        ledger_path: the JSON file the ledger is written to; its directory is created if needed.
        resume: whether to read the ledger first, keep its accepted tasks, and run the failed and
            interrupted ones again. False runs everything anew; the old ledger is then kept beside
            the new one as ``<name>.<UTC time>.bak``.
        execution: ``"serial"`` to run the tasks here one after another; ``"dask"`` to run each
            as a Dask task on a worker carrying ``resources``; ``"processes"`` to run each task on
            one device group of a multi-process JAX run (``ds.distributed.initialize``), on the
            processes that own the group, with the ledger written by process 0 (every process
            calls ``checkpointed_map`` with the same items and gets the same result; in a single
            process it runs the tasks here, one group after another).
        device_groups: for ``"processes"``: disjoint JAX submeshes (``ds.mesh_groups``), or None
            for each device its own group. Task ``i`` of those to run goes to group
            ``i % len(groups)``; while it runs, :func:`device_group` returns its mesh and a
            one-device group is JAX's default device. Must be None for other executions.
        on_conflict: ``"error"`` to refuse a ledger that recorded a ``task_id`` for a different
            item, or ``"restart"`` to rerun only the tasks whose items changed (their fingerprints
            differ) and the new ones: their old records are discarded, every other record is kept
            (accepted results stay accepted; records of tasks no longer among the items stay, as
            in any resume), and the previous ledger is kept beside it as a ``.bak``.
        client: for ``"dask"``: the Dask client to use. None takes the active client, or else
            starts the embedded default: a LocalCluster on 127.0.0.1 with one worker process per
            visible GPU (``CUDA_VISIBLE_DEVICES`` or ``nvidia-smi -L``), or, without GPUs, two CPU
            worker processes (a testing default; the setting ``diffsoup.cluster.n-workers``). Its
            workers carry exactly ``resources`` (with two threads: the resources keep one task
            per GPU at a time; one thread where ``resources`` is ``{}``), and it is closed when
            the campaign ends.
        resources: for ``"dask"``: the worker resources each task asks for; None reads the
            setting ``diffsoup.campaign.resources``, ``{"GPU": 1}`` unless configured, so tasks
            run only on GPU workers, one at a time per GPU. ``{}`` lets tasks run on any worker.
        no_worker_timeout: for ``"dask"``: seconds a task may wait in Dask's ``no-worker`` state,
            where no connected worker offers the resources it asks for, before it is failed with
            an error naming the request and the workers' resources. None reads the setting
            ``diffsoup.campaign.no-worker-timeout``: 60 s (:data:`DEFAULT_NO_WORKER_TIMEOUT`)
            unless a Dask config file, ``DASK_DIFFSOUP__CAMPAIGN__NO_WORKER_TIMEOUT`` or
            ``dask.config.set`` changes it. ``math.inf`` waits for ever (for clusters whose
            workers arrive from a batch queue). The check runs about once a second, so a task
            fails within this time plus about a second.
        progress: whether to show a progress bar on stderr (tqdm's when installed).

    Returns:
        ``CampaignResult(results, failures, records)``: ``results`` maps task_id to the accepted
        result in item order, ``failures`` maps task_id to the :class:`TaskRecord` of each failed
        task, and ``records`` holds one :class:`TaskRecord` per item in item order.

    Raises:
        ValueError: for an unknown ``execution`` or ``on_conflict``, an empty or duplicate
            ``task_id``, options that do not apply to the chosen execution, or a
            ``no_worker_timeout`` (given or configured) that is not a positive number.
        TypeError: for a non-callable ``fn``, an item without a string ``task_id``, or an item
            that cannot be fingerprinted stably.
        ValueError: for ``execution="processes"``: device groups that are not disjoint meshes.
        diffsoup.store.LedgerError: if the existing ledger cannot be read, is damaged, or does
            not match its checksum (a record edited by hand); the file is left untouched. Also
            when the ledger's directory cannot be written (one line naming it).
        diffsoup.store.LedgerConflictError: with ``on_conflict="error"``, if the ledger recorded
            a task_id for a different item; the message names the task.
        diffsoup.store.LedgerLockedError: if another process is running a campaign on this ledger.
    """
    if execution not in EXECUTIONS:
        raise ValueError(f"execution={execution!r} is not one of {EXECUTIONS}.")
    if device_groups is not None and execution != "processes":
        raise ValueError(f"device_groups applies to execution='processes', not execution={execution!r}.")
    if on_conflict not in CONFLICT_POLICIES:
        raise ValueError(f"on_conflict={on_conflict!r} is not one of {CONFLICT_POLICIES}.")
    if not isinstance(resume, bool):
        raise TypeError(f"resume must be True or False, not {resume!r}.")
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}.")
    if execution != "dask":
        for name, value in (("client", client), ("resources", resources)):
            if value is not None:
                raise ValueError(f"{name}= applies to execution='dask', not execution={execution!r}.")
    runner = _runner(execution, client, resources, no_worker_timeout, device_groups)
    by_id = index_items(items)
    plan = CampaignPlan(fn, by_id, fingerprint_items(by_id), Path(ledger_path), resume=resume,
                        on_conflict=on_conflict, progress=progress)  # fmt: skip
    return runner.run(plan)


def _runner(execution: str, client, resources, no_worker_timeout, device_groups) -> CampaignRunner:
    """The runner of ``execution``, its options checked (configured defaults read for Dask only)."""
    if execution == "dask":
        return DaskRunner(client, resources, no_worker_timeout)
    if no_worker_timeout is not None:
        check_timeout(no_worker_timeout)  # ignored here, but a bad value is still an error
    if execution == "processes":
        return ProcessRunner(check_device_groups(device_groups))
    return SerialRunner()
