"""The imported PEtab v1 problem: :class:`PetabProblem` (its ``ds.Study``, parameter table, observable
columns and measurement placements), with what it offers: ``lower``, ``simulate``, the simulation
table, ``theta_of``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..inference import InferenceProblem, SolverOptions
from ..inference import lower as lower_study
from ._petab_arrays import Placements
from ._petab_simulation import simulation_table
from ._petab_tables import PetabTables

DEFAULT_RTOL = 1e-8
DEFAULT_ATOL = 1e-8


class PetabProblem:
    """A PEtab v1 problem imported as a ``ds.Study``. Made by
    :func:`~diffsoup.formats._petab_study.load`.

    Attributes:
        path: the YAML file.
        name: the problem's name (the YAML file's stem).
        model: the ``SBMLModel`` (``diffsoup.formats.load_sbml``).
        study: the ``ds.Study``.
        solver: the ``SolverOptions`` of :meth:`lower` (rtol = atol = 1e-8, as AMICI's benchmarks).
        parameter_table: the parameter table (``pandas.DataFrame`` indexed by parameterId).
        petab_problem: the ``petab.v1.Problem`` (its tables, for ``petab.v1`` functions).
        tables: the checked rows (:class:`~diffsoup.formats._petab_tables.PetabTables`).
        columns: the observable columns (names ``id`` or ``id/slot``), in the experiments' order.
        nominal: ``theta`` at the parameter table's nominal values: the estimated parameters on
            their scales, in the order of :attr:`theta_names` (``lowered.nominal`` too).
        theta_names: the estimated parameters, in ``theta`` order.
        nominal_values: every parameter's nominal value (linear scale), by id (``theta_of(values)``
            gives ``theta`` at other values).
        files: every file of the problem (the YAML first).
        placements: where each measurement row lies: ``placements[row]`` is ``(experiment id, row
            of its data, column)``; its arrays ``experiment`` (study indices), ``row``, ``column``.
        objects_reason: why the study holds ``Experiment`` objects rather than arrays (None: it
            holds arrays, ``study.arrays``).
    """

    def __init__(self, tables: PetabTables, model: Any, study: Any, columns: tuple, placements: Placements,
                 formulas: Any, objects_reason: str | None = None):  # fmt: skip
        self.placements = placements
        self.objects_reason = objects_reason
        self.tables = tables
        self.path = tables.yaml_path
        self.name = tables.yaml_path.stem
        self.model = model
        self.study = study
        self.columns = columns
        self.formulas = formulas
        self.solver = SolverOptions(rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL)
        self.petab_problem = tables.problem
        self.parameter_table = tables.problem.parameter_df
        self.files = tables.files
        estimated = [p for p in study.parameters if p.estimate]
        self.theta_names = tuple(p.name for p in estimated)
        self.nominal = np.array([float(p.to_scale(p.nominal)) for p in estimated], dtype=np.float64)
        self.nominal_values = {p.name: float(p.nominal) for p in study.parameters}

    # -- evaluation ---------------------------------------------------------------------------
    def lower(self, *, solver: Any = None, **lower_options):
        """``ds.lower`` of the study: ``lowered.value(theta)`` is the negative log-likelihood.

        Args:
            solver: a ``ds.inference.SolverOptions`` (default :attr:`solver`).
            lower_options: passed to ``ds.lower`` (``layout=``, ``experiments_per_chunk=``, ``gradient=``, ...).
        """
        lower_options.setdefault("objective", "nll")
        return lower_study(self.study, solver=self.solver if solver is None else solver, **lower_options)

    def inference_problem(self, *, solver: Any = None, values: Mapping[str, float] | None = None):
        """The ``ds.inference.InferenceProblem`` (negative log-likelihood) of the study."""
        return InferenceProblem(self.study, objective="nll", solver=self.solver if solver is None else solver,
                                values=values)  # fmt: skip

    def simulate(self, theta: Any = None, *, solver: Any = None) -> dict:
        """The experiments' predictions at ``theta`` (default :attr:`nominal`): experiment id ->
        ``{"times", "states", "observables", "status"}`` (``InferenceProblem.predict``)."""
        problem = self.inference_problem(solver=solver)
        return problem.predict(problem.nominal if theta is None else np.asarray(theta, dtype=np.float64))

    def simulation_table(self, theta: Any = None, *, solver: Any = None, predictions: Mapping | None = None):
        """The PEtab simulation table at ``theta``: the measurement table with its ``measurement``
        column replaced by ``simulation`` (the observable formula's value, untransformed; NaN where
        the solve failed).

        Args:
            theta: the point (scaled; default :attr:`nominal`).
            solver: ``SolverOptions`` (default :attr:`solver`).
            predictions: ready predictions (:meth:`simulate`'s result) instead of simulating.
        """
        if predictions is None:
            predictions = self.simulate(theta, solver=solver)
        return simulation_table(self, predictions)

    def write_simulation_table(self, path: Any, theta: Any = None, *, solver: Any = None,
                               predictions: Mapping | None = None) -> Path:  # fmt: skip
        """Write :meth:`simulation_table` as a TSV file; returns its path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.simulation_table(theta, solver=solver, predictions=predictions).to_csv(path, sep="\t", index=False)
        return path

    def theta_of(self, values: Mapping[str, float]) -> np.ndarray:
        """``theta`` (scaled, :attr:`theta_names` order) from linear values by parameter id; the
        others at their nominal values.

        Raises:
            ValueError: for an id that is not an estimated parameter.
        """
        unknown = sorted(set(values) - set(self.theta_names))
        if unknown:
            raise ValueError(f"theta_of: {unknown} are not estimated parameters; theta is {list(self.theta_names)}.")
        table = {p.name: p for p in self.study.parameters}
        out = self.nominal.copy()
        for i, name in enumerate(self.theta_names):
            if name in values:
                out[i] = float(table[name].to_scale(values[name]))
        return out

    def placement(self, row: int) -> tuple[str, int, int]:
        """Where measurement ``row`` (0-based, over the concatenated measurement tables) lies:
        ``(experiment id, row of its data, column)``."""
        return self.placements[row]

    def __repr__(self) -> str:
        return (f"PetabProblem({self.name!r}, experiments={len(self.study.experiments)}, "
                f"measurements={len(self.tables.measurement_table)}, estimated={len(self.theta_names)}"
                f"{', held as arrays' if self.objects_reason is None else ''})")  # fmt: skip
