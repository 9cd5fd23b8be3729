"""Sensitivities through the stiff solver: forward solve, forward sensitivities (``jax.jacfwd``
with ``adjoint=ds.ForwardMode()`` over all parameters) and the adjoint gradient (``jax.grad`` of a
scalar loss with the default ``ds.CheckpointAdjoint()``), next to diffrax ``Kvaerno5`` (forward
mode: ``diffrax.ForwardMode``; reverse: ``RecursiveCheckpointAdjoint`` with the same number of
checkpoints) where it runs in reasonable time.

Problems: ROBER (3 parameters, 16 outputs log-spaced in [1e-4, 1e11]), a random 20-species
mass-action network with 25 rate constants (``mass_action_network(20, 25)``, y0 = 1, 11 outputs
log-spaced in [1e-2, 1e3]) and the 2-D Brusselator at N = 32 and 64 (parameters A, B, alpha;
outputs at t = 3, 6, 9, 11.5; discontinuity at 1.1). Loss = sum(w * ys) with fixed random w.
diffrax runs on ROBER, the network, and the Brusselator at N = 8 only (dense LU: 450 s for one
forward solve at N = 32 on this machine; ``--diffrax-bruss-n`` to change).

Timing: every function is jitted and compiled ahead of time (``jit(f).lower(p).compile()``: that
is the compile time reported), then run ``--repeats`` times (more for calls under 1/3 s, up to a
second of calls or 25 runs); the median is reported. Ratios are
against the forward solve of the same solver in the same run. The gradient is checked against
the forward sensitivities contracted with w (relative difference reported).

Memory of the reverse sweep at 1x, 4x and 16x the steps with a fixed number of checkpoints (128):
ROBER by tightening rtol (diffsoup and diffrax; the network too with ``--memory-network``), the
Brusselator (N = 16, diffsoup) by lengthening the time span (t_end = 1.1 + k * 10.4, k = 1, 5,
21: about 1x, 4x, 16x the steps); ``max_steps`` scales with the steps. Two figures: the compiled gradient's
``memory_analysis()`` temp bytes, and the measured peak RSS growth of the process during the first
run of the compiled gradient (sampled every 2 ms, over the RSS just before it).

The gradient of the Brusselator at N = 32 is also timed with 1024 checkpoints (every step
recorded: no segment replays), which separates the replay cost from the adjoint steps' own cost.

Compile targets: first compile of simulate + gradient of the Brusselator (build, forward compile
and gradient compile, measured in a process where nothing else was compiled for that problem).

Run:  .venv/bin/python benchmarks/bench_sensitivity.py            (default, ~20 min on 2 busy cores)
      .venv/bin/python benchmarks/bench_sensitivity.py --quick    (no N = 64, no memory scaling)
Writes benchmarks/results/bench_sensitivity.json (or --out).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import traceback
from pathlib import Path

from _common import RESULTS, fmt, machine_info, markdown_table, median, repeats_for, write_json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import diffsoup as ds  # noqa: E402
from diffsoup.examples import brusselator_2d, mass_action_network, rober  # noqa: E402

CHECKPOINTS = 128


# ----------------------------------------------------------------------------------------------
# Measurement helpers
# ----------------------------------------------------------------------------------------------


class PeakRSS:
    """Samples the process RSS in a thread; ``peak - start`` is the growth during the block."""

    def __init__(self, interval=0.002):
        import psutil

        self.proc = psutil.Process()
        self.interval = interval

    def __enter__(self):
        self.start = self.proc.memory_info().rss
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def growth(self):
        return self.peak - self.start


def aot(fn, *args):
    """``(compiled, seconds)``: trace, lower and compile ``jit(fn)`` for ``args``."""
    t = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - t


def run_timed(compiled, args, repeats):
    """Median of at least ``repeats`` runs (more for quick calls: see ``_common.repeats_for``)."""
    times, out, count = [], None, repeats
    while len(times) < count:
        t = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t)
        if len(times) == 1:
            count = repeats_for(times[0], repeats)
    return median(times), times, out


def temp_bytes(compiled):
    try:
        ma = compiled.memory_analysis()
        return {"temp": int(ma.temp_size_in_bytes), "argument": int(ma.argument_size_in_bytes),
                "output": int(ma.output_size_in_bytes), "generated_code": int(ma.generated_code_size_in_bytes)}  # fmt: skip
    except Exception as err:  # noqa: BLE001
        return {"error": str(err)}


# ----------------------------------------------------------------------------------------------
# Problems
# ----------------------------------------------------------------------------------------------


def problem_cases(args):
    cases = [
        {"name": "ROBER", "spec": rober(), "t_eval": np.logspace(-4, 11, 16), "discs": (), "rtol": 1e-6,
         "atol_factor": 1e-4, "diffrax": True, "scale": ("rtol", (1e-6, 5e-10, 3e-12))},
        {"name": "mass-action 20x25", "spec": mass_action_network(20, 25).to_spec(y0=np.ones(20)),
         "t_eval": np.logspace(-2, 3, 11), "discs": (), "rtol": 1e-6, "atol_factor": 1e-4, "diffrax": True,
         "scale": ("rtol", (1e-6, 5e-9, 5e-11)) if args.memory_network else None},
    ]  # fmt: skip
    for n in args.bruss_n:
        cases.append({"name": f"Brusselator N={n}", "spec": brusselator_2d(n), "t_eval": np.array([3.0, 6.0, 9.0, 11.5]),
                      "discs": (1.1,), "rtol": 1e-6, "atol_factor": 1e-2, "diffrax": False, "linear_solver": ds.linear.KLU(),
                      "scale": ("span", (1, 5, 21)) if n == args.memory_bruss_n else None, "bruss": n})  # fmt: skip
    if args.memory and args.memory_bruss_n and args.memory_bruss_n not in args.bruss_n:
        n = args.memory_bruss_n
        cases.append({"name": f"Brusselator N={n}", "spec": brusselator_2d(n), "t_eval": np.array([3.0, 6.0, 9.0, 11.5]),
                      "discs": (1.1,), "rtol": 1e-6, "atol_factor": 1e-2, "diffrax": False, "linear_solver": ds.linear.KLU(),
                      "scale": ("span", (1, 5, 21)), "bruss": n, "memory_only": True})  # fmt: skip
    if args.diffrax and args.diffrax_bruss_n in args.bruss_n:
        next(c for c in cases if c.get("bruss") == args.diffrax_bruss_n)["diffrax"] = True
    elif args.diffrax and args.diffrax_bruss_n:
        n = args.diffrax_bruss_n
        cases.append({"name": f"Brusselator N={n}", "spec": brusselator_2d(n), "t_eval": np.array([3.0, 6.0, 9.0, 11.5]),
                      "discs": (1.1,), "rtol": 1e-6, "atol_factor": 1e-2, "diffrax": True, "linear_solver": ds.linear.KLU(),
                      "scale": None, "bruss": n})  # fmt: skip
    return cases


def diffsoup_fns(problem, t_eval, rtol, atol, discs, w, max_steps=100_000, checkpoints=CHECKPOINTS):
    common = dict(t_eval=jnp.asarray(t_eval), rtol=rtol, atol=atol, discontinuities=discs, max_steps=max_steps,
                  throw=False)  # fmt: skip

    def forward(p):
        sol = ds.simulate(problem, params=p, adjoint=ds.ForwardMode(), **common)
        return sol.ys, sol.status, sol.stats

    def ys_fwd(p):
        return ds.simulate(problem, params=p, adjoint=ds.ForwardMode(), **common).ys

    def loss(p):
        sol = ds.simulate(problem, params=p, adjoint=ds.CheckpointAdjoint(checkpoints=checkpoints), **common)
        return jnp.sum(w * sol.ys)

    return forward, jax.jacfwd(ys_fwd), jax.grad(loss)


def diffrax_fns(problem, t_eval, rtol, atol, discs, w, max_steps=100_000, checkpoints=CHECKPOINTS):
    import diffrax

    term = diffrax.ODETerm(lambda t, y, args: problem.rhs(t, y, args))
    controller = diffrax.PIDController(rtol=rtol, atol=atol)
    if discs:
        controller = diffrax.ClipStepSizeController(controller, jump_ts=list(discs))
    y0 = jnp.asarray(problem.spec.y0, jnp.float64)
    ts = jnp.asarray(t_eval)

    def solve(p, adjoint):
        return diffrax.diffeqsolve(term, diffrax.Kvaerno5(), 0.0, float(t_eval[-1]), None, y0, args=p,
                                   saveat=diffrax.SaveAt(ts=ts), stepsize_controller=controller,
                                   max_steps=max_steps, adjoint=adjoint)  # fmt: skip

    def forward(p):
        sol = solve(p, diffrax.RecursiveCheckpointAdjoint(checkpoints=checkpoints))
        status = jnp.where(sol.result == diffrax.RESULTS.successful, 0, 1)
        return sol.ys, status, {k: sol.stats[k] for k in ("num_steps", "num_accepted_steps")}

    def ys_fwd(p):
        return solve(p, diffrax.ForwardMode()).ys

    def loss(p):
        return jnp.sum(w * solve(p, diffrax.RecursiveCheckpointAdjoint(checkpoints=checkpoints)).ys)

    return forward, jax.jacfwd(ys_fwd), jax.grad(loss)


def measure_solver(label, fns, p, w, repeats, log):
    forward, jac, grad = fns
    row = {"solver": label}
    c_fwd, row["compile_forward_s"] = aot(forward, p)
    row["forward_s"], row["forward_all"], (ys, status, stats) = run_timed(c_fwd, (p,), repeats)
    row["status"] = int(status) if np.ndim(status) == 0 else status.tolist()
    row["stats"] = {k: int(v) for k, v in stats.items()}
    row["steps"] = row["stats"].get("n_steps", row["stats"].get("num_accepted_steps"))
    row["lu_forward"] = row["stats"].get("n_factor", row["stats"].get("num_steps"))
    log(f"    {label} forward {row['forward_s']:.4f} s (compile {row['compile_forward_s']:.1f} s), {row['steps']} steps")
    c_jac, row["compile_jacfwd_s"] = aot(jac, p)
    row["jacfwd_s"], row["jacfwd_all"], J = run_timed(c_jac, (p,), repeats)
    log(f"    {label} jacfwd {row['jacfwd_s']:.4f} s (compile {row['compile_jacfwd_s']:.1f} s)")
    c_grad, row["compile_grad_s"] = aot(grad, p)
    row["grad_s"], row["grad_all"], g = run_timed(c_grad, (p,), repeats)
    row["grad_memory"] = temp_bytes(c_grad)
    row["forward_memory"] = temp_bytes(c_fwd)
    log(f"    {label} grad {row['grad_s']:.4f} s (compile {row['compile_grad_s']:.1f} s)")
    g_fwd = np.einsum("mn,mnp->p", np.asarray(w), np.asarray(J))
    g = np.asarray(g)
    row["grad_vs_jacfwd_rel"] = float(np.max(np.abs(g - g_fwd)) / max(np.max(np.abs(g_fwd)), 1e-300))
    row["grad_finite"] = bool(np.all(np.isfinite(g)))
    row["jacfwd_over_forward"] = row["jacfwd_s"] / row["forward_s"]
    row["grad_over_forward"] = row["grad_s"] / row["forward_s"]
    return row


def memory_scaling(case, label, make_fns, p, log):
    """Reverse-sweep memory at 1x, 4x, 16x the steps, fixed checkpoints."""
    kind, values = case["scale"]
    out = []
    base_steps = None
    for k, v in enumerate(values):
        if kind == "rtol":
            rtol, t_eval = v, case["t_eval"]
        else:
            rtol = case["rtol"]
            t_end = 1.1 + v * 10.4
            t_eval = np.array([t_end / 4, t_end / 2, 3 * t_end / 4, t_end])
        atol = case["atol_factor"] * rtol
        factor = 4**k
        max_steps = int(case["_base_attempts"] * 4 * factor) if "_base_attempts" in case else 100_000
        forward, _, grad = make_fns(t_eval, rtol, atol, max_steps)
        c_fwd, _ = aot(forward, p)
        _, _, (_, status, stats) = run_timed(c_fwd, (p,), 1)
        stats = {kk: int(vv) for kk, vv in stats.items()}
        steps = stats.get("n_steps", stats.get("num_accepted_steps"))
        if base_steps is None:
            base_steps = steps
        c_grad, compile_s = aot(grad, p)
        mem = temp_bytes(c_grad)
        with PeakRSS() as rss:
            t = time.perf_counter()
            g = jax.block_until_ready(c_grad(p))
            grad_s = time.perf_counter() - t
        row = {"solver": label, "factor": factor, "rtol": rtol, "t_end": float(t_eval[-1]), "max_steps": max_steps,
               "steps": steps, "step_ratio": steps / base_steps, "temp_bytes": mem.get("temp"), "memory_analysis": mem,
               "rss_growth_bytes": rss.growth, "rss_before_bytes": rss.start, "grad_s": grad_s,
               "compile_grad_s": compile_s, "grad_finite": bool(np.all(np.isfinite(np.asarray(g))))}  # fmt: skip
        out.append(row)
        log(f"    memory {label} x{factor}: {steps} steps, temp {fmt(mem.get('temp'), ',')} B, "
            f"RSS +{rss.growth / 2**20:.1f} MiB, grad {grad_s:.2f} s")  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Brusselator N = 32 only, no memory scaling")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bruss-n", type=int, nargs="*", default=None, help="Brusselator sizes (default 32 64)")
    parser.add_argument("--memory-bruss-n", type=int, default=16, help="Brusselator N for the memory scaling")
    parser.add_argument("--memory-network", action="store_true", help="also scale the network's steps (6 compiles more)")
    parser.add_argument("--ckpt-sweep-n", type=int, default=32,
                        help="Brusselator N where the gradient is also timed with --ckpt-sweep-c checkpoints (0: none)")
    parser.add_argument("--ckpt-sweep-c", type=int, default=1024)
    parser.add_argument("--diffrax-bruss-n", type=int, default=8, help="Brusselator N for diffrax (0: none)")
    parser.add_argument("--no-diffrax", dest="diffrax", action="store_false")
    parser.add_argument("--no-memory", dest="memory", action="store_false")
    parser.add_argument("--out", default=str(RESULTS / "bench_sensitivity.json"))
    args = parser.parse_args()
    if args.bruss_n is None:
        args.bruss_n = [32] if args.quick else [32, 64]
    if args.quick:
        args.memory = False

    info = machine_info()
    started = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - started:7.1f} s] {msg}", flush=True)

    rows, memory_rows, compile_rows = [], [], []
    rng = np.random.default_rng(0)
    for case in problem_cases(args):
        log(case["name"])
        t = time.perf_counter()
        problem = case["spec"].build(linear_solver=case.get("linear_solver"))
        build_s = time.perf_counter() - t
        p = problem.parameter_vector(None)
        w = jnp.asarray(rng.normal(size=(len(case["t_eval"]), problem.n_states)))
        atol = case["atol_factor"] * case["rtol"]
        base = {"problem": case["name"], "n": problem.n_states, "n_params": int(p.shape[0]), "rtol": case["rtol"],
                "atol": atol, "linear_solver": problem.linear_solver.name, "build_s": build_s,
                "n_outputs": len(case["t_eval"])}  # fmt: skip

        solvers = [("diffsoup", lambda te, rt, at, ms: diffsoup_fns(problem, te, rt, at, case["discs"], w, ms))]
        if args.diffrax and case["diffrax"]:
            solvers.append(("diffrax Kvaerno5", lambda te, rt, at, ms: diffrax_fns(problem, te, rt, at, case["discs"], w, ms)))
        for label, make in solvers:
            if case.get("memory_only"):
                # only the forward step count is needed (to scale max_steps)
                forward = make(case["t_eval"], case["rtol"], atol, 100_000)[0]
                c_fwd, _ = aot(forward, p)
                row = {"lu_forward": int(c_fwd(p)[2]["n_factor"])}
            else:
                try:
                    row = dict(base, **measure_solver(label, make(case["t_eval"], case["rtol"], atol, 100_000), p, w,
                                                       args.repeats, log))  # fmt: skip
                except Exception as err:  # noqa: BLE001 - a peer failing is a result
                    row = dict(base, solver=label, error=f"{type(err).__name__}: {err}")
                    log("    failed: " + traceback.format_exc(limit=3))
                rows.append(row)
            if label == "diffsoup" and case.get("bruss") == args.ckpt_sweep_n and "error" not in row:
                c = args.ckpt_sweep_c
                grad = diffsoup_fns(problem, case["t_eval"], case["rtol"], atol, case["discs"], w, checkpoints=c)[2]
                c_grad, comp = aot(grad, p)
                g_s, g_all, _ = run_timed(c_grad, (p,), args.repeats)
                rows.append(dict(base, solver=f"diffsoup, {c} checkpoints (grad only)", forward_s=row["forward_s"],
                                 grad_s=g_s, grad_all=g_all, compile_grad_s=comp, grad_over_forward=g_s / row["forward_s"],
                                 grad_memory=temp_bytes(c_grad), steps=row["steps"], checkpoints=c))  # fmt: skip
                log(f"    diffsoup grad with {c} checkpoints {g_s:.4f} s (compile {comp:.1f} s)")
            if label == "diffsoup" and case.get("bruss") and not case.get("memory_only") and "error" not in row:
                compile_rows.append({"problem": case["name"], "build_s": build_s,
                                     "compile_forward_s": row["compile_forward_s"],
                                     "compile_grad_s": row["compile_grad_s"],
                                     "first_compile_simulate_plus_grad_s": row["compile_forward_s"] + row["compile_grad_s"],
                                     "with_build_s": build_s + row["compile_forward_s"] + row["compile_grad_s"]})  # fmt: skip
            if args.memory and case.get("scale") and "error" not in row:
                case["_base_attempts"] = row["lu_forward"]
                try:
                    memory_rows += [dict(base, **r) for r in memory_scaling(case, label, make, p, log)]
                except Exception as err:  # noqa: BLE001
                    memory_rows.append(dict(base, solver=label, error=f"{type(err).__name__}: {err}"))
                    log("    memory scaling failed: " + traceback.format_exc(limit=3))

    info["load_average_at_end"] = os.getloadavg()
    info["total_seconds"] = time.perf_counter() - started

    # ---- tables ----
    headers = ["problem", "n", "p", "solver", "forward [s]", "jacfwd [s]", "grad [s]", "jacfwd / fwd", "grad / fwd",
               "compile fwd + jacfwd + grad [s]", "steps", "grad temp"]  # fmt: skip
    table = []
    for r in rows:
        if "error" in r:
            table.append([r["problem"], r["n"], r["n_params"], r["solver"], "failed"] + [""] * 7)
            continue
        comp = " + ".join(fmt(r.get(k), ".1f") for k in ("compile_forward_s", "compile_jacfwd_s", "compile_grad_s"))
        jr = r.get("jacfwd_over_forward")
        table.append([r["problem"], r["n"], r["n_params"], r["solver"], fmt(r["forward_s"], ".3g"), fmt(r.get("jacfwd_s"), ".3g"),
                      fmt(r["grad_s"], ".3g"), (fmt(jr, ".2f") + "x") if jr else "–", fmt(r["grad_over_forward"], ".2f") + "x",
                      comp, r["steps"], f"{r['grad_memory'].get('temp', 0) / 2**20:.1f} MiB"])  # fmt: skip
    md = markdown_table(headers, table)
    mheaders = ["problem", "solver", "steps (x)", "rtol", "t_end", "grad temp bytes", "RSS growth", "grad [s]"]
    mtable = []
    for r in memory_rows:
        if "error" in r:
            mtable.append([r["problem"], r["solver"], "failed", "", "", "", "", ""])
            continue
        mtable.append([r["problem"], r["solver"], f"{r['steps']} ({r['step_ratio']:.1f}x)", f"{r['rtol']:g}", f"{r['t_end']:g}",
                       f"{r['temp_bytes']:,}" if r["temp_bytes"] is not None else "–",
                       f"{r['rss_growth_bytes'] / 2**20:.1f} MiB", fmt(r["grad_s"], ".3g")])  # fmt: skip
    mmd = markdown_table(mheaders, mtable)

    # ---- targets ----
    targets = {}
    grad_ratios = {r["problem"]: r["grad_over_forward"] for r in rows if r["solver"] == "diffsoup" and "error" not in r}
    for r in rows:
        if r["solver"].startswith("diffrax") and "error" not in r:
            r["grad_vs_diffsoup_grad"] = r["grad_s"] / next(
                x["grad_s"] for x in rows if x["problem"] == r["problem"] and x["solver"] == "diffsoup")
            r["forward_vs_diffsoup_forward"] = r["forward_s"] / next(
                x["forward_s"] for x in rows if x["problem"] == r["problem"] and x["solver"] == "diffsoup")
    targets["adjoint_grad_le_3x_forward"] = {"ratios": grad_ratios, "met": bool(grad_ratios) and all(v <= 3.0 for v in grad_ratios.values())}
    mem_ratio = {}
    for prob in {r["problem"] for r in memory_rows if r.get("solver") == "diffsoup" and "error" not in r}:
        rs = sorted((r for r in memory_rows if r["problem"] == prob and r["solver"] == "diffsoup" and "error" not in r),
                    key=lambda r: r["factor"])  # fmt: skip
        if len(rs) >= 2:
            one, last = rs[0], rs[-1]
            mem_ratio[prob] = {"temp_ratio": last["temp_bytes"] / one["temp_bytes"] if one["temp_bytes"] else None,
                               "rss_growth_1x_MiB": one["rss_growth_bytes"] / 2**20,
                               "rss_growth_16x_MiB": last["rss_growth_bytes"] / 2**20,
                               "step_ratio": last["step_ratio"]}  # fmt: skip
    targets["reverse_memory_16x_lt_2x"] = {
        "by_problem": mem_ratio,
        "met_compiled": bool(mem_ratio) and all((m["temp_ratio"] or 0) < 2.0 for m in mem_ratio.values()),
        "note": "compiled temp bytes cannot depend on the run's step count; the RSS growth is the measured check",
    }
    targets["bruss_compile_lt_20s"] = {"rows": compile_rows,
                                       "met": bool(compile_rows) and all(c["first_compile_simulate_plus_grad_s"] < 20 for c in compile_rows)}  # fmt: skip

    print()
    print(md)
    print()
    print(mmd)
    print()
    for c in compile_rows:
        print(f"compile {c['problem']}: build {c['build_s']:.1f} s, simulate {c['compile_forward_s']:.1f} s + gradient "
              f"{c['compile_grad_s']:.1f} s = {c['first_compile_simulate_plus_grad_s']:.1f} s (target < 20 s)")  # fmt: skip
    print(f"target grad <= 3x forward: {'MET' if targets['adjoint_grad_le_3x_forward']['met'] else 'MISSED'} "
          + ", ".join(f"{k}: {v:.2f}x" for k, v in grad_ratios.items()))
    for prob, m in mem_ratio.items():
        print(f"reverse memory {prob}: steps x{m['step_ratio']:.1f}: temp ratio {fmt(m['temp_ratio'], '.3f')}, "
              f"RSS growth {m['rss_growth_1x_MiB']:.1f} -> {m['rss_growth_16x_MiB']:.1f} MiB")  # fmt: skip
    print(f"machine: {info['cpu_count']} CPUs ({info['cpu']}), load average {info['load_average_at_start']} -> "
          f"{info['load_average_at_end']}; total {info['total_seconds']:.0f} s")  # fmt: skip
    write_json(Path(args.out), {"benchmark": "bench_sensitivity", "machine": info, "args": vars(args), "rows": rows,
                                "memory_scaling": memory_rows, "compile": compile_rows, "targets": targets,
                                "table_markdown": md, "memory_table_markdown": mmd})  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
