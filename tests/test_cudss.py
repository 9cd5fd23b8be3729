"""ds.linear.CuDSS: configuration, lazy loading, the handler's build (CPU, with nvcc), the Python
layer against a CPU stand-in for the handlers, and on a GPU with cuDSS: solves, transposes,
uniform batches, precision modes, failures as values, and the Brusselator (N = 32, rtol 1e-10)
matching KLU's values, forward sensitivities and adjoint gradient to 1e-8.

The shared suite (tests/test_linear.py) also runs CuDSS where ``has_cudss()``. The KLU reference
of the Brusselator is in tests/data/brusselator32_klu_reference.npz; regenerate it on a CPU with
``python tests/test_cudss.py --regenerate``.
"""

import dataclasses
import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

import diffsoup as ds
from diffsoup.linear import _cudss
from diffsoup.linear import _cudss_build as build
from linear_helpers import prepared, solve

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = Path(__file__).resolve().parent / "data" / "brusselator32_klu_reference.npz"
BRUSSELATOR_KW = dict(t_eval=(1.0, 5.0, 11.5), rtol=1e-10, atol=1e-10, discontinuities=(1.1,))

GPU = ds.linear.has_cudss()
needs_gpu = pytest.mark.skipif(not GPU, reason=f"cuDSS cannot run here: {_cudss.cudss_unavailable_reason()}")


# ---- configuration (anywhere) ---------------------------------------------------------------------


def test_construction_is_plain_configuration_and_validates():
    s = ds.linear.CuDSS("metis", True, 512, ir_tol=1e-12, ir_max_steps=5)
    assert (s.reorder, s.hybrid_memory, s.hybrid_device_memory_limit_mb) == ("metis", True, 512)
    assert (s.ir_tol, s.ir_max_steps) == (1e-12, 5)
    assert s == ds.linear.CuDSS(reorder="metis", hybrid_memory=True, hybrid_device_memory_limit_mb=512,
                                ir_tol=1e-12, ir_max_steps=5)  # fmt: skip
    assert hash(s) == hash(ds.linear.CuDSS("metis", True, 512, ir_tol=1e-12, ir_max_steps=5))
    with pytest.raises(ValueError, match="reorder"):
        ds.linear.CuDSS(reorder="rcm")
    with pytest.raises(ValueError, match="hybrid_memory"):
        ds.linear.CuDSS(hybrid_memory="yes")
    with pytest.raises(ValueError, match="hybrid_device_memory_limit_mb"):
        ds.linear.CuDSS(hybrid_memory=True, hybrid_device_memory_limit_mb=0)
    with pytest.raises(ValueError, match="hybrid_memory=True"):
        ds.linear.CuDSS(hybrid_memory=False, hybrid_device_memory_limit_mb=100)
    with pytest.raises(ValueError, match="ir_tol"):
        ds.linear.CuDSS(ir_tol=-1.0)


def test_configuration_is_a_frozen_dataclass_with_the_documented_parameters():
    import inspect

    params = inspect.signature(ds.linear.CuDSS).parameters
    assert list(params) == ["reorder", "hybrid_memory", "hybrid_device_memory_limit_mb", "ir_tol", "ir_max_steps"]
    assert all(params[k].default is None for k in ("reorder", "hybrid_memory", "hybrid_device_memory_limit_mb"))
    assert params["ir_tol"].kind is inspect.Parameter.KEYWORD_ONLY  # the refinement fields of every solver
    assert isinstance(ds.linear.CuDSS(), ds.linear.LinearSolver)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ds.linear.CuDSS().reorder = "metis"


def test_process_settings_reach_the_handler_options_and_the_build(monkeypatch, tmp_path):
    m = _nonsymmetric(10, 7)
    assert _standin_prepared(m)[0]._opts["fp64"].check  # default: read cuDSS's error indicator
    monkeypatch.setenv("DIFFSOUP_CUDSS_CHECK_INFO", "0")
    assert not any(o.check for o in _standin_prepared(m)[0]._opts.values())
    monkeypatch.setenv("DIFFSOUP_CUDSS_NVCC_FLAGS", "-arch=sm_90 -lineinfo")
    assert build._arch_flags() == ["-arch=sm_90", "-lineinfo"]
    monkeypatch.delenv("DIFFSOUP_CUDSS_NVCC_FLAGS")
    assert build._arch_flags() == list(build.DEFAULT_ARCH_FLAGS)
    monkeypatch.setenv("DIFFSOUP_CACHE_DIR", str(tmp_path))
    assert build.cache_root() == tmp_path / "cudss-build"


def test_settings_on_the_object_win_over_the_layout():
    layout = ds.Layout(reorder="metis", hybrid_memory=True, hybrid_device_memory_limit_mb=256)
    assert ds.linear.CuDSS().settings(layout) == {
        "reorder": "metis", "hybrid_memory": True, "hybrid_device_memory_limit_mb": 256,
    }  # fmt: skip
    assert ds.linear.CuDSS(reorder="amd", hybrid_memory=False).settings(layout) == {
        "reorder": "amd", "hybrid_memory": False, "hybrid_device_memory_limit_mb": None,
    }  # fmt: skip
    with pytest.raises(ValueError, match="hybrid memory is off"):
        ds.linear.CuDSS(hybrid_device_memory_limit_mb=100).settings(ds.Layout())
    assert ds.linear.CuDSS(hybrid_device_memory_limit_mb=64).settings(layout)["hybrid_device_memory_limit_mb"] == 64
    assert ds.linear.CuDSS().settings(None) == {"reorder": "amd", "hybrid_memory": False, "hybrid_device_memory_limit_mb": None}


def test_importing_diffsoup_loads_no_gpu_binding():
    code = (
        "import sys, diffsoup, diffsoup.linear as L; "
        "assert L.CuDSS is not None and L._cudss._lib is None; "
        "assert 'diffsoup.linear._cudss_build' not in sys.modules; "
        "print('lazy')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "lazy" in out.stdout


@pytest.mark.skipif(GPU, reason="cuDSS can run here")
def test_prepare_where_cudss_cannot_run_says_what_is_missing():
    with pytest.raises(RuntimeError, match="CuDSS cannot run here: .*(GPU|cuDSS|nvcc)"):
        ds.examples.brusselator_2d(4).build(linear_solver=ds.linear.CuDSS())
    assert not ds.linear.has_cudss()


def test_handler_source_is_packaged_beside_the_module_under_its_own_name():
    """The C++ source lives in ``linear/_cudss_ffi/``: no folder shares a name with a module (an
    ``X.py`` beside an ``X/`` makes ``import X`` ambiguous to read), and package data names it."""
    assert build.SOURCE.is_file() and build.SOURCE.parent.name == "_cudss_ffi"
    package = ROOT / "diffsoup"
    clashes = [str(p.relative_to(ROOT)) for p in package.rglob("*.py") if p.with_suffix("").is_dir()]
    assert clashes == []
    assert '"diffsoup.linear" = ["_cudss_ffi/*.cu"]' in (ROOT / "pyproject.toml").read_text()


# ---- the handler compiles (CPU; CI has nvcc and the wheel's headers) -------------------------------


def test_handler_compiles_with_nvcc(tmp_path):
    if GPU:
        pytest.skip("a GPU run builds the handler anyway (the GPU tests load it)")
    nvcc = build.find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (set NVCC or CUDA_HOME)")
    if build.find_cudss(need_library=False) is None:
        pytest.skip("cuDSS headers not found (pip install nvidia-cudss-cu13, or set CUDSS_ROOT)")
    path = build.build(tmp_path, force=True)
    assert path.is_file() and path.stat().st_size > 10_000
    nm = shutil.which("nm")
    if nm and build.find_cudss() is not None:  # linked: the FFI symbols are exported
        syms = subprocess.run([nm, "-D", "--defined-only", str(path)], capture_output=True, text=True).stdout
        for name in build.HANDLER_SYMBOLS:
            assert name in syms, name


def test_lowering_to_cuda_custom_calls():
    """Lowered for CUDA on any machine: the four FFI targets, side-effecting, with the registry key."""
    m = sp.random(30, 30, 0.15, random_state=1, format="csr") + 4 * sp.eye(30)
    prep = _standin_prepared(m)[0]

    def run(values, b):
        ws = prep.begin(values, ("fp32_ir",))
        fac = prep.factor(ws, values, ("fp32_ir",))
        x, _, _ = prep.solve(fac, b, "fp32_ir", transpose=True)
        return x, prep.end(ws, x)

    nnz = prep.pattern.nnz
    checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in _cudss._TARGETS]
    exp = jax.export.export(jax.jit(jax.vmap(run)), platforms=["cuda"], disabled_checks=checks)(
        jnp.ones((4, nnz)), jnp.ones((4, 30))
    )
    text = exp.mlir_module()
    for target in ("diffsoup_cudss_analyze_factor", "diffsoup_cudss_refactor", "diffsoup_cudss_solve_transpose"):
        assert f"custom_call @{target}" in text
    calls = [line for line in text.splitlines() if "custom_call @diffsoup_cudss" in line]
    assert all("has_side_effect = true" in c for c in calls)
    assert all(f"tensor<4x{nnz}xf32>" in c for c in calls)  # vmap over values = one uniform batch of 4, float32 slot
    assert all("slot = 1 : i32" in c for c in calls)


# ---- the Python layer against a CPU stand-in for the handlers --------------------------------------


def _standin_factor(indptr, indices, values, after, *, opts, first):
    return jnp.zeros(values.shape[:1], jnp.int32)


def _standin_solve(info, indptr, indices, values, b, *tpattern, opts, transpose):
    L, nnz = values.shape
    n = indptr.shape[0] - 1
    rows = jnp.repeat(jnp.arange(n), jnp.diff(indptr), total_repeat_length=nnz)
    a = jnp.zeros((L, n, n), values.dtype).at[:, rows, indices].set(values)
    if transpose:
        a = jnp.swapaxes(a, 1, 2)
    x = jnp.swapaxes(jnp.linalg.solve(a, jnp.swapaxes(b, 1, 2)), 1, 2)
    return jnp.where((info != 0)[:, None, None], jnp.nan, x)


@functools.cache
def _register_cpu_standin():
    from jax.interpreters import mlir

    mlir.register_lowering(_cudss.cudss_factor_p, mlir.lower_fun(_standin_factor, multiple_results=False), platform="cpu")
    mlir.register_lowering(_cudss.cudss_solve_p, mlir.lower_fun(_standin_solve, multiple_results=False), platform="cpu")


class _StandIn(ds.linear.CuDSS):
    """CuDSS's Python layer with dense CPU stand-ins for the four handlers."""

    def prepare(self, pattern, precision, *, layout=None):
        _register_cpu_standin()
        if GPU:  # on a GPU the jitted calls run there: the real handlers
            _cudss.load_binding()
        return _cudss.PreparedCuDSS(self, pattern, precision, self.settings(layout))


def _standin_prepared(matrix, solver=None):
    return prepared(solver or _StandIn(), matrix)


_solve = solve


def _nonsymmetric(n, seed=0, density=0.02):
    rng = np.random.default_rng(seed)
    m = sp.random(n, n, density, random_state=rng, format="csr")
    return sp.csr_matrix(m + sp.diags(4.0 + rng.uniform(0, 1, n)))


@pytest.mark.parametrize("mode", ["fp64", "fp32", "fp32_ir", "adaptive"])
@pytest.mark.parametrize("transpose", [False, True])
def test_standin_modes_solves_and_transposes(mode, transpose):
    prep, values, dense = _standin_prepared(_nonsymmetric(40))
    b = jnp.asarray(np.random.default_rng(0).standard_normal((40, 3)))
    x, info, _ = _solve(prep, values, b, mode, transpose)
    ref = np.linalg.solve(dense.T if transpose else dense, np.asarray(b))
    tol = 1e-5 if mode == "fp32" else 1e-12
    np.testing.assert_allclose(np.asarray(x), ref, rtol=tol, atol=tol)
    assert bool(info.ok) and x.dtype == jnp.float64


def test_standin_vmap_becomes_a_uniform_batch_or_a_multi_rhs_solve():
    prep, values, dense = _standin_prepared(_nonsymmetric(30, 1))
    nnz = prep.pattern.nnz
    bs = jnp.asarray(np.random.default_rng(1).standard_normal((5, 30)))
    scales = jnp.linspace(0.5, 2.0, 5)

    def one(v, b):
        return _solve(prep, v, b, "fp64")[0]

    jaxpr = str(jax.make_jaxpr(jax.vmap(one))(values[None] * scales[:, None], bs))
    assert f"f64[5,{nnz}]" in jaxpr and "diffsoup_cudss_factor" in jaxpr  # one uniform batch of 5
    jaxpr_rhs = str(jax.make_jaxpr(jax.vmap(one, in_axes=(None, 0)))(values, bs))
    assert "f64[1,5,30]" in jaxpr_rhs and f"f64[5,{nnz}]" not in jaxpr_rhs  # one factorization, 5 right-hand sides
    both = jax.vmap(one)(values[None] * scales[:, None], bs)
    rhs = jax.vmap(one, in_axes=(None, 0))(values, bs)
    for i in range(5):
        np.testing.assert_allclose(np.asarray(both[i]), np.linalg.solve(dense * float(scales[i]), np.asarray(bs[i])), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(rhs[i]), np.linalg.solve(dense, np.asarray(bs[i])), rtol=1e-12)


def test_standin_pattern_batched_as_copies_is_unbatched():
    """A ``lax.cond`` with a batched predicate (lanes taking different branches under vmap)
    broadcasts every operand of its branches, the pattern's arrays included: the batching rules
    take one copy, since one prepared solver has one pattern."""
    prep, values, dense = _standin_prepared(_nonsymmetric(25, 3))
    bs = jnp.asarray(np.random.default_rng(3).standard_normal((4, 25)))
    scales = jnp.array([0.5, 1.5, 0.8, 2.0])

    def one(s, b):
        solve_scaled = lambda: _solve(prep, values * s, b, "fp64")[0]  # noqa: E731
        solve_plain = lambda: _solve(prep, values, b, "fp64")[0]  # noqa: E731
        return jax.lax.cond(s > 1.0, solve_scaled, solve_plain)

    jaxpr = str(jax.make_jaxpr(jax.vmap(one))(scales, bs))
    assert "diffsoup_cudss_solve" in jaxpr
    got = jax.vmap(one)(scales, bs)
    for i, s in enumerate(np.asarray(scales)):
        expected = np.linalg.solve(dense * (s if s > 1.0 else 1.0), np.asarray(bs[i]))
        np.testing.assert_allclose(np.asarray(got[i]), expected, rtol=1e-12)


def test_standin_non_finite_values_are_a_failed_solve():
    prep, values, _ = _standin_prepared(_nonsymmetric(20, 2))
    x, info, _ = _solve(prep, values.at[3].set(jnp.nan), jnp.ones(20), "fp64")
    assert not bool(info.ok) and not np.any(np.isfinite(np.asarray(x)))


def test_standin_simulate_forward_sensitivities_and_adjoint_match_dense():
    spec = ds.examples.brusselator_2d(6)
    kw = dict(t_eval=(0.5, 2.0), rtol=1e-8, atol=1e-10, discontinuities=(1.1,))
    cu = spec.build(linear_solver=_StandIn())
    klu = spec.build(linear_solver=ds.linear.Dense())
    p0 = klu.parameter_vector()

    def ys(problem, p, adjoint):
        return ds.simulate(problem, params=p, adjoint=adjoint, **kw).ys

    np.testing.assert_allclose(ys(cu, p0, ds.ForwardMode()), ys(klu, p0, ds.ForwardMode()), rtol=1e-10)
    jac = lambda pr: jax.jacfwd(lambda p: ys(pr, p, ds.ForwardMode())[-1])(p0)  # noqa: E731
    np.testing.assert_allclose(jac(cu), jac(klu), rtol=1e-8, atol=1e-12)
    grad = lambda pr: jax.grad(lambda p: jnp.sum(ys(pr, p, ds.CheckpointAdjoint())[-1] ** 2))(p0)  # noqa: E731
    np.testing.assert_allclose(grad(cu), grad(klu), rtol=1e-8)
    scales = jnp.array([0.9, 1.1])
    batched = jax.vmap(lambda s: ys(cu, p0 * s, ds.ForwardMode()))(scales)
    np.testing.assert_allclose(batched[1], ys(klu, p0 * 1.1, ds.ForwardMode()), rtol=1e-9)


def _brusselator_study(linear_solver, n=4, experiments=3, windows=False):
    """A study of Brusselators (one per value of ``B``), every u observed at two times."""
    problem = ds.examples.brusselator_2d(n).build(linear_solver=linear_solver)
    times = np.array([0.5, 1.0])
    truth = ds.simulate(problem, t_eval=times, rtol=1e-10, atol=1e-12).ys
    exps = []
    for i in range(experiments):
        data = np.asarray(truth) * (1.0 + 0.01 * np.random.default_rng(i).standard_normal(truth.shape))
        exp = ds.Experiment(f"B{i}", times, data, noise=ds.inference.Gaussian(0.05), conditions={"B": 0.9 + 0.1 * i})
        exps.append(ds.inference.Multishoot(boundaries=[0.7]).apply(exp) if windows else exp)
    table = [ds.inference.Parameter("A", 3.4, 1.0, 10.0), ds.inference.Parameter("alpha", 10.0, 1.0, 100.0)]
    return ds.Study(problem, exps, table)


@pytest.mark.slow
@pytest.mark.parametrize("windows", [False, True], ids=["single", "multishoot"])
def test_standin_batched_study_every_mode_matches_dense(windows):
    """Experiments batched under vmap through CuDSS in every mode of a lowered study (the pattern is
    never a batched operand): value, adjoint gradient, forward-sensitivity Jacobian and exact
    Hessian (forward-over-reverse products) against Dense."""
    solver = ds.inference.SolverOptions(rtol=1e-8, atol=1e-10)
    lowered = {
        name: ds.lower(_brusselator_study(lin, windows=windows), solver=solver, gradient="adjoint", hessian="exact")
        for name, lin in (("cudss", _StandIn()), ("dense", ds.linear.Dense()))
    }  # fmt: skip
    theta = lowered["dense"].problem.theta_of({"A": 3.3, "alpha": 11.0})  # window starts nominal
    v_cu, g_cu = lowered["cudss"].value_and_grad(theta)
    v_de, g_de = lowered["dense"].value_and_grad(theta)
    np.testing.assert_allclose(v_cu, v_de, rtol=1e-10)
    np.testing.assert_allclose(g_cu, g_de, rtol=1e-7, atol=1e-9 * np.abs(g_de).max())
    r_cu, j_cu = lowered["cudss"].residuals_and_jacobian(theta)
    r_de, j_de = lowered["dense"].residuals_and_jacobian(theta)
    np.testing.assert_allclose(r_cu, r_de, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(j_cu, j_de, rtol=1e-7, atol=1e-9 * np.abs(j_de).max())
    if not windows:
        h_cu, h_de = lowered["cudss"].hessian(theta), lowered["dense"].hessian(theta)
        np.testing.assert_allclose(h_cu, h_de, rtol=1e-6, atol=1e-8 * np.abs(h_de).max())


# ---- on a GPU with cuDSS ------------------------------------------------------------------------------


def _gpu_prepared(matrix, solver=None, precision=None):
    return prepared(solver or ds.linear.CuDSS(), matrix, precision)


@needs_gpu
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("mode", ["fp64", "fp32", "fp32_ir", "adaptive"])
def test_gpu_modes_solves_transposes_multi_rhs_against_scipy(mode, transpose):
    m = _nonsymmetric(600, 3, density=0.01)
    prep, values, dense = _gpu_prepared(m)
    b = jnp.asarray(np.random.default_rng(3).standard_normal((600, 4)))
    x, info, _ = _solve(prep, values, b, mode, transpose)
    ref = sp.linalg.spsolve(sp.csc_matrix(m.T if transpose else m), np.asarray(b))
    tol = 1e-5 if mode == "fp32" else 1e-12
    np.testing.assert_allclose(np.asarray(x), ref, rtol=tol, atol=tol)
    assert bool(info.ok)
    if mode in ("fp32_ir", "adaptive"):
        assert int(info.ir_steps) >= 1 and int(info.fallbacks) == 0


@needs_gpu
def test_gpu_uniform_batch_runs_one_analysis_and_matches_each_system():
    m = _nonsymmetric(300, 4)
    prep, values, dense = _gpu_prepared(m)
    rng = np.random.default_rng(4)
    scales = jnp.asarray(rng.uniform(0.5, 2.0, 7))
    bs = jnp.asarray(rng.standard_normal((7, 300)))
    before = _cudss.cudss_counters()
    run = jax.jit(jax.vmap(lambda v, b: _solve(prep, v, b, "fp64")[0]))
    x = run(values[None] * scales[:, None], bs)
    x2 = run(values[None] * scales[:, None] * 1.5, bs)  # same key: refactorization only
    after = _cudss.cudss_counters()
    for i in range(7):
        np.testing.assert_allclose(np.asarray(x[i]), np.linalg.solve(dense * float(scales[i]), np.asarray(bs[i])), rtol=1e-11)
        np.testing.assert_allclose(np.asarray(x2[i]), np.asarray(x[i]) / 1.5, rtol=1e-11)
    assert after["analyses"] - before["analyses"] == 1
    print("cuDSS counters:", after)


@needs_gpu
def test_gpu_failures_are_values():
    m = _nonsymmetric(200, 5)
    prep, values, _ = _gpu_prepared(m)
    x, info, _ = _solve(prep, values.at[7].set(jnp.nan), jnp.ones(200), "fp64")
    assert not bool(info.ok)
    # A singular matrix: row 11 all zeros (its entries, the diagonal included, stay in the pattern).
    rows = np.asarray(prep.pattern.rows)
    x, info, _ = _solve(prep, jnp.where(rows == 11, 0.0, values), jnp.ones(200), "fp64")
    assert not bool(info.ok)
    x, info, _ = _solve(prep, values, jnp.ones(200), "fp64")  # and the next factorization is fine
    assert bool(info.ok) and np.all(np.isfinite(np.asarray(x)))


@needs_gpu
@pytest.mark.parametrize(
    "solver", [ds.linear.CuDSS(reorder="metis"), ds.linear.CuDSS(hybrid_memory=True, hybrid_device_memory_limit_mb=64)],
    ids=["metis", "hybrid"],
)  # fmt: skip
def test_gpu_reordering_and_hybrid_memory(solver):
    n = 40
    lap = sp.kron(sp.eye(n), sp.diags([-1, 4.2, -1.1], [-1, 0, 1], (n, n))) + sp.kron(sp.diags([-1, -1], [-1, 1], (n, n)), sp.eye(n))
    m = sp.csr_matrix(lap)
    prep, values, _ = _gpu_prepared(m, solver)
    b = jnp.asarray(np.random.default_rng(6).standard_normal(n * n))
    for transpose in (False, True):
        x, info, _ = _solve(prep, values, b, "fp64", transpose)
        ref = sp.linalg.spsolve(sp.csc_matrix(m.T if transpose else m), np.asarray(b))
        np.testing.assert_allclose(np.asarray(x), ref, rtol=1e-11, atol=1e-12)
        assert bool(info.ok)


def _brusselator_outputs(problem, *, jac_by_columns=False):
    p0 = problem.parameter_vector()

    def ys(p, adjoint):
        return ds.simulate(problem, params=p, adjoint=adjoint, **BRUSSELATOR_KW).ys

    values = ys(p0, ds.ForwardMode())
    last = lambda p: ys(p, ds.ForwardMode())[-1]  # noqa: E731
    if jac_by_columns:  # one jvp per parameter (the reference: KLU's batched tangents are not used)
        eye = jnp.eye(p0.shape[0], dtype=p0.dtype)
        jac = jnp.stack([jax.jvp(last, (p0,), (eye[i],))[1] for i in range(p0.shape[0])], axis=1)
    else:
        jac = jax.jacfwd(last)(p0)
    grad = jax.grad(lambda p: jnp.sum(ys(p, ds.CheckpointAdjoint())[-1] ** 2))(p0)
    return {"ys": np.asarray(values), "jac": np.asarray(jac), "grad": np.asarray(grad)}


def _relative(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@needs_gpu
def test_gpu_brusselator_n32_matches_klu_values_sensitivities_and_gradient():
    ref = np.load(REFERENCE)
    problem = ds.examples.brusselator_2d(32).build(linear_solver=ds.linear.CuDSS())
    before = _cudss.cudss_counters()
    out = _brusselator_outputs(problem)
    after = _cudss.cudss_counters()
    errs = {k: _relative(out[k], ref[k]) for k in ("ys", "jac", "grad")}
    print("Brusselator N=32 rtol 1e-10, relative difference to KLU:", errs, "\ncuDSS counters:", after)
    assert errs["ys"] < 1e-8 and errs["jac"] < 1e-8 and errs["grad"] < 1e-8, errs
    # One analysis per pattern and slot however many simulations and steps.
    assert after["analyses"] - before["analyses"] <= 2
    assert after["refactorizations"] - before["refactorizations"] > 1000


def _regenerate_reference():  # pragma: no cover - run by hand on a CPU
    problem = ds.examples.brusselator_2d(32).build(linear_solver=ds.linear.KLU())
    with jax.default_device(jax.devices("cpu")[0]):
        out = _brusselator_outputs(problem, jac_by_columns=True)
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(REFERENCE, **out, note=np.array(f"KLU on CPU, jax {jax.__version__}, {BRUSSELATOR_KW}, jac by one jvp per parameter"))
    print("wrote", REFERENCE, {k: v.shape for k, v in out.items()})


if __name__ == "__main__":  # pragma: no cover
    if "--regenerate" in sys.argv:
        jax.config.update("jax_enable_x64", True)
        _regenerate_reference()
