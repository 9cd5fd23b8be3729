"""Multiple shooting: a Lotka-Volterra fit from poor starting values where single shooting stalls
(objective >= 10x the truth's) and Multishoot recovers the true parameters with the same optimizer
and budget; with window starts on the true trajectory the windows reproduce single shooting and the
continuity residuals vanish; adjoint gradient vs forward-sensitivity Jacobian vs finite
differences; one chunk vs many; validation; fit results written to Zarr and read back by plain zarr."""

import numpy as np
import pytest

import diffsoup as ds
import jax.numpy as jnp
from diffsoup.inference import Gaussian, Multishoot, Parameter, SolverOptions, fit

TRUTH = {"a": 1.0, "b": 0.5, "c": 0.25, "d": 0.75}
POOR = {"a": 2.0, "b": 0.25, "c": 0.5, "d": 1.5}
SIGMA = 0.05
SOLVER = SolverOptions(rtol=1e-7, atol=1e-9)


def lotka_volterra(t, y, p):
    x, z = y[0], y[1]
    return jnp.stack([p["a"] * x - p["b"] * x * z, p["c"] * x * z - p["d"] * z])


@pytest.fixture(scope="module")
def lv():
    spec = ds.ProblemSpec(lotka_volterra, states=["prey", "pred"], parameters=dict(TRUTH), y0=[2.0, 1.0], name="LV")
    problem = spec.build()
    times = np.linspace(0.5, 30.0, 40)
    ys = np.asarray(ds.simulate(problem, None, times, TRUTH, rtol=1e-10, atol=1e-12).ys)
    data = ys + SIGMA * np.random.default_rng(0).standard_normal(ys.shape)
    exp = ds.Experiment("lv", times, data, noise=Gaussian(SIGMA))
    table = [Parameter(k, v, v / 10, v * 10) for k, v in TRUTH.items()]
    return problem, exp, table, ys


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFSOUP_CACHE_DIR", str(tmp_path / "cache"))


def test_multishoot_recovers_oscillator_where_single_shooting_stalls(lv):
    problem, exp, table, _ = lv
    single = ds.lower(ds.Study(problem, [exp], table), objective="chi2", solver=SOLVER)
    multi = ds.lower(ds.Study(problem, [Multishoot(windows=6, continuity_weight=100.0).apply(exp)], table),
                     objective="chi2", solver=SOLVER)  # fmt: skip
    budget = dict(starts=0, max_nfev=40)
    r_single = fit(single, x0=POOR, **budget)
    r_multi = fit(multi, x0=POOR, **budget)
    truth_objective = single.value(single.problem.theta_of(TRUTH))
    assert r_single.objective >= 10 * truth_objective, (r_single.objective, truth_objective)
    est = np.array([r_multi.parameters[k] for k in TRUTH])
    np.testing.assert_allclose(est, list(TRUTH.values()), rtol=0.05)
    # The multiple-shooting optimum is a good single-shooting fit too (continuous trajectory).
    assert single.value(single.problem.theta_of(r_multi.parameters)) <= 1.05 * truth_objective
    assert r_multi.window_starts["lv"].shape == (5, 2)


def test_windows_on_the_true_trajectory_reproduce_single_shooting(lv):
    problem, exp, table, _ = lv
    ms = Multishoot(boundaries=[7.0, 15.0, 22.5], continuity_weight=3.0)
    low_s = ds.lower(ds.Study(problem, [exp], table), solver=SOLVER)
    low_m = ds.lower(ds.Study(problem, [ms.apply(exp)], table), solver=SOLVER)
    ip = low_m.problem
    assert ip.n_parameters == 4 and low_m.problem.n_theta == 4 + 3 * 2
    assert ip.theta_names[4:6] == ("lv.window1[prey]", "lv.window1[pred]")
    exact = np.asarray(ds.simulate(problem, None, [7.0, 15.0, 22.5], TRUTH, rtol=1e-12, atol=1e-14).ys)
    theta = np.concatenate([ip.theta_of(TRUTH)[:4], exact.reshape(-1)])
    r_s, r_m = low_s.residuals(theta[:4]), low_m.residuals(theta)
    assert r_m.size == r_s.size + 3 * 2 == low_m.n_residuals
    np.testing.assert_allclose(r_m[: r_s.size], r_s, atol=1e-4)
    np.testing.assert_allclose(r_m[r_s.size :], 0.0, atol=1e-4)
    # Moving one window start by delta gives a continuity residual of -weight * delta.
    moved = theta.copy()
    moved[4] += 0.1
    np.testing.assert_allclose(low_m.residuals(moved)[r_s.size], -3.0 * 0.1, atol=1e-4)
    assert abs(low_m.value(theta) - low_s.value(theta[:4])) < 1e-3


def test_gradient_adjoint_forward_and_finite_differences_agree(lv):
    problem, exp, table, _ = lv
    exps = [Multishoot(windows=3, continuity_weight=2.0).apply(exp)]
    low = ds.lower(ds.Study(problem, exps, table), solver=SolverOptions(rtol=1e-10, atol=1e-12))
    theta = low.problem.theta_of({"a": 1.1, "b": 0.45, "c": 0.3, "d": 0.7})
    theta[4:] += 0.05
    v, g = low.value_and_grad(theta)
    v2, g_gn, _ = low.gauss_newton(theta)
    assert v == pytest.approx(v2, rel=1e-8)
    np.testing.assert_allclose(g, g_gn, rtol=1e-5, atol=1e-6 * np.abs(g).max())
    h = 1e-6
    fd = [(low.value(theta + h * e) - low.value(theta - h * e)) / (2 * h) for e in np.eye(theta.size)[[0, 3, 4, 7]]]
    np.testing.assert_allclose(g[[0, 3, 4, 7]], fd, rtol=1e-4, atol=1e-4)


def test_chunks_and_mixed_trajectories_match_one_chunk(lv):
    problem, exp, table, _ = lv
    exps = [Multishoot(windows=3).apply(exp),
            ds.Experiment("lv2", exp.times, exp.data, noise=Gaussian(SIGMA), trajectory=Multishoot(windows=3)),
            ds.Experiment("single", exp.times[:10], exp.data[:10], noise=Gaussian(SIGMA))]  # fmt: skip
    study = ds.Study(problem, exps, table)
    one, many = ds.lower(study, solver=SOLVER), ds.lower(study, solver=SOLVER, experiments_per_chunk=1)
    theta = one.problem.nominal + 0.01
    assert one.value(theta) == pytest.approx(many.value(theta), rel=1e-10)
    np.testing.assert_allclose(one.residuals(theta), many.residuals(theta), atol=1e-10)
    assert many.chunk_sizes["value"] == [1, 1]
    assert len(one.groups) == 2 and one.problem.n_theta == 4 + 2 * 2 * 2


def test_validation_names_the_field(lv):
    _, exp, _, _ = lv
    with pytest.raises(ValueError, match="exactly one of windows"):
        Multishoot()
    with pytest.raises(ValueError, match="windows=1"):
        Multishoot(windows=1)
    with pytest.raises(ValueError, match="strictly increasing"):
        Multishoot(boundaries=[5.0, 3.0])
    with pytest.raises(ValueError, match="continuity_weight"):
        Multishoot(windows=2, continuity_weight=0.0)
    with pytest.raises(ValueError, match="init"):
        Multishoot(windows=2, init="guess")
    with pytest.raises(ValueError, match="strictly between t0"):
        Multishoot(boundaries=[40.0]).apply(exp)
    with pytest.raises(TypeError, match="trajectory must be"):
        exp.with_trajectory("windows")
    assert exp.trajectory is None and Multishoot(windows=2).apply(exp).trajectory.n_windows == 2


def test_fit_results_read_back_by_plain_zarr(lv, tmp_path):
    import zarr

    from diffsoup.store import read_fit, write_fit

    problem, exp, table, ys = lv
    low = ds.lower(ds.Study(problem, [Multishoot(windows=3).apply(exp)], table), solver=SOLVER)
    result = fit(low, starts=0, x0=TRUTH, max_nfev=5)
    path = write_fit(result, tmp_path / "fit.zarr", low)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_fit(result, path, low)
    g = zarr.open_group(str(path), mode="r")
    assert g.attrs["complete"] is True and g.attrs["theta_names"] == list(low.theta_names)
    np.testing.assert_array_equal(g["theta"][:], result.theta)
    e = g["experiments/0"]
    assert e.attrs["id"] == "lv"
    np.testing.assert_allclose(e["states"][:], ys, atol=5 * SIGMA)
    np.testing.assert_array_equal(e["window_starts"][:], result.window_starts["lv"])
    back = read_fit(path)
    np.testing.assert_array_equal(back["experiments"]["lv"]["times"], exp.times)
