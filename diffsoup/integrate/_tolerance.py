"""Tolerances a compute dtype can honour: :class:`ToleranceWarning` and the floor on ``rtol``.

The error estimate of a step is a difference of stage increments: it carries rounding errors of
a few ulps of ``y`` times the size of the method's coefficients (Rodas5P's reach 150), so a
relative tolerance near the dtype's resolution asks the controller to steer by rounding noise.
diffsoup follows MATLAB's ODE suite: ``rtol`` is at least ``100 * eps`` of the compute dtype
(2.2e-14 in float64, 1.2e-5 in float32); a smaller one is raised to that floor with a warning.
(Hairer's RODAS refuses ``rtol <= 10 * uround``; 100 eps keeps the estimate a few digits above
the noise for coefficients of Rodas5P's size.)
"""

from __future__ import annotations

import warnings

import numpy as np


class ToleranceWarning(UserWarning):
    """A tolerance the compute dtype cannot honour was raised to the smallest sensible one."""


def rtol_floor(dtype) -> float:
    """The smallest ``rtol`` a solve in ``dtype`` honours: ``100 * eps``."""
    return 100.0 * float(np.finfo(np.dtype(dtype)).eps)


def checked_rtol(rtol: float, dtype, where: str) -> float:
    """``rtol`` raised to :func:`rtol_floor` of ``dtype``, with a :class:`ToleranceWarning` when it
    had to be (``where`` names the call, for the message)."""
    floor = rtol_floor(dtype)
    if rtol < floor:
        name = np.dtype(dtype).name
        # Only a lower precision can be helped by a wider dtype; float64's floor is the last one.
        advice = ("" if np.finfo(np.dtype(dtype)).bits >= 64 else " Use a float64 precision policy "
                  "(ds.Precision.fp64() or fp32_factor()) for tighter tolerances.")  # fmt: skip
        warnings.warn(
            f"{where}: rtol={rtol:g} is below what {name} computations resolve (100 * eps = {floor:.2g}); "
            f"using rtol={floor:.2g}.{advice}",
            ToleranceWarning,
            stacklevel=3,
        )
        return floor
    return rtol
