"""ds.distributed.run over 1, 2 and 4 Dask CPU workers: one value+gradient evaluation.

Weak scaling: ``per_worker`` experiments per worker (the work grows with the workers); strong
scaling: a fixed study of ``4 * per_worker`` experiments. Each figure is the median wall time of
``repeats`` evaluations after a warm-up (compilation excluded), compared with the same study
lowered in-process in the same run (the peer). The fixed overhead per evaluation is the wall time
minus the slowest shard's own compute time as the workers report it (submission, scheduling,
transfer, gathering, dashboard update).

Efficiencies: weak ``t(1 worker) / t(n workers)`` at n times the work; strong
``t(1) / (n t(n))``. On a 2-core machine 4 workers share 2 cores, so expect no gain past 2.

Run: ``python benchmarks/bench_distributed.py [--per-worker 4] [--repeats 5] [--workers 1 2 4]``;
prints a table and writes ``benchmarks/results/bench_distributed.json`` (``..._pw<N>.json`` for
another ``--per-worker``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("JAX_ENABLE_X64", "1")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import diffsoup as ds  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
THETA = np.log10([1.2, 0.45, 0.33])


def _study(n):
    from test_study import tiny_study

    return tiny_study(n, seed=1)


def _time(fn, repeats):
    fn()  # warm-up (compiles)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _distributed(study, workers, repeats):
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, resources={"GPU": 1},
                           host="127.0.0.1", dashboard_address="127.0.0.1:0",
                           env={"JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)},
                           preload=["diffsoup.distributed._worker"])  # fmt: skip
    client = Client(cluster, set_as_default=False)
    try:
        with ds.distributed.run(study, cluster=client, name="bench") as low:
            shard_seconds = []

            def evaluate():
                low.value_and_grad(THETA)
                shard_seconds.append(max(low.backend.last_seconds))

            wall = _time(evaluate, repeats)
            compute = statistics.median(shard_seconds[1:])
            return wall, compute
    finally:
        client.close()
        cluster.close()


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--per-worker", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    a = p.parse_args(argv)
    rows = []
    strong_n = a.per_worker * max(a.workers)
    local_strong = _time(lambda low=ds.lower(_study(strong_n)): low.value_and_grad(THETA), a.repeats)
    local_unit = _time(lambda low=ds.lower(_study(a.per_worker)): low.value_and_grad(THETA), a.repeats)
    for w in a.workers:
        for kind, n in (("weak", a.per_worker * w), ("strong", strong_n)):
            wall, compute = _distributed(_study(n), w, a.repeats)
            rows.append({"workers": w, "scaling": kind, "experiments": n, "wall_s": wall,
                         "slowest_shard_s": compute, "overhead_s": wall - compute})  # fmt: skip
            print(rows[-1], flush=True)
    base = {k: next(r["wall_s"] for r in rows if r["scaling"] == k and r["workers"] == min(a.workers)) for k in ("weak", "strong")}
    for r in rows:
        w = r["workers"] / min(a.workers)
        r["efficiency"] = base["weak"] / r["wall_s"] if r["scaling"] == "weak" else base["strong"] / (w * r["wall_s"])
        r["vs_in_process"] = r["wall_s"] / (local_strong if r["scaling"] == "strong" or r["experiments"] == strong_n else
                                            (local_unit if r["experiments"] == a.per_worker else float("nan")))  # fmt: skip
    print(f"\nin-process value+grad: {a.per_worker} experiments {local_unit * 1e3:.1f} ms, {strong_n} experiments "
          f"{local_strong * 1e3:.1f} ms (os.cpu_count()={os.cpu_count()})")  # fmt: skip
    print(f"{'workers':>7} {'scaling':>7} {'exps':>5} {'wall ms':>9} {'shard ms':>9} {'overhead ms':>11} {'efficiency':>10}")
    for r in rows:
        print(f"{r['workers']:>7} {r['scaling']:>7} {r['experiments']:>5} {r['wall_s'] * 1e3:>9.1f} "
              f"{r['slowest_shard_s'] * 1e3:>9.1f} {r['overhead_s'] * 1e3:>11.1f} {r['efficiency']:>10.2f}")  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"benchmark": "bench_distributed", "cpu_count": os.cpu_count(), "per_worker": a.per_worker,
           "repeats": a.repeats, "in_process_s": {str(a.per_worker): local_unit, str(strong_n): local_strong},
           "rows": rows}  # fmt: skip
    name = "bench_distributed.json" if a.per_worker == 4 else f"bench_distributed_pw{a.per_worker}.json"
    (RESULTS / name).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
