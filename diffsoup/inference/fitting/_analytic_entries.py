"""What the analytic parameters of a hierarchical fit share: the checks that a parameter qualifies
(which study entries reach the objective only as observable parameters or only as spreads, the
tolerances of the affine check), residuals that must be finite, and the per-parameter bounds,
scales and selection their dataclasses are built from. ``_hierarchical``'s docstring has the
method."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from ..objective._abstract_lowered import AbstractLoweredStudy
from ..objective._lane_inputs import LaneInputs

# Largest deviation of the residuals from the affine prediction, relative to the parameter's effect
# (its column of B), at which it still counts as affine: the solves do not depend on it, so the
# residuals repeat to rounding, while a non-affine observable parameter misses by order one.
AFFINE_RTOL = 1e-6
# A column of B this small (relative to 1 + max |r|) means the parameter changes no residual.
NO_EFFECT_RTOL = 1e-12


# d log(s) / d theta for a parameter on each scale, as a function of its linear value s.
LOG_SLOPES: dict[str, Callable[[float], float]] = {
    "lin": lambda s: 1.0 / s, "log": lambda s: 1.0, "log10": lambda s: float(np.log(10.0)),
}


def bounds_and_scales(params: Sequence[Any]) -> dict:
    """``lower``, ``upper`` (linear values), ``to_scale`` and ``from_scale`` of study parameters."""
    return {"lower": np.array([float(p.lower) for p in params]), "upper": np.array([float(p.upper) for p in params]),
            "to_scale": tuple(p.to_scale for p in params), "from_scale": tuple(p.from_scale for p in params)}  # fmt: skip


def without_parameters(found: Any, indices: Sequence[int]) -> Any:
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


def candidate_indices(lowered: AbstractLoweredStudy, names: bool | str | Sequence[str],
                      qualifying: set[int]) -> list[int]:  # fmt: skip
    """The ``theta`` indices to check: for ``names`` True, every estimated parameter whose study
    entry is in ``qualifying``; else the named ones (a name or a sequence of names).

    Raises:
        ValueError: for a name that is not an estimated parameter (window starts never are).
    """
    prob = lowered.problem
    n_par = getattr(prob, "n_parameters", prob.n_theta)
    if names is True:
        return [j for j in range(n_par) if int(prob.estimated[j]) in qualifying]
    theta_names = tuple(lowered.theta_names)
    names = (names,) if isinstance(names, str) else tuple(names)
    unknown = [n for n in names if n not in theta_names[:n_par]]
    if unknown:
        raise ValueError(f"hierarchical: {unknown} are not estimated parameters; theta is {list(theta_names[:n_par])}.")
    return [theta_names.index(n) for n in names]


def observable_only_entries(problem: Any) -> set[int]:
    """Study entries that reach the objective only through experiments' observable parameters
    (not the model parameters, initial states, pre-equilibration or noise of any experiment)."""
    uses = entry_uses(problem)
    return uses["observable"] - uses["spread"] - uses["elsewhere"]


def noise_only_entries(problem: Any) -> set[int]:
    """Study entries that reach the objective only as spreads of measured values (a named spread
    per experiment or per cell), not as model, observable or pre-equilibration parameters or
    initial states."""
    uses = entry_uses(problem)
    return uses["spread"] - uses["observable"] - uses["elsewhere"]


def entry_uses(problem: Any) -> dict[str, set[int]]:
    """The study entries each kind of use reaches, over every experiment: ``"observable"``
    (observable parameters), ``"spread"`` (named spreads) and ``"elsewhere"`` (model and
    pre-equilibration parameters, initial states)."""
    uses: dict[str, set[int]] = {"observable": set(), "spread": set(), "elsewhere": set()}
    for group in problem.groups:
        block = problem.row_blocks.block(group)
        for key in LaneInputs._fields:
            if not key.endswith(("_entry", "_entries")):
                continue
            kind = "observable" if key == "op_entry" else "spread" if key in ("sigma_entry", "sigma_entries") else "elsewhere"
            uses[kind] |= block.entries(key)
    return uses


def residuals_or_none(lowered: AbstractLoweredStudy, theta: np.ndarray) -> np.ndarray | None:
    """The residuals at ``theta``, or None where a solve failed or one is not finite."""
    r = np.asarray(lowered.residuals(theta), dtype=np.float64)
    return None if lowered.last_failures or not np.all(np.isfinite(r)) else r


def finite_residuals(lowered: AbstractLoweredStudy, theta: np.ndarray, where: str) -> np.ndarray:
    """The residuals at ``theta`` for the checks that find analytic parameters, by the Jacobian
    program: a fit compiles it in any case (its standard errors come from it, as do fides'
    Gauss-Newton steps), where the residuals program for these few checks alone cost as much
    compilation again (Boehm: 1.9-3.5 s of a 24 s command).

    Raises:
        ValueError: naming ``where``, where a solve failed or a residual is not finite.
    """
    r = np.asarray(lowered.residuals_and_jacobian(theta)[0], dtype=np.float64)
    r = None if lowered.last_failures or not np.all(np.isfinite(r)) else r
    if r is None:
        failed = ", ".join(f"{k}: {getattr(v, 'name', v)}" for k, v in lowered.last_failures.items()) or "non-finite residuals"
        raise ValueError(f"hierarchical: the residuals at {where} are not finite ({failed}); check at another theta=.")
    return r
