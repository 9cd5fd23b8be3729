"""Experiments, studies, objectives, fitting, multiple shooting, and campaigns of independent fits.

Some documented names of this package are defined in higher layers and re-exported here lazily
(:mod:`diffsoup._lazy`), so importing this package imports none of them: ``checkpointed_map``,
``world`` and the campaign drivers ``profile`` (profile likelihoods, one task per parameter) and
``multistart`` (one task per start) live in :mod:`diffsoup.distributed` beside the other
execution code (Dask), and
``load_study``, ``StudyFile``, ``StudyFileError`` in :mod:`diffsoup.formats`.
"""

from ._abstract_lowered import AbstractLoweredStudy as AbstractLoweredStudy
from ._balance import balance_owners as balance_owners
from ._batched_fit import Optimum as Optimum
from ._batched_trust_region import BatchedTrustRegion as BatchedTrustRegion
from ._batched_trust_region import LaneStatus as LaneStatus
from ._experiment import Experiment as Experiment
from ._fides import Fides as Fides
from ._noise import AbstractNoise as AbstractNoise
from ._noise import Gaussian as Gaussian
from ._noise import Laplace as Laplace
from ._noise import LogLaplace as LogLaplace
from ._noise import LogNormal as LogNormal
from ._preequilibration import Preequilibration as Preequilibration
from ._fit import FitResult as FitResult
from ._fit import StartResult as StartResult
from ._fit import fit as fit
from ._lower import LoweredStudy as LoweredStudy
from ._lower import default_block_limit as default_block_limit
from ._lower import lower as lower
from ._multishoot import Multishoot as Multishoot
from ._optimizers import LBFGSB as LBFGSB
from ._optimizers import TRF as TRF
from ._optimizers import AbstractOptimizer as AbstractOptimizer
from ._parameter_table import parameter_table as parameter_table
from ._parameter_table import write_parameter_table as write_parameter_table
from ._parts import AbstractPart as AbstractPart
from ._parts import GaussNewtonPart as GaussNewtonPart
from ._parts import GradientPart as GradientPart
from ._parts import HessianPart as HessianPart
from ._parts import JacobianPart as JacobianPart
from ._parts import ResidualsPart as ResidualsPart
from ._parts import ValuePart as ValuePart
from ._parts import combine_parts as combine_parts
from ._problem import InferenceProblem as InferenceProblem
from ._samplers import ParameterBox as ParameterBox
from ._samplers import SobolIndices as SobolIndices
from ._samplers import latin_hypercube as latin_hypercube
from ._samplers import sobol as sobol
from ._profile_likelihood import ParameterProfile as ParameterProfile
from ._profile_likelihood import ProfileOptions as ProfileOptions
from ._profile_likelihood import ProfileResult as ProfileResult
from ._profile_likelihood import profile_parameter as profile_parameter
from ._pypesto import pypesto_objective as pypesto_objective
from ._pypesto import pypesto_problem as pypesto_problem
from ._solver_options import SolverOptions as SolverOptions
from ._study import Parameter as Parameter
from ._study import Study as Study
from ._window_cache import MemoryWindowCache as MemoryWindowCache
from ._window_cache import WindowCache as WindowCache
from ._window_cache import WindowEntry as WindowEntry
from ._windows import prepare_windows as prepare_windows
from ._windows import reset_window_solves as reset_window_solves
from ._windows import window_solves as window_solves

from .._lazy import lazy_attributes

# name -> the module that defines it, loaded on first attribute access.
__getattr__, __dir__ = lazy_attributes(
    __name__,
    {
        "checkpointed_map": "diffsoup.distributed",
        "CampaignResult": "diffsoup.distributed",
        "world": "diffsoup.distributed",
        "World": "diffsoup.distributed",
        "profile": "diffsoup.distributed._profile_runs",
        "multistart": "diffsoup.distributed._start_runs",
        "load_study": "diffsoup.formats",
        "StudyFile": "diffsoup.formats",
        "StudyFileError": "diffsoup.formats",
    },
)
