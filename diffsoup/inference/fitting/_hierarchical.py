"""Hierarchical optimization: the parameters the residuals are affine in, optimized analytically.

Offsets and scaling factors of observables compared under Gaussian noise enter the residuals
affinely: with ``v`` their linear values, ``r(theta, v) = a(theta) - B(theta) v``, so the objective
``scale ||r||^2 + offset`` has, at each ``theta``, its minimum over ``v`` within the bounds as the
solution of a bounded linear least-squares problem (``scipy.optimize.lsq_linear``, exact). The
optimizer then moves only the other coordinates (variable projection, Golub and Pereyra 1973;
the hierarchical optimization of Loos et al. 2018 that pyPESTO offers for PEtab problems):

- value: the objective at ``(theta, v*(theta))``;
- gradient: the other coordinates' part of the full gradient at ``v*`` (inner optimality makes
  the derivative along ``v`` vanish for a ``v*`` inside its bounds; one on a bound stays there
  under small moves, so it is constant);
- Hessian (Gauss-Newton or exact): the Schur complement ``H_tt - H_tv H_vv^+ H_vt`` over the
  ``v`` inside their bounds, the exact second derivative of the reduced objective;
- residual Jacobian (scipy's TRF): ``(I - P) J_t``, ``P`` the projection onto the span of ``J_v``
  (Kaufman 1975), whose ``J^T J`` is that Schur complement.

``a`` and ``B`` come from the residuals at a base point ``v0`` and at ``v0 + delta_k e_k`` per
parameter: ``k + 1`` residual evaluations (each about one value's cost) before the evaluation at
``v*``.

Noise levels (:class:`NoiseParameters`): a parameter ``s`` that is the spread of its cells, up to
a factor per cell (``sigma_i = s c_i``, Gaussian or log-normal noise, ``"nll"``), enters the
objective as ``sum_i (0.5 e_i^2 / (s c_i)^2 + log s) + const`` over its ``n`` cells, whose minimum
over ``s`` is at ``s*^2 = (1/n) sum_i (e_i / c_i)^2``: from the residuals ``r_i = e_i / (s0 c_i)`` at
any ``s0``, ``s* = s0 sqrt(mean r_i^2)``, clipped to the bounds (the objective is unimodal in
``log s``). One residual evaluation finds every noise level (none more where offsets or scaling
factors are found too: their residuals at ``v*`` are ``a - B v*``). With noise levels alone, the
value, gradient and Gauss-Newton matrix come from that same evaluation: the residuals and their
Jacobian at ``s0`` moved to ``s*`` row by row (:meth:`NoiseParameters.moved`), so a trial point
costs one evaluation, as without them. Offsets and scaling factors
are optimized first, with the spreads of the evaluation point: exact when no offset or scaling
factor reaches cells of two noise levels, or of a noise level and a fixed spread (then their
optimum does not depend on the noise levels), which :meth:`AnalyticParameters.find` checks. The
gradient and Hessians are those above, over both kinds (the Schur complement of the Gauss-Newton
matrix over a noise level is a model of the reduced objective's curvature, not its exact value).
pyPESTO offers the same for PEtab problems (Schmiester et al. 2020); on Boehm's 20 benchmark starts
it took fides with the Gauss-Newton Hessian from 0 to 1 start at the reference optimum (the
others at the local minimum +9.32 above it). Which parameters qualify is checked, not assumed: :meth:`LinearParameters.find` takes the
estimated parameters that reach the objective only as observable parameters (never the dynamics,
initial states or noise), evaluates the residuals at a second step along each and at a joint step
of all, and accepts a parameter only where they match the affine prediction to ``AFFINE_RTOL`` of
its effect.

References:
    G. H. Golub and V. Pereyra, "The differentiation of pseudo-inverses and nonlinear least squares
    problems whose variables separate", SIAM J. Numer. Anal. 10 (1973) 413-432.
    L. Kaufman, "A variable projection method for solving separable nonlinear least squares
    problems", BIT 15 (1975) 49-57.
    C. Loos, S. Krause, J. Hasenauer, "Hierarchical optimization for the efficient parametrization
    of ODE models", Bioinformatics 34 (2018) 4266-4273.
    L. Schmiester, Y. Schälte, F. Fröhlich, J. Hasenauer, D. Weindl, "Efficient parameterization of
    large-scale dynamic models based on relative measurements", Bioinformatics 36 (2020) 594-602.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from ..objective._abstract_lowered import AbstractLoweredStudy

# Largest deviation of the residuals from the affine prediction, relative to the parameter's effect
# (its column of B), at which it still counts as affine: the solves do not depend on it, so the
# residuals repeat to rounding, while a non-affine observable parameter misses by order one.
AFFINE_RTOL = 1e-6
# A column of B this small (relative to 1 + max |r|) means the parameter changes no residual.
NO_EFFECT_RTOL = 1e-12
# Noise levels optimized analytically bring the residuals' Jacobian to the host at each evaluation
# (rows x theta; the plain Gauss-Newton evaluation sums it where it is computed, and only theta x
# theta travels). fit's default takes them only where that Jacobian has at most this many entries
# (128 MB in float64): a PEtab problem's is thousands, a study of a million experiments' is 10^8.
DEFAULT_MAX_JACOBIAN_ENTRIES = 2**24


@dataclasses.dataclass(frozen=True, eq=False)
class LinearParameters:
    """Estimated parameters that the residuals are affine in, and how to optimize them analytically.

    Attributes:
        indices: their positions in ``theta``.
        names: their ``theta`` names.
        base, step: the linear values ``v0`` and steps ``delta`` at which the residuals are
            evaluated to find ``a`` and ``B`` (``v0 = 1, delta = 1`` on log scales, ``v0 = 0,
            delta = 1`` on the linear scale, moved inside the bounds where needed).
        lower, upper: their bounds, linear values.
        to_scale, from_scale: per parameter, linear value -> ``theta`` coordinate and back.
    """

    indices: np.ndarray
    names: tuple[str, ...]
    base: np.ndarray
    step: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    to_scale: tuple[Callable[[float], float], ...]
    from_scale: tuple[Callable[[float], float], ...]

    @classmethod
    def find(cls, lowered: AbstractLoweredStudy, names: bool | Sequence[str] = True,
             theta: Any = None) -> "LinearParameters | None":  # fmt: skip
        """The parameters of ``lowered`` to optimize analytically.

        Args:
            lowered: the lowered study.
            names: True: every estimated parameter that reaches the objective only as an
                observable parameter and that the residuals are affine in and depend on (checked
                by evaluating them); or the names (``theta`` names) of the parameters to take,
                each of which must pass the evaluation check (a named parameter may also act
                elsewhere, e.g. an initial state of a linear model).
            theta: where to check (scaled; default the nominal point).

        Returns:
            The :class:`LinearParameters`, or None where ``names`` is True and none qualifies.

        Raises:
            ValueError: for an unknown name, a named parameter the residuals are not affine in or
                do not depend on, or residuals that are not finite at ``theta``.
        """
        prob = lowered.problem
        n_par = getattr(prob, "n_parameters", prob.n_theta)  # window starts are never linear
        theta_names = tuple(lowered.theta_names)
        if names is True:
            observable_only = observable_only_entries(prob)
            wanted = [j for j in range(n_par) if int(prob.estimated[j]) in observable_only]
            if not wanted:
                return None
        else:
            if isinstance(names, str):
                names = (names,)
            unknown = [n for n in names if n not in theta_names[:n_par]]
            if unknown:
                raise ValueError(f"hierarchical: {unknown} are not estimated parameters; theta is {list(theta_names[:n_par])}.")
            wanted = [theta_names.index(n) for n in names]
        theta = np.asarray(lowered.nominal if theta is None else theta, dtype=np.float64)
        params = [prob.study.entries[prob.estimated[j]].parameter for j in wanted]
        candidate = cls._of(lowered, wanted, params)
        at = lambda v: candidate._theta(theta, v)  # noqa: E731
        r0 = _finite_residuals(lowered, at(candidate.base), "the base point")
        rounding = 1e-12 * (1.0 + float(np.max(np.abs(r0))))
        keep, columns, reasons = [], [], {}
        for k in range(len(wanted)):
            e = np.zeros(len(wanted))
            e[k] = 1.0
            r1 = _finite_residuals(lowered, at(candidate.base + candidate.step * e), theta_names[wanted[k]])
            r2 = _finite_residuals(lowered, at(candidate.base + 2 * candidate.step * e), theta_names[wanted[k]])
            column = r0 - r1
            effect = float(np.max(np.abs(column)))
            deviation = float(np.max(np.abs(r2 - (r0 - 2 * column))))
            if effect <= NO_EFFECT_RTOL * (1.0 + float(np.max(np.abs(r0)))):
                reasons[k] = "changes no residual"
            elif deviation > AFFINE_RTOL * effect + rounding:
                reasons[k] = f"the residuals are not affine in it (deviation {deviation:.3g} of an effect {effect:.3g})"
            else:
                keep.append(k)
                columns.append(column / candidate.step[k])
        if names is not True and reasons:
            k, why = next(iter(reasons.items()))
            raise ValueError(
                f"hierarchical: {theta_names[wanted[k]]!r} cannot be optimized analytically: {why}. Only parameters "
                "the residuals are affine in (offsets and scaling factors of observables under Gaussian noise) and "
                "noise levels (spreads) can; leave it out, or pass hierarchical=True to take those that qualify."
            )
        if not keep:
            return None
        found = cls._of(lowered, [wanted[k] for k in keep], [params[k] for k in keep])
        # Jointly: products of the parameters (one scaling another's offset) would show here. The
        # columns found above are B's (every other parameter sat at its base for each).
        B = np.stack(columns, axis=1)
        a = r0 + B @ found.base
        probe = found.base + found.step * np.linspace(0.5, 1.5, len(keep))
        joint = _finite_residuals(lowered, found._theta(theta, probe), "the joint check")
        deviation = float(np.max(np.abs(joint - (a - B @ probe))))
        if deviation > AFFINE_RTOL * float(np.max(np.abs(B * found.step))) + rounding:
            raise ValueError(
                f"hierarchical: the residuals are affine in each of {list(found.names)} alone but not jointly "
                f"(deviation {deviation:.3g}); name the parameters to optimize analytically."
            )
        return found

    @classmethod
    def _of(cls, lowered: AbstractLoweredStudy, indices: Sequence[int], params: Sequence[Any]) -> "LinearParameters":
        bounds = _bounds_and_scales(params)
        lower, upper = bounds["lower"], bounds["upper"]
        log = np.array([p.scale != "lin" for p in params])
        base = np.where(log, 1.0, 0.0)
        base = np.clip(base, lower, upper)
        # A step inside the bounds where the base sits on the upper one.
        step = np.where(base + 1.0 <= upper, 1.0, -np.minimum(1.0, 0.5 * (base - lower)))
        step = np.where(step == 0, 1.0, step)
        return cls(
            indices=np.asarray(indices, dtype=np.int64), names=tuple(lowered.theta_names[i] for i in indices),
            base=base, step=step, **bounds,
        )  # fmt: skip

    def __len__(self) -> int:
        return len(self.indices)

    def without(self, indices: Sequence[int]) -> "LinearParameters | None":
        """These parameters less the ``theta`` indices ``indices`` (a profile holds them fixed)."""
        return _without(self, indices)

    def _theta(self, theta: np.ndarray, values: np.ndarray) -> np.ndarray:
        out = np.array(theta, dtype=np.float64)
        for i, f, v in zip(self.indices, self.to_scale, values):
            out[i] = float(f(float(v)))
        return out

    def _affine(self, residuals: Callable[[np.ndarray], np.ndarray | None], theta: np.ndarray):
        """``(a, B)`` with ``r = a - B v`` at ``theta``'s other coordinates, or None if a solve failed."""
        r0 = residuals(self._theta(theta, self.base))
        if r0 is None:
            return None
        B = np.empty((r0.size, len(self)))
        for k in range(len(self)):
            v = self.base.copy()
            v[k] += self.step[k]
            rk = residuals(self._theta(theta, v))
            if rk is None:
                return None
            B[:, k] = (r0 - rk) / self.step[k]
        return r0 + B @ self.base, B

    def solve(self, residuals: Callable[[np.ndarray], np.ndarray | None], theta: np.ndarray):
        """The optimal linear values at ``theta``'s other coordinates.

        Args:
            residuals: ``theta -> residuals``, None where a solve failed.
            theta: the full ``theta`` (its entries of these parameters are ignored).

        Returns:
            ``(theta with v*, interior, residuals there)``: ``interior`` marks the ``v*`` strictly
            inside their bounds; None where a solve failed.
        """
        found = self._affine(residuals, theta)
        if found is None:
            return None
        a, B = found
        v, interior = self._optimum(a, B)
        return self._theta(theta, v), interior, a - B @ v

    def _optimum(self, a: np.ndarray, B: np.ndarray):
        """``(v*, interior)``: the bounded least-squares solution of ``B v = a``."""
        from scipy.optimize import lsq_linear

        # Columns scaled to unit norm: scaling factors of 1e-5 and 1e3 side by side.
        norms = np.linalg.norm(B, axis=0)
        norms = np.where(norms > 0, norms, 1.0)
        fit = lsq_linear(B / norms, a, bounds=(self.lower * norms, self.upper * norms), method="bvls")
        v = np.clip(fit.x / norms, self.lower, self.upper)
        span = self.upper - self.lower
        interior = (v - self.lower > 1e-12 * span) & (self.upper - v > 1e-12 * span)
        return v, interior


@dataclasses.dataclass(frozen=True, eq=False)
class NoiseParameters:
    """Estimated noise levels: parameters that are the spread of their cells up to a factor per
    cell (Gaussian or log-normal noise), optimized analytically (the module's docstring).

    Attributes:
        indices: their positions in ``theta``; names: their ``theta`` names.
        rows: per parameter, the residual rows of its cells' data (their ``(T(h) - T(d)) / sigma``).
        log_rows: per parameter, the rows of its cells' ``sqrt(2 log sigma + K)`` terms.
        counts: per parameter, its cells (the number of its ``log_rows``).
        log_slopes: per parameter, ``d log(s) / d theta_j`` as a function of ``s`` (its scale's).
        lower, upper: their bounds, linear values.
        to_scale, from_scale: per parameter, linear value -> ``theta`` coordinate and back.
    """

    indices: np.ndarray
    names: tuple[str, ...]
    rows: tuple[np.ndarray, ...]
    log_rows: tuple[np.ndarray, ...]
    counts: np.ndarray
    log_slopes: tuple[Callable[[float], float], ...]
    lower: np.ndarray
    upper: np.ndarray
    to_scale: tuple[Callable[[float], float], ...]
    from_scale: tuple[Callable[[float], float], ...]

    @classmethod
    def find(cls, lowered: AbstractLoweredStudy, names: bool | Sequence[str] = True,
             theta: Any = None) -> "NoiseParameters | None":  # fmt: skip
        """The noise levels of ``lowered`` to optimize analytically: True takes every estimated
        parameter that reaches the objective only as a spread and passes the check; names must
        each pass it. The check, at ``theta`` (default the nominal point): with the parameter
        multiplied by ``c``, its cells' data residuals are divided by ``c`` and their
        ``sqrt(2 log sigma + K)`` terms grow by ``2 log c`` in square, and nothing else changes.

        Raises:
            ValueError: for an unknown name, a named parameter that fails the check, named
                parameters that share cells, or residuals that are not finite at ``theta``.
        """
        prob = lowered.problem
        n_par = getattr(prob, "n_parameters", prob.n_theta)
        theta_names = tuple(lowered.theta_names)
        if names is True:
            noise_only = noise_only_entries(prob)
            wanted = [j for j in range(n_par) if int(prob.estimated[j]) in noise_only]
            if not wanted:
                return None
        else:
            names = (names,) if isinstance(names, str) else tuple(names)
            unknown = [n for n in names if n not in theta_names[:n_par]]
            if unknown:
                raise ValueError(f"hierarchical: {unknown} are not estimated parameters; theta is {list(theta_names[:n_par])}.")
            wanted = [theta_names.index(n) for n in names]
        theta = np.asarray(lowered.nominal if theta is None else theta, dtype=np.float64)
        params = [prob.study.entries[prob.estimated[j]].parameter for j in wanted]
        r0 = _finite_residuals(lowered, theta, "the base point")
        rounding = 1e-12 * (1.0 + float(np.max(np.abs(r0))))
        keep, rows, log_rows, reasons = [], [], [], {}
        for k, (j, p) in enumerate(zip(wanted, params)):
            s0 = float(p.from_scale(theta[j]))
            c = 2.0 if 2.0 * s0 <= p.upper else 0.5
            moved = theta.copy()
            moved[j] = float(p.to_scale(c * s0))
            r1 = _finite_residuals(lowered, moved, theta_names[j])
            changed = np.abs(r1 - r0) > rounding
            data = changed & (np.abs(r1 - r0 / c) <= AFFINE_RTOL * np.abs(r0) + rounding)
            logs = changed & ~data & (np.abs(r1**2 - r0**2 - 2.0 * np.log(c)) <= AFFINE_RTOL + rounding)
            other = int(np.sum(changed & ~data & ~logs))
            if not changed.any():
                reasons[k] = "it changes no residual"
            elif other or not data.any() or int(logs.sum()) < int(data.sum()):
                reasons[k] = (f"it is not the spread of its cells alone ({other} residuals change otherwise, "
                              f"{int(data.sum())} scale as its data, {int(logs.sum())} as its log-spread terms)")  # fmt: skip
            else:
                keep.append(k)
                rows.append(np.flatnonzero(data))
                log_rows.append(np.flatnonzero(logs))
        if names is not True and reasons:
            k, why = next(iter(reasons.items()))
            raise ValueError(
                f"hierarchical: {theta_names[wanted[k]]!r} cannot be optimized analytically as a noise level: {why}. "
                "Noise levels that can are the spread (sigma) of their cells under Gaussian or log-normal noise, "
                "up to a factor per cell."
            )
        # A cell whose spread is a product of two of them: each one's optimum depends on the other.
        shared = [k for a, k in enumerate(keep) if any(np.intersect1d(rows[a], rows[b]).size for b in range(a))]
        if shared:
            if names is not True:
                raise ValueError(f"hierarchical: {theta_names[wanted[shared[0]]]!r} shares cells with another noise level "
                                 "(a spread that is their product); name one of them.")  # fmt: skip
            drop = set(shared)
            rows = [r for k, r in zip(keep, rows) if k not in drop]
            log_rows = [r for k, r in zip(keep, log_rows) if k not in drop]
            keep = [k for k in keep if k not in drop]
        if not keep:
            return None
        return cls(
            indices=np.asarray([wanted[k] for k in keep], dtype=np.int64), names=tuple(theta_names[wanted[k]] for k in keep),
            rows=tuple(rows), log_rows=tuple(log_rows), counts=np.asarray([r.size for r in log_rows], dtype=np.float64),
            log_slopes=tuple(_LOG_SLOPES[params[k].scale] for k in keep), **_bounds_and_scales([params[k] for k in keep]),
        )  # fmt: skip

    def __len__(self) -> int:
        return len(self.indices)

    def without(self, indices: Sequence[int]) -> "NoiseParameters | None":
        """These parameters less the ``theta`` indices ``indices`` (a profile holds them fixed)."""
        return _without(self, indices)

    def optimum(self, theta: np.ndarray, r: np.ndarray):
        """``(theta with s*, interior)`` from the residuals ``r`` at ``theta``: ``s* = s sqrt(mean
        r^2)`` over each parameter's cells, clipped to its bounds."""
        out = np.array(theta, dtype=np.float64)
        interior = np.zeros(len(self), dtype=bool)
        for k, j in enumerate(self.indices):
            s = float(self.from_scale[k](float(theta[j])))
            best = s * float(np.sqrt(np.sum(r[self.rows[k]] ** 2) / self.counts[k]))
            v = min(max(best, float(self.lower[k])), float(self.upper[k]))
            span = self.upper[k] - self.lower[k]
            interior[k] = v - self.lower[k] > 1e-12 * span and self.upper[k] - v > 1e-12 * span
            out[j] = float(self.to_scale[k](v))
        return out, interior

    def moved(self, theta: np.ndarray, r: np.ndarray, J: np.ndarray | None = None):
        """``(theta with s*, interior, r*, J*)``: the residuals and their Jacobian at the optimum,
        from ``r`` and ``J`` at ``theta`` (no evaluation more). With ``q = s/s*`` a parameter's data
        rows are ``q r`` (their derivatives ``q J``), its log-spread rows ``sqrt(r^2 + 2 log(s*/s))``
        (derivatives ``r/r* J``: the factor per cell may depend on other parameters); in its own
        column, data rows ``-r* dlog(s)/dtheta_j`` and log-spread rows ``dlog(s)/dtheta_j / r*``."""
        out, interior = self.optimum(theta, r)
        r = np.array(r, dtype=np.float64)
        J = None if J is None else np.array(J, dtype=np.float64)  # None: the residuals alone
        for k, j in enumerate(self.indices):
            s, best = float(self.from_scale[k](float(theta[j]))), float(self.from_scale[k](float(out[j])))
            data, logs = self.rows[k], self.log_rows[k]
            r_log = np.sqrt(r[logs] ** 2 + 2.0 * np.log(best / s))
            if J is not None:
                slope = self.log_slopes[k](best)
                J[data] *= s / best
                J[logs] *= (r[logs] / r_log)[:, None]
                J[data, j] = -r[data] * (s / best) * slope
                J[logs, j] = slope / r_log
            r[data] *= s / best
            r[logs] = r_log
        return out, interior, r, J


@dataclasses.dataclass(frozen=True, eq=False)
class AnalyticParameters:
    """The parameters a hierarchical fit optimizes analytically at every evaluation: offsets and
    scaling factors (``affine``) and noise levels (``noise``), either None.

    ``solve`` finds the offsets and scaling factors first (their residuals there are ``a - B v*``,
    no solve more), then the noise levels from those residuals.
    """

    affine: LinearParameters | None
    noise: NoiseParameters | None

    @classmethod
    def find(cls, lowered: AbstractLoweredStudy, names: bool | Sequence[str] | None = True,
             theta: Any = None) -> "AnalyticParameters | None":  # fmt: skip
        """The parameters of ``lowered`` to optimize analytically (``fit(hierarchical=names)``):
        True takes the offsets and scaling factors (:meth:`LinearParameters.find`) and the noise
        levels (:meth:`NoiseParameters.find`) that qualify, leaving out offsets and scaling
        factors whose cells have more than one noise level or a noise level and fixed spreads
        (their optimum would depend on the noise levels); names go to the kind their parameter
        reaches the objective as (a spread: noise level), and each must qualify. None (``fit``'s
        default) takes the noise levels that qualify alone, and none where the residuals at
        ``theta`` are not finite (the fit then runs without them rather than fail) or where the
        residuals' Jacobian would exceed ``DEFAULT_MAX_JACOBIAN_ENTRIES`` (twice the measured
        values times theta: it travels to the host at each evaluation; name them to have them).

        Returns:
            The :class:`AnalyticParameters`, or None where ``names`` is True or None and none
            qualifies.

        Raises:
            ValueError: as the two ``find``; for named offsets or scaling factors whose cells
                have more than one noise level.
        """
        prob = lowered.problem
        if names is None:
            if 2 * prob.study.n_measured * prob.n_theta > DEFAULT_MAX_JACOBIAN_ENTRIES:
                return None
            try:
                noise = NoiseParameters.find(lowered, True, theta)
            except ValueError:  # residuals not finite at theta: nothing to find them from
                return None
            return None if noise is None else cls(None, noise)
        if names is True:
            affine, noise = LinearParameters.find(lowered, True, theta), NoiseParameters.find(lowered, True, theta)
        else:
            names = (names,) if isinstance(names, str) else tuple(names)
            known = tuple(lowered.theta_names)
            noise_only = noise_only_entries(prob)
            spreads = [n for n in names if n in known and int(prob.estimated[known.index(n)]) in noise_only]
            others = [n for n in names if n not in spreads]
            affine = LinearParameters.find(lowered, others, theta) if others else None
            noise = NoiseParameters.find(lowered, spreads, theta) if spreads else None
        if affine is not None and noise is not None:
            theta = np.asarray(lowered.nominal if theta is None else theta, dtype=np.float64)
            found = affine._affine(lambda th: residuals_or_none(lowered, th), theta)
            if found is None:
                raise ValueError("hierarchical: the residuals at the base point are not finite; check at another theta=.")
            _, B = found
            owner = np.full(B.shape[0], -1)
            for k, rows in enumerate(noise.rows):
                owner[rows] = k
            coupled = []
            for k in range(len(affine)):
                column = np.abs(B[:, k])
                reached = set(owner[column > NO_EFFECT_RTOL * (1.0 + float(np.max(column)))].tolist())
                if len(reached) > 1:
                    coupled.append(k)
            if coupled and names is not True:
                raise ValueError(
                    f"hierarchical: {affine.names[coupled[0]]!r} reaches cells of more than one noise level (or of a "
                    "noise level and fixed spreads), so its optimum depends on them; optimize one kind analytically."
                )
            if coupled:
                affine = affine.without(affine.indices[coupled])
        if affine is None and noise is None:
            return None
        return cls(affine, noise)

    @property
    def indices(self) -> np.ndarray:
        """Their positions in ``theta``: the offsets and scaling factors, then the noise levels."""
        parts = [x.indices for x in (self.affine, self.noise) if x is not None]
        return np.concatenate(parts).astype(np.int64)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for x in (self.affine, self.noise) if x is not None for n in x.names)

    def __len__(self) -> int:
        return len(self.indices)

    def without(self, indices: Sequence[int]) -> "AnalyticParameters | None":
        """These parameters less the ``theta`` indices ``indices`` (a profile holds them fixed)."""
        affine = self.affine.without(indices) if self.affine is not None else None
        noise = self.noise.without(indices) if self.noise is not None else None
        return None if affine is None and noise is None else AnalyticParameters(affine, noise)

    def solve(self, residuals: Callable[[np.ndarray], np.ndarray | None], theta: np.ndarray):
        """``(theta with the analytic optimum, interior)`` at ``theta``'s other coordinates
        (``interior``: in :attr:`indices` order, those strictly inside their bounds); None where a
        solve failed."""
        interior = []
        r = None
        if self.affine is not None:
            found = self.affine.solve(residuals, theta)
            if found is None:
                return None
            theta, inside, r = found
            interior.append(inside)
        if self.noise is not None:
            r = residuals(theta) if r is None else r
            if r is None:
                return None
            theta, inside = self.noise.optimum(theta, r)
            interior.append(inside)
        return theta, np.concatenate(interior)


# d log(s) / d theta for a parameter on each scale, as a function of its linear value s.
_LOG_SLOPES: dict[str, Callable[[float], float]] = {
    "lin": lambda s: 1.0 / s, "log": lambda s: 1.0, "log10": lambda s: float(np.log(10.0)),
}


def _bounds_and_scales(params: Sequence[Any]) -> dict:
    """``lower``, ``upper`` (linear values), ``to_scale`` and ``from_scale`` of study parameters."""
    return {"lower": np.array([float(p.lower) for p in params]), "upper": np.array([float(p.upper) for p in params]),
            "to_scale": tuple(p.to_scale for p in params), "from_scale": tuple(p.from_scale for p in params)}  # fmt: skip


def _without(found: Any, indices: Sequence[int]) -> Any:
    """``found`` (a frozen dataclass of per-parameter fields: arrays or tuples, in ``indices``
    order) less the parameters at the ``theta`` indices ``indices``; None if none is left."""
    held = {int(i) for i in indices}
    keep = [k for k, i in enumerate(found.indices) if int(i) not in held]
    if not keep:
        return None
    fields = {}
    for f in dataclasses.fields(found):
        value = getattr(found, f.name)
        fields[f.name] = value[keep] if isinstance(value, np.ndarray) else tuple(value[k] for k in keep)
    return type(found)(**fields)


def schur_complement(H: np.ndarray, free: np.ndarray, linear: np.ndarray) -> np.ndarray:
    """``H[free, free] - H[free, linear] H[linear, linear]^+ H[linear, free]``: the Hessian of the
    objective with the ``linear`` coordinates at their optimum, over the ``free`` ones."""
    Hff = H[np.ix_(free, free)]
    if linear.size == 0:
        return Hff
    Hfl = H[np.ix_(free, linear)]
    return Hff - Hfl @ np.linalg.pinv(H[np.ix_(linear, linear)], hermitian=True) @ Hfl.T


def projected_jacobian(J: np.ndarray, free: np.ndarray, linear: np.ndarray) -> np.ndarray:
    """``(I - P) J[:, free]``, ``P`` the projection onto the columns ``linear`` of ``J``: the
    Jacobian of the residuals with the ``linear`` coordinates at their optimum (Kaufman)."""
    Jf = J[:, free]
    if linear.size == 0:
        return Jf
    Jl = J[:, linear]
    coef, *_ = np.linalg.lstsq(Jl, Jf, rcond=None)
    return Jf - Jl @ coef


def observable_only_entries(problem: Any) -> set[int]:
    """Study entries that reach the objective only through experiments' observable parameters
    (not the model parameters, initial states, pre-equilibration or noise of any experiment)."""
    uses = _entry_uses(problem)
    return uses["observable"] - uses["spread"] - uses["elsewhere"]


def noise_only_entries(problem: Any) -> set[int]:
    """Study entries that reach the objective only as spreads of measured values (a named spread
    per experiment or per cell), not as model, observable or pre-equilibration parameters or
    initial states."""
    uses = _entry_uses(problem)
    return uses["spread"] - uses["observable"] - uses["elsewhere"]


def _entry_uses(problem: Any) -> dict[str, set[int]]:
    """The study entries each kind of use reaches, over every experiment: ``"observable"``
    (observable parameters), ``"spread"`` (named spreads) and ``"elsewhere"`` (model and
    pre-equilibration parameters, initial states)."""
    from ..objective._terms import SIGMA_ENTRY, member_array

    uses: dict[str, set[int]] = {"observable": set(), "spread": set(), "elsewhere": set()}
    for group in problem.groups:
        arrays = problem.pack(group, list(member_array(group.members)))
        for key, values in arrays.items():
            if not key.endswith(("_entry", "_entries")) or (key == "sigma_entry" and group.sigma != SIGMA_ENTRY):
                continue
            kind = "observable" if key == "op_entry" else "spread" if key in ("sigma_entry", "sigma_entries") else "elsewhere"
            uses[kind].update(int(i) for i in np.unique(np.asarray(values)) if i >= 0)
    return uses


def residuals_or_none(lowered: AbstractLoweredStudy, theta: np.ndarray) -> np.ndarray | None:
    """The residuals at ``theta``, or None where a solve failed or one is not finite."""
    r = np.asarray(lowered.residuals(theta), dtype=np.float64)
    return None if lowered.last_failures or not np.all(np.isfinite(r)) else r


def _finite_residuals(lowered: AbstractLoweredStudy, theta: np.ndarray, where: str) -> np.ndarray:
    r = residuals_or_none(lowered, theta)
    if r is None:
        failed = ", ".join(f"{k}: {getattr(v, 'name', v)}" for k, v in lowered.last_failures.items()) or "non-finite residuals"
        raise ValueError(f"hierarchical: the residuals at {where} are not finite ({failed}); check at another theta=.")
    return r
