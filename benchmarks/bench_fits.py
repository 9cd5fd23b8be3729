"""Multistart fits of the PEtab benchmark problems: diffsoup (fides, trf, lbfgsb) against pyPESTO +
fides + AMICI, from the same start points, in the same run.

Per problem (the five of ``shared/petab``, loaded with ``ds.petab.load``; ``--quick``: three of
them), ``--starts`` start points are drawn once: a Latin hypercube on the parameters' scales within
the bounds (``diffsoup.inference.start_points``, seeded by ``--seed``). Every tool starts from
exactly these points (no start is replaced), at the same solver tolerances (rtol = atol = 1e-8):

* diffsoup: ``ds.inference.fit(lowered, method=M, starts=points)`` for M in fides (the default:
  Gauss-Newton Hessian from forward sensitivities, run on past a function-value or radius stop
  where its model still predicts a decrease: ``Fides.continue_above``), trf and lbfgsb. Before
  the timed fit, one start of two evaluations compiles the programs the method uses, and
  ``lowered.compile`` their variants with the lanes one after the other ("compile", reported apart).
  ``--methods ... batched`` adds ``fit(method="batched")`` from the same points (the starts as lanes
  of one program, the best distinct ends polished by fides; its compile step runs its program of
  as many lanes as the fit, and fides').
* pyPESTO + fides + AMICI, in a subprocess of the interpreter that has them (``--amici-python``;
  default ``/work/amici-venv/bin/python`` when it exists): ``PetabImporter.create_problem()``
  (AMICI builds and compiles the model: "build", reported apart), then one
  ``pypesto.optimize.minimize`` with ``FidesOptimizer()`` (its defaults: fides' options and
  ``HybridFixed``, the Fisher information for 20 iterations, then BFGS) per start
  (``_pypesto_fits.py`` says exactly what is timed).

Every start's end point is then evaluated by one judge, diffsoup's objective at rtol = atol =
1e-10 (each tool's own value carries its solver's error at 1e-8: on Fujita AMICI's is 0.01 off at
the nominal point, ten times the criterion below; the tools' own values are in the JSON too). A
start has converged when the judge's value at its end is within 1e-3 of the best objective known:
the lower of the reference (the negative log-likelihood at the nominal parameters, the
collection's best fit, ``reference.json``'s ``llh_amici``) and the best end point of any tool in
this run. Per tool and
problem: the fraction of converged starts, the best objective against the reference, wall and CPU
time of the fits, evaluations (diffsoup: evaluations of the lowered study; pyPESTO: objective
calls, each with sensitivities), and the time per converged start (the fits' time over the
converged starts; setup apart). On this shared 2-core machine wall-clock times stretch with the
load; CPU time (the process's, all threads) is the steadier clock, and the time target is judged
on it (both are in the table and the JSON).

Targets (issue 21): diffsoup's default method converges in at least pyPESTO's fraction of starts
on every problem; its time per converged start is at most a third of pyPESTO + AMICI's; its best
objective is at most the reference + 1e-3 (meaningful with the full 20 starts).

    python benchmarks/bench_fits.py [--quick] [--starts 20] [--models Boehm Bruno ...]
                                    [--methods fides trf lbfgsb batched] [--amici-python PATH] [--no-amici]
                                    [--fides-hessians gauss_newton hybrid ...] [--hierarchical [all|noise|none]]
                                    [--reuse-pypesto EARLIER.json] [--reuse-diffsoup EARLIER.json]

``--fides-hessians`` runs fides once per Hessian named (``ds.inference.Fides(hessian=H)``; rows
"fides H"; the default, gauss_newton, is the row "fides" that the targets judge; without it the
targets are not judged).

``--hierarchical`` also runs each method with ``fit(hierarchical=True)`` (scaling factors, offsets
and noise levels optimized analytically; rows "M hierarchical"), ``--hierarchical noise`` with the
noise levels named (rows "M noise levels analytic"; what the default does since it takes the noise
levels that qualify), ``--hierarchical none`` with ``hierarchical=False`` (rows "M, no analytic
noise levels": the default before), from the same starts. ``--reuse-pypesto``
takes pyPESTO's rows from an earlier run's JSON where that run had the same problem, start points
and tolerances (pyPESTO's side does not change with diffsoup's code; a Fujita run of 20 starts
takes it 12 minutes); such rows carry ``reused_from``. ``--reuse-diffsoup`` takes diffsoup's rows
the same way (to add ``--hierarchical`` rows to a run without repeating its plain ones).

``--quick`` (about 10 minutes on a 2-core CPU): 8 starts on Boehm and Bruno, the two problems
whose starts take seconds (a start on Brannmark, Fujita or Weber takes one to several minutes with
either tool; ``--models Brannmark --methods fides --starts 5`` measures one of them alone). Writes
``benchmarks/results/bench_fits.json`` (``bench_fits_quick.json`` for ``--quick``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from _common import RESULTS, machine_info, markdown_table, write_json

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
# The problems as published (shared/ beside the checkout), else the copy the tests use.
SHARED = HERE.parents[1] / "shared" / "petab"
DATA = SHARED if SHARED.is_dir() else HERE.parent / "tests" / "data" / "petab"
MODELS = ["Boehm_JProteomeRes2014", "Bruno_JExpBot2016", "Fujita_SciSignal2010", "Brannmark_JBC2010", "Weber_BMC2015"]
QUICK_MODELS = ["Boehm", "Bruno"]
QUICK_STARTS, FULL_STARTS = 8, 20
METHODS = ("fides", "trf", "lbfgsb", "batched")
DEFAULT_METHODS = ("fides", "trf", "lbfgsb")  # batched only when asked for (--methods fides batched)
DEFAULT_METHOD = "fides"
DEFAULT_HESSIAN = "gauss_newton"  # fides' Hessian in diffsoup's default method (fitting._hessians.DEFAULT_HESSIAN)
RTOL = ATOL = 1e-8
CONVERGED = 1e-3  # the PEtab benchmarks' criterion (diffsoup.inference.fitting._results.CONVERGED)
JUDGE_TOL = 1e-10  # the tolerances of the one evaluator that judges every tool's end points
TIME_TARGET = 1.0 / 3.0  # time per converged start, diffsoup / pyPESTO + AMICI
AMICI_VENV_PYTHON = Path("/work/amici-venv/bin/python")
PYPESTO = "pypesto+fides+amici"


def _short(name: str) -> str:
    return name.split("_")[0]


def reference_nll(name: str) -> float:
    """The negative log-likelihood at the nominal parameters (the collection's best fit)."""
    return -float(json.loads((DATA / "reference.json").read_text())["models"][name]["llh_amici"])


def load(name: str):
    import diffsoup as ds

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ds.petab.PetabWarning)  # the collection's extra columns
        return ds.petab.load(DATA / name / f"{name}.yaml")


def method_variants(methods, hessians=(DEFAULT_HESSIAN,)) -> list:
    """``(label, fit's method)`` per row: fides once per Hessian in ``hessians`` ("fides" with the
    default Hessian, "fides H" with another), every other method once."""
    import diffsoup as ds

    variants = []
    for method in methods:
        if method != "fides":
            variants.append((method, method))
            continue
        for hessian in hessians:
            if hessian == DEFAULT_HESSIAN:
                variants.append(("fides", "fides"))
            else:
                variants.append((f"fides {hessian}", ds.inference.Fides(hessian=hessian)))
    return variants


def bench_diffsoup(problem, points: np.ndarray, methods, hierarchical: str | None = None,
                   hessians=(DEFAULT_HESSIAN,), reused: dict | None = None, lanes: int | None = None,
                   polish: int | None = None, polish_unfinished: int | None = None, progress: bool = False) -> dict:  # fmt: skip
    """Each method's fit from ``points`` on one lowered study (compiled once per program); fides
    once per Hessian in ``hessians``; with ``hierarchical="all"``, each also with
    ``fit(hierarchical=True)`` (labelled "M hierarchical"), with ``"noise"`` with the noise levels
    that qualify named (labelled "M noise levels analytic"; not run where none does). Rows in
    ``reused`` (label -> an earlier run's row, :func:`earlier_diffsoup`) are taken, not run. ``lanes``:
    the batched method's starts per program, ``polish`` its optima finished by fides and
    ``polish_unfinished`` the unconverged ones finished past those (None: ``BatchedTrustRegion``'s
    defaults); ``progress``: the fits' progress bars (on stderr), so that a
    run cut short still shows how far its fits came."""
    import diffsoup as ds

    t, c = time.perf_counter(), time.process_time()
    lowered = problem.lower()
    nominal = float(lowered.value(problem.nominal))
    out: dict = {"nominal_nll": nominal, "lower_and_value_s": time.perf_counter() - t,
                 "lower_and_value_cpu_s": time.process_time() - c, "methods": {}}  # fmt: skip
    rows = method_variants(methods, hessians)
    analytic_setting = {None: None, "all": True, "none": False}.get(hierarchical)
    if hierarchical == "noise":
        from diffsoup.inference.fitting._hierarchical import NoiseParameters

        found = NoiseParameters.find(lowered, True)
        analytic_setting = list(found.names) if found is not None else None
    extra = [(*r, analytic_setting) for r in rows] if analytic_setting is not None else []
    variants = [(*r, None) for r in rows] + extra
    suffix = {"all": " hierarchical", "noise": " noise levels analytic", "none": ", no analytic noise levels"}.get(hierarchical)
    for name, method, analytic in variants:
        label = f"{name}{suffix}" if analytic is not None else name
        if label in (reused or {}):
            out["methods"][label] = reused[label]
            continue
        # Compile what the method evaluates (one start, two evaluations), timed apart.
        t, c = time.perf_counter(), time.process_time()
        batched = {k: int(v) for k, v in (("lanes", lanes), ("polish", polish), ("polish_unfinished", polish_unfinished))
                   if v is not None}  # fmt: skip
        if method == "batched":  # its program of as many lanes as the fit runs, and the polish's (fides)
            n_lanes = ds.inference.BatchedTrustRegion(**batched).lanes_on(lowered.platform)
            ds.inference.fit(lowered, method=ds.inference.BatchedTrustRegion(max_evaluations=2, **{**batched, "polish": 0}),
                             starts=points[:n_lanes], hierarchical=analytic)  # fmt: skip
            method_warmup = "fides"
        else:
            method_warmup = method
        ds.inference.fit(lowered, method=method_warmup, starts=points[:1], max_nfev=2, hierarchical=analytic)
        # ... and, on a CPU, those modes' programs with the lanes one after the other, which "auto"
        # would otherwise compile inside the timed fit at the first evaluation that takes them.
        lowered.compile(list(lowered.chunk_sizes))
        compile_s, compile_cpu_s = time.perf_counter() - t, time.process_time() - c
        t, c = time.perf_counter(), time.process_time()
        chosen = ds.inference.BatchedTrustRegion(**batched) if method == "batched" else method
        result = ds.inference.fit(lowered, method=chosen, starts=points, progress=progress, hierarchical=analytic)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        out["methods"][label] = {
            "compile_s": compile_s, "compile_cpu_s": compile_cpu_s, "seconds": wall, "cpu_seconds": cpu,
            "starts": [{"objective": s.objective if np.isfinite(s.objective) else None, "x": np.asarray(s.x).tolist(),
                        "n_evaluations": s.n_evaluations,
                        "n_iterations": s.n_iterations, "seconds": s.seconds, "success": bool(s.success),
                        "message": s.message, "failed_solves": sum(f[2] for f in s.failures)}
                       for s in result.starts],
            "optima": [{"objective": o.objective, "count": o.count, "polished": o.polished} for o in result.optima],
        }  # fmt: skip
        objectives = [s.objective for s in result.starts]
        print(f"[bench_fits]   diffsoup {label}: best {min(objectives):.6f}, {wall:.1f} s ({cpu:.1f} s CPU), "
              f"compile {compile_s:.1f} s", flush=True)  # fmt: skip
    return out


def bench_pypesto(name: str, names, points: np.ndarray, python: str | None) -> dict | None:
    """pyPESTO + fides + AMICI from the same points, in a subprocess of ``python``; None without it."""
    if python is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        starts, result = Path(folder) / "starts.json", Path(folder) / "pypesto.json"
        starts.write_text(json.dumps({"names": list(names), "points": np.asarray(points).tolist()}))
        command = [python, str(HERE / "_pypesto_fits.py"), "--yaml", str(DATA / name / f"{name}.yaml"),
                   "--starts", str(starts), "--out", str(result), "--rtol", str(RTOL), "--atol", str(ATOL)]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        out = json.loads(result.read_text()) if result.exists() else {
            "error": f"exit status {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"}  # fmt: skip
    if "error" in out:
        print(f"[bench_fits] pyPESTO failed on {name}:\n{out['error']}", flush=True)
    else:
        best = min((s["fval"] for s in out["starts"] if s["fval"] is not None), default=float("inf"))
        wall = sum(s["seconds"] for s in out["starts"])
        print(f"[bench_fits]   {PYPESTO}: best {best:.6f}, {wall:.1f} s, build {out['build_s']:.1f} s", flush=True)
    return out


def earlier_pypesto(path: Path, earlier: dict, name: str, points: np.ndarray) -> dict | None:
    """pyPESTO's results for ``name`` from an earlier run's JSON (``earlier``, read from ``path``),
    when that run started from the same points at the same tolerances (pyPESTO's side does not
    change with diffsoup's code); else None."""
    row = earlier.get("results", {}).get(name)
    if (row is None or PYPESTO not in row or row[PYPESTO] is None or "error" in row[PYPESTO]
            or (earlier.get("rtol"), earlier.get("atol")) != (RTOL, ATOL)
            or not np.array_equal(np.asarray(row["start_points"]), np.asarray(points))):  # fmt: skip
        return None
    print(f"[bench_fits]   {PYPESTO}: reused from {path}", flush=True)
    return {**row[PYPESTO], "reused_from": str(path)}


def earlier_diffsoup(path: Path, earlier: dict, name: str, points: np.ndarray) -> dict:
    """diffsoup's rows for ``name`` (label -> row) from an earlier run's JSON, when that run started
    from the same points at the same tolerances; each marked with ``reused_from``."""
    row = earlier.get("results", {}).get(name)
    if (row is None or (earlier.get("rtol"), earlier.get("atol")) != (RTOL, ATOL)
            or not np.array_equal(np.asarray(row["start_points"]), np.asarray(points))):  # fmt: skip
        return {}
    rows = {label: {**m, "reused_from": str(path)} for label, m in row["diffsoup"]["methods"].items()}
    print(f"[bench_fits]   diffsoup {', '.join(rows)}: reused from {path}", flush=True)
    return rows


def end_points(d: dict, p: dict | None, names) -> dict:
    """tool -> the end point of every start (theta, scaled; None for a failed start)."""
    points = {f"diffsoup {method}": [s["x"] if s["objective"] is not None else None for s in m["starts"]]
              for method, m in d["methods"].items()}  # fmt: skip
    if p is not None and "error" not in p:
        points[PYPESTO] = [[s["x"][n] for n in names] if s["fval"] is not None else None for s in p["starts"]]
    return points


def judge(problem, points: dict) -> dict:
    """Every tool's end points evaluated by one judge: diffsoup's objective at rtol = atol =
    ``JUDGE_TOL`` (each tool's own value carries its solver's error at 1e-8: on Fujita AMICI's is
    0.01 off at the nominal point, ten times the convergence criterion). Returns the judge's
    value at the nominal point and tool -> values (None where a start failed or the judge's solve
    failed)."""
    from diffsoup.inference import SolverOptions

    lowered = problem.lower(solver=SolverOptions(rtol=JUDGE_TOL, atol=JUDGE_TOL))

    def value(theta):
        if theta is None:
            return None
        v = float(lowered.value(np.asarray(theta, dtype=np.float64)))
        return v if np.isfinite(v) and not lowered.last_failures else None

    return {"nominal": value(problem.nominal), "tol": JUDGE_TOL,
            "values": {tool: [value(x) for x in xs] for tool, xs in points.items()}}  # fmt: skip


def _tool_rows(d: dict, p: dict | None, judged: dict) -> dict:
    """tool -> (judged objectives, own objectives, evaluations, wall s, CPU s, setup s, setup CPU s)."""
    tools = {}
    for method, m in d["methods"].items():
        tool = f"diffsoup {method}"
        tools[tool] = (
            judged[tool], [s["objective"] for s in m["starts"]], sum(s["n_evaluations"] for s in m["starts"]),
            m["seconds"], m["cpu_seconds"], d["lower_and_value_s"] + m["compile_s"],
            d["lower_and_value_cpu_s"] + m["compile_cpu_s"])  # fmt: skip
    if p is not None and "error" not in p:
        tools[PYPESTO] = (judged[PYPESTO], [s["fval"] for s in p["starts"]], sum(s["n_fval"] for s in p["starts"]),
                          sum(s["seconds"] for s in p["starts"]), sum(s["cpu_seconds"] for s in p["starts"]),
                          p["build_s"], p["build_cpu_s"])  # fmt: skip
    return tools


def compare(name: str, d: dict, p: dict | None, judged: dict) -> dict:
    """Per tool: converged fraction, best objective vs the reference, times, evaluations; and the
    targets for diffsoup's default method against pyPESTO. Objectives are the judge's."""
    reference = reference_nll(name)
    tools = _tool_rows(d, p, judged["values"])
    finite = [v for objs, *_ in tools.values() for v in objs if v is not None]
    best_known = min([reference, *finite])
    out: dict = {"reference_nll": reference, "judge_at_nominal": judged["nominal"], "best_known": best_known, "tools": {}}
    for tool, (objs, own, evaluations, wall, cpu, setup, setup_cpu) in tools.items():
        values = np.array([np.inf if v is None else v for v in objs], dtype=np.float64)
        converged = int(np.sum(values <= best_known + CONVERGED))
        best = float(np.min(values))
        own_best = min((v for v in own if v is not None), default=None)
        out["tools"][tool] = {
            "starts": len(objs), "converged": converged, "fraction": converged / len(objs),
            "failed": int(np.sum(~np.isfinite(values))), "best": best, "best_minus_reference": best - reference,
            "own_best": own_best, "objectives": list(objs), "own_objectives": list(own),
            "reaches_reference": bool(best <= reference + CONVERGED), "evaluations": int(evaluations),
            "seconds": wall, "cpu_seconds": cpu, "setup_s": setup, "setup_cpu_s": setup_cpu,
            "per_converged_s": wall / converged if converged else None,
            "per_converged_cpu_s": cpu / converged if converged else None,
            "per_converged_with_setup_s": (wall + setup) / converged if converged else None,
            "converged_per_second": converged / wall if wall else None,
        }  # fmt: skip
    ours, theirs = out["tools"].get(f"diffsoup {DEFAULT_METHOD}"), out["tools"].get(PYPESTO)
    if ours is None:  # --fides-hessians without the default's
        out["targets"] = {"note": "diffsoup's default method (fides, Gauss-Newton) was not run"}
        return out
    targets: dict = {"best_within_reference": ours["reaches_reference"]}
    if theirs is not None:
        targets["fraction_at_least_pypesto"] = ours["fraction"] >= theirs["fraction"]
        if theirs["converged"] == 0:
            targets["time_ratio_cpu"] = targets["time_ratio"] = None
            targets["time_note"] = "pyPESTO converged in no start"
            targets["time_per_converged_at_most_a_third"] = None
        elif ours["converged"] == 0:
            targets["time_ratio_cpu"] = targets["time_ratio"] = None
            targets["time_note"] = "diffsoup converged in no start"
            targets["time_per_converged_at_most_a_third"] = False
        else:
            targets["time_ratio_cpu"] = ours["per_converged_cpu_s"] / theirs["per_converged_cpu_s"]
            targets["time_ratio"] = ours["per_converged_s"] / theirs["per_converged_s"]
            targets["time_per_converged_at_most_a_third"] = targets["time_ratio_cpu"] <= TIME_TARGET
    out["targets"] = targets
    return out


def _cell_time(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g}"


def table(results: dict) -> str:
    headers = ["model", "tool", "converged", "best − ref", "fits s (CPU s)", "evaluations",
               "s per converged start (CPU)", "setup s", "targets"]  # fmt: skip
    rows = []
    for name, r in results.items():
        c = r["compare"]
        for tool, t in c["tools"].items():
            marks = ""
            if tool == f"diffsoup {DEFAULT_METHOD}":
                g = c["targets"]
                bits = []
                if "fraction_at_least_pypesto" in g:
                    bits.append("fraction ✓" if g["fraction_at_least_pypesto"] else "fraction ✗")
                if g.get("time_ratio_cpu") is not None:
                    bits.append(f"time {g['time_ratio_cpu']:.2f}x {'✓' if g['time_per_converged_at_most_a_third'] else '✗'}")
                elif g.get("time_note"):
                    bits.append(f"time: {g['time_note']}")
                bits.append("best ✓" if g["best_within_reference"] else "best ✗")
                marks = ", ".join(bits)
            per = (f"{_cell_time(t['per_converged_s'])} ({_cell_time(t['per_converged_cpu_s'])})"
                   if t["converged"] else "– (none converged)")  # fmt: skip
            rows.append([_short(name), tool, f"{t['converged']}/{t['starts']}", f"{t['best_minus_reference']:+.4g}",
                         f"{t['seconds']:.1f} ({t['cpu_seconds']:.1f})", t["evaluations"], per, f"{t['setup_s']:.1f}",
                         marks])  # fmt: skip
    return markdown_table(headers, rows)


def default_amici_python() -> str | None:
    return str(AMICI_VENV_PYTHON) if AMICI_VENV_PYTHON.exists() else None


def main() -> None:
    from diffsoup.inference.fitting._hessians import FIDES_HESSIANS  # imports nothing itself

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_STARTS} starts on {', '.join(QUICK_MODELS)}")
    parser.add_argument("--starts", type=int, help=f"starts per problem (default {FULL_STARTS}; --quick {QUICK_STARTS})")
    parser.add_argument("--models", nargs="*", help="short names (default: all five; --quick: " + " ".join(QUICK_MODELS) + ")")
    parser.add_argument("--methods", nargs="*", default=list(DEFAULT_METHODS), choices=METHODS)
    parser.add_argument("--fides-hessians", nargs="+", default=[DEFAULT_HESSIAN], choices=FIDES_HESSIANS,
                        help="fides' rows, one per Hessian (default: gauss_newton, diffsoup's default, whose row the "
                        "targets judge; the others are labelled 'fides H')")  # fmt: skip
    parser.add_argument("--lanes", type=int, help="starts per program of the batched method (default: its own)")
    parser.add_argument("--polish", type=int, help="distinct optima the batched method finishes with fides (default: its own)")
    parser.add_argument("--polish-unfinished", type=int,
                        help="unconverged optima below every converged one it finishes as well (default: its own)")
    parser.add_argument("--seed", type=int, default=0, help="of the Latin hypercube start points")
    parser.add_argument("--amici-python", default=None, help=f"interpreter with pyPESTO, fides and AMICI (default {AMICI_VENV_PYTHON})")
    parser.add_argument("--no-amici", action="store_true", help="diffsoup only")
    parser.add_argument("--progress", action="store_true", help="diffsoup's fits show progress bars (stderr)")
    parser.add_argument("--hierarchical", nargs="?", const="all", choices=("all", "noise", "none"),
                        help="also run each method with fit(hierarchical=True) (all: scalings, offsets and noise levels "
                        "optimized analytically), with the noise levels named (noise) or with hierarchical=False (none)")  # fmt: skip
    parser.add_argument("--reuse-pypesto", type=Path, metavar="JSON",
                        help="take pyPESTO's results from an earlier run's JSON where it holds the same problem, start "
                        "points and tolerances (marked 'reused_from'); the others are run")  # fmt: skip
    parser.add_argument("--reuse-diffsoup", type=Path, metavar="JSON",
                        help="take diffsoup's rows from an earlier run's JSON where it holds the same problem, start "
                        "points and tolerances (marked 'reused_from'; e.g. the plain rows, to run --hierarchical "
                        "alone); the others are run")  # fmt: skip
    parser.add_argument("--json", type=Path, help="where the results go (default benchmarks/results/bench_fits.json, "
                        "bench_fits_quick.json for --quick)")  # fmt: skip
    args = parser.parse_args()
    import jax

    jax.config.update("jax_enable_x64", True)
    from diffsoup.inference.fitting._starts import start_points

    n_starts = args.starts or (QUICK_STARTS if args.quick else FULL_STARTS)
    short = args.models or (QUICK_MODELS if args.quick else [_short(m) for m in MODELS])
    chosen = [m for m in MODELS if _short(m) in short]
    python = None if args.no_amici else (args.amici_python or default_amici_python())
    machine = machine_info()
    t_all = time.perf_counter()
    results: dict = {}
    # Read before this run writes: the output may be the file reused.
    earlier = json.loads(args.reuse_pypesto.read_text()) if args.reuse_pypesto else {}
    earlier_ours = json.loads(args.reuse_diffsoup.read_text()) if args.reuse_diffsoup else {}
    out = args.json or RESULTS / ("bench_fits_quick.json" if args.quick else "bench_fits.json")

    def save(results: dict, *, complete: bool, table: str | None = None) -> None:
        write_json(out, {"machine": machine, "starts": n_starts, "seed": args.seed, "methods": args.methods,
                         "rtol": RTOL, "atol": ATOL, "judge_tol": JUDGE_TOL, "converged_within": CONVERGED,
                         "time_target": TIME_TARGET, "amici_python": python, "complete": complete,
                         "seconds": time.perf_counter() - t_all, "results": results, "table": table})  # fmt: skip
    for name in chosen:
        print(f"[bench_fits] {name}: {n_starts} starts (load {os.getloadavg()[0]:.1f}) ...", flush=True)
        problem = load(name)
        points = start_points(problem.lower(), n_starts, args.seed)
        reused = earlier_diffsoup(args.reuse_diffsoup, earlier_ours, name, points) if args.reuse_diffsoup else {}
        d = bench_diffsoup(problem, points, args.methods, args.hierarchical, args.fides_hessians, reused, lanes=args.lanes,
                           polish=args.polish, polish_unfinished=args.polish_unfinished, progress=args.progress)  # fmt: skip
        p = earlier_pypesto(args.reuse_pypesto, earlier, name, points) if args.reuse_pypesto else None
        if p is None:
            p = bench_pypesto(name, problem.theta_names, points, python)
        judged = judge(problem, end_points(d, p, problem.theta_names))
        results[name] = {"theta_names": list(problem.theta_names), "start_points": points.tolist(), "diffsoup": d,
                         PYPESTO: p, "compare": compare(name, d, p, judged)}  # fmt: skip
        save(results, complete=False)  # what is done so far survives an interrupted run
    text = table(results)
    print()
    print(text)
    if python is None and not args.no_amici:
        print(f"\npyPESTO + AMICI is not at {AMICI_VENV_PYTHON} (--amici-python PATH names an interpreter with pypesto, "
              "fides and amici): its rows are missing.")  # fmt: skip
    print(f"\nconverged: within {CONVERGED:g} of the best objective known (the reference, or better when a tool found "
          f"better); best − ref: against the negative log-likelihood at the nominal point. Targets for diffsoup "
          f"{DEFAULT_METHOD}: converged fraction ≥ pyPESTO's; CPU time per converged start ≤ {TIME_TARGET:.2g}x "
          f"pyPESTO + AMICI's; best ≤ ref + {CONVERGED:g}. Setup (not in the fits' times): diffsoup's lowering, first "
          f"value and compilation of the method's programs; AMICI's model build. {time.perf_counter() - t_all:.0f} s in "
          f"all; load average {machine['load_average_at_start'][0]:.1f} at the start, {os.getloadavg()[0]:.1f} at "
          "the end (2 cores: wall-clock times stretch with it).")  # fmt: skip
    machine["load_average_at_end"] = os.getloadavg()
    save(results, complete=True, table=text)


if __name__ == "__main__":
    main()
