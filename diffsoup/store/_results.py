"""Fit and simulation results in Zarr stores, readable by plain zarr, plus a short JSON summary.

Fit store layout (Zarr v3, ``format = "diffsoup.fit/1"``)::

    <path>/                           group; attrs: format, kind ("fit"), method, objective,
                                      theta_names, parameters (linear values by name),
                                      standard_errors (scaled coordinates, by name), states,
                                      analytic (names optimized analytically at each evaluation),
                                      complete (written last)
        theta                         float64 (k,): the best point (scaled coordinates)
        covariance                    float64 (k, k)
        starts/x0, starts/x           float64 (s, k): every start's first and last point
        starts/objective              float64 (s,): every start's final objective (inf: failed)
        experiments/<i>/              one group per experiment, in study order; attrs: id, status
                                      (a ds.Status name), status_code, observables (names)
            times                     float64 (m,)
            states                    float64 (m, n): the fitted trajectory at the measurement times
            observables               float64 (m, k): the model's observables there
            data                      float64 (m, k): the measured values (NaN: missing)
            window_starts             float64 (W-1, n): fitted window starts (multiple shooting only)

A study held as arrays (``ds.Study.from_arrays``/``from_table``) is written with an experiment
axis instead of one group per experiment (``experiments`` attrs: ``layout = "arrays"``,
``observables``)::

        experiments/                  attrs: layout ("arrays"), observables (names)
            ids                       str (E,): experiment ids, in study order
            times                     float64 (E, m): measurement times (padded with the last time)
            n_times                   int32 (E,): measurement times per experiment
            states                    float64 (E, m, n)
            observables               float64 (E, m, k)
            data                      float64 (E, m, k)
            status_code               int32 (E,): the ds.Status code of each solve

A simulation store (``format = "diffsoup.simulation/1"``, kind "simulation") has the same
``experiments`` (without a fit) and attrs ``parameters`` (the values simulated).

A store is written in a temporary directory beside ``path`` and renamed into place, so a reader
never sees half a result.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from ..integrate import Status
from ._durable_files import write_text_durably

FORMAT = "diffsoup.fit/1"
SIMULATION_FORMAT = "diffsoup.simulation/1"


@contextlib.contextmanager
def _atomic_group(path: Path, overwrite: bool, who: str) -> Iterator[Any]:
    """A fresh Zarr group written beside ``path`` and moved into place when the block succeeds."""
    import zarr

    if path.exists() and not overwrite:
        raise FileExistsError(f"{who}: {path} exists; pass overwrite=True to replace it.")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}-{uuid.uuid4().hex}")
    try:
        root = zarr.open_group(str(tmp), mode="w-")
        yield root
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


# Experiments per chunk of the arrays of a study held as arrays.
ARRAY_CHUNK_ROWS = 65536


def _write_experiment_arrays(root: Any, study: Any, predicted: Mapping[str, Any], observables: Mapping | None) -> None:
    """The ``experiments`` of a study held as arrays, with an experiment axis (``predicted``:
    ``InferenceProblem.predict_arrays``)."""
    arrays = study.arrays
    E, m, k = arrays.shape
    g = root.create_group("experiments")
    names = list((observables or {}).get(str(arrays.ids[0]), [])) if observables else []
    g.attrs.update(layout="arrays", observables=names)
    n_times = arrays.n_times if arrays.n_times is not None else np.full(E, m, dtype=np.int32)

    def put(name, data):
        data = np.ascontiguousarray(data)
        g.create_array(name, data=data, chunks=(min(E, ARRAY_CHUNK_ROWS),) + data.shape[1:])

    put("ids", np.asarray(arrays.ids, dtype=str))
    put("times", np.asarray(arrays.times, dtype=np.float64))
    put("n_times", np.asarray(n_times, dtype=np.int32))
    put("states", np.asarray(predicted["states"], dtype=np.float64))
    put("observables", np.asarray(predicted["observables"], dtype=np.float64))
    put("data", np.asarray(arrays.data, dtype=np.float64))
    put("status_code", np.asarray(predicted["status"], dtype=np.int32))


def _keeps_an_experiment_axis(study: Any) -> bool:
    """The store's layout of a study's experiments: with an experiment axis (``layout = "arrays"``)
    for a study held as arrays, else one group per experiment (the layout readers of those stores
    know, with window starts)."""
    return study.arrays is not None


def _stored_predictions(study: Any, problem: Any, predictions: Mapping[str, dict] | None, theta: Any) -> Mapping:
    """The predictions as the study's layout stores them: ``predict_arrays`` (from per-experiment
    ``predictions`` when given) for the experiment axis; else per experiment, with the window
    starts of ``problem`` (None: none) at ``theta``."""
    if not _keeps_an_experiment_axis(study):
        predictions = dict(predictions or problem.predict(theta))
        for eid, starts in (problem.window_values(theta) if problem is not None else {}).items():
            predictions[eid] = {**predictions[eid], "window_starts": starts}
        return predictions
    if predictions is None:
        return problem.predict_arrays(theta)
    if "states" in predictions:  # already predict_arrays
        return predictions
    E, m, k = len(study), study.rows.times.shape[1], study.n_observables
    out = {"states": np.full((E, m, study.problem.n_states), np.nan), "observables": np.full((E, m, k), np.nan),
           "status": np.zeros(E, dtype=np.int32)}  # fmt: skip
    for i, eid in enumerate(study.ids):
        p = predictions[eid]
        mi = p["states"].shape[0]
        out["states"][i, :mi], out["observables"][i, :mi], out["status"][i] = p["states"], p["observables"], p["status"]
    return out


def _write_experiments(root: Any, study: Any, predictions: Mapping[str, dict], observables: Mapping | None) -> None:
    if _keeps_an_experiment_axis(study):
        _write_experiment_arrays(root, study, predictions, observables)
        return
    for i, e in enumerate(study.experiments):
        p = predictions[e.id]
        g = root.create_group(f"experiments/{i}")
        code = int(p["status"])
        g.attrs.update(id=e.id, status_code=code, status=Status(code).name if code in set(Status) else str(code),
                       observables=list((observables or {}).get(e.id, [])))  # fmt: skip
        g.create_array("times", data=np.asarray(e.times, dtype=np.float64))
        g.create_array("states", data=np.asarray(p["states"], dtype=np.float64))
        g.create_array("observables", data=np.asarray(p["observables"], dtype=np.float64))
        g.create_array("data", data=np.asarray(e.data, dtype=np.float64))
        if "window_starts" in p:
            g.create_array("window_starts", data=np.asarray(p["window_starts"], dtype=np.float64))


def write_fit(result: Any, path: Any, lowered: Any, *, overwrite: bool = False, observables: Mapping | None = None,
              predictions: Mapping[str, dict] | None = None) -> Path:  # fmt: skip
    """Write a :class:`~diffsoup.inference.FitResult` and its trajectories to a Zarr store.

    Args:
        result: the ``FitResult``.
        path: the directory of the store.
        lowered: the ``LoweredStudy`` (or ``InferenceProblem``) that was fitted; its model gives
            the trajectories at the measurement times.
        overwrite: replace an existing store at ``path``.
        observables: experiment id -> observable names (``StudyFile.observables``), stored as attrs.
        predictions: ``lowered.problem.predict(result.theta)`` when already computed.

    Returns:
        The store's path.

    Raises:
        FileExistsError: if ``path`` exists and ``overwrite`` is False.
        ValueError: if ``result`` does not belong to ``lowered`` (other theta names).
    """
    problem = getattr(lowered, "problem", lowered)
    if tuple(result.theta_names) != tuple(problem.theta_names):
        raise ValueError(
            "write_fit: result.theta_names differ from the lowered study's; pass the study that was fitted."
        )
    predictions = _stored_predictions(problem.study, problem, predictions, result.theta)
    with _atomic_group(Path(path), overwrite, "write_fit") as root:
        root.create_array("theta", data=np.asarray(result.theta, dtype=np.float64))
        root.create_array("covariance", data=np.asarray(result.covariance, dtype=np.float64))
        root.create_array("starts/x0", data=np.stack([np.asarray(s.x0, np.float64) for s in result.starts]))
        root.create_array("starts/x", data=np.stack([np.asarray(s.x, np.float64) for s in result.starts]))
        root.create_array("starts/objective", data=np.array([s.objective for s in result.starts], np.float64))
        _write_experiments(root, problem.study, predictions, observables)
        root.attrs.update(
            format=FORMAT, kind="fit", method=result.method, objective=float(result.objective),
            theta_names=list(result.theta_names), parameters={k: float(v) for k, v in result.parameters.items()},
            standard_errors={k: float(v) if np.isfinite(v) else None for k, v in result.standard_errors.items()},
            states=list(problem.study.problem.state_names), analytic=list(result.analytic),
        )  # fmt: skip
    return Path(path)


def write_simulation(path: Any, study: Any, predictions: Mapping[str, dict], parameters: Mapping[str, float], *,
                     observables: Mapping | None = None, overwrite: bool = False) -> Path:  # fmt: skip
    """Write simulated trajectories (``InferenceProblem.predict``) of a study to a Zarr store
    (a study held as arrays: ``predictions`` may also be ``InferenceProblem.predict_arrays``).

    Raises:
        FileExistsError: if ``path`` exists and ``overwrite`` is False.
    """
    predictions = _stored_predictions(study, None, predictions, None)
    with _atomic_group(Path(path), overwrite, "write_simulation") as root:
        _write_experiments(root, study, predictions, observables)
        root.attrs.update(format=SIMULATION_FORMAT, kind="simulation",
                          parameters={k: float(v) for k, v in parameters.items()},
                          states=list(study.problem.state_names))  # fmt: skip
    return Path(path)


def read_experiment_arrays(path: Any) -> dict:
    """The experiments of a store as arrays with an experiment axis: ``ids`` ``(E,)``, ``times``
    ``(E, m)``, ``n_times`` ``(E,)``, ``states`` ``(E, m, n)``, ``observables`` ``(E, m, k)``,
    ``data`` ``(E, m, k)``, ``status_code`` ``(E,)`` (zarr arrays, read lazily), for a store
    written from a study held as arrays.

    Raises:
        ValueError: if the store keeps one group per experiment (read it with :func:`read_fit`).
    """
    import zarr

    group = zarr.open_group(str(path), mode="r")["experiments"]
    if group.attrs.get("layout") != "arrays":
        raise ValueError(f"read_experiment_arrays: {path} keeps one group per experiment; read it with read_fit().")
    return {name: group[name] for name in group.array_keys()}


def read_fit(path: Any) -> dict:
    """Read a store written by :func:`write_fit` (or :func:`write_simulation`), in either layout.

    Returns:
        ``{"attrs", "experiments": {id: {"times", "states", "observables", "data"[, "window_starts"],
        "status"}}}`` and, for a fit, ``"theta"``, ``"covariance"``, ``"starts"`` (``x0``, ``x``,
        ``objective``). (A store of many experiments reads faster as arrays:
        :func:`read_experiment_arrays`.)

    Raises:
        ValueError: if the store is incomplete or not a diffsoup result.
    """
    import zarr

    root = zarr.open_group(str(path), mode="r")
    attrs = dict(root.attrs)
    if attrs.get("format") not in (FORMAT, SIMULATION_FORMAT) or attrs.get("complete") is not True:
        raise ValueError(f"read_fit: {path} is not a complete diffsoup result store (format {attrs.get('format')!r}).")
    exps = {}
    group = root["experiments"]
    if group.attrs.get("layout") == "arrays":
        exps = _experiments_of_arrays(group)
    for i in range(len(list(group.group_keys()))):
        g = group[str(i)]
        exps[g.attrs["id"]] = {name: np.asarray(g[name][...]) for name in g.array_keys()}
        exps[g.attrs["id"]]["status"] = g.attrs.get("status", "SUCCESS")
    out = {"attrs": attrs, "experiments": exps}
    if attrs["format"] == FORMAT:
        out.update(theta=np.asarray(root["theta"][...]), covariance=np.asarray(root["covariance"][...]),
                   starts={k: np.asarray(root[f"starts/{k}"][...]) for k in ("x0", "x", "objective")})  # fmt: skip
    return out


def _experiments_of_arrays(group: Any) -> dict:
    """``read_fit``'s per-experiment records of the array layout."""
    a = {name: np.asarray(group[name][...]) for name in group.array_keys()}
    codes = set(int(c) for c in Status)
    out = {}
    for i, eid in enumerate(a["ids"].tolist()):
        m = int(a["n_times"][i])
        code = int(a["status_code"][i])
        out[str(eid)] = {"times": a["times"][i, :m], "states": a["states"][i, :m], "observables": a["observables"][i, :m],
                         "data": a["data"][i, :m], "status": Status(code).name if code in codes else str(code)}  # fmt: skip
    return out


def write_summary(path: Any, summary: Mapping[str, Any]) -> Path:
    """Write a JSON summary (sorted keys, two-space indent) durably: a reader sees the old file or
    the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_durably(path, json.dumps(summary, indent=2, sort_keys=True, default=_json_default) + "\n")
    return path


def _json_default(value: Any):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON: {type(value).__name__}")
