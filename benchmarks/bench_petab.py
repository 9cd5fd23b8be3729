"""PEtab problems: import, first evaluation (compile) and per-call times of diffsoup's objective,
next to AMICI measured in the same run on the same problem at the same tolerances when AMICI is
importable (the ``bench`` extra).

Per model (the five problems of ``tests/data/petab``), at rtol = atol = 1e-8 (AMICI's benchmark
setting, ``PetabProblem.solver``):

* import: ``ds.petab.load`` with a cold code cache (tables, lint, SBML and formulas to JAX), then
  with a warm one;
* first call and per-call median of ``value`` (negative log-likelihood), ``value_and_grad`` by the
  checkpointed adjoint, and ``residuals_and_jacobian`` (forward sensitivities); the first call
  includes tracing and compiling that mode's program;
* AMICI (when importable): model import + build, and per-call ``simulate``, forward-sensitivity
  and adjoint gradients (``amici.petab``), at the same tolerances.

Without AMICI the AMICI columns say "not installed" and the JSON records ``"amici": null``; the
numbers AMICI 1.0.1 gave on this kind of 2-core machine for Boehm (tests/data/petab/README.md) are
printed beside the table for orientation, marked as not measured in this run.

    python benchmarks/bench_petab.py [--models Boehm Bruno ...] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from _common import RESULTS, fmt, machine_info, markdown_table, median, timed, write_json

import numpy as np  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "petab"
MODELS = ["Boehm_JProteomeRes2014", "Bruno_JExpBot2016", "Fujita_SciSignal2010", "Brannmark_JBC2010", "Weber_BMC2015"]
# What AMICI 1.0.1 measured for Boehm on a 2-core CPU at rtol = atol = 1e-8 (tests/data/petab/README.md).
AMICI_BOEHM_REFERENCE = {"build_s": 16.0, "value_ms": 3.4, "forward_grad_ms": 7.5, "adjoint_grad_ms": 20.1}


def _short(name: str) -> str:
    return name.split("_")[0]


def bench_diffsoup(name: str, repeats: int) -> dict:
    import warnings

    import diffsoup as ds

    yaml = DATA / name / f"{name}.yaml"
    out: dict = {}
    with tempfile.TemporaryDirectory() as cache, warnings.catch_warnings():
        warnings.simplefilter("ignore", ds.petab.PetabWarning)  # the collection's extra columns
        os.environ["DIFFSOUP_CACHE_DIR"] = cache
        t = time.perf_counter()
        problem = ds.petab.load(yaml)
        out["import_cold_s"] = time.perf_counter() - t
        t = time.perf_counter()
        problem = ds.petab.load(yaml)
        out["import_warm_s"] = time.perf_counter() - t
        theta = problem.nominal
        out.update(theta=int(theta.size), experiments=len(problem.study.experiments),
                   measurements=len(problem.tables.measurements), states=problem.study.problem.n_states)  # fmt: skip
        modes = {
            "value": (problem.lower(), lambda lw: lw.value(theta)),
            "adjoint": (problem.lower(gradient="adjoint"), lambda lw: lw.value_and_grad(theta)),
            "forward_jacobian": (problem.lower(), lambda lw: lw.residuals_and_jacobian(theta)),
        }
        for mode, (lowered, call) in modes.items():
            first, steady, result = timed(lambda: call(lowered), repeats)
            out[f"{mode}_first_s"] = first
            out[f"{mode}_ms"] = 1e3 * median(steady)
            if mode == "value":
                out["nll"] = float(result)
        out["compile_all_s"] = sum(out[f"{m}_first_s"] for m in modes)
        os.environ.pop("DIFFSOUP_CACHE_DIR", None)
    return out


def bench_amici(name: str, repeats: int) -> dict | None:
    """AMICI on the same problem and tolerances, or None when it is not importable."""
    try:
        import amici
        import amici.petab.petab_import
        import amici.petab.simulations
        import petab.v1 as petab
    except ImportError:
        return None
    out: dict = {"version": amici.__version__}
    problem = petab.Problem.from_yaml(DATA / name / f"{name}.yaml")
    with tempfile.TemporaryDirectory() as folder:
        t = time.perf_counter()
        model = amici.petab.petab_import.import_petab_problem(problem, model_output_dir=folder, compile_=True)
        out["build_s"] = time.perf_counter() - t
        solver = model.getSolver()
        solver.setRelativeTolerance(1e-8)
        solver.setAbsoluteTolerance(1e-8)

        def run(order, method):
            solver.setSensitivityOrder(order)
            if method is not None:
                solver.setSensitivityMethod(method)
            return amici.petab.simulations.simulate_petab(problem, model, solver=solver)

        for key, order, method in (("value", amici.SensitivityOrder.none, None),
                                   ("forward_grad", amici.SensitivityOrder.first, amici.SensitivityMethod.forward),
                                   ("adjoint_grad", amici.SensitivityOrder.first, amici.SensitivityMethod.adjoint)):  # fmt: skip
            first, steady, result = timed(lambda: run(order, method), repeats)
            out[f"{key}_first_s"] = first
            out[f"{key}_ms"] = 1e3 * median(steady)
            if key == "value":
                out["nll"] = -float(result["llh"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=[_short(m) for m in MODELS])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    chosen = [m for m in MODELS if _short(m) in args.models]
    results = {}
    for name in chosen:
        print(f"[bench_petab] {name} ...", flush=True)
        results[name] = {"diffsoup": bench_diffsoup(name, args.repeats), "amici": bench_amici(name, args.repeats)}
    have_amici = any(r["amici"] for r in results.values())
    headers = ["model", "exp", "θ", "import cold / warm s", "compile value / adjoint / fwd-jac s",
               "value ms", "adjoint grad ms", "fwd res+jac ms", "grad / value",
               "AMICI build s", "AMICI value ms", "AMICI fwd grad ms", "AMICI adjoint ms"]  # fmt: skip
    rows = []
    for name, r in results.items():
        d, a = r["diffsoup"], r["amici"]
        missing = "not installed"
        rows.append([
            _short(name), d["experiments"], d["theta"], f"{d['import_cold_s']:.2f} / {d['import_warm_s']:.2f}",
            f"{d['value_first_s']:.1f} / {d['adjoint_first_s']:.1f} / {d['forward_jacobian_first_s']:.1f}",
            fmt(d["value_ms"]), fmt(d["adjoint_ms"]), fmt(d["forward_jacobian_ms"]),
            fmt(d["adjoint_ms"] / d["value_ms"], ".2f"),
            fmt(a["build_s"]) if a else missing, fmt(a["value_ms"]) if a else missing,
            fmt(a["forward_grad_ms"]) if a else missing, fmt(a["adjoint_grad_ms"]) if a else missing,
        ])  # fmt: skip
    table = markdown_table(headers, rows)
    print()
    print(table)
    if not have_amici:
        ref = AMICI_BOEHM_REFERENCE
        print(f"\nAMICI is not importable here (pip install 'diffsoup[bench]' builds it): its columns are missing. "
              f"For orientation only, not measured in this run: AMICI 1.0.1 on a 2-core CPU, Boehm: build "
              f"{ref['build_s']} s, simulate {ref['value_ms']} ms, forward-sensitivity gradient "
              f"{ref['forward_grad_ms']} ms, adjoint {ref['adjoint_grad_ms']} ms per call.")  # fmt: skip
    write_json(RESULTS / "bench_petab.json", {"machine": machine_info(), "rtol": 1e-8, "atol": 1e-8,
                                              "results": results, "amici_reference_boehm": AMICI_BOEHM_REFERENCE,
                                              "table": table})  # fmt: skip


if __name__ == "__main__":
    main()
