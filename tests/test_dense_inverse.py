"""``Dense(solve="inverse")``: solves as products with the explicit inverse, against the LU path.

The inverse path is what ``solve="auto"`` runs on a GPU; here it is forced on the CPU and checked
against ``solve="lu"`` (and numpy, scipy's reference values, forward mode): single solves in every
mode and transposed, the stiff problems of the suite (ROBER, OREGO, E5 of the Test Set, BDF's
Newton solves), a study's value and gradient, the adjoint against forward mode, a non-finite
matrix, jit against eager and vmap against a loop. ``"auto"`` on the CPU is the LU, bit for bit.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.integrate import solve_ivp

import diffsoup as ds
from diffsoup.examples import OREGO_REFERENCE, ROBER_REFERENCE, mass_action_network, orego, rober
from diffsoup.inference import Gaussian, Parameter, SolverOptions
from linear_helpers import prepared, solve
from test_e5 import E5, Y_REF

LU = ds.linear.Dense(solve="lu")
INVERSE = ds.linear.Dense(solve="inverse")
MODES = ("fp64", "fp32", "fp32_ir", "adaptive")


def _weighted_error(y, y_ref, rtol, atol):
    """The largest difference in units of the solver's tolerance ``atol + rtol |y_ref|``."""
    y, y_ref = np.asarray(y), np.asarray(y_ref)
    return float(np.max(np.abs(y - y_ref) / (atol + rtol * np.abs(y_ref))))


def _matrix(n=12, seed=1):
    return sp.csr_matrix(sp.random(n, n, density=0.3, random_state=seed) + 3.0 * sp.eye(n))


# ---- the option ------------------------------------------------------------------------------


def test_solve_option_is_checked_and_defaults_to_auto():
    assert ds.linear.Dense().solve == "auto"
    with pytest.raises(ValueError, match=r"Dense.solve='cholesky' must be 'auto'.*'lu'.*'inverse'"):
        ds.linear.Dense(solve="cholesky")


def test_auto_is_the_lu_on_the_cpu_bit_for_bit():
    # On the CPU even where a GPU is JAX's default device (the GPU machine runs this file too).
    with jax.default_device(jax.devices("cpu")[0]):
        _auto_is_the_lu_on_the_cpu_bit_for_bit()


def _auto_is_the_lu_on_the_cpu_bit_for_bit():
    te = np.geomspace(1e-4, 1e11, 9)
    ys = {}
    for name, solver in (("auto", ds.linear.Dense()), ("lu", LU)):
        sol = ds.simulate(rober().build(linear_solver=solver), t_eval=te, rtol=1e-8, atol=1e-12)
        ys[name] = np.asarray(sol.ys)
    np.testing.assert_array_equal(ys["auto"], ys["lu"])
    # The platform is decided when the program is lowered: the CPU program holds no conditional.
    prep, values, _ = prepared(ds.linear.Dense(), _matrix())

    def run(v, b):
        fac = prep.factor(prep.begin(v), v, ("fp64",))
        return prep.solve(fac, b, "fp64")[0]

    hlo = jax.jit(run).lower(values, jnp.ones(12)).compile().as_text()
    assert "conditional" not in hlo


# ---- single solves -----------------------------------------------------------------------------


@pytest.mark.parametrize("reorder", ["amd", "natural"])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_inverse_solves_match_numpy(mode, transpose, reorder):
    prep, values, dense = prepared(ds.linear.Dense(solve="inverse", reorder=reorder), _matrix())
    b = np.random.default_rng(0).standard_normal(12)
    x, info, _ = solve(prep, values, jnp.asarray(b), mode, transpose)
    ref = np.linalg.solve(dense.T if transpose else dense, b)
    tol = 1e-6 if mode == "fp32" else 1e-13
    assert bool(info.ok)
    np.testing.assert_allclose(np.asarray(x), ref, rtol=0, atol=tol * np.max(np.abs(ref)))


def test_inverse_folds_the_elimination_order_in():
    prep, values, dense = prepared(INVERSE, _matrix())
    assert prep.order is not None  # a real permutation, folded into the inverse
    fac = jax.jit(lambda v: prep.factor(prep.begin(v), v, ("fp64",)))(values)
    np.testing.assert_allclose(np.asarray(fac.factors.fp64.matrix), np.linalg.inv(dense), rtol=0, atol=1e-14)


def test_several_right_hand_sides_at_once():
    prep, values, dense = prepared(INVERSE, _matrix())
    B = np.random.default_rng(1).standard_normal((12, 3))
    for transpose in (False, True):

        def run(v, b):
            fac = prep.factor(prep.begin(v), v, ("fp64",))
            return prep.solve(fac, b, "fp64", transpose=transpose)[0]  # noqa: B023

        x = jax.jit(run)(values, jnp.asarray(B))
        np.testing.assert_allclose(np.asarray(x), np.linalg.solve(dense.T if transpose else dense, B), atol=1e-13)


@pytest.mark.parametrize("mode", MODES)
def test_a_non_finite_matrix_fails_the_solve(mode):
    prep, values, _ = prepared(INVERSE, _matrix())
    x, info, _ = solve(prep, values.at[3].set(jnp.nan), jnp.ones(12), mode)
    assert not bool(info.ok)
    assert not np.any(np.isfinite(np.asarray(x)))


def test_a_singular_matrix_fails_the_solve():
    singular = sp.csr_matrix(np.array([[1.0, 2.0, 0.0], [2.0, 4.0, 0.0], [0.0, 0.0, 1.0]]))
    prep, values, _ = prepared(INVERSE, singular)
    _, info, _ = solve(prep, values, jnp.ones(3), "fp64")
    assert not bool(info.ok)


def test_jit_and_eager_solves_agree():
    prep, values, _ = prepared(INVERSE, _matrix())
    b = jnp.asarray(np.random.default_rng(2).standard_normal(12))

    def run(v, b):
        fac = prep.factor(prep.begin(v), v, ("fp64",))
        return prep.solve(fac, b, "fp64", transpose=True)[0]

    with jax.disable_jit():
        eager = np.asarray(run(values, b))
    np.testing.assert_allclose(np.asarray(jax.jit(run)(values, b)), eager, rtol=1e-14, atol=1e-15)


# ---- integrations ------------------------------------------------------------------------------


@pytest.mark.parametrize("rtol", [1e-6, 1e-10])
@pytest.mark.parametrize(
    "spec, t_end, reference",
    [(rober(), 1e11, ROBER_REFERENCE["y"]), (orego(), 360.0, OREGO_REFERENCE["y"])],
    ids=["ROBER", "OREGO"],
)
def test_stiff_problems_match_the_lu_path(spec, t_end, reference, rtol):
    atol = 1e-4 * rtol  # as the Test Set's report runs these problems
    out = {}
    for name, solver in (("lu", LU), ("inverse", INVERSE)):
        sol = ds.simulate(spec.build(linear_solver=solver), t_eval=np.array([t_end]), rtol=rtol, atol=atol)
        out[name] = (np.asarray(sol.ys[-1]), int(sol.stats["n_steps"]))
    (y_lu, steps_lu), (y_inv, steps_inv) = out["lu"], out["inverse"]
    assert steps_inv == steps_lu
    # Measured: ROBER's y1 differs by 1e-7 relative (0.2 atol), OREGO by 5e-13 relative.
    assert _weighted_error(y_inv, y_lu, rtol, atol) < 0.5
    # Against the Test Set's reference, no further off than the LU path, give or take a tolerance.
    assert _weighted_error(y_inv, reference, rtol, atol) <= _weighted_error(y_lu, reference, rtol, atol) + 1.0


@pytest.mark.parametrize("rtol", [1e-7, 1e-10])
def test_e5_matches_the_lu_path_and_the_reference(rtol):
    atol = 1.1e-24  # as the Test Set's report runs E5
    ends = {}
    for name, solver in (("lu", LU), ("inverse", INVERSE)):
        problem = E5.build(linear_solver=solver)
        sol = ds.simulate(problem, t_eval=np.array([1e13]), rtol=rtol, atol=atol, max_steps=100_000)
        assert int(sol.status) == 0
        ends[name] = np.asarray(sol.ys[-1])
    # y2, y3 ~ 8.9e-23 (atol is 1.2 % of them): measured 0.7 % (rtol 1e-7) and 0.3 % apart.
    np.testing.assert_allclose(ends["inverse"][1:3], ends["lu"][1:3], rtol=0, atol=atol)
    np.testing.assert_allclose(ends["inverse"][1:3], Y_REF[1:3], rtol=0.05)


def test_bdf_newton_solves_match_the_lu_path():
    te = np.array([1.0, 1e3, 1e7])
    ys = [np.asarray(ds.simulate(rober().build(linear_solver=s), t_eval=te, rtol=1e-8, atol=1e-12, method=ds.BDF()).ys)
          for s in (LU, INVERSE)]  # fmt: skip
    # Against scipy's Radau at rtol 1e-13, both paths' global errors are BDF's own (measured 11.2
    # tolerance units for the LU, 10.4 for the inverse); the two differ by 0.75 units on JAX 0.12.0
    # and 2.5 on 0.12.1 (934 steps against 937: the Newton iterations round differently), so the
    # check is that the inverse is as accurate as the LU, not that it repeats the LU's rounding.
    def rhs(t, y):
        return [-0.04 * y[0] + 1e4 * y[1] * y[2], 0.04 * y[0] - 1e4 * y[1] * y[2] - 3e7 * y[1] ** 2, 3e7 * y[1] ** 2]

    ref = solve_ivp(rhs, (0.0, te[-1]), [1.0, 0.0, 0.0], method="Radau", t_eval=te, rtol=1e-13, atol=1e-20).y.T
    error_lu, error_inverse = (_weighted_error(y, ref, 1e-8, 1e-12) for y in ys)
    assert error_lu < 25.0 and error_inverse < 1.5 * error_lu, (error_lu, error_inverse)


def test_vmap_matches_a_loop_and_jit_matches_eager():
    problem = rober().build(linear_solver=INVERSE)
    te = jnp.array([1.0, 1e3, 1e7])
    y0s = jnp.array([[1.0, 0.0, 0.0], [0.9, 1e-5, 0.1], [0.5, 0.0, 0.5]])

    def run(y0):
        return ds.simulate(problem, y0, te, rtol=1e-8, atol=1e-12).ys

    batched = np.asarray(jax.jit(jax.vmap(run))(y0s))
    looped = np.stack([np.asarray(run(y0)) for y0 in y0s])
    # A batched product sums in its own order: measured 6e-12 relative, rtol is 1e-8.
    np.testing.assert_allclose(batched, looped, rtol=1e-10, atol=1e-20)
    np.testing.assert_allclose(np.asarray(jax.jit(run)(y0s[1])), looped[1], rtol=1e-10, atol=1e-20)


# ---- derivatives ---------------------------------------------------------------------------------


def _rober_loss(solver):
    problem = rober().build(linear_solver=solver)
    te = jnp.array([1.0, 10.0, 1e3, 1e5])
    weights = jnp.array([[1.0, 1e4, 1.0], [0.5, 2e4, 1.0], [1.0, 1e4, 2.0], [2.0, 1e4, 1.0]])

    def loss(theta, adjoint):
        sol = ds.simulate(problem, theta[3:], te, jnp.exp(theta[:3]), rtol=1e-10, atol=1e-14, adjoint=adjoint)
        return jnp.sum(weights * sol.ys)

    theta = jnp.concatenate([jnp.log(problem.parameter_vector()), jnp.array([1.0, 0.0, 0.0])])
    return loss, theta


def test_adjoint_transposed_solves_match_forward_mode_and_the_lu_path():
    loss, theta = _rober_loss(INVERSE)
    g_rev = np.asarray(jax.grad(loss)(theta, ds.CheckpointAdjoint(checkpoints=16)))
    g_fwd = np.asarray(jax.jacfwd(loss)(theta, ds.ForwardMode()))
    np.testing.assert_allclose(g_rev, g_fwd, rtol=1e-7, atol=1e-7 * np.max(np.abs(g_fwd)))
    loss_lu, _ = _rober_loss(LU)
    g_lu = np.asarray(jax.grad(loss_lu)(theta, ds.CheckpointAdjoint(checkpoints=16)))
    np.testing.assert_allclose(g_rev, g_lu, rtol=1e-6, atol=1e-6 * np.max(np.abs(g_lu)))


def _network_study(solver, n=6):
    net = mass_action_network(20, 25, seed=3)
    problem = net.to_spec(y0=np.ones(20)).build(linear_solver=solver)
    rng = np.random.default_rng(0)
    times = np.array([0.2, 1.0, 3.0, 6.0])
    exps = [ds.Experiment(f"x{i}", times, rng.uniform(0.5, 1.5, (4, 20)), noise=Gaussian(0.05),
                          y0=rng.uniform(0.2, 2.0, 20)) for i in range(n)]  # fmt: skip
    params = [Parameter(k, v, v / 100, v * 100) for k, v in net.parameters.items()]
    return ds.Study(problem, exps, params)


def test_study_value_and_gradient_match_the_lu_path():
    out = {}
    for name, solver in (("lu", LU), ("inverse", INVERSE)):
        lowered = ds.lower(_network_study(solver), solver=SolverOptions(rtol=1e-8, atol=1e-10))
        value, grad = lowered.value_and_grad(lowered.problem.nominal)
        out[name] = (float(value), np.asarray(grad))
    (v_lu, g_lu), (v_inv, g_inv) = out["lu"], out["inverse"]
    # Measured: the network's states agree to 1e-14 relative on either path.
    assert abs(v_inv - v_lu) <= 1e-10 * abs(v_lu)
    np.testing.assert_allclose(g_inv, g_lu, rtol=1e-8, atol=1e-8 * np.max(np.abs(g_lu)))


def test_auto_takes_the_lu_above_the_size_limit():
    from diffsoup.linear._dense import AUTO_INVERSE_MAX_STATES

    small = prepared(ds.linear.Dense(), _matrix(AUTO_INVERSE_MAX_STATES))[0]
    large = prepared(ds.linear.Dense(), _matrix(AUTO_INVERSE_MAX_STATES + 1))[0]
    forced = prepared(INVERSE, _matrix(AUTO_INVERSE_MAX_STATES + 1))[0]
    assert (small.path, large.path, forced.path) == ("auto", "lu", "inverse")
