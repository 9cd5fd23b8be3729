"""Time to the first result of a lowered study, per mode, in a fresh process: compiling (an empty
persistent compilation cache) and loading from the cache (a second fresh process on the same
cache), and the per-call run time after that.

    python benchmarks/bench_compile.py                         # this checkout
    python benchmarks/bench_compile.py --ref /work/before      # and another checkout: the "before" column
    python benchmarks/bench_compile.py --quick                 # fewer timed calls per mode
    python benchmarks/bench_compile.py --studies boehm --modes value_and_grad

Studies (CPU, float64, ``SolverOptions()``: rtol 1e-6, atol 1e-9):

- ``rober``: ROBER (``ds.examples.rober``, 3 species, dense LU), 3 experiments from 3 initial
  states, every species observed at 5 times, ``k1, k2, k3`` estimated (log10).
- ``boehm``: Boehm_JProteomeRes2014 (8 species, dense LU) from its SBML in
  ``tests/data/petab/Boehm_JProteomeRes2014/``: its 48 measurements as 3 experiments (one per
  observable, the other two columns missing), sharing one observable function of the PEtab
  formulas, Gaussian noise with each observable's sigma estimated: 9 estimated parameters (6 rate
  constants and 3 sigmas, log10), ``ratio`` and ``specC17`` held at their PEtab values, as PEtab's
  problem has them.
- The five PEtab problems of ``tests/data/petab/`` (``Boehm_JProteomeRes2014`` ... ``Weber_BMC2015``),
  each from its YAML through ``ds.petab.load`` and ``problem.lower()`` (rtol = atol = 1e-8, the
  PEtab default): the time to the first result counts the load (SBML and formulas to JAX; the
  cached run reads the generated code from the same cache directory). "after" only.
- ``brusselator``: the 2-D Brusselator, N = 32 (``ds.examples.brusselator_2d``, 2048 states, KLU),
  one experiment observed at 4 grid values at t = 0.5 and 1 (before the forcing switches on),
  ``A, B, alpha`` estimated.

Each (checkout, study, mode) runs in two fresh processes sharing a new, empty cache directory:
the first compiles and writes the cache (``first``), the second loads it (``cached``). A time to
the first result counts from before ``spec.build()`` (sparsity detection, ``ds.Study``,
``ds.lower``) to the first result of the mode's call; imports are counted apart. The run time is
the median of the calls after the first: at least 7 adding up to 3 s (``--quick``: 3 and 1 s), at
most 200. Each mode runs in its own process, so programs two
modes share are compiled once per mode (the sum of the three modes is an upper bound on one process
doing all three). Data values are constants for ROBER and the Brusselator (the timings do not
depend on them) and PEtab's measurements for Boehm.

The cache is turned on with ``ds.enable_compilation_cache()`` (``DIFFSOUP_CACHE_DIR`` set to the
run's temporary directory); a checkout without it (the code before issue 20) gets JAX's cache
turned on by hand with the same settings (folder, 0.1 s minimum compile time): the ``cached``
column there says what JAX's cache would have given it, which it did not turn on.

The Boehm model is read from its SBML by this checkout's ``ds.formats.load_sbml`` (the code before
issue 20 has no SBML import): the generated JAX source is written once to the run's directory and
every checkout builds its ``ds.ProblemSpec`` from that same source through the public API, so the
model code is identical in both columns.

Writes ``benchmarks/results/bench_compile.json`` (or ``--out``) and prints a table. On a shared
machine the load average at start is recorded in the JSON: compare columns measured in one run.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BOEHM_DIR = REPO / "tests" / "data" / "petab" / "Boehm_JProteomeRes2014"
PETAB_DIR = REPO / "tests" / "data" / "petab"
# The five PEtab problems through ds.petab.load (the code before issue 20 has no PEtab import:
# their "before" column is empty).
PETAB = ("Boehm_JProteomeRes2014", "Bruno_JExpBot2016", "Fujita_SciSignal2010", "Brannmark_JBC2010",
         "Weber_BMC2015")  # fmt: skip
STUDIES = ("rober", "boehm", "brusselator") + PETAB
MODES = ("value", "value_and_grad", "residuals_and_jacobian")
MIN_COMPILE_SECONDS = 0.1  # what ds.enable_compilation_cache sets; used by hand on a checkout without it
TARGETS = {"boehm value_and_grad first": 10.0, "boehm three modes first": 16.0, "cached per mode": 2.0}


# ------------------------------------------------------------------------------------------------
# The studies (built in the measuring process, with whatever diffsoup is on its path)
# ------------------------------------------------------------------------------------------------


def rober_study(ds, np):
    from diffsoup.inference import Gaussian, Parameter

    spec = ds.examples.rober()
    times = np.array([0.1, 1.0, 10.0, 100.0, 1000.0])
    y0s = ([1.0, 0.0, 0.0], [0.8, 0.0, 0.2], [0.5, 1e-5, 0.5])
    exps = [ds.Experiment(f"rober{i}", times, np.full((5, 3), 0.3), noise=Gaussian(0.05), y0=y0)
            for i, y0 in enumerate(y0s)]  # fmt: skip
    params = [Parameter(k, float(v), float(v) / 100, float(v) * 100)
              for k, v in zip(spec.parameter_names, spec.parameter_defaults)]  # fmt: skip
    return spec, exps, params


def boehm_study(ds, np, spec_file: Path):
    import jax
    import jax.numpy as jnp
    from diffsoup.inference import Gaussian, Parameter

    model = json.loads(spec_file.read_text())
    namespace = {"jnp": jnp, "jsp": jax.scipy}
    exec(compile(model["source"], "<boehm generated>", "exec"), namespace)  # noqa: S102 - load_sbml's output
    vector_rhs, ids = namespace["rhs"], tuple(model["parameter_ids"])

    def rhs(t, y, p):  # p by name, as ProblemSpec passes it
        return vector_rhs(t, y, jnp.stack([jnp.asarray(p[k]) for k in ids]))

    spec = ds.ProblemSpec(rhs, states=model["state_ids"], parameters=dict(zip(ids, model["parameter_values"])),
                          y0=model["y0"], name="Boehm_JProteomeRes2014")  # fmt: skip
    state = {s: i for i, s in enumerate(model["state_ids"])}

    def observables(y, p):  # the PEtab observable formulas
        a, b, ab = y[state["STAT5A"]], y[state["STAT5B"]], y[state["pApB"]]
        aa, bb, c = y[state["pApA"]], y[state["pBpB"]], p["specC17"]
        return jnp.stack([
            (100 * ab + 200 * aa * c) / (ab + a * c + 2 * aa * c),
            -(100 * ab - 200 * bb * (c - 1)) / ((b * (c - 1) - ab) + 2 * bb * (c - 1)),
            (100 * ab + 100 * a * c + 200 * aa * c) / (2 * ab + a * c + 2 * aa * c - b * (c - 1) - 2 * bb * (c - 1)),
        ])  # fmt: skip

    names = ("pSTAT5A_rel", "pSTAT5B_rel", "rSTAT5A_rel")
    with (BOEHM_DIR / "measurementData_Boehm_JProteomeRes2014.tsv").open() as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    exps = []
    for k, name in enumerate(names):
        mine = [r for r in rows if r["observableId"] == name]
        times = np.array([float(r["time"]) for r in mine])
        data = np.full((len(mine), 3), np.nan)
        data[:, k] = [float(r["measurement"]) for r in mine]
        exps.append(ds.Experiment(name, times, data, observables=observables, noise=Gaussian(f"sd_{name}")))
    with (BOEHM_DIR / "parameters_Boehm_JProteomeRes2014.tsv").open() as f:
        table = [r for r in csv.DictReader(f, delimiter="\t") if r["estimate"] == "1"]
    params = [Parameter(r["parameterId"], float(r["nominalValue"]), float(r["lowerBound"]), float(r["upperBound"]),
                        scale=r["parameterScale"]) for r in table]  # fmt: skip
    assert len(params) == 9, [p.name for p in params]
    return spec, exps, params


def brusselator_study(ds, np):
    from diffsoup.inference import Gaussian, Parameter

    n = 32
    spec = ds.examples.brusselator_2d(n)
    index = np.array([0, n * n // 2 + n // 2, n * n, n * n + n * n // 2 + n // 2])

    def observables(y, p):
        return y[index]

    times = np.array([0.5, 1.0])
    exps = [ds.Experiment("brusselator", times, np.ones((2, 4)), observables=observables, noise=Gaussian(0.1))]
    params = [Parameter(k, float(v), float(v) / 10, float(v) * 10)
              for k, v in zip(spec.parameter_names, spec.parameter_defaults)]  # fmt: skip
    return spec, exps, params


def write_boehm_spec(path: Path) -> None:
    """This checkout's SBML import of Boehm, as the generated source and the ids (see the docstring)."""
    import diffsoup as ds

    model = ds.formats.load_sbml(BOEHM_DIR / "model_Boehm_JProteomeRes2014.xml", cache=False)
    assert model.derived_ids == ("BaF3_Epo",) and not model.events  # the rhs is all there is
    path.write_text(json.dumps({
        "source": model.source, "state_ids": list(model.state_ids), "parameter_ids": list(model.parameter_ids),
        "parameter_values": [model.parameter_values[k] for k in model.parameter_ids],
        "y0": [float(v) for v in model.spec.y0], "sha256": model.sha256,
    }))  # fmt: skip


# ------------------------------------------------------------------------------------------------
# One measurement (a fresh process)
# ------------------------------------------------------------------------------------------------


def measure(study_name: str, mode: str, repeats: int, spec_file: Path, min_total_s: float) -> dict:
    import warnings

    warnings.filterwarnings("ignore", message=".*column.*")  # PetabWarning on unknown extra columns
    start = time.perf_counter()
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np

    import diffsoup as ds

    cache_via = _enable_cache(ds, jax)
    events = {"hits": 0, "misses": 0}
    names = {"/jax/compilation_cache/cache_hits": "hits", "/jax/compilation_cache/cache_misses": "misses"}

    def listen(name, **kwargs):
        if name in names:
            events[names[name]] += 1

    # Where the time to the first result goes: JAX's own durations (tracing to a jaxpr, lowering to
    # MLIR, XLA compilation or loading from the cache).
    durations = {"trace": 0.0, "lower": 0.0, "compile_or_load": 0.0}
    duration_names = {"/jax/core/compile/jaxpr_trace_duration": "trace",
                      "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
                      "/jax/core/compile/backend_compile_duration": "compile_or_load"}  # fmt: skip

    def listen_duration(name, seconds, **kwargs):
        if name in duration_names:
            durations[duration_names[name]] += seconds

    jax.monitoring.register_event_listener(listen)
    jax.monitoring.register_event_duration_secs_listener(listen_duration)
    imported = time.perf_counter()
    if study_name == "rober":
        spec, exps, params = rober_study(ds, np)
    elif study_name == "boehm":
        spec, exps, params = boehm_study(ds, np, spec_file)
    elif study_name == "brusselator":
        spec, exps, params = brusselator_study(ds, np)
    t0 = time.perf_counter()
    if study_name in PETAB:  # loading (SBML and formulas to JAX, cached on disk) counts too
        petab_problem = ds.petab.load(PETAB_DIR / study_name / f"{study_name}.yaml")
        problem = petab_problem.study.problem
        lowered = petab_problem.lower()  # rtol = atol = 1e-8
    else:
        problem = spec.build()
        lowered = ds.lower(ds.Study(problem, exps, params))
    t_lowered = time.perf_counter()
    call = getattr(lowered, mode)
    theta = np.asarray(lowered.nominal)
    call(theta)  # returns host (numpy) values: the program has finished
    t_first = time.perf_counter()
    first_events, first_durations = dict(events), dict(durations)
    runs = []  # at least `repeats` calls, more for quick ones: a median of milliseconds is noise otherwise
    while len(runs) < repeats or (sum(runs) < min_total_s and len(runs) < 200):
        t = time.perf_counter()
        call(theta)
        runs.append(time.perf_counter() - t)
    return {
        "first_s": t_first - t0, "build_and_lower_s": t_lowered - t0, "first_call_s": t_first - t_lowered,
        "import_s": imported - start, "run_s": statistics.median(runs), "run_min_s": min(runs), "run_calls": len(runs),
        "cache_hits": first_events["hits"], "cache_misses": first_events["misses"],
        **{f"{k}_s": v for k, v in first_durations.items()},
        "linear_solver": type(problem.linear_solver).__name__, "estimated": len(lowered.nominal),
        "cache_via": cache_via, "diffsoup": str(Path(ds.__file__).parent),
    }  # fmt: skip


def _enable_cache(ds, jax) -> str:
    enable = getattr(ds, "enable_compilation_cache", None)
    if enable is None:
        try:
            from diffsoup._compilation_cache import enable_compilation_cache as enable
        except ImportError:
            enable = None
    if enable is not None:
        enable()
        return "diffsoup"
    directory = Path(os.environ["DIFFSOUP_CACHE_DIR"]) / "jax"
    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    return "jax.config by hand (this checkout has no enable_compilation_cache)"


# ------------------------------------------------------------------------------------------------
# The driver
# ------------------------------------------------------------------------------------------------


def run_measure(tree: Path, study: str, mode: str, cache: Path, repeats: int, spec_file: Path) -> dict:
    dropped = ("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE", "DIFFSOUP_", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    env.update(PYTHONPATH=str(tree), DIFFSOUP_CACHE_DIR=str(cache), JAX_PLATFORMS="cpu", JAX_ENABLE_X64="1")
    command = [sys.executable, str(Path(__file__).resolve()), "--measure", study, mode, "--repeats", str(repeats),
               "--spec-file", str(spec_file)]  # fmt: skip
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800, cwd=str(tree))
    if proc.returncode != 0:
        raise RuntimeError(f"{tree} {study} {mode}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if Path(out["diffsoup"]).resolve() != (tree / "diffsoup").resolve():
        raise RuntimeError(f"{tree}: the measuring process imported diffsoup from {out['diffsoup']}")
    return out


def _fmt(x, spec=".2f"):
    return "failed" if x is None else format(x, spec)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", type=Path, help="another checkout to measure the same way (the 'before' column)")
    parser.add_argument("--studies", nargs="+", choices=STUDIES, default=list(STUDIES))
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--quick", action="store_true",
                        help="at least 3 timed calls per mode adding up to 1 s (instead of 7 and 3 s)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "bench_compile.json")
    parser.add_argument("--measure", nargs=2, metavar=("STUDY", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=7, help=argparse.SUPPRESS)
    parser.add_argument("--spec-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(*args.measure, args.repeats, args.spec_file, 1.0 if args.repeats < 7 else 3.0)))
        return 0

    sys.path.insert(0, str(HERE))
    from _common import machine_info, markdown_table, write_json

    repeats = 3 if args.quick else 7
    trees = [("after", REPO)] + ([("before", args.ref.resolve())] if args.ref else [])
    info = machine_info()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-compile-") as tmp:
        spec_file = Path(tmp) / "boehm_spec.json"
        if "boehm" in args.studies:
            write_boehm_spec(spec_file)
        for study in args.studies:
            for mode in args.modes:
                row = {"study": study, "mode": mode}
                for label, tree in trees:
                    if study in PETAB and label != "after":
                        row[label] = {"error": "no PEtab import in this checkout"}
                        continue
                    cache = Path(tmp) / label / study / mode
                    try:
                        first = run_measure(tree, study, mode, cache, repeats, spec_file)
                        cached = run_measure(tree, study, mode, cache, repeats, spec_file)
                    except RuntimeError as err:  # recorded, the other rows still run
                        row[label] = {"error": str(err).strip().splitlines()[-1]}
                        print(f"{label:>6} {study:>11} {mode:>22}: FAILED {row[label]['error']}", flush=True)
                        continue
                    row[label] = {"first": first, "cached": cached}
                    f, c = first, cached
                    print(f"{label:>6} {study:>11} {mode:>22}: first {f['first_s']:7.2f} s (trace {f['trace_s']:.2f}, "
                          f"lower {f['lower_s']:.2f}, compile {f['compile_or_load_s']:.2f}), "
                          f"cached {c['first_s']:6.2f} s (trace {c['trace_s']:.2f}, lower {c['lower_s']:.2f}, "
                          f"load {c['compile_or_load_s']:.2f}; "
                          f"{c['cache_hits']} hits, {c['cache_misses']} misses), run {f['run_s']:.4f} s",
                          flush=True)  # fmt: skip
                rows.append(row)

    def cell(row, label, which, key):
        return row[label][which][key] if "error" not in row.get(label, {"error": 0}) else None

    headers = ["study", "mode"]
    for label, _ in trees:
        headers += [f"first s ({label})", f"cached s ({label})", f"run s ({label})"]
    headers.append("cached hits/misses (after)")
    table = []
    for row in rows:
        line = [row["study"], row["mode"]]
        for label, _ in trees:
            line += [_fmt(cell(row, label, "first", "first_s")), _fmt(cell(row, label, "cached", "first_s")),
                     _fmt(cell(row, label, "first", "run_s"), ".4f")]  # fmt: skip
        hits = cell(row, "after", "cached", "cache_hits")
        line.append("–" if hits is None else f"{hits}/{cell(row, 'after', 'cached', 'cache_misses')}")
        table.append(line)
    totals = {}
    for label, _ in trees:
        for study in args.studies:
            mine = [r for r in rows if r["study"] == study]
            if len(mine) == len(MODES) and all("error" not in r[label] for r in mine):
                totals[f"{study} three modes first ({label})"] = sum(r[label]["first"]["first_s"] for r in mine)
    checks = {}
    by = {(r["study"], r["mode"]): r for r in rows}
    if ("boehm", "value_and_grad") in by and "error" not in by["boehm", "value_and_grad"]["after"]:
        checks["boehm value_and_grad first <= 10 s"] = by["boehm", "value_and_grad"]["after"]["first"]["first_s"] <= 10
    if "boehm three modes first (after)" in totals:
        checks["boehm three modes first <= 16 s"] = totals["boehm three modes first (after)"] <= 16
    measured = [r["after"] for r in rows if "error" not in r["after"]]
    checks["cached <= 2 s per mode (rows that ran)"] = all(m["cached"]["first_s"] <= 2 for m in measured)
    print()
    print(f"Time to the first result (s) in a fresh process, {info['cpu_count']} CPU cores ({info['cpu']}), load "
          f"average at start {info['load_average_at_start']}; run: median of the calls after it.")  # fmt: skip
    print(markdown_table(headers, table))
    for k, v in totals.items():
        print(f"{k}: {v:.2f} s")
    for k, v in checks.items():
        print(f"target {k}: {'met' if v else 'NOT met'}")
    write_json(args.out, {"machine": info, "repeats": repeats, "trees": {k: str(v) for k, v in trees},
                          "rows": rows, "totals_s": totals, "targets": checks, "note": __doc__})  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
