"""ds.distributed.run over 1, 2 and 4 Dask CPU workers: one value+gradient evaluation.

Weak scaling: ``per_worker`` experiments per worker (the work grows with the workers); strong
scaling: a fixed study of ``4 * per_worker`` experiments. Each figure is the median wall time of
``repeats`` evaluations after a warm-up (compilation excluded), compared with the same study
lowered in-process in the same run (the peer). The fixed overhead per evaluation is the wall time
minus the slowest shard's own compute time as the workers report it (submission, scheduling,
transfer, gathering, dashboard update).

Efficiencies: weak ``t(1 worker) / t(n workers)`` at n times the work; strong
``t(1) / (n t(n))``. On a 2-core machine 4 workers share 2 cores, so expect no gain past 2.

The dashboard's cost: on 2 workers (weak study), the median evaluation with diffsoup's state not
published at all, published with no page open, and published with the ``/diffsoup`` page open in
headless Chromium (Playwright; without it a Bokeh client session, which runs the same server-side
updates); the three alternate in rounds, so drifts of a shared machine hit all three alike. Beside
the wall time, the CPU time that the run's own processes spend per evaluation (this process, which
holds the scheduler, its HTTP server and the page's server-side updates, and the worker processes;
not the browser, which runs on the user's machine): a cost that a shared machine's drifts hardly
blur, and that a machine with idle cores pays without waiting for it.

Run: ``python benchmarks/bench_distributed.py [--per-worker 4] [--repeats 5] [--workers 1 2 4]
[--dashboard-repeats 15] [--only-dashboard]``; prints tables and writes
``benchmarks/results/bench_distributed.json`` (``..._pw<N>.json`` for another ``--per-worker``;
``bench_distributed_dashboard.json`` with ``--only-dashboard``).
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
    cluster, client = _cluster(workers)
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


def _cluster(workers):
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, resources={"GPU": 1},
                           host="127.0.0.1", dashboard_address="127.0.0.1:0",
                           env={"JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)},
                           preload=["diffsoup.distributed._worker"])  # fmt: skip
    return cluster, Client(cluster, set_as_default=False)


class _Page:
    """The ``/diffsoup`` page held open: in headless Chromium where Playwright and Debian's chromium
    are there, else as a Bokeh client session (the server runs the page's updates for either)."""

    def __init__(self, url, browser=True):
        self.url, self.how = url, None
        try:
            if not browser:
                raise ImportError("a Bokeh session asked for")
            from playwright.sync_api import sync_playwright

            if not os.path.exists("/usr/bin/chromium"):
                raise ImportError("no /usr/bin/chromium")
            self._pw = sync_playwright().start()
            self._browser = self._pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            self.how = "chromium"
        except ImportError:
            self.how = "bokeh session"
        self._open = None

    def open(self):
        if self.how == "chromium":
            self._open = self._browser.new_page()
            self._open.goto(self.url)
            self._open.wait_for_timeout(1500)  # rendered and updating
        else:
            from bokeh.client import pull_session

            self._open = pull_session(url=self.url)

    def close(self):
        self._open.close()
        self._open = None

    def stop(self):
        if self.how == "chromium":
            self._browser.close()
            self._pw.stop()


def _cpu_seconds(processes) -> float:
    """User and system CPU seconds the processes have spent so far."""
    total = 0.0
    for proc in processes:
        t = proc.cpu_times()
        total += t.user + t.system
    return total


class _PageUpdates:
    """The thread CPU seconds of the ``/diffsoup`` page's periodic updates, summed: the page is
    served by this process's scheduler, whose documents are made by ``page_doc`` (wrapped here
    before the cluster starts; an update's time includes the Bokeh messages its changes create)."""

    def __init__(self):
        from diffsoup.distributed import _dashboard_page

        self.seconds, self.calls = 0.0, 0
        original = _dashboard_page.page_doc

        def page_doc(scheduler, extra, doc):
            add = doc.add_periodic_callback

            def add_timed(callback, period):
                def timed():
                    t0 = time.thread_time()
                    callback()
                    self.seconds += time.thread_time() - t0
                    self.calls += 1

                return add(timed, period)

            doc.add_periodic_callback = add_timed
            original(scheduler, extra, doc)

        _dashboard_page.page_doc = page_doc


class _Timed:
    """Thread CPU seconds spent in a method of an object (here the backend's ``_publish``)."""

    def __init__(self, owner, name):
        self.seconds, self.calls = 0.0, 0
        method = getattr(owner, name)

        def timed(*args, **kwargs):
            t0 = time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - t0
                self.calls += 1

        setattr(owner, name, timed)


def _dashboard_cost(study, workers, repeats, rounds=8, browser=True):
    """Per round, the median evaluation seconds with the state not published, published with the
    page closed, and with it open (the order of the three rotates from round to round), and the
    CPU seconds per evaluation of this process and the workers (``cpu:<state>``)."""
    import psutil

    updates = _PageUpdates()
    cluster, client = _cluster(workers)
    modes = ["not published", "page closed", "page open"]
    per_round, direct = [], {"page_update_s": 0.0, "page_open_s": 0.0, "page_updates": 0}
    try:
        processes = [psutil.Process()] + [psutil.Process(pid) for pid in client.run(os.getpid).values()]
        with ds.distributed.run(study, cluster=client, name="bench_dashboard") as low:
            page = _Page(f"{low.dashboard}/diffsoup", browser)
            backend = low.backend
            publishing = _Timed(backend, "_publish")
            low.value_and_grad(THETA)  # compiles
            published = {"s": publishing.seconds, "n": 0}
            try:
                for r in range(rounds):
                    medians = {}
                    for mode in modes[r % 3:] + modes[: r % 3]:
                        if mode == "not published":
                            timed_publish, backend._publish = backend._publish, lambda final=False: None
                        if mode == "page open":
                            page.open()
                            opened, before = time.perf_counter(), (updates.seconds, updates.calls)
                        times = []
                        cpu0 = _cpu_seconds(processes)
                        for _ in range(repeats):
                            t0 = time.perf_counter()
                            low.value_and_grad(THETA)
                            times.append(time.perf_counter() - t0)
                        medians["cpu:" + mode] = (_cpu_seconds(processes) - cpu0) / repeats
                        medians[mode] = statistics.median(times)
                        if mode == "page open":
                            direct["page_open_s"] += time.perf_counter() - opened
                            direct["page_update_s"] += updates.seconds - before[0]
                            direct["page_updates"] += updates.calls - before[1]
                            page.close()
                        if mode == "not published":
                            backend._publish = timed_publish
                        else:
                            published["n"] += repeats
                    per_round.append(medians)
            finally:
                page.stop()
            how = page.how
            direct["publish_s_per_evaluation"] = (publishing.seconds - published["s"]) / max(published["n"], 1)
    finally:
        client.close()
        cluster.close()
    return per_round, how, direct


def _dashboard_rows(a):
    n = a.per_worker * 2
    per_round, how, direct = _dashboard_cost(_study(n), 2, a.dashboard_repeats, browser=a.page == "chromium")
    rows = []
    for mode in (m for m in per_round[0] if not m.startswith("cpu:")):
        ratios = [r[mode] / r["page closed"] - 1.0 for r in per_round]
        cpu_ratios = [r["cpu:" + mode] / r["cpu:page closed"] - 1.0 for r in per_round]
        rows.append({"state": mode, "workers": 2, "experiments": n,
                     "wall_s": statistics.median(r[mode] for r in per_round),
                     "vs_page_closed": statistics.median(ratios),  # paired by round: drifts cancel
                     "vs_page_closed_min": min(ratios), "vs_page_closed_max": max(ratios),
                     "cpu_s": statistics.median(r["cpu:" + mode] for r in per_round),
                     "cpu_vs_page_closed": statistics.median(cpu_ratios),
                     "cpu_vs_page_closed_min": min(cpu_ratios), "cpu_vs_page_closed_max": max(cpu_ratios)})  # fmt: skip
    print(f"\ndashboard cost (2 workers, {n} experiments, value+grad; {len(per_round)} rounds of "
          f"{a.dashboard_repeats} per state; page in {how}; os.cpu_count()={os.cpu_count()}):")  # fmt: skip
    print(f"{'state':>14} {'wall ms':>9} {'vs page closed':>15} {'range over rounds':>20} {'CPU ms':>8} "
          f"{'CPU vs closed':>14} {'range over rounds':>20}")  # fmt: skip
    for r in rows:
        print(f"{r['state']:>14} {r['wall_s'] * 1e3:>9.2f} {r['vs_page_closed'] * 100:>14.2f}% "
              f"{r['vs_page_closed_min'] * 100:>8.1f}% .. {r['vs_page_closed_max'] * 100:.1f}% "
              f"{r['cpu_s'] * 1e3:>8.2f} {r['cpu_vs_page_closed'] * 100:>13.2f}% "
              f"{r['cpu_vs_page_closed_min'] * 100:>8.1f}% .. {r['cpu_vs_page_closed_max'] * 100:.1f}%")  # fmt: skip
    evaluation = statistics.median(r["page closed"] for r in per_round)
    direct["page_update_core_fraction"] = direct["page_update_s"] / direct["page_open_s"]
    direct["publish_vs_evaluation"] = direct["publish_s_per_evaluation"] / evaluation
    print(f"measured directly: the page's updates {direct['page_update_s'] * 1e3:.1f} ms of CPU in "
          f"{direct['page_open_s']:.1f} s open ({direct['page_updates']} updates; "
          f"{direct['page_update_core_fraction'] * 100:.3f}% of one core); publishing "
          f"{direct['publish_s_per_evaluation'] * 1e3:.3f} ms per evaluation "
          f"({direct['publish_vs_evaluation'] * 100:.2f}% of an evaluation's {evaluation * 1e3:.1f} ms)")  # fmt: skip
    for r in rows:
        r["page_update_core_fraction"] = direct["page_update_core_fraction"] if r["state"] == "page open" else 0.0
        r["publish_vs_evaluation"] = 0.0 if r["state"] == "not published" else direct["publish_vs_evaluation"]
    return rows, how


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--per-worker", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--dashboard-repeats", type=int, default=15)
    p.add_argument("--only-dashboard", action="store_true")
    p.add_argument("--page", choices=("chromium", "bokeh"), default="chromium",
                   help="what holds the page open (chromium falls back to a Bokeh session without Playwright)")
    a = p.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    dashboard, how = _dashboard_rows(a)
    if a.only_dashboard:
        out = {"benchmark": "bench_distributed.dashboard", "cpu_count": os.cpu_count(), "per_worker": a.per_worker,
               "page": how, "dashboard": dashboard}  # fmt: skip
        (RESULTS / "bench_distributed_dashboard.json").write_text(json.dumps(out, indent=2))
        return
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
    out = {"benchmark": "bench_distributed", "cpu_count": os.cpu_count(), "per_worker": a.per_worker,
           "repeats": a.repeats, "in_process_s": {str(a.per_worker): local_unit, str(strong_n): local_strong},
           "rows": rows, "page": how, "dashboard": dashboard}  # fmt: skip
    name = "bench_distributed.json" if a.per_worker == 4 else f"bench_distributed_pw{a.per_worker}.json"
    (RESULTS / name).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
