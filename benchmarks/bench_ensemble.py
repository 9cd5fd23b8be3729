"""Ensembles through Dask into Zarr against ``ds.simulate`` vmapped in one process (issue 24).

The 20-species mass-action network (``ds.examples.mass_action_network(20, 25, seed=0)``, y0 = 1,
11 output times on [0, 10], rtol 1e-6, atol 1e-9), its 25 rate constants drawn per simulation
log-uniformly within a factor 3 of their nominal values (a lazy Dask array, one chunk generated
per task: the inputs never exist whole).

Measured in the same run, every figure also a ratio against the in-process peer:

* **in-process** (run before and after the Dask runs; the faster is the peer, so that a machine
  whose load changes does not flatter Dask): ``jax.jit(jax.vmap(ds.simulate))`` on chunks of
  ``--draws-per-chunk`` simulations in a loop in one process (the same program the ensemble's tasks
  run; the inputs generated the same way), results brought to host memory: simulations per second.
* **Dask + Zarr**: ``ds.distributed.ensemble(...).to_zarr(store)`` on the embedded cluster
  (``ds.distributed.embedded_cluster``: ``--workers`` CPU worker processes here, one worker per
  GPU with ``--gpu``), into a new store: simulations per second over the whole write, after a
  warm-up write of one chunk per worker into a store of its own (timed apart as ``warmup_s``: the
  workers' compilation, as the in-process peer's is not timed), ``rate / in-process rate``.
* **time in Dask vs in solves**: the workers' summed task time by kind (Dask's task stream: input
  chunks, solves, Zarr writes; a GPU worker's second thread writes while the next chunk solves) and
  the in-process solve time of the same simulations; the rest of ``workers x wall`` is scheduling,
  transfers and idle workers.
* **peak host memory**: the largest resident set (sampled every 0.1 s) of the client and of each
  worker during the write, at ``n / 10`` and ``n`` simulations: bounded, independent of ``n``.

CPU (default): 100,000 simulations, 2 worker processes (1 and 2 workers are both run: one worker
is the like-for-like comparison with the one in-process core). ``--quick``: 10,000 simulations.
GPU (``--gpu``, on a machine with a CUDA jaxlib): 1,000,000 simulations on one GPU worker, chunks
of ``--draws-per-chunk`` (default 32,768 there); target: Dask + Zarr within 15 % of the in-process rate.

Run:  .venv/bin/python benchmarks/bench_ensemble.py --quick     (about 2 minutes on 2 cores)
      .venv/bin/python benchmarks/bench_ensemble.py             (about 15 minutes on 2 busy cores)
      .venv/bin/python benchmarks/bench_ensemble.py --gpu       (the GPU machine)
Writes benchmarks/results/bench_ensemble[_gpu].json (or --out).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# The in-process peer runs in the environment Dask's nanny gives its workers (distributed's
# pre-spawn environment), so that the comparison is of the execution, not of thread settings.
for _name, _value in (("OMP_NUM_THREADS", "1"), ("MKL_NUM_THREADS", "1"), ("OPENBLAS_NUM_THREADS", "1"),
                      ("MALLOC_TRIM_THRESHOLD_", "65536")):  # fmt: skip
    os.environ.setdefault(_name, _value)

from _common import RESULTS, machine_info, write_json  # noqa: E402  (sets float64)

import jax  # noqa: E402
import numpy as np  # noqa: E402

TIMES = np.linspace(0.0, 10.0, 11)
SPREAD = np.log10(3.0)  # draws within a factor 3 of the nominal rate constants
OPTIONS = dict(rtol=1e-6, atol=1e-9)


def network():
    import diffsoup as ds

    net = ds.examples.mass_action_network(20, 25, seed=0)
    return net.to_spec(y0=np.ones(20)).build(), np.array(list(net.parameters.values()))


def _draw_block(block, base, seed, block_info=None):
    """Rate constants of one chunk, from a generator keyed by (seed, chunk index): lazy and reproducible."""
    index = block_info[None]["chunk-location"][0]
    rng = np.random.default_rng([seed, index])
    return base * 10 ** rng.uniform(-SPREAD, SPREAD, block.shape)


def lazy_params(n, chunk, base, seed=0):
    import dask.array as da

    shape = da.zeros((n, base.size), chunks=(chunk, base.size))
    return shape.map_blocks(_draw_block, base, seed, dtype=np.float64, name=f"bench-params-{n}-{chunk}-{seed}")


def in_process(problem, base, n, chunk):
    """``ds.simulate`` vmapped over chunks in this process: (compile seconds, run seconds, failures)."""
    import diffsoup as ds

    def one(p):
        sol = ds.simulate(problem, None, TIMES, p, throw=False, **OPTIONS)
        return sol.ys, sol.status

    run = jax.jit(jax.vmap(one))
    params = lazy_params(n, chunk, base)
    blocks = params.to_delayed().ravel()
    first = np.asarray(blocks[0].compute())
    t0 = time.perf_counter()
    jax.block_until_ready(run(first))
    compile_s = time.perf_counter() - t0
    failures = 0
    t0 = time.perf_counter()
    for b in blocks:
        p = np.asarray(b.compute())
        if p.shape[0] < chunk:  # the ensemble pads its last chunk the same way
            p = np.concatenate([p, np.repeat(p[-1:], chunk - p.shape[0], axis=0)])
        ys, status = jax.device_get(run(p))
        failures += int(np.count_nonzero(status))
    return compile_s, time.perf_counter() - t0, failures


class PeakMemory:
    """The largest resident set of each process in ``pids``, sampled every 0.1 s."""

    def __init__(self, pids):
        import psutil

        self.procs = {pid: psutil.Process(pid) for pid in pids}
        self.peak = {pid: 0 for pid in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for pid, p in self.procs.items():
                try:
                    self.peak[pid] = max(self.peak[pid], p.memory_info().rss)
                except Exception:  # noqa: BLE001 (a process that ended)
                    pass
            time.sleep(0.1)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def dask_run(problem, base, n, chunk, workers, gpu):
    """``ensemble(...).to_zarr`` on a fresh embedded cluster: a dict of figures."""
    import diffsoup as ds
    from distributed import get_task_stream

    tmp = Path(tempfile.mkdtemp(prefix="bench-ensemble-"))
    try:
        cluster, client = ds.distributed.embedded_cluster(n_workers=workers)
        try:
            pids = client.run(os.getpid)
            # Warm-up: one chunk per worker of another draw into a store of its own, so that the
            # workers' compilation is not timed (as the in-process peer's is not).
            t0 = time.perf_counter()
            warm = ds.distributed.ensemble(problem, params=lazy_params(chunk * len(pids), chunk, base, seed=1),
                                           t_eval=TIMES, draws_per_chunk=chunk, client=client, **OPTIONS)  # fmt: skip
            warm.to_zarr(tmp / "warmup.zarr", client=client)
            warmup_s = time.perf_counter() - t0
            with PeakMemory([os.getpid(), *pids.values()]) as memory:
                ens = ds.distributed.ensemble(problem, params=lazy_params(n, chunk, base), t_eval=TIMES,
                                              draws_per_chunk=chunk, client=client, **OPTIONS)  # fmt: skip
                t0 = time.perf_counter()
                with get_task_stream(client) as stream:
                    written = ens.to_zarr(tmp / "ensemble.zarr", client=client)
                wall = time.perf_counter() - t0
            task_seconds = {"solve": 0.0, "write": 0.0, "inputs": 0.0}
            for t in stream.data:
                key = str(t["key"])
                kind = "solve" if "diffsoup-ensemble" in key else "write" if "store-map" in key else "inputs"
                task_seconds[kind] += sum(s["stop"] - s["start"] for s in t["startstops"] if s["action"] == "compute")
            n_workers = len(pids)
        finally:
            client.close()
            cluster.close()
        size = sum(f.stat().st_size for f in (tmp / "ensemble.zarr").rglob("*") if f.is_file())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "n": n, "workers": n_workers, "chunk_size": chunk, "chunks": written.chunks, "wall_s": wall,
        "rate": n / wall, "warmup_s": warmup_s, "task_seconds": sum(task_seconds.values()),
        "task_seconds_by_kind": task_seconds, "status": written.status, "store_bytes": size,
        "peak_rss_client_mb": memory.peak[os.getpid()] / 2**20,
        "peak_rss_workers_mb": [memory.peak[p] / 2**20 for p in pids.values()],
        "resources": dict(ens.resources),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10,000 simulations (CPU)")
    parser.add_argument("--gpu", action="store_true", help="1,000,000 simulations on the GPU (one worker)")
    parser.add_argument("-n", type=int, help="simulations (default 100,000; --quick 10,000; --gpu 1,000,000)")
    parser.add_argument("--draws-per-chunk", "--chunk-size", type=int, dest="draws_per_chunk",
                        help="simulations per chunk (default 1024; --gpu 32768)")  # fmt: skip
    parser.add_argument("--workers", type=int, nargs="+", help="CPU worker counts (default 1 2)")
    parser.add_argument("--out", help="JSON output path")
    a = parser.parse_args()

    import diffsoup as ds  # noqa: F401

    if a.gpu and jax.default_backend() != "gpu":
        raise SystemExit("bench_ensemble --gpu: JAX sees no GPU (install a CUDA jaxlib, unset JAX_PLATFORMS=cpu).")
    n = a.n or (1_000_000 if a.gpu else 10_000 if a.quick else 100_000)
    chunk = a.draws_per_chunk or (32_768 if a.gpu else 1024)
    worker_counts = [1] if a.gpu else (a.workers or [1, 2])
    machine = machine_info()
    problem, base = network()
    print(f"bench_ensemble: {problem!r}, n={n}, chunk {chunk}, {jax.default_backend()}, "
          f"os.cpu_count()={os.cpu_count()}, load {os.getloadavg()}", flush=True)  # fmt: skip

    def baseline(label):
        compile_s, solve_s, failures = in_process(problem, base, n, chunk)
        print(f"  in-process ({label}): compile {compile_s:.1f} s, {n} simulations in {solve_s:.1f} s = "
              f"{n / solve_s:,.0f}/s ({failures} failed)", flush=True)  # fmt: skip
        return {"compile_s": compile_s, "solve_s": solve_s, "rate": n / solve_s, "failures": failures,
                "load": os.getloadavg()}  # fmt: skip

    baselines = [baseline("before")]
    compile_s, solve_s = baselines[0]["compile_s"], baselines[0]["solve_s"]
    base_rate = n / solve_s
    rows = []
    for workers in worker_counts:
        sizes = [n] if a.quick or a.gpu else [n // 10, n]
        for size in sizes:
            r = dask_run(problem, base, size, chunk, workers, a.gpu)
            r["rate_vs_in_process"] = r["rate"] / base_rate
            r["in_process_solve_s_same_work"] = solve_s * size / n
            r["dask_and_write_fraction"] = 1.0 - r["in_process_solve_s_same_work"] / (r["workers"] * r["wall_s"])
            rows.append(r)
            print(f"  dask+zarr: {r['workers']} worker(s), {size} simulations in {r['wall_s']:.1f} s = {r['rate']:,.0f}/s "
                  f"(x{r['rate_vs_in_process']:.2f} of in-process); "
                  f"tasks {r['task_seconds']:.1f} s (solve {r['task_seconds_by_kind']['solve']:.1f}, write "
                  f"{r['task_seconds_by_kind']['write']:.1f}, inputs {r['task_seconds_by_kind']['inputs']:.1f}) vs "
                  f"in-process solves {r['in_process_solve_s_same_work']:.1f} s; warm-up {r['warmup_s']:.1f} s; "
                  f"peak RSS client {r['peak_rss_client_mb']:.0f} MB, workers "
                  f"{', '.join(f'{m:.0f}' for m in r['peak_rss_workers_mb'])} MB; {r['status']}", flush=True)  # fmt: skip

    # Measured again after the Dask runs; the faster of the two is the peer (on a shared machine the
    # load changes between runs: this keeps the Dask ratios conservative).
    baselines.append(baseline("after"))
    best = max(baselines, key=lambda b: b["rate"])
    compile_s, solve_s, base_rate = best["compile_s"], best["solve_s"], best["rate"]
    for r in rows:
        r["rate_vs_in_process"] = r["rate"] / base_rate
        r["in_process_solve_s_same_work"] = solve_s * r["n"] / n
        r["dask_and_write_fraction"] = 1.0 - r["in_process_solve_s_same_work"] / (r["workers"] * r["wall_s"])
    print("\n| simulations | workers | chunk | wall s | sims/s | vs in-process | "
          "task s | in-process solve s | peak RSS client MB | peak RSS per worker MB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {n:,} | in-process | {chunk} | {solve_s:.1f} | {base_rate:,.0f} | 1.00 | – | {solve_s:.1f} | – | – |")
    for r in rows:
        print(f"| {r['n']:,} | {r['workers']} | {r['chunk_size']} | {r['wall_s']:.1f} | {r['rate']:,.0f} | "
              f"{r['rate_vs_in_process']:.2f} | {r['task_seconds']:.1f} | "
              f"{r['in_process_solve_s_same_work']:.1f} | {r['peak_rss_client_mb']:.0f} | "
              f"{max(r['peak_rss_workers_mb']):.0f} |")  # fmt: skip
    out = Path(a.out) if a.out else RESULTS / ("bench_ensemble_gpu.json" if a.gpu else "bench_ensemble.json")
    write_json(out, {
        "machine": machine, "problem": repr(problem), "n": n, "chunk_size": chunk, "times": TIMES.tolist(),
        "options": OPTIONS, "in_process": baselines, "in_process_peer": best,
        "dask_zarr": rows, "load_average_at_end": os.getloadavg(),
    })  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
