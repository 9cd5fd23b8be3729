"""pyPESTO + fides + AMICI's side of ``bench_fits.py``: run by the interpreter that has them (a
subprocess, as ``_amici_petab.py``), so that AMICI may live in another virtual environment than
diffsoup. Imports neither diffsoup nor JAX.

    python _pypesto_fits.py --yaml PROBLEM.yaml --starts STARTS.json --out RESULT.json [--rtol 1e-8] [--atol 1e-8]

``STARTS.json``: ``{"names": [parameter ids], "points": [[scaled values], ...]}``, the start points
(on the parameter table's scales) of the estimated parameters, the same that diffsoup starts from.

The problem is imported with ``pypesto.petab.PetabImporter`` (AMICI builds and compiles the model
into a temporary folder: ``build_s``, ``build_cpu_s`` with the compiler's processes); the
objective is pyPESTO's ``AmiciObjective`` (forward sensitivities, the Fisher information as the
Hessian) with the solver at ``--rtol``/``--atol``; each start is one ``pypesto.optimize.minimize``
with ``FidesOptimizer()`` (its defaults: fides' options, the objective's Hessian) from that start,
timed on the wall clock and on this process's CPU clock. Writes one JSON object to ``--out``:
``starts`` (per start: ``fval``, ``n_fval``, ``n_grad``, ``n_hess``, ``exitflag``, ``message``,
``seconds``, ``cpu_seconds``, ``x``), ``nominal_fval``, versions, tolerances; ``error`` (a
traceback) when something failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import resource
import sys
import tempfile
import time
import traceback
from pathlib import Path


def _cpu_with_children() -> float:
    """CPU seconds of this process and of its finished children (the compiler AMICI's build runs)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _finite_or_none(value) -> float | None:
    value = float(value) if value is not None else math.nan
    return value if math.isfinite(value) else None


def run(yaml_path: Path, starts: dict, rtol: float, atol: float) -> dict:
    # AMICI's build runs cmake, ninja and swig, which its virtual environment's bin/ holds.
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    import numpy as np
    import petab.v1 as petab

    import amici
    import fides
    import pypesto
    import pypesto.optimize
    import pypesto.petab

    logging.disable(logging.WARNING)  # AMICI's import logs every step at DEBUG level
    out: dict = {"python": sys.executable, "versions": {"amici": amici.__version__, "pypesto": pypesto.__version__,
                                                        "fides": fides.__version__}}  # fmt: skip
    problem_tables = petab.Problem.from_yaml(yaml_path)
    name = yaml_path.stem
    with tempfile.TemporaryDirectory(prefix="bench_fits_amici_") as folder:
        t, c = time.perf_counter(), _cpu_with_children()
        importer = pypesto.petab.PetabImporter(problem_tables, output_folder=folder,
                                               model_name=f"{name.split('_')[0]}_fits_{os.getpid()}")  # fmt: skip
        problem = importer.create_problem()
        out["build_s"] = time.perf_counter() - t
        out["build_cpu_s"] = _cpu_with_children() - c
        objective = problem.objective
        solver = objective.amici_solver
        solver.set_relative_tolerance(rtol)
        solver.set_absolute_tolerance(atol)
        out["tolerances"] = {"rtol": solver.get_relative_tolerance(), "atol": solver.get_absolute_tolerance(),
                             "sensitivity_method": str(solver.get_sensitivity_method())}  # fmt: skip
        names = list(problem.x_names)
        free = [names[i] for i in problem.x_free_indices]
        missing = sorted(set(free) - set(starts["names"]))
        if missing:
            raise ValueError(f"the start points lack the estimated parameters {missing}")
        full = np.asarray(problem_tables.x_nominal_scaled, dtype=np.float64)
        out["nominal_fval"] = _finite_or_none(objective(full[problem.x_free_indices]))
        optimizer = pypesto.optimize.FidesOptimizer(verbose=logging.ERROR)
        options = pypesto.optimize.OptimizeOptions(allow_failed_starts=True)
        engine = pypesto.engine.SingleCoreEngine()
        records = []
        for i, point in enumerate(starts["points"]):
            x0 = full.copy()
            for pid, value in zip(starts["names"], point):
                x0[names.index(pid)] = float(value)
            problem.set_x_guesses(x0[None])
            t, c = time.perf_counter(), time.process_time()
            result = pypesto.optimize.minimize(problem, optimizer, n_starts=1, ids=[f"start-{i:03d}"], engine=engine,
                                               progress_bar=False, options=options)  # fmt: skip
            wall, cpu = time.perf_counter() - t, time.process_time() - c
            r = result.optimize_result.list[0]
            x = np.asarray(r.x, dtype=np.float64) if r.x is not None else np.full(len(names), np.nan)
            records.append({
                "fval": _finite_or_none(r.fval), "n_fval": int(r.n_fval or 0), "n_grad": int(r.n_grad or 0),
                "n_hess": int(r.n_hess or 0), "n_res": int(r.n_res or 0), "n_sres": int(r.n_sres or 0),
                "exitflag": None if r.exitflag is None else int(r.exitflag), "message": str(r.message),
                "seconds": wall, "cpu_seconds": cpu, "optimizer_seconds": float(r.time or 0.0),
                "x": {pid: float(x[names.index(pid)]) for pid in free},
            })  # fmt: skip
            print(f"[pypesto] {name} start {i}: fval {records[-1]['fval']}, {records[-1]['n_fval']} evaluations, "
                  f"{wall:.1f} s", flush=True)  # fmt: skip
        out["starts"] = records
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--yaml", type=Path, required=True)
    parser.add_argument("--starts", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rtol", type=float, default=1e-8)
    parser.add_argument("--atol", type=float, default=1e-8)
    args = parser.parse_args()
    try:
        result = run(args.yaml.resolve(), json.loads(args.starts.read_text()), args.rtol, args.atol)
    except Exception:  # reported to the benchmark, which prints it and carries on without pyPESTO
        result = {"error": traceback.format_exc()}
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
