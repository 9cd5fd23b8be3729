"""Start points of a multistart fit: a Latin hypercube on the parameters' scales within the bounds.

Every estimated parameter is sampled in the optimizer's coordinates (``log10 k`` for a
``log10``-scaled parameter, so a box of 1e-5..1e5 gives each decade the same share of starts), one
point per stratum of each coordinate: the unit-cube points of the public sampler
``ds.inference.latin_hypercube``
(:func:`~diffsoup.inference.fitting._samplers.latin_hypercube_unit`, ``scipy.stats.qmc``) mapped
linearly onto the scaled bounds. They are that sampler's draws from a box of the scaled bounds on
the linear scale (tested bit for bit); the map is done here because a ``ParameterBox`` refuses a
parameter estimated with ``lower == upper``, which a study allows. The points are a function of
``(n, seed)`` alone, so a campaign that reruns with the same settings finds the same starts (its
ledger items fingerprint them) and resumes.

A start point at which a solve fails (the model blows up, a steady state is not reached) is
replaced, when ``fit`` draws the starts itself, by :func:`replacement_point`: a uniform draw on
the same scales, a function of ``(seed, start, attempt)`` alone (pyPESTO's
``startpoint_resample``). Coordinates without finite bounds (window starts of multiple
shooting) keep their prepared values (``lowered.nominal``).
"""

from __future__ import annotations

import numpy as np

from ..objective._abstract_lowered import AbstractLoweredStudy
from ._samplers import latin_hypercube_unit


def _sampled(lowered: AbstractLoweredStudy) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lo, hi = np.asarray(lowered.lower, float), np.asarray(lowered.upper, float)
    return lo, hi, np.isfinite(lo) & np.isfinite(hi)


def start_points(lowered: AbstractLoweredStudy, n: int, seed: int) -> np.ndarray:
    """``n`` start points ``(n, n_theta)`` (scaled) of a multistart: Latin hypercube samples of the
    coordinates with finite bounds, the prepared values (``lowered.nominal``) for the others.

    Raises:
        ValueError: for a negative ``n``.
    """
    if int(n) < 0:
        raise ValueError(f"start_points: n={n!r} must be non-negative.")
    lo, hi, sampled = _sampled(lowered)
    points = np.repeat(np.asarray(lowered.nominal, float)[None], int(n), axis=0)
    if n and np.any(sampled):
        unit = latin_hypercube_unit(int(n), int(np.sum(sampled)), seed)
        points[:, sampled] = lo[sampled] + unit * (hi[sampled] - lo[sampled])
    return points


def replacement_point(lowered: AbstractLoweredStudy, seed: int, start: int, attempt: int) -> np.ndarray:
    """The ``attempt``-th (from 1) replacement of start ``start`` whose point failed to solve: uniform
    within the bounds on the parameters' scales, a function of ``(seed, start, attempt)``."""
    lo, hi, sampled = _sampled(lowered)
    point = np.asarray(lowered.nominal, float).copy()
    rng = np.random.default_rng([int(seed), int(start), int(attempt), 0x5EED])
    point[sampled] = lo[sampled] + rng.random(int(np.sum(sampled))) * (hi[sampled] - lo[sampled])
    return point
