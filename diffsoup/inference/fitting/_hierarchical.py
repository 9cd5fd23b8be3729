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
from ._analytic_entries import AFFINE_RTOL as AFFINE_RTOL
from ._analytic_entries import NO_EFFECT_RTOL as NO_EFFECT_RTOL
from ._analytic_entries import noise_only_entries as noise_only_entries
from ._analytic_entries import observable_only_entries as observable_only_entries
from ._analytic_entries import residuals_or_none as residuals_or_none
from ._linear_parameters import LinearParameters as LinearParameters
from ._linear_parameters import projected_jacobian as projected_jacobian
from ._linear_parameters import schur_complement as schur_complement
from ._noise_parameters import NoiseParameters as NoiseParameters

# Noise levels optimized analytically bring the residuals' Jacobian to the host at each evaluation
# (rows x theta; the plain Gauss-Newton evaluation sums it where it is computed, and only theta x
# theta travels). fit's default takes them only where that Jacobian has at most this many entries
# (128 MB in float64): a PEtab problem's is thousands, a study of a million experiments' is 10^8.
DEFAULT_MAX_JACOBIAN_ENTRIES = 2**24


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
