"""fides as a fit method: every Hessian choice recovers the optimum and standard errors known
from the closed form; trial points whose solves fail make each method step back and the start
still converges; drawn start points that fail to solve are replaced; options are checked."""

import numpy as np
import pytest
from fit_helpers import SOLVER, decay_study, reference_fit

import diffsoup as ds
from diffsoup.inference import LBFGSB, TRF, Fides, Gaussian, Parameter, SolverOptions

pytest.importorskip("fides")


@pytest.mark.parametrize("hessian", ["gauss_newton", "hybrid", "exact", "bfgs", "sr1"])
def test_fides_recovers_the_closed_form_optimum_and_standard_errors(hessian):
    low = ds.lower(decay_study(0), solver=SOLVER)
    theta, se, nll = reference_fit(0)
    result = ds.inference.fit(low, method=Fides(hessian=hessian), starts=3, seed=2)
    assert result.method == "fides"
    assert all(s.success for s in result.starts), [s.message for s in result.starts]
    assert result.objective == pytest.approx(nll, abs=1e-7)
    assert np.all(np.abs(result.theta - theta) < 1e-3 * se), (result.theta, theta)
    np.testing.assert_allclose([result.standard_errors[n] for n in low.theta_names], se, rtol=1e-4)
    # every start reached the optimum: the waterfall is flat
    assert np.all(result.converged(1e-6)) and result.waterfall[-1] - result.waterfall[0] < 1e-6


def test_fides_is_the_default_method():
    low = ds.lower(decay_study(1), solver=SOLVER)
    result = ds.inference.fit(low, starts=1)
    assert result.method == "fides" and result.message.startswith("fides: ")


def _blowup_study():
    """y' = k y^2 blows up at t = 1/(k y0): for k above 1 before the last measurement (t = 1), so
    Gauss-Newton and quasi-Newton steps from small k overshoot into points whose solve fails."""
    spec = ds.ProblemSpec(lambda t, y, p: p["k"] * y**2, states=["y"], parameters={"A": 1.0, "k": 0.7}, y0=[1.0],
                          name="blowup")  # fmt: skip
    times = np.linspace(0.1, 1.0, 10)
    rng = np.random.default_rng(0)
    data = 1.0 / (1.0 - 0.7 * times) + 0.05 * rng.standard_normal(10)
    e = ds.Experiment("e", times, data[:, None], observables=lambda y, p: p["A"] * y, noise=Gaussian(0.05), y0=[1.0])
    study = ds.Study(spec.build(), [e], [Parameter("A", 1.0, 0.1, 10.0), Parameter("k", 0.5, 0.01, 100.0)])
    return ds.lower(study, solver=SolverOptions(max_steps=2000))


@pytest.mark.parametrize("method", [Fides(), Fides(hessian="bfgs"), TRF(), LBFGSB()], ids=lambda m: repr(m)[:20])
def test_a_trial_point_that_fails_to_solve_makes_the_optimizer_step_back(method):
    low = _blowup_study()
    starts = np.array([[0.0, -2.0], [0.0, -1.0], [0.5, -1.5]])
    result = ds.inference.fit(low, method=method, starts=starts)
    best = ds.inference.fit(low, method=Fides(fatol=1e-10, frtol=0.0), starts=np.array([[0.0, -0.16]])).objective
    met = [s for s in result.starts if s.failures]
    assert met, "no start met a failed solve"
    for s in met:
        assert all(name == "MAX_STEPS" and eid == "e" for eid, name, _ in s.failures)
    for s in result.starts:
        assert s.objective == pytest.approx(best, abs=1e-6), (s.objective, s.message)


def test_drawn_start_points_that_fail_are_replaced_given_ones_are_not():
    low = _blowup_study()
    result = ds.inference.fit(low, starts=6, seed=0)
    assert sum(s.resampled for s in result.starts) > 0
    assert all(np.isfinite(s.objective) for s in result.starts)
    for s in result.starts:
        assert np.isfinite(low.value(s.x0)) and not low.last_failures
    again = ds.inference.fit(low, starts=6, seed=0)
    np.testing.assert_array_equal([s.x0 for s in again.starts], [s.x0 for s in result.starts])
    kept = ds.inference.fit(low, starts=6, seed=0, resample_failed_starts=0)
    failed = [s for s in kept.starts if not np.isfinite(s.objective)]
    assert failed and all(s.message == "a solve failed at the start point" and s.resampled == 0 for s in failed)
    given = ds.inference.fit(low, starts=np.array([[0.0, 1.0], [0.0, -1.0]]))
    assert given.starts[0].objective == np.inf and given.starts[0].resampled == 0
    np.testing.assert_array_equal(given.starts[0].x0, [0.0, 1.0])


def test_fides_options_are_checked():
    with pytest.raises(ValueError, match="hessian="):
        Fides(hessian="newton")
    with pytest.raises(ValueError, match="subspace="):
        Fides(subspace="3D")
    with pytest.raises(ValueError, match="max_evaluations"):
        Fides(max_evaluations=0)
    with pytest.raises(ValueError, match="fatol"):
        Fides(fatol=-1.0)
    low = ds.lower(decay_study(0), solver=SOLVER)
    with pytest.raises(ValueError, match="apply to a method given by name"):
        ds.inference.fit(low, method=Fides(), ftol=1e-3)
    with pytest.raises(TypeError, match="method must be"):
        ds.inference.fit(low, method=3)


def test_max_nfev_caps_fides_iterations():
    low = ds.lower(decay_study(0), solver=SOLVER)
    result = ds.inference.fit(low, starts=np.array([[-1.5, 1.5]]), max_nfev=2)
    s = result.starts[0]
    assert s.n_iterations == 2 and not s.success and "MAXITER" in s.message
