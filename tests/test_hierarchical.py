"""Hierarchical optimization (``fit(hierarchical=...)``): the parameters the residuals are affine in
are found by evaluation, optimized analytically, and the fit reaches the optimum known from the
closed form; the reduced objective's gradient and Hessians match finite differences of its value."""

import numpy as np
import pytest
from fit_helpers import SOLVER, TIMES, decay_study, problem, reference_fit

import diffsoup as ds
from diffsoup.inference import LBFGSB, TRF, Fides, Gaussian, Parameter
from diffsoup.inference._hierarchical import LinearParameters
from diffsoup.inference._optimizers import StartObjective

pytest.importorskip("fides")


def test_a_named_scaling_factor_qualifies_and_the_rate_and_the_noise_level_do_not():
    low = ds.lower(decay_study(0, estimate_sigma=True), solver=SOLVER)
    # h = A y with A a model parameter: True takes only observable parameters (A could act in the
    # dynamics, as far as the study's structure tells), so it is named.
    assert LinearParameters.find(low, True) is None
    assert LinearParameters.find(low, ["A"]).names == ("A",)
    with pytest.raises(ValueError, match=r"'k' cannot be optimized analytically: the residuals are not affine"):
        LinearParameters.find(low, ["k"])
    with pytest.raises(ValueError, match=r"'sigma' cannot be optimized analytically: the residuals are not affine"):
        LinearParameters.find(low, ["sigma"])
    with pytest.raises(ValueError, match=r"\['nope'\] are not estimated parameters"):
        LinearParameters.find(low, ["nope"])


@pytest.mark.parametrize("method", [Fides(), Fides(hessian="exact"), TRF(), LBFGSB()], ids=lambda m: repr(m)[:22])
def test_a_hierarchical_fit_reaches_the_closed_form_optimum(method):
    low = ds.lower(decay_study(0), solver=SOLVER)
    theta, se, nll = reference_fit(0)
    result = ds.inference.fit(low, method=method, starts=3, seed=1, hierarchical=["A"])
    assert result.objective == pytest.approx(nll, abs=1e-7)
    assert np.all(np.abs(result.theta - theta) < 1e-3 * se), (result.theta, theta)
    np.testing.assert_allclose([result.standard_errors[n] for n in low.theta_names], se, rtol=1e-3)
    for s in result.starts:  # each start's A is its analytic optimum, not its drawn value
        assert s.x[0] == pytest.approx(theta[0], abs=1e-3 * se[0])


def _scaled_offset_study():
    """h = s y + o with y' = -k y: s and o enter affinely, jointly."""
    rng = np.random.default_rng(3)
    truth = {"k": 0.5, "s": 3.0, "o": 0.4}
    y = np.exp(-truth["k"] * TIMES)
    data = (truth["s"] * y + truth["o"] + 0.05 * rng.standard_normal(TIMES.size))[:, None]
    e = ds.Experiment("e", TIMES, data, observables=lambda y, p: p["s"] * y + p["o"], noise=Gaussian(0.05),
                      y0=[1.0], observable_parameters={"s": "s", "o": "o"})  # fmt: skip
    params = [Parameter("k", 1.0, 0.01, 100.0), Parameter("s", 1.0, 1e-3, 1e3),
              Parameter("o", 0.0, -5.0, 5.0, scale="lin")]  # fmt: skip
    return ds.Study(problem(), [e], params)


def test_a_scaling_and_an_offset_together_give_the_full_fits_optimum():
    low = ds.lower(_scaled_offset_study(), solver=SOLVER)
    found = LinearParameters.find(low, True)
    assert set(found.names) == {"s", "o"}
    full = ds.inference.fit(low, starts=4, seed=0)
    reduced = ds.inference.fit(low, starts=4, seed=0, hierarchical=True)
    assert reduced.objective == pytest.approx(full.objective, abs=1e-8)
    np.testing.assert_allclose(reduced.theta, full.theta, atol=1e-5)


def test_the_reduced_gradient_and_hessians_are_those_of_the_reduced_value():
    low = ds.lower(_scaled_offset_study(), solver=SOLVER, hessian="exact")
    objective = StartObjective(low, linear=LinearParameters.find(low, True))
    assert objective.free.tolist() == [0]  # only k is left to the optimizer
    x = np.array([-0.2])
    h = 1e-4

    def value(u):
        return objective.value(np.array([u]))

    fd_grad = (value(x[0] + h) - value(x[0] - h)) / (2 * h)
    fd_curv = (value(x[0] + h) - 2 * value(x[0]) + value(x[0] - h)) / h**2
    v, g = objective.value_and_grad(x)
    assert v == pytest.approx(value(x[0]), rel=1e-12)
    assert g[0] == pytest.approx(fd_grad, rel=1e-5)
    _, _, H = objective.value_grad_hessian(x)
    assert H[0, 0] == pytest.approx(fd_curv, rel=1e-3)
    # Gauss-Newton: 2 scale J_red^T J_red, the projected Jacobian's, near the exact one near the optimum
    r, J = objective.residuals_and_jacobian(x)
    _, _, G = objective.gauss_newton(x)
    np.testing.assert_allclose(G, 2 * low.scale * J.T @ J, rtol=1e-10)
    # the inner optimum: moving s or o away from it raises the value
    theta = objective.theta(x)
    for i in (1, 2):
        for d in (-1e-3, 1e-3):
            moved = theta.copy()
            moved[i] += d
            assert low.value(moved) > low.value(theta)
