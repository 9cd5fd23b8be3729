"""Noise levels optimized analytically inside the lanes of a batched fit (:class:`LaneNoise`).

``fit``'s default (``hierarchical=None``) optimizes the noise levels that qualify in closed form at
every evaluation (:class:`~diffsoup.inference.fitting._noise_parameters.NoiseParameters`): the
optimizer moves only the other coordinates, on the profile of the objective over the noise levels.
Here the same is done for many points at once, on the device, so that the starts of
``fit(method="batched")`` stay the lanes of one program and see the objective fides sees:

- the lanes move the other coordinates (``free``); a point is evaluated with the noise levels at
  the nominal ones (any spread will do: a data residual scales as ``1 / s``);
- from those residuals and Jacobians, :meth:`LaneNoise.moved` (jitted, vmapped over the points)
  gives each point's noise optimum ``s* = s sqrt(mean r^2)`` over its cells (clipped to the
  bounds), the residuals there and their Jacobian (``NoiseParameters.moved``'s formulas), and
  projects the columns of the noise levels inside their bounds out of the free columns (Kaufman's
  variable projection, as ``projected_jacobian``): ``J^T J`` of the projected Jacobian is the
  Schur complement, the Gauss-Newton Hessian of the profile, and ``J^T r`` its gradient.

No evaluation more per point than without them. Measured from the same 40 Boehm starts (2-core
CPU, 100 evaluations per start, no polish): 3 lanes end at the collection's optimum with 1,832
evaluations, against none with 2,591 when the lanes move the three noise levels as coordinates.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..objective._abstract_lowered import AbstractLoweredStudy
from ._analytic_entries import LOG_SLOPES
from ._noise_parameters import NoiseParameters

# Optimizer coordinate -> linear value and back, per parameter scale: ``Parameter.from_scale`` and
# ``to_scale`` in JAX (those convert to numpy arrays, which a traced value cannot be).
FROM_SCALE = {"lin": lambda v: v, "log": jnp.exp, "log10": lambda v: 10.0**v}
TO_SCALE = {"lin": lambda s: s, "log": jnp.log, "log10": jnp.log10}
INTERIOR_RTOL = 1e-12  # a noise optimum this close to a bound (share of its range) is held there (as NoiseParameters)


@dataclasses.dataclass(frozen=True, eq=False)
class LaneNoise:
    """The noise levels of a lowered study optimized in closed form for many points at once.

    Attributes:
        noise: the noise levels (``NoiseParameters``: their cells, scales and bounds).
        free: ``theta`` indices the lanes move (every other coordinate).
        template: ``(n_theta,)`` the point the lanes' coordinates are set into (the nominal one:
            its noise levels are the spreads each point is evaluated with).
    """

    noise: NoiseParameters
    free: np.ndarray
    template: np.ndarray

    @classmethod
    def of(cls, lowered: AbstractLoweredStudy, analytic: Any) -> "LaneNoise | None":
        """The lanes' noise levels for ``fit``'s analytic parameters ``analytic``: None where there
        are none, or where offsets or scaling factors are analytic too (``hierarchical=True``: the
        lanes then move every coordinate, and only the polish optimizes them analytically)."""
        if analytic is None or analytic.noise is None or analytic.affine is not None:
            return None
        noise = analytic.noise
        k = lowered.problem.n_theta
        free = np.setdiff1d(np.arange(k), noise.indices).astype(np.int64)
        return cls(noise, free, np.asarray(lowered.nominal, dtype=np.float64).copy())

    def thetas(self, x: np.ndarray) -> np.ndarray:
        """Full points ``(s, n_theta)`` of the lanes' coordinates ``x`` ``(s, len(free))``."""
        x = np.atleast_2d(np.asarray(x, dtype=np.float64))
        out = np.tile(self.template, (len(x), 1))
        out[:, self.free] = x
        return out

    @functools.cached_property
    def _program(self):
        return jax.jit(jax.vmap(self._moved_one))

    def moved(self, thetas, r, J):
        """``(thetas*, r*, J*)`` for points ``thetas`` ``(s, n_theta)`` with residuals ``r``
        ``(s, m)`` and Jacobians ``J`` ``(s, m, n_theta)`` there: each point with its noise levels
        at their optimum, the residuals there, and their Jacobian over the free coordinates with
        the noise levels inside their bounds projected out (``(s, m, len(free))``). A point whose
        residuals are not finite gives non-finite numbers (a failed solve stays one)."""
        return self._program(jnp.asarray(thetas, jnp.float64), jnp.asarray(r, jnp.float64), jnp.asarray(J, jnp.float64))

    def _moved_one(self, theta, r, J):
        noise = self.noise
        r_new, J_new, theta_new, interior = r, J, theta, []
        for k, j in enumerate(noise.indices.tolist()):
            data, logs = noise.rows[k], noise.log_rows[k]
            scale = noise.scales[k]
            lo, hi = float(noise.lower[k]), float(noise.upper[k])
            s = FROM_SCALE[scale](theta[j])
            best = jnp.clip(s * jnp.sqrt(jnp.sum(r[data] ** 2) / float(noise.counts[k])), lo, hi)
            interior.append((best - lo > INTERIOR_RTOL * (hi - lo)) & (hi - best > INTERIOR_RTOL * (hi - lo)))
            theta_new = theta_new.at[j].set(TO_SCALE[scale](best))
            q, slope = s / best, LOG_SLOPES[scale](best)
            r_log = jnp.sqrt(r[logs] ** 2 + 2.0 * jnp.log(best / s))
            J_new = J_new.at[data].multiply(q).at[logs].multiply((r[logs] / r_log)[:, None])
            J_new = J_new.at[data, j].set(-r[data] * q * slope).at[logs, j].set(slope / r_log)
            r_new = r_new.at[data].multiply(q).at[logs].set(r_log)
        inside = jnp.stack(interior)
        J_free = J_new[:, self.free]
        J_noise = J_new[:, noise.indices] * inside[None, :]
        # (I - P) J_free, P the projection onto the interior noise columns (a held one: a zero column).
        gram = J_noise.T @ J_noise + jnp.diag(jnp.where(inside, 0.0, 1.0))
        return theta_new, r_new, J_free - J_noise @ jnp.linalg.solve(gram, J_noise.T @ J_free)

    def optimum(self, lowered: AbstractLoweredStudy, x: np.ndarray, lanes: int) -> tuple[np.ndarray, np.ndarray]:
        """The full points of lanes' end coordinates ``x`` ``(s, len(free))`` with their noise
        levels at the optimum, from one evaluation of each (``lanes`` points at a time, the lane
        program's size), and which of them solved (one that did not keeps the nominal noise levels)."""
        thetas = self.thetas(x)
        out, solved = thetas.copy(), np.zeros(len(thetas), dtype=bool)
        lanes = max(1, int(lanes))
        for at in range(0, len(thetas), lanes):
            n = min(lanes, len(thetas) - at)
            # A last, partial chunk is padded (inactive copies of its first point): the program of
            # `lanes` points is the one the lanes compiled, another count would compile anew.
            part = np.concatenate([thetas[at : at + n], np.repeat(thetas[at : at + 1], lanes - n, axis=0)])
            r, J, failures = lowered.residuals_and_jacobians(part, np.arange(lanes) < n)
            moved = np.asarray(self.moved(part, r, J)[0])[:n]
            ok = np.array([not f for f in failures[:n]]) & np.all(np.isfinite(moved), axis=1)
            out[at : at + n][ok] = moved[ok]
            solved[at : at + n] = ok
        return out, solved
