"""File formats that describe studies and models: study files (TOML, formats ``diffsoup-study/1``
and ``/2``, with CSV data files) read into a ``ds.Study``, SBML models read into a
``ds.ProblemSpec`` (``load_sbml``), and PEtab v1 problems (``load_petab``, public as
``ds.petab.load``). ``load_study``, ``StudyFile`` and
``StudyFileError`` keep their documented home ``ds.inference`` too (re-exported there lazily).

This layer sits above the numerical one (model, inference) and imports no Dask. The modules that
import sympy and libsbml load on first use (a cached SBML model needs neither).
"""

from ._reader import StudyFileError as StudyFileError
from ._sbml import EventExpressions as EventExpressions
from ._sbml import SBMLExpressions as SBMLExpressions
from ._sbml import SBMLModel as SBMLModel
from ._sbml import SpeciesInfo as SpeciesInfo
from ._sbml import TimedEvent as TimedEvent
from ._sbml import load_sbml as load_sbml
from ._sbml_error import SBMLError as SBMLError
from ._petab_simulation import write_simulation_table as write_simulation_table
from ._petab_study import PetabProblem as PetabProblem
from ._petab_study import load as load_petab
from ._petab_errors import PetabError as PetabError
from ._petab_errors import PetabWarning as PetabWarning
from ._study_file import FORMAT as FORMAT
from ._study_file import StudyFile as StudyFile
from ._study_file import load_study as load_study

from .._lazy import lazy_attributes  # noqa: E402

# name -> module that defines it: these import sympy/libsbml, so they load on first access.
__getattr__, __dir__ = lazy_attributes(
    __name__,
    {
        "jax_function": "diffsoup.formats._sympy_jax",
        "Argument": "diffsoup.formats._sympy_jax",
        "JaxPrinter": "diffsoup.formats._sympy_jax",
        "TIME": "diffsoup.formats._sbml_math",
    },
)
