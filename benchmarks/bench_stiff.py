"""Stiff forward solves: diffsoup (Rodas5P and BDF; KLU, and dense LU where n is small) against
scipy ``solve_ivp`` BDF with the exact sparse Jacobian, scipy Radau, and diffrax ``Kvaerno5``.

Problems: ROBER to t = 1e11 (atol = 1e-4 rtol, as in the Test Set) and the 2-D Brusselator
(2 N^2 states, t in [0, 11.5], forcing on at t = 1.1: a discontinuity every solver steps to;
scipy restarts there, diffrax clips its steps to it through ``jump_ts``).

Every figure is measured in this run: wall time is the median of ``--repeats`` steady-state calls
(more for calls under 1/3 s, up to a second of calls or 25 calls); compile time is given
separately for diffsoup and diffrax, twice: the first call minus that median (noisy where a call
lasts seconds on a busy machine) and an ahead-of-time ``jit(...).lower(...).compile()`` of the same
solve (no run),
steps (accepted), LU factorizations (scipy's ``nlu``; diffsoup's ``n_factor``; diffrax's Kvaerno5
factors once per step attempt, so its count is its attempts), and accuracy as significant correct
digits (scd, Test Set definition: -log10 of the largest relative error over all states) against the
Test Set reference for ROBER and, for the Brusselator, scipy BDF at rtol 1e-12 (atol 1e-14; it
agrees with diffsoup at rtol 1e-12 to 8.6 digits at N = 32). "vs BDF" is T(BDF) / T(solver): above
1 the solver is faster than scipy BDF with a sparse Jacobian.

Defaults: ROBER at rtol 1e-6 and 1e-10, the Brusselator N = 16 (1e-6), N = 32 (1e-6, 1e-8, 1e-10),
N = 64 (1e-6, 1e-8) (N = 128 at 1e-6 and 1e-8 with ``--large``); ``--only`` picks cases,
``--methods`` the diffsoup methods; Radau and diffrax at N <= 16 only (Radau took 224 s at N = 32, rtol 1e-6; diffrax's
dense LU 450 s at N = 32): raise ``--radau-max-n`` / ``--diffrax-max-n`` to run them further.

Run:  .venv/bin/python benchmarks/bench_stiff.py              (default, ~10-15 min on 2 cores)
      .venv/bin/python benchmarks/bench_stiff.py --large      (adds N = 128)
      .venv/bin/python benchmarks/bench_stiff.py --quick      (ROBER and N = 16 only, a smoke run)
      .venv/bin/python benchmarks/bench_stiff.py --only Brusselator:64:1e-6 ROBER:1e-10 --methods BDF
Writes benchmarks/results/bench_stiff.json (or --out). The Brusselator reference solutions are
cached in ~/.cache/diffsoup-bench (``--no-ref-cache`` recomputes them).
"""

from __future__ import annotations

import argparse
import os
import time
import traceback
from pathlib import Path

from _common import (  # noqa: E402  (sets up sys.path and x64)
    RESULTS,
    aot_compile_seconds,
    block,
    compile_seconds,
    diffrax_solver,
    fmt,
    jitted_fns,
    machine_info,
    markdown_table,
    median,
    scipy_solve,
    timed,
    write_json,
)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import diffsoup as ds  # noqa: E402
from diffsoup.examples import ROBER_REFERENCE, brusselator_2d, rober, scd  # noqa: E402

BRUSS_T_END = 11.5
BRUSS_DISC = 1.1
REF_RTOL = 1e-12


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "diffsoup-bench"


def brusselator_reference(n, f, jac, pattern, y0, use_cache=True):
    """scipy BDF at rtol 1e-12, atol 1e-14 (restarted at the discontinuity); cached on disk."""
    path = cache_dir() / f"brusselator_N{n}_bdf_rtol{REF_RTOL:g}.npy"
    if use_cache and path.exists():
        return np.load(path), {"method": "scipy BDF", "rtol": REF_RTOL, "atol": 1e-14, "cached": True}
    t = time.perf_counter()
    y, stats = scipy_solve(f, jac, pattern, y0, [(0.0, BRUSS_DISC), (BRUSS_DISC, BRUSS_T_END)], "BDF", REF_RTOL, 1e-14)
    info = {"method": "scipy BDF", "rtol": REF_RTOL, "atol": 1e-14, "cached": False,
            "seconds": time.perf_counter() - t, "steps": stats["n_steps"], "nlu": stats["nlu"]}  # fmt: skip
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, y)
    return y, info


def run_case(case, args, log):
    """All solvers on one (problem, n, rtol). Returns a list of row dicts."""
    name, n_grid, rtol = case["problem"], case.get("N"), case["rtol"]
    rows = []
    if name == "ROBER":
        spec = rober()
        atol = 1e-4 * rtol
        t_end, discs = float(ROBER_REFERENCE["t"]), ()
        y_ref = np.asarray(ROBER_REFERENCE["y"])
        ref_info = {"method": "Test Set for IVP Solvers (RADAU, rtol 1.1e-18)"}
    else:
        spec = brusselator_2d(n_grid)
        atol = 1e-2 * rtol
        t_end, discs = BRUSS_T_END, (BRUSS_DISC,)
        y_ref, ref_info = None, None
    pieces = [(0.0, t_end)] if not discs else [(0.0, discs[0]), (discs[0], t_end)]

    t = time.perf_counter()
    klu_problem = spec.build(linear_solver=ds.linear.KLU())
    build_klu = time.perf_counter() - t
    n = klu_problem.n_states
    f, jac, pattern = jitted_fns(klu_problem)
    y0 = np.asarray(spec.y0, float)
    if y_ref is None:
        t = time.perf_counter()
        y_ref, ref_info = brusselator_reference(n_grid, f, jac, pattern, y0, use_cache=not args.no_ref_cache)
        log(f"  reference ({ref_info}) in {time.perf_counter() - t:.1f} s")

    base = {"problem": name if name == "ROBER" else "Brusselator 2-D", "N": n_grid, "n": n, "nnz": klu_problem.pattern.nnz,
            "rtol": rtol, "atol": atol, "reference": ref_info}  # fmt: skip

    # --- diffsoup ---------------------------------------------------------------------------
    problems = [("KLU", klu_problem, build_klu)]
    if n <= args.dense_max_n:
        t = time.perf_counter()
        dense_problem = spec.build(linear_solver=ds.linear.Dense())
        problems.append(("Dense", dense_problem, time.perf_counter() - t))
    methods = {"Rodas5P": ds.Rodas5P(), "BDF": ds.BDF()}
    solvers = [(f"diffsoup {m} {lin}" if m != "Rodas5P" else f"diffsoup {lin}", methods[m], problem, build_s)
               for m in args.methods for lin, problem, build_s in problems]  # fmt: skip
    for label, method, problem, build_s in solvers:

        def call(problem=problem, method=method):
            sol = ds.simulate(problem, t_eval=[t_end], rtol=rtol, atol=atol, discontinuities=discs, method=method,
                              adjoint=ds.ForwardMode(), max_steps=200_000)  # fmt: skip
            block(sol.ys)
            return sol

        first, steady, sol = timed(call, args.repeats)
        st = {k: int(v) for k, v in sol.stats.items()}
        p_vec = problem.parameter_vector(None)
        aot_s = aot_compile_seconds(
            lambda y0_, p_, problem=problem, method=method: ds.simulate(
                problem, y0=y0_, t_eval=[t_end], params=p_, rtol=rtol, atol=atol, discontinuities=discs, method=method,
                adjoint=ds.ForwardMode(), throw=False, max_steps=200_000).ys,
            jnp.asarray(y0), p_vec)  # fmt: skip
        row = dict(base, solver=label, seconds=median(steady), seconds_all=steady, first_call_seconds=first,
                   compile_seconds=compile_seconds(first, steady), compile_aot_seconds=aot_s, build_seconds=build_s,
                   steps=st["n_steps"],
                   rejected=st["n_rejected"], lu=st["n_factor"], jac_evals=st["n_jac"], rhs_evals=st["n_rhs"],
                   status=int(sol.status), scd=scd(np.asarray(sol.ys[-1]), y_ref), stats=st)  # fmt: skip
        rows.append(row)
        log(f"  {label}: {row['seconds']:.3f} s (compile {row['compile_seconds']:.1f} s, AOT {aot_s:.1f} s), {st['n_steps']} steps, "
            f"{st['n_factor']} LU, {st['n_solves']} solves, scd {row['scd']:.2f}")  # fmt: skip

    # --- scipy ------------------------------------------------------------------------------
    methods = ["BDF"]
    if n_grid is None or n_grid <= args.radau_max_n:
        methods.append("Radau")
    for method in methods:
        _, steady, (y, st) = timed(lambda m=method: scipy_solve(f, jac, pattern, y0, pieces, m, rtol, atol),
                                   args.repeats, first=False)  # fmt: skip
        row = dict(base, solver=f"scipy {method} (sparse J)", seconds=median(steady), seconds_all=steady,
                   compile_seconds=None, steps=st["n_steps"], rejected=None, lu=st["nlu"], jac_evals=st["njev"],
                   rhs_evals=st["nfev"], status=st["status"], scd=scd(y, y_ref), stats=st)  # fmt: skip
        rows.append(row)
        log(f"  scipy {method}: {row['seconds']:.3f} s, {st['n_steps']} steps, {st['nlu']} LU, scd {row['scd']:.2f}")

    # --- diffrax ----------------------------------------------------------------------------
    if args.diffrax and (n_grid is None or n_grid <= args.diffrax_max_n) and case.get("diffrax", True):
        try:
            solve = jax.jit(diffrax_solver(klu_problem, 0.0, t_end, rtol, atol, jump_ts=discs,
                                           max_steps=args.diffrax_max_steps))  # fmt: skip
            p = klu_problem.parameter_vector(None)
            y0j = jnp.asarray(y0)

            def dcall():
                return block(solve(y0j, p))

            first, steady, (y, st, result) = timed(dcall, args.repeats)
            st = {k: int(v) for k, v in st.items()}
            aot_s = aot_compile_seconds(diffrax_solver(klu_problem, 0.0, t_end, rtol, atol, jump_ts=discs,
                                                       max_steps=args.diffrax_max_steps), y0j, p)  # fmt: skip
            row = dict(base, solver="diffrax Kvaerno5 (dense LU)", seconds=median(steady), seconds_all=steady,
                       first_call_seconds=first, compile_seconds=compile_seconds(first, steady),
                       compile_aot_seconds=aot_s, steps=st["num_accepted_steps"], rejected=st["num_rejected_steps"], lu=st["num_steps"],
                       lu_note="one LU per step attempt (Kvaerno5 factors at its 2nd stage)",
                       status=0 if bool(result) else 1, scd=scd(np.asarray(y), y_ref), stats=st)  # fmt: skip
            rows.append(row)
            log(f"  diffrax: {row['seconds']:.3f} s (compile {row['compile_seconds']:.1f} s, AOT {aot_s:.1f} s), {row['steps']} steps, "
                f"scd {row['scd']:.2f}")  # fmt: skip
        except Exception as err:  # noqa: BLE001 - a peer failing is a result, not a crash
            rows.append(dict(base, solver="diffrax Kvaerno5 (dense LU)", error=f"{type(err).__name__}: {err}"))
            log("  diffrax failed: " + traceback.format_exc(limit=2))

    bdf = next(r for r in rows if r["solver"].startswith("scipy BDF"))
    for r in rows:
        if "seconds" in r:
            r["speedup_vs_bdf"] = bdf["seconds"] / r["seconds"]
            r["scd_minus_bdf"] = r["scd"] - bdf["scd"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true", help="add the Brusselator at N = 128")
    parser.add_argument("--quick", action="store_true", help="ROBER and N = 16 only")
    parser.add_argument("--repeats", type=int, default=3, help="steady-state repeats (median reported)")
    parser.add_argument("--radau-max-n", type=int, default=16, help="largest Brusselator N for scipy Radau")
    parser.add_argument("--diffrax-max-n", type=int, default=16, help="largest Brusselator N for diffrax")
    parser.add_argument("--diffrax-max-steps", type=int, default=100_000)
    parser.add_argument("--no-diffrax", dest="diffrax", action="store_false")
    parser.add_argument("--dense-max-n", type=int, default=600, help="largest state count for diffsoup Dense")
    parser.add_argument("--no-ref-cache", action="store_true", help="recompute the Brusselator references")
    parser.add_argument("--methods", nargs="+", default=["Rodas5P", "BDF"], choices=["Rodas5P", "BDF"],
                        help="diffsoup methods to run")  # fmt: skip
    parser.add_argument("--only", nargs="+", default=None,
                        help="cases to run, as PROBLEM:N:RTOL or ROBER:RTOL (e.g. Brusselator:64:1e-6 ROBER:1e-10)")  # fmt: skip
    parser.add_argument("--out", default=str(RESULTS / "bench_stiff.json"))
    args = parser.parse_args()

    cases = [{"problem": "ROBER", "rtol": 1e-6}, {"problem": "ROBER", "rtol": 1e-10},
             {"problem": "Brusselator", "N": 16, "rtol": 1e-6}]  # fmt: skip
    if not args.quick:
        cases += [{"problem": "Brusselator", "N": 32, "rtol": 1e-6}, {"problem": "Brusselator", "N": 32, "rtol": 1e-8},
                  {"problem": "Brusselator", "N": 32, "rtol": 1e-10}, {"problem": "Brusselator", "N": 64, "rtol": 1e-6},
                  {"problem": "Brusselator", "N": 64, "rtol": 1e-8}]  # fmt: skip
    if args.large:
        cases += [{"problem": "Brusselator", "N": 128, "rtol": 1e-6}, {"problem": "Brusselator", "N": 128, "rtol": 1e-8}]
    if args.only:
        cases = []
        for item in args.only:
            parts = item.split(":")
            if parts[0] == "ROBER":
                cases.append({"problem": "ROBER", "rtol": float(parts[1])})
            else:
                cases.append({"problem": "Brusselator", "N": int(parts[1]), "rtol": float(parts[2])})

    info = machine_info()
    started = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - started:7.1f} s] {msg}", flush=True)

    rows = []
    for case in cases:
        log(f"{case}")
        rows += run_case(case, args, log)
    info["load_average_at_end"] = os.getloadavg()
    info["total_seconds"] = time.perf_counter() - started

    headers = ["problem", "n", "rtol", "solver", "time [s]", "compile [s] (1st - steady / AOT)", "steps (rej.)", "LU",
               "scd", "vs BDF"]  # fmt: skip
    table = []
    for r in rows:
        size = f"{r['n']}" if r["N"] is None else f"{r['n']} (N={r['N']})"
        if "error" in r:
            table.append([r["problem"], size, f"{r['rtol']:g}", r["solver"], "failed", "", "", "", "", ""])
            continue
        steps = f"{r['steps']}" + (f" ({r['rejected']})" if r.get("rejected") is not None else "")
        table.append([r["problem"], size, f"{r['rtol']:g}", r["solver"], fmt(r["seconds"], ".3g"),
                      (f"{r['compile_seconds']:.1f} / {r['compile_aot_seconds']:.1f}" if r.get("compile_seconds") is not None
                       else "–"), steps, r["lu"], fmt(r["scd"], ".2f"),
                      fmt(r["speedup_vs_bdf"], ".2f") + "x"])  # fmt: skip
    md = markdown_table(headers, table)

    targets = []
    for label in ("diffsoup KLU", "diffsoup BDF KLU"):
        for big in (64, 128):
            ours = [r for r in rows if r["N"] == big and r["rtol"] == 1e-6 and r["solver"] == label and "seconds" in r]
            peer = [r for r in rows if r["N"] == big and r["rtol"] == 1e-6 and r["solver"].startswith("scipy BDF")]
            if ours and peer:
                speedup, dscd = ours[0]["speedup_vs_bdf"], ours[0]["scd"] - peer[0]["scd"]
                targets.append({"description": f"Brusselator N={big}, rtol 1e-6: {label} >= 3x faster than scipy BDF "
                                               "(sparse J) at equal or better accuracy (scd)",  # fmt: skip
                                "speedup_vs_bdf": speedup, "diffsoup_scd": ours[0]["scd"], "bdf_scd": peer[0]["scd"],
                                "lu": ours[0]["lu"], "bdf_lu": peer[0]["lu"],
                                "met": bool(speedup >= 3.0 and dscd >= 0.0)})  # fmt: skip
    bdf64 = [r for r in rows if r["N"] == 64 and r["rtol"] == 1e-6 and r["solver"] == "diffsoup BDF KLU" and "lu" in r]
    if bdf64:
        targets.append({"description": "Brusselator N=64, rtol 1e-6: diffsoup BDF KLU at most 40 factorizations",
                        "lu": bdf64[0]["lu"], "met": bool(bdf64[0]["lu"] <= 40)})  # fmt: skip
    rober10 = [r for r in rows if r["problem"] == "ROBER" and r["rtol"] == 1e-10 and r["solver"].startswith("diffsoup BDF")
               and "scd" in r]  # fmt: skip
    if rober10:
        targets.append({"description": "ROBER rtol 1e-10, atol 1e-14: diffsoup BDF at least 7 significant digits",
                        "scd": rober10[0]["scd"], "met": bool(rober10[0]["scd"] >= 7.0)})  # fmt: skip
    target = targets[0] if targets else None
    print()
    print(md)
    print()
    print(f"machine: {info['cpu_count']} CPUs ({info['cpu']}), load average {info['load_average_at_start']} -> "
          f"{info['load_average_at_end']}; total {info['total_seconds']:.0f} s")  # fmt: skip
    for t in targets:
        numbers = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in t.items()
                            if k not in ("description", "met"))  # fmt: skip
        print(f"target: {t['description']}: {numbers} -> {'MET' if t['met'] else 'MISSED'}")
    write_json(Path(args.out), {"benchmark": "bench_stiff", "machine": info, "args": vars(args), "rows": rows,
                                "target": target, "targets": targets, "table_markdown": md})  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
