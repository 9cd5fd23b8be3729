"""Experiments, studies, objectives, fitting, and campaigns of independent fits.

``checkpointed_map`` and ``world`` live in :mod:`diffsoup.distributed` beside the other execution
code and keep their documented home here by re-export. They load on first access, so importing
this package imports neither Dask nor the execution layer.
"""

from ._balance import balance_owners as balance_owners
from ._experiment import Experiment as Experiment
from ._experiment import Gaussian as Gaussian
from ._experiment import LogNormal as LogNormal
from ._fit import FitResult as FitResult
from ._fit import StartResult as StartResult
from ._fit import fit as fit
from ._lower import LoweredStudy as LoweredStudy
from ._lower import default_block_limit as default_block_limit
from ._lower import lower as lower
from ._multishoot import Multishoot as Multishoot
from ._problem import InferenceProblem as InferenceProblem
from ._problem import SolverOptions as SolverOptions
from ._study import Parameter as Parameter
from ._study import Study as Study
from ._study_file import StudyFile as StudyFile
from ._study_file import StudyFileError as StudyFileError
from ._study_file import load_study as load_study
from ._windows import prepare_windows as prepare_windows
from ._windows import reset_window_solves as reset_window_solves
from ._windows import window_solves as window_solves

from .._lazy import lazy_attributes

# name -> module that defines it, loaded on first attribute access.
_LAZY = {
    "checkpointed_map": "diffsoup.distributed",
    "CampaignResult": "diffsoup.distributed",
    "world": "diffsoup.distributed",
    "World": "diffsoup.distributed",
}

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
