"""Sparse linear solves and stiff simulations on a GPU: diffsoup's cuDSS binding against its peers.

Sections (each figure is a ratio against a peer measured in the same run, plus absolute times):

* ``linear``: refactorization + solve of W = c I - J for 2-D Brusselator Jacobians (N = 64, 128,
  256) and of a 3-D 7-point operator (~1e6 unknowns): CuDSS through XLA FFI vs ``jnp.linalg.solve``
  (dense LU, where it fits) vs ``jax.experimental.sparse.linalg.spsolve`` (cuSOLVER QR, where it
  runs in seconds) vs the same cuDSS calls from a plain C++ program (``cudss_standalone.cu``,
  built here with nvcc): the FFI's overhead.
* ``batch``: 1,000 small systems (Brusselator N = 8, 128 unknowns) as one cuDSS uniform batch
  (``vmap``) vs a loop of single cuDSS calls (``lax.map``) vs batched dense LU.
* ``simulate``: ``ds.simulate`` of the Brusselator (rtol 1e-6) with CuDSS on the GPU vs KLU on the
  CPU vs scipy's BDF (sparse Jacobian) vs diffrax's Kvaerno5 on the GPU (dense Newton solves).

Run on a machine with a GPU and cuDSS (``ds.linear.has_cudss()``):

    XLA_PYTHON_CLIENT_MEM_FRACTION=0.7 python benchmarks/bench_linear.py \
        [--sections linear,batch,simulate] [--kvaerno 32,64] [--scipy 32,64] [--budget-s 420]

It prints a table and writes benchmarks/results/bench_linear_gpu.json (rewritten after every
measurement, so a run stopped early keeps what it measured). Peers that would not finish inside
``--budget-s`` are recorded as skipped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.7")
os.environ.setdefault("JAX_ENABLE_X64", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

jax.config.update("jax_enable_x64", True)

import diffsoup as ds  # noqa: E402
from diffsoup.linear import _cudss  # noqa: E402
from diffsoup.linear import _cudss_build as build  # noqa: E402

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "bench_linear_gpu.json"
START = time.perf_counter()


def elapsed():
    return time.perf_counter() - START


def block(x):
    return jax.tree_util.tree_map(lambda a: a.block_until_ready() if hasattr(a, "block_until_ready") else a, x)


def timed(fn, reps, warmup=1):
    """Median and best wall time of ``fn()`` (blocked), after ``warmup`` calls (compilation)."""
    for _ in range(warmup):
        block(fn())
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        block(fn())
        times.append(time.perf_counter() - t)
    return float(np.median(times)), float(np.min(times))


class Results:
    def __init__(self, args):
        self.data = {
            "meta": {
                "jax": jax.__version__, "devices": [str(d) for d in jax.devices()],
                "python": platform.python_version(), "cpu_count": os.cpu_count(),
                "xla_mem_fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
                "argv": sys.argv[1:], "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            },
            "linear": [], "batch": [], "simulate": [],
        }  # fmt: skip
        self.args = args

    def add(self, section, record):
        record = {k: v for k, v in record.items()}
        self.data[section].append(record)
        print(f"[{elapsed():7.1f}s] {section}: {json.dumps(record)}", flush=True)
        self.save()

    def save(self):
        OUT.parent.mkdir(parents=True, exist_ok=True)
        tmp = OUT.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, OUT)


def _hash_pattern(indptr, indices):
    h = hashlib.sha256(np.asarray(indptr, np.int64).tobytes() + np.asarray(indices, np.int64).tobytes()).hexdigest()
    return _cudss._signed64(h)


# ---------------------------------------------------------------------------------------------------
# Matrices
# ---------------------------------------------------------------------------------------------------


def brusselator_w(n_grid, c=1e3):
    """W = c I - J of the 2-D Brusselator at its initial state, as CSR arrays."""
    problem = ds.examples.brusselator_2d(n_grid).build(linear_solver=ds.linear.Dense())
    pat = problem.pattern
    y0 = jnp.asarray(problem.spec.y0)
    jac = np.asarray(jax.jit(problem.jacobian_values)(jnp.asarray(0.0), y0, problem.parameter_vector()))
    w = -jac
    w[np.asarray(pat.diagonal)] += c
    return np.asarray(pat.indptr, np.int32), np.asarray(pat.indices, np.int32), w


def operator_3d(m):
    """A 7-point convection-diffusion operator on an m^3 grid (nonsymmetric), CSR."""
    one = sp.identity(m, format="csr")
    d = sp.diags([-1.05, 2.0, -0.95], [-1, 0, 1], shape=(m, m), format="csr")
    a = sp.kron(sp.kron(d, one), one) + sp.kron(sp.kron(one, d), one) + sp.kron(sp.kron(one, one), d)
    a = sp.csr_matrix(a + 0.01 * sp.identity(m**3))
    a.sort_indices()
    return np.asarray(a.indptr, np.int32), np.asarray(a.indices, np.int32), np.asarray(a.data, np.float64)


# ---------------------------------------------------------------------------------------------------
# The standalone C++ peer
# ---------------------------------------------------------------------------------------------------


def _cuda_library_dirs():
    dirs = []
    for entry in sys.path:
        for sub in ("nvidia/cu13/lib", "nvidia/cu12/lib", "nvidia/cublas/lib", "nvidia/cuda_nvrtc/lib"):
            d = Path(entry) / sub
            if d.is_dir():
                dirs.append(str(d))
    return list(dict.fromkeys(dirs))


def build_standalone(tmp):
    cudss, nvcc = build.find_cudss(), build.find_nvcc()
    if cudss is None or nvcc is None:
        return None, "cuDSS or nvcc not found"
    exe = Path(tmp) / "cudss_standalone"
    cmd = [str(nvcc), "-O2", "-std=c++17", "-I", str(cudss.include_dir), str(HERE / "cudss_standalone.cu"),
           "-o", str(exe), "-L", str(cudss.lib_dir), "-Xlinker", "-l:libcudss.so.1",
           "-Xlinker", f"-rpath,{cudss.lib_dir}", "-Xlinker", "--allow-shlib-undefined"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return None, proc.stderr[-2000:]
    return exe, None


def run_standalone(exe, tmp, indptr, indices, values, b, reps):
    path = Path(tmp) / "matrix.bin"
    with open(path, "wb") as fh:
        fh.write(np.int64(indptr.shape[0] - 1).tobytes())
        fh.write(np.int64(indices.shape[0]).tobytes())
        fh.write(np.asarray(indptr, np.int32).tobytes())
        fh.write(np.asarray(indices, np.int32).tobytes())
        fh.write(np.asarray(values, np.float64).tobytes())
        fh.write(np.asarray(b, np.float64).tobytes())
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join(_cuda_library_dirs() + [env.get("LD_LIBRARY_PATH", "")])
    det = "0" if os.environ.get("DIFFSOUP_CUDSS_DETERMINISTIC", "1").startswith("0") else "1"  # as the library
    proc = subprocess.run([str(exe), str(path), str(reps), "1", det], capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        return {"error": (proc.stdout + proc.stderr)[-1000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------------


def bench_one_matrix(res, name, indptr, indices, values, exe, tmp, *, dense_max=32768, spsolve_max=32768):
    n, nnz = indptr.shape[0] - 1, indices.shape[0]
    rng = np.random.default_rng(0)
    b_np = rng.standard_normal(n)
    big = n > 200_000
    reps = 3 if big else 20
    rec = {"matrix": name, "n": int(n), "nnz": int(nnz)}

    # The C++ peer first, while this process holds no cuDSS factors.
    if exe is not None:
        sa = run_standalone(exe, tmp, indptr, indices, values, b_np, reps)
        rec["standalone"] = sa

    opts = _cudss.Options(_hash_pattern(indptr, indices), 0, 0, 0, 0, True)
    ip, ix = jnp.asarray(indptr), jnp.asarray(indices)
    v = jnp.asarray(values)
    b = jnp.asarray(b_np)
    begin = jax.jit(lambda ip, ix, v: _cudss.factor(ip, ix, v, None, opts, first=True))

    @jax.jit
    def refactor_solve(ip, ix, v, b, token):
        info = _cudss.factor(ip, ix, v, token, opts, first=False)
        return _cudss.solve(info, ip, ix, v, b, opts), info

    t = time.perf_counter()
    token = block(begin(ip, ix, v))
    rec["cudss_analysis_factor_s"] = time.perf_counter() - t
    med, best = timed(lambda: refactor_solve(ip, ix, v, b, token), reps)
    x, info = refactor_solve(ip, ix, v, b, token)
    a = sp.csr_matrix((values, indices, indptr), shape=(n, n))
    resid = float(np.max(np.abs(a @ np.asarray(x) - b_np)) / np.max(np.abs(b_np)))
    rec.update(cudss_refactor_solve_s=med, cudss_refactor_solve_best_s=best, cudss_info=int(info[0]),
               cudss_relative_residual=resid)  # fmt: skip
    sa = rec.get("standalone", {})
    if "refactor_solve_median_s" in sa:
        rec["ffi_overhead_ratio"] = med / sa["refactor_solve_median_s"]
    _cudss.release_cudss_memory()

    if n <= dense_max:
        rows = np.repeat(np.arange(n), np.diff(indptr))
        dense = jnp.zeros((n, n)).at[rows, indices].set(v)
        block(dense)
        solve = jax.jit(jnp.linalg.solve)
        med_d, _ = timed(lambda: solve(dense, b), 2 if n > 10_000 else 5)
        rec["dense_lu_solve_s"] = med_d
        rec["dense_over_cudss"] = med_d / med
        del dense
    else:
        rec["dense_lu_solve_s"] = f"skipped: {n}x{n} float64 is {n * n * 8 / 1e9:.0f} GB"
    if n <= spsolve_max:
        from jax.experimental.sparse.linalg import spsolve

        sps = jax.jit(lambda v, b: spsolve(v, ix, ip, b))
        med_s, _ = timed(lambda: sps(v, b), 1)
        rec["spsolve_s"] = med_s
        rec["spsolve_over_cudss"] = med_s / med
    else:
        rec["spsolve_s"] = "skipped: cuSOLVER QR without reuse takes minutes at this size"
    res.add("linear", rec)


def section_linear(res, args):
    with tempfile.TemporaryDirectory() as tmp:
        exe, err = build_standalone(tmp)
        if exe is None:
            res.add("linear", {"standalone_build_error": err})
        for n_grid in args.brusselator:
            try:
                ip, ix, v = brusselator_w(n_grid)
                bench_one_matrix(res, f"brusselator_2d N={n_grid}", ip, ix, v, exe, tmp)
            except Exception as err:  # a failed case is recorded, the run goes on
                res.add("linear", {"matrix": f"brusselator_2d N={n_grid}", "error": repr(err)[:1000]})
        if args.grid3d:
            m = args.grid3d
            try:
                ip, ix, v = operator_3d(m)
                bench_one_matrix(res, f"7-point 3-D {m}^3", ip, ix, v, exe, tmp, dense_max=0, spsolve_max=0)
            except Exception as err:
                res.add("linear", {"matrix": f"7-point 3-D {m}^3", "error": repr(err)[:1000]})


def section_batch(res, args):
    count = args.batch
    ip, ix, v0 = brusselator_w(8, c=0.0)
    n = ip.shape[0] - 1
    diag = np.nonzero(np.repeat(np.arange(n), np.diff(ip)) == ix)[0]
    rng = np.random.default_rng(1)
    cs = 10 ** rng.uniform(1.5, 4.0, count)
    vals = np.tile(v0, (count, 1))
    vals[:, diag] += cs[:, None]
    bs = rng.standard_normal((count, n))
    opts = _cudss.Options(_hash_pattern(ip, ix), 0, 0, 0, 0, True)
    ipj, ixj, V, B = jnp.asarray(ip), jnp.asarray(ix), jnp.asarray(vals), jnp.asarray(bs)

    def begin(v):
        return _cudss.factor(ipj, ixj, v, None, opts, first=True)

    def step(v, b, tok):
        info = _cudss.factor(ipj, ixj, v, tok, opts, first=False)
        return _cudss.solve(info, ipj, ixj, v, b, opts)

    tok_b = block(jax.jit(jax.vmap(begin))(V))
    ubatch = jax.jit(jax.vmap(step))
    med_u, _ = timed(lambda: ubatch(V, B, tok_b), 10)
    tok_1 = block(jax.jit(begin)(V[0]))
    loop = jax.jit(lambda V, B: jax.lax.map(lambda vb: step(vb[0], vb[1], tok_1), (V, B)))
    med_l, _ = timed(lambda: loop(V, B), 2)
    rows = np.repeat(np.arange(n), np.diff(ip))
    dense = jnp.zeros((count, n, n)).at[:, rows, ixj].set(V)
    dsolve = jax.jit(jax.vmap(jnp.linalg.solve))
    med_d, _ = timed(lambda: dsolve(dense, B), 10)
    x_u, x_l, x_d = np.asarray(ubatch(V, B, tok_b)), np.asarray(loop(V, B)), np.asarray(dsolve(dense, B))
    res.add("batch", {
        "systems": count, "n": int(n), "nnz": int(ix.shape[0]),
        "ubatch_s": med_u, "loop_s": med_l, "dense_batched_lu_s": med_d,
        "loop_over_ubatch": med_l / med_u, "dense_over_ubatch": med_d / med_u,
        "max_rel_diff_ubatch_vs_dense": float(np.max(np.abs(x_u - x_d)) / np.max(np.abs(x_d))),
        "max_rel_diff_loop_vs_dense": float(np.max(np.abs(x_l - x_d)) / np.max(np.abs(x_d))),
    })  # fmt: skip
    _cudss.release_cudss_memory()


SIM_KW = dict(rtol=1e-6, atol=1e-8)
T_END = 11.5


def _time_simulate(problem, device=None, twice=True):
    """(first call, second call, solution); the second call is None when ``twice`` is False."""
    import contextlib

    ctx = jax.default_device(device) if device is not None else contextlib.nullcontext()
    with ctx:
        p = problem.parameter_vector()
        run = lambda: ds.simulate(problem, t_eval=[T_END], params=p, discontinuities=(1.1,), adjoint=ds.ForwardMode(), **SIM_KW)  # noqa: E731
        t = time.perf_counter()
        sol = run()
        block(sol.ys)
        first = time.perf_counter() - t
        if not twice:
            return first, None, sol
        t = time.perf_counter()
        sol = run()
        block(sol.ys)
        second = time.perf_counter() - t
    return first, second, sol


def _scipy_simulate(problem):
    import scipy.integrate

    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        p = problem.parameter_vector()
        f = jax.jit(lambda t, y: problem.rhs(t, y, p))
        jac = jax.jit(lambda t, y: problem.jacobian_values(t, y, p))
        pat = problem.pattern
        jac_sp = lambda t, y: sp.csr_matrix((np.asarray(jac(t, y)), pat.indices, pat.indptr), shape=(pat.n, pat.n))  # noqa: E731
        y = np.asarray(problem.spec.y0)
        f(0.0, jnp.asarray(y)).block_until_ready()
        jac(0.0, jnp.asarray(y)).block_until_ready()
        t = time.perf_counter()
        t0 = 0.0
        nsteps = 0
        for t_stop in (1.1, T_END):
            r = scipy.integrate.solve_ivp(lambda t, y: np.asarray(f(t, y)), (t0, t_stop), y, method="BDF",
                                          jac=jac_sp, **SIM_KW)  # fmt: skip
            if not r.success:
                raise RuntimeError(r.message)
            y, t0 = r.y[:, -1], t_stop
            nsteps += r.t.shape[0] - 1
        return time.perf_counter() - t, y, nsteps


def _kvaerno_simulate(problem, twice=True):
    import diffrax

    p = problem.parameter_vector()
    term = diffrax.ODETerm(lambda t, y, args: problem.rhs(t, y, args))
    ctrl = diffrax.PIDController(rtol=SIM_KW["rtol"], atol=SIM_KW["atol"], jump_ts=[1.1])

    @jax.jit
    def solve(y0, p):
        sol = diffrax.diffeqsolve(term, diffrax.Kvaerno5(), 0.0, T_END, 1e-4, y0, args=p, stepsize_controller=ctrl,
                                  saveat=diffrax.SaveAt(t1=True), max_steps=200_000)  # fmt: skip
        return sol.ys[-1], sol.stats["num_accepted_steps"]

    y0 = jnp.asarray(problem.spec.y0)
    t = time.perf_counter()
    y, steps = block(solve(y0, p))
    first = time.perf_counter() - t
    if not twice:
        return first, None, np.asarray(y), int(steps)
    t = time.perf_counter()
    y, steps = block(solve(y0, p))
    return first, time.perf_counter() - t, np.asarray(y), int(steps)


def section_simulate(res, args):
    cpu = jax.devices("cpu")[0]
    sizes = sorted(set(args.simulate) | set(args.kvaerno) | set(args.scipy))
    for n_grid in sizes:
        rec = {"problem": f"brusselator_2d N={n_grid}", "states": 2 * n_grid * n_grid, **SIM_KW, "t_end": T_END}
        spec = ds.examples.brusselator_2d(n_grid)
        gpu_t = None
        try:
            cu = spec.build(linear_solver=ds.linear.CuDSS())
            first, second, sol = _time_simulate(cu)
            gpu_t, y_ref = second, np.asarray(sol.ys[-1])
            rec.update(cudss_gpu_first_s=first, cudss_gpu_s=second, cudss_steps=int(sol.stats["n_steps"]),
                       cudss_status=int(sol.status))  # fmt: skip
            _cudss.release_cudss_memory()
        except Exception as err:
            rec["cudss_error"] = repr(err)[:1000]
        twice = n_grid < args.single_call_from  # slow peers at large N: one call, compilation included
        klu = None
        try:
            with jax.default_device(cpu):
                klu = spec.build(linear_solver=ds.linear.KLU())
            if n_grid not in args.klu:
                rec["klu_cpu_s"] = "not run (--klu)"
            elif elapsed() < args.budget_s:
                first, second, sol = _time_simulate(klu, cpu, twice)
                second = second if second is not None else first
                rec.update(klu_cpu_first_s=first, klu_cpu_s=second, klu_steps=int(sol.stats["n_steps"]),
                           klu_includes_compile=not twice)  # fmt: skip
                if gpu_t:
                    rec["klu_cpu_over_cudss_gpu"] = second / gpu_t
                    y_klu = np.asarray(sol.ys[-1])
                    rec["max_rel_diff_cudss_vs_klu"] = float(np.max(np.abs(y_ref - y_klu)) / np.max(np.abs(y_klu)))
            else:
                rec["klu_cpu_s"] = "skipped: budget"
        except Exception as err:
            rec["klu_error"] = repr(err)[:1000]
        if n_grid in args.scipy and klu is not None:
            if elapsed() < args.budget_s:
                try:
                    secs, y_sp, steps = _scipy_simulate(klu)
                    rec.update(scipy_bdf_cpu_s=secs, scipy_steps=steps)
                    if gpu_t:
                        rec["scipy_over_cudss_gpu"] = secs / gpu_t
                        rec["max_rel_diff_cudss_vs_scipy"] = float(np.max(np.abs(y_ref - y_sp)) / np.max(np.abs(y_sp)))
                except Exception as err:
                    rec["scipy_error"] = repr(err)[:1000]
            else:
                rec["scipy_bdf_cpu_s"] = "skipped: budget"
        if n_grid in args.kvaerno:
            if elapsed() < args.budget_s:
                try:
                    first, secs, y_kv, steps = _kvaerno_simulate(cu, twice)
                    secs = secs if secs is not None else first
                    rec.update(kvaerno5_gpu_first_s=first, kvaerno5_gpu_s=secs, kvaerno5_steps=steps,
                               kvaerno5_includes_compile=not twice)  # fmt: skip
                    if gpu_t:
                        rec["kvaerno5_over_cudss_gpu"] = secs / gpu_t
                        rec["max_rel_diff_cudss_vs_kvaerno5"] = float(np.max(np.abs(y_ref - y_kv)) / np.max(np.abs(y_kv)))
                except Exception as err:
                    rec["kvaerno5_error"] = repr(err)[:1000]
            else:
                rec["kvaerno5_gpu_s"] = "skipped: budget"
        res.add("simulate", rec)


# ---------------------------------------------------------------------------------------------------
# Table
# ---------------------------------------------------------------------------------------------------


def _fmt(x, unit="s"):
    if isinstance(x, (int, float)):
        if unit == "x":
            return f"{x:.1f}x" if x < 1e4 else f"{x:.2e}x"
        return f"{x * 1e3:.3g} ms" if x < 1 else f"{x:.3g} s"
    return "n/a" if x is None else str(x).split(":")[0]


def table(data) -> str:
    lines = ["## Refactorization + solve (one system, float64)", "",
             "| matrix | n | nnz | CuDSS (FFI) | C++ cuDSS | FFI / C++ | dense LU | dense / CuDSS | JAX spsolve | spsolve / CuDSS |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in data["linear"]:
        if "matrix" not in r:
            continue
        if "error" in r:
            lines.append(f"| {r['matrix']} | error: {r['error'][:80]} |")
            continue
        sa = r.get("standalone", {}).get("refactor_solve_median_s")
        lines.append(
            f"| {r['matrix']} | {r['n']} | {r['nnz']} | {_fmt(r.get('cudss_refactor_solve_s'))} | {_fmt(sa)} | "
            f"{_fmt(r.get('ffi_overhead_ratio'), 'x')} | {_fmt(r.get('dense_lu_solve_s'))} | {_fmt(r.get('dense_over_cudss'), 'x')} | "
            f"{_fmt(r.get('spsolve_s'))} | {_fmt(r.get('spsolve_over_cudss'), 'x')} |"
        )
    lines += ["", "## Uniform batch", "", "| systems x n | cuDSS uniform batch | loop of cuDSS calls | loop / batch | batched dense LU | dense / batch |",
              "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in data["batch"]:
        lines.append(
            f"| {r['systems']} x {r['n']} | {_fmt(r['ubatch_s'])} | {_fmt(r['loop_s'])} | {_fmt(r['loop_over_ubatch'], 'x')} | "
            f"{_fmt(r['dense_batched_lu_s'])} | {_fmt(r['dense_over_ubatch'], 'x')} |"
        )
    lines += ["", "## ds.simulate, Brusselator 2-D, rtol 1e-6, t in [0, 11.5] (second call: compiled)", "",
              "| N (states) | CuDSS on GPU | KLU on CPU | KLU / CuDSS | scipy BDF (CPU) | scipy / CuDSS | diffrax Kvaerno5 (GPU) | Kvaerno5 / CuDSS |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    star = lambda r, k: "*" if r.get(k) else ""  # noqa: E731
    for r in data["simulate"]:
        if "problem" not in r:
            continue
        lines.append(
            f"| {r['problem'].split('=')[-1]} ({r['states']}) | {_fmt(r.get('cudss_gpu_s', r.get('cudss_error')))} | "
            f"{_fmt(r.get('klu_cpu_s'))}{star(r, 'klu_includes_compile')} | {_fmt(r.get('klu_cpu_over_cudss_gpu'), 'x')} | "
            f"{_fmt(r.get('scipy_bdf_cpu_s'))} | {_fmt(r.get('scipy_over_cudss_gpu'), 'x')} | "
            f"{_fmt(r.get('kvaerno5_gpu_s'))}{star(r, 'kvaerno5_includes_compile')} | {_fmt(r.get('kvaerno5_over_cudss_gpu'), 'x')} |"
        )
    lines += ["", "\\* one call, compilation included (a few seconds of it)."]
    return "\n".join(lines)


def main(argv=None):
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sections", default="linear,batch,simulate")
    ap.add_argument("--brusselator", type=ints, default=[64, 128, 256])
    ap.add_argument("--grid3d", type=int, default=100, help="edge of the 3-D grid (100: 1e6 unknowns; 0: skip)")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--simulate", type=ints, default=[32, 64, 128])
    ap.add_argument("--kvaerno", type=ints, default=[32])
    ap.add_argument("--scipy", type=ints, default=[32, 64])
    ap.add_argument("--klu", type=ints, default=[32, 64, 128])
    ap.add_argument("--single-call-from", type=int, default=64,
                    help="from this N on, KLU and Kvaerno5 are called once (their time includes compilation)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="skip slow peers once this much time has passed")
    args = ap.parse_args(argv)
    if not ds.linear.has_cudss():
        print("cuDSS cannot run here:", _cudss.cudss_unavailable_reason())
        return 1
    _cudss.load_binding()
    res = Results(args)
    res.data["meta"]["cudss_version"] = _cudss.cudss_version()
    sections = args.sections.split(",")
    for name, fn in (("linear", section_linear), ("batch", section_batch), ("simulate", section_simulate)):
        if name in sections:
            try:
                fn(res, args)
            except Exception as err:
                res.add(name, {"error": repr(err)[:2000]})
    res.data["meta"]["counters"] = _cudss.cudss_counters()
    res.data["meta"]["total_s"] = elapsed()
    res.data["table"] = table(res.data)
    res.save()
    print(res.data["table"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
