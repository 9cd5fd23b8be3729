"""``Fides``: the interior trust-region reflective optimizer of the ``fides`` package as a fit method.

fides (Fröhlich & Sorger, PLoS Comput Biol 18(7): e1010322, 2022) minimizes within box bounds
by trust-region steps in the affine-scaled coordinates of Coleman & Li (1994, 1996), solving the
subproblem in a two-dimensional (or full) subspace and reflecting steps at the bounds. It is
what pyPESTO runs on likelihoods of ODE models. Its Hessian here is one of:

- ``"gauss_newton"``: ``2 scale J^T J`` of the noise-weighted residuals' Jacobian by forward
  sensitivities (the Fisher information at the data for Gaussian noise), formed where the
  experiments are evaluated (one evaluation per trial point; ``LoweredStudy.gauss_newton``);
- ``"hybrid"``: that Gauss-Newton matrix until the trust region stops changing for
  ``hybrid_switch`` iterations, then BFGS updates from it (fides' ``HybridFixed``; pyPESTO's
  default for objectives with a Hessian);
- ``"exact"``: the lowered study's Hessian (forward over reverse, or central differences of
  gradients: ``ds.lower(hessian=...)``; two evaluations per trial point);
- ``"bfgs"``, ``"sr1"``: quasi-Newton updates from gradients alone (``value_and_grad``: the
  adjoint gradient for many parameters).

A trial point whose solve failed returns NaN, which fides rejects, shrinking the radius.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import ClassVar

import numpy as np

from ._optimizers import AbstractOptimizer, Outcome, StartObjective

HESSIANS = ("gauss_newton", "hybrid", "exact", "bfgs", "sr1")
DEFAULT_HESSIAN = "gauss_newton"
SUBSPACES = ("2D", "full", "scg")


@dataclasses.dataclass(frozen=True)
class Fides(AbstractOptimizer):
    """fides' trust-region optimizer as a ``fit`` method (``method="fides"`` is ``Fides()``).

    Attributes:
        hessian: ``"gauss_newton"`` (default), ``"hybrid"``, ``"exact"``, ``"bfgs"`` or ``"sr1"``
            (see the module's docstring).
        max_evaluations: most iterations, one trial point each (fides' ``maxiter``).
        max_seconds: wall-time limit per start (fides' ``maxtime``).
        fatol, frtol: stop when an accepted step changes the objective by less than
            ``fatol + frtol |f|`` (fides' own defaults, which pyPESTO keeps). Looser is faster and
            stops short in flat valleys: from one Fujita start ``fatol=1e-6`` ended 0.0044 above
            the valley's floor after 265 iterations, 1e-8 0.0019 above after 282 and ``fatol =
            frtol = 0`` (stop on the gradient or the radius) reached it after 433; on Bruno's 20
            starts 1e-8 took 5 % more evaluations than 1e-6 and ``0`` 87 % more, each converging
            15.
        gatol, grtol: stop when the (bound-scaled) gradient norm is below ``gatol`` or ``grtol |f|``.
        xtol: stop when an accepted step is shorter than this (0: never).
        subspace: the trust-region subproblem's subspace, ``"2D"``, ``"full"`` or ``"scg"``.
        hybrid_switch: iterations without a radius change after which ``"hybrid"`` switches to BFGS.
        delta_init: the first trust-region radius (theta's units).
        log_level: the level of fides' own logger (``logging.ERROR`` keeps it quiet).

    Raises:
        ValueError: for an unknown ``hessian`` or ``subspace``, or a non-positive count.
    """

    name: ClassVar[str] = "fides"
    hessian: str = DEFAULT_HESSIAN
    max_evaluations: int = 1000
    max_seconds: float = math.inf
    fatol: float = 1e-8
    frtol: float = 1e-8
    gatol: float = 1e-6
    grtol: float = 0.0
    xtol: float = 0.0
    subspace: str = "2D"
    hybrid_switch: int = 20
    delta_init: float = 1.0
    log_level: int = logging.ERROR

    def __post_init__(self):
        if self.hessian not in HESSIANS:
            raise ValueError(f"Fides: hessian={self.hessian!r} must be one of {HESSIANS}.")
        if self.subspace not in SUBSPACES:
            raise ValueError(f"Fides: subspace={self.subspace!r} must be one of {SUBSPACES}.")
        for field in ("max_evaluations", "hybrid_switch"):
            if int(getattr(self, field)) < 1:
                raise ValueError(f"Fides: {field}={getattr(self, field)!r} must be a positive integer.")
        for field in ("fatol", "frtol", "gatol", "grtol", "xtol"):
            if not float(getattr(self, field)) >= 0:
                raise ValueError(f"Fides: {field}={getattr(self, field)!r} must be non-negative.")
        if not (float(self.max_seconds) > 0 and float(self.delta_init) > 0):
            raise ValueError("Fides: max_seconds and delta_init must be positive.")

    def _update(self):
        import fides

        return {"gauss_newton": None, "exact": None, "bfgs": fides.BFGS(), "sr1": fides.SR1(),
                "hybrid": fides.HybridFixed(switch_iteration=int(self.hybrid_switch))}[self.hessian]  # fmt: skip

    def _function(self, objective: StartObjective):
        if self.hessian in ("gauss_newton", "hybrid"):
            return objective.gauss_newton
        if self.hessian == "exact":
            return objective.value_grad_hessian
        return objective.value_and_grad

    def minimize(self, objective: StartObjective, x0: np.ndarray, f0: float) -> Outcome:
        import fides

        options = {
            fides.Options.MAXITER: int(self.max_evaluations), fides.Options.MAXTIME: float(self.max_seconds),
            fides.Options.FATOL: float(self.fatol), fides.Options.FRTOL: float(self.frtol),
            fides.Options.GATOL: float(self.gatol), fides.Options.GRTOL: float(self.grtol),
            fides.Options.XTOL: float(self.xtol), fides.Options.SUBSPACE_DIM: self.subspace,
            fides.Options.DELTA_INIT: float(self.delta_init),
        }  # fmt: skip
        opt = fides.Optimizer(self._function(objective), ub=objective.upper, lb=objective.lower,
                              verbose=self.log_level, options=options, hessian_update=self._update())  # fmt: skip
        message = None
        try:
            opt.minimize(np.asarray(x0, dtype=np.float64))
        except RuntimeError as exc:  # fides refuses a non-finite start or a point outside the bounds
            message = f"fides stopped: {exc}"
        flag = opt.exitflag
        if message is None:
            message = f"fides: {getattr(flag, 'name', flag)}"
        if opt.x_min is None or not np.isfinite(opt.fval_min):
            return Outcome(np.asarray(x0, dtype=np.float64), float(f0), False, message, int(opt.iteration))
        success = bool(int(flag) > 0)
        return Outcome(np.asarray(opt.x_min, dtype=np.float64), float(opt.fval_min), success, message,
                       int(opt.iteration))  # fmt: skip
