"""Noise levels optimized analytically (:class:`NoiseParameters`): parameters that are the spread
of their cells up to a factor per cell, found and checked, their closed-form optimum, and the
residuals and Jacobian of an evaluation moved to it. ``_hierarchical``'s docstring has the
method."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from ..objective._abstract_lowered import AbstractLoweredStudy
from ._analytic_entries import (
    AFFINE_RTOL,
    LOG_SLOPES,
    bounds_and_scales,
    candidate_indices,
    finite_residuals,
    noise_only_entries,
    without_parameters,
)


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
        scales: per parameter, its scale (``"lin"``, ``"log"``, ``"log10"``).
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
    scales: tuple[str, ...]

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
        theta_names = tuple(lowered.theta_names)
        wanted = candidate_indices(lowered, names, noise_only_entries(prob))
        if names is True and not wanted:
            return None
        theta = np.asarray(lowered.nominal if theta is None else theta, dtype=np.float64)
        params = [prob.study.entries[prob.estimated[j]].parameter for j in wanted]
        r0 = finite_residuals(lowered, theta, "the base point")
        rounding = 1e-12 * (1.0 + float(np.max(np.abs(r0))))
        keep, rows, log_rows, reasons = [], [], [], {}
        for k, (j, p) in enumerate(zip(wanted, params)):
            s0 = float(p.from_scale(theta[j]))
            c = 2.0 if 2.0 * s0 <= p.upper else 0.5
            moved = theta.copy()
            moved[j] = float(p.to_scale(c * s0))
            r1 = finite_residuals(lowered, moved, theta_names[j])
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
            log_slopes=tuple(LOG_SLOPES[params[k].scale] for k in keep), **bounds_and_scales([params[k] for k in keep]),
            scales=tuple(params[k].scale for k in keep),
        )  # fmt: skip

    def __len__(self) -> int:
        return len(self.indices)

    def without(self, indices: Sequence[int]) -> "NoiseParameters | None":
        """These parameters less the ``theta`` indices ``indices`` (a profile holds them fixed)."""
        return without_parameters(self, indices)

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
