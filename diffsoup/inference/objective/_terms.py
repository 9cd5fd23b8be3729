"""The per-experiment term of an objective: solve, observe, compare with the data under the noise model.

A :class:`Group` is the static description of experiments that are vmapped together (what their
compiled program depends on: observables, noise kinds per column, which numbers come from
parameters, callables, counts); :class:`LaneTerms` holds the JAX code of one experiment's term,
which reads only its static fields, the :class:`TermOperands` and the experiment's packed
inputs (``a``, one lane of the :class:`~diffsoup.inference.objective._lane_inputs.LaneInputs` of
:meth:`InferenceProblem.pack`, read by field). Numbers (fixed values, per-cell spreads, times) are
in those arrays, so other numbers compile nothing.

Per measured value with observable ``h``, datum ``d``, spread ``s`` (``sigma`` or ``scale``), its
column's noise model (a law: :class:`~diffsoup.inference.AbstractNoise`, whose methods carry the
maths) and comparison scale ``T = law.transform``, ``z = (T(h) - T(d)) / s``:
``nll = law.penalty(z) + law.spread_nll(s) + constants`` and the residual is ``law.residual(z)``
(normal: ``0.5 z^2``, residual ``z``; Laplace: ``|z|``, residual ``sqrt(2 |z|)``, not smooth at 0).
Columns of different laws are computed by each law and joined by ``where``; least-squares laws
(:attr:`~diffsoup.inference.AbstractNoise.least_squares`) enter the value as ``scale * r^2``.

The constants (and ``log s`` of known spreads) are summed on the host (``const``); a spread that
comes from a parameter or a function adds ``spread_nll(s) = log s`` in the program and, among the
residuals, one more per measured value, ``sqrt(2 log s + K)``, so that ``value = scale * ||r||^2 +
offset``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ...integrate import CheckpointAdjoint, ForwardMode, Reset, simulate
from ...integrate._steady_state_derivative import steady_state_with_derivatives
from ..study._noise import SIGMA_CELLS, SIGMA_ENTRY, SIGMA_FIXED
from ._lane_inputs import LaneInputs


def member_array(members) -> np.ndarray:
    """Study indices as an int64 array (a ``range``, a group of a study of arrays, without a loop)."""
    if isinstance(members, range):
        return np.arange(members.start, members.stop, members.step, dtype=np.int64)
    return np.asarray(members, dtype=np.int64)


@dataclasses.dataclass(frozen=True)
class Preequilibrated:
    """The static part of a group's pre-equilibration: its ``y0`` callable (or None), whether its
    ``y0`` names estimated entries, and the ``SteadyState`` test."""

    y0_function: Any
    y0_entries: bool
    steady_state: Any


@dataclasses.dataclass(frozen=True)
class Group:
    """Experiments vmapped together: everything their compiled term depends on besides numbers.

    Attributes:
        observables: the observables function (None: every state).
        noise: per observable column the noise model's :class:`~diffsoup.inference.study._noise.NoiseKind`.
        sigma: how spreads come from parameters: ``"fixed"`` (none do), ``"entry"`` (one study
            entry for the whole experiment) or ``"cells"`` (an entry per cell where named).
        k: observables; n_times: measurement times (padded); members: study indices.
        windows, window_points, n_states: multiple shooting (None, 0, 0 for single shooting).
        observables_take_time: ``observables(t, y, p)`` rather than ``observables(y, p)``.
        observable_parameters: the names added to ``p`` for the observables and spreads.
        sigma_functions: per column the spread callable (None: not a callable); ``()`` if none.
        y0_function: the ``y0(p)`` callable, or None; y0_entries: ``y0`` names estimated entries.
        preequilibration: a :class:`Preequilibrated`, or None.
        resets: per reset ``(time callable or None, apply)``.
        discontinuities: their most in an experiment (numbers in the arrays, padded with +inf) or
            the callable.
        steady_state: the ``SteadyState`` test of ``+inf`` times, or None when there are none.
    """

    observables: Any
    noise: tuple
    sigma: str
    k: int
    n_times: int
    # Indices into study.experiments (a range for a study held as arrays); not part of what the
    # group's programs compile from, so groups of the same shape share their programs.
    members: tuple = dataclasses.field(compare=False)
    windows: int | None = None  # multiple shooting: windows per experiment (None: single shooting)
    window_points: int = 0  # most output times of a window (its measurements and its end)
    n_states: int = 0
    observables_take_time: bool = False
    observable_parameters: tuple = ()
    sigma_functions: tuple = ()
    y0_function: Any = None
    y0_entries: bool = False
    preequilibration: Preequilibrated | None = None
    resets: tuple = ()
    discontinuities: Any = 0
    steady_state: Any = None

    @property
    def dynamic_sigma(self) -> bool:
        """Some spreads come from parameters or functions (an ``nll`` term and residuals of their own)."""
        return self.sigma != SIGMA_FIXED or any(f is not None for f in self.sigma_functions)

    @property
    def estimated_sigma(self) -> bool:
        return self.dynamic_sigma

    @property
    def lognormal(self) -> bool:
        """Every column is compared on a log scale."""
        return all(kind.law().log_base is not None for kind in self.noise)

    @property
    def n_residuals(self) -> int:
        """Residuals per experiment (data, estimated-sigma terms, continuity of the windows)."""
        cont = (self.windows - 1) * self.n_states if self.windows else 0
        return self.n_times * self.k * (2 if self.dynamic_sigma else 1) + cont


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
    theta = jnp.asarray(theta)
    full = jnp.asarray(values).astype(theta.dtype)
    est = np.asarray(estimated, dtype=np.int64)
    for s, fn in (("lin", lambda x: x), ("log", jnp.exp), ("log10", lambda x: 10.0**x)):
        pos = np.array([j for j, sc in enumerate(scales) if sc == s], dtype=np.int64)
        if pos.size:
            full = full.at[est[pos]].set(fn(theta[pos]))
    return full


def _gather(full, entry, fixed):
    """``full[entry]`` where ``entry >= 0``, else ``fixed``."""
    return jnp.where(entry >= 0, full[jnp.maximum(entry, 0)], fixed)


@dataclasses.dataclass(frozen=True)
class LaneTerms:
    """The static part of one group's per-experiment term: everything a chunk program is
    compiled from besides its kind, lane count and mesh (hashable; the problem and the
    callables compare by identity).

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
        shapes: the lengths of ``theta`` (window starts included) and of the entries' values: the
            programs' argument shapes besides the packed arrays (which the group's fields fix).
        solve_theta: the entries of ``theta`` that reach the group's solves (model parameters,
            initial states, pre-equilibration, window starts), in order; forward sensitivities
            carry tangents through the solves for these alone (None: all of ``theta``).
    """

    problem: Any
    group: Group
    scale: float
    estimated: tuple
    scales: tuple
    checkpoints: int
    shapes: tuple = ()
    solve_theta: tuple | None = None

    def full_vector(self, theta, ops: TermOperands):
        """All entries' linear values as a JAX vector (traceable in ``theta`` and ``ops``)."""
        return full_vector(self.estimated, self.scales, ops.values, theta)

    # -- parameters and initial state ------------------------------------------------------------
    def model_parameters(self, full, a: LaneInputs):
        """The experiment's model parameter vector (``parameter_names`` order)."""
        return _gather(full, a.p_entry, a.p_fixed)

    def parameter_dict(self, full, a: LaneInputs, pv=None) -> dict:
        """Model and observable parameters by name (the ``p`` of observables and spreads)."""
        pdict = self.problem.params_dict(self.model_parameters(full, a) if pv is None else pv)
        if self.group.observable_parameters:
            ov = _gather(full, a.op_entry, a.op_fixed)
            pdict.update({name: ov[i] for i, name in enumerate(self.group.observable_parameters)})
        return pdict

    def _initial(self, full, pv, function, y0, y0_entry):
        """An initial state: ``function(p)``, else ``y0`` with the estimated entries ``y0_entry``
        (None: none) taken from ``full``."""
        dtype = self.problem.dtype
        if function is not None:
            return jnp.asarray(function(self.problem.params_dict(pv))).astype(dtype)
        if y0_entry is not None:
            return _gather(full, y0_entry, y0)
        return y0

    def initial_state(self, ops: TermOperands, full, a: LaneInputs, pv, adjoint):
        """The state the experiment's solve starts from: its ``y0``, or (pre-equilibration) the
        steady state under the pre-equilibration's parameters with ``y0``'s states re-set;
        returns ``(y0, status, steps)`` (status and steps of the pre-equilibration, else 0)."""
        group = self.group
        pre = group.preequilibration
        y0 = self._initial(full, pv, group.y0_function, a.y0, a.y0_entry if group.y0_entries else None)
        if pre is None:
            return y0, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32)
        pre_pv = jnp.where(a.pre_keep, pv, _gather(full, a.pre_entry, a.pre_fixed))
        start = self._initial(full, pre_pv, pre.y0_function, a.pre_y0, a.pre_y0_entry if pre.y0_entries else None)
        # The steady state is found without derivatives and differentiated by the implicit function
        # theorem: the discrete solution's derivative depends on how far the sensitivities relaxed
        # before the state settled (wrong where the search starts near the steady state).
        stop = jax.lax.stop_gradient
        sol = simulate(self.problem, stop(start), jnp.full((1,), jnp.inf, self.problem.dtype), stop(pre_pv),
                       t0=a.t0, rtol=ops.rtol, atol=ops.atol, max_steps=ops.max_steps, adjoint=adjoint,
                       throw=False, steady_state=pre.steady_state)  # fmt: skip
        y_steady = steady_state_with_derivatives(self.problem.rhs, a.t0, sol.ys[-1], pre_pv, start)
        y_main = jnp.where(a.y0_set, y0, y_steady)
        return y_main, sol.status, sol.stats["n_steps"]

    def _events(self, full, a: LaneInputs, pv) -> dict:
        """The keyword arguments of ``simulate`` for resets, discontinuities and ``+inf`` times
        (none for a group without them, so that its solve is the plain one)."""
        group = self.group
        kw: dict = {}
        if not (group.resets or group.discontinuities or group.steady_state is not None):
            return kw
        pdict = self.problem.params_dict(pv)
        if group.resets:
            resets = []
            for i, (time_fn, apply) in enumerate(group.resets):
                t = jnp.reshape(time_fn(pdict), ()) if time_fn is not None else a.reset_times[i]
                resets.append(Reset(t, apply))
            kw["resets"] = tuple(resets)
        if callable(group.discontinuities):
            kw["discontinuities"] = jnp.reshape(group.discontinuities(pdict), (-1,))
        elif group.discontinuities:
            kw["discontinuities"] = a.discs
        if group.steady_state is not None:
            kw["steady_state"] = group.steady_state
        return kw

    def states(self, ops: TermOperands, full, a: LaneInputs, theta=None, *, forward: bool = True):
        """One experiment's states at its measurement times ``(m, n)``, its status and steps, and
        (multiple shooting) its continuity residuals ``(W-1, n)`` (else None)."""
        problem, group = self.problem, self.group
        pv = self.model_parameters(full, a)
        adjoint = ForwardMode() if forward else CheckpointAdjoint(self.checkpoints)
        y0, pre_status, pre_steps = self.initial_state(ops, full, a, pv, adjoint)
        events = self._events(full, a, pv)

        def solve(y0, times, t0):
            return simulate(problem, y0, times, pv, t0=t0, rtol=ops.rtol, atol=ops.atol,
                            max_steps=ops.max_steps, adjoint=adjoint, throw=False, **events)  # fmt: skip

        if not group.windows:
            sol = solve(y0, a.times, a.t0)
            if group.preequilibration is None:
                return sol.ys, sol.status, sol.stats["n_steps"], None
            status = jnp.where(pre_status != 0, pre_status, sol.status)
            return sol.ys, status, sol.stats["n_steps"] + pre_steps, None
        if theta is None:
            raise ValueError("InferenceProblem.states: a multiple-shooting group needs theta (the window starts).")
        starts = jnp.asarray(theta)[a.win_idx]
        y0s = jnp.concatenate([y0[None].astype(starts.dtype), starts], axis=0)
        sol = jax.vmap(solve)(y0s, a.win_times, a.win_t0)
        ys = sol.ys[a.win_of, a.win_pos]
        cont = (sol.ys[:-1, -1] - starts) * a.cont_w[None, :]
        return ys, jnp.max(sol.status), jnp.sum(sol.stats["n_steps"]), cont

    # -- observation and noise -------------------------------------------------------------------
    def observe(self, full, a: LaneInputs, ys):
        """The observables ``(m, k)`` of one experiment's states ``ys`` at its times ``a.times``
        (the states themselves when the group observes every state)."""
        group = self.group
        if group.observables is None:
            return ys
        pdict = self.parameter_dict(full, a)
        if group.observables_take_time:
            return jax.vmap(lambda t, y: jnp.asarray(group.observables(t, y, pdict), ys.dtype))(a.times, ys)
        return jax.vmap(lambda y: jnp.asarray(group.observables(y, pdict), ys.dtype))(ys)

    def spreads(self, full, a: LaneInputs, h):
        """Every value's ``sigma`` (or Laplace ``scale``) ``(m, k)``, and the cells whose spread
        comes from a parameter or a function (None when none does)."""
        group = self.group
        mask = a.mask
        dynamic = None
        if group.sigma == SIGMA_ENTRY:
            sigma = jnp.broadcast_to(full[a.sigma_entry], mask.shape)
            dynamic = jnp.ones(mask.shape, bool)
        elif group.sigma == SIGMA_CELLS:
            sigma = _gather(full, a.sigma_entries, a.sigma)
            dynamic = a.sigma_entries >= 0
        else:
            sigma = a.sigma
        functions = [f for f in dict.fromkeys(group.sigma_functions) if f is not None]
        if functions:
            pdict = self.parameter_dict(full, a)
            for fn in functions:
                cols = np.array([g is fn for g in group.sigma_functions])
                out = jax.vmap(lambda t, hr, fn=fn: jnp.asarray(fn(t, hr, pdict), h.dtype))(a.times, h)
                out = jnp.broadcast_to(out.reshape(out.shape[0], -1), h.shape)
                sigma = jnp.where(cols[None, :], out, sigma)
                on = jnp.broadcast_to(jnp.asarray(cols)[None, :], mask.shape)
                dynamic = on if dynamic is None else dynamic | on
        return sigma, dynamic

    @property
    def laws(self) -> tuple:
        """The distinct noise models of the group's columns: ``(law, columns)`` pairs, ``law`` an
        :class:`~diffsoup.inference.AbstractNoise` whose methods give the cells' maths and
        ``columns`` a ``(k,)`` bool array of the columns it holds (in order of first column)."""
        kinds = list(dict.fromkeys(self.group.noise))
        return tuple((kind.law(), np.array([c == kind for c in self.group.noise])) for kind in kinds)

    @staticmethod
    def _by_column(laws, cell):
        """``cell(law)`` of each column's law, one ``(m, k)`` array (a ``where`` per further law)."""
        out = None
        for law, cols in laws:
            value = cell(law)
            out = value if out is None else jnp.where(cols[None, :], value, out)
        return out

    def _compared(self, h, data):
        """Observables and data on the columns' comparison scales (each law's ``transform``)."""
        laws = self.laws
        if len(laws) == 1:
            law = laws[0][0]
            return law.transform(h, clip=True), law.transform(data)
        return (self._by_column(laws, lambda law: law.transform(h, clip=True)),
                self._by_column(laws, lambda law: law.transform(data, clip=True)))  # fmt: skip

    def lane(self, ops: TermOperands, full, a: LaneInputs, *, forward: bool, residuals: bool, theta=None):
        """One experiment: ``(value or residuals, status, n_steps)``, NaN where the solve failed, 0 on padding."""
        ys, status, n_steps, cont = self.states(ops, full, a, theta, forward=forward)
        return self.from_states(ops, full, a, ys, status, n_steps, cont, residuals=residuals)

    def from_states(self, ops: TermOperands, full, a: LaneInputs, ys, status, n_steps, cont, *, residuals: bool):
        """One experiment's ``(value or residuals, status, n_steps)`` from its solve's outputs
        (:meth:`states`): observe, compare with the data under the noise model."""
        group = self.group
        h = self.observe(full, a, ys)
        mask = a.mask
        sigma, dynamic = self.spreads(full, a, h)
        pred, meas = self._compared(h, a.data)
        laws = self.laws
        z = (pred - meas) / sigma
        r = jnp.where(mask, self._by_column(laws, lambda law: law.residual(z)), 0.0)
        ok = status == 0
        bad = jnp.asarray(jnp.nan, r.dtype)
        # A group of one named spread per experiment keeps the mask alone (the cells are all named).
        own = mask if group.sigma == SIGMA_ENTRY and not group.sigma_functions else (
            None if dynamic is None else mask & dynamic)  # fmt: skip
        if group.dynamic_sigma:
            spread_nll = self._by_column(laws, lambda law: law.spread_nll(sigma))
        if residuals:
            parts = [r.reshape(-1)]
            if group.dynamic_sigma:
                safe = jnp.where(own, 2.0 * spread_nll + ops.sigma_shift, 1.0)
                if group.sigma_functions:  # no lower bound is known for a function's spread
                    safe = jnp.maximum(safe, 0.0)
                parts.append(jnp.where(own, jnp.sqrt(safe), 0.0).reshape(-1))
            if cont is not None:
                parts.append(cont.reshape(-1).astype(r.dtype))
            out = jnp.concatenate(parts)
            out = jnp.where(a.valid, jnp.where(ok, out, bad), 0.0)
        else:
            # Least-squares columns (penalty 0.5 r^2) enter as scale * sum(r^2), the others by penalty.
            squares = np.array([law.least_squares for law in (kind.law() for kind in group.noise)])
            if squares.all():
                v = self.scale * jnp.sum(r * r) + a.const
            else:
                rs = jnp.where(squares[None, :], r, 0.0)
                penalty = self._by_column(tuple(x for x in laws if not x[0].least_squares), lambda law: law.penalty(z))
                v = self.scale * jnp.sum(rs * rs) + jnp.sum(jnp.where(mask & ~squares[None, :], penalty, 0.0)) + a.const
            if group.dynamic_sigma:
                v = v + jnp.sum(jnp.where(own, spread_nll, 0.0))
            if cont is not None:
                v = v + self.scale * jnp.sum(cont * cont)
            out = jnp.where(a.valid, jnp.where(ok, v, bad), 0.0)
        return out, status, n_steps
