"""Experiments, studies, objectives, fitting, multiple shooting, and campaigns of independent fits.

The study model, multiple shooting and the objective (``Study``, ``lower``, ...) load with this
package. Other documented names load on first use (:mod:`diffsoup._lazy`), so importing this
package imports none of them: the fitting room's (``fit``, ``Fides``, ``TRF``, ``LBFGSB``, the
samplers, ``profile_parameter``, the pyPESTO bridge: they bring scipy's optimizers, fides and
pyPESTO when they run); and names of higher layers: ``checkpointed_map``, ``world`` and the
campaign drivers ``profile`` (profile likelihoods, one task per parameter) and ``multistart`` (one
task per start) live in :mod:`diffsoup.distributed` beside the other execution code (Dask), and
``load_study``, ``StudyFile``, ``StudyFileError`` in :mod:`diffsoup.formats`.
"""

from typing import TYPE_CHECKING

from .objective._abstract_lowered import AbstractLoweredStudy as AbstractLoweredStudy
from .objective._balance import balance_owners as balance_owners
from .study._experiment import Experiment as Experiment
from .study._noise import AbstractNoise as AbstractNoise
from .study._noise import Gaussian as Gaussian
from .study._noise import Laplace as Laplace
from .study._noise import LogLaplace as LogLaplace
from .study._noise import LogNormal as LogNormal
from .study._preequilibration import Preequilibration as Preequilibration
from .objective._lower import LoweredStudy as LoweredStudy
from .objective._lower import default_block_limit as default_block_limit
from .objective._lower import lower as lower
from .study._multishoot import Multishoot as Multishoot
from .study._parameter_table import parameter_table as parameter_table
from .study._parameter_table import write_parameter_table as write_parameter_table
from .objective._same_functions import ProgramGroupsWarning as ProgramGroupsWarning
from .objective._parts import AbstractPart as AbstractPart
from .objective._parts import GaussNewtonPart as GaussNewtonPart
from .objective._parts import GradientPart as GradientPart
from .objective._parts import HessianPart as HessianPart
from .objective._parts import JacobianPart as JacobianPart
from .objective._parts import ResidualsPart as ResidualsPart
from .objective._parts import ValuePart as ValuePart
from .objective._parts import combine_parts as combine_parts
from .objective._problem import InferenceProblem as InferenceProblem
from .study._solver_options import SolverOptions as SolverOptions
from .study._study import Parameter as Parameter
from .study._study import Study as Study
from .shooting._window_cache import MemoryWindowCache as MemoryWindowCache
from .shooting._window_cache import WindowCache as WindowCache
from .shooting._window_cache import WindowEntry as WindowEntry
from .shooting._windows import prepare_windows as prepare_windows
from .shooting._windows import reset_window_solves as reset_window_solves
from .shooting._windows import window_solves as window_solves

from .._lazy import lazy_attributes

# The same names for type checkers, IDEs and the API reference (never run: they load lazily).
if TYPE_CHECKING:
    from .fitting._fit import fit as fit
    from .fitting._batched_trust_region import BatchedTrustRegion as BatchedTrustRegion
    from .fitting._batched_trust_region import LaneStatus as LaneStatus
    from .fitting._batched_fit import Optimum as Optimum
    from .fitting._results import FitResult as FitResult
    from .fitting._results import StartResult as StartResult
    from .fitting._optimizers import AbstractOptimizer as AbstractOptimizer
    from .fitting._optimizers import TRF as TRF
    from .fitting._optimizers import LBFGSB as LBFGSB
    from .fitting._fides import Fides as Fides
    from .fitting._samplers import ParameterBox as ParameterBox
    from .fitting._samplers import SobolIndices as SobolIndices
    from .fitting._samplers import latin_hypercube as latin_hypercube
    from .fitting._samplers import sobol as sobol
    from .fitting._profile_likelihood import ParameterProfile as ParameterProfile
    from .fitting._profile_likelihood import ProfileOptions as ProfileOptions
    from .fitting._profile_likelihood import ProfileResult as ProfileResult
    from .fitting._profile_likelihood import profile_parameter as profile_parameter
    from .fitting._pypesto import pypesto_objective as pypesto_objective
    from .fitting._pypesto import pypesto_problem as pypesto_problem


# name -> the module that defines it, loaded on first attribute access. The fitting room (its
# optimizers bring scipy.optimize, fides and pyPESTO when they run) loads on first use, so that
# ``import diffsoup`` and ``ds.inference`` stay light; the higher layers' names come after it.
__getattr__, __dir__ = lazy_attributes(
    __name__,
    {
        "fit": "diffsoup.inference.fitting._fit",
        "BatchedTrustRegion": "diffsoup.inference.fitting._batched_trust_region",
        "LaneStatus": "diffsoup.inference.fitting._batched_trust_region",
        "Optimum": "diffsoup.inference.fitting._batched_fit",
        "FitResult": "diffsoup.inference.fitting._results",
        "StartResult": "diffsoup.inference.fitting._results",
        "AbstractOptimizer": "diffsoup.inference.fitting._optimizers",
        "TRF": "diffsoup.inference.fitting._optimizers",
        "LBFGSB": "diffsoup.inference.fitting._optimizers",
        "Fides": "diffsoup.inference.fitting._fides",
        "ParameterBox": "diffsoup.inference.fitting._samplers",
        "SobolIndices": "diffsoup.inference.fitting._samplers",
        "latin_hypercube": "diffsoup.inference.fitting._samplers",
        "sobol": "diffsoup.inference.fitting._samplers",
        "ParameterProfile": "diffsoup.inference.fitting._profile_likelihood",
        "ProfileOptions": "diffsoup.inference.fitting._profile_likelihood",
        "ProfileResult": "diffsoup.inference.fitting._profile_likelihood",
        "profile_parameter": "diffsoup.inference.fitting._profile_likelihood",
        "pypesto_objective": "diffsoup.inference.fitting._pypesto",
        "pypesto_problem": "diffsoup.inference.fitting._pypesto",
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
    submodules=("fitting",),
)
