"""The linear-solver suite every backend passes: solves, transposes, batches, precision modes,
failures as values. CuDSS joins the list where it can run (GPU machine)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

import diffsoup as ds
from linear_helpers import prepared, solve

SOLVERS = [ds.linear.Dense(), ds.linear.KLU()]
if hasattr(ds.linear, "has_cudss") and ds.linear.has_cudss():
    SOLVERS.append(ds.linear.CuDSS())
IDS = [s.name for s in SOLVERS]


def _tridiagonal(n, shift):
    """The 1-D Laplacian stencil (2, -1) minus ``shift`` on the diagonal, plus a few far entries."""
    main = np.full(n, 2.0 - shift)
    m = sp.diags([main, -np.ones(n - 1), -np.ones(n - 1)], [0, -1, 1], format="lil")
    m[0, n - 1] = 0.01  # some asymmetry, so transpose solves differ from solves
    m[n - 1, 3] = -0.02
    return sp.csr_matrix(m)


_prepared = prepared
_solve = solve


WELL = _tridiagonal(64, -1.0)  # diagonally dominant: cond ~ 5
# Smallest eigenvalue of the shifted Laplacian ~1e-9: cond ~ 4e9 > 1/eps32, refinement of float32
# factors cannot converge (the float32-rounded matrix is not even close).
LAMBDA_MIN = 2.0 - 2.0 * np.cos(np.pi / 65)
ILL = sp.csr_matrix(sp.diags([np.full(64, 2.0 - LAMBDA_MIN + 1e-9), -np.ones(63), -np.ones(63)], [0, -1, 1]))


@pytest.mark.parametrize("solver", SOLVERS, ids=IDS)
@pytest.mark.parametrize("transpose", [False, True])
def test_fp64_solve_and_transpose(solver, transpose):
    prep, values, dense = _prepared(solver, WELL)
    b = jnp.asarray(np.random.default_rng(0).standard_normal(64))
    x, info, _ = _solve(prep, values, b, "fp64", transpose)
    ref = np.linalg.solve(dense.T if transpose else dense, np.asarray(b))
    np.testing.assert_allclose(np.asarray(x), ref, rtol=1e-12, atol=1e-12)
    assert bool(info.ok) and int(info.ir_steps) == 0 and int(info.fallbacks) == 0


@pytest.mark.parametrize("solver", SOLVERS, ids=IDS)
def test_multiple_right_hand_sides(solver):
    prep, values, dense = _prepared(solver, WELL)
    b = jnp.asarray(np.random.default_rng(1).standard_normal((64, 5)))
    x, info, _ = _solve(prep, values, b, "fp64")
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(dense, np.asarray(b)), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("solver", SOLVERS, ids=IDS)
def test_vmap_over_matrices_and_over_rhs_match_a_loop(solver):
    prep, values, dense = _prepared(solver, WELL)
    rng = np.random.default_rng(2)
    scales = jnp.asarray(rng.uniform(0.5, 2.0, 6))
    bs = jnp.asarray(rng.standard_normal((6, 64)))
    batched_values = values[None, :] * scales[:, None]

    def one(v, b):
        return _solve(prep, v, b, "fp64")[0]

    both = jax.vmap(one)(batched_values, bs)
    rhs_only = jax.vmap(one, in_axes=(None, 0))(values, bs)
    for i in range(6):
        # a batched factorization may differ from a single one in the last bits (cuDSS's uniform batch)
        np.testing.assert_allclose(np.asarray(both[i]), np.asarray(one(batched_values[i], bs[i])), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(np.asarray(rhs_only[i]), np.linalg.solve(dense, np.asarray(bs[i])), rtol=1e-12)


@pytest.mark.parametrize("solver", SOLVERS, ids=IDS)
def test_fp32_factors_are_float32_accurate(solver):
    prep, values, dense = _prepared(solver, WELL)
    b = jnp.asarray(np.random.default_rng(3).standard_normal(64))
    x, info, _ = _solve(prep, values, b, "fp32")
    ref = np.linalg.solve(dense, np.asarray(b))
    err = np.max(np.abs(np.asarray(x) - ref)) / np.max(np.abs(ref))
    assert 1e-10 < err < 1e-5  # float32 accuracy: neither float64 nor garbage
    assert x.dtype == jnp.float64  # the solution comes back in the compute dtype
    if isinstance(solver, ds.linear.Dense):
        ws = prep.begin(values, ("fp32",))
        fac = prep.factor(ws, values, ("fp32",))
        assert fac.factors.low.matrix.dtype == jnp.float32  # a real float32 LU


@pytest.mark.parametrize("solver", SOLVERS, ids=IDS)
@pytest.mark.parametrize("mode", ["fp32_ir", "adaptive"])
def test_refinement_reaches_float64_on_a_well_conditioned_matrix(solver, mode):
    prep, values, dense = _prepared(solver, WELL)
    b = jnp.asarray(np.random.default_rng(4).standard_normal(64))
    x, info, _ = _solve(prep, values, b, mode)
    ref = np.linalg.solve(dense, np.asarray(b))
    np.testing.assert_allclose(np.asarray(x), ref, rtol=1e-12, atol=1e-13)
    assert bool(info.ok)
    assert 1 <= int(info.ir_steps) <= solver.ir_max_steps
    assert int(info.fallbacks) == 0


@pytest.mark.parametrize("solver", SOLVERS, ids=IDS)
def test_adaptive_falls_back_to_float64_on_an_ill_conditioned_matrix(solver):
    prep, values, dense = _prepared(solver, ILL)
    b = jnp.asarray(np.random.default_rng(5).standard_normal(64))
    ref = np.linalg.solve(dense, np.asarray(b))
    x, info, _ = _solve(prep, values, b, "adaptive")
    assert int(info.fallbacks) == 1 and bool(info.ok)
    np.testing.assert_allclose(np.asarray(x), ref, rtol=1e-5)  # cond ~4e9: float64 gives ~6 digits
    x_ir, info_ir, _ = _solve(prep, values, b, "fp32_ir")
    assert not bool(info_ir.ok)  # refinement stalled: reported, not hidden


@pytest.mark.parametrize("solver", SOLVERS, ids=IDS)
def test_adaptive_uses_float64_factors_for_later_solves_of_the_step(solver):
    prep, values, _ = _prepared(solver, ILL)
    b = jnp.ones(64)

    @jax.jit
    def two_solves(values):
        ws = prep.begin(values, ("adaptive",))
        fac = prep.factor(ws, values, ("adaptive",))
        x1, fac, i1 = prep.solve(fac, b, "adaptive")
        x2, fac, i2 = prep.solve(fac, b, "adaptive")
        return x1, x2, i1, i2, prep.end(ws, (x1, x2))

    x1, x2, i1, i2, _ = two_solves(values)
    assert int(i1.fallbacks) == 1 and int(i2.fallbacks) == 0 and int(i2.ir_steps) == 0
    np.testing.assert_allclose(np.asarray(x1), np.asarray(x2), rtol=1e-12)


@pytest.mark.parametrize("solver", SOLVERS, ids=IDS)
def test_non_finite_matrix_is_a_failed_solve_not_a_crash(solver):
    prep, values, _ = _prepared(solver, WELL)
    bad = values.at[5].set(jnp.nan)
    x, info, _ = _solve(prep, bad, jnp.ones(64), "fp64")
    assert not bool(info.ok)


def test_dense_singular_matrix_is_a_failed_solve():
    prep, values, _ = _prepared(ds.linear.Dense(), WELL)
    x, info, _ = _solve(prep, jnp.zeros_like(values), jnp.ones(64), "fp64")
    assert not bool(info.ok)


def test_klu_handles_are_released():
    import resource

    prep, values, _ = _prepared(ds.linear.KLU(), _tridiagonal(2000, -1.0))

    @jax.jit
    def many(values):
        def body(i, acc):
            ws = prep.begin(values, ("fp64",))
            fac = prep.factor(ws, values * (1.0 + i * 1e-12), ("fp64",))
            x, _, _ = prep.solve(fac, jnp.ones(2000), "fp64")
            return acc + x[0] + 0.0 * prep.end(ws, x)

        return jax.lax.fori_loop(0, 500, body, 0.0)

    many(values).block_until_ready()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(4):
        many(values).block_until_ready()
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    # 2000 factorizations of a 2000x2000 tridiagonal matrix: leaking them would take > 100 MB.
    assert grown_mb < 20, f"resident memory grew by {grown_mb:.1f} MB"


def test_solver_configuration_validation():
    with pytest.raises(ValueError, match="ir_tol"):
        ds.linear.KLU(ir_tol=0.0)
    with pytest.raises(ValueError, match="ir_max_steps"):
        ds.linear.Dense(ir_max_steps=0)


@pytest.mark.gpu
def test_klu_on_a_gpu_default_device_says_how_to_proceed():
    if jax.default_backend() == "cpu":
        pytest.skip("needs a GPU as JAX's default device")
    with pytest.raises(ValueError, match=r"KLU runs on the CPU only.*CuDSS"):
        _prepared(ds.linear.KLU(), WELL)
    with jax.default_device(jax.devices("cpu")[0]):  # the remedy the message gives
        prep, values, dense = _prepared(ds.linear.KLU(), WELL)
        x, info, _ = _solve(prep, values, jnp.ones(64), "fp64")
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(dense, np.ones(64)), rtol=1e-12)


def test_solver_interfaces_are_abstract_and_the_state_typed():
    assert ds.linear.LinearSolver is ds.linear.AbstractLinearSolver
    with pytest.raises(TypeError, match="abstract"):
        ds.linear.LinearSolver()

    class NoHooks(ds.linear.AbstractPreparedSolver):
        def _raw_begin(self, values, slot):
            return None

    with pytest.raises(TypeError, match="_raw_factor"):
        NoHooks(ds.linear.Dense(), None, None)
    # One begin / factor / solve in "adaptive" mode: typed workspace and factorization (KLU runs on
    # the CPU device, also on a GPU machine).
    with jax.default_device(jax.devices("cpu")[0]):
        prep, values, dense = _prepared(ds.linear.KLU(), WELL)

        def run(values):
            ws = prep.begin(values, ("adaptive",))
            fac = prep.factor(ws, values, ("adaptive",))
            x, fac2, _ = prep.solve(fac, jnp.ones(64), "adaptive")
            return ws, fac, fac2, x, prep.end(ws, x)

        ws, fac, fac2, x, _ = jax.jit(run)(values)
    assert isinstance(ws, ds.linear.Workspace) and ws.low is not None and ws.fp64 is not None
    assert isinstance(fac, ds.linear.Factorization) and isinstance(fac.factors, ds.linear.Factors)
    assert not bool(fac.factors.fp64_ready) and not bool(fac2.factors.upgraded)  # well conditioned: no fallback
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(dense, np.ones(64)), rtol=1e-12)


def test_refinement_settings_are_keyword_only():
    assert ds.linear.KLU(ir_tol=1e-10).ir_tol == 1e-10
    with pytest.raises(TypeError):
        ds.linear.KLU(1e-10)


# An ODE whose W = I/(h gamma) + s K is too ill-conditioned for float32 refinement once the steps
# grow (K: the Laplacian shifted to an eigenvalue of 1e-9, s = 1e7): "adaptive" falls back.
_N_ILL = 16
_SHIFT = 2.0 - 2.0 * np.cos(np.pi / (_N_ILL + 1)) - 1e-9


def _ill_rhs(t, y, p):
    zero = jnp.zeros(1, y.dtype)
    ky = (2.0 - _SHIFT) * y - jnp.concatenate([y[1:], zero]) - jnp.concatenate([zero, y[:-1]])
    return -p["s"] * ky + p["f"] * jnp.cos(0.1 * t)


_ILL_SPEC = ds.ProblemSpec(_ill_rhs, states=_N_ILL, parameters={"s": 1e7, "f": 1.0}, y0=np.linspace(1.0, 2.0, _N_ILL))


def _ill_simulate(problem, p, adjoint=None):
    extra = {} if adjoint is None else {"adjoint": adjoint}
    return ds.simulate(problem, params=p, t_eval=jnp.array([1.0, 50.0]), rtol=1e-8, atol=1e-10, **extra)


def test_jacfwd_of_forward_mode_with_adaptive_klu_matches_a_jvp_loop_and_float64_dense():
    # jacfwd batches the tangents, not the matrix: the fallback's float64 factorization once ran
    # batched over tangents (KLU: "batched values need batched handles"; Dense: a batched primal).
    fp64 = _ILL_SPEC.build(linear_solver=ds.linear.Dense())
    p0 = fp64.parameter_vector()
    reference = jax.jacfwd(lambda p: _ill_simulate(fp64, p, ds.ForwardMode()).ys)(p0)
    for solver in (ds.linear.KLU(), ds.linear.Dense()):
        problem = _ILL_SPEC.build(linear_solver=solver, precision=ds.Precision(solve_mode="adaptive"))
        assert int(_ill_simulate(problem, p0).stats["n_fallbacks"]) > 10  # the fallback path runs

        def ys(p):
            return _ill_simulate(problem, p, ds.ForwardMode()).ys

        jac = jax.jacfwd(ys)(p0)
        jvp = jax.jit(lambda v: jax.jvp(ys, (p0,), (v,))[1])  # noqa: B023 (one program for the loop's two tangents)
        loop = jnp.stack([jvp(jnp.eye(2)[i]) for i in range(2)], axis=-1)
        scale = np.abs(np.asarray(reference)).max(axis=(0, 1))
        # (cond(W) ~ 1e9: float64 solves themselves differ by ~1e-7 relative)
        np.testing.assert_allclose(np.asarray(jac) / scale, np.asarray(loop) / scale, rtol=0, atol=1e-6)
        np.testing.assert_allclose(np.asarray(jac) / scale, np.asarray(reference) / scale, rtol=0, atol=1e-6)


def test_vmap_over_parameters_with_adaptive_klu_matches_a_loop():
    # A batched fallback predicate broadcast the pattern into KLU's refactor ("Ai/Aj must be 1D"),
    # and its not-yet-factored float64 handle was a null pointer the batched solve used.
    problem = _ILL_SPEC.build(linear_solver=ds.linear.KLU(), precision=ds.Precision(solve_mode="adaptive"))
    p0 = problem.parameter_vector()
    ps = jnp.stack([p0, p0 * jnp.array([1e-4, 1.0]), p0 * jnp.array([0.5, 2.0])])
    batched = jax.vmap(lambda p: _ill_simulate(problem, p).ys)(ps)
    for i in range(3):
        one = _ill_simulate(problem, ps[i])
        np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(one.ys), rtol=1e-6, atol=1e-9)
    assert [int(_ill_simulate(problem, p).stats["n_fallbacks"]) > 0 for p in ps] == [True, False, True]


def test_default_solver_follows_the_measured_crossovers(monkeypatch):
    """Dense LU for small systems (64 states on a CPU, 512 on a GPU: bench_gpu_study.py), KLU above
    on a CPU, cuDSS above on a GPU where it can run, dense LU where it cannot."""
    import diffsoup.linear as linear

    assert isinstance(linear.default_solver(64, "cpu"), ds.linear.Dense)
    assert isinstance(linear.default_solver(65, "cpu"), ds.linear.KLU)
    assert isinstance(linear.default_solver(512, "gpu"), ds.linear.Dense)
    monkeypatch.setattr(linear, "has_cudss", lambda: True)
    assert isinstance(linear.default_solver(513, "gpu"), ds.linear.CuDSS)
    monkeypatch.setattr(linear, "has_cudss", lambda: False)
    assert isinstance(linear.default_solver(513, "gpu"), ds.linear.Dense)


@pytest.mark.parametrize("transpose", [False, True])
def test_matvec_rows_by_scatter_and_by_product_equal_scipy(transpose):
    """``csr_matvec`` sums each row's terms by segment_sum on a CPU and by a product with a 0/1
    matrix elsewhere (small patterns): both against scipy, for one vector and for a block of
    columns (tangents), jitted and vmapped over matrices."""
    from diffsoup.linear._base import csr_matvec, rows_by_product

    m = _tridiagonal(12, 0.5)
    rows = np.repeat(np.arange(12), np.diff(m.indptr))
    x = np.random.default_rng(0).standard_normal((12, 3))
    reference = (m.T if transpose else m) @ x
    src, dst = (rows, m.indices) if transpose else (m.indices, rows)
    terms = m.data[:, None] * x[src]
    np.testing.assert_allclose(rows_by_product(jnp.asarray(terms), dst, 12), reference, rtol=1e-14, atol=1e-14)
    on_cpu = jax.jit(lambda v, b: csr_matvec(jnp.asarray(rows), jnp.asarray(m.indices), 12, v, b, transpose))
    np.testing.assert_allclose(on_cpu(m.data, x), reference, rtol=1e-14, atol=1e-14)
    scales = np.array([1.0, -2.0])
    batched = jax.vmap(lambda s: on_cpu(s * m.data, x[:, 0]))(scales)
    np.testing.assert_allclose(batched, np.outer(scales, reference[:, 0]), rtol=1e-14, atol=1e-14)


def test_matvec_lowered_for_a_gpu_sums_rows_by_a_product_and_for_a_cpu_by_scatter():
    """The branch is picked when the program is lowered for its platform (vmapped and
    differentiated, as the tangent solves use it): no scatter in a GPU program (the H200 ran the
    scatter-add at 0.2 ms per stage), the CPU program unchanged."""
    from diffsoup.linear._base import csr_matvec

    m = _tridiagonal(6, 0.5)
    rows = jnp.asarray(np.repeat(np.arange(6), np.diff(m.indptr)))
    cols = jnp.asarray(m.indices)
    tangent = jax.vmap(lambda v, x: jax.jvp(lambda a, b: csr_matvec(rows, cols, 6, a, b), (v, x), (v, x))[1])
    args = (jnp.ones((4, m.nnz)), jnp.ones((4, 6)))
    for platform, scatter in (("cpu", True), ("cuda", False)):
        text = jax.jit(tangent).trace(*args).lower(lowering_platforms=(platform,)).as_text()
        assert ("scatter" in text) == scatter, platform
        assert ("dot_general" in text) != scatter, platform
