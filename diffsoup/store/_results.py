"""Fit results in a Zarr store, readable by plain zarr.

Layout (Zarr v3)::

    <path>/                           group; attrs: format, method, objective, theta_names,
                                      parameters (linear values by name), complete (written last)
        theta                         float64 (k,): the best point (scaled coordinates)
        covariance                    float64 (k, k)
        experiments/<i>/              one group per experiment, in study order; attrs: id
            times                     float64 (m,)
            states                    float64 (m, n): the fitted trajectory at the measurement times
            window_starts             float64 (W-1, n): fitted window starts (multiple shooting only)

The whole store is written in a temporary directory beside ``path`` and renamed into place, so a
reader never sees half a result.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "diffsoup.fit/1"


def write_fit(result: Any, path: Any, lowered: Any, *, overwrite: bool = False) -> Path:
    """Write a :class:`~diffsoup.inference.FitResult` and its trajectories to a Zarr store.

    Args:
        result: the ``FitResult``.
        path: the directory of the store.
        lowered: the ``LoweredStudy`` (or ``InferenceProblem``) that was fitted; its model gives
            the trajectories at the measurement times.
        overwrite: replace an existing store at ``path``.

    Returns:
        The store's path.

    Raises:
        FileExistsError: if ``path`` exists and ``overwrite`` is False.
        ValueError: if ``result`` does not belong to ``lowered`` (other theta names).
    """
    import zarr

    problem = getattr(lowered, "problem", lowered)
    if tuple(result.theta_names) != tuple(problem.theta_names):
        raise ValueError(
            "write_fit: result.theta_names differ from the lowered study's; pass the study that was fitted."
        )
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"write_fit: {path} exists; pass overwrite=True to replace it.")
    path.parent.mkdir(parents=True, exist_ok=True)
    states = problem.trajectories(result.theta)
    windows = problem.window_values(result.theta)
    tmp = path.with_name(f".tmp-{path.name}-{uuid.uuid4().hex}")
    try:
        root = zarr.open_group(str(tmp), mode="w-")
        root.create_array("theta", data=np.asarray(result.theta, dtype=np.float64))
        root.create_array("covariance", data=np.asarray(result.covariance, dtype=np.float64))
        for i, e in enumerate(problem.study.experiments):
            g = root.create_group(f"experiments/{i}")
            g.attrs["id"] = e.id
            g.create_array("times", data=np.asarray(e.times, dtype=np.float64))
            g.create_array("states", data=states[e.id])
            if e.id in windows:
                g.create_array("window_starts", data=windows[e.id])
        root.attrs.update(
            format=FORMAT, method=result.method, objective=float(result.objective),
            theta_names=list(result.theta_names), parameters={k: float(v) for k, v in result.parameters.items()},
            states=list(problem.study.problem.state_names),
        )  # fmt: skip
        root.attrs["complete"] = True
        if path.exists():
            aside = path.with_name(f".old-{path.name}-{uuid.uuid4().hex}")
            os.rename(path, aside)
            os.rename(tmp, path)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.rename(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def read_fit(path: Any) -> dict:
    """Read a store written by :func:`write_fit`.

    Returns:
        ``{"attrs", "theta", "covariance", "experiments": {id: {"times", "states"[, "window_starts"]}}}``.

    Raises:
        ValueError: if the store is incomplete or not a diffsoup fit.
    """
    import zarr

    root = zarr.open_group(str(path), mode="r")
    attrs = dict(root.attrs)
    if attrs.get("format") != FORMAT or attrs.get("complete") is not True:
        raise ValueError(f"read_fit: {path} is not a complete diffsoup fit store (format {attrs.get('format')!r}).")
    exps = {}
    group = root["experiments"]
    for i in range(len(list(group.group_keys()))):
        g = group[str(i)]
        exps[g.attrs["id"]] = {name: np.asarray(g[name][...]) for name in g.array_keys()}
    return {"attrs": attrs, "theta": np.asarray(root["theta"][...]), "covariance": np.asarray(root["covariance"][...]),
            "experiments": exps}  # fmt: skip
