"""Profile likelihoods: re-optimization along one parameter, and confidence intervals from the
chi-square threshold.

The profile of parameter ``i`` is ``PL(t) = min over the other parameters of f(theta)`` with
``theta_i = t`` fixed (``f`` the objective, a negative log-likelihood or a chi-square). By Wilks'
theorem ``2 (PL(t) - f_min)`` (in units of ``-2 log L``) is asymptotically chi-square with one
degree of freedom at the true ``t``, so ``{t : PL(t) - f_min <= Delta}`` with
``Delta = scale * chi2.ppf(confidence, 1)`` is a ``confidence`` interval (``scale`` is the
objective's: 0.5 for ``"nll"``, where ``Delta = 1.92`` at 95%, and 1 for ``"chi2"``).
``simultaneous=True`` takes ``n_theta`` degrees of freedom instead (a joint region's shadow).

:func:`profile_parameter` walks from the optimum in both directions, each point a fit of the
other parameters (warm-started from the last point moved along the optimum's local covariance
direction), its step adapted so that each one raises the profile by about
``step_increase * Delta``. It stops past the threshold, at the parameter's bound (the interval is
then open on that side), or after ``max_steps``; the crossing is then located by safeguarded
interpolation between the last points below and above the threshold, each trial a re-optimization,
until the profile there is within ``crossing_tolerance`` of the threshold. With
``ProfileOptions(hierarchical=...)`` the offsets and scaling factors the residuals are affine in and
the noise levels are optimized analytically at every point (as ``fit(hierarchical=...)`` does), the optimizer
moving only the rest; the profiled parameter itself is held fixed even when it is one of them.

The distributed driver (``ds.inference.profile``, one ``checkpointed_map`` task per parameter)
lives in :mod:`diffsoup.distributed._profile_runs`; this module runs one profile in this process.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Mapping

import numpy as np

from ..objective._abstract_lowered import AbstractLoweredStudy
from ._fides import Fides
from ._run_start import run_start
from ._hierarchical import AnalyticParameters
from ._optimizers import AbstractOptimizer

PROFILES_FORMAT = "diffsoup.profiles/1"

def threshold(scale: float, confidence: float = 0.95, dof: int = 1) -> float:
    """The profile's rise above the optimum that bounds a ``confidence`` interval:
    ``scale * chi2.ppf(confidence, dof)`` (``scale`` 0.5 for a negative log-likelihood).

    Raises:
        ValueError: for a confidence outside (0, 1) or dof below 1.
    """
    from scipy.stats import chi2

    if not 0.0 < float(confidence) < 1.0:
        raise ValueError(f"confidence={confidence!r} must lie in (0, 1).")
    if int(dof) < 1:
        raise ValueError(f"dof={dof!r} must be at least 1.")
    return float(scale) * float(chi2.ppf(float(confidence), int(dof)))


@dataclasses.dataclass(frozen=True)
class ProfileOptions:
    """How a profile is computed.

    Attributes:
        confidence: of the intervals (0.95).
        simultaneous: False for pointwise intervals (one degree of freedom), True for the
            projections of the joint confidence region (``n_theta`` degrees of freedom).
        optimizer: the re-optimization of the other parameters at each point (default
            ``Fides()``: Gauss-Newton trust region, warm-started, a few iterations per point).
        max_steps: most points per direction (before the crossing is located).
        step_increase: the profile's rise per step aimed at, as a fraction of the threshold.
        min_step, max_step: bounds of the step (theta's units: decades for log10 parameters).
        crossing_tolerance: how close to the threshold (objective units) a located crossing is.
        refine_iterations: most re-optimizations spent locating each crossing.
        better_tolerance: a profile point this far below the optimum is a better optimum (the
            fit had not converged); it is reported in ``ProfileResult.better``.
        hierarchical: False, True (every parameter the residuals are affine in, offsets and
            scaling factors of observables, and every noise level) or the names of such parameters, optimized
            analytically at each profile point (``fit(hierarchical=...)``'s rule; checked at the
            optimum when a profile starts).

    Raises:
        ValueError: naming the field, for values outside their ranges.
    """

    confidence: float = 0.95
    simultaneous: bool = False
    optimizer: AbstractOptimizer = Fides()
    max_steps: int = 40
    step_increase: float = 0.25
    min_step: float = 1e-4
    max_step: float = 1.0
    crossing_tolerance: float = 1e-2
    refine_iterations: int = 8
    better_tolerance: float = 1e-3
    hierarchical: bool | tuple[str, ...] = False

    def __post_init__(self):
        if not isinstance(self.hierarchical, bool):
            names = (self.hierarchical,) if isinstance(self.hierarchical, str) else self.hierarchical
            try:
                names = tuple(names)
            except TypeError:
                names = None
            if not names or not all(isinstance(n, str) for n in names):
                raise TypeError(f"ProfileOptions: hierarchical={self.hierarchical!r} must be True, False or parameter names.")
            object.__setattr__(self, "hierarchical", names)
        if not 0.0 < float(self.confidence) < 1.0:
            raise ValueError(f"ProfileOptions: confidence={self.confidence!r} must lie in (0, 1).")
        if not isinstance(self.optimizer, AbstractOptimizer):
            raise TypeError("ProfileOptions: optimizer must be an optimizer object (ds.inference.Fides(), TRF(), LBFGSB()).")
        for field in ("max_steps", "refine_iterations"):
            if int(getattr(self, field)) < 1:
                raise ValueError(f"ProfileOptions: {field}={getattr(self, field)!r} must be a positive integer.")
        for field in ("step_increase", "min_step", "max_step", "crossing_tolerance", "better_tolerance"):
            if not float(getattr(self, field)) > 0:
                raise ValueError(f"ProfileOptions: {field}={getattr(self, field)!r} must be positive.")
        if self.min_step > self.max_step:
            raise ValueError(f"ProfileOptions: min_step={self.min_step} is above max_step={self.max_step}.")

    def as_dict(self) -> dict:
        """The options as JSON (the optimizer by its repr): what a campaign's items carry."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["optimizer"] = repr(self.optimizer)
        if not self.hierarchical:
            del out["hierarchical"]  # so that ledgers written before the option still resume
        elif not isinstance(self.hierarchical, bool):
            out["hierarchical"] = list(self.hierarchical)  # as JSON reads it back
        return out


@dataclasses.dataclass(frozen=True)
class ParameterProfile:
    """The profile of one parameter.

    Attributes:
        name: the parameter's theta name; index: its position in theta.
        values: the profiled parameter's values (scaled), ascending; objectives: the profile there.
        points: the full theta ``(n, n_theta)`` at each point.
        optimum: the fit's objective the profile starts from; estimate: its value of the parameter.
        threshold: ``optimum + Delta``.
        lower, upper: the interval's ends (scaled). An end where the profile did not cross the
            threshold is the last point reached (the bound, or where ``max_steps`` ran out) and
            its ``*_open`` flag is True.
        lower_open, upper_open: whether that side did not cross the threshold.
        reasons: why each direction stopped, ``(lower side, upper side)``.
        n_evaluations: evaluations of the lowered study; seconds: wall time.
        best_point, best_objective: the lowest point the profile met (below ``optimum`` when the
            fit had not found the optimum).
    """

    name: str
    index: int
    values: np.ndarray
    objectives: np.ndarray
    points: np.ndarray
    optimum: float
    estimate: float
    threshold: float
    lower: float
    upper: float
    lower_open: bool
    upper_open: bool
    reasons: tuple
    n_evaluations: int
    seconds: float
    best_point: np.ndarray
    best_objective: float

    @property
    def interval(self) -> tuple[float, float]:
        """``(lower, upper)`` in the optimizer's coordinates (scaled)."""
        return (self.lower, self.upper)

    def contains(self, value: float) -> bool:
        """Whether the interval holds ``value`` (scaled)."""
        return self.lower <= float(value) <= self.upper

    def to_json(self) -> dict:
        """A JSON form (lists and numbers; ``from_json`` reads it back)."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = np.asarray(v).tolist() if isinstance(v, np.ndarray) else (list(v) if isinstance(v, tuple) else v)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ParameterProfile":
        """Read :meth:`to_json`'s form."""
        kw = dict(data)
        for key in ("values", "objectives", "points", "best_point"):
            kw[key] = np.asarray(kw[key], dtype=np.float64)
        kw["reasons"] = tuple(kw["reasons"])
        for key in ("optimum", "estimate", "threshold", "lower", "upper", "seconds", "best_objective"):
            kw[key] = float(kw[key])
        return cls(**kw)


@dataclasses.dataclass(frozen=True)
class ProfileResult:
    """The profiles of a fit's parameters (``ds.inference.profile``).

    Attributes:
        profiles: theta name -> :class:`ParameterProfile`, in theta order.
        theta: the optimum the profiles start from (scaled); objective: its value.
        confidence, delta: the intervals' confidence and the threshold's rise ``Delta``.
        scales: theta name -> the parameter's scale (``"lin"``, ``"log"``, ``"log10"``).
        failures: theta name -> error message of profiles whose task failed.
    """

    profiles: dict
    theta: np.ndarray
    objective: float
    confidence: float
    delta: float
    scales: dict
    failures: dict = dataclasses.field(default_factory=dict)

    def intervals(self, linear: bool = False) -> dict:
        """Name -> ``(lower, upper)``: scaled (default) or on the linear scale."""
        out = {}
        for name, p in self.profiles.items():
            lo, hi = p.lower, p.upper
            if linear:
                lo, hi = (_from_scale(self.scales.get(name, "lin"), v) for v in (lo, hi))
            out[name] = (lo, hi)
        return out

    @property
    def better(self) -> tuple[float, np.ndarray] | None:
        """``(objective, theta)`` of a profile point below the optimum by more than the options'
        ``better_tolerance`` (the fit had not converged; refit from there), else None."""
        best = min(self.profiles.values(), key=lambda p: p.best_objective, default=None)
        if best is None or not best.best_objective < self.objective - 1e-3:
            return None
        return best.best_objective, best.best_point

    def table(self) -> list[dict]:
        """One row per parameter: name, estimate, interval (scaled and linear), open sides, why
        each side stopped, evaluations and seconds."""
        rows = []
        linear = self.intervals(linear=True)
        for name, p in self.profiles.items():
            scale = self.scales.get(name, "lin")
            rows.append({"parameter": name, "scale": scale, "estimate": p.estimate, "lower": p.lower,
                         "upper": p.upper, "estimate_linear": _from_scale(scale, p.estimate),
                         "lower_linear": linear[name][0], "upper_linear": linear[name][1],
                         "lower_open": p.lower_open, "upper_open": p.upper_open, "lower_reason": p.reasons[0],
                         "upper_reason": p.reasons[1], "evaluations": p.n_evaluations,
                         "seconds": round(float(p.seconds), 3)})  # fmt: skip
        return rows

    def to_json(self) -> dict:
        """A JSON form (``from_json`` reads it back): every profile's points and the optimum."""
        return {"format": PROFILES_FORMAT, "theta": np.asarray(self.theta).tolist(), "objective": float(self.objective),
                "confidence": float(self.confidence), "delta": float(self.delta), "scales": dict(self.scales),
                "failures": dict(self.failures),
                "profiles": {name: p.to_json() for name, p in self.profiles.items()}}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ProfileResult":
        """Read :meth:`to_json`'s form.

        Raises:
            ValueError: for another format.
        """
        if data.get("format") != PROFILES_FORMAT:
            raise ValueError(f"ProfileResult.from_json: format {data.get('format')!r} is not {PROFILES_FORMAT!r}.")
        return cls(profiles={k: ParameterProfile.from_json(v) for k, v in data["profiles"].items()},
                   theta=np.asarray(data["theta"], dtype=np.float64), objective=float(data["objective"]),
                   confidence=float(data["confidence"]), delta=float(data["delta"]), scales=dict(data["scales"]),
                   failures=dict(data.get("failures", {})))  # fmt: skip


def _from_scale(scale: str, value: float) -> float:
    return {"lin": lambda v: v, "log": math.exp, "log10": lambda v: 10.0**v}[scale](float(value))


def profile_parameter(lowered: AbstractLoweredStudy, theta: Any, objective: float, parameter: int | str,
                      options: ProfileOptions = ProfileOptions()) -> ParameterProfile:  # fmt: skip
    """The profile of one parameter from an optimum, and its confidence interval.

    Args:
        lowered: the lowered study.
        theta: the optimum (scaled), e.g. ``FitResult.theta``.
        objective: the objective there (``FitResult.objective``).
        parameter: the parameter's theta name or index.
        options: :class:`ProfileOptions`.

    Returns:
        A :class:`ParameterProfile`.

    Raises:
        ValueError: for an unknown parameter, a theta of the wrong shape, one parameter only
            (nothing to re-optimize: its profile is the objective itself, not supported here), or
            ``options.hierarchical`` naming a parameter the residuals are not affine in.
    """
    start = time.perf_counter()
    names = tuple(lowered.problem.theta_names)
    if isinstance(parameter, str):
        if parameter not in names:
            raise ValueError(f"profile: {parameter!r} is not an estimated parameter; theta is {list(names)}.")
        index = names.index(parameter)
    else:
        index = int(parameter)
        if not 0 <= index < len(names):
            raise ValueError(f"profile: parameter index {index} is outside theta (size {len(names)}).")
    theta = np.asarray(theta, dtype=np.float64)
    if theta.shape != (len(names),):
        raise ValueError(f"profile: theta has shape {theta.shape}; expected ({len(names)},).")
    if len(names) < 2:
        raise ValueError("profile: a study with one estimated parameter has no other parameters to re-optimize.")
    f_hat = float(objective)
    dof = len(names) if options.simultaneous else 1
    delta = threshold(lowered.scale, options.confidence, dof)
    lo_b, hi_b = float(np.asarray(lowered.lower)[index]), float(np.asarray(lowered.upper)[index])
    evaluations = [0]
    # Found once, at the optimum; each point's StartObjective holds the profiled parameter fixed.
    analytic = AnalyticParameters.find(lowered, options.hierarchical, theta) if options.hierarchical else None

    # The optimum's local covariance: the first step and the direction the others move along.
    _, _, H = lowered.gauss_newton(theta)
    evaluations[0] += 1
    cov = np.linalg.pinv(np.asarray(H), hermitian=True) if np.all(np.isfinite(H)) else np.zeros((len(names),) * 2)
    var = float(cov[index, index])
    direction = cov[:, index] / var if var > 0 else np.zeros(len(names))
    direction[index] = 1.0
    first_step = math.sqrt(2.0 * delta * var) if var > 0 else options.max_step
    first_step = float(np.clip(0.5 * first_step, options.min_step, options.max_step))

    def optimize(t: float, guess: np.ndarray):
        """The profile at ``theta_i = t`` (re-optimization from ``guess``): (value, theta)."""
        x0 = np.clip(guess, lowered.lower, lowered.upper)
        x0[index] = t
        r = run_start(lowered, options.optimizer, x0, fixed={index: t}, analytic=analytic)
        evaluations[0] += r.n_evaluations
        return r.objective, np.asarray(r.x, dtype=np.float64)

    sides, reasons, ends, opens = [], [], [], []
    for sign in (-1.0, 1.0):
        bound = lo_b if sign < 0 else hi_b
        pts: list = []  # (t, value, theta)
        t, f, x = float(theta[index]), f_hat, theta.copy()
        step, reason, crossed = first_step, "max_steps", None
        for _ in range(int(options.max_steps)):
            if abs(t - bound) <= 1e-12 * max(1.0, abs(bound)):
                reason = "bound"
                break
            t_new = float(np.clip(t + sign * step, min(lo_b, hi_b), max(lo_b, hi_b)))
            f_new, x_new = optimize(t_new, x + (t_new - t) * direction)
            if not np.isfinite(f_new):  # every re-optimization start failed to solve: shorter step
                if step <= options.min_step:
                    reason = "solve failed"
                    break
                step = max(step / 4.0, options.min_step)
                continue
            pts.append((t_new, f_new, x_new))
            if f_new - f_hat > delta:
                crossed = ((t, f, x), (t_new, f_new, x_new))
                reason = "crossed"
                break
            rise = f_new - f
            factor = math.sqrt(options.step_increase * delta / rise) if rise > 0 else 2.0
            step = float(np.clip(step * min(max(factor, 0.5), 2.0), options.min_step, options.max_step))
            t, f, x = t_new, f_new, x_new
        if crossed is not None:
            end, more = _crossing(crossed, f_hat + delta, optimize, options)
            pts.extend(more)
            opens.append(False)
        else:
            end = t
            opens.append(True)
        ends.append(end)
        reasons.append(reason)
        sides.append(pts)
    points = [(float(theta[index]), f_hat, theta.copy())] + sides[0] + sides[1]
    points.sort(key=lambda p: p[0])
    values = np.array([p[0] for p in points])
    objectives = np.array([p[1] for p in points])
    best = int(np.argmin(objectives))
    return ParameterProfile(
        name=names[index], index=index, values=values, objectives=objectives,
        points=np.stack([p[2] for p in points]), optimum=f_hat, estimate=float(theta[index]),
        threshold=f_hat + delta, lower=float(ends[0]), upper=float(ends[1]), lower_open=bool(opens[0]),
        upper_open=bool(opens[1]), reasons=tuple(reasons), n_evaluations=int(evaluations[0]),
        seconds=time.perf_counter() - start, best_point=points[best][2], best_objective=float(objectives[best]),
    )  # fmt: skip


def _crossing(bracket, level: float, optimize, options: ProfileOptions):
    """Where the profile crosses ``level`` between ``bracket``'s points (below, above): safeguarded
    interpolation (the Illinois variant of regula falsi), each trial a re-optimization warm-started
    from the nearer bracket point. Returns the crossing and the points computed on the way."""
    (ta, fa, xa), (tb, fb, xb) = bracket
    ga, gb = fa - level, fb - level  # true rises above the level at the bracket's ends
    wa, wb = ga, gb  # the Illinois weights (halved on a side kept twice)
    more = []
    side = 0
    for _ in range(int(options.refine_iterations)):
        if abs(gb) <= options.crossing_tolerance:
            return tb, more
        if abs(ga) <= options.crossing_tolerance:
            return ta, more
        t = tb - wb * (tb - ta) / (wb - wa) if wb != wa else 0.5 * (ta + tb)
        # Keep the trial inside the bracket, away from its ends (guards against a flat side).
        lo, hi = min(ta, tb), max(ta, tb)
        t = float(np.clip(t, lo + 0.05 * (hi - lo), hi - 0.05 * (hi - lo)))
        w = (t - ta) / (tb - ta)
        f, x = optimize(t, (1 - w) * xa + w * xb)
        if not np.isfinite(f):
            break
        more.append((t, f, x))
        g = f - level
        if g > 0:
            tb, gb, wb, xb = t, g, g, x
            if side == 1:
                wa *= 0.5
            side = 1
        else:
            ta, ga, wa, xa = t, g, g, x
            if side == -1:
                wb *= 0.5
            side = -1
    # The linear interpolant's root in the last bracket.
    return (ta - ga * (tb - ta) / (gb - ga) if gb != ga else 0.5 * (ta + tb)), more
