"""The fitted parameters as a PEtab v1 parameter table (``write_parameter_table``).

A PEtab user takes the fit elsewhere (AMICI, pyPESTO, COPASI, Data2Dynamics) by replacing the
problem's parameter table with this one: its ``nominalValue`` column holds the estimates (linear
scale, as PEtab's nominal values are) and the fixed parameters' values; ``parameterScale``,
``lowerBound``, ``upperBound`` and ``estimate`` are the study's. With ``template`` (the problem's
own parameter table, e.g. ``PetabProblem.parameter_table``) every other column and row of the
template is kept (priors, names) and only ``nominalValue`` changes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np

COLUMNS = ("parameterId", "parameterScale", "lowerBound", "upperBound", "nominalValue", "estimate")


def _petab_id(name: str) -> str:
    """An entry name as a PEtab identifier: ``k1[site A]`` -> ``k1__site_A``."""
    return re.sub(r"\W", "_", name.replace("[", "__").replace("]", ""))


def parameter_table(problem: Any, parameters: Mapping[str, float], template: Any = None):
    """The PEtab parameter table (a ``pandas.DataFrame`` indexed by ``parameterId``) with
    ``parameters`` (linear values by theta name, e.g. ``FitResult.parameters``) as nominal values.

    Args:
        problem: the ``InferenceProblem`` (or a lowered study: its ``problem``).
        parameters: the estimates by entry name (linear scale).
        template: a PEtab parameter table (DataFrame indexed or columned by ``parameterId``, or a
            TSV path) to keep; None builds one from the study's parameter table.

    Raises:
        ValueError: for an estimate the problem does not estimate, or a template that lacks a
            fitted parameter.
    """
    import pandas as pd

    problem = getattr(problem, "problem", problem)
    study = problem.study
    estimated = {study.entries[i].name for i in problem.estimated}
    unknown = sorted(set(parameters) - estimated)
    if unknown:
        raise ValueError(f"parameter_table: {unknown} are not estimated parameters; theta is {sorted(estimated)}.")
    values = {e.name: float(v) for e, v in zip(study.entries, problem.values)}
    values.update({k: float(v) for k, v in parameters.items()})
    if template is not None:
        table = pd.read_csv(template, sep="\t") if isinstance(template, (str, Path)) else template.copy()
        if "parameterId" in table.columns:
            table = table.set_index("parameterId")
        missing = sorted(_petab_id(n) for n in parameters if _petab_id(n) not in table.index)
        if missing:
            raise ValueError(f"parameter_table: the template has no rows for {missing}.")
        table["nominalValue"] = table["nominalValue"].astype(float)
        for name, v in values.items():
            if _petab_id(name) in table.index:
                table.loc[_petab_id(name), "nominalValue"] = v
        return table
    rows = []
    for e in study.entries:
        p = e.parameter
        rows.append({"parameterId": _petab_id(e.name), "parameterScale": p.scale, "lowerBound": p.lower,
                     "upperBound": p.upper, "nominalValue": values[e.name], "estimate": int(e.name in estimated)})  # fmt: skip
    return pd.DataFrame(rows, columns=list(COLUMNS)).set_index("parameterId")


def write_parameter_table(result: Any, path: Any, problem: Any, *, template: Any = None) -> Path:
    """Write a fit's estimates as a PEtab parameter table (TSV).

    Args:
        result: a ``FitResult`` (its ``parameters``) or a mapping of linear values by theta name.
        path: the TSV file (its directory is created).
        problem: the ``InferenceProblem`` or lowered study the fit ran on.
        template: the problem's own parameter table to keep (see :func:`parameter_table`).

    Returns:
        The path.
    """
    parameters = result.parameters if hasattr(result, "parameters") else dict(result)
    table = parameter_table(problem, parameters, template)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = table.reset_index()
    for column in ("lowerBound", "upperBound", "nominalValue"):
        if column in out.columns:
            out[column] = out[column].map(lambda v: repr(float(v)) if np.isfinite(v) else str(v))
    out.to_csv(path, sep="\t", index=False)
    return path
