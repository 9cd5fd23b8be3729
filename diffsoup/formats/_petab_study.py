"""A PEtab v1 problem as a ``ds.Study``: ``ds.petab.load(yaml_path) -> PetabProblem``.

How PEtab's tables become experiments:

* **Experiments.** The measurements are grouped by ``(simulationConditionId,
  preequilibrationConditionId)``; each group is one experiment, named by its simulation
  condition, or ``"<simulation>@<pre-equilibration>"`` when it has one. Its times are the group's
  distinct measurement times, each repeated as often as the most replicates any observable has
  there; ``time = inf`` measurements are the steady state (the last rows).
* **Arrays or objects.** Without pre-equilibration, and with one set of observable (and noise
  expression) parameters per observable and condition, the study is held as arrays
  (``ds.Study.from_arrays``, built from the tables' columns without a loop over rows or
  conditions: :mod:`._petab_arrays`); otherwise each experiment is a ``ds.Experiment``. Both give
  the same experiments, columns, numbers and placements (``load(arrays=...)`` chooses).
* **Observable columns.** One column per observable, shared by every experiment (NaN where an
  experiment has no value), so that all experiments evaluate the same observables function and
  are vmapped together. An observable whose rows in one experiment give different
  ``observableParameters`` (or different ``noiseParameters`` for a noise formula that is not a
  bare placeholder) gets several columns (*slots*), named ``id``, ``id/1``, ...
* **Observable and noise parameters.** Placeholders ``observableParameter{n}_{id}`` (and the noise
  placeholders of noise formulas that are expressions) and the parameter-table parameters a
  formula names that are not model parameters become ``Experiment.observable_parameters``
  (numbers or study-parameter names). A noise formula that is a bare placeholder, parameter or
  number is a per-measurement spread (an object array of numbers and parameter names); any other
  noise formula is a function ``sigma(t, h, p)`` of the time, the observables and the parameters.
* **Noise models.** ``noiseDistribution`` x ``lin``/``log``/``log10``: the registered noise model of
  that distribution (``normal``: ``Gaussian``, ``LogNormal(base=e or 10)``; ``laplace``:
  ``Laplace``, ``LogLaplace``; ``petab_noise_class``), one per column where they differ.
* **Conditions.** A condition's column that is a model parameter or compartment overrides it (a
  number: ``conditions``; a parameter id: ``parameters``); a column that is a species (a state)
  sets its initial value (NaN keeps the model's). Model parameters in the parameter table map to
  the study parameters of the same name; the others keep their SBML values.
* **Initial states** are ``y0(p)`` of the SBML model (initial assignments are functions of the
  parameters), with the condition's species values set over them: a species set in some condition
  adds two parameters to the model, ``"<species>:initial"`` (the value) and
  ``"<species>:initial_set"`` (1 where the condition sets it), so every experiment shares one
  ``y0`` function.
* **Pre-equilibration.** ``ds.inference.Preequilibration`` with the pre-equilibration condition's
  values as its conditions and ``y0``; the simulation condition's species values re-initialize
  those states afterwards (PEtab's semantics).
* **Events and switches.** The model's time-triggered events are ``ds.Reset``s (their times and
  assignments functions of the parameters); the times of piecewise switches on time are the
  experiments' ``discontinuities``. Events together with pre-equilibration are refused.
* **Parameters.** Each row of the parameter table is a ``ds.inference.Parameter`` (scale, bounds,
  nominal value, estimate flag).

``PetabProblem.lower()`` gives the negative log-likelihood (``objective="nll"``), equal to
``-petab.v1.calculate_llh``.

The parts: :mod:`._petab_tables` reads and checks the tables, :mod:`._petab_builder` turns them and
the SBML model into the study, :mod:`._petab_problem` holds the result (:class:`PetabProblem`);
this module's :func:`load` runs them.
"""

from __future__ import annotations

from typing import Any

from ._petab_builder import PetabStudyBuilder
from ._petab_errors import PetabError
from ._petab_problem import DEFAULT_ATOL as DEFAULT_ATOL
from ._petab_problem import DEFAULT_RTOL as DEFAULT_RTOL
from ._petab_problem import PetabProblem as PetabProblem
from ._petab_tables import read_tables
from ._sbml import load_sbml
from ._sbml_error import SBMLError


# ------------------------------------------------------------------------------------------------


def load(yaml_path: Any, *, validate: bool = True, cache: bool = True, cache_dir: Any = None,
         precision: Any = None, linear_solver: Any = None, arrays: bool | None = None) -> PetabProblem:  # fmt: skip
    """Import a PEtab v1 problem.

    Args:
        yaml_path: the problem's YAML file.
        validate: run ``petab.v1.lint_problem`` too: about a second for the benchmark problems,
            but petab checks row by row (measured: 9 s for 90,000 measurement rows, 114 s for
            900,000); ``validate=False`` skips it, and diffsoup's own checks of every row stay.
        cache: read and write the generated code (model, formulas) in the disk cache.
        cache_dir: the cache's root (default: ``DIFFSOUP_CACHE_DIR``'s).
        precision, linear_solver: for ``spec.build`` (defaults: float64, the default solver).
        arrays: None holds the study as arrays (``ds.Study.from_arrays``, no ``Experiment`` object
            per condition) when the problem allows it (no pre-equilibration; one set of observable
            parameters per observable and condition), else as ``Experiment`` objects; True
            requires arrays (a ``PetabError`` says what prevents them); False builds the objects.

    Returns:
        A :class:`PetabProblem`.

    Raises:
        PetabError: (a ``ValueError``) naming the file, row and column of a malformed table or an
            unsupported feature (objective priors, noise formulas of the states, events with
            pre-equilibration, SBML features diffsoup does not import, ...).
        FileNotFoundError: for a missing YAML file.
    """
    tables = read_tables(yaml_path, validate=validate)
    try:
        model = load_sbml(tables.sbml_path, cache=cache, cache_dir=cache_dir)
    except SBMLError as exc:
        raise PetabError(str(exc), path=tables.sbml_path) from None
    return PetabStudyBuilder(tables, model, cache=cache, cache_dir=cache_dir, precision=precision,
                             linear_solver=linear_solver).build(arrays)  # fmt: skip
