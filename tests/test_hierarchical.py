"""Hierarchical optimization (``fit(hierarchical=...)``): the parameters the residuals are affine in
are found by evaluation, optimized analytically, and the fit reaches the optimum known from the
closed form; the reduced objective's gradient and Hessians match finite differences of its value."""

import numpy as np
import pytest
from fit_helpers import SOLVER, TIMES, data, decay_study, problem, reference_fit, two_noise_levels_study

import diffsoup as ds
from diffsoup.inference import LBFGSB, TRF, Fides, Gaussian, Parameter
from diffsoup.inference.fitting._hierarchical import AnalyticParameters, LinearParameters, NoiseParameters
from diffsoup.inference.fitting._optimizers import StartObjective

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
    objective = StartObjective(low, analytic=AnalyticParameters.find(low, True))
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


# ---- noise levels ---------------------------------------------------------------------------------


def test_a_noise_level_is_optimized_to_its_closed_form_value():
    """h = A exp(-k t) with sigma estimated: the optimum of (A, k) is the least-squares one whatever
    sigma, and sigma's is the root mean square of its residuals; the hierarchical fit finds both."""
    low = ds.lower(decay_study(0, estimate_sigma=True), solver=SOLVER)
    found = AnalyticParameters.find(low, True)
    assert found.affine is None  # A is a model parameter (h = A y): True leaves it to the optimizer
    assert found.noise.names == ("sigma",) and found.noise.counts.tolist() == [TIMES.size]
    theta, _, _ = reference_fit(0)
    A, k = 10.0**theta
    rms = float(np.sqrt(np.mean((A * np.exp(-k * TIMES) - data(0)[:, 0]) ** 2)))
    nll = TIMES.size * (0.5 + np.log(rms) + 0.5 * np.log(2 * np.pi))
    result = ds.inference.fit(low, starts=3, seed=1, hierarchical=True)
    assert result.objective == pytest.approx(nll, abs=1e-8)
    np.testing.assert_allclose(result.theta[:2], theta, atol=1e-6)
    assert result.parameters["sigma"] == pytest.approx(rms, rel=1e-7)
    assert result.analytic == ("sigma",)
    # The default (hierarchical=None) takes the noise level too, in fit and in the campaign form.
    for default in (ds.inference.fit(low, starts=3, seed=1), ds.inference.multistart(low, starts=3, seed=1)):
        assert default.analytic == ("sigma",) and default.objective == pytest.approx(nll, abs=1e-8)
    assert ds.inference.fit(low, starts=1, seed=1, hierarchical=False).analytic == ()
    # Away from the optimum the inner optimum is the closed form's too, and a minimum in sigma.
    objective = StartObjective(low, analytic=found)
    x = theta + np.array([0.1, -0.2])
    A, k = 10.0**x
    inner = objective.theta(x)
    assert 10.0 ** inner[2] == pytest.approx(np.sqrt(np.mean((A * np.exp(-k * TIMES) - data(0)[:, 0]) ** 2)), rel=1e-8)
    for d in (-1e-3, 1e-3):
        assert low.value(inner + np.array([0.0, 0.0, d])) > low.value(inner)


def test_the_default_leaves_noise_levels_to_the_optimizer_where_the_jacobian_would_be_large(monkeypatch):
    """Analytic noise levels bring the residuals' Jacobian to the host at each evaluation: the
    default takes them only up to ``DEFAULT_MAX_JACOBIAN_ENTRIES`` entries; named, they are taken."""
    from diffsoup.inference.fitting import _hierarchical

    low = ds.lower(decay_study(0, estimate_sigma=True), solver=SOLVER)
    entries = 2 * low.problem.study.n_measured * low.problem.n_theta
    monkeypatch.setattr(_hierarchical, "DEFAULT_MAX_JACOBIAN_ENTRIES", entries)
    assert AnalyticParameters.find(low, None).names == ("sigma",)
    monkeypatch.setattr(_hierarchical, "DEFAULT_MAX_JACOBIAN_ENTRIES", entries - 1)
    assert AnalyticParameters.find(low, None) is None
    assert ds.inference.fit(low, starts=1, seed=1).analytic == ()
    assert AnalyticParameters.find(low, ["sigma"]).names == ("sigma",)


def _scaled_offset(y, p):
    return p["s"] * y + p["o"]


def _scaled_offset_study(estimate_sigma=False):
    """h = s y + o with y' = -k y: s and o enter affinely, jointly (sigma estimated: the spread
    of every cell, 'sd'). One observable function for every call: the studies share programs."""
    rng = np.random.default_rng(3)
    truth = {"k": 0.5, "s": 3.0, "o": 0.4}
    y = np.exp(-truth["k"] * TIMES)
    data = (truth["s"] * y + truth["o"] + 0.05 * rng.standard_normal(TIMES.size))[:, None]
    e = ds.Experiment("e", TIMES, data, observables=_scaled_offset,
                      noise=Gaussian("sd" if estimate_sigma else 0.05), y0=[1.0],
                      observable_parameters={"s": "s", "o": "o"})  # fmt: skip
    params = [Parameter("k", 1.0, 0.01, 100.0), Parameter("s", 1.0, 1e-3, 1e3),
              Parameter("o", 0.0, -5.0, 5.0, scale="lin")]  # fmt: skip
    if estimate_sigma:
        params.append(Parameter("sd", 0.1, 1e-3, 10.0))
    return ds.Study(problem(), [e], params)


def test_offsets_scalings_and_a_noise_level_together_give_the_full_fits_optimum():
    low = ds.lower(_scaled_offset_study(estimate_sigma=True), solver=SOLVER, hessian="exact")
    found = AnalyticParameters.find(low, True)
    assert found.names == ("s", "o", "sd")
    full = ds.inference.fit(low, starts=4, seed=0)
    reduced = ds.inference.fit(low, starts=4, seed=0, hierarchical=True)
    assert reduced.objective == pytest.approx(full.objective, abs=1e-8)
    np.testing.assert_allclose(reduced.theta, full.theta, atol=1e-5)
    # The reduced gradient and exact Hessian are those of the reduced value (central differences).
    objective = StartObjective(low, analytic=found)
    assert objective.free.tolist() == [0]
    h = 1e-4
    value = lambda u: objective.value(np.array([u]))  # noqa: E731
    x = -0.2
    v, g = objective.value_and_grad(np.array([x]))
    assert g[0] == pytest.approx((value(x + h) - value(x - h)) / (2 * h), rel=1e-5)
    _, _, H = objective.value_grad_hessian(np.array([x]))
    assert H[0, 0] == pytest.approx((value(x + h) - 2 * v + value(x - h)) / h**2, rel=1e-3)


@pytest.mark.parametrize("distribution", [Gaussian, ds.inference.LogNormal], ids=["gaussian", "lognormal"])
def test_noise_levels_alone_take_one_evaluation_equal_to_evaluating_at_their_optimum(distribution):
    """With noise levels alone analytic, value and Gauss-Newton come from one evaluation at the
    template's spreads, the rows moved to the optimum: equal to evaluating there (and to the
    two-evaluation path); the reduced gradient matches central differences of the reduced value.
    sd2 on a linear scale (its own column's slope differs from log10's)."""
    low = ds.lower(two_noise_levels_study(distribution, sd2_scale="lin"), solver=SOLVER)
    found = AnalyticParameters.find(low, ["sd1", "sd2"])
    assert found.affine is None and found.noise.names == ("sd1", "sd2")
    objective = StartObjective(low, analytic=found)
    assert objective.free.tolist() == [0, 1]
    x = np.array([-0.2, 0.5])
    calls, compute = [], low.compute
    low.compute = lambda mode, theta: (calls.append(mode), compute(mode, theta))[1]
    v, g, H = objective.gauss_newton(x)
    theta = objective.theta(x)
    assert calls == ["jacobian"]
    assert np.all(theta[2:] != low.nominal[2:])
    v_at, g_at, H_at = low.gauss_newton(theta)
    assert v == pytest.approx(v_at, rel=1e-12)
    np.testing.assert_allclose(g, g_at[:2], rtol=1e-9, atol=1e-9 * np.max(np.abs(g_at)))
    from diffsoup.inference.fitting._hierarchical import schur_complement

    np.testing.assert_allclose(H, schur_complement(H_at, np.array([0, 1]), np.array([2, 3])), rtol=1e-9)
    assert objective.value(x) == pytest.approx(v_at, rel=1e-12)
    two = StartObjective(low, analytic=found)
    two._noise_alone = False  # the path that evaluates at the optimum found from the residuals
    v2, g2, H2 = two.gauss_newton(x)
    assert v2 == pytest.approx(v, rel=1e-12) and calls[-2:] == ["residuals", "gauss_newton"]
    np.testing.assert_allclose(g2, g, rtol=1e-9)
    np.testing.assert_allclose(H2, H, rtol=1e-9)
    h = 1e-5
    fd = [(objective.value(x + h * e) - objective.value(x - h * e)) / (2 * h) for e in np.eye(2)]
    np.testing.assert_allclose(g, fd, rtol=1e-5)


def test_what_cannot_be_optimized_analytically_as_a_noise_level_is_refused_or_left_out():
    low = ds.lower(two_noise_levels_study(), solver=SOLVER)
    # o reaches the cells of two noise levels: its optimum depends on them. True leaves it to the
    # optimizer; naming it with them fails.
    found = AnalyticParameters.find(low, True)
    assert found.affine is None and found.noise.names == ("sd1", "sd2")
    with pytest.raises(ValueError, match=r"'o' reaches cells of more than one noise level"):
        AnalyticParameters.find(low, ["o", "sd1", "sd2"])
    assert AnalyticParameters.find(low, ["o"]).names == ("o",)  # alone: the spreads stay numeric
    # A Laplace scale is not a Gaussian spread: its residuals sqrt(2 |z|) do not scale as 1/s.
    laplace = ds.lower(two_noise_levels_study(ds.inference.Laplace), solver=SOLVER)
    with pytest.raises(ValueError, match=r"'sd1' cannot be optimized analytically as a noise level: it is not the spread"):
        NoiseParameters.find(laplace, ["sd1"])
    assert NoiseParameters.find(laplace, True) is None
    # k acts in the dynamics: named, it goes to the affine check, which refuses it.
    with pytest.raises(ValueError, match=r"'k' cannot be optimized analytically: the residuals are not affine"):
        AnalyticParameters.find(low, ["k"])
