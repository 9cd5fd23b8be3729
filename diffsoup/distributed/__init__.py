"""Execution across processes and machines: campaigns (``checkpointed_map``) and ``world``.

Importing this package does not import Dask: the modules below import it inside the functions
that run on a cluster.
"""

from ._campaign import DEFAULT_NO_WORKER_TIMEOUT as DEFAULT_NO_WORKER_TIMEOUT
from ._campaign import CampaignResult as CampaignResult
from ._campaign import TaskRecord as TaskRecord
from ._campaign import checkpointed_map as checkpointed_map
from ._world import World as World
from ._world import world as world
