"""``checkpointed_map(execution="processes")``: each task on one device group of a multi-process
JAX run, the ledger written by process 0.

Every process calls ``checkpointed_map`` with the same items. Process 0 alone opens, locks and
writes the ledger; it publishes the ids of the tasks to run through the coordinator's key-value
store (:class:`~diffsoup.distributed._kv.KeyValueStore`). Task ``i`` of those runs on device group
``i % len(groups)``, on every process owning a device of the group; the group's first process
sends the outcome to process 0, which records it. Process 0 then publishes the records, so every
process returns the same :class:`CampaignResult`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import json
import os
import socket
from collections.abc import Callable
from typing import Any, ClassVar, final

import jax
import numpy as np
from jax.sharding import Mesh

from ..store._ledger import LedgerError, now_iso
from ._campaign_ledger import CampaignLedger, CampaignPlan, open_campaign
from ._kv import KeyValueStore
from ._runner import CampaignRunner
from ._runtime import process_count, process_index
from ._tasks import CampaignResult, TaskOutcome, TaskRecord, run_task

_CURRENT_GROUP: contextvars.ContextVar = contextvars.ContextVar("diffsoup_device_group", default=None)
# Campaigns of one run, counted alike on every process: each gets its own keys in the store.
_CAMPAIGN_COUNTER = [0]
_NULL = b"null"  # published by process 0 in place of the plan or the records when it failed


def device_group():
    """The device group (a ``jax.sharding.Mesh``) of the task running now under
    ``checkpointed_map(..., execution="processes")``, or None outside such a task."""
    return _CURRENT_GROUP.get()


def check_device_groups(device_groups: Any) -> tuple:
    """The groups as a tuple of meshes: None gives each device (of every process) its own group.

    Raises:
        TypeError: for something other than meshes.
        ValueError: for no groups, or groups sharing a device.
    """
    if device_groups is None:
        return tuple(Mesh(np.asarray([d], dtype=object), ("data",)) for d in jax.devices())
    if isinstance(device_groups, Mesh):
        device_groups = (device_groups,)
    groups = tuple(device_groups)
    if not groups:
        raise ValueError("device_groups is empty; give meshes from ds.mesh_groups, or None for one device each.")
    seen: dict = {}
    for g, mesh in enumerate(groups):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"device_groups[{g}] is a {type(mesh).__name__}; give jax.sharding.Mesh objects "
                            "(ds.mesh_groups(mesh, sizes)).")  # fmt: skip
        for d in mesh.devices.flat:
            if d.id in seen:
                raise ValueError(f"device {d} is in device groups {seen[d.id]} and {g}; groups must be disjoint.")
            seen[d.id] = g
    return groups


def _owners(mesh) -> list[int]:
    """The processes owning a device of ``mesh``, lowest first."""
    return sorted({d.process_index for d in mesh.devices.flat})


def _run_in_group(fn: Callable, item: Any, task_id: str, mesh) -> TaskOutcome:
    token = _CURRENT_GROUP.set(mesh)
    try:
        devices = list(mesh.devices.flat)
        with contextlib.ExitStack() as stack:
            if len(devices) == 1:
                stack.enter_context(jax.default_device(devices[0]))
            return run_task(fn, item, task_id)
    finally:
        _CURRENT_GROUP.reset(token)


@final
class ProcessRunner(CampaignRunner):
    """Run each task on a device group of a multi-process JAX run (in one process: here, one
    group after another).

    Args:
        groups: the device groups, checked (:func:`check_device_groups`).
    """

    execution: ClassVar[str] = "processes"

    def __init__(self, groups: tuple):
        self.groups = groups

    def run(self, plan: CampaignPlan) -> CampaignResult:
        nproc, me = process_count(), process_index()
        kv = KeyValueStore() if nproc > 1 else None
        serial = _CAMPAIGN_COUNTER[0]
        _CAMPAIGN_COUNTER[0] += 1
        digest = hashlib.sha256(json.dumps([str(plan.ledger_path), sorted(plan.fingerprints.items())]).encode())
        prefix = f"diffsoup/campaign/{serial}/{digest.hexdigest()[:16]}"
        if me != 0:
            return self._follow(plan, kv, prefix, me)
        return self._lead(plan, kv, prefix)

    def _group_of(self, index: int):
        return self.groups[index % len(self.groups)]

    def _run_mine(self, plan: CampaignPlan, to_run: list[str], me: int, on_done: Callable[[str, TaskOutcome], None],
                  on_start: Callable[[str, str, str], None] | None = None):  # fmt: skip
        """Run the tasks whose group this process owns; the group's first process reports each
        (``on_start(task_id, started, worker)`` before it runs, ``on_done`` after)."""
        worker = f"{socket.gethostname()} pid {os.getpid()} process {me}"
        for i, task_id in enumerate(to_run):
            mesh = self._group_of(i)
            procs = _owners(mesh)
            if me not in procs:
                continue
            started = now_iso()
            if on_start is not None and me == procs[0]:
                on_start(task_id, started, worker)
            outcome = _run_in_group(plan.fn, plan.items[task_id], task_id, mesh)
            if me == procs[0]:
                on_done(task_id, dataclasses.replace(outcome, started=started, worker=worker))

    def _follow(self, plan: CampaignPlan, kv: KeyValueStore, prefix: str, me: int) -> CampaignResult:
        """Processes above 0: run this process's share of the plan process 0 publishes."""
        to_run = json.loads(kv.get(f"{prefix}/plan").decode())
        if to_run is None:
            raise LedgerError(f"process 0 could not open the ledger {plan.ledger_path}; see its error.")
        self._run_mine(plan, to_run, me, lambda task_id, outcome: kv.set(f"{prefix}/out/{task_id}",
                                                                          outcome.to_json().encode()))  # fmt: skip
        records = json.loads(kv.get(f"{prefix}/final").decode())
        if records is None:
            raise RuntimeError(f"process 0 failed during the campaign on {plan.ledger_path}; see its error.")
        return CampaignResult.from_records(TaskRecord.from_dict(r) for r in records)

    def _lead(self, plan: CampaignPlan, kv: KeyValueStore | None, prefix: str) -> CampaignResult:
        """Process 0: open the ledger, publish the plan, run its share, record every outcome."""
        published = False
        try:
            with open_campaign(plan) as campaign:
                to_run = campaign.to_run
                if kv is not None:
                    kv.set(f"{prefix}/plan", json.dumps(to_run).encode())
                published = True
                self._settle_all(plan, campaign, kv, prefix)
                result = campaign.result()
        except BaseException:
            # The others wait for the plan or the records: tell them this process failed.
            if kv is not None:
                kv.set(f"{prefix}/{'final' if published else 'plan'}", _NULL)
            raise
        if kv is not None:
            kv.set(f"{prefix}/final", json.dumps([dataclasses.asdict(r) for r in result.records]).encode())
        return result

    def _settle_all(self, plan: CampaignPlan, campaign: CampaignLedger, kv: KeyValueStore | None, prefix: str):
        to_run = campaign.to_run
        leader = {task_id: _owners(self._group_of(i))[0] for i, task_id in enumerate(to_run)}
        counted: set[str] = set()  # tasks whose attempt the ledger holds from before they ran

        def on_start(task_id: str, started: str, worker: str) -> None:
            # This process's own tasks are counted before they run, as in a serial campaign; the
            # others' when their outcome arrives.
            campaign.mark_running(task_id, started=started, worker=worker)
            campaign.save()
            counted.add(task_id)

        def settle(task_id: str, outcome: TaskOutcome) -> None:
            if task_id not in counted:
                campaign.mark_running(task_id, started=outcome.started, worker=outcome.worker)
            campaign.finish(task_id, outcome)
            campaign.save_and_show()

        def collect(block: bool) -> None:
            """Record the outcomes the other processes sent (all of them when ``block``)."""
            for task_id in to_run:
                if leader[task_id] == 0 or campaign.is_settled(task_id):
                    continue
                key = f"{prefix}/out/{task_id}"
                blob = kv.get(key) if block else kv.try_get(key)
                if blob is None:
                    continue
                kv.delete(key)
                settle(task_id, TaskOutcome.from_json(blob.decode()))

        def on_mine(task_id: str, outcome: TaskOutcome) -> None:
            settle(task_id, outcome)
            if kv is not None:
                collect(block=False)

        self._run_mine(plan, to_run, 0, on_mine, on_start)
        if kv is not None:
            collect(block=True)
