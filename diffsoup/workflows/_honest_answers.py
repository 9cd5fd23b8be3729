"""What a fit's summary says about how far its answer can be trusted: how many starts finished
and reached the best (within a stated tolerance), which estimates lie at a bound (their standard
errors withheld), and whether the problem's nominal parameter values beat the fit."""

from __future__ import annotations

from typing import Any

import numpy as np

# An estimate within this of a bound, on the optimizer's scale (log10 for log10-scaled parameters),
# is at that bound: the Gauss-Newton standard error there describes no interval.
AT_BOUND = 1e-3
# The summary lists this many of the best distinct optima (and counts them all).
LISTED_OPTIMA = 10


def check_tolerance(at_best_tolerance: float | None) -> float:
    """The tolerance of "at the best" (None: 1e-3, :data:`ds.inference` 's CONVERGED).

    Raises:
        ValueError: naming ``at_best_tolerance``, for a value that is not a finite number >= 0.
    """
    from ..inference.fitting._results import CONVERGED

    tolerance = CONVERGED if at_best_tolerance is None else float(at_best_tolerance)
    if not (np.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"at_best_tolerance={at_best_tolerance!r} (--at-best-tolerance) must be a finite number "
                         ">= 0, e.g. 1e-3.")  # fmt: skip
    return tolerance


def _nominal_objective(lowered: Any) -> float | None:
    """The objective at the problem's nominal values (PEtab's nominalValue; a study file's values),
    None where the problem has none or the value is not finite. Evaluated by the Gauss-Newton
    evaluation, whose program the fit's standard errors have compiled (``FitResult.from_starts``),
    so the comparison compiles nothing more."""
    nominal = getattr(lowered, "nominal", None)
    if nominal is None:
        return None
    theta = np.asarray(nominal, dtype=np.float64)
    if theta.size == 0 or not np.all(np.isfinite(theta)):
        return None
    try:
        value = float(lowered.gauss_newton(theta)[0])
    except Exception:  # noqa: BLE001 (a solve that raises at the nominal point: nothing to compare)
        return None
    return value if np.isfinite(value) else None


def at_bounds(lowered: Any, result: Any, tolerance: float = AT_BOUND) -> dict[str, str]:
    """Estimated parameters within ``tolerance`` (scaled) of a bound: name -> ``"lower"`` / ``"upper"``."""
    theta = np.asarray(result.theta, dtype=np.float64)
    lower, upper = np.asarray(lowered.lower, dtype=np.float64), np.asarray(lowered.upper, dtype=np.float64)
    found = {}
    for i, name in enumerate(result.theta_names[: theta.size]):
        if name not in result.parameters or i >= lower.size:
            continue
        if theta[i] - lower[i] <= tolerance:
            found[name] = "lower"
        elif upper[i] - theta[i] <= tolerance:
            found[name] = "upper"
    return found


def distinct_objectives(result: Any, tolerance: float | None = None) -> tuple:
    """The distinct optima a fit's finished starts reached, told apart by objective alone:
    ``((objective, start indices), ...)``, best first, each start joining the first optimum whose
    best objective is within ``tolerance`` (None: 1e-3) of its own (the batched fit's
    ``distinct_optima`` with no test on the points).

    Ends on one flat valley (a non-identifiable direction: the same objective at points that
    differ along it) are one optimum here, however far apart their points; a batched fit's
    ``FitResult.optima`` separates ends by point as well. Failed and stalled starts are left out.
    """
    from ..inference.fitting._batched_fit import distinct_optima

    tolerance = check_tolerance(tolerance)
    values = np.array([s.objective if getattr(s, "finished", True) else np.inf for s in result.starts], dtype=np.float64)
    points = np.zeros((values.size, 1))  # no test on the points: one unbounded coordinate, equal everywhere
    groups = distinct_optima(values, points, np.array([-np.inf]), np.array([np.inf]), tolerance=tolerance,
                             same_point=np.inf)  # fmt: skip
    return tuple((float(values[g[0]]), tuple(int(i) for i in g)) for g in groups)


def honest_entries(lowered: Any, result: Any, at_best_tolerance: float | None = None) -> dict:
    """The summary's ``starts``, ``at_bound``, ``standard_errors_withheld`` and ``nominal_objective``
    entries, and ``advice``: the warning lines to print (popped by the caller).

    ``starts``: ``total``; ``finished`` (a finite objective, having moved); ``failed`` (the rest:
    no finite objective, or never moved from a start point far above the best); ``at_best``
    (within ``at_best_tolerance``, default 1e-3, of the best objective); the tolerance, the best
    start's index and message; ``optima``, the distinct optima the finished starts reached, told
    apart by objective within the same tolerance (:func:`distinct_objectives`: ends on one
    flat valley, whose points differ along a non-identifiable direction, are one optimum), best
    first, as ``{"objective", "starts"}`` (at most :data:`LISTED_OPTIMA`; ``distinct_optima``
    counts them all).
    """
    tolerance = check_tolerance(at_best_tolerance)
    finished = sum(bool(getattr(s, "finished", np.isfinite(s.objective))) for s in result.starts)
    at_best = int(np.sum(result.converged(tolerance)))
    starts = {"total": len(result.starts), "finished": int(finished), "failed": len(result.starts) - int(finished),
              "at_best": at_best, "at_best_tolerance": tolerance, "best": int(result.best),
              "message": result.message}  # fmt: skip
    optima = distinct_objectives(result, tolerance)
    starts["distinct_optima"] = len(optima)
    starts["optima"] = [{"objective": value, "starts": len(members)} for value, members in optima[:LISTED_OPTIMA]]
    bound = at_bounds(lowered, result)
    withheld = {name: f"at its {side} bound (within {AT_BOUND:g} on the optimizer's scale): the Gauss-Newton "
                      "standard error describes no interval there; a profile does"
                for name, side in bound.items()}  # fmt: skip
    unidentifiable = [name for name, se in result.standard_errors.items()
                      if name in result.parameters and name not in bound and not np.isfinite(se)]  # fmt: skip
    withheld.update({name: "not identifiable at the estimate: the Gauss-Newton Hessian is singular along it, so "
                           "its standard error is unbounded; a profile shows how far it can move"
                     for name in unidentifiable})  # fmt: skip
    advice = []
    stalled = sum(bool(getattr(s, "stalled", False)) for s in result.starts)
    if starts["failed"]:
        advice.append(f"{starts['failed']} of {starts['total']} starts failed"
                      + (f" ({stalled} never moved from their start point)" if stalled else "")
                      + ": they are not counted as finished")  # fmt: skip
    if bound:
        advice.append("at a bound (no standard error given): "
                      + ", ".join(f"{name} ({side})" for name, side in bound.items()))  # fmt: skip
    if unidentifiable:
        advice.append("not identifiable at the estimate (the data do not determine it; no standard error given): "
                      + ", ".join(unidentifiable))  # fmt: skip
    nominal = _nominal_objective(lowered)
    if nominal is not None and nominal < float(result.objective) - tolerance:
        advice.append(f"the nominal parameters give {nominal:.8g}, lower than the fit's {float(result.objective):.8g}: "
                      "run more starts or --method batched")  # fmt: skip
    return {"starts": starts, "at_bound": bound, "standard_errors_withheld": withheld,
            "nominal_objective": nominal, "advice": advice}  # fmt: skip
