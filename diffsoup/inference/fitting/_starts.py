"""Start points of a multistart fit: a scrambled Sobol' sequence on the parameters' scales within the bounds.

Every estimated parameter is sampled in the optimizer's coordinates (``log10 k`` for a
``log10``-scaled parameter, so a box of 1e-5..1e5 gives each decade the same share of starts): the
rows of the scrambled Sobol' sequence that ``seed`` fixes
(:func:`~diffsoup.inference.fitting._samplers.sobol_unit`, ``scipy.stats.qmc``, the sequence of the
public sampler ``ds.inference.sobol``) mapped linearly onto the scaled bounds. The map is done here
because a ``ParameterBox`` refuses a parameter estimated with ``lower == upper``, which a study allows.

Why a sequence and not a Latin hypercube: point ``i`` is the same whatever the number of starts
(the first ``n`` points of ``n + k`` starts are the ``n`` points of ``n`` starts), so a campaign of
40 starts grown to 44 finds its 40 finished starts unchanged in its ledger and runs the 4 new ones,
and a batched optimizer refilling its lanes asks :func:`start_points` for the next points of the
same stream (``first=``). A Latin hypercube of ``n`` points moves every point when ``n`` changes.
Sobol' points are best balanced in counts that are powers of 2 (8, 16, 32 starts); other counts are
a prefix of the sequence, still low-discrepancy, and prefix stability matters more here. The
scrambling makes the first point a uniform draw in the box rather than its corner or centre.

A start point at which a solve fails (the model blows up, a steady state is not reached) is
replaced, when ``fit`` draws the starts itself, by :func:`replacement_point`: a uniform draw on
the same scales, a function of ``(seed, start, attempt)`` alone (pyPESTO's
``startpoint_resample``). Coordinates without finite bounds (window starts of multiple
shooting) keep their prepared values (``lowered.nominal``).
"""

from __future__ import annotations

import numpy as np

from ..objective._abstract_lowered import AbstractLoweredStudy
from ._samplers import sobol_unit


def _sampled(lowered: AbstractLoweredStudy) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lo, hi = np.asarray(lowered.lower, float), np.asarray(lowered.upper, float)
    return lo, hi, np.isfinite(lo) & np.isfinite(hi)


def start_points(lowered: AbstractLoweredStudy, n: int, seed: int, first: int = 0) -> np.ndarray:
    """Start points ``first .. first + n - 1`` ``(n, n_theta)`` (scaled) of a multistart's stream:
    the scrambled Sobol' sequence of ``seed`` on the coordinates with finite bounds, the prepared
    values (``lowered.nominal``) for the others. Point ``i`` depends on ``(seed, i)`` alone:
    ``start_points(lowered, n, seed)[i] == start_points(lowered, 1, seed, first=i)[0]`` for any
    ``n > i``.

    Raises:
        ValueError: for a negative ``n`` or ``first``.
    """
    if int(n) < 0:
        raise ValueError(f"start_points: n={n!r} must be non-negative.")
    if int(first) < 0:
        raise ValueError(f"start_points: first={first!r} must be non-negative (the index of the first point).")
    lo, hi, sampled = _sampled(lowered)
    points = np.repeat(np.asarray(lowered.nominal, float)[None], int(n), axis=0)
    if n and np.any(sampled):
        unit = sobol_unit(int(first), int(n), int(np.sum(sampled)), int(seed))
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
