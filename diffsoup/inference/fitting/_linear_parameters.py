"""Offsets and scaling factors optimized analytically (:class:`LinearParameters`): the parameters
the residuals are affine in, found and checked, and their bounded linear least-squares optimum;
with the variable-projection algebra the optimizers apply to them (:func:`schur_complement`,
:func:`projected_jacobian`). ``_hierarchical``'s docstring has the method."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from ..objective._abstract_lowered import AbstractLoweredStudy
from ._analytic_entries import (
    AFFINE_RTOL,
    NO_EFFECT_RTOL,
    bounds_and_scales,
    candidate_indices,
    finite_residuals,
    observable_only_entries,
    without_parameters,
)


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
        theta_names = tuple(lowered.theta_names)
        wanted = candidate_indices(lowered, names, observable_only_entries(prob))  # window starts are never linear
        if names is True and not wanted:
            return None
        theta = np.asarray(lowered.nominal if theta is None else theta, dtype=np.float64)
        params = [prob.study.entries[prob.estimated[j]].parameter for j in wanted]
        candidate = cls._of(lowered, wanted, params)
        at = lambda v: candidate._theta(theta, v)  # noqa: E731
        r0 = finite_residuals(lowered, at(candidate.base), "the base point")
        rounding = 1e-12 * (1.0 + float(np.max(np.abs(r0))))
        keep, columns, reasons = [], [], {}
        for k in range(len(wanted)):
            e = np.zeros(len(wanted))
            e[k] = 1.0
            r1 = finite_residuals(lowered, at(candidate.base + candidate.step * e), theta_names[wanted[k]])
            r2 = finite_residuals(lowered, at(candidate.base + 2 * candidate.step * e), theta_names[wanted[k]])
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
        joint = finite_residuals(lowered, found._theta(theta, probe), "the joint check")
        deviation = float(np.max(np.abs(joint - (a - B @ probe))))
        if deviation > AFFINE_RTOL * float(np.max(np.abs(B * found.step))) + rounding:
            raise ValueError(
                f"hierarchical: the residuals are affine in each of {list(found.names)} alone but not jointly "
                f"(deviation {deviation:.3g}); name the parameters to optimize analytically."
            )
        return found

    @classmethod
    def _of(cls, lowered: AbstractLoweredStudy, indices: Sequence[int], params: Sequence[Any]) -> "LinearParameters":
        bounds = bounds_and_scales(params)
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
        return without_parameters(self, indices)

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
