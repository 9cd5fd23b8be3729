"""File formats that describe studies, read into a ``ds.Study``: study files (TOML, format
``diffsoup-study/1``, with CSV data files). ``load_study``, ``StudyFile`` and ``StudyFileError``
keep their documented home ``ds.inference`` too (re-exported there lazily).

This layer sits above the numerical one (model, inference) and imports no Dask.
"""

from ._reader import StudyFileError as StudyFileError
from ._study_file import FORMAT as FORMAT
from ._study_file import StudyFile as StudyFile
from ._study_file import load_study as load_study
