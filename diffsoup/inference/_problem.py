"""``ds.inference.InferenceProblem``: a study, the parameters to estimate, the objective and solver options.

It turns the study into arrays (one row per experiment, grouped by the shapes that can be
vmapped together) and defines the per-experiment terms the lowered objective sums:

- Gaussian noise: ``r = (h - d) / sigma``; log-normal: ``r = (log h - log d) / sigma``.
- ``objective="nll"``: ``value = sum(0.5 r^2 + log sigma) + N/2 log(2 pi) (+ sum log d, log-normal)``.
- ``objective="chi2"``: ``value = sum(r^2)`` (known sigma only).

Residuals for Gauss-Newton are the ``r`` above, plus, for an estimated sigma under ``"nll"``, one
more residual per measured value, ``sqrt(2 log sigma + K)``, so that ``value = scale * ||r||^2 +
offset`` exactly (``scale`` 0.5 for ``"nll"``, 1 for ``"chi2"``; ``K`` makes the root real over
the sigma parameter's bounds: ``K = 1 - 2 log(lower)`` at least, see ``sigma_shift``).

A multiple-shooting experiment (``Experiment.trajectory`` a ``Multishoot``) is solved window by
window from its fitted window starts (extra entries of ``theta``); its continuity residuals
``c = weight * (y_w(end) - s_{w+1}) / state_scale`` follow its other residuals and enter the value
as ``scale * sum(c^2)``, so the identity above still holds.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from ..integrate._tolerance import checked_rtol
from ._experiment import LogNormal
from ._multishoot import trajectory_signature, window_layout
from ._solver_options import SolverOptions
from ._study import Study, entries_by_name
from ._window_cache import WindowCache, window_cache
from ._windows import window_starts

OBJECTIVES = ("nll", "chi2")


@dataclasses.dataclass(frozen=True)
class Group:
    """Experiments that share observables, noise model and observable count (vmapped together)."""

    observables: Any
    lognormal: bool
    estimated_sigma: bool
    k: int
    n_times: int
    members: tuple  # indices into study.experiments
    windows: int | None = None  # multiple shooting: windows per experiment (None: single shooting)
    window_points: int = 0  # most output times of a window (its measurements and its end)
    n_states: int = 0

    @property
    def n_residuals(self) -> int:
        """Residuals per experiment (data, estimated-sigma terms, continuity of the windows)."""
        cont = (self.windows - 1) * self.n_states if self.windows else 0
        return self.n_times * self.k * (2 if self.estimated_sigma else 1) + cont


class TermOperands(NamedTuple):
    """The numbers of the per-experiment terms that are operands of the compiled chunk programs
    (numpy on the host, traced inside a program): another tolerance, step budget or fixed
    parameter value runs the same program with other arguments.

    Attributes:
        values: linear values of every study entry ``(n_entries,)`` (the fixed ones and the nominal
            point; the estimated entries are overwritten from ``theta``).
        sigma_shift: the ``K`` of the estimated-sigma residuals.
        rtol, atol, max_steps: the solves' ``SolverOptions`` (``rtol`` after
            :class:`~diffsoup.integrate.ToleranceWarning`'s floor).
    """

    values: Any
    sigma_shift: Any
    rtol: Any
    atol: Any
    max_steps: Any


def full_vector(estimated, scales, values, theta):
    """Every study entry's linear value, a JAX vector: ``values`` with the estimated entries (study
    indices ``estimated``, on ``scales``) taken from ``theta``."""
    import jax.numpy as jnp

    theta = jnp.asarray(theta)
    full = jnp.asarray(values).astype(theta.dtype)
    est = np.asarray(estimated, dtype=np.int64)
    for s, fn in (("lin", lambda x: x), ("log", jnp.exp), ("log10", lambda x: 10.0**x)):
        pos = np.array([j for j, sc in enumerate(scales) if sc == s], dtype=np.int64)
        if pos.size:
            full = full.at[est[pos]].set(fn(theta[pos]))
    return full


@dataclasses.dataclass(frozen=True)
class LaneTerms:
    """The static part of one group's per-experiment term: everything a chunk program is
    compiled from besides its kind, lane count and mesh (hashable; the problem and the
    observables compare by identity).

    The JAX code of the terms reads only these fields and the :class:`TermOperands` passed to
    it, so equal terms make equal programs: that is what lets ``ds.lower`` reuse a compiled
    program for another inference problem of the same study (other tolerances, step budget or
    fixed values).

    Attributes:
        problem: the built ``ds.Problem``.
        group: the :class:`Group` (observables, noise, shapes).
        scale: the objective's ``scale`` (0.5 for ``"nll"``, 1 for ``"chi2"``).
        estimated: study entry indices of the estimated parameters, in ``theta`` order.
        scales: their scales (``"lin"``, ``"log"``, ``"log10"``).
        checkpoints: records per level of the checkpointed adjoint (sizes its buffers).
    """

    problem: Any
    group: Group
    scale: float
    estimated: tuple
    scales: tuple
    checkpoints: int

    def full_vector(self, theta, ops: TermOperands):
        """All entries' linear values as a JAX vector (traceable in ``theta`` and ``ops``)."""
        return full_vector(self.estimated, self.scales, ops.values, theta)

    def states(self, ops: TermOperands, full, a: dict, theta=None, *, forward: bool = True):
        """One experiment's states at its measurement times ``(m, n)``, its status and steps, and
        (multiple shooting) its continuity residuals ``(W-1, n)`` (else None)."""
        import jax
        import jax.numpy as jnp

        from ..integrate import CheckpointAdjoint, ForwardMode, simulate

        problem, group = self.problem, self.group
        pv = jnp.where(a["p_entry"] >= 0, full[jnp.maximum(a["p_entry"], 0)], a["p_fixed"])
        adjoint = ForwardMode() if forward else CheckpointAdjoint(self.checkpoints)

        def solve(y0, times, t0):
            return simulate(problem, y0, times, pv, t0=t0, rtol=ops.rtol, atol=ops.atol,
                            max_steps=ops.max_steps, adjoint=adjoint, throw=False)  # fmt: skip

        if not group.windows:
            sol = solve(a["y0"], a["times"], a["t0"])
            return sol.ys, sol.status, sol.stats["n_steps"], None
        if theta is None:
            raise ValueError("InferenceProblem.states: a multiple-shooting group needs theta (the window starts).")
        starts = jnp.asarray(theta)[a["win_idx"]]
        y0s = jnp.concatenate([a["y0"][None].astype(starts.dtype), starts], axis=0)
        sol = jax.vmap(solve)(y0s, a["win_times"], a["win_t0"])
        ys = sol.ys[a["win_of"], a["win_pos"]]
        cont = (sol.ys[:-1, -1] - starts) * a["cont_w"][None, :]
        return ys, jnp.max(sol.status), jnp.sum(sol.stats["n_steps"]), cont

    def observe(self, full, a: dict, ys):
        """The observables ``(m, k)`` of one experiment's states ``ys`` (the states themselves when
        the group observes every state)."""
        import jax
        import jax.numpy as jnp

        if self.group.observables is None:
            return ys
        pv = jnp.where(a["p_entry"] >= 0, full[jnp.maximum(a["p_entry"], 0)], a["p_fixed"])
        pdict = self.problem.params_dict(pv)
        return jax.vmap(lambda y: jnp.asarray(self.group.observables(y, pdict), ys.dtype))(ys)

    def lane(self, ops: TermOperands, full, a: dict, *, forward: bool, residuals: bool, theta=None):
        """One experiment: ``(value or residuals, status, n_steps)``, NaN where the solve failed, 0 on padding."""
        import jax.numpy as jnp

        group = self.group
        ys, status, n_steps, cont = self.states(ops, full, a, theta, forward=forward)
        h = self.observe(full, a, ys)
        mask = a["mask"]
        if group.estimated_sigma:
            sigma = jnp.broadcast_to(full[a["sigma_entry"]], mask.shape)
        else:
            sigma = a["sigma"]
        if group.lognormal:
            pred = jnp.log(jnp.maximum(h, jnp.finfo(h.dtype).tiny))
            meas = jnp.log(a["data"])
        else:
            pred, meas = h, a["data"]
        r = jnp.where(mask, (pred - meas) / sigma, 0.0)
        ok = status == 0
        bad = jnp.asarray(jnp.nan, r.dtype)
        if residuals:
            parts = [r.reshape(-1)]
            if group.estimated_sigma:
                safe = jnp.where(mask, 2.0 * jnp.log(sigma) + ops.sigma_shift, 1.0)
                parts.append(jnp.where(mask, jnp.sqrt(safe), 0.0).reshape(-1))
            if cont is not None:
                parts.append(cont.reshape(-1).astype(r.dtype))
            out = jnp.concatenate(parts)
            out = jnp.where(a["valid"], jnp.where(ok, out, bad), 0.0)
        else:
            v = self.scale * jnp.sum(r * r) + a["const"]
            if group.estimated_sigma:
                v = v + jnp.sum(jnp.where(mask, jnp.log(sigma), 0.0))
            if cont is not None:
                v = v + self.scale * jnp.sum(cont * cont)
            out = jnp.where(a["valid"], jnp.where(ok, v, bad), 0.0)
        return out, status, n_steps


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
        sigma_entries = {r["sigma_entry"] for r in study.resolved.values() if r["sigma_entry"] >= 0}
        if sigma_entries and objective == "chi2":
            raise ValueError(
                "InferenceProblem: objective='chi2' with an estimated sigma (noise.sigma a parameter name) has no "
                "minimum in sigma; use objective='nll'."
            )
        lows = [study.entries[i].parameter.lower for i in sigma_entries]
        self.sigma_shift = max([1.0] + [1.0 - 2.0 * math.log(lo) for lo in lows])
        self._windows_init(window_store)
        self.groups = self._group()
        self.offset = float(sum(self._constant(e) for e in study.experiments)) - 0.5 * self.sigma_shift * sum(
            e.n_measured for e in study.experiments if isinstance(e.noise.sigma, str)
        )

    # -- multiple shooting -----------------------------------------------------------------------
    def _windows_init(self, window_store: WindowCache | None):
        study = self.study
        n = study.problem.n_states
        self.n_parameters = len(self.theta_names)
        self.window_offset: dict = {}
        self.window_keys: dict = {}
        names, lows, highs, starts = [], [], [], []
        offset = self.n_parameters
        shooting = [e for e in study.experiments if e.trajectory is not None]
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

    # -- packing --------------------------------------------------------------------------------
    def _group(self) -> tuple[Group, ...]:
        keys: dict = {}
        for i, e in enumerate(self.study.experiments):
            key = (id(e.observables) if e.observables is not None else None, isinstance(e.noise, LogNormal),
                   isinstance(e.noise.sigma, str), e.n_observables, trajectory_signature(e.trajectory))  # fmt: skip
            keys.setdefault(key, []).append(i)
        out = []
        n = self.study.problem.n_states
        for (_, logn, est, k, (windows,)), members in keys.items():
            exps = [self.study.experiments[i] for i in members]
            points = max(window_layout(e, e.trajectory)[3].shape[1] for e in exps) if windows else 0
            out.append(Group(exps[0].observables, logn, est, k, max(e.times.shape[0] for e in exps), tuple(members),
                             windows, points, n if windows else 0))  # fmt: skip
        return tuple(out)

    def _constant(self, e) -> float:
        if self.objective == "chi2":
            return 0.0
        mask = np.isfinite(e.data)
        c = 0.5 * math.log(2 * math.pi) * e.n_measured
        if e.sigma is not None:
            c += float(np.sum(np.log(e.sigma[mask])))
        if isinstance(e.noise, LogNormal):
            c += float(np.sum(np.log(e.data[mask])))
        return c

    def pack(self, group: Group, order: Sequence[int]) -> dict:
        """Arrays of the experiments ``order`` (study indices; -1 = padding lane) of one group."""
        study = self.study
        n_lanes, m, k = len(order), group.n_times, group.k
        pad_source = group.members[0]
        n_par = len(study.problem.parameter_names)
        arr = {
            "times": np.zeros((n_lanes, m)), "t0": np.zeros(n_lanes), "data": np.ones((n_lanes, m, k)),
            "mask": np.zeros((n_lanes, m, k), dtype=bool), "sigma": np.ones((n_lanes, m, k)),
            "sigma_entry": np.zeros(n_lanes, dtype=np.int32), "y0": np.zeros((n_lanes, study.problem.n_states)),
            "p_entry": np.full((n_lanes, n_par), -1, dtype=np.int32), "p_fixed": np.zeros((n_lanes, n_par)),
            "const": np.zeros(n_lanes), "valid": np.zeros(n_lanes, dtype=bool),
        }  # fmt: skip
        W, P, n = group.windows, group.window_points, study.problem.n_states
        if W:
            arr.update({
                "win_t0": np.zeros((n_lanes, W)), "win_times": np.zeros((n_lanes, W, P)),
                "win_of": np.zeros((n_lanes, m), dtype=np.int32), "win_pos": np.zeros((n_lanes, m), dtype=np.int32),
                "win_idx": np.zeros((n_lanes, W - 1, n), dtype=np.int32), "cont_w": np.zeros((n_lanes, n)),
            })  # fmt: skip
        for lane, idx in enumerate(order):
            real = idx >= 0
            e = study.experiments[idx if real else pad_source]
            r = study.resolved[e.id]
            mi = e.times.shape[0]
            arr["times"][lane, :mi] = e.times
            arr["times"][lane, mi:] = e.times[-1]
            arr["t0"][lane] = e.t0
            if real:
                fin = np.isfinite(e.data)
                arr["mask"][lane, :mi] = fin
                arr["data"][lane, :mi] = np.where(fin, e.data, 1.0)
                arr["const"][lane] = self._constant(e)
                arr["valid"][lane] = True
            if e.sigma is not None:
                arr["sigma"][lane, :mi] = e.sigma
            arr["sigma_entry"][lane] = max(r["sigma_entry"], 0)
            arr["y0"][lane] = r["y0"]
            if W:
                edges, wof, pos, wt = window_layout(e, e.trajectory)
                arr["win_t0"][lane] = edges[:-1]
                arr["win_times"][lane] = wt[:, -1:]
                arr["win_times"][lane, :, : wt.shape[1]] = wt
                arr["win_of"][lane, :mi] = wof
                arr["win_pos"][lane, :mi] = pos
                o = self.window_offset[e.id]
                arr["win_idx"][lane] = np.arange(o, o + (W - 1) * n).reshape(W - 1, n)
                arr["cont_w"][lane] = e.trajectory.continuity_weight / e.trajectory.scales(n)
            for j, (kind, v) in enumerate(r["plan"]):
                if kind == "entry":
                    arr["p_entry"][lane, j] = v
                else:
                    arr["p_fixed"][lane, j] = v
        return arr

    # -- the per-experiment terms (JAX) ----------------------------------------------------------
    def terms(self, group: Group) -> LaneTerms:
        """The static part of ``group``'s per-experiment term (what its chunk programs compile from)."""
        return LaneTerms(self.study.problem, group, self.scale, tuple(int(i) for i in self.estimated),
                         self._scales, int(self.solver.checkpoints))  # fmt: skip

    def operands(self) -> TermOperands:
        """The numbers the chunk programs take as arguments (numpy)."""
        return TermOperands(
            values=np.asarray(self.values, dtype=np.float64), sigma_shift=np.float64(self.sigma_shift),
            rtol=np.float64(self.rtol), atol=np.float64(self.solver.atol), max_steps=np.int32(self.solver.max_steps),
        )  # fmt: skip

    def states(self, group: Group, full, a: dict, theta=None, *, forward: bool = True):
        """One experiment's states (:meth:`LaneTerms.states` with this problem's operands)."""
        return self.terms(group).states(self.operands(), full, a, theta, forward=forward)

    def trajectories(self, theta) -> dict:
        """States at the measurement times at ``theta``: experiment id -> ``(m, n)`` (numpy).

        Multiple-shooting experiments are predicted window by window, from their window starts in
        ``theta``, as in the objective. (The ``"states"`` of :meth:`predict`.)
        """
        return {eid: p["states"] for eid, p in self.predict(theta).items()}

    def observe(self, group: Group, full, a: dict, ys):
        """The observables ``(m, k)`` of one experiment's states ``ys`` (:meth:`LaneTerms.observe`)."""
        return self.terms(group).observe(full, a, ys)

    def predict(self, theta, *, points: int = 0) -> dict:
        """What the model says at ``theta``, experiment by experiment (for results and plots).

        Args:
            theta: the point (scaled coordinates).
            points: with ``points > 0``, also each single-shooting experiment's observables on
                ``points`` evenly spaced times from ``t0`` to its last measurement (smooth curves).

        Returns:
            id -> ``{"times" (m,), "states" (m, n), "observables" (m, k), "status" (int: a
            ``ds.Status`` code)[, "curve_times" (points,), "curve" (points, k)]}``; the values of a
            failed solve are NaN.
        """
        import jax

        theta = np.asarray(theta, dtype=np.float64)
        ops = self.operands()
        run = _prediction_program()
        out = {}
        for group in self.groups:
            arrs = self.pack(group, list(group.members))
            terms = self.terms(group)
            ys, hs, status = jax.device_get(run(terms, theta, ops, arrs))
            curve_t = curve = None
            if points > 0 and not group.windows:
                span = arrs["times"][:, -1:] - arrs["t0"][:, None]
                dense = dict(arrs, times=arrs["t0"][:, None] + span * np.linspace(0.0, 1.0, points)[None, :])
                _, curve, _ = jax.device_get(run(terms, theta, ops, dense))
                curve_t = dense["times"]
            for lane, i in enumerate(group.members):
                e = self.study.experiments[i]
                m = e.times.shape[0]
                failed = int(status[lane]) != 0
                rec = {"times": e.times.copy(), "states": np.array(ys[lane, :m], dtype=np.float64),
                       "observables": np.array(hs[lane, :m], dtype=np.float64), "status": int(status[lane])}  # fmt: skip
                if curve is not None:
                    rec["curve_times"] = np.array(curve_t[lane], dtype=np.float64)
                    rec["curve"] = np.array(curve[lane], dtype=np.float64)
                if failed:
                    for key in ("states", "observables", "curve"):
                        if key in rec:
                            rec[key][:] = np.nan
                out[e.id] = rec
        return out

    def lane(self, group: Group, full, a: dict, *, forward: bool, residuals: bool, theta=None):
        """One experiment's term (:meth:`LaneTerms.lane` with this problem's operands)."""
        return self.terms(group).lane(self.operands(), full, a, forward=forward, residuals=residuals, theta=theta)

    def __repr__(self) -> str:
        return f"InferenceProblem({self.study!r}, objective={self.objective!r}, theta={list(self.theta_names)})"


@functools.cache
def _prediction_program():
    """``(terms, theta, operands, arrays) -> (states, observables, status)`` of a group's
    experiments, jitted once per :class:`LaneTerms` and shapes (theta and the operands are
    arguments: predictions at new points compile nothing)."""
    import jax

    def run(terms: LaneTerms, theta, ops: TermOperands, arrs):
        full = terms.full_vector(theta, ops)

        def one(a):
            ys, status, _, _ = terms.states(ops, full, a, theta, forward=True)
            return ys, terms.observe(full, a, ys), status

        return jax.vmap(one)(arrs)

    return jax.jit(run, static_argnums=(0,))
