"""The batched trust-region optimizer (``fit(method="batched")``): linear least squares against
numpy's and scipy's solutions, bounded Rosenbrock against scipy's ``least_squares`` (the same
method, run start by start), every lane equal to the same start alone in one lane, refill keeping
the lanes busy, a failing lane flagged without disturbing its neighbours, and an ODE fit that
reaches the optimum fides finds."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fit_helpers import SOLVER, decay_study, reference_fit, two_noise_levels_study
from scipy.optimize import least_squares, lsq_linear

import diffsoup as ds
from diffsoup.inference import BatchedTrustRegion, LaneStatus
from diffsoup.inference.fitting._batched_fit import distinct_optima, polish_heads
from diffsoup.inference.fitting._batched_trust_region import run_lanes
from diffsoup.inference.fitting._starts import start_points

SCIPY_TIGHT = dict(ftol=1e-14, xtol=1e-14, gtol=1e-12)
TIGHT = dict(SCIPY_TIGHT, stall_rtol=0.0)  # scipy's tests alone, tight


def evaluator(residuals):
    """``points -> (r, J, solved)`` of a JAX residual function, all points in one jitted program."""
    program = jax.jit(jax.vmap(lambda x: (residuals(x), jax.jacfwd(residuals)(x))))

    def evaluate(points, active):
        r, J = program(jnp.asarray(points))
        return np.asarray(r), np.asarray(J), np.ones(len(points), dtype=bool)

    return evaluate


RNG = np.random.default_rng(3)
A = RNG.standard_normal((8, 3))
B = A @ np.array([0.3, -0.1, -0.5]) + 1e-3 * RNG.standard_normal(8)  # a small residual at the optimum


def linear(x):
    return A @ x - B


def rosenbrock(x):
    return jnp.stack([10.0 * (x[1] - x[0] ** 2), 1.0 - x[0]])


ROSEN_LOWER, ROSEN_UPPER = np.array([-2.0, -1.0]), np.array([2.0, 3.0])
ROSEN_STARTS = np.array([[-1.5, 2.5], [0.5, -0.5], [1.9, 0.1], [-0.3, 0.3], [1.2, 2.9], [0.0, 0.0], [-1.9, -0.9]])


def test_linear_least_squares_inactive_bounds_equal_lstsq():
    x_star = np.linalg.lstsq(A, B, rcond=None)[0]
    lower, upper = x_star - 10.0, x_star + 10.0
    starts = lower + (upper - lower) * RNG.random((4, 3))
    run = run_lanes(BatchedTrustRegion(lanes=4, **TIGHT), evaluator(linear), starts, lower, upper)
    for end in run.results:
        assert end.status.converged, end.message
        np.testing.assert_allclose(end.x, x_star, rtol=0, atol=1e-10)


def test_linear_least_squares_active_bound_equals_lsq_linear():
    lower, upper = np.array([-1.0, -1.0, 0.0]), np.array([1.0, 1.0, 0.05])
    reference = lsq_linear(A, B, bounds=(lower, upper), tol=1e-14, method="bvls")
    assert np.any(np.isclose(reference.x, upper) | np.isclose(reference.x, lower)), "a bound must be active"
    starts = lower + (upper - lower) * np.array([[0.1, 0.2, 0.3], [0.9, 0.5, 0.5], [0.5, 0.9, 0.9]])
    run = run_lanes(BatchedTrustRegion(lanes=3, max_evaluations=500, **TIGHT), evaluator(linear), starts, lower,
                    upper)
    for end in run.results:
        np.testing.assert_allclose(end.x, reference.x, rtol=0, atol=1e-8)


def test_rosenbrock_lanes_equal_one_lane_runs_and_scipy_trf():
    """Each lane equals its start alone in one lane and scipy's least_squares(method="trf") from
    that start (the same method: the same end point and the same number of evaluations)."""
    evaluate = evaluator(rosenbrock)
    run = run_lanes(BatchedTrustRegion(lanes=3, **TIGHT), evaluate, ROSEN_STARTS, ROSEN_LOWER, ROSEN_UPPER)
    for start, end in list(zip(ROSEN_STARTS, run.results))[:4]:
        alone = run_lanes(BatchedTrustRegion(lanes=1, **TIGHT), evaluate, start[None], ROSEN_LOWER, ROSEN_UPPER).results[0]
        np.testing.assert_allclose(end.x, alone.x, rtol=0, atol=1e-8)
        assert end.evaluations == alone.evaluations
        np.testing.assert_allclose(end.x, [1.0, 1.0], rtol=0, atol=1e-8)
        scipy = least_squares(lambda x: np.asarray(rosenbrock(x)), start, jac=lambda x: np.asarray(jax.jacfwd(rosenbrock)(x)),
                              bounds=(ROSEN_LOWER, ROSEN_UPPER), method="trf", **SCIPY_TIGHT)  # fmt: skip
        np.testing.assert_allclose(end.x, scipy.x, rtol=0, atol=1e-8)
        assert end.evaluations == scipy.nfev


def test_rosenbrock_with_an_active_bound_reaches_the_bounded_minimum():
    upper = np.array([0.5, 3.0])  # the minimum of 10^2 (y - x^2)^2 + (1 - x)^2 with x <= 0.5: (0.5, 0.25)
    starts = np.clip(ROSEN_STARTS, ROSEN_LOWER, upper)
    run = run_lanes(BatchedTrustRegion(lanes=4, **TIGHT), evaluator(rosenbrock), starts, ROSEN_LOWER, upper)
    for end in run.results:
        np.testing.assert_allclose(end.x, [0.5, 0.25], rtol=0, atol=1e-8)
        assert np.all(end.x <= upper)


def test_jit_and_no_jit_agree():
    starts = ROSEN_STARTS[2:3]
    options = BatchedTrustRegion(lanes=1, **TIGHT)
    jitted = run_lanes(options, evaluator(rosenbrock), starts, ROSEN_LOWER, ROSEN_UPPER)
    with jax.disable_jit():
        eager = run_lanes(options, evaluator(rosenbrock), starts, ROSEN_LOWER, ROSEN_UPPER)
    for a, b in zip(jitted.results, eager.results):
        np.testing.assert_allclose(a.x, b.x, rtol=0, atol=1e-12)
        assert a.evaluations == b.evaluations


def test_refill_keeps_every_lane_busy_until_fewer_starts_remain():
    lanes, n = 3, len(ROSEN_STARTS)
    run = run_lanes(BatchedTrustRegion(lanes=lanes), evaluator(rosenbrock), ROSEN_STARTS, ROSEN_LOWER, ROSEN_UPPER)
    ended_before = (0,) + run.ended[:-1]
    assert run.active == tuple(min(lanes, n - e) for e in ended_before)
    assert run.active[0] == lanes and run.ended[-1] == n
    # Without refill the lanes run in batches: a new batch only once every lane's start has ended.
    batches = run_lanes(BatchedTrustRegion(lanes=lanes, refill=False), evaluator(rosenbrock), ROSEN_STARTS,
                        ROSEN_LOWER, ROSEN_UPPER)  # fmt: skip
    for before, active, after in zip(batches.ended, batches.active[1:], batches.ended[1:]):
        assert active <= lanes
    assert batches.ended[-1] == n and len(batches.active) > len(run.active)
    for a, b in zip(run.results, batches.results):
        np.testing.assert_allclose(a.x, b.x, rtol=0, atol=1e-12)


def failing_rosenbrock(x):
    """Rosenbrock whose residuals are NaN for x[0] > 1.6 (a region where "the solve fails")."""
    return jnp.where(x[0] > 1.6, jnp.nan, rosenbrock(x))


def test_a_failing_lane_is_flagged_and_leaves_its_neighbours_alone():
    evaluate = evaluator(failing_rosenbrock)
    bad = np.array([1.9, 0.1])  # the start point itself fails
    good = ROSEN_STARTS[[0, 1, 3]]
    with_bad = run_lanes(BatchedTrustRegion(lanes=4, **TIGHT), evaluate, np.vstack([good[:1], bad[None], good[1:]]),
                         ROSEN_LOWER, ROSEN_UPPER)  # fmt: skip
    without = run_lanes(BatchedTrustRegion(lanes=3, **TIGHT), evaluate, good, ROSEN_LOWER, ROSEN_UPPER)
    flagged = with_bad.results[1]
    assert flagged.status == LaneStatus.FAILED_START and np.isinf(flagged.cost) and "failed" in flagged.message
    assert np.all(np.isfinite(flagged.x))
    for a, b in zip([with_bad.results[i] for i in (0, 2, 3)], without.results):
        np.testing.assert_allclose(a.x, b.x, rtol=0, atol=1e-12)
        assert a.cost == b.cost and a.evaluations == b.evaluations
    # A start whose trial step enters a failing region rejects it, cuts its radius and goes on.
    band = evaluator(lambda x: jnp.where((x[0] > 0.0) & (x[0] < 0.2), jnp.nan, rosenbrock(x)))
    end = run_lanes(BatchedTrustRegion(lanes=1, **TIGHT), band, np.array([[-1.9, -0.9]]), ROSEN_LOWER, ROSEN_UPPER).results[0]
    assert end.failed > 0 and end.status.converged
    np.testing.assert_allclose(end.x, [1.0, 1.0], atol=1e-8)


def test_failed_start_points_are_replaced_when_a_replacement_is_given():
    evaluate = evaluator(failing_rosenbrock)
    run = run_lanes(BatchedTrustRegion(lanes=2, **TIGHT), evaluate, np.array([[1.9, 0.1], [0.5, -0.5]]), ROSEN_LOWER,
                    ROSEN_UPPER, replace=lambda i, attempt: np.array([1.8 - 0.3 * attempt, 0.0]), attempts=5)  # fmt: skip
    first = run.results[0]
    assert first.resampled == 1 and np.allclose(first.x0, [1.5, 0.0]) and first.status.converged
    np.testing.assert_allclose(first.x, [1.0, 1.0], atol=1e-8)


def test_distinct_optima_cluster_by_objective_and_point():
    objectives = [1.0, 1.0005, 1.0, 2.0, np.inf]
    points = np.array([[0.0, 0.0], [0.001, 0.0], [0.5, 0.0], [0.0, 0.0], [0.0, 0.0]])
    groups = distinct_optima(objectives, points, np.array([-1.0, -1.0]), np.array([1.0, 1.0]))
    assert groups == [[0, 1], [2], [3]]


def test_polish_heads_add_unconverged_ends_only_below_every_converged_end():
    """Past the ``polish`` best optima, up to ``unfinished`` more are polished: those whose start
    did not converge in the lanes, below the best converged end (none where a converged end is the
    best); an objective within CONVERGED of one already chosen is polished once."""

    def ends(objectives, converged):
        return [ds.inference.StartResult(np.zeros(1), np.array([float(i)]), f, i in converged, "", 1, 1, 0.0, ())
                for i, f in enumerate(objectives)]  # fmt: skip

    def heads(starts, polish, unfinished):
        groups = distinct_optima([s.objective for s in starts], np.stack([s.x for s in starts]), np.array([-np.inf]),
                                 np.array([np.inf]))  # fmt: skip
        return polish_heads(starts, groups, polish, unfinished)

    # Weber-like: the best ends all spent their budget; the first converged end is start 7 (20.0).
    weber = ends([10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 20.0, 21.0, 17.0], converged={7})
    assert heads(weber, 3, 2) == [0, 1, 2, 3, 4]
    assert heads(weber, 3, 8) == [0, 1, 2, 3, 4, 5, 6, 9]  # start 9 (17.0) is below 20.0; 20.0 stops it
    assert heads(weber, 3, 0) == [0, 1, 2] and heads(weber, 0, 8) == []
    # Boehm-like: a converged end is the best: the polish count stays.
    boehm = ends([10.0, 11.0, 12.0, 13.0, 14.0], converged={0})
    assert heads(boehm, 3, 8) == [0, 1, 2]
    # No converged end at all: every unconverged end may be polished.
    assert heads(ends([1.0, 2.0, 3.0], converged=set()), 1, 8) == [0, 1, 2]
    # A flat valley: 10.0005 at another point is 10's objective; polished once, not counted.
    valley = ends([10.0, 10.0005, 12.0, 13.0], converged=set())
    assert heads(valley, 2, 1) == [0, 2, 3]


def test_options_are_checked():
    with pytest.raises(ValueError, match="lanes=0 must be a positive integer"):
        BatchedTrustRegion(lanes=0)
    with pytest.raises(ValueError, match="ftol"):
        BatchedTrustRegion(ftol=-1.0)
    with pytest.raises(TypeError, match="polish_method"):
        BatchedTrustRegion(polish_method="fides")
    with pytest.raises(ValueError, match="polish_unfinished=-1 must be a non-negative integer"):
        BatchedTrustRegion(polish_unfinished=-1)
    assert ds.inference.fit.__module__ == "diffsoup.inference.fitting._fit"
    from diffsoup.inference.fitting._fit import optimizer_of

    assert optimizer_of("batched", ftol=1e-6, max_nfev=50) == BatchedTrustRegion(ftol=1e-6, max_evaluations=50)


def test_the_budget_per_start_is_an_explorers_when_a_polish_follows():
    """Unset, the evaluations per start are 100 when the best ends are polished (the batched phase
    explores), scipy's 100 n_theta otherwise; a budget given is kept either way. A run at the
    budget ends its lanes there."""
    from diffsoup.inference.fitting._batched_trust_region import EXPLORE_EVALUATIONS

    assert EXPLORE_EVALUATIONS == 100
    assert BatchedTrustRegion().budget(13) == 100 and BatchedTrustRegion().budget(1) == 100
    assert BatchedTrustRegion(polish=0).budget(13) == 1300
    assert BatchedTrustRegion(max_evaluations=7).budget(13) == 7 == BatchedTrustRegion(max_evaluations=7, polish=0).budget(13)
    rosenbrock = lambda x: jnp.stack([10.0 * (x[1] - x[0] ** 2), 1.0 - x[0]])  # noqa: E731
    starts = np.array([[-1.9, 2.9], [1.9, -0.9]])
    run = run_lanes(BatchedTrustRegion(lanes=2, max_evaluations=4, stall_rtol=0.0), evaluator(rosenbrock), starts,
                    np.full(2, -3.0), np.full(2, 3.0))  # fmt: skip
    assert [r.evaluations for r in run.results] == [4, 4]
    assert all(r.status == LaneStatus.MAX_EVALUATIONS for r in run.results)


@pytest.fixture(scope="module")
def decay():
    return ds.lower(decay_study(11), solver=SOLVER)


def test_study_evaluates_points_as_lanes_as_it_does_one_by_one(decay):
    thetas = np.array([[0.1, -0.2], [0.3, -0.1], [-1.0, 1.5]])
    r, J, failures = decay.residuals_and_jacobians(thetas)
    assert failures == ({}, {}, {})
    for i, theta in enumerate(thetas):
        r1, J1 = decay.residuals_and_jacobian(theta)
        np.testing.assert_allclose(r[i], r1, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(J[i], J1, rtol=1e-10, atol=1e-10)
    # A point marked inactive is skipped (NaN residuals); the others are the same numbers.
    r2, J2, _ = decay.residuals_and_jacobians(thetas, active=[True, False, True])
    assert np.all(np.isnan(r2[1]))
    np.testing.assert_array_equal(r2[[0, 2]], r[[0, 2]])
    np.testing.assert_array_equal(J2[[0, 2]], J[[0, 2]])


def test_a_step_budget_per_call_fails_the_points_that_need_more_and_compiles_nothing(decay):
    """``residuals_and_jacobians(max_steps=...)``: a point whose solve needs more steps than the
    budget fails with MAX_STEPS, the others are the same numbers, and no program is compiled."""
    thetas = np.array([[0.1, -1.5], [0.2, 0.5], [0.0, -1.4]])  # log10 k = -1.5, 0.5, -1.4
    steps = []
    for theta in thetas:
        decay.residuals_and_jacobian(theta)
        steps.append(int(decay.steps[0]))
    assert max(steps[0], steps[2]) < steps[1], steps  # the fast decay takes the most steps
    r, J, _ = decay.residuals_and_jacobians(thetas)
    programs = len(decay._compiled)
    budget = (max(steps[0], steps[2]) + steps[1]) // 2
    r2, J2, failures = decay.residuals_and_jacobians(thetas, max_steps=budget)
    assert len(decay._compiled) == programs
    assert failures == ({}, {"decay": ds.Status.MAX_STEPS}, {})
    np.testing.assert_array_equal(r2[[0, 2]], r[[0, 2]])
    np.testing.assert_array_equal(J2[[0, 2]], J[[0, 2]])
    assert np.all(np.isnan(r2[1]))
    with pytest.raises(ValueError, match="max_steps=0 must be a positive integer"):
        decay.residuals_and_jacobians(thetas, max_steps=0)


def test_the_lanes_step_budget_is_ten_times_the_nominal_points_within_the_floor_and_the_study(decay):
    from diffsoup.inference.fitting._batched_fit import lane_step_budget
    from diffsoup.inference.fitting._batched_trust_region import EXPLORE_STEPS_FACTOR, EXPLORE_STEPS_FLOOR

    assert lane_step_budget(decay, BatchedTrustRegion(max_steps=77)) == 77
    decay.value(decay.nominal)
    nominal = int(decay.steps[0])
    expected = max(EXPLORE_STEPS_FLOOR, EXPLORE_STEPS_FACTOR * nominal)
    assert expected < SOLVER.max_steps
    assert lane_step_budget(decay, BatchedTrustRegion()) == expected
    # Evaluated as one wanted lane of the lanes' own program (3 starts in 4 lanes: 3 points), with
    # no value program compiled for it, and no other number of points.
    fresh = ds.lower(decay_study(11), solver=SOLVER)
    assert lane_step_budget(fresh, BatchedTrustRegion(lanes=4), starts=3) == expected
    assert list(fresh._programs) == [("jacobian", 0)]
    points_programs = [key for key in fresh._compiled if isinstance(key, tuple) and key[0] == "points"]
    fresh.residuals_and_jacobians(start_points(fresh, 3, 0))
    assert [key for key in fresh._compiled if isinstance(key, tuple) and key[0] == "points"] == points_programs
    assert fresh._compiled[points_programs[0]]._cache_size() == 1
    tight = ds.lower(decay_study(11), solver=dataclasses.replace(SOLVER, max_steps=expected))
    assert lane_step_budget(tight, BatchedTrustRegion()) is None  # the study's own budget is no larger
    with pytest.raises(ValueError, match="max_steps=0 must be a positive integer"):
        BatchedTrustRegion(max_steps=0)


def test_ode_fit_lanes_equal_one_lane_runs_and_reach_the_optimum(decay):
    points = start_points(decay, 4, 0)
    np.testing.assert_array_equal(points, start_points(decay, 7, 0)[:4])  # a stream: start i does not depend on n
    options = BatchedTrustRegion(lanes=4, polish=0, **TIGHT)
    result = ds.inference.fit(decay, method=options, starts=4, seed=0)
    for i, start in enumerate(result.starts):
        np.testing.assert_array_equal(start.x0, points[i])
        alone = ds.inference.fit(decay, method=BatchedTrustRegion(lanes=1, polish=0, **TIGHT), starts=points[i : i + 1])
        np.testing.assert_allclose(start.x, alone.starts[0].x, rtol=0, atol=1e-8)
    best, _, nll = reference_fit(11)
    np.testing.assert_allclose(result.theta, best, rtol=0, atol=1e-7)
    assert result.objective == pytest.approx(nll, abs=1e-9)
    assert len(result.optima) == 1 and result.optima[0].count == 4 and result.converged().sum() == 4


def test_fit_batched_with_polish_reaches_what_fides_finds(decay):
    fides = ds.inference.fit(decay, method="fides", starts=3, seed=1)
    batched = ds.inference.fit(decay, method="batched", starts=3, seed=1)
    assert batched.method == "batched" and batched.optima[0].polished
    assert batched.objective == pytest.approx(fides.objective, abs=1e-8)
    np.testing.assert_allclose(batched.theta, fides.theta, atol=1e-5)
    assert "polished by fides" in batched.starts[batched.best].message


def test_fit_polishes_unconverged_ends_past_the_polish_count(decay):
    """Lanes stopped by their budget (2 evaluations) converge nowhere: ``polish=1`` with
    ``polish_unfinished=2`` finishes three distinct ends, and each polished end is at least as low as
    its batched end (its budget spent)."""
    options = BatchedTrustRegion(lanes=4, max_evaluations=2, polish=1, polish_unfinished=2)
    batched = ds.inference.fit(decay, method=options, starts=4, seed=1)
    alone = ds.inference.fit(decay, method=dataclasses.replace(options, polish=0), starts=4, seed=1)
    polished = [i for i, s in enumerate(batched.starts) if "polished by fides" in s.message]
    assert len(polished) == 3 and all(not s.success for s in alone.starts)
    assert sorted(polished) == sorted(np.argsort([s.objective for s in alone.starts])[:3].tolist())
    for i in polished:
        assert batched.starts[i].objective <= alone.starts[i].objective
        assert batched.starts[i].n_evaluations > alone.starts[i].n_evaluations == 2


def test_polishes_in_threads_equal_them_one_after_the_other_and_compile_each_program_once(caplog):
    """The batched fit's polishes run at once, one thread each (``polish_points``): each ends where
    it ends alone, and a program both threads ask for at once is compiled once (``compile_lock``)."""
    import logging

    from diffsoup.inference.fitting._batched_fit import polish_points
    from diffsoup.inference.objective._chunk_programs import clear_program_cache

    clear_program_cache()
    low = ds.lower(decay_study(11), solver=SOLVER)  # a fresh study: nothing compiled yet
    points = list(start_points(low, 3, 2))
    with caplog.at_level(logging.INFO, logger="diffsoup.compile"):
        together = polish_points(low, ds.inference.Fides(), points, threads=3)
    compiled = [r.diffsoup_compile[1] for r in caplog.records if getattr(r, "diffsoup_compile", ("",))[0] == "start"]
    assert compiled and len(compiled) == len(set(compiled)), compiled
    alone = polish_points(low, ds.inference.Fides(), points, threads=1)
    for a, b in zip(together, alone, strict=True):
        np.testing.assert_array_equal(a.x, b.x)
        assert a.objective == b.objective and a.n_evaluations == b.n_evaluations and a.message == b.message
    best, _, nll = reference_fit(11)
    assert min(a.objective for a in together) == pytest.approx(nll, abs=1e-8)


def test_one_start_through_fits_per_start_path_equals_its_lane(decay):
    """``BatchedTrustRegion.minimize`` (``run_start``: profiles, campaigns) runs one start in one
    lane on the study's own evaluation; it ends where the batched fit's lane does."""
    from diffsoup.inference.fitting._fit import run_start

    point = start_points(decay, 1, 0)[0]
    options = BatchedTrustRegion(lanes=1, polish=0, **TIGHT)
    alone = run_start(decay, options, point)
    lane = ds.inference.fit(decay, method=options, starts=point[None]).starts[0]
    np.testing.assert_allclose(alone.x, lane.x, rtol=0, atol=1e-8)
    assert alone.success and alone.objective == pytest.approx(lane.objective, abs=1e-10)


@pytest.mark.parametrize("distribution, sd1_upper", [(ds.inference.Gaussian, 10.0), (ds.inference.LogNormal, 10.0),
                                                     (ds.inference.Gaussian, 0.02)],
                         ids=["gaussian", "lognormal", "sd1-at-its-bound"])  # fmt: skip
def test_noise_levels_in_the_lanes_equal_the_per_point_path(distribution, sd1_upper):
    """The lanes' closed-form noise levels (one evaluation per point, moved and projected on the
    device, all points at once) give the residuals, the projected Jacobian and the noise optimum of
    ``StartObjective``'s path that evaluates again at the optimum (``projected_jacobian``); a noise
    level held at its bound is not projected out."""
    from diffsoup.inference.fitting._hierarchical import AnalyticParameters
    from diffsoup.inference.fitting._lane_noise import LaneNoise
    from diffsoup.inference.fitting._optimizers import StartObjective

    low = ds.lower(two_noise_levels_study(distribution, sd2_scale="lin", sd1_upper=sd1_upper), solver=SOLVER)
    found = AnalyticParameters.find(low, ["sd1", "sd2"])
    lane = LaneNoise.of(low, found)
    assert lane.free.tolist() == [0, 1]
    x = np.array([[-0.2, 0.5], [0.3, 0.1], [0.05, -0.4]])
    thetas = lane.thetas(x)
    r, J, failures = low.residuals_and_jacobians(thetas)
    assert failures == ({}, {}, {})
    moved, r_moved, J_moved = (np.asarray(a) for a in lane.moved(thetas, r, J))
    for i in range(len(x)):
        objective = StartObjective(low, analytic=found)
        objective._noise_alone = False  # the path that evaluates again at the optimum
        r_at, J_at = objective.residuals_and_jacobian(x[i])
        np.testing.assert_allclose(moved[i], objective.theta(x[i]), rtol=1e-12)
        np.testing.assert_allclose(r_moved[i], r_at, rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(J_moved[i], J_at, rtol=1e-7, atol=1e-8 * np.max(np.abs(J_at)))
    if sd1_upper < 1.0:
        assert np.all(moved[:, 2] == np.log10(sd1_upper))


def test_a_batched_fit_with_noise_levels_moves_the_other_coordinates_as_one_start_alone_does():
    """With the default analytic noise levels the lanes move k and o alone; each lane ends where
    the same start does through fit's per-start path (``run_start``, which evaluates again at the
    noise optimum), at fides' optimum, its noise levels at their closed-form values there."""
    from diffsoup.inference.fitting._fit import run_start
    from diffsoup.inference.fitting._hierarchical import AnalyticParameters

    low = ds.lower(two_noise_levels_study(), solver=SOLVER)
    found = AnalyticParameters.find(low, None)
    assert found is not None and found.noise.names == ("sd1", "sd2") and found.affine is None
    options = BatchedTrustRegion(lanes=3, polish=0, **TIGHT)
    result = ds.inference.fit(low, method=options, starts=3, seed=0)
    assert result.analytic == ("sd1", "sd2")
    fides = ds.inference.fit(low, method="fides", starts=3, seed=0)
    points = start_points(low, 3, 0)
    for i, start in enumerate(result.starts):
        np.testing.assert_array_equal(start.x0, points[i])
        alone = run_start(low, BatchedTrustRegion(lanes=1, polish=0, **TIGHT), points[i], analytic=found)
        np.testing.assert_allclose(start.x, alone.x, rtol=0, atol=1e-8)
        assert start.objective == pytest.approx(alone.objective, abs=1e-9)
        assert start.objective == pytest.approx(fides.objective, abs=1e-8)
        np.testing.assert_allclose(start.x, fides.theta, atol=1e-5)
