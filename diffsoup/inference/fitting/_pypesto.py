"""pyPESTO objectives on diffsoup's solver: ``pypesto_objective(lowered)``, ``pypesto_problem(lowered)``.

pyPESTO (parameter estimation toolbox: multistart optimizers, profiles, samplers, plots) calls an
objective with the orders of derivatives it needs. The objective here answers from one evaluation
of the lowered study per call:

- value (order 0): ``lowered.value``;
- value and gradient (order 1): ``lowered.value_and_grad`` (forward sensitivities or the
  checkpointed adjoint, as the study was lowered);
- with the Hessian (order 2): ``lowered.gauss_newton`` (the Gauss-Newton / Fisher-information
  matrix ``2 scale J^T J``; value and gradient come with it), or the lowered study's own Hessian
  with ``hessian="exact"``;
- residuals (``mode="mode_res"``): ``res = sqrt(2 scale) r``, so that pyPESTO's least-squares
  convention ``0.5 ||res||^2`` equals ``value - lowered.offset``; their Jacobian by forward
  sensitivities.

Where a solve failed the answer is NaN (pyPESTO's optimizers, fides among them, treat the point as
failed and step back). pyPESTO is imported when these functions are called; install it with
``pip install diffsoup[test]`` (or ``pip install pypesto``).
"""

from __future__ import annotations

import copy
import functools
import math
from typing import Any

import numpy as np

from ..objective._abstract_lowered import AbstractLoweredStudy
from ._hessians import PYPESTO_HESSIANS


def _pypesto():
    try:
        import pypesto
    except ImportError as exc:  # pragma: no cover (pypesto is in the test extra)
        raise ImportError(
            "pypesto_objective needs pyPESTO: pip install 'diffsoup[test]' (or pip install pypesto)."
        ) from exc
    return pypesto


@functools.cache
def _objective_class():
    """The ``pypesto.objective.ObjectiveBase`` subclass (defined once pyPESTO is imported)."""
    pypesto = _pypesto()
    from pypesto.C import FVAL, GRAD, HESS, MODE_FUN, MODE_RES, RES, SRES

    class DiffsoupObjective(pypesto.objective.ObjectiveBase):
        """A lowered study as a pyPESTO objective (see :func:`pypesto_objective`).

        Attributes:
            lowered: the lowered study; hessian: ``"gauss_newton"`` or ``"exact"``.
            n_evaluations: evaluations of the lowered study so far.
        """

        def __init__(self, lowered: AbstractLoweredStudy, hessian: str):
            super().__init__(x_names=list(lowered.problem.theta_names))
            self.lowered, self.hessian = lowered, hessian
            self.n_evaluations = 0

        def __deepcopy__(self, memo):  # pyPESTO copies objectives: share the (compiled) study
            other = type(self).__new__(type(self))
            for key, value in self.__dict__.items():
                setattr(other, key, value if key == "lowered" else copy.deepcopy(value, memo))
            return other

        def check_mode(self, mode) -> bool:
            return mode in (MODE_FUN, MODE_RES)

        def check_sensi_orders(self, sensi_orders, mode) -> bool:
            if not sensi_orders:
                return True
            return max(sensi_orders) <= (2 if mode == MODE_FUN else 1) and min(sensi_orders) >= 0

        def get_config(self) -> dict:
            return {**super().get_config(), "hessian": self.hessian, "lowered": repr(self.lowered)}

        def call_unprocessed(self, x, sensi_orders, mode, return_dict=False, **kwargs) -> dict:
            low = self.lowered
            theta = np.asarray(x, dtype=np.float64)
            k = theta.size
            orders = tuple(sensi_orders) or (0,)
            self.n_evaluations += 1
            if mode == MODE_RES:
                c = math.sqrt(2.0 * low.scale)
                if 1 in orders:
                    r, J = low.residuals_and_jacobian(theta)
                    out = {RES: c * np.asarray(r), SRES: c * np.asarray(J)}
                else:
                    out = {RES: c * np.asarray(low.residuals(theta))}
                if low.last_failures:
                    out = {key: np.full_like(v, math.nan) for key, v in out.items()}
                return out
            if 2 in orders:
                if self.hessian == "gauss_newton":
                    v, g, H = low.gauss_newton(theta)
                    failed = bool(low.last_failures)
                else:
                    v, g = low.value_and_grad(theta)
                    failed = bool(low.last_failures)
                    H = low.hessian(theta) if not failed else np.full((k, k), math.nan)
                    self.n_evaluations += 1
                    failed = failed or bool(low.last_failures)
                out = {FVAL: float(v), GRAD: np.asarray(g), HESS: np.asarray(H)}
            elif 1 in orders:
                v, g = low.value_and_grad(theta)
                failed = bool(low.last_failures)
                out = {FVAL: float(v), GRAD: np.asarray(g)}
            else:
                v = low.value(theta)
                failed = bool(low.last_failures)
                out = {FVAL: float(v)}
            if failed:
                out = {key: (math.nan if key == FVAL else np.full_like(val, math.nan)) for key, val in out.items()}
            return out

    return DiffsoupObjective


def pypesto_objective(lowered: AbstractLoweredStudy, *, hessian: str = "gauss_newton"):
    """A pyPESTO objective evaluating ``lowered`` (any ``AbstractLoweredStudy``: ``ds.lower``'s or
    the one ``ds.distributed.run`` yields).

    Args:
        lowered: the lowered study; pyPESTO's ``x`` is its ``theta`` (scaled, ``theta_names``).
        hessian: what order 2 returns: ``"gauss_newton"`` (``2 scale J^T J``, with value and
            gradient from the same evaluation) or ``"exact"`` (the lowered study's Hessian).

    Returns:
        A ``pypesto.objective.ObjectiveBase`` (value, gradient, Hessian, residuals and their
        Jacobian; NaN where a solve failed).

    Raises:
        ImportError: without pyPESTO (``pip install 'diffsoup[test]'``).
        ValueError: for an unknown ``hessian``.
        TypeError: for something that is not a lowered study.
    """
    if not isinstance(lowered, AbstractLoweredStudy):
        raise TypeError(f"pypesto_objective: lowered must be a lowered study (ds.lower), not {type(lowered).__name__}.")
    if hessian not in PYPESTO_HESSIANS:
        raise ValueError(f"pypesto_objective: hessian={hessian!r} must be one of {PYPESTO_HESSIANS}.")
    return _objective_class()(lowered, hessian)


def pypesto_problem(lowered: AbstractLoweredStudy, *, hessian: str = "gauss_newton", **problem_options: Any):
    """A ``pypesto.Problem`` of ``lowered``: :func:`pypesto_objective`, the bounds, names and scales
    of theta (``problem_options`` go to ``pypesto.Problem``, e.g. ``x_guesses``).

    Raises:
        ImportError: without pyPESTO.
    """
    pypesto = _pypesto()
    prob = lowered.problem
    n_par = getattr(prob, "n_parameters", prob.n_theta)
    scales = [prob.study.entries[i].parameter.scale for i in prob.estimated] + ["lin"] * (prob.n_theta - n_par)
    options = {"x_names": list(prob.theta_names), "x_scales": scales, "copy_objective": False, **problem_options}
    return pypesto.Problem(pypesto_objective(lowered, hessian=hessian), lb=np.asarray(lowered.lower, dtype=np.float64),
                           ub=np.asarray(lowered.upper, dtype=np.float64), **options)  # fmt: skip
