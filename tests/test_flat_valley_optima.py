"""Counting optima on a flat valley: a decay whose rate is the product ``a b`` of two estimated
parameters is not identifiable along ``log a + log b = const``. The closed form (one rate, fitted
by scipy) says every end point on that line is the one optimum: the fit's starts end at points
far apart along it, at the closed form's objective, and they count as one optimum and all at
the best; an end at a higher objective is a second optimum."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fit_helpers import SOLVER, TIMES, data

import diffsoup as ds
from diffsoup.inference import Gaussian, Parameter
from diffsoup.inference.fitting._batched_fit import SAME_POINT, distinct_optima
from diffsoup.inference.fitting._results import FitResult, StartResult

SIGMA, AMPLITUDE = 0.05, 2.0


def _rhs(t, y, p):
    return -p["a"] * p["b"] * y


def _observe(y, p):
    return AMPLITUDE * y


def _lowered():
    problem = ds.ProblemSpec(_rhs, states=["y"], parameters={"a": 1.0, "b": 0.5}, y0=[1.0], name="product").build()
    e = ds.Experiment("decay", TIMES, data(0), observables=_observe, noise=Gaussian(SIGMA), y0=[1.0])
    study = ds.Study(problem, [e], [Parameter("a", 1.0, 0.01, 100.0), Parameter("b", 1.0, 0.01, 100.0)])
    return ds.lower(study, solver=SOLVER)


def _closed_form() -> tuple[float, float]:
    """The rate ``k = a b`` of the optimum and its negative log-likelihood (scipy on the closed form)."""
    from scipy.optimize import minimize_scalar

    d = data(0)[:, 0]

    def nll(log_k):
        r = (AMPLITUDE * np.exp(-(10.0**log_k) * TIMES) - d) / SIGMA
        return 0.5 * float(r @ r) + TIMES.size * (math.log(SIGMA) + 0.5 * math.log(2 * math.pi))

    res = minimize_scalar(nll, bounds=(-2.0, 2.0), method="bounded", options={"xatol": 1e-12})
    return 10.0**res.x, res.fun


def test_ends_along_a_non_identifiable_valley_are_one_optimum():
    from diffsoup.workflows._honest_answers import distinct_objectives, honest_entries

    lowered = _lowered()
    k, nll = _closed_form()
    starts = np.log10([[0.05, 0.2], [20.0, 0.2], [0.3, 30.0], [3.0, 3.0]])
    result = ds.inference.fit(lowered, method="trf", starts=starts)
    ends = np.array([s.x for s in result.starts])
    np.testing.assert_allclose(10.0 ** ends.sum(axis=1), k, rtol=1e-5)  # every end on the valley's floor
    assert all(s.objective == pytest.approx(nll, abs=1e-7) for s in result.starts)
    assert np.ptp(ends[:, 0]) > 0.5  # ... at points far apart along it
    # By point (the batched fit's clustering) they are several optima; by objective, one.
    lower, upper = np.asarray(lowered.lower), np.asarray(lowered.upper)
    assert len(distinct_optima([s.objective for s in result.starts], ends, lower, upper, same_point=SAME_POINT)) > 1
    (value, members), = distinct_objectives(result)
    assert value == pytest.approx(nll, abs=1e-7) and sorted(members) == [0, 1, 2, 3]
    entries = honest_entries(lowered, result)
    assert entries["starts"]["at_best"] == 4 and entries["starts"]["distinct_optima"] == 1
    assert entries["starts"]["optima"] == [{"objective": result.objective, "starts": 4}]

    # An end 0.02 above the valley is another optimum; a failed start is none.
    x = ends[0]
    more = list(result.starts) + [StartResult(x + 0.5, x + 0.01, result.objective + 0.02, True, "ok", 1, 1, 0.0, ()),
                                  StartResult(x, x, math.inf, False, "a solve failed", 1, 0, 0.0, ())]
    mixed = FitResult.from_starts(lowered, more, method="trf", seconds=0.0)
    assert [(round(v - nll, 6), len(m)) for v, m in distinct_objectives(mixed)] == [(0.0, 4), (0.02, 1)]
    assert len(distinct_objectives(mixed, 0.05)) == 1
    entries = honest_entries(lowered, mixed)
    assert entries["starts"]["distinct_optima"] == 2 and entries["starts"]["at_best"] == 4
