"""Profile likelihoods: intervals against an independent profile of the closed-form model (scipy),
coverage of the truth over 50 data sets, open intervals of a parameter the data do not determine,
the campaign's ledger (a rerun resumes), the chi-square threshold, the figure."""

import json

import numpy as np
import pytest
from fit_helpers import SIGMA, SOLVER, TIMES, TRUTH, closed_form_interval, data, decay_study, problem, reference_fit

import diffsoup as ds
from diffsoup.inference import Parameter, ProfileOptions, profile_parameter
from diffsoup.inference.fitting._profile_likelihood import threshold

TRUE_THETA = np.log10([TRUTH["A"], TRUTH["k"]])


def test_threshold_is_the_chi_square_quantile_times_the_objectives_scale():
    assert threshold(0.5, 0.95) == pytest.approx(1.920729410347062, rel=1e-12)
    assert threshold(1.0, 0.95) == pytest.approx(3.841458820694124, rel=1e-12)
    assert threshold(0.5, 0.95, dof=2) == pytest.approx(0.5 * 5.991464547107979, rel=1e-12)
    with pytest.raises(ValueError, match="confidence"):
        threshold(0.5, 1.0)


def test_profile_intervals_match_the_closed_form_profile():
    low = ds.lower(decay_study(0), solver=SOLVER)
    result = ds.inference.fit(low, starts=2, seed=0)
    prof = ds.inference.profile(low, result)
    assert set(prof.profiles) == {"A", "k"} and not prof.failures
    for i, name in enumerate(low.theta_names):
        p = prof.profiles[name]
        lo, hi = closed_form_interval(0, i, prof.delta)
        assert not p.lower_open and not p.upper_open and p.reasons == ("crossed", "crossed")
        # The crossing is located to 1e-2 in the objective: for a quadratic profile of curvature
        # 1/se^2 that is ~1e-2 se / sqrt(2 delta) in the parameter.
        assert abs(p.lower - lo) < 5e-3 * result.standard_errors[name], (p.lower, lo)
        assert abs(p.upper - hi) < 5e-3 * result.standard_errors[name], (p.upper, hi)
        assert np.all(np.diff(p.values) > 0) and np.all(p.objectives >= p.optimum - 1e-6)
        # every profile point is a re-optimization: the other coordinate is optimal there
        j = 1 - i
        for theta, value in zip(p.points[1:-1:3], p.objectives[1:-1:3]):
            for shift in (-1e-3, 1e-3):
                moved = theta.copy()
                moved[j] += shift
                assert low.value(moved) >= value - 1e-9
    linear = prof.intervals(linear=True)
    assert linear["A"][0] == pytest.approx(10 ** prof.profiles["A"].lower)
    assert prof.better is None


def test_hierarchical_profiles_match_the_closed_form_profile():
    """With ``hierarchical=True`` the amplitude A (h = A y is linear in it) is optimized
    analytically at every point: A's profile re-optimizes k numerically, k's profile has nothing
    left for the optimizer (A alone, analytically). Both intervals match scipy's closed-form
    profile; every point's A is the closed-form optimum for its k; naming k (not linear) fails once,
    before any task runs."""
    low = ds.lower(decay_study(0), solver=SOLVER)
    result = ds.inference.fit(low, starts=2, seed=0)
    prof = ds.inference.profile(low, result, options=ProfileOptions(hierarchical=True))
    assert set(prof.profiles) == {"A", "k"} and not prof.failures
    for i, name in enumerate(low.theta_names):
        p = prof.profiles[name]
        lo, hi = closed_form_interval(0, i, prof.delta)
        assert p.reasons == ("crossed", "crossed")
        assert abs(p.lower - lo) < 5e-3 * result.standard_errors[name], (name, p.lower, lo)
        assert abs(p.upper - hi) < 5e-3 * result.standard_errors[name], (name, p.upper, hi)
    d = data(0)[:, 0]
    for theta in prof.profiles["k"].points:  # A at the closed-form least-squares optimum given k
        y = np.exp(-(10.0 ** theta[1]) * TIMES)
        assert 10.0 ** theta[0] == pytest.approx(float(y @ d) / float(y @ y), rel=1e-7)
    with pytest.raises(ValueError, match="'k' cannot be optimized analytically"):
        ds.inference.profile(low, result, options=ProfileOptions(hierarchical=("k",)))
    with pytest.raises(TypeError, match="hierarchical"):
        ProfileOptions(hierarchical=[1])


def test_profile_interval_covers_the_truth_at_its_confidence_over_50_data_sets():
    covered = np.zeros(2, dtype=int)
    for seed in range(50):
        low = ds.lower(decay_study(seed), solver=SOLVER)
        result = ds.inference.fit(low, starts=0, x0=TRUE_THETA)
        reference, se, _ = reference_fit(seed)
        assert np.all(np.abs(result.theta - reference) < 1e-3 * se)
        prof = ds.inference.profile(low, result)
        covered += [prof.profiles[n].contains(t) for n, t in zip(low.theta_names, TRUE_THETA)]
    rate = covered / 50
    assert np.all((rate >= 0.88) & (rate <= 0.99)), rate


def test_a_parameter_the_data_do_not_determine_has_an_open_interval_to_its_bounds():
    """A model parameter that enters neither the right-hand side nor the observables."""
    spec = ds.ProblemSpec(lambda t, y, p: -p["k"] * y, states=["y"], parameters={"A": 2.0, "k": 0.5, "u": 1.0},
                          y0=[1.0], name="decay_u")  # fmt: skip
    e = ds.Experiment("decay", TIMES, data(3), observables=lambda y, p: p["A"] * y,
                      noise=ds.inference.Gaussian(SIGMA), y0=[1.0])  # fmt: skip
    params = [Parameter("A", 1.0, 0.01, 100.0), Parameter("k", 1.0, 0.01, 100.0), Parameter("u", 1.0, 0.1, 10.0)]
    low = ds.lower(ds.Study(spec.build(), [e], params), solver=SOLVER)
    result = ds.inference.fit(low, starts=0, x0=np.r_[TRUE_THETA, 0.3])
    p = profile_parameter(low, result.theta, result.objective, "u")
    assert p.lower_open and p.upper_open and p.reasons == ("bound", "bound")
    assert (p.lower, p.upper) == (-1.0, 1.0)
    np.testing.assert_allclose(p.objectives, result.objective, atol=1e-6)
    identified = profile_parameter(low, result.theta, result.objective, "k")
    assert not identified.lower_open and not identified.upper_open


def test_profiles_are_campaign_tasks_and_a_rerun_resumes(tmp_path):
    low = ds.lower(decay_study(1), solver=SOLVER)
    result = ds.inference.fit(low, starts=0, x0=TRUE_THETA)
    ledger = tmp_path / "profiles.json"
    first = ds.inference.profile(low, result, parameters=["k"], ledger_path=ledger)
    assert list(first.profiles) == ["k"]
    records = json.loads(ledger.read_text())
    assert "profile:k" in json.dumps(records)
    calls = []
    original = low.evaluate

    def counting(mode, theta):
        calls.append(mode)
        return original(mode, theta)

    low.evaluate = counting
    try:
        again = ds.inference.profile(low, result, parameters=["k"], ledger_path=ledger)
    finally:
        del low.evaluate
    assert not calls  # read from the ledger: nothing evaluated
    assert again.profiles["k"].interval == first.profiles["k"].interval
    np.testing.assert_array_equal(again.profiles["k"].objectives, first.profiles["k"].objectives)
    both = ds.inference.profile(low, result, ledger_path=ledger)  # adds A; k is kept
    assert list(both.profiles) == ["A", "k"] and both.profiles["k"].interval == first.profiles["k"].interval


def test_profile_rejects_bad_input():
    low = ds.lower(decay_study(2), solver=SOLVER)
    with pytest.raises(ValueError, match="not estimated parameters"):
        ds.inference.profile(low, TRUE_THETA, parameters=["nope"])
    with pytest.raises(ValueError, match="shape"):
        ds.inference.profile(low, np.zeros(3))
    with pytest.raises(ValueError, match="step_increase"):
        ProfileOptions(step_increase=0.0)
    with pytest.raises(TypeError, match="optimizer"):
        ProfileOptions(optimizer="fides")


def test_profile_figure_is_written(tmp_path):
    low = ds.lower(decay_study(4), solver=SOLVER)
    prof = ds.inference.profile(low, ds.inference.fit(low, starts=0, x0=TRUE_THETA))
    path = ds.plots.plot_profiles(prof, tmp_path / "plots" / "profiles.png", title="decay")
    assert path.exists() and path.stat().st_size > 5000
    assert problem().n_states == 1
