"""Overhead per task of ``checkpointed_map(execution="dask")`` against ``execution="serial"``.

Two workloads, each run serially and on a LocalCluster of worker processes carrying ``GPU=1``
(the resource every campaign task asks for), measured in the same run:

- 1,000 trivial tasks (return a number): the cost of the machinery itself, ledger included;
- 100 tasks sleeping 0.5 s: a realistic task length, where the target is an overhead per task
  under 5 % of the task's duration.

Per-task overhead against serial is the wall time per task beyond the serial run's, per worker
slot: ``(workers * T_dask - T_serial) / n``. With one worker this is the extra time each task
costs; with two it also charges Dask for any slot left idle. It is negative where Dask is
cheaper: serial execution writes the ledger twice per task between tasks, while the Dask client
writes it (once per batch of events arriving together) as the workers compute. The overhead
against the work itself, ``(workers * T_dask - n * task_seconds) / n``, is the Dask machinery's
whole cost. Every figure is also given as a ratio to serial. The machine's load average is
recorded: other processes on a 2-core machine shift the absolute times.

Run:  .venv/bin/python benchmarks/bench_campaign.py            (about 2.5 minutes on 2 cores)
      .venv/bin/python benchmarks/bench_campaign.py --quick    (a smoke run, seconds)
Writes benchmarks/results/bench_campaign.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diffsoup.distributed import checkpointed_map  # noqa: E402


def trivial(item):
    return item["x"]


def sleeper(item):
    time.sleep(item["seconds"])
    return item["x"]


def _timed(fn, items, ledger, **options):
    start = time.perf_counter()
    result = checkpointed_map(fn, items, ledger_path=ledger, progress=False, resume=False, **options)
    elapsed = time.perf_counter() - start
    if result.failures or len(result.results) != len(items):
        raise RuntimeError(f"benchmark campaign failed: {list(result.failures.items())[:2]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 trivial and 6 tasks of 0.1 s")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_campaign.json"))
    args = parser.parse_args()

    from distributed import Client, LocalCluster
    import dask
    import distributed

    n_trivial, n_long, seconds = (100, 6, 0.1) if args.quick else (1000, 100, 0.5)
    workloads = {
        "trivial": (trivial, [{"task_id": f"trivial-{i:04d}", "x": i} for i in range(n_trivial)], 0.0),
        "sleep": (sleeper, [{"task_id": f"sleep-{i:03d}", "x": i, "seconds": seconds} for i in range(n_long)], seconds),
    }
    rows = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-campaign-") as tmp:
        serial = {}
        for name, (fn, items, _) in workloads.items():
            serial[name] = _timed(fn, items, Path(tmp) / f"serial-{name}.json")
        for workers in (1, 2):
            started = time.perf_counter()
            with LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                processes=True,
                resources={"GPU": 1},
                host="127.0.0.1",
                dashboard_address="127.0.0.1:0",
            ) as cluster, Client(cluster) as client:
                startup = time.perf_counter() - started
                # Warm up: the workers import diffsoup once, outside the timing.
                _timed(trivial, [{"task_id": f"warm-{i}", "x": i} for i in range(2 * workers)],
                       Path(tmp) / "warm.json", execution="dask", client=client)
                for name, (fn, items, task_seconds) in workloads.items():
                    t_dask = _timed(fn, items, Path(tmp) / f"dask-{name}-{workers}.json", execution="dask", client=client)
                    t_serial = serial[name]
                    n = len(items)
                    overhead = (workers * t_dask - t_serial) / n
                    over_work = (workers * t_dask - n * task_seconds) / n
                    rows.append(
                        {
                            "workload": name,
                            "tasks": n,
                            "task_seconds": task_seconds,
                            "dask_workers": workers,
                            "serial_s": round(t_serial, 4),
                            "dask_s": round(t_dask, 4),
                            "dask_over_serial": round(t_dask / t_serial, 4),
                            "slot_time_over_serial": round(workers * t_dask / t_serial, 4),
                            "serial_per_task_ms": round(1e3 * t_serial / n, 4),
                            "dask_per_task_ms": round(1e3 * t_dask / n, 4),
                            "overhead_per_task_ms": round(1e3 * overhead, 4),
                            "overhead_fraction_of_task": round(overhead / task_seconds, 5) if task_seconds else None,
                            "overhead_over_work_per_task_ms": round(1e3 * over_work, 4),
                            "overhead_over_work_fraction": round(over_work / task_seconds, 5) if task_seconds else None,
                            "cluster_startup_s": round(startup, 3),
                        }
                    )

    header = (
        f"{'workload':<16}{'workers':>8}{'serial s':>10}{'dask s':>9}{'dask/serial':>12}"
        f"{'slot/serial':>12}{'vs serial/task':>16}{'of task':>9}{'vs work/task':>14}{'of task':>9}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        label = f"{row['tasks']} x {'trivial' if not row['task_seconds'] else str(row['task_seconds']) + ' s'}"
        def percent(fraction):
            return "" if fraction is None else f"{100 * fraction:.2f}%"

        print(
            f"{label:<16}{row['dask_workers']:>8}{row['serial_s']:>10.2f}{row['dask_s']:>9.2f}"
            f"{row['dask_over_serial']:>12.3f}{row['slot_time_over_serial']:>12.3f}"
            f"{row['overhead_per_task_ms']:>13.2f} ms{percent(row['overhead_fraction_of_task']):>9}"
            f"{row['overhead_over_work_per_task_ms']:>11.2f} ms{percent(row['overhead_over_work_fraction']):>9}"
        )
    report = {
        "benchmark": "bench_campaign",
        "description": "checkpointed_map overhead per task, execution='dask' vs 'serial', same run",
        "definition": {
            "overhead_per_task": "(dask_workers * dask_s - serial_s) / tasks",
            "overhead_over_work_per_task": "(dask_workers * dask_s - tasks * task_seconds) / tasks",
        },
        "quick": args.quick,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "dask": dask.__version__,
            "distributed": distributed.__version__,
        },
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average_1_5_15_before": [round(x, 2) for x in load_before],
        "load_average_1_5_15_after": [round(x, 2) for x in os.getloadavg()],
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwritten {out}")


if __name__ == "__main__":
    main()
