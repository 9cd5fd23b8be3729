"""``ds.inference.InferenceProblem``: a study, the parameters to estimate, the objective and solver options.

It reads the study's experiments through :mod:`._study_rows` (the one place that knows how the
study holds them) as blocks of arrays, one row per experiment, one block per group of experiments
that can be vmapped together, and defines the per-experiment terms the lowered objective sums:

- the terms of each measured value by its noise model (:mod:`diffsoup.inference.objective._terms`): Gaussian
  ``r = (h - d) / sigma``, log-normal ``r = (log_b h - log_b d) / sigma``, Laplace and log-Laplace
  ``|z| = |T(h) - T(d)| / scale`` with residual ``sqrt(2 |z|)``;
- ``objective="nll"``: ``value`` = the negative log-likelihood (exactly PEtab's);
- ``objective="chi2"``: ``value = sum(r^2)`` (known sigma and normal noise only).

Residuals for Gauss-Newton are the ``r`` above, plus, for a spread that comes from a parameter or a
function under ``"nll"``, one more residual per measured value, ``sqrt(2 log sigma + K)``, so that
``value = scale * ||r||^2 + offset`` exactly (``scale`` 0.5 for ``"nll"``, 1 for ``"chi2"``; ``K``
makes the root real over the sigma parameters' bounds: ``K = 1 - 2 log(lower)`` at least, and
``1 - 2 log(FUNCTION_SIGMA_FLOOR)`` with a sigma function, see ``sigma_shift``).

A multiple-shooting experiment (``Experiment.trajectory`` a ``Multishoot``) is solved window by
window from its fitted window starts (extra entries of ``theta``); its continuity residuals
``c = weight * (y_w(end) - s_{w+1}) / state_scale`` follow its other residuals and enter the value
as ``scale * sum(c^2)``, so the identity above still holds.
"""

from __future__ import annotations

import functools
import math
from typing import Mapping, Sequence

import jax
import numpy as np

from ...integrate._tolerance import checked_rtol
from ..shooting._window_cache import WindowCache, window_cache
from ..shooting._windows import window_starts
from ..study._solver_options import SolverOptions
from ..study._study import Study, entries_by_name
from ._lane_inputs import LaneInputs
from ._study_rows import study_rows
from ._terms import (  # noqa: F401 (Group, LaneTerms, TermOperands, full_vector: re-exported)
    Group,
    LaneTerms,
    TermOperands,
    full_vector,
    member_array,
)

OBJECTIVES = ("nll", "chi2")
# Experiments solved together by predict (a chunk's program is compiled once per group and size).
PREDICT_LANES = 4096
# The smallest spread a sigma function is expected to give: it sets the shift ``K`` of the residuals
# ``sqrt(2 log sigma + K)`` (no bounds are known for a function's value; below
# ``FUNCTION_SIGMA_FLOOR / sqrt(e)`` the residual is clipped at 0 and the identity with the value fails).
FUNCTION_SIGMA_FLOOR = 1e-8


class InferenceProblem:
    """A study with the parameters to estimate, the objective and the solver options.

    Args:
        study: a :class:`Study`.
        parameters: names of the study parameters to estimate (a parameter's name covers all its
            level entries, ``name[member]`` one entry); None estimates every parameter the table
            marks ``estimate=True``. The others stay at their values.
        objective: ``"nll"`` (negative log-likelihood) or ``"chi2"`` (sum of squared weighted
            residuals; needs known sigmas).
        values: linear-scale values overriding the table's nominal values (by parameter or entry
            name), for the fixed parameters and as the nominal point.
        solver: :class:`SolverOptions`.
        window_store: the :class:`~diffsoup.inference.WindowCache` of the window starts of
            multiple-shooting experiments; None uses the shared Zarr store under
            ``DIFFSOUP_CACHE_DIR`` (``ds.store.WindowStore()``), opened only if an experiment
            needs it.

    Experiments carrying a :class:`~diffsoup.inference.Multishoot` add their window starts to
    ``theta`` after the parameters (linear scale, named ``"<experiment id>.window<w>[<state>]"``),
    first guessed by :func:`~diffsoup.inference.prepare_windows`'s path: loaded from the window
    cache, or computed at ``values`` and saved there. Their continuity residuals follow the data
    residuals of each experiment.

    Attributes:
        theta_names: the estimated entries, in the order of the optimizer vector ``theta``
            (each on its parameter's scale), then the window starts.
        n_parameters: how many of ``theta`` are parameters (the rest are window starts).
        window_keys: experiment id -> store key of its window starts.
        lower, upper, nominal: bounds and nominal point of ``theta`` (scaled).
        scale: ``value = scale * ||residuals||^2 + offset``.
        groups: the groups of experiments that share a compiled term.
        row_blocks: the study's rows as the objective reads them, a block of arrays per group
            (``objective._study_rows.RowBlocks``; the same for studies of objects and of arrays).

    Raises:
        ValueError: for an unknown objective or parameter name, nothing to estimate, or
            ``"chi2"`` with an estimated sigma.
    """

    def __init__(
        self,
        study: Study,
        parameters: Sequence[str] | None = None,
        *,
        objective: str = "nll",
        values: Mapping[str, float] | None = None,
        solver: SolverOptions = SolverOptions(),
        window_store: WindowCache | None = None,
    ):
        if not isinstance(study, Study):
            raise TypeError(f"InferenceProblem: study must be a ds.Study, not {type(study).__name__}.")
        if objective not in OBJECTIVES:
            raise ValueError(f"InferenceProblem: objective={objective!r} must be one of {OBJECTIVES}.")
        if not isinstance(solver, SolverOptions):
            raise TypeError("InferenceProblem: solver must be a ds.inference.SolverOptions.")
        self.study = study
        self.objective = objective
        self.solver = solver
        self.scale = 0.5 if objective == "nll" else 1.0
        self.values = entries_by_name(study, values)
        if parameters is None:
            est = [i for i, e in enumerate(study.entries) if e.parameter.estimate]
        else:
            if isinstance(parameters, str):
                raise TypeError("InferenceProblem: parameters= is a sequence of names, not one string.")
            est = []
            for name in parameters:
                if name in study.entry_index:
                    est.append(study.entry_index[name])
                elif name in study.table:
                    est.extend(i for i, e in enumerate(study.entries) if e.parameter.name == name)
                else:
                    raise ValueError(
                        f"InferenceProblem: parameters names unknown study parameter {name!r}; the table has "
                        f"{list(study.table)}."
                    )
            est = sorted(set(est))
            for i in est:
                p = study.entries[i].parameter
                if not (math.isfinite(p.lower) and math.isfinite(p.upper)):
                    raise ValueError(f"InferenceProblem: estimated parameter {p.name!r} needs finite bounds.")
        if not est:
            raise ValueError("InferenceProblem: no parameter to estimate; mark some estimate=True or pass parameters=.")
        self.estimated = np.asarray(est, dtype=np.int64)
        ents = [study.entries[i] for i in est]
        self.theta_names = tuple(e.name for e in ents)
        self.lower = np.array([float(e.parameter.to_scale(e.parameter.lower)) for e in ents])
        self.upper = np.array([float(e.parameter.to_scale(e.parameter.upper)) for e in ents])
        self.nominal = np.array([float(e.parameter.to_scale(self.values[i])) for i, e in zip(est, ents)])
        self._scales = tuple(e.parameter.scale for e in ents)
        # The solves' rtol, raised to what the compute dtype resolves (with a warning, once, here).
        self.rtol = checked_rtol(float(solver.rtol), study.problem.dtype, "InferenceProblem")
        self._check_objective()
        self._windows_init(window_store)
        # The one place that knows how the study holds its rows: from here on, blocks of arrays.
        self.row_blocks = rows = study_rows(study, objective, self.window_offset)
        lows = [study.entries[i].parameter.lower for i in rows.sigma_entries()]
        if rows.has_sigma_functions:
            lows.append(FUNCTION_SIGMA_FLOOR)
        self.sigma_shift = max([1.0] + [1.0 - 2.0 * math.log(lo) for lo in lows])
        self.groups = rows.groups
        self.differing_functions = rows.differing_functions  # kind -> (experiments, distinct functions)
        self._solve_theta: dict = {}  # id(group) -> (group, its solve_theta)
        self.offset = self.offset_of(range(len(study.experiments)))

    def _check_objective(self) -> None:
        if self.objective != "chi2":
            return
        for e in self.study.shape_examples():
            for c in e.noise_columns:
                if not c.least_squares:
                    raise ValueError(
                        f"InferenceProblem: objective='chi2' is a sum of squared normal residuals; experiment {e.id!r} "
                        f"has {type(c).__name__} noise, which has none; use objective='nll'."
                    )
            if e.sigma is None:
                raise ValueError(
                    "InferenceProblem: objective='chi2' with an estimated sigma (noise.sigma a parameter name) or a "
                    f"sigma function (experiment {e.id!r}) has no minimum in sigma; use objective='nll'."
                )

    def offset_of(self, members) -> float:
        """``value = scale * ||r||^2 + offset`` over the experiments ``members`` (study indices):
        the constants of their terms, less ``K / 2`` per measured value whose spread comes from a
        parameter or a function (the shift inside its residual)."""
        members = list(members)
        rows = self.row_blocks
        return rows.constants(members) - 0.5 * self.sigma_shift * rows.dynamic_cells(members)

    # -- multiple shooting -----------------------------------------------------------------------
    def _windows_init(self, window_store: WindowCache | None):
        study = self.study
        n = study.problem.n_states
        self.n_parameters = len(self.theta_names)
        self.window_offset: dict = {}
        self.window_keys: dict = {}
        names, lows, highs, starts = [], [], [], []
        offset = self.n_parameters
        shooting = [study.experiments[i] for i in study.shooting]
        # Single shooting opens no store (a given one is still checked).
        cache = window_cache(window_store) if shooting or window_store is not None else None
        for e in shooting:
            traj = e.trajectory
            traj.scales(n)
            key, s = window_starts(study, self.values, self.solver, e, cache)
            self.window_keys[e.id] = key
            self.window_offset[e.id] = offset
            offset += s.size
            for w in range(s.shape[0]):
                names.extend(f"{e.id}.window{w + 1}[{state}]" for state in study.problem.state_names)
            lows.append(np.full(s.size, float(traj.lower)))
            highs.append(np.full(s.size, float(traj.upper)))
            starts.append(np.clip(s.reshape(-1), traj.lower, traj.upper))
        if names:
            self.theta_names = self.theta_names + tuple(names)
            self.lower = np.concatenate([self.lower, *lows])
            self.upper = np.concatenate([self.upper, *highs])
            self.nominal = np.concatenate([self.nominal, *starts])

    def window_values(self, theta) -> dict:
        """Window starts of each multiple-shooting experiment at ``theta``: id -> ``(W-1, n)``."""
        theta = np.asarray(theta, dtype=np.float64)
        n = self.study.problem.n_states
        out = {}
        if not self.window_offset:
            return out
        for e in self.study.experiments:
            if e.id in self.window_offset:
                o = self.window_offset[e.id]
                W = e.trajectory.n_windows
                out[e.id] = theta[o : o + (W - 1) * n].reshape(W - 1, n).copy()
        return out

    # -- parameters -----------------------------------------------------------------------------
    @property
    def n_theta(self) -> int:
        return len(self.theta_names)

    def theta_of(self, values: Mapping[str, float]) -> np.ndarray:
        """``theta`` (scaled) from linear values by entry or parameter name; the others nominal.

        Raises:
            ValueError: for a name that is not an estimated entry or parameter.
        """
        out = self.nominal.copy()
        for name, v in values.items():
            hits = [j for j, i in enumerate(self.estimated)
                    if name in (self.study.entries[i].name, self.study.entries[i].parameter.name)]  # fmt: skip
            if not hits:
                raise ValueError(f"theta_of: {name!r} is not an estimated parameter; theta is {list(self.theta_names)}.")
            for j in hits:
                out[j] = float(self.study.entries[self.estimated[j]].parameter.to_scale(v))
        return out

    def parameter_values(self, theta) -> dict:
        """Linear values of the estimated entries, by name (window starts: :meth:`window_values`)."""
        theta = np.asarray(theta, dtype=np.float64)
        return {n: float(self.study.entries[i].parameter.from_scale(t))
                for n, i, t in zip(self.theta_names, self.estimated, theta)}  # fmt: skip

    def full_vector(self, theta):
        """All entries' linear values as a JAX vector (traceable in ``theta``)."""
        return full_vector(self.estimated, self._scales, self.values, theta)

    def pack(self, group: Group, order: Sequence[int]) -> LaneInputs:
        """The :class:`LaneInputs` of the experiments ``order`` (study indices; -1 = padding lane) of one group."""
        return self.row_blocks.pack(group, order)

    # -- the per-experiment terms (JAX) ----------------------------------------------------------
    def terms(self, group: Group) -> LaneTerms:
        """The static part of ``group``'s per-experiment term (what its chunk programs compile from)."""
        return LaneTerms(self.study.problem, group, self.scale, tuple(int(i) for i in self.estimated),
                         self._scales, int(self.solver.checkpoints), (self.n_theta, len(self.values)),
                         self.solve_theta(group))  # fmt: skip

    def solve_theta(self, group: Group) -> tuple[int, ...]:
        """The entries of ``theta`` that reach the solves of ``group``'s experiments, in order: the
        estimated entries their model parameters, initial states and pre-equilibrations take (a
        ``y0``, event or reset function reads the model parameters), and their window starts.
        The rest (offsets, scalings, spreads) enter only the observation, so forward
        sensitivities need no tangent through the solves for them. Taken over all the group's
        members, so that a lowered study restricted to some of them compiles the same programs."""
        key = id(group)
        if key not in self._solve_theta:
            self._solve_theta[key] = (group, self._solve_theta_of(group))
        return self._solve_theta[key][1]

    def _solve_theta_of(self, group: Group) -> tuple[int, ...]:
        entries, windows = self.row_blocks.solve_entries(group)
        parameters = [j for j, i in enumerate(self.estimated) if int(i) in entries]
        return tuple(sorted(set(parameters) | set(windows)))

    def operands(self) -> TermOperands:
        """The numbers the chunk programs take as arguments (numpy)."""
        return TermOperands(
            values=np.asarray(self.values, dtype=np.float64), sigma_shift=np.float64(self.sigma_shift),
            rtol=np.float64(self.rtol), atol=np.float64(self.solver.atol), max_steps=np.int32(self.solver.max_steps),
        )  # fmt: skip

    def states(self, group: Group, full, a: LaneInputs, theta=None, *, forward: bool = True):
        """One experiment's states (:meth:`LaneTerms.states` with this problem's operands)."""
        return self.terms(group).states(self.operands(), full, a, theta, forward=forward)

    def trajectories(self, theta) -> dict:
        """States at the measurement times at ``theta``: experiment id -> ``(m, n)`` (numpy).

        Multiple-shooting experiments are predicted window by window, from their window starts in
        ``theta``, as in the objective. (The ``"states"`` of :meth:`predict`.)
        """
        return {eid: p["states"] for eid, p in self.predict(theta).items()}

    def observe(self, group: Group, full, a: LaneInputs, ys):
        """The observables ``(m, k)`` of one experiment's states ``ys`` (:meth:`LaneTerms.observe`)."""
        return self.terms(group).observe(full, a, ys)

    def _predicted_chunks(self, group: Group, theta, points: int = 0):
        """``(rows, states, observables, status, curve_times, curve)`` of the group's experiments,
        ``PREDICT_LANES`` at a time (a last, shorter chunk is padded: one program shape).

        With curves, the measurement times and the curve's times are both padded to the longer of
        the two with their last time (a repeated output time takes no step, so the values at the
        measurement times are those of an unpadded solve): one program runs both, compiled once."""
        ops = self.operands()
        run = _prediction_program()
        terms = self.terms(group)
        members = member_array(group.members)
        lanes = min(PREDICT_LANES, members.size)
        curves = points > 0 and not group.windows
        for a in range(0, members.size, lanes):
            rows = members[a : a + lanes]
            order = np.full(lanes, -1, dtype=np.int64)
            order[: rows.size] = rows
            arrs = self.pack(group, order)
            m = arrs.times.shape[1]
            width = max(m, points) if curves else m
            ys, hs, status = jax.device_get(run(terms, theta, ops, arrs._replace(times=_pad_last(arrs.times, width))))
            ys, hs = ys[:, :m], hs[:, :m]
            curve_t = curve = None
            if curves:
                # From t0 to the last finite time (+inf times are the steady state, not on the curve).
                finite = np.where(np.isfinite(arrs.times), arrs.times, arrs.t0[:, None])
                span = np.max(finite, axis=1, keepdims=True) - arrs.t0[:, None]
                curve_t = arrs.t0[:, None] + span * np.linspace(0.0, 1.0, points)[None, :]
                _, curve, _ = jax.device_get(run(terms, theta, ops, arrs._replace(times=_pad_last(curve_t, width))))
                curve_t, curve = curve_t[: rows.size], curve[: rows.size, :points]
            yield rows, ys[: rows.size], hs[: rows.size], status[: rows.size], curve_t, curve

    def predict(self, theta, *, points: int = 0) -> dict:
        """What the model says at ``theta``, experiment by experiment (for results and plots).

        Args:
            theta: the point (scaled coordinates).
            points: with ``points > 0``, also each single-shooting experiment's observables on
                ``points`` evenly spaced times from ``t0`` to its last measurement (smooth curves).

        Returns:
            id -> ``{"times" (m,), "states" (m, n), "observables" (m, k), "status" (int: a
            ``ds.Status`` code)[, "curve_times" (points,), "curve" (points, k)]}``; the values of a
            failed solve are NaN. (:meth:`predict_arrays` gives the same numbers as arrays with an
            experiment axis.)
        """
        theta = np.asarray(theta, dtype=np.float64)
        ids = self.study.ids
        out = {}
        for group in self.groups:
            for rows, ys, hs, status, curve_t, curve in self._predicted_chunks(group, theta, points):
                for lane, i in enumerate(rows.tolist()):
                    times = self.study.times_of(i)
                    m = times.shape[0]
                    failed = int(status[lane]) != 0
                    rec = {"times": np.array(times, dtype=np.float64), "states": np.array(ys[lane, :m], dtype=np.float64),
                           "observables": np.array(hs[lane, :m], dtype=np.float64), "status": int(status[lane])}  # fmt: skip
                    if curve is not None:
                        rec["curve_times"] = np.array(curve_t[lane], dtype=np.float64)
                        rec["curve"] = np.array(curve[lane], dtype=np.float64)
                    if failed:
                        for key in ("states", "observables", "curve"):
                            if key in rec:
                                rec[key][:] = np.nan
                    out[ids[i]] = rec
        return out

    def predict_arrays(self, theta) -> dict:
        """:meth:`predict` as arrays with an experiment axis: ``states`` ``(E, m, n)``,
        ``observables`` ``(E, m, k)`` (``m``, ``k``: the most times and observables of an
        experiment; NaN for a failed solve, at padded times and past an experiment's
        observables), ``status`` ``(E,)``."""
        study = self.study
        theta = np.asarray(theta, dtype=np.float64)
        E, m, k = len(study), study.rows.times.shape[1], study.n_observables
        states = np.full((E, m, study.problem.n_states), np.nan)
        observables = np.full((E, m, k), np.nan)
        status = np.zeros(E, dtype=np.int32)
        for group in self.groups:
            for rows, ys, hs, st, _, _ in self._predicted_chunks(group, theta):
                ok = np.asarray(st) == 0
                states[rows[ok], : ys.shape[1]] = ys[ok]
                observables[rows[ok], : hs.shape[1], : hs.shape[2]] = hs[ok]
                status[rows] = st
        padded = np.arange(m)[None, :] >= study.rows.n_times[:, None]
        states[padded] = np.nan
        observables[padded] = np.nan
        return {"states": states, "observables": observables, "status": status}

    def lane(self, group: Group, full, a: LaneInputs, *, forward: bool, residuals: bool, theta=None):
        """One experiment's term (:meth:`LaneTerms.lane` with this problem's operands)."""
        return self.terms(group).lane(self.operands(), full, a, forward=forward, residuals=residuals, theta=theta)

    def __repr__(self) -> str:
        return f"InferenceProblem({self.study!r}, objective={self.objective!r}, theta={list(self.theta_names)})"


def _pad_last(times: np.ndarray, width: int) -> np.ndarray:
    """``(L, m)`` times padded to ``(L, width)`` with each row's last time."""
    return np.concatenate([times, np.repeat(times[:, -1:], width - times.shape[1], axis=1)], axis=1)


@functools.cache
def _prediction_program():
    """``(terms, theta, operands, arrays) -> (states, observables, status)`` of a group's
    experiments, jitted once per :class:`LaneTerms` and shapes (theta and the operands are
    arguments: predictions at new points compile nothing)."""
    def run(terms: LaneTerms, theta, ops: TermOperands, arrs):
        full = terms.full_vector(theta, ops)

        def one(a):
            ys, status, _, _ = terms.states(ops, full, a, theta, forward=True)
            return ys, terms.observe(full, a, ys), status

        return jax.vmap(one)(arrs)

    return jax.jit(run, static_argnums=(0,))
