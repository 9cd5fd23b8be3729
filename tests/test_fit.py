"""Fitting: parameter recovery on 100 experiments of a 10-species network (every |estimate - truth|
/ standard error below 4, mean square below 2), a hierarchical study with cluster parameters,
failed solves during a fit recorded while the fit goes on (TRF and L-BFGS-B), Latin hypercube starts."""

import functools

import numpy as np
import pytest

import diffsoup as ds
from diffsoup.examples import mass_action_network
from diffsoup.inference import Gaussian, Parameter, SolverOptions, fit
from diffsoup.inference.fitting._starts import start_points


def _synthetic(problem, conditions, times, truth, sigma, rng, **exp_kwargs):
    """One experiment's data from ds.simulate at the true values plus Gaussian noise."""
    model = {k: v for k, v in truth.items() if k in problem.parameter_names}
    ys = np.asarray(ds.simulate(problem, conditions, times, model, rtol=1e-10, atol=1e-12).ys)
    return ys + sigma * rng.standard_normal(ys.shape)


def _z_scores(result, truth_theta):
    est = np.asarray(result.theta)
    se = np.array([result.standard_errors[n] for n in result.theta_names])
    return (est - truth_theta) / se


@pytest.mark.slow
def test_recovers_parameters_of_100_experiments_10_species():
    net = mass_action_network(10, 12, seed=1)
    problem = net.to_spec(y0=np.ones(10)).build()
    truth = dict(net.parameters)
    rng = np.random.default_rng(42)
    times = np.array([0.2, 1.0, 3.0])
    sigma = 0.02
    exps = []
    for i in range(100):
        y0 = rng.uniform(0.2, 2.0, 10)
        data = _synthetic(problem, y0, times, truth, sigma, rng)
        exps.append(ds.Experiment(f"x{i:03d}", times, data, noise=Gaussian(sigma), y0=y0))
    params = [Parameter(k, v, v / 10, v * 10) for k, v in truth.items()]
    study = ds.Study(problem, exps, params)
    low = ds.lower(study, solver=SolverOptions(rtol=1e-8, atol=1e-10))
    true_theta = np.log10([truth[n] for n in low.theta_names])
    start = true_theta + np.random.default_rng(0).uniform(-0.3, 0.3, true_theta.size)
    result = fit(low, starts=0, x0=start)
    z = _z_scores(result, true_theta)
    assert result.starts[0].success, result.message
    assert np.all(np.abs(z) < 4), dict(zip(result.theta_names, z))
    assert np.mean(z**2) < 2, z
    assert result.objective <= low.value(true_theta)


def _cluster_study():
    net = ds.ReactionNetwork(["A", "B", "C"], [("A -> B", "k1"), ("B -> C", "k2")], {"k1": 1.0, "k2": 0.5})
    problem = net.to_spec(y0=[1.0, 0.0, 0.0]).build()
    rng = np.random.default_rng(7)
    k1 = {f"c{j}": float(v) for j, v in enumerate([0.4, 0.8, 1.5, 2.5, 4.0])}
    truth = {"k2": 0.5}
    times = np.array([0.3, 1.0, 2.0, 4.0])
    exps = []
    for j, site in enumerate(k1):
        for i in range(4):
            y0 = [float(rng.uniform(0.5, 2.0)), 0.0, 0.0]
            data = _synthetic(problem, y0, times, {"k1": k1[site], **truth}, 0.02, rng)
            exps.append(ds.Experiment(f"{site}-{i}", times, data, noise=Gaussian(0.02), y0=y0,
                                      groups={"cluster": site}))  # fmt: skip
    params = [Parameter("k1", 1.0, 0.1, 10.0, level="cluster"), Parameter("k2", 0.5, 0.05, 5.0)]
    return ds.Study(problem, exps, params, levels=("cluster",)), k1, truth


@pytest.mark.slow
def test_hierarchical_study_recovers_cluster_parameters():
    study, k1, truth = _cluster_study()
    low = ds.lower(study)
    assert low.theta_names == ("k1[c0]", "k1[c1]", "k1[c2]", "k1[c3]", "k1[c4]", "k2")
    result = fit(low, starts=2, seed=1)
    assert len(result.starts) == 2 and all(s.n_evaluations > 0 for s in result.starts)
    true_theta = np.log10([k1[n[3:5]] for n in low.theta_names[:5]] + [truth["k2"]])
    z = _z_scores(result, true_theta)
    assert np.all(np.abs(z) < 4), z
    for site, value in k1.items():
        assert abs(result.parameters[f"k1[{site}]"] / value - 1) < 0.1


@functools.cache
def _blowup_study():
    """A' = -k1 A + k2 A^2: decays for k2 < k1 / A0, blows up in finite time above. (Built once:
    both methods' fits share its compiled programs.)"""
    net = ds.ReactionNetwork(["A", "B"], [("A -> B", "k1"), ("A + A -> A + A + A", "k2")], {"k1": 1.0, "k2": 0.3})
    problem = net.to_spec(y0=[1.0, 0.0]).build()
    rng = np.random.default_rng(1)
    times = np.array([0.5, 1.0, 2.0, 3.0])
    exps = []
    for i in range(4):
        y0 = [0.6 + 0.2 * i, 0.0]
        exps.append(ds.Experiment(f"b{i}", times, _synthetic(problem, y0, times, net.parameters, 0.01, rng),
                                  noise=Gaussian(0.01), y0=y0))  # fmt: skip
    params = [Parameter("k1", 1.0, 0.1, 10.0), Parameter("k2", 0.3, 0.03, 10.0)]
    return ds.Study(problem, exps, params, ), np.log10([1.0, 0.3])


@pytest.mark.slow
@pytest.mark.parametrize("method", ["trf", "lbfgsb"])
def test_failed_solves_are_recorded_and_the_fit_goes_on(method):
    study, true_theta = _blowup_study()
    low = ds.lower(study, solver=SolverOptions(max_steps=2000))
    bad = np.log10([1.0, 8.0])  # k2 = 8: every experiment blows up before t = 3
    good = np.log10([2.0, 0.1])
    result = fit(low, method=method, starts=np.array([bad, good]))
    failed, ok = result.starts
    assert not failed.success and failed.objective == np.inf
    assert "failed at the start point" in failed.message
    assert {f[0] for f in failed.failures} == {"b0", "b1", "b2", "b3"}
    assert all(f[1] in ("NONFINITE_STATE", "STEP_TOO_SMALL", "MAX_STEPS") for f in failed.failures)
    assert result.best == 1 and ok.success
    assert np.all(np.abs(_z_scores(result, true_theta)) < 4)


def test_start_points_are_the_public_sobol_sequence_on_the_scaled_bounds():
    """Start points: the rows of the public ``ds.inference.sobol`` draws (scipy's scrambled Sobol'
    sequence) from a box of the same bounds on the linear scale, mapped onto the bounds; an
    unbounded coordinate (a window start) keeps its prepared value and takes no column of the
    sequence."""
    from types import SimpleNamespace

    from scipy.stats import qmc

    lo, hi = np.array([-1.0, 0.0, -np.inf, 2.0]), np.array([1.0, 5.0, np.inf, 3.0])
    lowered = SimpleNamespace(lower=lo, upper=hi, nominal=np.array([0.5, 1.0, 7.0, 2.5]))
    pts = start_points(lowered, 8, seed=3)
    assert pts.shape == (8, 4) and np.all(pts[:, 2] == 7.0)
    bounded = [0, 1, 3]
    unit = qmc.Sobol(3, scramble=True, rng=np.random.default_rng(3)).random(8)
    np.testing.assert_array_equal(pts[:, bounded], lo[bounded] + unit * (hi[bounded] - lo[bounded]))
    box = ds.inference.ParameterBox(("a", "b", "c"), lo[bounded], hi[bounded], ("lin",) * 3)
    np.testing.assert_allclose(pts[:, bounded], ds.inference.sobol(box, 8, seed=3), rtol=1e-15)
    assert np.all(pts[:, bounded] >= lo[bounded]) and np.all(pts[:, bounded] <= hi[bounded])
    # 8 Sobol' points (a power of 2): one in each eighth of every coordinate, as a hypercube's.
    strata = np.floor((pts[:, bounded] - lo[bounded]) / (hi[bounded] - lo[bounded]) * 8).astype(int)
    for j in range(3):
        assert sorted(strata[:, j]) == list(range(8))
    np.testing.assert_array_equal(pts, start_points(lowered, 8, seed=3))
    assert start_points(lowered, 0, seed=3).shape == (0, 4)


def test_start_points_are_a_stream_whose_prefix_does_not_move_with_the_count():
    """Point i depends on (seed, i) alone: 40 starts are the first 40 of 44, and ``first=`` gives
    any later piece of the same stream (what a campaign grown from 40 to 44 starts, or an optimizer
    refilling its lanes, asks for); another seed gives other points."""
    from types import SimpleNamespace

    lowered = SimpleNamespace(lower=np.array([-5.0, 0.0]), upper=np.array([5.0, 1.0]), nominal=np.zeros(2))
    forty, forty_four = start_points(lowered, 40, seed=7), start_points(lowered, 44, seed=7)
    np.testing.assert_array_equal(forty_four[:40], forty)
    np.testing.assert_array_equal(start_points(lowered, 4, seed=7, first=40), forty_four[40:])
    np.testing.assert_array_equal(start_points(lowered, 1, seed=7, first=13)[0], forty[13])
    assert not np.allclose(start_points(lowered, 4, seed=8), forty[:4])
    with pytest.raises(ValueError, match="first=-1 must be non-negative"):
        start_points(lowered, 2, seed=7, first=-1)


def test_fit_rejects_bad_options():
    study, _ = _blowup_study()
    low = ds.lower(study)
    with pytest.raises(ValueError, match="method="):
        fit(low, method="newton")
    with pytest.raises(ValueError, match="starts has shape"):
        fit(low, starts=np.zeros((2, 3)))
    with pytest.raises(ValueError, match="outside the bounds"):
        fit(low, starts=np.array([[5.0, 0.0]]))


# -- methods, results, campaigns of starts, PEtab parameter tables --------------------------------


def test_methods_by_name_map_the_tolerances_onto_their_options():
    from diffsoup.inference import LBFGSB, TRF, Fides
    from diffsoup.inference.fitting._fit import optimizer_of

    assert optimizer_of("fides", ftol=1e-9, gtol=1e-7, xtol=1e-6, max_nfev=50) == Fides(
        frtol=1e-9, gatol=1e-7, xtol=1e-6, max_evaluations=50)  # fmt: skip
    assert optimizer_of("trf", ftol=1e-5) == TRF(ftol=1e-5)
    assert optimizer_of("lbfgsb", xtol=1e-3, max_nfev=9) == LBFGSB(max_evaluations=9)  # no xtol in L-BFGS-B
    assert optimizer_of(Fides(hessian="sr1"), max_nfev=7) == Fides(hessian="sr1", max_evaluations=7)


def test_waterfall_and_converged_starts():
    from fit_helpers import SOLVER, decay_study, reference_fit

    low = ds.lower(decay_study(5), solver=SOLVER)
    _, _, nll = reference_fit(5)
    bad = np.array([[1.9, 1.9]])  # A = k = 80: stopped after one iteration, far from the optimum
    result = fit(low, starts=np.vstack([bad, [[0.3, -0.3]]]), max_nfev=1)
    assert result.waterfall.tolist() == sorted(s.objective for s in result.starts)
    converged = result.converged(1e-3)
    assert result.best == 1 and converged[1] and not converged[0]
    assert result.starts[0].objective > result.objective + 100
    full = fit(low, starts=3, seed=4)
    assert full.converged(1e-6, best=nll).all()
    assert not full.converged(1e-6, best=nll - 1.0).any()


def test_failure_residual_is_deprecated():
    from fit_helpers import SOLVER, decay_study

    low = ds.lower(decay_study(6), solver=SOLVER)
    with pytest.warns(DeprecationWarning, match="failure_residual"):
        fit(low, starts=1, failure_residual=1e4)


def test_multistart_campaign_resumes_from_its_ledger(tmp_path):
    from fit_helpers import SOLVER, decay_study, reference_fit

    low = ds.lower(decay_study(7), solver=SOLVER)
    ledger = tmp_path / "starts.json"
    first = ds.inference.multistart(low, starts=3, seed=1, ledger_path=ledger)
    direct = fit(low, starts=3, seed=1)
    np.testing.assert_array_equal([s.x0 for s in first.starts], [s.x0 for s in direct.starts])
    assert first.objective == pytest.approx(reference_fit(7)[2], abs=1e-7)
    calls = []
    original = low.evaluate
    low.evaluate = lambda mode, theta: calls.append(mode) or original(mode, theta)
    try:
        again = ds.inference.multistart(low, starts=3, seed=1, ledger_path=ledger)
    finally:
        del low.evaluate
    assert calls == ["gauss_newton"]  # the standard errors at the best start; no start ran again
    np.testing.assert_array_equal(again.theta, first.theta)


def test_parameter_table_in_petab_form(tmp_path):
    import pandas as pd
    from fit_helpers import SOLVER, decay_study

    low = ds.lower(decay_study(8, estimate_sigma=True), solver=SOLVER, parameters=["A", "k"], values={"sigma": 0.05})
    result = fit(low, starts=1)
    path = ds.inference.write_parameter_table(result, tmp_path / "out" / "parameters.tsv", low)
    table = pd.read_csv(path, sep="\t").set_index("parameterId")
    assert list(table.columns) == ["parameterScale", "lowerBound", "upperBound", "nominalValue", "estimate"]
    assert table.loc["A", "nominalValue"] == pytest.approx(result.parameters["A"], rel=1e-15)
    assert table.loc["sigma", "nominalValue"] == 0.05 and table.loc["sigma", "estimate"] == 0
    assert table.loc["k", "parameterScale"] == "log10" and table.loc["k", "upperBound"] == 100.0
    import petab.v1 as petab

    petab.lint.check_parameter_df(table)
    template = table.assign(parameterName=["amplitude", "rate", "noise"], nominalValue=1.0)
    kept = ds.inference.parameter_table(low, result.parameters, template)
    assert list(kept["parameterName"]) == ["amplitude", "rate", "noise"]
    assert kept.loc["k", "nominalValue"] == pytest.approx(result.parameters["k"], rel=1e-15)
    with pytest.raises(ValueError, match="not estimated"):
        ds.inference.parameter_table(low, {"sigma": 1.0})
