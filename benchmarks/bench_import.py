"""Cold ``import diffsoup``: seconds in a fresh process, against ``import jax`` and ``import numpy``
timed in the same run (peers), and the modules each import loads.

    python benchmarks/bench_import.py                        # 15 rounds
    python benchmarks/bench_import.py --rounds 31            # a steadier median on a busy machine
    python benchmarks/bench_import.py --baseline /work/main  # also another checkout's import diffsoup

Each statement runs in a fresh ``python -c`` process, which prints the seconds of the statement
alone (``time.perf_counter`` around it, interpreter start-up excluded), its CPU seconds
(``time.process_time``: less sensitive than the elapsed time to other work on a busy machine) and
the number of modules in ``sys.modules`` afterwards. The statements run round-robin (one process
each per round), so that a change of the machine's load falls on all of them alike; one untimed
round first writes the bytecode caches (to a folder of the temporary directory). Per statement:
the median and the fastest round, the median CPU seconds, the process's wall time, the modules
loaded beyond a bare interpreter's, and the ratio of its median to ``import jax``'s (diffsoup's
core is built on JAX, which loads with it). The statements:

- ``numpy``, ``jax``: the peers;
- ``diffsoup``: ``import diffsoup`` (JAX and the numerical core; the target is 0.5 s on a 2-core CPU);
- ``diffsoup + Study``: also ``ds.Study`` (the inference layer without its fitting room);
- ``diffsoup + fit``: also ``ds.inference.fit`` (the fitting room; scipy loads when a fit runs);
- ``diffsoup (baseline)``: ``import diffsoup`` of the ``--baseline`` checkout.

Writes ``benchmarks/results/bench_import.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from _common import RESULTS, machine_info, markdown_table, median, write_json  # noqa: I001 (sets up the path)

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 0.5  # issue 38: import diffsoup on the 2-core CPU
# The children's bytecode goes to a folder of its own (filled by the untimed round): the baseline's
# checkout gets no __pycache__ folders.
PYCACHE = Path(tempfile.gettempdir()) / "diffsoup-bench-import-pycache"

STATEMENTS = {
    "python": "pass",
    "numpy": "import numpy",
    "jax": "import jax",
    "diffsoup": "import diffsoup",
    "diffsoup + Study": "import diffsoup; diffsoup.Study",
    "diffsoup + fit": "import diffsoup; diffsoup.inference.fit",
}

CHILD = """
import sys, time
start, cpu = time.perf_counter(), time.process_time()
{statement}
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
print(seconds, cpu, len(sys.modules), int("scipy" in sys.modules))
"""


def _one(statement: str, root: Path) -> dict:
    """``statement`` in a fresh interpreter that imports diffsoup from ``root``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(root)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD.format(statement=statement))], cwd=root,
                         env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"{statement!r} failed in {root}:\n{out.stderr[-2000:]}")
    seconds, cpu, modules, scipy = out.stdout.split()
    return {"seconds": float(seconds), "cpu_s": float(cpu), "wall_s": wall, "modules": int(modules),
            "scipy": bool(int(scipy))}  # fmt: skip


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15, help="fresh processes per statement (the median is kept)")
    ap.add_argument("--baseline", default=None, help="a checkout whose import diffsoup is also timed")
    args = ap.parse_args()
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")

    cases = {name: (statement, ROOT) for name, statement in STATEMENTS.items()}
    if args.baseline:
        cases["diffsoup (baseline)"] = ("import diffsoup", Path(args.baseline).resolve())
    info = machine_info()
    for statement, root in cases.values():  # untimed: bytecode caches
        _one(statement, root)
    runs: dict[str, list[dict]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, (statement, root) in cases.items():
            runs[name].append(_one(statement, root))

    bare = runs["python"][0]["modules"]
    jax_s = median([r["seconds"] for r in runs["jax"]])
    rows = []
    for name, (statement, root) in cases.items():
        if name == "python":
            continue
        seconds = [r["seconds"] for r in runs[name]]
        rows.append({
            "name": name, "statement": statement, "root": str(root), "median_s": median(seconds),
            "min_s": min(seconds), "cpu_median_s": median([r["cpu_s"] for r in runs[name]]),
            "wall_median_s": median([r["wall_s"] for r in runs[name]]),
            "modules_loaded": runs[name][0]["modules"] - bare, "scipy_loaded": runs[name][0]["scipy"],
            "ratio_vs_jax": median(seconds) / jax_s, "seconds": seconds,
        })  # fmt: skip
    by_name = {r["name"]: r for r in rows}
    diffsoup_s = by_name["diffsoup"]["median_s"]
    summary = {
        "import_diffsoup_s": diffsoup_s, "import_jax_s": jax_s, "ratio_diffsoup_vs_jax": diffsoup_s / jax_s,
        "diffsoup_beyond_jax_s": diffsoup_s - jax_s, "target_s": TARGET_S, "meets_target": diffsoup_s <= TARGET_S,
        "jax_alone_within_target": jax_s <= TARGET_S, "import_diffsoup_cpu_s": by_name["diffsoup"]["cpu_median_s"],
        "import_jax_cpu_s": by_name["jax"]["cpu_median_s"],
    }  # fmt: skip
    if "diffsoup (baseline)" in by_name:
        summary["speedup_vs_baseline"] = by_name["diffsoup (baseline)"]["median_s"] / diffsoup_s

    print(f"cold imports, {args.rounds} fresh processes each, {info['cpu_count']} cores, "
          f"load {tuple(round(x, 1) for x in info['load_average_at_start'])}")  # fmt: skip
    headers = ["import", "median s", "fastest s", "CPU s", "process wall s", "modules", "scipy", "x jax"]
    table = [[r["name"], f"{r['median_s']:.3f}", f"{r['min_s']:.3f}", f"{r['cpu_median_s']:.3f}",
              f"{r['wall_median_s']:.3f}", r["modules_loaded"],
              "yes" if r["scipy_loaded"] else "no", f"{r['ratio_vs_jax']:.2f}"] for r in rows]  # fmt: skip
    print(markdown_table(headers, table))
    print(f"import diffsoup {diffsoup_s:.3f} s = import jax {jax_s:.3f} s + {diffsoup_s - jax_s:.3f} s "
          f"(target {TARGET_S} s: {'met' if summary['meets_target'] else 'not met'}); CPU "
          f"{summary['import_diffsoup_cpu_s']:.3f} s against {summary['import_jax_cpu_s']:.3f} s")  # fmt: skip
    if "speedup_vs_baseline" in summary:
        print(f"{summary['speedup_vs_baseline']:.2f}x faster than the baseline's import diffsoup")
    out = RESULTS / "bench_import.json"
    write_json(out, {"machine": info, "rounds": args.rounds, "summary": summary, "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
