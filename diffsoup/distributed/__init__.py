"""Execution across processes and machines: ``run`` (a study over Dask workers or the processes of a
multi-process JAX run), the runtime (``initialize``, ``configure``, ``is_primary``, ``owns``,
``local_value``, ``from_local_data``, ``key``, ``any_process``), campaigns (``checkpointed_map``),
``world``, ensembles (``ensemble``: many simulations as a lazy Dask array, written to Zarr;
``sample``, ``saltelli`` and ``sobol_indices`` for the draws and global sensitivity), and the
clusters diffsoup starts (``embedded_cluster``, ``slurm_cluster`` from a SLURM profile
(``SlurmProfile``, ``read_slurm_profile``; ``read_profile`` is its deprecated name),
``cluster_client``, ``worker_threads``), and ``dashboard_line`` (where the Dask dashboard and
diffsoup's page on it are, for a script to print).

Execution settings (timeouts, resources, worker counts, SLURM profile defaults) live in the
``diffsoup`` namespace of Dask's configuration (``_config``, defaults in ``diffsoup.yaml``).

Importing this package does not import Dask: the modules below import it inside the functions
that run on a cluster (``_dask_backend`` imports it when ``run`` starts a Dask run).
"""

from ._campaign import DEFAULT_NO_WORKER_TIMEOUT as DEFAULT_NO_WORKER_TIMEOUT
from ._campaign import checkpointed_map as checkpointed_map
from ._clusters import ClusterConnectionError as ClusterConnectionError
from ._clusters import cluster_client as cluster_client
from ._clusters import embedded_cluster as embedded_cluster
from ._clusters import slurm_cluster as slurm_cluster
from ._clusters import worker_threads as worker_threads
from ._dashboard import dashboard_line as dashboard_line
from ._ensemble import Ensemble as Ensemble
from ._ensemble import EnsembleWrite as EnsembleWrite
from ._ensemble import ensemble as ensemble
from ._process_campaign import device_group as device_group
from ._run import DistributedStudy as DistributedStudy
from ._run import RunOptions as RunOptions
from ._run import run as run
from ._slurm_profile import SlurmProfile as SlurmProfile
from ._slurm_profile import read_profile as read_profile
from ._slurm_profile import read_slurm_profile as read_slurm_profile
from ._runtime import any_process as any_process
from ._runtime import configure as configure
from ._runtime import from_local_data as from_local_data
from ._runtime import initialize as initialize
from ._runtime import is_primary as is_primary
from ._runtime import key as key
from ._runtime import local_value as local_value
from ._runtime import owns as owns
from ._samplers import SaltelliDesign as SaltelliDesign
from ._samplers import sample as sample
from ._samplers import saltelli as saltelli
from ._samplers import sobol_indices as sobol_indices
from ._tasks import CampaignResult as CampaignResult
from ._tasks import TaskRecord as TaskRecord
from ._world import World as World
from ._world import world as world
