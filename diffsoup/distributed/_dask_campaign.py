"""``checkpointed_map(execution="dask")``: each task a Dask task on a worker carrying resources.

Each task is submitted as a Dask task restricted to workers that carry ``resources`` (``{"GPU":
1}`` by default, the setting ``diffsoup.campaign.resources``), so tasks land only on GPU workers,
one at a time per GPU. Workers report each start through a Dask event, so the ledger shows a task
as running, on which worker, and how many attempts it took when a worker died under it.

An attempt is counted before it runs: the worker announces the start, then waits until the client
has written the attempt to the ledger (durably) and acknowledged it through a Dask ``Event``; only
then does it call the task function. So the ledger's ``attempts`` is never below the number of
times a task ran, even when the client is killed while tasks run (a task whose start was not
acknowledged when the client died is cancelled by the scheduler and never calls the function).
While it waits, the worker announces the start again every few seconds (in case an announcement
was lost) and gives up as soon as Dask cancels the task (the client is gone). A task
that waits in Dask's ``no-worker`` state (no connected worker offers its resources) for
``no_worker_timeout`` seconds (``diffsoup.campaign.no-worker-timeout``, 60 by default) is failed
with an error naming the request and the workers' resources.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import queue
import time
import traceback as _traceback
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, final

from ..store._ledger import now_iso
from ._campaign_ledger import CampaignLedger, CampaignPlan, open_campaign
from ._clusters import embedded_cluster
from ._dashboard_publish import publish_campaign
from ._config import get
from ._runner import CampaignRunner
from ._tasks import CampaignResult, TaskOutcome, run_task

if TYPE_CHECKING:  # pragma: no cover
    from distributed import Client

logger = logging.getLogger("diffsoup.campaign")


def check_resources(resources: Any) -> dict[str, float]:
    """``resources`` as a dict of positive amounts by non-empty name.

    Raises:
        TypeError: for something other than a mapping.
        ValueError: for a bad name or amount, naming it.
    """
    if not isinstance(resources, Mapping):
        raise TypeError(f"resources must be a mapping such as {{'GPU': 1}}, not {resources!r}.")
    out = {}
    for name, amount in resources.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"resources has the name {name!r}; resource names are non-empty strings.")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not amount > 0:
            raise ValueError(f"resources[{name!r}] = {amount!r}; an amount is a positive number.")
        out[name] = amount
    return out


def check_timeout(seconds: Any, where: str = "no_worker_timeout") -> float:
    """``seconds`` as a positive float (``math.inf`` waits for ever).

    Raises:
        ValueError: for anything else, naming ``where``.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ValueError(
            f"{where}={seconds!r} must be a positive number of seconds (math.inf waits for ever; None reads "
            "the setting diffsoup.campaign.no-worker-timeout, 60 s unless configured)."
        )
    return float(seconds)


def _configured_number(value: Any) -> Any:
    """A configured number: Dask gives an environment variable's text as it is when it is not a
    Python literal (``DASK_DIFFSOUP__CAMPAIGN__NO_WORKER_TIMEOUT=inf``), YAML's ``.inf`` included."""
    if isinstance(value, str):
        try:
            return float(value.strip().removeprefix("."))
        except ValueError:
            return value
    return value


@final
@dataclasses.dataclass(frozen=True, init=False)
class DaskRunner(CampaignRunner):
    """Run each task as a Dask task on a worker carrying ``resources``.

    Args:
        client: the Dask client; None takes the active client, or else starts the embedded default
            cluster (:func:`diffsoup.distributed.embedded_cluster`), closed at the end.
        resources: what each task asks of a worker; None reads ``diffsoup.campaign.resources``.
        no_worker_timeout: seconds a task may wait in ``no-worker``; None reads
            ``diffsoup.campaign.no-worker-timeout``; ``math.inf`` waits for ever.

    Raises:
        TypeError, ValueError: for bad ``resources`` or ``no_worker_timeout`` (given or configured).
    """

    execution: ClassVar[str] = "dask"
    client: Any
    resources: Mapping[str, float]
    no_worker_timeout: float

    def __init__(self, client: Client | None = None, resources: Mapping[str, float] | None = None,
                 no_worker_timeout: float | None = None):  # fmt: skip
        if no_worker_timeout is None:
            where = "the setting diffsoup.campaign.no-worker-timeout"
            timeout = _configured_number(get("campaign.no-worker-timeout"))
        else:
            where, timeout = "no_worker_timeout", no_worker_timeout
        object.__setattr__(self, "client", client)
        object.__setattr__(self, "resources", check_resources(get("campaign.resources", resources)))
        object.__setattr__(self, "no_worker_timeout", check_timeout(timeout, where))

    def run(self, plan: CampaignPlan) -> CampaignResult:
        with open_campaign(plan) as campaign:
            if campaign.to_run:
                self._run(campaign, plan)
            return campaign.result()

    def _run(self, campaign: CampaignLedger, plan: CampaignPlan) -> None:
        from distributed import default_client

        client, cluster = self.client, None
        if client is None:
            try:
                client = default_client()
            except ValueError:
                cluster, client = embedded_cluster(self.resources)
                logger.info("started the embedded Dask cluster %s", cluster)
        publish_campaign(campaign, client)  # the dashboard page, through this campaign's client
        to_run = campaign.to_run
        events: queue.SimpleQueue = queue.SimpleQueue()
        topic = f"diffsoup-campaign-{uuid.uuid4().hex}"
        # Keys read "diffsoup-<task_id>-<8 hex digits>": unique on a shared scheduler and across
        # reruns, named by task on the dashboard's task stream, and grouped into one progress bar
        # per campaign (Dask's key_split drops the hex suffix and words holding digits).
        suffix = uuid.uuid4().hex[:8]
        try:
            # Subscribed before submitting: the scheduler handles a client's messages in order, so
            # no start event can be missed.
            client.subscribe_topic(topic, lambda event: events.put(("start", event[1])))
            from distributed.spans import span

            # One span per campaign on the dashboard, named by the task function.
            with span(f"diffsoup-campaign-{getattr(plan.fn, '__name__', 'task')}"):
                submitted = client.map(
                    _run_on_worker,
                    [plan.items[task_id] for task_id in to_run],
                    to_run,
                    key=[f"diffsoup-{task_id}-{suffix}" for task_id in to_run],
                    resources=dict(self.resources) or None,
                    pure=False,
                    fn=plan.fn,
                    topic=topic,
                )
            futures = {future.key: (task_id, future) for task_id, future in zip(to_run, submitted)}
            for future in submitted:
                future.add_done_callback(lambda f: events.put(("done", f)))
            _drive(campaign, client, futures, events, self.resources, self.no_worker_timeout, topic)
        finally:
            try:
                client.unsubscribe_topic(topic)
            except Exception:  # a closed client has nothing to unsubscribe
                pass
            if cluster is not None:
                client.close()
                cluster.close()


# Seconds between a waiting worker's checks whether its task was cancelled, and how many checks
# between announcements of its start (a lost announcement is sent again).
_ACK_POLL_SECONDS = 0.5
_ANNOUNCE_EVERY = 10


class CampaignClientGone(RuntimeError):
    """Raised on a worker, instead of running a task, when the campaign's client went away before
    it recorded the task's start (Dask cancelled the task)."""


def ack_event_name(topic: str, token: str) -> str:
    """The Dask ``Event`` the client sets once the attempt ``token`` is in the ledger."""
    return f"{topic}-ack-{token}"


def _await_ack(worker, topic: str, start: dict) -> None:
    """Announce the start of this attempt and wait until the client has recorded it.

    Raises:
        CampaignClientGone: if Dask cancels the task first (its client is gone).
    """
    from distributed import Event

    key = worker.get_current_task()
    event = Event(ack_event_name(topic, start["token"]))
    worker.log_event(topic, start)
    checks = 0
    while not event.wait(timeout=_ACK_POLL_SECONDS):
        task = worker.state.tasks.get(key)
        if task is None or task.state not in ("executing", "long-running"):
            raise CampaignClientGone(
                f"task {start['task_id']!r} was cancelled before the campaign's client recorded its start "
                "(the client is gone); it did not run, and a rerun of the campaign runs it."
            )
        checks += 1
        if checks % _ANNOUNCE_EVERY == 0:
            worker.log_event(topic, start)
    event.clear()  # the scheduler forgets an event that is clear and has no waiters


def _run_on_worker(item: Any, task_id: str, *, fn: Callable, topic: str) -> TaskOutcome:
    """The Dask task: announce the start to the client (one event per attempt), wait until the
    client has counted it in the ledger, then run."""
    from distributed import get_worker

    token = uuid.uuid4().hex
    started = now_iso()
    try:
        worker = get_worker()
    except ValueError:  # run outside a worker (e.g. a synchronous scheduler): no events
        worker = None
    address = getattr(worker, "address", None)
    if worker is not None:
        _await_ack(worker, topic, {"task_id": task_id, "token": token, "worker": address, "started": started})
    outcome = run_task(fn, item, task_id)
    return dataclasses.replace(outcome, token=token, worker=address, started=started)


def _drive(
    campaign: CampaignLedger,
    client: Client,
    futures: dict[str, tuple[str, Any]],
    events: queue.SimpleQueue,
    resources: Mapping[str, float],
    no_worker_timeout: float,
    topic: str,
) -> None:
    """Apply start events and finished futures to the ledger until every task has an outcome,
    acknowledging each start once the ledger holding it is written.

    Everything that arrives together goes into one ledger write, so a burst of short tasks does
    not cost one whole-file write each.
    """
    from distributed import Event

    outstanding = dict(futures)  # key -> (task_id, Future) of tasks without an outcome yet
    unsettled = {task_id for task_id, _ in futures.values()}
    tokens: dict[str, set[str]] = {task_id: set() for task_id in unsettled}
    bounded = math.isfinite(no_worker_timeout)
    poll = min(1.0, max(0.05, no_worker_timeout / 4)) if bounded else 1.0
    last_check = time.monotonic()
    waiting_since: dict[str, float] = {}
    try:
        while outstanding:
            try:
                batch = [events.get(timeout=poll)]
            except queue.Empty:
                batch = []
            while True:
                try:
                    batch.append(events.get_nowait())
                except queue.Empty:
                    break
            changed = False
            finished = []
            acks = []  # attempts to acknowledge once the ledger holds them
            for kind, payload in batch:
                if kind == "start":
                    task_id, token = payload["task_id"], payload["token"]
                    if task_id not in tokens:
                        continue
                    acks.append(token)
                    if token in tokens[task_id]:
                        continue  # announced again: recorded already, acknowledged again below
                    tokens[task_id].add(token)
                    if task_id in unsettled:
                        campaign.mark_running(task_id, started=payload["started"], worker=payload["worker"])
                    else:
                        campaign.count_attempt(task_id)
                    changed = True
                elif payload.key in outstanding:
                    finished.append(payload)
            if acks:
                # The starts first: their tasks wait, idle, until the ledger holds them.
                if changed:
                    campaign.save()
                    changed = False
                for token in acks:
                    Event(ack_event_name(topic, token), client=client).set()
            outcomes = _gather_outcomes(client, finished)
            for future in finished:
                task_id, _ = outstanding.pop(future.key)
                unsettled.discard(task_id)
                outcome = outcomes[future.key]
                if outcome.token is not None and outcome.token not in tokens[task_id]:
                    # Its start event is still on the way: count the attempt now.
                    tokens[task_id].add(outcome.token)
                    campaign.mark_running(task_id, started=outcome.started, worker=outcome.worker)
                campaign.finish(task_id, outcome)
                future.release()
                changed = True
            if bounded and outstanding and time.monotonic() - last_check >= poll:
                last_check = time.monotonic()
                for task_id in _fail_unrunnable(
                    campaign, client, outstanding, waiting_since, resources, no_worker_timeout
                ):
                    unsettled.discard(task_id)
                    changed = True
            if changed:
                campaign.save_and_show()
    finally:
        if outstanding:
            # Interrupted (KeyboardInterrupt, a lost scheduler): the ledger keeps these tasks as
            # pending or running, and a rerun starts them again.
            try:
                client.cancel([future for _, future in outstanding.values()])
            except Exception:
                pass


def _gather_outcomes(client: Client, finished: list) -> dict[str, TaskOutcome]:
    """The outcome of each settled future: what the task returned, or why it did not return."""
    outcomes: dict[str, TaskOutcome] = {}
    ok = [future for future in finished if future.status == "finished"]
    if ok:
        try:
            outcomes.update(zip((f.key for f in ok), client.gather(ok)))
        except Exception:
            # One of them was lost with its worker and failed on recomputation: one at a time.
            for future in ok:
                try:
                    outcomes[future.key] = future.result()
                except Exception:
                    pass
    for future in finished:
        if future.key not in outcomes:
            outcomes[future.key] = _failed_future_outcome(future)
    return outcomes


def _failed_future_outcome(future) -> TaskOutcome:
    """The outcome of a Dask task that did not return (killed its workers, erred, was cancelled)."""
    try:
        exc = future.exception()
        tb = future.traceback()
    except Exception as err:  # cancelled futures raise here
        exc, tb = err, None
    if exc is None:
        return TaskOutcome.failure(f"the Dask task {future.key} ended as {future.status!r}")
    return TaskOutcome.failure(
        f"{type(exc).__name__}: {exc}", "".join(_traceback.format_tb(tb)) if tb is not None else None
    )


def _keys_without_worker(keys: list[str], dask_scheduler=None) -> list[str]:
    """Run on the scheduler: which of ``keys`` wait in the ``no-worker`` state."""
    tasks = dask_scheduler.tasks
    return [key for key in keys if key in tasks and tasks[key].state == "no-worker"]


def _workers_resources(client: Client) -> str:
    """The connected workers and the resources each offers, for error messages."""
    try:
        workers = client.scheduler_info(n_workers=-1)["workers"]
    except Exception as exc:  # the message must not fail because the cluster is in trouble
        return f"unknown ({type(exc).__name__}: {exc})"
    if not workers:
        return "no workers are connected"
    return "; ".join(f"{address}: {info.get('resources') or {}}" for address, info in workers.items())


def _fail_unrunnable(
    campaign: CampaignLedger,
    client: Client,
    outstanding: dict[str, tuple[str, Any]],
    waiting_since: dict[str, float],
    resources: Mapping[str, float],
    timeout: float,
) -> list[str]:
    """Fail the tasks that sat in ``no-worker`` for ``timeout`` seconds; returns their task ids."""
    now = time.monotonic()
    stuck = set(client.run_on_scheduler(_keys_without_worker, list(outstanding)))
    for key in list(waiting_since):
        if key not in stuck:
            del waiting_since[key]  # a worker with the resources arrived
    for key in stuck:
        waiting_since.setdefault(key, now)
    expired = [key for key, since in waiting_since.items() if now - since >= timeout and key in outstanding]
    if not expired:
        return []
    offered = _workers_resources(client)
    failed = []
    for key in expired:
        task_id, future = outstanding.pop(key)
        waited = now - waiting_since.pop(key)
        future.cancel()
        error = (
            f"task {task_id!r} waited {waited:.1f} s (no_worker_timeout={timeout:g} s) in Dask's "
            f"'no-worker' state: it asks for resources {dict(resources)} and no worker offers them. "
            f"Workers' resources: {offered}. Start workers with matching resources (dask worker "
            "--resources \"GPU=1\"), pass resources= that your workers carry, or raise "
            "no_worker_timeout (math.inf waits for ever; the setting diffsoup.campaign.no-worker-timeout "
            "changes the default)."
        )
        campaign.finish(task_id, TaskOutcome.failure(error))
        failed.append(task_id)
    return failed
