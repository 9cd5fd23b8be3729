"""pyPESTO on diffsoup's solver: the objective's value, gradient, Gauss-Newton Hessian and
residuals agree with the lowered study (and its gradient with pyPESTO's finite differences);
pyPESTO's fides multistart reaches the closed-form optimum; its profile agrees with ours; failed
solves are NaN. Skipped without pyPESTO (``pip install diffsoup[test]``)."""

import math

import numpy as np
import pytest
from fit_helpers import SOLVER, decay_study, reference_fit

import diffsoup as ds
from diffsoup.inference import Gaussian, Parameter, SolverOptions, pypesto_objective, pypesto_problem

pypesto = pytest.importorskip("pypesto")
from pypesto.C import FVAL, GRAD, HESS, MODE_RES, RES, SRES  # noqa: E402


@pytest.fixture(scope="module")
def lowered():
    return ds.lower(decay_study(0, estimate_sigma=True), solver=SOLVER)


def test_objective_answers_as_the_lowered_study(lowered):
    obj = pypesto_objective(lowered)
    theta = np.array([0.25, -0.2, -1.2])
    out = obj(theta, sensi_orders=(0, 1, 2), return_dict=True)
    v, g, H = lowered.gauss_newton(theta)
    assert out[FVAL] == pytest.approx(lowered.value(theta), rel=1e-12)
    np.testing.assert_allclose(out[GRAD], lowered.value_and_grad(theta)[1], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(out[HESS], H, rtol=1e-12)
    assert obj(theta) == pytest.approx(v, rel=1e-12)
    res = obj(theta, sensi_orders=(0, 1), mode=MODE_RES, return_dict=True)
    assert 0.5 * float(res[RES] @ res[RES]) == pytest.approx(v - lowered.offset, rel=1e-12)
    r, J = lowered.residuals_and_jacobian(theta)
    np.testing.assert_allclose(res[SRES], math.sqrt(2 * lowered.scale) * J, rtol=1e-12)
    exact = pypesto_objective(lowered, hessian="exact")(theta, sensi_orders=(2,))
    np.testing.assert_allclose(exact, lowered.hessian(theta), rtol=1e-9)


def test_gradient_agrees_with_pypesto_finite_differences(lowered):
    obj = pypesto_objective(lowered)
    check = obj.check_grad(np.array([0.3, -0.25, -1.1]), eps=1e-6, verbosity=0)
    assert np.all(check["rel_err"].abs() < 1e-5), check


def test_pypesto_fides_multistart_reaches_the_closed_form_optimum():
    low = ds.lower(decay_study(0), solver=SOLVER)
    problem = pypesto_problem(low)
    assert problem.x_names == ["A", "k"] and list(problem.x_scales) == ["log10", "log10"]
    result = pypesto.optimize.minimize(problem, optimizer=pypesto.optimize.FidesOptimizer(verbose=40), n_starts=3,
                                       progress_bar=False)  # fmt: skip
    theta, se, nll = reference_fit(0)
    best = result.optimize_result[0]
    assert best.fval == pytest.approx(nll, abs=1e-6)
    assert np.all(np.abs(best.x - theta) < 1e-3 * se)


def test_pypesto_profile_agrees_with_ours():
    low = ds.lower(decay_study(0), solver=SOLVER)
    ours = ds.inference.profile(low, ds.inference.fit(low, starts=2))
    problem = pypesto_problem(low)
    result = pypesto.optimize.minimize(problem, optimizer=pypesto.optimize.FidesOptimizer(verbose=40), n_starts=2,
                                       progress_bar=False)  # fmt: skip
    result = pypesto.profile.parameter_profile(problem, result, optimizer=pypesto.optimize.ScipyOptimizer(),
                                               progress_bar=False)  # fmt: skip
    for i, name in enumerate(low.theta_names):
        lo, hi = pypesto.profile.calculate_approximate_ci(
            xs=result.profile_result.list[0][i].x_path[i], ratios=result.profile_result.list[0][i].ratio_path,
            confidence_ratio=math.exp(-ours.delta))  # fmt: skip
        p = ours.profiles[name]
        # pyPESTO interpolates linearly between its points: agreement to its grid's resolution
        assert p.lower == pytest.approx(lo, abs=3e-3) and p.upper == pytest.approx(hi, abs=3e-3), (p.interval, lo, hi)


def test_failed_solves_are_nan():
    spec = ds.ProblemSpec(lambda t, y, p: p["k"] * y**2, states=["y"], parameters={"A": 1.0, "k": 0.7}, y0=[1.0],
                          name="blowup")  # fmt: skip
    times = np.linspace(0.1, 1.0, 5)
    e = ds.Experiment("e", times, np.ones((5, 1)), observables=lambda y, p: p["A"] * y, noise=Gaussian(0.1), y0=[1.0])
    low = ds.lower(ds.Study(spec.build(), [e], [Parameter("A", 1.0, 0.1, 10.0), Parameter("k", 0.5, 0.01, 100.0)]),
                   solver=SolverOptions(max_steps=500))  # fmt: skip
    obj = pypesto_objective(low)
    out = obj(np.array([0.0, 1.0]), sensi_orders=(0, 1, 2), return_dict=True)  # k = 10: blows up at t = 0.1
    assert math.isnan(out[FVAL]) and np.all(np.isnan(out[GRAD])) and np.all(np.isnan(out[HESS]))
    assert np.all(np.isnan(obj(np.array([0.0, 1.0]), sensi_orders=(0,), mode=MODE_RES)))
    assert np.isfinite(obj(np.array([0.0, -1.0])))


def test_bad_arguments():
    low = ds.lower(decay_study(0), solver=SOLVER)
    with pytest.raises(ValueError, match=r"hessian='bfgs' must be one of \('gauss_newton', 'exact'\)"):
        pypesto_objective(low, hessian="bfgs")
    with pytest.raises(TypeError, match="lowered study"):
        pypesto_objective(low.problem)


def test_pypesto_hessians_are_the_fides_hessians_the_lowered_study_computes():
    """One vocabulary: pyPESTO's objective offers the fides Hessians that are matrices of the
    lowered study, not those fides builds itself by quasi-Newton updates."""
    from diffsoup.inference.fitting._hessians import FIDES_HESSIANS, PYPESTO_HESSIANS, QUASI_NEWTON_HESSIANS

    assert PYPESTO_HESSIANS == ("gauss_newton", "exact")
    assert set(PYPESTO_HESSIANS) | set(QUASI_NEWTON_HESSIANS) == set(FIDES_HESSIANS)
