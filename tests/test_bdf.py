"""ds.BDF: its history operations against scipy's, the order of each formula, the Test Set
references, the Brusselator against scipy, factorization reuse, status codes, every linear
solver and precision mode, vmap against a loop, and its derivatives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.sparse as sp
from scipy.integrate._ivp import bdf as scipy_bdf

import diffsoup as ds
from diffsoup.examples import OREGO_REFERENCE, ROBER_REFERENCE, brusselator_2d, orego, scd
from diffsoup.integrate._bdf_coefficients import NDF_KAPPA, advance, coefficients, predict, rescale
from conftest import klu_device


# ---- the history: re-sampling, predictor, update ----------------------------------------------------


@pytest.mark.parametrize("order", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("factor", [0.25, 0.9, 1.7, 10.0])
def test_rescale_is_scipys_change_D(order, factor):
    rng = np.random.default_rng(order)
    D = rng.standard_normal((8, 3))
    expected = D.copy()
    scipy_bdf.change_D(expected, order, factor)
    got = rescale(jnp.asarray(D), jnp.asarray(order), jnp.asarray(factor))
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-13, atol=1e-13)
    assert np.array_equal(np.asarray(rescale(jnp.asarray(D), jnp.asarray(order), jnp.asarray(1.0))), D)


def test_rescaled_history_is_the_same_polynomial():
    # D holds backward differences of the interpolating polynomial at t_n - j h; re-sampled at
    # spacing 2.5 h, its differences are those of the same polynomial's values at t_n - j 2.5 h.
    poly = np.polynomial.Polynomial([0.3, -1.2, 0.7, 0.25, -0.05])  # degree 4

    def differences(h, k):
        values = poly(-h * np.arange(k + 1))
        rows = [values[0]]
        for _ in range(k):
            values = values[:-1] - values[1:]
            rows.append(values[0])
        return np.array(rows)

    D = np.zeros((8, 1))
    D[:5, 0] = differences(0.1, 4)
    got = np.asarray(rescale(jnp.asarray(D), jnp.asarray(4), jnp.asarray(2.5)))[:5, 0]
    np.testing.assert_allclose(got, differences(0.25, 4), rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("order", [1, 3, 5])
def test_predict_and_advance_are_scipys(order):
    rng = np.random.default_rng(7)
    D = rng.standard_normal((8, 4))
    d = rng.standard_normal(4)
    gamma, alpha, error_const = coefficients(ndf=True)
    # scipy's own constants (bdf.py computes them in BDF.__init__).
    kappa = np.array([0, -0.1850, -1 / 9, -0.0823, -0.0415, 0])
    np.testing.assert_array_equal(NDF_KAPPA, kappa)
    np.testing.assert_allclose(error_const, kappa * gamma + 1 / np.arange(1, 7), rtol=1e-15)
    weights = np.zeros(8)
    weights[1 : order + 1] = gamma[1 : order + 1] / alpha[order]
    y_pred, psi = predict(jnp.asarray(D), jnp.asarray(order), jnp.asarray(weights))
    np.testing.assert_allclose(np.asarray(y_pred), np.sum(D[: order + 1], axis=0), rtol=1e-14)
    np.testing.assert_allclose(np.asarray(psi), D[1 : order + 1].T @ gamma[1 : order + 1] / alpha[order], rtol=1e-14)
    expected = D.copy()  # scipy's update after an accepted step
    expected[order + 2] = d - expected[order + 1]
    expected[order + 1] = d
    for i in reversed(range(order + 1)):
        expected[i] += expected[i + 1]
    np.testing.assert_allclose(np.asarray(advance(jnp.asarray(D), jnp.asarray(order), jnp.asarray(d))), expected,
                               rtol=1e-14, atol=1e-15)  # fmt: skip


# ---- the order of each formula ----------------------------------------------------------------------


LAMBDA = -50.0


@pytest.fixture(scope="module")
def sine_problem():
    # y' = lambda (y - sin t) + cos t, y(0) = 0: y = sin t. The start at order 1 and the order
    # ramp leave errors that decay as exp(lambda t), gone by t = 2: what remains is each
    # formula's own global error, C h^k. (One problem for the module: its programs are reused.)
    return ds.ProblemSpec(lambda t, y, p: LAMBDA * (y - jnp.sin(t)) + jnp.cos(t), states=1).build()


@pytest.mark.parametrize("ndf", [True, False], ids=["ndf", "bdf"])
@pytest.mark.parametrize("order", [1, 2, 3, 4, 5])
def test_each_fixed_order_converges_with_its_order(sine_problem, order, ndf):
    problem = sine_problem
    errors = []
    for h in [2.0**-5, 2.0**-6, 2.0**-7]:  # exact in binary: 2 / h steps, no shortened step
        sol = ds.simulate(problem, [0.0], [2.0], method=ds.BDF(max_order=order, ndf=ndf),
                          controller=ds.ConstantStep(h), rtol=1e-12, atol=1e-14)  # fmt: skip
        assert int(sol.stats["n_steps"]) == int(round(2.0 / h))
        errors.append(abs(float(sol.ys[-1, 0]) - np.sin(2.0)))
    measured = np.log2(np.asarray(errors[:-1]) / np.asarray(errors[1:]))
    assert np.all(np.abs(measured - order) < 0.1), measured


def test_ndf_is_more_accurate_than_bdf_at_orders_one_to_four(sine_problem):
    problem = sine_problem

    def error(order, ndf):
        sol = ds.simulate(problem, [0.0], [2.0], method=ds.BDF(max_order=order, ndf=ndf),
                          controller=ds.ConstantStep(2.0**-5), rtol=1e-12, atol=1e-14)  # fmt: skip
        return abs(float(sol.ys[-1, 0]) - np.sin(2.0))

    for order in (1, 2, 3, 4):
        assert error(order, True) < 0.8 * error(order, False), order
    # Order 5 has kappa = 0: the same formula.
    assert error(5, True) == pytest.approx(error(5, False), rel=1e-6)


# ---- Test Set references -------------------------------------------------------------------------------


def _rober_scipy(rtol):
    k1, k2, k3 = 0.04, 3e7, 1e4

    def f(t, y):
        return [-k1 * y[0] + k3 * y[1] * y[2], k1 * y[0] - k2 * y[1] ** 2 - k3 * y[1] * y[2], k2 * y[1] ** 2]

    def jac(t, y):
        return [[-k1, k3 * y[2], k3 * y[1]], [k1, -2 * k2 * y[1] - k3 * y[2], -k3 * y[1]], [0, 2 * k2 * y[1], 0]]

    sol = scipy.integrate.solve_ivp(f, (0, 1e11), [1, 0, 0], method="BDF", rtol=rtol, atol=1e-4 * rtol, jac=jac)
    return sol.y[:, -1], sol.nlu


# Measured scd (scipy BDF, same tolerances): 1e-7: 3.15-3.77 (3.6), 1e-10: 5.69-5.82 (5.83);
# the range is over machines and JAX builds. ROBER's y1 (2e-8 at t = 1e11) carries the BDF's
# global error, which swings with rtol at loose tolerances (jax 0.12.0.1, 2-core CPU: 3e-7 3.37,
# 1e-7 3.15, 5e-8 3.83); RADAU reached 5.67 at rtol 1e-7.
@pytest.mark.parametrize("rtol, min_scd", [(1e-7, 3.0), (1e-10, 5.3)])
def test_rober_against_test_set_reference(rober_problem, rtol, min_scd):
    sol = ds.simulate(rober_problem, t_eval=[ROBER_REFERENCE["t"]], rtol=rtol, atol=1e-4 * rtol, method=ds.BDF())
    digits = scd(sol.ys[-1], ROBER_REFERENCE["y"])
    assert digits >= min_scd
    y_scipy, nlu_scipy = _rober_scipy(rtol)
    assert digits >= scd(y_scipy, ROBER_REFERENCE["y"]) - 0.5  # as accurate as scipy's BDF
    assert int(sol.stats["n_factor"]) < nlu_scipy  # with fewer factorizations


@pytest.mark.parametrize("rtol, min_scd", [(1e-7, 4.5), (1e-10, 7.5)])
def test_orego_against_test_set_reference(rtol, min_scd):
    sol = ds.simulate(orego().build(), t_eval=[OREGO_REFERENCE["t"]], rtol=rtol, atol=rtol, method=ds.BDF())
    assert scd(sol.ys[-1], OREGO_REFERENCE["y"]) >= min_scd  # measured 5.17, 8.14


def test_e5_against_test_set_reference():
    import test_e5

    for rtol, min_mescd in ((1e-7, 6.5), (1e-10, 9.5)):  # measured 7.1, 10.3 (RADAU: 8.42, 11.79)
        sol = ds.simulate(test_e5.E5.build(), t_eval=[1e13], rtol=rtol, atol=1.1e-24, method=ds.BDF())
        y = np.asarray(sol.ys[-1])
        mescd = -np.log10(np.max(np.abs(y - test_e5.Y_REF) / (1.1e-24 / rtol + np.abs(test_e5.Y_REF))))
        assert mescd >= min_mescd, (rtol, mescd)


# ---- the Brusselator against scipy ------------------------------------------------------------------------


def _scipy_brusselator(problem, y0, rtol, atol):
    p = problem.parameter_vector()
    rhs = jax.jit(problem.rhs)
    jac_values = jax.jit(problem.jacobian_values)
    pattern = problem.pattern

    def f(t, y):
        return np.asarray(rhs(t, y, p))

    def jac(t, y):
        values = np.asarray(jac_values(jnp.asarray(t, jnp.float64), jnp.asarray(y), p))
        return sp.csr_matrix((values, pattern.indices, pattern.indptr), shape=(pattern.n, pattern.n))

    y = np.asarray(y0, float)
    nlu = 0
    for a, b in ((0.0, 1.1), (1.1, 4.0)):  # restarted at the discontinuity
        sol = scipy.integrate.solve_ivp(f, (a, b), y, method="BDF", rtol=rtol, atol=atol, jac=jac)
        y, nlu = sol.y[:, -1], nlu + sol.nlu
    return y, nlu


@pytest.fixture(scope="module")
def brusselator8():
    spec = brusselator_2d(8)
    with klu_device():
        problem = spec.build(linear_solver=ds.linear.KLU())
        reference, _ = _scipy_brusselator(problem, spec.y0, 1e-12, 1e-14)
    return spec, problem, reference


@pytest.mark.parametrize("rtol", [1e-6, 1e-9])
def test_brusselator_against_scipy_at_tight_tolerance(brusselator8, rtol):
    spec, problem, reference = brusselator8
    sol = ds.simulate(problem, t_eval=[4.0], rtol=rtol, atol=1e-2 * rtol, method=ds.BDF(), discontinuities=(1.1,))
    ours = scd(sol.ys[-1], reference)
    y_scipy, nlu = _scipy_brusselator(problem, spec.y0, rtol, 1e-2 * rtol)
    assert ours >= scd(y_scipy, reference) - 0.5, (ours, scd(y_scipy, reference))
    assert ours >= -np.log10(rtol) - 2.0
    assert int(sol.stats["n_factor"]) < nlu


def test_brusselator_with_dense_lu_matches_klu(brusselator8):
    spec, klu, _ = brusselator8
    dense = spec.build(linear_solver=ds.linear.Dense())
    kw = dict(t_eval=[0.5, 2.0, 4.0], rtol=1e-8, atol=1e-10, method=ds.BDF(), discontinuities=(1.1,))
    a, b = ds.simulate(klu, **kw), ds.simulate(dense, **kw)
    # The same steps; the two factorizations round differently.
    assert abs(int(a.stats["n_steps"]) - int(b.stats["n_steps"])) <= 2
    np.testing.assert_allclose(np.asarray(a.ys), np.asarray(b.ys), rtol=1e-7)


# ---- factorization reuse, outputs, statistics -----------------------------------------------------------------


def test_factorizations_are_reused_and_newton_counters_reported(brusselator8):
    _, problem, _ = brusselator8
    kw = dict(t_eval=[4.0], rtol=1e-6, atol=1e-8, discontinuities=(1.1,))
    bdf = ds.simulate(problem, method=ds.BDF(), **kw)
    st = {k: int(v) for k, v in bdf.stats.items()}
    assert st["n_newton_iters"] == st["n_solves"] >= st["n_steps"] + st["n_rejected"]
    assert st["n_factor"] < st["n_steps"] / 5  # one factorization serves many steps
    assert st["n_jac"] <= st["n_factor"]
    # A factorization at every step (no reuse): many more, same answer within the tolerance.
    every = ds.simulate(problem, method=ds.BDF(max_lu_age=1, max_jac_age=1), **kw)
    assert int(every.stats["n_factor"]) >= int(every.stats["n_steps"])
    np.testing.assert_allclose(np.asarray(every.ys), np.asarray(bdf.ys), rtol=1e-3)
    # One-step methods report no Newton counters.
    assert "n_newton_iters" not in ds.simulate(problem, **kw).stats


def test_many_outputs_are_step_endpoints_on_a_known_solution():
    # y' = -(y - cos t) - sin t ... with y(0) = 1: y = cos t (plus a decaying mode when y0 differs).
    problem = ds.ProblemSpec(lambda t, y, p: -5.0 * (y - jnp.cos(t)) - jnp.sin(t), states=1).build()
    te = np.linspace(0.0, 10.0, 41)[1:]
    y0 = 3.0
    exact = np.cos(te) + (y0 - 1.0) * np.exp(-5.0 * te)
    sol = ds.simulate(problem, [y0], te, method=ds.BDF(), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(np.asarray(sol.ys[:, 0]), exact, rtol=0, atol=2e-7)
    # Outputs cost steps (each is an endpoint), but no more than two per output beyond the free run.
    free = ds.simulate(problem, [y0], [10.0], method=ds.BDF(), rtol=1e-8, atol=1e-10)
    assert int(sol.stats["n_steps"]) <= int(free.stats["n_steps"]) + 2 * len(te)


# ---- status codes -------------------------------------------------------------------------------------------------


def test_status_codes():
    blow_up = ds.ProblemSpec(lambda t, y, p: y * y, states=1).build()  # y = 1/(1 - t)
    sol = ds.simulate(blow_up, [1.0], [2.0], method=ds.BDF(), rtol=1e-4, throw=False)
    assert int(sol.status) == ds.Status.STEP_TOO_SMALL
    assert np.isnan(float(sol.ys[-1, 0]))  # the output it did not reach
    sol = ds.simulate(blow_up, [1.0], [0.5], method=ds.BDF(), max_steps=5, throw=False)
    assert int(sol.status) == ds.Status.MAX_STEPS
    with pytest.raises(ds.SolveError, match="MAX_STEPS"):
        ds.simulate(blow_up, [1.0], [0.5], method=ds.BDF(), max_steps=5)
    nan_rhs = ds.ProblemSpec(lambda t, y, p: jnp.where(t > 0.5, jnp.nan, -y), states=1).build()
    sol = ds.simulate(nan_rhs, [1.0], [1.0], method=ds.BDF(), throw=False)
    assert int(sol.status) in (ds.Status.STEP_TOO_SMALL, ds.Status.NONFINITE_STATE)
    assert float(sol.ys[-1, 0]) != float(sol.ys[-1, 0])


def test_validation():
    for bad in (dict(max_order=0), dict(max_order=6), dict(max_order=2.5), dict(ndf=1), dict(newton_tol=0.0),
                dict(max_newton_iters=0), dict(lu_change=-1.0), dict(max_lu_age=0), dict(max_jac_age=True)):  # fmt: skip
        field = next(iter(bad))
        with pytest.raises(ValueError, match=field):
            ds.BDF(**bad)
    assert ds.BDF() == ds.BDF() and hash(ds.BDF()) == hash(ds.BDF())
    assert ds.integrate.BDF is ds.BDF


# ---- batches and precision modes ------------------------------------------------------------------------


@pytest.mark.parametrize("solver", [ds.linear.KLU(), ds.linear.Dense()], ids=["klu", "dense"])
def test_vmap_matches_a_loop_lane_by_lane(solver):
    # Each lane keeps its own steps, order, history and factorization: the batched solve gives
    # every lane's own numbers, counters included.
    spec = brusselator_2d(6)
    problem = spec.build(linear_solver=solver)
    y0 = jnp.asarray(spec.y0)
    kw = dict(t_eval=[0.5, 2.0], method=ds.BDF(), rtol=1e-6, atol=1e-8, discontinuities=(1.1,))
    scales = jnp.array([0.8, 1.0, 1.3])
    batched = jax.jit(jax.vmap(lambda s: ds.simulate(problem, y0 * s, **kw)))(scales)
    steps = set()
    for i in range(3):
        one = ds.simulate(problem, y0 * scales[i], **kw)
        np.testing.assert_allclose(np.asarray(batched.ys[i]), np.asarray(one.ys), rtol=1e-12, atol=1e-14)
        assert {k: int(v[i]) for k, v in batched.stats.items()} == {k: int(v) for k, v in one.stats.items()}
        steps.add(int(one.stats["n_steps"]))
    assert len(steps) > 1  # the lanes did take different steps


PRECISION_KW = dict(t_eval=[2.0], method=ds.BDF(), rtol=1e-8, atol=1e-10, discontinuities=(1.1,))


@pytest.fixture(scope="module")
def brusselator6_float64():
    """The float64 solve the precision modes are compared with (solved once for the three)."""
    with klu_device():
        return ds.simulate(brusselator_2d(6).build(linear_solver=ds.linear.KLU()), **PRECISION_KW)


@pytest.mark.parametrize("mode", ["fp32_ir", "adaptive", "fp32"])
def test_precision_modes(mode, brusselator6_float64):
    spec = brusselator_2d(6)
    kw = PRECISION_KW
    plain = brusselator6_float64
    sol = ds.simulate(spec.build(linear_solver=ds.linear.KLU(), precision=ds.Precision(solve_mode=mode)), **kw)
    # The corrector iterates to its tolerance whatever the solves' precision.
    np.testing.assert_allclose(np.asarray(sol.ys), np.asarray(plain.ys), rtol=1e-8)
    if mode != "fp32":
        assert int(sol.stats["n_ir_steps"]) > 0


# ---- derivatives ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_state_problem():
    rhs = lambda t, y, p: jnp.stack([-p["k"] * y[0] + p["a"] * y[1], -p["a"] * y[1] + jnp.sin(t)])  # noqa: E731
    return ds.ProblemSpec(rhs, states=2, parameters={"k": 3.0, "a": 0.5}).build()


def test_sensitivities_of_the_discrete_solution_at_fixed_steps(two_state_problem):
    # Fixed steps: the discrete solution is a smooth function of p (no step-size decisions), and
    # on a linear problem the corrector is solved exactly: forward mode and the adjoint both
    # give its derivative, as central differences of it do.
    problem = two_state_problem
    w = jnp.array([[1.0, -2.0], [0.5, 3.0]])

    def loss(y0p, adjoint):
        sol = ds.simulate(problem, y0p[:2], [0.5, 1.0], y0p[2:], method=ds.BDF(), controller=ds.ConstantStep(2.0**-7),
                          adjoint=adjoint, rtol=1e-10, atol=1e-12)  # fmt: skip
        return jnp.sum(w * sol.ys)

    x0 = jnp.concatenate([jnp.array([1.0, 1.0]), problem.parameter_vector()])  # (y0, p)
    forward = np.asarray(jax.jacfwd(loss)(x0, ds.ForwardMode()))
    reverse = np.asarray(jax.grad(loss)(x0, ds.CheckpointAdjoint(checkpoints=4)))
    value = jax.jit(lambda x: loss(x, ds.ForwardMode()))
    fd = np.array([(float(value(x0 + 1e-6 * e)) - float(value(x0 - 1e-6 * e))) / 2e-6 for e in np.eye(4)])
    np.testing.assert_allclose(forward, fd, rtol=1e-7)
    np.testing.assert_allclose(reverse, fd, rtol=1e-7)


def test_rober_sensitivities_forward_adjoint_and_rodas(rober_problem):
    # Adaptive steps: forward mode and the adjoint differentiate the same discrete solution; both
    # converge with the tolerance to Rodas5P's sensitivities at a tight one.
    p0 = rober_problem.parameter_vector()
    w = jnp.array([[1.0, 2.0, 3.0], [0.5, 1e4, 1.0], [2.0, 1e5, -1.0]])

    def loss(p, method, adjoint, rtol, checkpoints=128):
        adj = adjoint if adjoint is not None else ds.CheckpointAdjoint(checkpoints=checkpoints)
        sol = ds.simulate(rober_problem, t_eval=[1.0, 100.0, 1e4], params=p, rtol=rtol, atol=1e-6 * rtol, method=method,
                          adjoint=adj)  # fmt: skip
        return jnp.sum(w * sol.ys)

    forward = np.asarray(jax.jacfwd(loss)(p0, ds.BDF(), ds.ForwardMode(), 1e-8))
    reverse = np.asarray(jax.grad(loss)(p0, ds.BDF(), None, 1e-8))
    np.testing.assert_allclose(reverse, forward, rtol=1e-7)  # measured 4e-9
    few = np.asarray(jax.grad(loss)(p0, ds.BDF(), None, 1e-8, 4))  # replays of long segments
    np.testing.assert_allclose(few, reverse, rtol=1e-12)
    rodas = np.asarray(jax.jacfwd(loss)(p0, ds.Rodas5P(), ds.ForwardMode(), 1e-11))
    np.testing.assert_allclose(forward, rodas, rtol=1e-6)  # measured 4e-8
    loose = np.asarray(jax.jacfwd(loss)(p0, ds.BDF(), ds.ForwardMode(), 1e-6))
    assert 1e-8 < np.max(np.abs(loose - rodas) / np.abs(rodas)) < 1e-4  # converges with the tolerance


def test_brusselator_gradient_through_a_discontinuity_klu_vmap(brusselator8):
    # KLU, the restart at the discontinuity, outputs before and after it, and vmap of grad.
    spec, problem, _ = brusselator8
    p0 = problem.parameter_vector()
    w = jnp.linspace(-1.0, 1.0, problem.n_states)

    def loss(p, adjoint):
        sol = ds.simulate(problem, t_eval=[0.5, 2.0], params=p, rtol=1e-7, atol=1e-9, discontinuities=(1.1,),
                          method=ds.BDF(), adjoint=adjoint)  # fmt: skip
        return jnp.sum(w * sol.ys[-1]) + jnp.sum(sol.ys[0] ** 2)

    forward = np.asarray(jax.jacfwd(loss)(p0, ds.ForwardMode()))
    # One compiled gradient program for both points of the loop (p0 and 1.1 p0).
    grad = jax.jit(jax.grad(lambda p: loss(p, ds.CheckpointAdjoint(checkpoints=8))))
    reverse = np.asarray(grad(p0))
    np.testing.assert_allclose(reverse, forward, rtol=1e-5)  # measured 2e-6 (the smallest entry)
    batched = jax.vmap(lambda s: grad(p0 * s))(jnp.array([1.0, 1.1]))
    np.testing.assert_allclose(np.asarray(batched[0]), reverse, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(batched[1]), np.asarray(grad(p0 * 1.1)), rtol=1e-10)


# ---- with the rest of simulate: steady states, resets; the automatic choice ------------------------------------


def test_steady_state_and_resets():
    # y' = k (2 - y): steady at 2; a reset to 5 at t = 1 (then y = 2 + 3 exp(-k (t - 1))).
    problem = ds.ProblemSpec(lambda t, y, p: p["k"] * (2.0 - y), states=1, parameters={"k": 1.5}).build()
    sol = ds.simulate(problem, [0.0], [1.0, np.inf], method=ds.BDF(), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(float(sol.ys[0, 0]), 2.0 * (1.0 - np.exp(-1.5)), rtol=1e-6)
    np.testing.assert_allclose(float(sol.ys[1, 0]), 2.0, rtol=1e-6)
    reset = ds.Reset(1.0, lambda t, y, p: jnp.full_like(y, 5.0))
    sol = ds.simulate(problem, [0.0], [0.5, 1.0, 2.0], method=ds.BDF(), resets=reset, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(np.asarray(sol.ys[:, 0]), [2 * (1 - np.exp(-0.75)), 5.0, 2.0 + 3.0 * np.exp(-1.5)],
                               rtol=1e-6)  # fmt: skip

    def y_end(k):
        out = ds.simulate(problem, [0.0], [0.5, 2.0], {"k": k}, method=ds.BDF(), resets=reset, rtol=1e-9, atol=1e-12)
        return out.ys[-1, 0]

    # d/dk of 2 + 3 exp(-k (t - 1)) at t = 2: -3 exp(-k).
    np.testing.assert_allclose(float(jax.grad(y_end)(1.5)), -3.0 * np.exp(-1.5), rtol=1e-5)


def test_auto_method_chooses_by_size_and_solver():
    big = brusselator_2d(24)  # 1,152 states
    klu_big = big.build(linear_solver=ds.linear.KLU())
    auto = ds.AutoMethod()
    assert auto.choose(klu_big) == ds.BDF()
    assert auto.choose(big.build(linear_solver=ds.linear.Dense())) == ds.Rodas5P()
    assert auto.choose(brusselator_2d(8).build(linear_solver=ds.linear.KLU())) == ds.Rodas5P()
    assert ds.AutoMethod(min_states_for_bdf=10).choose(brusselator_2d(8).build(linear_solver=ds.linear.KLU())) == ds.BDF()
    small = ds.ProblemSpec(lambda t, y, p: -y, states=1).build()
    a = ds.simulate(small, [1.0], [1.0], method=auto)
    b = ds.simulate(small, [1.0], [1.0], method=ds.Rodas5P())
    assert np.array_equal(np.asarray(a.ys), np.asarray(b.ys))
    with pytest.raises(ValueError, match="min_states_for_bdf"):
        ds.AutoMethod(min_states_for_bdf=0)
    with pytest.raises(TypeError, match="bdf"):
        ds.AutoMethod(bdf="BDF")
