"""fides as a fit method: every Hessian choice recovers the optimum and standard errors known
from the closed form; trial points whose solves fail make each method step back and the start
still converges; drawn start points that fail to solve are replaced; options are checked; a stop
in a valley is continued while the quadratic model predicts a decrease (Rosenbrock's valley, a
closed-form quadratic), and a continuation that gains nothing is not repeated."""

import functools

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
    # Every start ends at the optimum (the flat waterfall below); from the Sobol' start points the
    # exact Hessian stops one of them there by its trust region shrinking to its floor
    # (DELTA_TOO_SMALL, 2e-13 above the closed-form optimum, 6e-8 standard errors from it).
    assert all(s.success or s.message == "fides: DELTA_TOO_SMALL" for s in result.starts), [s.message for s in result.starts]
    assert all(s.objective == pytest.approx(nll, abs=1e-7) for s in result.starts)
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
    return ds.lower(_blowup(), solver=SolverOptions(max_steps=2000))


@functools.cache
def _blowup():
    """The study of :func:`_blowup_study`, built once: the tests' lowerings of it share their
    compiled programs."""
    spec = ds.ProblemSpec(lambda t, y, p: p["k"] * y**2, states=["y"], parameters={"A": 1.0, "k": 0.7}, y0=[1.0],
                          name="blowup")  # fmt: skip
    times = np.linspace(0.1, 1.0, 10)
    rng = np.random.default_rng(0)
    data = 1.0 / (1.0 - 0.7 * times) + 0.05 * rng.standard_normal(10)
    e = ds.Experiment("e", times, data[:, None], observables=lambda y, p: p["A"] * y, noise=Gaussian(0.05), y0=[1.0])
    return ds.Study(spec.build(), [e], [Parameter("A", 1.0, 0.1, 10.0), Parameter("k", 0.5, 0.01, 100.0)])


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


class _RosenbrockLeastSquares:
    """Rosenbrock's valley as least squares, ``f = |r|^2`` with ``r = (10 (x1 - x0^2), 1 - x0)``:
    the minimum 0 at (1, 1), reached along a long curved valley (the ``StartObjective`` interface
    fides' ``minimize`` uses: bounds and a Gauss-Newton evaluation)."""

    lower, upper = np.array([-5.0, -5.0]), np.array([5.0, 5.0])

    def gauss_newton(self, x):
        r = np.array([10.0 * (x[1] - x[0] ** 2), 1.0 - x[0]])
        J = np.array([[-20.0 * x[0], 10.0], [-1.0, 0.0]])
        return float(r @ r), 2.0 * J.T @ r, 2.0 * J.T @ J


def test_fides_continues_past_a_premature_function_value_stop():
    """With a function-value test loose enough to stop in the valley (fatol = 1), fides alone
    stops far from the minimum; the continuation (the model there still predicts a decrease)
    runs on to (1, 1); with ``continue_above=inf`` it does not."""
    x0 = np.array([-1.2, 1.0])
    f0 = _RosenbrockLeastSquares().gauss_newton(x0)[0]
    stopped = Fides(fatol=1.0, continue_above=np.inf).minimize(_RosenbrockLeastSquares(), x0, f0)
    assert stopped.message == "fides: FTOL" and stopped.value > 1e-2
    out = Fides(fatol=1.0).minimize(_RosenbrockLeastSquares(), x0, f0)
    assert "continued after FTOL" in out.message and out.success
    np.testing.assert_allclose(out.x, [1.0, 1.0], atol=1e-5)
    assert out.value < 1e-9 and out.n_iterations > stopped.n_iterations


def test_model_decrease_is_the_quadratic_models_drop_to_its_minimum():
    """For ``f = (x - c)^T A (x - c) / 2`` the Newton step's predicted decrease is ``f`` itself;
    a coordinate a bound holds (at the bound, gradient pointing out) is left out; negative
    curvature makes the model unbounded."""
    from diffsoup.inference.fitting._fides import model_decrease

    A = np.array([[4.0, 1.0], [1.0, 3.0]])
    c, x = np.array([0.5, -0.2]), np.array([1.5, 0.7])
    lo, hi = np.full(2, -10.0), np.full(2, 10.0)
    g = A @ (x - c)
    assert model_decrease(x, g, A, lo, hi) == pytest.approx(0.5 * (x - c) @ A @ (x - c), rel=1e-12)
    held = np.array([1.5, 10.0])  # x1 on its upper bound with the gradient pushing it up (out)
    g = np.array([2.0, -3.0])
    assert model_decrease(held, g, A, lo, hi) == pytest.approx(0.5 * 2.0**2 / 4.0, rel=1e-12)
    assert model_decrease(x, g, np.diag([1.0, -1.0]), lo, hi) == np.inf
    with pytest.raises(ValueError, match="max_continuations"):
        Fides(max_continuations=-1)


class _GradientOffByOne:
    """``f = x^2`` whose reported gradient is ``2 x + 1``: at the minimum the model predicts a
    decrease (0.25) that no step bears out, so the trust region collapses wherever fides starts."""

    lower, upper = np.array([-5.0]), np.array([5.0])

    def gauss_newton(self, x):
        return float(x[0] ** 2), np.array([2.0 * x[0] + 1.0]), np.array([[2.0]])


def test_a_continuation_that_gains_nothing_is_not_repeated():
    """The model's 0.25 is borne out by no step: the continuation's first round (at most
    ``continue_iterations``) gains less than ``continue_above`` and is the last."""
    first = Fides(continue_above=np.inf).minimize(_GradientOffByOne(), np.array([2.0]), 4.0)
    assert first.message == "fides: DELTA_TOO_SMALL"
    out = Fides(max_continuations=3, continue_iterations=7).minimize(_GradientOffByOne(), np.array([2.0]), 4.0)
    assert out.message.startswith("fides: DELTA_TOO_SMALL (continued after DELTA_TOO_SMALL with 0.25 predicted; "
                                  "a round of 7 iterations gained"), out.message
    assert out.n_iterations == first.n_iterations + 7
    assert abs(out.x[0]) < 1e-4 and out.value < 1e-8 and not out.success
    with pytest.raises(ValueError, match="continue_iterations"):
        Fides(continue_iterations=0)


def test_a_continuation_that_keeps_gaining_runs_round_after_round():
    """Rosenbrock's valley from a loose function-value stop: rounds of 5 iterations each gain more
    than ``continue_above`` until the minimum; the end point is the one an unbounded continuation
    (one round as long as the budget) reaches, and so is the objective to 1e-9."""
    x0 = np.array([-1.2, 1.0])
    f0 = _RosenbrockLeastSquares().gauss_newton(x0)[0]
    rounds = Fides(fatol=1.0, continue_iterations=5).minimize(_RosenbrockLeastSquares(), x0, f0)
    long = Fides(fatol=1.0, continue_iterations=1000).minimize(_RosenbrockLeastSquares(), x0, f0)
    assert "rounds" in rounds.message and rounds.success, rounds.message
    np.testing.assert_allclose(rounds.x, [1.0, 1.0], atol=1e-5)
    np.testing.assert_allclose(long.x, [1.0, 1.0], atol=1e-5)
    assert rounds.value < 1e-9 and long.value < 1e-9


@pytest.mark.parametrize(("method", "mode"), [(Fides(), "gauss_newton"), (Fides(hessian="bfgs"), "value_and_grad"),
                                              (TRF(), "jacobian"), (LBFGSB(), "value_and_grad")],
                         ids=["fides", "fides-bfgs", "trf", "lbfgsb"])  # fmt: skip
def test_a_start_evaluates_each_point_once_by_the_optimizers_own_evaluation(method, mode):
    """The start point's check is the optimizer's own first evaluation: one program compiled
    (none for the check alone), and no point evaluated twice by a start (the fit's standard errors
    then evaluate the best point once more)."""
    low = ds.lower(decay_study(0), solver=SOLVER)
    calls = []
    evaluate = low.evaluate

    def counted(which, theta):
        calls.append((which, np.asarray(theta, dtype=np.float64).tobytes()))
        return evaluate(which, theta)

    low.evaluate = counted
    result = ds.inference.fit(low, method=method, starts=1, seed=2)
    assert result.objective == pytest.approx(reference_fit(0)[2], abs=1e-6)
    starts_calls, errors_call = calls[:-1], calls[-1]
    assert {which for which, _ in starts_calls} == {mode}
    assert len(set(starts_calls)) == len(starts_calls) == result.n_evaluations
    assert errors_call[0] == "gauss_newton"
    assert sorted(key[0] for key in low._programs) == sorted({"jacobian", "value_and_grad" if mode == "value_and_grad"
                                                              else "jacobian"})  # fmt: skip
