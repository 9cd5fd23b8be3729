"""Importing PEtab problems of many conditions: ``ds.petab.load`` of a synthetic cohort whose study
is held as arrays (``Study.from_arrays``) against the same problem forced through one
``ds.Experiment`` per condition (``arrays=False``), and against another checkout's importer.

    nice -n 10 python benchmarks/bench_petab_import.py                 # 10^4 and 10^5 conditions
    python benchmarks/bench_petab_import.py --sizes 1000               # a quick look
    python benchmarks/bench_petab_import.py --baseline /work/main      # also the importer of another checkout

The problem (written by :func:`write_cohort`): a three-reaction SBML model (``-> A``, ``A -> B``,
``B ->``), one simulation condition per subject setting the rate ``k1`` (a number), the initial
amount of ``A`` (a number) and the production rate ``kin`` (one of two estimated parameters,
``kin_lo``/``kin_hi``); four times; three observables: ``A`` with an estimated sigma, ``scale_b * B +
offset_b`` with a noise parameter per row, and ``A + B`` log-normal at the last time only (9
measurement rows per condition). Six estimated parameters.

Per size and path, the seconds of:

- ``load_s``: ``ds.petab.load(yaml, validate=False)`` (reading and checking the tables, the study);
  the model's and formulas' code come from the disk cache (a load of a 100-condition cohort, the
  same model and formulas, fills it first, untimed);
- ``lower_s``: ``problem.lower()`` (programs compile on first use: not counted);
- ``lint_s``: ``petab.v1.lint_problem`` alone (what ``validate=True`` adds: petab's own per-row
  checks), at the ``--lint-sizes``.

Nothing is compiled or solved. Writes ``benchmarks/results/bench_petab_import.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from _common import RESULTS, machine_info, markdown_table, write_json  # noqa: I001 (sets up the path and x64)

import numpy as np

if os.environ.get("BENCH_BASELINE_ROOT"):  # the baseline's subprocess imports that checkout's diffsoup
    sys.path.insert(0, os.environ["BENCH_BASELINE_ROOT"])

import diffsoup as ds  # noqa: E402

TIMES = (0.5, 1.0, 2.0, 4.0)
SBML = """<?xml version="1.0" encoding="UTF-8"?>
<sbml xmlns="http://www.sbml.org/sbml/level3/version1/core" level="3" version="1">
  <model id="cohort">
    <listOfCompartments><compartment id="cell" size="1" constant="true" spatialDimensions="3"/></listOfCompartments>
    <listOfSpecies>
      <species id="A" compartment="cell" initialConcentration="1" hasOnlySubstanceUnits="false"
               boundaryCondition="false" constant="false"/>
      <species id="B" compartment="cell" initialConcentration="0" hasOnlySubstanceUnits="false"
               boundaryCondition="false" constant="false"/>
    </listOfSpecies>
    <listOfParameters>
      <parameter id="k1" value="0.5" constant="true"/>
      <parameter id="k2" value="0.2" constant="true"/>
      <parameter id="kin" value="0.1" constant="true"/>
    </listOfParameters>
    <listOfReactions>
      <reaction id="make" reversible="false" fast="false">
        <listOfProducts><speciesReference species="A" stoichiometry="1" constant="true"/></listOfProducts>
        <kineticLaw><math xmlns="http://www.w3.org/1998/Math/MathML"><ci>kin</ci></math></kineticLaw>
      </reaction>
      <reaction id="convert" reversible="false" fast="false">
        <listOfReactants><speciesReference species="A" stoichiometry="1" constant="true"/></listOfReactants>
        <listOfProducts><speciesReference species="B" stoichiometry="1" constant="true"/></listOfProducts>
        <kineticLaw><math xmlns="http://www.w3.org/1998/Math/MathML">
          <apply><times/><ci>k1</ci><ci>A</ci></apply></math></kineticLaw>
      </reaction>
      <reaction id="decay" reversible="false" fast="false">
        <listOfReactants><speciesReference species="B" stoichiometry="1" constant="true"/></listOfReactants>
        <kineticLaw><math xmlns="http://www.w3.org/1998/Math/MathML">
          <apply><times/><ci>k2</ci><ci>B</ci></apply></math></kineticLaw>
      </reaction>
    </listOfReactions>
  </model>
</sbml>
"""


def write_cohort(folder: Path, n_conditions: int, *, seed: int = 0) -> Path:
    """The synthetic cohort problem of ``n_conditions`` conditions in ``folder``; returns its YAML."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.xml").write_text(SBML)
    ids = np.char.add("s", np.arange(n_conditions).astype(str))
    pd.DataFrame({"conditionId": ids, "k1": rng.uniform(0.2, 1.0, n_conditions).round(6),
                  "A": rng.uniform(0.5, 2.0, n_conditions).round(6),
                  "kin": np.where(np.arange(n_conditions) % 2 == 0, "kin_lo", "kin_hi")}).to_csv(
        folder / "conditions.tsv", sep="\t", index=False)  # fmt: skip
    times = np.array(TIMES)
    T = times.size
    blocks = [
        pd.DataFrame({"observableId": "obs_a", "simulationConditionId": np.repeat(ids, T),
                      "time": np.tile(times, n_conditions), "observableParameters": "", "noiseParameters": "",
                      "measurement": rng.uniform(0.3, 2.0, n_conditions * T).round(6)}),
        pd.DataFrame({"observableId": "obs_b", "simulationConditionId": np.repeat(ids, T),
                      "time": np.tile(times, n_conditions), "observableParameters": "scale_b",
                      "noiseParameters": np.tile(0.05 + 0.02 * times, n_conditions).round(6),
                      "measurement": rng.uniform(0.0, 1.0, n_conditions * T).round(6)}),
        pd.DataFrame({"observableId": "obs_total", "simulationConditionId": ids, "time": times[-1],
                      "observableParameters": "", "noiseParameters": "",
                      "measurement": rng.uniform(0.5, 2.5, n_conditions).round(6)}),
    ]  # fmt: skip
    meas = pd.concat(blocks, ignore_index=True)
    meas.insert(1, "preequilibrationConditionId", "")
    meas.to_csv(folder / "measurements.tsv", sep="\t", index=False)
    pd.DataFrame([
        {"observableId": "obs_a", "observableFormula": "A", "observableTransformation": "lin",
         "noiseFormula": "sd_a", "noiseDistribution": "normal"},
        {"observableId": "obs_b", "observableFormula": "observableParameter1_obs_b * B + offset_b",
         "observableTransformation": "lin", "noiseFormula": "noiseParameter1_obs_b", "noiseDistribution": "normal"},
        {"observableId": "obs_total", "observableFormula": "A + B", "observableTransformation": "log",
         "noiseFormula": "0.1", "noiseDistribution": "normal"},
    ]).to_csv(folder / "observables.tsv", sep="\t", index=False)  # fmt: skip
    rows = [("k2", "log10", 1e-3, 1e2, 0.2), ("kin_lo", "log10", 1e-3, 1e2, 0.05), ("kin_hi", "log10", 1e-3, 1e2, 0.2),
            ("sd_a", "log10", 1e-3, 1e2, 0.1), ("scale_b", "log10", 1e-3, 1e2, 1.5), ("offset_b", "lin", -1, 1, 0.1)]
    pd.DataFrame([{"parameterId": p, "parameterScale": s, "lowerBound": lo, "upperBound": hi, "nominalValue": v,
                   "estimate": 1} for p, s, lo, hi, v in rows]).to_csv(folder / "parameters.tsv", sep="\t", index=False)
    yaml = folder / "problem.yaml"
    yaml.write_text(textwrap.dedent("""\
        format_version: 1
        parameter_file: parameters.tsv
        problems:
        - condition_files: [conditions.tsv]
          measurement_files: [measurements.tsv]
          observable_files: [observables.tsv]
          sbml_files: [model.xml]
        """))
    return yaml


def load(yaml: Path, path: str):
    """``ds.petab.load`` on ``path`` ("arrays", "objects", or "before": the checkout's default)."""
    if path == "before":
        return ds.petab.load(yaml, validate=False)
    return ds.petab.load(yaml, validate=False, arrays=path == "arrays")


def measure(yaml: Path, path: str, E: int) -> dict:
    t = time.perf_counter()
    problem = load(yaml, path)
    t_load = time.perf_counter() - t
    t = time.perf_counter()
    problem.lower()
    t_lower = time.perf_counter() - t
    arrays = getattr(problem.study, "arrays", None) is not None
    return {"path": path, "conditions": E, "measurements": int(len(problem.petab_problem.measurement_df)),
            "load_s": t_load, "lower_s": t_lower, "held_as_arrays": arrays}  # fmt: skip


def lint_seconds(yaml: Path) -> float:
    import petab.v1 as petab

    problem = petab.Problem.from_yaml(str(yaml))
    t = time.perf_counter()
    petab.lint_problem(problem)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000])
    ap.add_argument("--object-sizes", type=int, nargs="*", default=None, help="sizes also loaded as Experiment objects")
    ap.add_argument("--baseline", default=None, help="a checkout whose importer also loads the problems (subprocess)")
    ap.add_argument("--baseline-sizes", type=int, nargs="*", default=None, help="sizes the baseline loads (default: all)")
    ap.add_argument("--lint-sizes", type=int, nargs="*", default=[10_000], help="sizes petab's lint is timed at")
    ap.add_argument("--folder", default=None, help="where the problems are written (default: a temporary folder)")
    ap.add_argument("--baseline-only", action="store_true", help=argparse.SUPPRESS)  # the baseline's subprocess
    a = ap.parse_args()
    folder = Path(a.folder or tempfile.mkdtemp(prefix="bench-petab-import-"))
    yamls = {E: folder / f"cohort{E}" / "problem.yaml" for E in a.sizes}
    warm = write_cohort(folder / "warm", 100)
    if a.baseline_only:
        load(warm, "before")  # fills the code cache, warms the imports
        print("RECORDS" + json.dumps([measure(yamls[E], "before", E) for E in a.sizes]))
        return
    object_sizes = a.sizes if a.object_sizes is None else a.object_sizes
    for path in ("arrays", "objects"):
        load(warm, path)
    records = []
    for E in a.sizes:
        write_cohort(yamls[E].parent, E)
        for path in ["arrays"] + (["objects"] if E in object_sizes else []):
            rec = measure(yamls[E], path, E)
            records.append(rec)
            print(f"{path:8} E={E:>7}: load {rec['load_s']:.2f} s, lower {rec['lower_s']:.2f} s "
                  f"(held as arrays: {rec['held_as_arrays']})", flush=True)  # fmt: skip
        if E in a.lint_sizes:
            records.append({"path": "lint", "conditions": E, "lint_s": lint_seconds(yamls[E])})
            print(f"lint     E={E:>7}: {records[-1]['lint_s']:.2f} s", flush=True)
    if a.baseline:
        env = dict(os.environ, BENCH_BASELINE_ROOT=str(Path(a.baseline).resolve()))
        proc = subprocess.run([sys.executable, __file__, "--baseline-only", "--folder", str(folder), "--sizes",
                               *map(str, a.sizes if a.baseline_sizes is None else a.baseline_sizes)], env=env,
                              capture_output=True, text=True)  # fmt: skip
        if proc.returncode != 0:
            raise SystemExit(f"the baseline failed:\n{proc.stderr[-3000:]}")
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RECORDS")][0]
        for rec in json.loads(line[len("RECORDS"):]):
            rec.update(checkout=str(a.baseline))
            records.append(rec)
            print(f"before   E={rec['conditions']:>7} ({a.baseline}): load {rec['load_s']:.2f} s, lower "
                  f"{rec['lower_s']:.2f} s", flush=True)  # fmt: skip
    by = {(r["path"], r["conditions"]): r for r in records}
    rows = []
    for E in a.sizes:
        r, o, b, lint = by[("arrays", E)], by.get(("objects", E)), by.get(("before", E)), by.get(("lint", E))

        def cell(x, key="load_s"):
            return f"{x[key]:.2f}" if x else "–"

        rows.append([f"{E:,}", f"{r['measurements']:,}", cell(r), cell(r, "lower_s"), cell(o), cell(o, "lower_s"),
                     f"{o['load_s'] / r['load_s']:.0f}x" if o else "–", cell(b),
                     f"{b['load_s'] / r['load_s']:.0f}x" if b else "–", cell(lint, "lint_s")])  # fmt: skip
    table = markdown_table(["conditions", "measurements", "arrays load s", "lower s", "objects load s", "lower s",
                            "objects/arrays", "before load s", "before/arrays", "petab lint s"], rows)  # fmt: skip
    print(table)
    write_json(RESULTS / "bench_petab_import.json", {
        "machine": machine_info(), "problem": __doc__.split("\n\n")[2], "records": records, "table": table,
    })  # fmt: skip
    if a.folder is None:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
