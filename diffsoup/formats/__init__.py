"""File formats that describe studies and models: study files (TOML, format ``diffsoup-study/1``,
with CSV data files) read into a ``ds.Study``, and SBML models read into a ``ds.ProblemSpec`` with
everything a PEtab loader needs (``load_sbml``). ``load_study``, ``StudyFile`` and
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
