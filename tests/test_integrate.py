"""ds.simulate: accuracy against published references and scipy, convergence order, outputs,
discontinuities, transformations, status codes and input validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.linalg

import diffsoup as ds
from diffsoup.examples import (
    BRUSSELATOR_U00_REFERENCE,
    OREGO_REFERENCE,
    ROBER_REFERENCE,
    brusselator_2d,
    mass_action_network,
    orego,
    rober,
    scd,
)
from conftest import klu_device


# ---- Test Set for IVP Solvers ------------------------------------------------------------------


# At rtol 1e-10 the digits are those of y2 ~ 8e-14, held by atol = 1e-14; its last digits move with
# XLA's rounding (scd 7.17 with jax 0.12.0, 6.89 with 0.12.0.1, the same 2007 steps), hence 6.5.
@pytest.mark.parametrize("rtol, min_scd", [(1e-6, 4.0), (1e-10, 6.5)])
def test_rober_against_test_set_reference(rober_problem, rtol, min_scd):
    sol = ds.simulate(rober_problem, t_eval=[ROBER_REFERENCE["t"]], rtol=rtol, atol=1e-4 * rtol)
    assert sol.ok
    assert scd(sol.ys[-1], ROBER_REFERENCE["y"]) >= min_scd


@pytest.mark.parametrize("rtol, min_scd", [(1e-6, 4.0), (1e-10, 7.0)])
def test_orego_against_test_set_reference(rtol, min_scd):
    sol = ds.simulate(orego().build(), t_eval=[OREGO_REFERENCE["t"]], rtol=rtol, atol=rtol)
    assert sol.ok
    assert scd(sol.ys[-1], OREGO_REFERENCE["y"]) >= min_scd


def test_rober_written_as_a_reaction_network_matches():
    net = ds.ReactionNetwork(
        ["y1", "y2", "y3"],
        [("y1 -> y2", "k1"), ("2 y2 -> y2 + y3", "k2"), ("y2 + y3 -> y1 + y3", "k3")],
        {"k1": 0.04, "k2": 3e7, "k3": 1e4},
    )
    te = [1.0, 100.0, 1e4]
    a = ds.simulate(net.to_spec(y0=[1, 0, 0]).build(), t_eval=te, rtol=1e-9, atol=1e-14)
    b = ds.simulate(rober().build(), t_eval=te, rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(np.asarray(a.ys), np.asarray(b.ys), rtol=1e-12, atol=1e-20)


# ---- convergence order ---------------------------------------------------------------------------


def _measured_orders(problem, y0, t_end, exact, hs, params=None):
    errors = []
    for h in hs:
        sol = ds.simulate(problem, y0, [t_end], params, controller=ds.ConstantStep(h))
        assert int(sol.stats["n_steps"]) == int(round(t_end / h))
        errors.append(np.max(np.abs(np.asarray(sol.ys[-1]) - exact)))
    errors = np.asarray(errors)
    return np.log2(errors[:-1] / errors[1:]), errors


def test_order_five_on_a_forced_linear_system():
    # y' = A y + v sin(t); exact solution from expm of the augmented autonomous system
    # [y, s, c]' = [[A, v, 0], [0, 0, 1], [0, -1, 0]] [y, s, c] with s = sin t, c = cos t.
    # The forcing makes the stages' time terms (h f_t) count, as in nonlinear problems.
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    A = q @ np.diag([-1.0, -3.0, -10.0, -0.5]) @ q.T
    v = rng.standard_normal(4)
    spec = ds.ProblemSpec(lambda t, y, p: jnp.asarray(A, y.dtype) @ y + jnp.asarray(v, y.dtype) * jnp.sin(t), states=4)
    M = np.zeros((6, 6))
    M[:4, :4], M[:4, 4], M[4, 5], M[5, 4] = A, v, 1.0, -1.0
    y0 = rng.standard_normal(4)
    exact = (scipy.linalg.expm(M * 2.0) @ np.concatenate([y0, [0.0, 1.0]]))[:4]
    orders, errors = _measured_orders(spec.build(), y0, 2.0, exact, [0.4, 0.2, 0.1, 0.05])
    assert errors[-1] > 1e-13  # still above round-off
    assert np.all(np.abs(orders - 5.0) < 0.5), orders


# ---- the 2-D Brusselator ------------------------------------------------------------------------


def _scipy_brusselator(problem, t_eval, rtol):
    p = problem.parameter_vector()
    f = jax.jit(lambda t, y: problem.rhs(t, y, p))
    jac_pattern = problem.pattern.to_scipy()
    jac = lambda t, y: problem.jacobian(t, y)  # noqa: E731  (the exact sparse Jacobian)
    out = []
    y = np.asarray(problem.spec.y0)
    t0 = 0.0
    for t_stop in (1.1, t_eval[-1]):  # the forcing switches on at t = 1.1: two pieces
        te = [t for t in t_eval if t0 < t <= t_stop]
        r = scipy.integrate.solve_ivp(
            lambda t, y: np.asarray(f(t, y)), (t0, t_stop), y, method="BDF", t_eval=sorted(set(te) | {t_stop}),
            rtol=rtol, atol=1e-12, jac=jac, jac_sparsity=jac_pattern,
        )  # fmt: skip
        assert r.success
        out.extend(r.y.T[[list(r.t).index(t) for t in te]])
        y, t0 = r.y[:, -1], t_stop
    return np.asarray(out)


@pytest.mark.slow
def test_brusselator_n32_against_scipy_bdf_and_reference_value():
    problem = brusselator_2d(32).build(linear_solver=ds.linear.KLU())
    t_eval = [1.0, 5.0, 11.5]
    sol = ds.simulate(problem, t_eval=t_eval, rtol=1e-10, atol=1e-12, discontinuities=(1.1,))
    assert sol.ok
    u00 = float(sol.ys[-1, 0])
    assert abs(u00 - BRUSSELATOR_U00_REFERENCE) < 5e-7  # 3.2723158 to 7 digits
    ref = _scipy_brusselator(problem, t_eval, 1e-10)
    rel = np.abs(np.asarray(sol.ys) - ref) / np.maximum(np.abs(ref), 1e-3)
    assert rel.max() < 1e-6


def test_dense_and_klu_agree_on_brusselator_n16():
    spec = brusselator_2d(16)
    kw = dict(t_eval=[2.0, 4.0], rtol=1e-8, atol=1e-10, discontinuities=(1.1,))
    dense = ds.simulate(spec.build(linear_solver=ds.linear.Dense()), **kw)
    klu = ds.simulate(spec.build(linear_solver=ds.linear.KLU()), **kw)
    np.testing.assert_allclose(np.asarray(klu.ys), np.asarray(dense.ys), rtol=1e-9)
    assert int(klu.stats["n_factor"]) == int(klu.stats["n_steps"]) + int(klu.stats["n_rejected"])


# ---- precision modes, through their counters and dtypes -------------------------------------------


@pytest.fixture(scope="module")
def brusselator16_fp64():
    spec = brusselator_2d(16)
    kw = dict(t_eval=[2.0, 6.0], rtol=1e-8, atol=1e-10, discontinuities=(1.1,))
    with klu_device():
        return spec, kw, ds.simulate(spec.build(linear_solver=ds.linear.KLU()), **kw)


@pytest.mark.parametrize("mode", ["fp32_ir", "adaptive"])
def test_refined_modes_agree_with_fp64_on_brusselator(brusselator16_fp64, mode):
    spec, kw, ref = brusselator16_fp64
    problem = spec.build(linear_solver=ds.linear.KLU(), precision=ds.Precision(solve_mode=mode))
    sol = ds.simulate(problem, **kw)
    np.testing.assert_allclose(np.asarray(sol.ys), np.asarray(ref.ys), rtol=1e-6)
    assert int(sol.stats["n_ir_steps"]) >= int(sol.stats["n_solves"])  # every solve refined at least once
    assert int(sol.stats["n_fallbacks"]) == 0  # well conditioned: no float64 needed
    assert int(ref.stats["n_ir_steps"]) == 0


def _stiff_nonnormal_problem():
    """A linear ODE whose W = I/(h gamma) - A is badly conditioned (cond ~1e11 at the first step)."""
    n = 8
    S = np.eye(n) + np.diag(np.full(n - 1, 3e3), 1)  # cond(S) ~ (3e3)^7
    A = S @ np.diag(-np.logspace(0, 2, n)) @ np.linalg.inv(S)
    return ds.ProblemSpec(lambda t, y, p: jnp.asarray(A, y.dtype) @ y, states=n), np.linspace(1, 2, n)


def test_adaptive_falls_back_on_an_ill_conditioned_system():
    spec, y0 = _stiff_nonnormal_problem()
    kw = dict(t_eval=[0.5], rtol=1e-8, atol=1e-8)
    ref = ds.simulate(spec.build(linear_solver=ds.linear.Dense()), y0, **kw)
    adaptive = ds.simulate(
        spec.build(linear_solver=ds.linear.Dense(), precision=ds.Precision(solve_mode="adaptive")), y0, **kw
    )
    assert int(adaptive.stats["n_fallbacks"]) > 0
    np.testing.assert_allclose(np.asarray(adaptive.ys), np.asarray(ref.ys), rtol=1e-6)


def test_fp32_runs_in_float32_end_to_end():
    problem = rober().build(precision=ds.Precision.fp32(), linear_solver=ds.linear.Dense())
    y0 = jnp.asarray([1.0, 0.0, 0.0], jnp.float32)
    te = jnp.asarray([1.0, 10.0], jnp.float32)
    compiled = jax.jit(lambda y0: ds.simulate(problem, y0, te, rtol=1e-4, atol=1e-8).ys).lower(y0).compile()
    text = compiled.as_text()  # the optimized program that runs
    assert "f32" in text and "f64" not in text
    sol = ds.simulate(problem, y0, te, rtol=1e-4, atol=1e-8)
    assert sol.ys.dtype == jnp.float32 and sol.ok
    ref = ds.simulate(rober().build(), [1.0, 0.0, 0.0], [1.0, 10.0], rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(np.asarray(sol.ys), np.asarray(ref.ys), rtol=2e-3, atol=1e-7)


# ---- outputs, discontinuities ---------------------------------------------------------------------


def test_outputs_at_requested_times_including_t0_and_duplicates():
    spec = ds.ProblemSpec(lambda t, y, p: -p["k"] * y, states=1, parameters={"k": 0.7})
    te = np.array([0.0, 0.5, 0.5, 1.0, 3.0])
    sol = ds.simulate(spec.build(), [2.0], te, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(np.asarray(sol.ys[:, 0]), 2.0 * np.exp(-0.7 * te), rtol=1e-9)
    np.testing.assert_array_equal(np.asarray(sol.ts), te)


def test_discontinuity_is_integrated_in_pieces():
    # y' = -y + H(t - 1): y(3) = e^{-3} + 1 - e^{-2} exactly.
    spec = ds.ProblemSpec(lambda t, y, p: -y + jnp.where(t >= 1.0, 1.0, 0.0), states=1)
    exact = np.exp(-3.0) + 1.0 - np.exp(-2.0)
    with_piece = ds.simulate(spec.build(), [1.0], [3.0], rtol=1e-10, atol=1e-12, discontinuities=(1.0,))
    np.testing.assert_allclose(float(with_piece.ys[-1, 0]), exact, rtol=1e-9)
    blind = ds.simulate(spec.build(), [1.0], [3.0], rtol=1e-10, atol=1e-12)
    assert int(blind.stats["n_rejected"]) > int(with_piece.stats["n_rejected"])


# ---- transformations -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def network_problem():
    return mass_action_network(12, 16, seed=5).to_spec(y0=np.linspace(1.0, 2.0, 12)).build()


def test_jit_matches_no_jit(network_problem):
    te = jnp.array([0.1, 1.0, 5.0])
    p = network_problem.parameter_vector()
    plain = ds.simulate(network_problem, t_eval=te, params=p, rtol=1e-8)
    jitted = jax.jit(lambda p: ds.simulate(network_problem, t_eval=te, params=p, rtol=1e-8).ys)(p)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(plain.ys), rtol=1e-12)


def test_vmap_over_64_experiments_matches_a_loop_with_own_step_counts(network_problem):
    rng = np.random.default_rng(7)
    base = np.asarray(network_problem.parameter_vector())
    params = jnp.asarray(base * 10 ** rng.uniform(-1, 1, (64, base.size)))
    te = jnp.array([0.5, 2.0, 8.0])

    def run(p):
        sol = ds.simulate(network_problem, t_eval=te, params=p, rtol=1e-7, atol=1e-10, throw=False)
        return sol.ys, sol.stats["n_steps"], sol.status

    ys, steps, status = jax.vmap(run)(params)
    assert np.all(np.asarray(status) == 0)
    assert len(set(np.asarray(steps).tolist())) > 5  # each experiment keeps its own step sizes
    for i in range(0, 64, 9):
        y_i, s_i, _ = run(params[i])
        np.testing.assert_allclose(np.asarray(ys[i]), np.asarray(y_i), rtol=1e-10, atol=1e-14)
        assert int(steps[i]) == int(s_i)


def test_vmap_with_klu_matches_a_loop():
    problem = brusselator_2d(8).build(linear_solver=ds.linear.KLU())
    scales = jnp.array([0.8, 1.0, 1.3])
    y0 = jnp.asarray(problem.spec.y0)
    run = lambda s: ds.simulate(problem, y0 * s, [3.0], rtol=1e-7, atol=1e-9, discontinuities=(1.1,)).ys  # noqa: E731
    batched = jax.vmap(run)(scales)
    for i in range(3):
        np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(run(scales[i])), rtol=1e-10)


# ---- status codes -----------------------------------------------------------------------------------


def test_blow_up_is_a_status_and_a_clear_error():
    spec = ds.ProblemSpec(lambda t, y, p: y * y, states=1)  # y = 1/(1 - t): singular at t = 1
    problem = spec.build()
    sol = ds.simulate(problem, [1.0], [2.0], throw=False)
    assert int(sol.status) in (ds.Status.STEP_TOO_SMALL, ds.Status.NONFINITE_STATE)
    assert not sol.ok
    with pytest.raises(ds.SolveError, match="did not succeed"):
        ds.simulate(problem, [1.0], [2.0])
    with pytest.raises(ds.SolveError):
        sol.raise_if_failed()
    # Under jit the status comes back as a value.
    status = jax.jit(lambda y0: ds.simulate(problem, y0, [2.0]).status)(jnp.array([1.0]))
    assert int(status) != 0


def test_max_steps_status(rober_problem):
    sol = ds.simulate(rober_problem, t_eval=[1e11], max_steps=20, throw=False)
    assert int(sol.status) == ds.Status.MAX_STEPS
    with pytest.raises(ds.SolveError, match="MAX_STEPS"):
        ds.simulate(rober_problem, t_eval=[1e11], max_steps=20)


# ---- bad input -----------------------------------------------------------------------------------------


def test_bad_inputs_raise_value_errors_naming_the_problem(rober_problem):
    with pytest.raises(ValueError, match=r"y0 has shape \(2,\); expected \(3,\)"):
        ds.simulate(rober_problem, [1.0, 0.0], [1.0])
    with pytest.raises(ValueError, match=r"unknown parameter name\(s\) \['k9'\]"):
        ds.simulate(rober_problem, t_eval=[1.0], params={"k9": 1.0})
    with pytest.raises(ValueError, match="rtol=0.0 must be positive"):
        ds.simulate(rober_problem, t_eval=[1.0], rtol=0.0)
    with pytest.raises(ValueError, match="atol=-1e-08 must be positive"):
        ds.simulate(rober_problem, t_eval=[1.0], atol=-1e-8)
    with pytest.raises(ValueError, match=r"y0 is not finite for state\(s\) \['y2'\]"):
        ds.simulate(rober_problem, [1.0, np.nan, 0.0], [1.0])
    with pytest.raises(ValueError, match="non-decreasing"):
        ds.simulate(rober_problem, t_eval=[2.0, 1.0])
    with pytest.raises(ValueError, match="not before t0"):
        ds.simulate(rober_problem, t_eval=[1.0], t0=2.0)
    with pytest.raises(ValueError, match="ConstantStep.h"):
        ds.ConstantStep(0.0)


def test_rhs_of_the_wrong_shape_or_dtype_is_refused_at_build():
    with pytest.raises(ValueError, match=r"rhs returned shape \(2,\)"):
        ds.ProblemSpec(lambda t, y, p: y[:2], states=3, name="short").build()
    with pytest.raises(ValueError, match="rhs returned float32 under compute_dtype=float64"):
        ds.ProblemSpec(lambda t, y, p: y.astype(jnp.float32), states=3).build()
    with pytest.raises(ValueError, match="rhs\\(t, y, p\\) failed"):
        ds.ProblemSpec(lambda t, y, p: y * p["missing"], states=3).build()
    with pytest.raises(ValueError, match="duplicate state names"):
        ds.ProblemSpec(lambda t, y, p: y, states=["a", "a"])
    with pytest.raises(TypeError, match="rhs must be a function"):
        ds.ProblemSpec("dy/dt", states=1)


def test_reaction_network_validation():
    with pytest.raises(ValueError, match="unknown species 'D'"):
        ds.ReactionNetwork(["A", "B"], [("A + D -> B", "k")], {"k": 1.0})
    with pytest.raises(ValueError, match="unknown rate parameter 'kx'"):
        ds.ReactionNetwork(["A", "B"], [("A -> B", "kx")], {"k": 1.0})
    with pytest.raises(ValueError, match="no arrow"):
        ds.ReactionNetwork(["A", "B"], [("A = B", "k")], {"k": 1.0})
    net = ds.ReactionNetwork(["A", "B"], [("A <-> B", ("kf", "kb")), ("-> A", "s"), ("B -> 0", "d")],
                             {"kf": 2.0, "kb": 1.0, "s": 0.5, "d": 0.25})  # fmt: skip
    np.testing.assert_array_equal(net.stoichiometry, [[-1, 1, 1, 0], [1, -1, 0, -1]])


def test_network_fluxes_against_the_rate_laws_written_out():
    """Mass-action fluxes (orders 1, 2, 3 and 0.5, a source, reversible pairs) and a user rate
    law, in reaction order, against each law written out by hand; the fluxes' Jacobian against
    its closed form; a negative concentration under a fractional order stays out of the other
    reactions' fluxes."""
    hill = lambda t, c, p: p["v"] * c["A"] / (p["km"] + c["A"])  # noqa: E731
    net = ds.ReactionNetwork(
        ["A", "B", "C"],
        [("A + B -> C", "k1"), ("-> A", "s"), ("2 B <-> C", ("kf", "kb")), ("A -> B", hill),
         ("3 A -> 0", "k3"), ("0.5 C -> A", "kh")],
        {"k1": 2.0, "s": 0.3, "kf": 1.5, "kb": 0.7, "k3": 0.2, "kh": 0.9, "v": 4.0, "km": 0.5},
    )  # fmt: skip
    p = {k: jnp.asarray(v) for k, v in net.parameters.items()}
    a, b, c = 1.3, 0.6, 2.2
    expected = [2.0 * a * b, 0.3, 1.5 * b * b, 0.7 * c, 4.0 * a / (0.5 + a), 0.2 * a**3, 0.9 * np.sqrt(c)]
    y = jnp.array([a, b, c])
    np.testing.assert_allclose(np.asarray(net.fluxes(0.0, y, p)), expected, rtol=1e-15)
    jac = np.asarray(jax.jacfwd(lambda y: net.fluxes(0.0, y, p))(y))
    np.testing.assert_allclose(jac, [[2.0 * b, 2.0 * a, 0], [0, 0, 0], [0, 3.0 * b, 0], [0, 0, 0.7],
                                     [4.0 * 0.5 / (0.5 + a) ** 2, 0, 0], [0.6 * a**2, 0, 0],
                                     [0, 0, 0.45 / np.sqrt(c)]], rtol=1e-14, atol=1e-300)  # fmt: skip
    flux = np.asarray(net.fluxes(0.0, jnp.array([a, b, -1.0]), p))
    assert np.isnan(flux[6]) and np.all(np.isfinite(flux[:6]))


def test_outputs_a_failed_solve_never_reached_are_nan(rober_problem):
    # Issue 18 item 5: 0.0 after a failure read as a plausible value.
    sol = ds.simulate(rober_problem, t_eval=[1e-3, 1e3, 1e11], rtol=1e-8, atol=1e-12, max_steps=40, throw=False)
    assert int(sol.status) == ds.Status.MAX_STEPS
    ys = np.asarray(sol.ys)
    assert np.all(np.isfinite(ys[0])) and np.all(np.isnan(ys[-1])), ys


def test_float32_tolerance_below_its_resolution_is_raised_with_a_warning():
    # Issue 18 item 6: float32 at rtol 1e-10 reported SUCCESS silently.
    from diffsoup.examples import rober
    from diffsoup.integrate import ToleranceWarning

    problem = rober().build(precision=ds.Precision.fp32(), linear_solver=ds.linear.Dense())
    with pytest.warns(ToleranceWarning, match=r"rtol=1e-10 is below what float32"):
        clamped = ds.simulate(problem, t_eval=[1.0, 10.0], rtol=1e-10, atol=1e-6)
    floor = ds.simulate(problem, t_eval=[1.0, 10.0], rtol=100 * float(np.finfo(np.float32).eps), atol=1e-6)
    np.testing.assert_array_equal(np.asarray(clamped.ys), np.asarray(floor.ys))
