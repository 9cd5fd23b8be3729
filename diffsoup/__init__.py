"""diffsoup: differentiable stiff ODE simulation and fitting in JAX.

Import it as ``import diffsoup as ds``. Importing it never changes JAX's global settings; it
loads JAX and the numerical core (models, linear solvers, integrators) and nothing else: the
inference layer (``ds.Study``, ``ds.lower``, ``ds.inference``), scipy, fides, Dask, zarr, sympy and
the GPU binding load when first used.
"""

from ._settings import configure as _configure

_configure()  # XLA flags, allocator: only what is unset (imports no JAX, no Dask)
from ._compilation_cache import enable_compilation_cache as enable_compilation_cache
from ._precision import Precision as Precision
from ._layout import Layout as Layout
from ._layout import global_mesh as global_mesh
from ._layout import mesh_groups as mesh_groups
from .model import ProblemSpec as ProblemSpec
from .model import Problem as Problem
from .model import ReactionNetwork as ReactionNetwork
from .model import SparsityPattern as SparsityPattern
from .integrate import simulate as simulate
from .integrate import Solution as Solution
from .integrate import Status as Status
from .integrate import SolveError as SolveError
from .integrate import Rodas5P as Rodas5P
from .integrate import BDF as BDF
from .integrate import AutoMethod as AutoMethod
from .integrate import PIController as PIController
from .integrate import ConstantStep as ConstantStep
from .integrate import ForwardMode as ForwardMode
from .integrate import CheckpointAdjoint as CheckpointAdjoint
from .integrate import Reset as Reset
from . import linear as linear

__version__ = "0.1.0"

from typing import TYPE_CHECKING

from ._lazy import lazy_attributes

if TYPE_CHECKING:  # for type checkers, IDEs and the API reference; at run time they load lazily
    from .inference import Experiment as Experiment
    from .inference import Study as Study
    from .inference import lower as lower

# The inference layer's names and the subpackages of the higher layers (and the heavier
# dependencies they bring: scipy, fides, sympy, Dask, zarr) load on first access.
__getattr__, __dir__ = lazy_attributes(
    __name__,
    {
        "Experiment": "diffsoup.inference",
        "Study": "diffsoup.inference",
        "lower": "diffsoup.inference",
    },
    submodules=("inference", "formats", "petab", "store", "distributed", "examples", "plots", "workflows", "cli"),
)
