"""What the ``diffsoup`` command and the job scripts run on a study file (or a PEtab v1 problem's
YAML file, read by ``ds.petab.load``): a fit (the study lowered
over a Dask cluster's workers with ``ds.distributed.run``), a campaign of fit starts (one
``checkpointed_map`` task per start, resumable from its JSON ledger), and a simulation; each writes
a Zarr store, a JSON summary and PNG plots into an output directory (and, for a PEtab problem, the
PEtab simulation table ``simulation.tsv``); profile likelihoods of a fit (``profile_study``: one
campaign task per parameter, intervals as TSV and JSON); and a study simulated at many parameter draws
(``simulate_samples``: an ensemble streamed into Zarr, resumable)."""

from ._ensemble_runs import simulate_samples as simulate_samples
from ._study_campaign import campaign_study as campaign_study
from ._study_campaign import check_campaign as check_campaign
from ._study_profiles import profile_study as profile_study
from ._study_runs import StudyFailedError as StudyFailedError
from ._study_runs import fit_study as fit_study
from ._study_runs import simulate_study as simulate_study
from ._study_runs import study_digest as study_digest
