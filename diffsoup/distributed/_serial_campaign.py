"""``checkpointed_map(execution="serial")``: the tasks run here, one after another."""

from __future__ import annotations

import os
import socket
from typing import ClassVar, final

from ..store._ledger import now_iso
from ._campaign_ledger import CampaignPlan, open_campaign
from ._runner import CampaignRunner
from ._tasks import CampaignResult, run_task


@final
class SerialRunner(CampaignRunner):
    """Run each task in this process; the ledger shows a task as running before it starts, so a
    kill mid-task leaves it visibly interrupted (and a rerun runs it again)."""

    execution: ClassVar[str] = "serial"

    def run(self, plan: CampaignPlan) -> CampaignResult:
        worker = f"{socket.gethostname()} pid {os.getpid()}"
        with open_campaign(plan) as campaign:
            for task_id in campaign.to_run:
                campaign.mark_running(task_id, started=now_iso(), worker=worker)
                campaign.save()
                campaign.finish(task_id, run_task(plan.fn, plan.items[task_id], task_id))
                campaign.save_and_show()
            return campaign.result()
