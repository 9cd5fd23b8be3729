"""Objective + gradient throughput of a lowered study: chunked vs one experiment at a time, against
the same simulations by scipy's solve_ivp (BDF, no gradient) one experiment at a time.

    python benchmarks/bench_fit.py                 # 1, 100, 1000 experiments
    python benchmarks/bench_fit.py 1 100 1000 10000

A 20-species random mass-action network (``mass_action_network(20, 25)``), every species observed at
4 times, rtol 1e-6. Times are per evaluation after compilation (the median of 3). One-at-a-time
(``experiments_per_chunk=1``) and scipy are timed on at most 100 and 20 experiments and scaled linearly to N
(their cost is a sum of independent per-experiment costs); the JSON marks those rows
``extrapolated_from``. Writes ``benchmarks/results/bench_fit.json`` and prints a table.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("JAX_ENABLE_X64", "1")


def _median(fn, repeats=3):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main(sizes):
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np
    from scipy.integrate import solve_ivp

    import diffsoup as ds
    from diffsoup.examples import mass_action_network
    from diffsoup.inference import Gaussian, Parameter, SolverOptions

    net = mass_action_network(20, 25, seed=3)
    problem = net.to_spec(y0=np.ones(20)).build()
    truth = dict(net.parameters)
    times = np.array([0.2, 1.0, 3.0, 6.0])
    rng = np.random.default_rng(0)
    n_max = max(sizes)
    y0s = rng.uniform(0.2, 2.0, (n_max, 20))
    exps = [ds.Experiment(f"x{i}", times, np.ones((4, 20)), noise=Gaussian(0.05), y0=y0s[i]) for i in range(n_max)]
    params = [Parameter(k, v, v / 10, v * 10) for k, v in truth.items()]
    solver = SolverOptions(rtol=1e-6, atol=1e-9)
    pvec = np.asarray(problem.parameter_vector(truth))
    rhs = jax.jit(lambda t, y: problem.rhs(t, y, pvec))
    jac = jax.jit(jax.jacfwd(lambda y: problem.rhs(0.0, y, pvec)))

    def scipy_one(y0):
        solve_ivp(lambda t, y: np.asarray(rhs(t, y)), (0.0, times[-1]), y0, method="BDF", t_eval=times,
                  rtol=1e-6, atol=1e-9, jac=lambda t, y: np.asarray(jac(y)))  # fmt: skip

    n_sp = min(20, n_max)
    scipy_one(y0s[0])
    t_scipy_each = _median(lambda: [scipy_one(y) for y in y0s[:n_sp]], 1) / n_sp
    single_study = ds.Study(problem, exps[: min(100, n_max)], params)
    single = ds.lower(single_study, solver=solver, experiments_per_chunk=1)
    theta = single.nominal
    single.value_and_grad(theta)
    t_single_each = _median(lambda: single.value_and_grad(theta)) / len(single_study)
    rows = []
    for n in sizes:
        study = ds.Study(problem, exps[:n], params)
        low = ds.lower(study, solver=solver)
        start = time.perf_counter()
        low.value_and_grad(theta)
        first = time.perf_counter() - start
        t = _median(lambda: low.value_and_grad(theta))
        rows.append(dict(
            experiments=n, chunk=low.chunk_sizes["value_and_grad"][0], chunked_s=t, compile_and_first_s=first,
            one_at_a_time_s=t_single_each * n, scipy_bdf_s=t_scipy_each * n,
            chunked_exp_per_s=n / t, one_at_a_time_exp_per_s=1 / t_single_each, scipy_exp_per_s=1 / t_scipy_each,
            speedup_vs_one_at_a_time=t_single_each * n / t, ratio_vs_scipy=t_scipy_each * n / t,
            extrapolated_from={"one_at_a_time": len(single_study), "scipy_bdf": n_sp},
            scratch_bytes=low.scratch_bytes["value_and_grad"],
        ))  # fmt: skip
    head = (f"{'N':>6} {'chunk':>6} {'chunked s':>10} {'exp/s':>8} {'1-at-a-time exp/s':>18} "
            f"{'scipy BDF exp/s':>16} {'x vs 1-at-a-time':>17} {'x vs scipy':>11}")  # fmt: skip
    print(f"objective + gradient, {net!r}, {jax.devices()[0].platform.upper()}, {os.cpu_count()} cores")
    print(head)
    for r in rows:
        print(f"{r['experiments']:>6} {r['chunk']:>6} {r['chunked_s']:>10.3f} {r['chunked_exp_per_s']:>8.1f} "
              f"{r['one_at_a_time_exp_per_s']:>18.1f} {r['scipy_exp_per_s']:>16.1f} "
              f"{r['speedup_vs_one_at_a_time']:>17.1f} {r['ratio_vs_scipy']:>11.2f}")  # fmt: skip
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "bench_fit.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"network": repr(net), "platform": jax.devices()[0].platform, "cores": os.cpu_count(),
                   "note": "scipy BDF: simulation only (no gradient); diffsoup: objective + adjoint gradient",
                   "rows": rows}, f, indent=2)  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1, 100, 1000])
