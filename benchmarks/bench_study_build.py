"""Building, lowering and packing studies of 10^4 to 10^6 experiments: a study held as arrays
(``ds.Study.from_arrays``) against the same experiments built as ``ds.Experiment`` objects.

    nice -n 10 python benchmarks/bench_study_build.py            # 10^4, 10^5, 10^6 (objects at 10^4, 10^5)
    python benchmarks/bench_study_build.py --quick               # 10^4 only
    python benchmarks/bench_study_build.py --baseline /work/main # also the objects with another checkout

The study: the 20-species mass-action network (``ds.examples.mass_action_network(20, 25, seed=3)``,
25 rate constants estimated, log10), every experiment its own initial state (uniform in [0.2, 2]),
4 measurement times, all 20 states observed (random positive data), Gaussian noise of 0.05.
Nothing is compiled or solved: the figures are host work before the first evaluation.

Per size and path (arrays, objects):

- ``build_s``: ``Study.from_arrays(...)`` from NumPy arrays, or building one ``ds.Experiment`` per
  row and ``ds.Study(...)`` of them (the objects' time counts both);
- ``lower_s``: ``ds.lower(study)`` (the ``InferenceProblem`` and the ``LoweredStudy``; programs
  compile on first use and are not counted);
- ``pack_s``: packing every chunk's arrays (``InferenceProblem.pack``, ``DEFAULT_CHUNK`` = 256
  experiments per chunk, the last one padded) as the evaluations do before putting them on the
  device (the device transfer is not counted);
- ``held_bytes_per_experiment``: memory that the study and the lowered study hold beyond the
  input arrays (tracemalloc, which NumPy reports to: the net allocation of building and lowering,
  measured in a second pass so that timing runs without tracing); the objects' figure is measured
  at 10^4 only (it is per experiment). ``data_bytes_per_experiment``: the input (times, data, y0).
- ``packed_bytes_per_experiment``: the packed arrays of one lane (what a chunk puts on the device).

``--baseline DIR`` also times the objects' path with the diffsoup of another checkout (say, the
code before issue 25, which made ``ds.Study`` of objects faster too), in a subprocess: the path
``objects@baseline``.

Targets (issue 25, 2-core CPU): 10^6 experiments built and lowered in at most 30 s, at most 2 KB of
host memory per experiment beyond its data. The first chunk packed from the arrays is compared with
the same chunk packed from the objects (they must be equal). Writes
``benchmarks/results/bench_study_build.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

from _common import RESULTS, machine_info, markdown_table, write_json  # noqa: I001 (sets up the path and x64)

import numpy as np

if os.environ.get("BENCH_BASELINE_ROOT"):  # the baseline's subprocess imports that checkout's diffsoup
    sys.path.insert(0, os.environ["BENCH_BASELINE_ROOT"])

import diffsoup as ds  # noqa: E402
from diffsoup.inference import Gaussian, Parameter
from diffsoup.inference.objective._lower import DEFAULT_CHUNK

TARGET_SECONDS = 30.0
TARGET_BYTES = 2048
TIMES = np.array([0.2, 1.0, 3.0, 6.0])


def inputs(E: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    y0 = rng.uniform(0.2, 2.0, (E, 20))
    data = rng.uniform(0.1, 2.0, (E, TIMES.size, 20))
    return y0, data


def build_arrays(problem, params, y0, data):
    return ds.Study.from_arrays(problem, TIMES, data, y0=y0, noise=Gaussian(0.05), parameters=params,
                                ids=np.char.add("x", np.arange(data.shape[0]).astype(str)))  # fmt: skip


def build_objects(problem, params, y0, data):
    exps = [ds.Experiment(f"x{i}", TIMES, data[i], noise=Gaussian(0.05), y0=y0[i]) for i in range(data.shape[0])]
    return ds.Study(problem, exps, params)


def pack_all(low) -> tuple[float, dict]:
    """Seconds to pack every chunk of the (one) group; the first chunk's arrays."""
    problem = low.problem
    group = problem.groups[0]
    members = np.arange(len(problem.study.experiments))
    lanes = min(DEFAULT_CHUNK, members.size)
    first = None
    t = time.perf_counter()
    for a in range(0, members.size, lanes):
        order = np.full(lanes, -1, dtype=np.int64)
        rows = members[a : a + lanes]
        order[: rows.size] = rows
        arrs = problem.pack(group, order)
        first = arrs if first is None else first
    return time.perf_counter() - t, first


def measure(path: str, problem, params, E: int, *, memory: bool, pack: bool) -> dict:
    y0, data = inputs(E)
    build = build_arrays if path == "arrays" else build_objects
    gc.collect()
    t = time.perf_counter()
    study = build(problem, params, y0, data)
    t_build = time.perf_counter() - t
    t = time.perf_counter()
    low = ds.lower(study)
    t_lower = time.perf_counter() - t
    rec = {"path": path, "experiments": E, "build_s": t_build, "lower_s": t_lower, "build_and_lower_s": t_build + t_lower,
           "data_bytes_per_experiment": (data.nbytes + y0.nbytes) / E}  # fmt: skip
    first = None
    if pack:
        rec["pack_s"], first = pack_all(low)
        rec["packed_bytes_per_experiment"] = sum(np.asarray(v).nbytes for _, v in first.items()) / DEFAULT_CHUNK
    del study, low
    if memory:
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        study = build(problem, params, y0, data)
        low = ds.lower(study)
        gc.collect()
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rec["held_bytes_per_experiment"] = (held - base) / E
        rec["peak_bytes_per_experiment"] = (peak - base) / E
        del study, low
    return rec, first


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10^4 experiments only")
    ap.add_argument("--sizes", type=int, nargs="*", default=None)
    ap.add_argument("--object-sizes", type=int, nargs="*", default=None, help="sizes also built as Experiment objects")
    ap.add_argument("--baseline", default=None, help="a checkout whose diffsoup also builds the objects (subprocess)")
    ap.add_argument("--objects-only", action="store_true", help=argparse.SUPPRESS)  # the baseline's subprocess
    a = ap.parse_args()
    if a.objects_only:
        net = ds.examples.mass_action_network(20, 25, seed=3)
        problem = net.to_spec(y0=np.ones(20)).build()
        params = [Parameter(k, v, v / 10, v * 10) for k, v in net.parameters.items()]
        out = [dict(measure("objects", problem, params, E, memory=False, pack=True)[0], diffsoup=ds.__file__)
               for E in a.sizes]
        print("RECORDS" + json.dumps(out))
        return
    sizes = a.sizes or ([10_000] if a.quick else [10_000, 100_000, 1_000_000])
    object_sizes = a.object_sizes if a.object_sizes is not None else [s for s in sizes if s <= 100_000]
    machine = machine_info()
    net = ds.examples.mass_action_network(20, 25, seed=3)
    problem = net.to_spec(y0=np.ones(20)).build()
    params = [Parameter(k, v, v / 10, v * 10) for k, v in net.parameters.items()]
    records, checks = [], {}
    for E in sizes:
        rec, first = measure("arrays", problem, params, E, memory=True, pack=True)
        records.append(rec)
        print(f"arrays  E={E:>8}: build {rec['build_s']:.2f} s, lower {rec['lower_s']:.2f} s, pack {rec['pack_s']:.2f} s, "
              f"held {rec['held_bytes_per_experiment']:.0f} B/experiment", flush=True)  # fmt: skip
        if E in object_sizes:
            orec, ofirst = measure("objects", problem, params, E, memory=E == min(object_sizes), pack=True)
            records.append(orec)
            same = [n for n, _ in first.items()] == [n for n, _ in ofirst.items()] and all(
                np.array_equal(x, y) for (_, x), (_, y) in zip(first.items(), ofirst.items()))
            checks[E] = same
            held = orec.get("held_bytes_per_experiment")
            print(f"objects E={E:>8}: build {orec['build_s']:.2f} s, lower {orec['lower_s']:.2f} s, pack "
                  f"{orec['pack_s']:.2f} s" + (f", held {held:.0f} B/experiment" if held else "")
                  + f"; first chunk equal to the arrays': {same}", flush=True)  # fmt: skip
            if not same:
                raise SystemExit("bench_study_build: the arrays' first chunk differs from the objects'.")
    if a.baseline:
        env = dict(os.environ, BENCH_BASELINE_ROOT=str(Path(a.baseline).resolve()))
        proc = subprocess.run([sys.executable, __file__, "--objects-only", "--sizes", *map(str, object_sizes)], env=env,
                              capture_output=True, text=True, check=True)  # fmt: skip
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RECORDS")][0]
        for rec in json.loads(line[len("RECORDS"):]):
            rec.update(path="objects@baseline", checkout=str(a.baseline))
            records.append(rec)
            print(f"objects E={rec['experiments']:>8} ({a.baseline}): build {rec['build_s']:.2f} s, lower "
                  f"{rec['lower_s']:.2f} s, pack {rec['pack_s']:.2f} s", flush=True)  # fmt: skip
    by = {(r["path"], r["experiments"]): r for r in records}
    rows, ratios = [], {}
    for E in sizes:
        r = by[("arrays", E)]
        o = by.get(("objects", E))
        ratio = o["build_and_lower_s"] / r["build_and_lower_s"] if o else None
        pack_ratio = o["pack_s"] / r["pack_s"] if o else None
        ratios[E] = {"build_and_lower_objects_over_arrays": ratio, "pack_objects_over_arrays": pack_ratio}
        b = by.get(("objects@baseline", E))
        if b:
            ratios[E]["build_and_lower_baseline_objects_over_arrays"] = b["build_and_lower_s"] / r["build_and_lower_s"]
            ratios[E]["pack_baseline_objects_over_arrays"] = b["pack_s"] / r["pack_s"]
        rows.append([f"{E:,}", f"{r['build_s']:.2f}", f"{r['lower_s']:.2f}", f"{r['pack_s']:.2f}",
                     f"{r['held_bytes_per_experiment']:.0f}", f"{o['build_s']:.1f}" if o else "–",
                     f"{o['lower_s']:.2f}" if o else "–", f"{o['pack_s']:.2f}" if o else "–",
                     f"{ratio:.0f}x" if ratio else "–", f"{pack_ratio:.0f}x" if pack_ratio else "–"]
                    + ([f"{b['build_and_lower_s']:.1f}" if b else "–"] if a.baseline else []))  # fmt: skip
    table = markdown_table(["experiments", "arrays build s", "lower s", "pack s", "held B/exp", "objects build s",
                            "lower s", "pack s", "build+lower objects/arrays", "pack objects/arrays"]
                           + (["baseline objects build+lower s"] if a.baseline else []), rows)  # fmt: skip
    print(table)
    objects_held = [r["held_bytes_per_experiment"] for r in records if r["path"] == "objects" and
                    "held_bytes_per_experiment" in r]  # fmt: skip
    largest = by[("arrays", max(sizes))]
    targets = {
        "experiments": max(sizes),
        "build_and_lower_s": largest["build_and_lower_s"], "build_and_lower_target_s": TARGET_SECONDS,
        "build_and_lower_met": largest["build_and_lower_s"] <= TARGET_SECONDS,
        "held_bytes_per_experiment": largest["held_bytes_per_experiment"], "held_bytes_target": TARGET_BYTES,
        "held_bytes_met": largest["held_bytes_per_experiment"] <= TARGET_BYTES,
    }  # fmt: skip
    print(f"targets at {max(sizes):,} experiments: build+lower {largest['build_and_lower_s']:.1f} s "
          f"(<= {TARGET_SECONDS:.0f} s: {targets['build_and_lower_met']}), held "
          f"{largest['held_bytes_per_experiment']:.0f} B/experiment (<= {TARGET_BYTES}: {targets['held_bytes_met']})"
          + (f"; objects hold {objects_held[0]:.0f} B/experiment" if objects_held else ""))  # fmt: skip
    name = "bench_study_build_quick.json" if a.quick else "bench_study_build.json"
    write_json(RESULTS / name, {
        "machine": machine, "study": "mass_action_network(20, 25, seed=3), 4 times, 20 observed states, y0 per "
        "experiment, Gaussian(0.05), 25 parameters", "chunk": DEFAULT_CHUNK, "records": records,
        "ratios": {str(k): v for k, v in ratios.items()}, "first_chunk_equal": {str(k): v for k, v in checks.items()},
        "targets": targets, "table": table,
    })  # fmt: skip


if __name__ == "__main__":
    main()
