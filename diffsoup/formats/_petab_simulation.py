"""PEtab simulation tables: the measurement table with each row's simulated value.

A simulation table (PEtab v1) has the measurement table's columns with ``measurement`` replaced by
``simulation``: the value of the row's observable formula (untransformed) at its time, in its
experiment, with its observable parameters. ``petab.v1.calculate_llh`` takes it with the problem's
tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np


def simulation_table(problem: Any, predictions: Mapping[str, dict]):
    """The simulation table of a ``PetabProblem`` from its predictions.

    Args:
        problem: the ``PetabProblem``.
        predictions: experiment id -> ``{"observables": (m, k), ...}`` (``InferenceProblem.predict``).

    Returns:
        A ``pandas.DataFrame`` in the measurement tables' row order.
    """
    from petab.v1.C import MEASUREMENT, SIMULATION

    df = problem.petab_problem.measurement_df.copy().reset_index(drop=True)
    places = problem.placements
    values = np.full(len(places), np.nan)
    # The rows of each experiment, gathered from its observables at once (a loop over experiments).
    order = np.argsort(places.experiment, kind="stable")
    bounds = np.searchsorted(places.experiment[order], np.arange(len(places.ids) + 1))
    for e, eid in enumerate(places.ids):
        rows = order[bounds[e] : bounds[e + 1]]
        if rows.size:
            observed = np.asarray(predictions[eid]["observables"], dtype=np.float64)
            values[rows] = observed[places.row[rows], places.column[rows]]
    if len(df) != values.size:  # petab concatenates the files we read row by row: the same rows
        raise RuntimeError(f"simulation_table: {len(df)} rows in petab's measurement table, {values.size} read.")
    df = df.rename(columns={MEASUREMENT: SIMULATION})
    df[SIMULATION] = values
    return df


def write_simulation_table(problem: Any, path: Any, theta: Any = None, *, solver: Any = None,
                           predictions: Mapping | None = None) -> Path:  # fmt: skip
    """Write a ``PetabProblem``'s simulation table at ``theta`` (default: the nominal point) as TSV.

    Args:
        problem: the ``PetabProblem``.
        path: the file to write.
        theta: the point (scaled coordinates, :attr:`PetabProblem.theta_names` order).
        solver: ``SolverOptions`` (default ``problem.solver``).
        predictions: ready predictions instead of simulating.

    Returns:
        The path written.
    """
    return problem.write_simulation_table(path, theta, solver=solver, predictions=predictions)
