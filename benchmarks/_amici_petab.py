"""AMICI's side of ``bench_petab.py``: run by the AMICI interpreter in a subprocess, so that AMICI
may live in another virtual environment than diffsoup (and its C++ extension and threads stay out
of the JAX process). Imports neither diffsoup nor JAX.

    python _amici_petab.py --yaml PROBLEM.yaml --out RESULT.json [--repeats 5] [--rtol 1e-8] [--atol 1e-8]

Writes one JSON object to ``--out``:

* ``import_amici_s``: ``import amici`` and its PEtab modules;
* ``build_s``: ``import_petab_problem`` (SBML to C++ code, and the model extension compiled by
  g++ into a temporary folder, removed afterwards); ``build_cpu_s`` its CPU time, the compiler's
  processes included;
* per mode (``value``: no sensitivities; ``forward_grad``: first-order forward sensitivities;
  ``adjoint_grad``: first-order adjoint), ``{mode}_first_s`` (first call) and ``{mode}_ms``, the
  median of timed calls of ``run_simulations`` on every condition's ``ExpData`` (measurements,
  parameters and fixed parameters filled in once beforehand: the solver's call from Python,
  with the log-likelihood and, for the gradients, ``sllh`` per condition), ``{mode}_cpu_ms`` (the
  median CPU time of the same calls: on a loaded machine the fairer clock), ``{mode}_objective_ms``
  and ``{mode}_objective_cpu_ms`` (the same of ``simulate_petab`` with ready ExpData and parameter
  mapping: filling in the parameters and summing ``sllh`` over the problem's parameters, in
  Python, on top) and ``{mode}_amici_clock_ms`` (AMICI's own ``cpu_time`` + ``cpu_time_b``
  summed over conditions, the pre-equilibration's included, of the last timed call);
* ``llh`` (at the nominal point), ``sllh_forward`` and ``sllh_adjoint`` (gradients of ``llh`` by
  parameter id, on the parameter table's scales), the solver's tolerances, status of every
  condition, AMICI's version; ``error`` (a traceback) when something failed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path


def _repeats_for(seconds_one_call: float, repeats: int, min_total: float = 1.0, max_repeats: int = 25) -> int:
    # As benchmarks/_common.repeats_for: quick calls are repeated until they add up to a second.
    if seconds_one_call <= 0:
        return max_repeats
    return max(repeats, min(max_repeats, math.ceil(min_total / seconds_one_call)))


def _timed(fn, repeats: int):
    """``(first seconds, [wall seconds], [CPU seconds], last result)`` as ``_common.timed``."""
    t = time.perf_counter()
    out = fn()
    first = time.perf_counter() - t
    times: list[float] = []
    cpu: list[float] = []
    count = repeats
    while len(times) < count:
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        if len(times) == 1:
            count = _repeats_for(times[0], repeats)
    return first, times, cpu, out


def _cpu_with_children() -> float:
    """CPU seconds of this process and of its finished children (the compiler AMICI's build runs)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def run(yaml_path: Path, repeats: int, rtol: float, atol: float) -> dict:
    # AMICI's build runs cmake, ninja and swig, which its virtual environment's bin/ holds.
    bin_dir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    out: dict = {"python": sys.executable}
    t = time.perf_counter()
    import amici
    import petab.v1 as petab
    from amici.importers.petab.v1 import import_petab_problem
    from amici.sim.sundials import SensitivityMethod, SensitivityOrder, run_simulations
    from amici.sim.sundials.petab.v1 import create_edatas, fill_in_parameters, simulate_petab
    from amici.sim.sundials.petab.v1._parameter_mapping import create_parameter_mapping

    out["import_amici_s"] = time.perf_counter() - t
    out["version"] = amici.__version__
    problem = petab.Problem.from_yaml(yaml_path)
    name = yaml_path.stem
    with tempfile.TemporaryDirectory(prefix="bench_amici_") as folder:
        t, c = time.perf_counter(), _cpu_with_children()
        # A fresh module name per run: AMICI imports the built extension as a Python module.
        model = import_petab_problem(problem, output_dir=folder, model_name=f"{name.split('_')[0]}_bench_{os.getpid()}",
                                     compile_=True)  # fmt: skip
        out["build_s"] = time.perf_counter() - t
        out["build_cpu_s"] = _cpu_with_children() - c
        solver = model.create_solver()
        solver.set_relative_tolerance(rtol)
        solver.set_absolute_tolerance(atol)
        out["tolerances"] = {
            "rtol": solver.get_relative_tolerance(), "atol": solver.get_absolute_tolerance(),
            "rtol_fsa": solver.get_relative_tolerance_fsa(), "atol_fsa": solver.get_absolute_tolerance_fsa(),
            "rtol_b": solver.get_relative_tolerance_b(), "atol_b": solver.get_absolute_tolerance_b(),
            "rtol_quadratures": solver.get_relative_tolerance_quadratures(),
            "atol_quadratures": solver.get_absolute_tolerance_quadratures(),
            "max_steps": solver.get_max_steps(),
        }  # fmt: skip

        conditions = problem.get_simulation_conditions_from_measurement_df()
        mapping = create_parameter_mapping(petab_problem=problem, simulation_conditions=conditions,
                                           scaled_parameters=True, amici_model=model)  # fmt: skip
        edatas = create_edatas(amici_model=model, petab_problem=problem, simulation_conditions=conditions)
        nominal = dict(zip(problem.x_ids, problem.get_x_nominal(scaled=True), strict=True))
        nominal = {k: v for k, v in nominal.items() if k in mapping.free_symbols}
        fill_in_parameters(edatas=edatas, problem_parameters=nominal, scaled_parameters=True,
                           parameter_mapping=mapping, amici_model=model)  # fmt: skip
        out["conditions"] = len(edatas)

        modes = (("value", SensitivityOrder.none, SensitivityMethod.none),
                 ("forward_grad", SensitivityOrder.first, SensitivityMethod.forward),
                 ("adjoint_grad", SensitivityOrder.first, SensitivityMethod.adjoint))  # fmt: skip
        for key, order, method in modes:
            solver.set_sensitivity_order(order)
            solver.set_sensitivity_method(method)

            def solve():
                rdatas = run_simulations(model, solver, edatas)
                return rdatas, sum(float(r["llh"]) for r in rdatas)

            first, steady, cpu, (rdatas, llh) = _timed(solve, repeats)
            out[f"{key}_first_s"] = first
            out[f"{key}_ms"] = 1e3 * statistics.median(steady)
            out[f"{key}_cpu_ms"] = 1e3 * statistics.median(cpu)
            clocks = ("cpu_time", "cpu_time_b", "preeq_cpu_time", "preeq_cpu_time_b")
            out[f"{key}_amici_clock_ms"] = sum(float(r[c]) for r in rdatas for c in clocks)  # AMICI's clocks: ms
            out[f"{key}_status"] = [int(r["status"]) for r in rdatas]
            if key == "value":
                out["llh"] = llh

            def objective():
                return simulate_petab(problem, amici_model=model, solver=solver, edatas=edatas,
                                      parameter_mapping=mapping, problem_parameters=nominal,
                                      scaled_parameters=True, scaled_gradients=True)  # fmt: skip

            _, steady, cpu, result = _timed(objective, max(3, repeats // 2))
            out[f"{key}_objective_ms"] = 1e3 * statistics.median(steady)
            out[f"{key}_objective_cpu_ms"] = 1e3 * statistics.median(cpu)
            if key != "value":
                out[f"sllh_{key.split('_')[0]}"] = {k: float(v) for k, v in (result["sllh"] or {}).items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--yaml", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rtol", type=float, default=1e-8)
    parser.add_argument("--atol", type=float, default=1e-8)
    args = parser.parse_args()
    try:
        result = run(args.yaml.resolve(), args.repeats, args.rtol, args.atol)
    except Exception:  # reported to the benchmark, which prints it and carries on without AMICI
        result = {"error": traceback.format_exc()}
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
