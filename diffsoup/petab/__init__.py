"""PEtab v1 problems as diffsoup studies: ``ds.petab.load(yaml_path)``.

    import diffsoup as ds
    problem = ds.petab.load("Boehm_JProteomeRes2014.yaml")
    lowered = problem.lower()                 # SolverOptions(rtol=1e-8, atol=1e-8) unless solver=
    nll = lowered.value(problem.nominal)      # the negative log-likelihood (= -petab's llh)
    problem.write_simulation_table("simulation.tsv")

The importer lives in ``diffsoup.formats`` (``_petab_tables``: reading and checking the tables,
one module per table kind beside it; ``_petab_formulas``: observable and noise formulas compiled
to JAX; ``_petab_study``: ``load``, with ``_petab_builder`` making the study and ``_petab_problem``
holding it; ``_petab_simulation``: simulation tables). The ``diffsoup`` command accepts a PEtab
YAML file wherever it accepts a study file.
"""

from ..formats._petab_simulation import write_simulation_table as write_simulation_table
from ..formats._petab_study import PetabProblem as PetabProblem
from ..formats._petab_study import load as load
from ..formats._petab_errors import PetabError as PetabError
from ..formats._petab_errors import PetabWarning as PetabWarning
