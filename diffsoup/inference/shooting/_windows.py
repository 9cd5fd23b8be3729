"""Window starts of multiple-shooting experiments: computed once, kept in a window cache.

:func:`prepare_windows` computes an experiment's window starts (by a solve at the given parameter
values, or from the data where the states are observed) and keeps them in a
:class:`~diffsoup.inference.WindowCache` (by default the shared Zarr store under
``DIFFSOUP_CACHE_DIR``, see :mod:`diffsoup.inference.shooting._window_cache`), keyed by :func:`window_key`, a
content hash of everything the starts depend on: the model (``Problem.fingerprint``: the rhs
source, identity, names, sparsity pattern, precision and solver), the initial state, ``t0``, the
model parameter values of the experiment, the window edges, the ``init`` mode, the data and the
solver tolerances. Every input is hashed as float64 bytes or text, never by ``id`` or Python's
salted ``hash``, so the key is the same in every process and on every machine.

Building an :class:`~diffsoup.inference.InferenceProblem` of multiple-shooting experiments goes
through the same path: it loads the starts when present and otherwise computes and stores them.
:func:`window_solves` counts the solves done to compute window starts in this process (0 when
every start came from the store).
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any

import numpy as np

from ...integrate import ForwardMode, simulate
from ..study._multishoot import Multishoot
from ..study._solver_options import SolverOptions
from ..study._study import Parameter, Study, entries_by_name
from ._window_cache import WindowCache, WindowEntry, window_cache

KEY_VERSION = "windows/1"
_counter = {"solves": 0}


def window_solves() -> int:
    """The number of solves this process has run to compute window starts (cache hits run none)."""
    return _counter["solves"]


def reset_window_solves() -> None:
    """Set :func:`window_solves` back to 0."""
    _counter["solves"] = 0


def _model_values(study, values: np.ndarray, experiment) -> np.ndarray:
    plan = study.resolved[experiment.id]["plan"]
    return np.array([values[v] if kind == "entry" else v for kind, v in plan], dtype=np.float64)


def initial_state(study, values: np.ndarray, experiment) -> np.ndarray:
    """The experiment's initial state ``(n,)`` at the entries' linear ``values`` (numpy): its
    ``y0`` with estimated initial amounts filled in, or its ``y0(p)`` evaluated."""
    r = study.resolved[experiment.id]
    if r["y0_function"] is not None:
        problem = study.problem
        pdict = dict(zip(problem.parameter_names, _model_values(study, values, experiment)))
        return np.asarray(r["y0_function"](pdict), dtype=np.float64)
    y0 = np.array(r["y0"], dtype=np.float64)
    est = r["y0_entry"] >= 0
    y0[est] = values[r["y0_entry"][est]]
    return y0


def _observed(experiment, n_states: int) -> np.ndarray:
    """Per state: whether the data observe it directly (``observables=None`` and a measured value)."""
    if experiment.observables is not None:
        return np.zeros(n_states, dtype=bool)
    return np.any(np.isfinite(experiment.data), axis=0)


def window_key(study, values: np.ndarray, solver, experiment) -> str:
    """The content key of ``experiment``'s window starts (the same in every process and machine).

    Args:
        study: a ``Study`` that resolves ``experiment`` (its model and parameter mapping).
        values: linear values of all the study's entries.
        solver: the ``SolverOptions`` of the solve.
        experiment: an experiment carrying a ``Multishoot``.

    Returns:
        A 32-character hex string.
    """
    traj: Multishoot = experiment.trajectory
    h = hashlib.sha256()

    def put(label, value):
        if isinstance(value, np.ndarray):
            a = np.ascontiguousarray(value)
            h.update(f"{label}:{a.dtype.str}:{a.shape}:".encode())
            h.update(a.tobytes())
        else:
            h.update(f"{label}:{value!r};".encode())

    put("version", KEY_VERSION)
    put("model", study.problem.fingerprint)
    put("init", traj.init)
    put("edges", np.asarray(traj.edges(experiment), dtype=np.float64))
    put("t0", float(experiment.t0))
    put("y0", initial_state(study, values, experiment))
    put("params", _model_values(study, values, experiment))
    put("times", np.asarray(experiment.times, dtype=np.float64))
    put("data", np.where(np.isfinite(experiment.data), experiment.data, np.inf))
    put("observed", _observed(experiment, study.problem.n_states))
    put("solver", (float(solver.rtol), float(solver.atol), int(solver.max_steps)))
    return h.hexdigest()[:32]


def compute_starts(study, values: np.ndarray, solver, experiment) -> np.ndarray:
    """Window starts ``(W-1, n)`` of ``experiment``: data where observed, a solve for the rest.

    Raises:
        ValueError: for ``init="data"`` when a state is not observed.
        RuntimeError: naming the experiment, if the solve at the given values fails.
    """
    traj: Multishoot = experiment.trajectory
    problem = study.problem
    n = problem.n_states
    edges = traj.edges(experiment)
    inner = edges[1:-1]
    observed = _observed(experiment, n) if traj.init in ("auto", "data") else np.zeros(n, dtype=bool)
    if traj.init == "data" and not np.all(observed):
        missing = [problem.state_names[j] for j in np.nonzero(~observed)[0]]
        raise ValueError(
            f"Experiment {experiment.id!r}: Multishoot(init='data') needs every state observed (observables=None and "
            f"data for each state); states {missing[:10]} are not. Use init='auto' or 'simulate'."
        )
    starts = np.zeros((inner.size, n))
    if not np.all(observed):
        sol = simulate(problem, initial_state(study, values, experiment), inner, _model_values(study, values, experiment), t0=experiment.t0,
                       rtol=solver.rtol, atol=solver.atol, max_steps=solver.max_steps, adjoint=ForwardMode(),
                       throw=False)  # fmt: skip
        _counter["solves"] += 1
        if int(sol.status) != 0:
            raise RuntimeError(
                f"Experiment {experiment.id!r}: the solve for the window starts failed at the given parameter values "
                f"(status {int(sol.status)}); give values= where the model solves, or use Multishoot(init='data')."
            )
        starts[:] = np.asarray(sol.ys, dtype=np.float64)
    for j in np.nonzero(observed)[0]:
        fin = np.isfinite(experiment.data[:, j])
        starts[:, j] = np.interp(inner, experiment.times[fin], experiment.data[fin, j])
    return starts


def window_starts(study, values: np.ndarray, solver, experiment, cache: WindowCache) -> tuple[str, np.ndarray]:
    """``(key, starts)`` of ``experiment``: loaded from ``cache``, else computed and saved there.

    Returns:
        The key and the window starts ``(W-1, n)``.
    """
    key = window_key(study, values, solver, experiment)
    edges = np.asarray(experiment.trajectory.edges(experiment), dtype=np.float64)
    n = study.problem.n_states
    entry = cache.load(key)
    if entry is not None and entry.fits(edges, n):
        return key, entry.starts
    # One solve for every process sharing the cache: the others wait here, then load its entry.
    with cache.computing(key):
        entry = cache.load(key)
        if entry is not None and entry.fits(edges, n):
            return key, entry.starts
        starts = compute_starts(study, values, solver, experiment)
        try:
            placed = cache.save(key, WindowEntry(starts, edges, {"experiment": experiment.id,
                                                                 "states": list(study.problem.state_names)}))  # fmt: skip
        except OSError as err:
            warnings.warn(f"diffsoup: could not store the window starts of {experiment.id!r} in {cache!r}: {err}",
                          stacklevel=2)  # fmt: skip
            return key, starts
    if not placed:  # another process stored them first: use its copy, so every process holds the same values
        entry = cache.load(key)
        if entry is not None and entry.fits(edges, n):
            return key, entry.starts
    return key, starts


PROBLEM_KEYWORDS = ("study", "problem", "table", "levels", "values", "solver", "parameters", "objective",
                    "window_store")  # fmt: skip


def prepare_windows(experiment: Any, trajectory: Any = None, **problem_kwargs: Any) -> str | None:
    """Compute and store the window starts of a multiple-shooting experiment before a fit.

    A later fit of the same experiment (the same model, parameter values, windows and data) loads
    them instead of solving again. Set ``DIFFSOUP_CACHE_DIR`` to a shared directory for a run of
    several processes; entries are written whole and renamed into place, so processes may prepare
    the same experiment at once: one of them solves while the others wait for its entry (the
    store's lock of the entry), so the run pays for one solve.

    Args:
        experiment: the ``Experiment`` whose windows to initialize.
        trajectory: a ``Multishoot`` to apply to the experiment, or None to keep its own.
        **problem_kwargs: the model and parameter values, as for an ``InferenceProblem``:
            ``study=`` (a ``Study`` whose model, parameter table and levels resolve the
            experiment; the experiment need not be one of its own) or ``problem=`` (a built model)
            with ``table=`` (``Parameter`` rows, default none) and ``levels=``; ``values=``
            (linear values by parameter or entry name; default the nominal values); ``solver=``
            (``SolverOptions``); ``window_store=`` (a ``WindowCache``; default the Zarr store
            under ``DIFFSOUP_CACHE_DIR``). ``parameters=`` (names to estimate, or with
            ``problem=`` the ``Parameter`` rows in place of ``table=``) and ``objective=`` are
            accepted; names do not change the starts.

    Returns:
        The key the windows are stored under, or None when the experiment uses single shooting
        (nothing to store).

    Raises:
        TypeError: for unknown keywords, neither ``study=`` nor ``problem=``, or a
            ``window_store`` that is not a ``WindowCache``.
        ValueError: as for ``Study`` and ``Multishoot``.
    """
    if "store" in problem_kwargs:  # its name before window_store= (the InferenceProblem keyword)
        warnings.warn("prepare_windows: store= is now window_store=.", DeprecationWarning, stacklevel=2)
        problem_kwargs.setdefault("window_store", problem_kwargs.pop("store"))
    unknown = sorted(set(problem_kwargs) - set(PROBLEM_KEYWORDS))
    if unknown:
        raise TypeError(f"prepare_windows: unknown keyword(s) {unknown}; accepted are {sorted(PROBLEM_KEYWORDS)}.")
    traj = trajectory if trajectory is not None else getattr(experiment, "trajectory", None)
    if traj is None:
        return None
    experiment = experiment.with_trajectory(traj)
    study = problem_kwargs.get("study")
    if study is not None:
        if not isinstance(study, Study):
            raise TypeError(f"prepare_windows: study= must be a ds.Study, not {type(study).__name__}.")
        model, table, levels = study.problem, study.parameters, study.levels
    elif problem_kwargs.get("problem") is not None:
        model = problem_kwargs["problem"]
        table = tuple(problem_kwargs.get("table") or ())
        rows = problem_kwargs.get("parameters")
        if not table and rows is not None and not isinstance(rows, str) and all(isinstance(p, Parameter) for p in rows):
            table = tuple(rows)  # parameters= given as the table itself
        levels = tuple(problem_kwargs.get("levels") or ())
        if not all(isinstance(p, Parameter) for p in table):
            raise TypeError("prepare_windows: table= holds ds.inference.Parameter rows.")
    else:
        raise TypeError("prepare_windows: give study= (a ds.Study) or problem= (a built model) for the solve.")
    cache = window_cache(problem_kwargs.get("window_store"))
    one = Study(model, [experiment], table, levels=levels)
    solver = problem_kwargs.get("solver") or SolverOptions()
    values = entries_by_name(one, problem_kwargs.get("values"))
    key, _ = window_starts(one, values, solver, one.experiments[0], cache)
    return key
