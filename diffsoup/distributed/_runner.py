"""The interface of a campaign's runners: how the tasks of a :class:`CampaignPlan` run.

``checkpointed_map`` checks its arguments, makes the plan, and hands it to the runner its
``execution=`` names: :class:`~diffsoup.distributed._serial_campaign.SerialRunner` (here, one after
another), :class:`~diffsoup.distributed._dask_campaign.DaskRunner` (Dask tasks on workers carrying
resources) or :class:`~diffsoup.distributed._process_campaign.ProcessRunner` (device groups of a
multi-process JAX run). Each opens the ledger through
:func:`~diffsoup.distributed._campaign_ledger.open_campaign` (only one process writes it) and
applies every start and outcome to it as it learns them.
"""

from __future__ import annotations

import abc
from typing import ClassVar

from ._campaign_ledger import CampaignPlan
from ._tasks import CampaignResult


class CampaignRunner(abc.ABC):
    """Runs the tasks of a campaign, recording each start and outcome in its ledger."""

    execution: ClassVar[str]
    """The ``execution=`` of ``checkpointed_map`` that picks this runner."""

    @abc.abstractmethod
    def run(self, plan: CampaignPlan) -> CampaignResult:
        """Run the plan's tasks that its ledger has not accepted yet; the result of every task.

        Raises:
            diffsoup.store.LedgerError, diffsoup.store.LedgerConflictError,
            diffsoup.store.LedgerLockedError: when the ledger cannot be opened for the plan.
        """
