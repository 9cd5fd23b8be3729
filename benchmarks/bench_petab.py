"""PEtab problems: import, first evaluation (compile) and per-call times of diffsoup's objective,
next to AMICI measured in the same run on the same problems at the same tolerances.

Per model (the five problems of ``tests/data/petab``), at rtol = atol = 1e-8 (AMICI's benchmark
setting, ``PetabProblem.solver``):

* diffsoup: ``ds.petab.load`` with a cold code cache (tables, lint, SBML and formulas to JAX), then
  with a warm one; first call and per-call median of ``value`` (negative log-likelihood),
  ``value_and_grad`` by the checkpointed adjoint, ``value_and_grad`` by forward sensitivities
  (``gradient="forward"``) and ``residuals_and_jacobian`` (forward sensitivities); the first call
  includes tracing and compiling that mode's program. "import + compile" is the cold import plus
  the first calls of value, adjoint gradient and residuals + Jacobian (the issue's three modes).
* AMICI, in a subprocess of the interpreter that has it (``--amici-python``; default: this
  interpreter when ``amici`` is importable here, else ``/work/amici-venv/bin/python`` when it
  exists; else its columns say "not installed"): ``import_petab_problem`` with the model extension
  compiled into a temporary folder ("build"), and per-call medians without sensitivities, with
  first-order forward sensitivities and with the adjoint (``_amici_petab.py`` says exactly what is
  timed). Two AMICI times per mode: "solve", ``run_simulations`` on ready ``ExpData`` (the C++
  solver's call from Python: the bar the ratios are taken against), and "objective",
  ``simulate_petab`` with ready ``ExpData`` and parameter mapping (parameters filled in and the
  gradient gathered over the problem's parameters in Python on top, as a PEtab objective does).
* checks: AMICI's log-likelihood at the nominal point beside ours, and the largest difference of
  the gradients (ours by the adjoint, AMICI's by forward sensitivities), relative to the gradient's
  largest entry.

Every time is taken on two clocks: wall-clock, and the CPU time of the process (all its threads;
for AMICI's build, its compiler processes too). On a machine shared with other work (this one has
2 cores and often a load of 10) wall-clock times stretch with the load while CPU times barely
move, so the targets are judged on CPU time; both are in the tables and the JSON.

Ratios are diffsoup / AMICI (below 1: diffsoup faster). Targets (issue 19): value and adjoint
gradient <= 1 x AMICI, forward sensitivities <= 1.5 x, adjoint gradient <= 3 x diffsoup's value,
import + compile of the three modes <= AMICI's import + build.

    python benchmarks/bench_petab.py [--models Boehm Bruno ...] [--repeats 5] [--amici-python PATH]

Writes ``benchmarks/results/bench_petab.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import RESULTS, fmt, machine_info, markdown_table, median, repeats_for, write_json

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "tests" / "data" / "petab"
MODELS = ["Boehm_JProteomeRes2014", "Bruno_JExpBot2016", "Fujita_SciSignal2010", "Brannmark_JBC2010", "Weber_BMC2015"]
RTOL = ATOL = 1e-8
# Where this project's machines keep AMICI when diffsoup's environment does not have it.
AMICI_VENV_PYTHON = Path("/work/amici-venv/bin/python")
NOT_INSTALLED = "not installed"
# diffsoup mode -> (AMICI mode, target ratio diffsoup / AMICI)
TARGETS = {"value": ("value", 1.0), "adjoint": ("adjoint_grad", 1.0), "forward_grad": ("forward_grad", 1.5),
           "forward_jacobian": ("forward_grad", 1.5)}  # fmt: skip
ADJOINT_OVER_VALUE_TARGET = 3.0
COMPILED_MODES = ("value", "adjoint", "forward_jacobian")  # "import + compile of all three modes"


def _short(name: str) -> str:
    return name.split("_")[0]


def default_amici_python() -> str | None:
    if importlib.util.find_spec("amici") is not None:
        return sys.executable
    return str(AMICI_VENV_PYTHON) if AMICI_VENV_PYTHON.exists() else None


def timed_cpu(fn, repeats: int):
    """``_common.timed`` with CPU time too: ``(first wall s, first CPU s, [wall s], [CPU s], result)``.
    On a machine shared with other work the process's CPU time (all its threads) is the steadier
    clock; wall time is what a user of an idle machine would see."""
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    first, first_cpu = time.perf_counter() - t, time.process_time() - c
    wall, cpu = [], []
    count = repeats
    while len(wall) < count:
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        if len(wall) == 1:
            count = repeats_for(wall[0], repeats)
    return first, first_cpu, wall, cpu, out


def bench_diffsoup(name: str, repeats: int) -> dict:
    import warnings

    import diffsoup as ds

    yaml = DATA / name / f"{name}.yaml"
    out: dict = {}
    with tempfile.TemporaryDirectory() as cache, warnings.catch_warnings():
        warnings.simplefilter("ignore", ds.petab.PetabWarning)  # the collection's extra columns
        os.environ["DIFFSOUP_CACHE_DIR"] = cache
        t, c = time.perf_counter(), time.process_time()
        problem = ds.petab.load(yaml)
        out["import_cold_s"] = time.perf_counter() - t
        out["import_cold_cpu_s"] = time.process_time() - c
        t = time.perf_counter()
        problem = ds.petab.load(yaml)
        out["import_warm_s"] = time.perf_counter() - t
        theta = problem.nominal
        out.update(theta=int(theta.size), theta_names=list(problem.theta_names),
                   experiments=len(problem.study.experiments), measurements=len(problem.tables.measurements),
                   states=problem.study.problem.n_states)  # fmt: skip
        modes = {
            "value": (problem.lower(), lambda lw: lw.value(theta)),
            "adjoint": (problem.lower(gradient="adjoint"), lambda lw: lw.value_and_grad(theta)),
            "forward_grad": (problem.lower(gradient="forward"), lambda lw: lw.value_and_grad(theta)),
            "forward_jacobian": (problem.lower(), lambda lw: lw.residuals_and_jacobian(theta)),
        }
        for mode, (lowered, call) in modes.items():
            load = os.getloadavg()[0]
            first, first_cpu, steady, cpu, result = timed_cpu(lambda: call(lowered), repeats)
            out[f"{mode}_first_s"] = first
            out[f"{mode}_first_cpu_s"] = first_cpu
            out[f"{mode}_ms"] = 1e3 * median(steady)
            out[f"{mode}_cpu_ms"] = 1e3 * median(cpu)
            out[f"{mode}_calls"] = len(steady)
            out[f"{mode}_load"] = load
            if mode == "value":
                out["nll"] = float(result)
            elif mode == "adjoint":
                out["adjoint_gradient"] = np.asarray(result[1], dtype=np.float64).tolist()
            elif mode == "forward_grad":
                out["forward_gradient"] = np.asarray(result[1], dtype=np.float64).tolist()
        for suffix in ("s", "cpu_s"):
            out[f"compile_all_{suffix}"] = sum(out[f"{m}_first_{suffix}"] for m in COMPILED_MODES)
            out[f"import_and_compile_{suffix}"] = out[f"import_cold_{suffix}"] + out[f"compile_all_{suffix}"]
        os.environ.pop("DIFFSOUP_CACHE_DIR", None)
    return out


def bench_amici(name: str, repeats: int, python: str | None) -> dict | None:
    """AMICI on the same problem and tolerances, in a subprocess of ``python``; None without AMICI.
    A failure is recorded as ``{"error": ...}`` and printed."""
    if python is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "amici.json"
        command = [python, str(HERE / "_amici_petab.py"), "--yaml", str(DATA / name / f"{name}.yaml"),
                   "--out", str(result), "--repeats", str(repeats), "--rtol", str(RTOL), "--atol", str(ATOL)]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        if not result.exists():
            out = {"error": f"exit status {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"}
        else:
            out = json.loads(result.read_text())
    if "error" in out:
        print(f"[bench_petab] AMICI failed on {name}:\n{out['error']}", flush=True)
    return out


def compare(d: dict, a: dict | None) -> dict:
    """Ratios diffsoup / AMICI on both clocks (``_cpu``: CPU time; the targets are judged on it),
    the targets they meet, and the agreement checks."""
    out: dict = {}
    for clock in ("", "_cpu"):
        out[f"adjoint_over_value{clock}"] = d[f"adjoint{clock}_ms"] / d[f"value{clock}_ms"]
    out["adjoint_over_value_meets_target"] = out["adjoint_over_value_cpu"] <= ADJOINT_OVER_VALUE_TARGET
    if not a or "error" in a:
        return out
    for mode, (amode, target) in TARGETS.items():
        for which, key in (("solve", amode), ("objective", f"{amode}_objective")):
            for clock in ("", "_cpu"):
                out[f"{mode}_vs_{which}{clock}"] = d[f"{mode}{clock}_ms"] / a[f"{key}{clock}_ms"]
            out[f"{mode}_vs_{which}_meets_target"] = out[f"{mode}_vs_{which}_cpu"] <= target
    out["import_and_compile_vs_build"] = d["import_and_compile_s"] / a["build_s"]
    out["import_and_compile_vs_build_cpu"] = d["import_and_compile_cpu_s"] / a["build_cpu_s"]
    out["import_and_compile_meets_target"] = out["import_and_compile_vs_build_cpu"] <= 1.0
    ours, theirs = -d["nll"], a["llh"]
    out["llh_diffsoup"], out["llh_amici"] = ours, theirs
    out["llh_relative_difference"] = abs(ours - theirs) / abs(theirs)
    ref = a.get("sllh_forward") or {}
    if ref and all(n in ref for n in d["theta_names"]):
        amici_grad = -np.array([ref[n] for n in d["theta_names"]])  # of the nll, on the parameters' scales
        scale = np.max(np.abs(amici_grad))
        for mode in ("adjoint", "forward"):
            ours_grad = np.asarray(d[f"{mode}_gradient"])
            out[f"{mode}_gradient_vs_amici_forward"] = float(np.max(np.abs(ours_grad - amici_grad)) / scale)
        adj = a.get("sllh_adjoint") or {}
        if all(n in adj for n in d["theta_names"]):
            amici_adj = -np.array([adj[n] for n in d["theta_names"]])
            out["amici_adjoint_vs_amici_forward"] = float(np.max(np.abs(amici_adj - amici_grad)) / scale)
    return out


def _versus(ours: float, theirs: float | None, target: float | None, spec: str = ".3g") -> str:
    """``"4.02 / 0.51 = 7.9x"`` with a mark where the target is missed."""
    if theirs is None:
        return f"{fmt(ours, spec)} / –"
    ratio = ours / theirs
    miss = " ✗" if target is not None and ratio > target else ""
    return f"{fmt(ours, spec)} / {fmt(theirs, spec)} = {ratio:.2g}x{miss}"


def tables(results: dict) -> str:
    """Markdown tables: CPU time against AMICI's solve (the targets' bar), wall-clock time, and
    the rest (compile times, AMICI's objective, the agreement checks)."""
    out = []
    for clock, title in (("_cpu", "CPU time (this process's threads; AMICI's build with its compiler processes)"),
                         ("", "wall-clock time")):  # fmt: skip
        headers = ["model", "exp", "θ", "import+compile s / AMICI build s", "value ms / AMICI",
                   "adjoint grad ms / AMICI", "fwd grad ms / AMICI", "res+jac ms / AMICI fwd", "adjoint / value"]  # fmt: skip
        rows = []
        for name, r in results.items():
            d, a, c = r["diffsoup"], r["amici"], r["compare"]
            ok = a is not None and "error" not in a
            state = NOT_INSTALLED if a is None else "failed"
            build = "build_cpu_s" if clock else "build_s"

            def cell(ours, key, target):
                return _versus(ours, a[key], target) if ok else f"{fmt(ours)} / {state}"

            aov = c[f"adjoint_over_value{clock}"]
            mark = "" if aov <= ADJOINT_OVER_VALUE_TARGET else " ✗"
            rows.append([
                _short(name), d["experiments"], d["theta"],
                cell(d[f"import_and_compile{'_cpu' if clock else ''}_s"], build, 1.0),
                cell(d[f"value{clock}_ms"], f"value{clock}_ms", 1.0),
                cell(d[f"adjoint{clock}_ms"], f"adjoint_grad{clock}_ms", 1.0),
                cell(d[f"forward_grad{clock}_ms"], f"forward_grad{clock}_ms", 1.5),
                cell(d[f"forward_jacobian{clock}_ms"], f"forward_grad{clock}_ms", 1.5),
                f"{aov:.2g}{mark}",
            ])  # fmt: skip
        out.append(f"{title}:\n\n" + markdown_table(headers, rows))
    headers = ["model", "import cold / warm s", "compile value / adjoint / fwd grad / res+jac s (CPU s)",
               "AMICI objective value / fwd / adjoint ms (CPU)", "llh diffsoup", "llh AMICI",
               "grad vs AMICI fwd (AMICI adjoint vs fwd)"]  # fmt: skip
    rows = []
    for name, r in results.items():
        d, a, c = r["diffsoup"], r["amici"], r["compare"]
        ok = a is not None and "error" not in a
        state = NOT_INSTALLED if a is None else "failed"
        modes = ("value", "adjoint", "forward_grad", "forward_jacobian")
        rows.append([
            _short(name), f"{d['import_cold_s']:.2f} / {d['import_warm_s']:.2f}",
            " / ".join(f"{d[f'{m}_first_s']:.1f}" for m in modes)
            + " (" + " / ".join(f"{d[f'{m}_first_cpu_s']:.1f}" for m in modes) + ")",
            (" / ".join(fmt(a[f"{m}_objective_cpu_ms"]) for m in ("value", "forward_grad", "adjoint_grad"))
             if ok else state),
            f"{-d['nll']:.10g}", f"{a['llh']:.10g}" if ok else state,
            (f"{c['adjoint_gradient_vs_amici_forward']:.1e} ({c.get('amici_adjoint_vs_amici_forward', float('nan')):.1e})"
             if "adjoint_gradient_vs_amici_forward" in c else "–"),
        ])  # fmt: skip
    out.append("compile times, AMICI's PEtab objective, agreement:\n\n" + markdown_table(headers, rows))
    return "\n\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=[_short(m) for m in MODELS])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--amici-python", default=None,
                        help="interpreter that imports amici (default: this one if it can, else "
                             f"{AMICI_VENV_PYTHON} if it exists)")  # fmt: skip
    parser.add_argument("--no-amici", action="store_true", help="measure diffsoup only")
    args = parser.parse_args()
    python = None if args.no_amici else (args.amici_python or default_amici_python())
    chosen = [m for m in MODELS if _short(m) in args.models]
    machine = machine_info()
    results = {}
    for name in chosen:
        print(f"[bench_petab] {name}: diffsoup (load {os.getloadavg()[0]:.1f}) ...", flush=True)
        d = bench_diffsoup(name, args.repeats)
        print(f"[bench_petab] {name}: AMICI (load {os.getloadavg()[0]:.1f}) ...", flush=True)
        a = bench_amici(name, args.repeats, python)
        results[name] = {"diffsoup": d, "amici": a, "compare": compare(d, a)}
        c = results[name]["compare"]
        if "llh_amici" in c:
            print(f"[bench_petab] {name}: llh diffsoup {c['llh_diffsoup']:.12g}, AMICI {c['llh_amici']:.12g} "
                  f"(relative difference {c['llh_relative_difference']:.1e})", flush=True)  # fmt: skip
    table = tables(results)
    print()
    print(table)
    if python is None:
        print(f"\nAMICI is not importable here nor at {AMICI_VENV_PYTHON} (--amici-python PATH names an interpreter "
              "that has it): its columns say 'not installed'.")  # fmt: skip
    print("\nCells: diffsoup / AMICI = ratio (below 1: diffsoup faster); ✗ marks a missed target (value and "
          "adjoint <= 1x AMICI's solve, forward sensitivities <= 1.5x, adjoint <= 3x value, import + compile "
          f"<= AMICI's build). Load average at the start {machine['load_average_at_start'][0]:.1f}, at the end "
          f"{os.getloadavg()[0]:.1f} (2 cores: wall-clock times stretch with it, CPU times much less).")  # fmt: skip
    machine["load_average_at_end"] = os.getloadavg()
    write_json(RESULTS / "bench_petab.json", {"machine": machine, "rtol": RTOL, "atol": ATOL,
                                              "amici_python": python, "targets": {
                                                  "value_and_adjoint_vs_amici": 1.0, "forward_vs_amici": 1.5,
                                                  "adjoint_over_value": ADJOINT_OVER_VALUE_TARGET,
                                                  "import_and_compile_vs_build": 1.0},
                                              "results": results, "table": table})  # fmt: skip


if __name__ == "__main__":
    main()
