"""Where a lane's step goes: a device trace of one study evaluation, its kernels attributed to
the source that made them.

The study is ``bench_gpu_study.py``'s 20-species network (``mass_action_network(20, 25,
seed=3)``, Dense LU, rtol 1e-6, atol 1e-9, 4 measurement times). After a warm-up, one evaluation
of each mode runs under ``jax.profiler.trace`` (a Perfetto trace); every device kernel of the
trace is matched to the HLO instruction it ran (the trace's ``hlo_op``), whose metadata names
the Python source line that emitted it. The report gives, per mode:

* the wall time of the evaluation, the kernels launched, their summed device time and the share
  of the wall time the device was busy (the rest is launch latency and host work);
* the step loop's iterations (lock-step: the most steps of any lane, summed over chunks) and so
  kernels per step and microseconds per step;
* device time by source (the diffsoup module and function, or the model's right-hand side):
  the LU, the right-hand side, the Jacobian's columns, the controller, the output;
* the while-loop bodies of the compiled program: instructions that launch kernels per iteration.

``--dense-solve lu inverse`` profiles the network's dense solves both ways in one run
(``ds.linear.Dense(solve=...)``; ``auto``, the default, is the explicit inverse on a GPU and the
LU's triangular solves on a CPU); every row names its ``dense_solve``.

Run (GPU machine): ``python benchmarks/profile_gpu_step.py --experiments 10000`` (``--quick``: 200
experiments, a CPU smoke run). Writes ``benchmarks/results/profile_gpu_step.json`` (or
``--out``) and the raw trace under ``--trace-dir``.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, machine_info, write_json  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

import diffsoup as ds  # noqa: E402
from bench_gpu_study import ATOL, DENSE_SOLVES, RTOL, network_study  # noqa: E402
from diffsoup.inference import SolverOptions  # noqa: E402

MODES = ("value", "value_and_grad", "residuals_and_jacobian")
# Instructions that run on the device as kernels of their own (the rest live inside a fusion).
LAUNCHING = re.compile(r"=\s*[^=]*?\b(fusion|custom-call|copy-start|cublas|cudnn|gemm|sort|scatter|reduce-window)\b")
METADATA = re.compile(r'op_name="([^"]*)"(?:[^}]*?source_file="([^"]*)")?(?:[^}]*?source_line=(\d+))?')
INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=")


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- the compiled program --------------------------------------------------------------------


def hlo_sources(hlo_text: str) -> dict[str, str]:
    """Instruction name -> where it came from: ``module.py:function`` of its source file (a
    diffsoup module by its path, the model's functions as ``model``), else its op name's tail."""
    sources = {}
    for line in hlo_text.splitlines():
        m = INSTRUCTION.match(line)
        if not m:
            continue
        meta = METADATA.search(line)
        if meta is None:
            continue
        op_name, source_file, _ = meta.groups()
        sources[m.group(1)] = _source_label(op_name, source_file or "")
    return sources


def _source_label(op_name: str, source_file: str) -> str:
    """A diffsoup module named by the source file where XLA kept it; else the innermost two
    jitted functions of the op's name stack (``solve_forward > lu_solve``: the names of the
    integrator's, the linear solver's and the model's functions), which XLA keeps always."""
    path = source_file.replace("\\", "/")
    if "/diffsoup/" in path:
        return path.split("/diffsoup/", 1)[1]
    jitted = re.findall(r"jit\(([^()]+)\)", op_name)
    if jitted:
        return " > ".join(jitted[-2:])
    return op_name.rsplit("/", 1)[-1] or "?"


def loop_bodies(hlo_text: str) -> dict[str, int]:
    """Computations used as while-loop bodies -> instructions in them that launch kernels."""
    bodies = set(re.findall(r"body=%?([\w.\-]+)", hlo_text))
    counts: dict[str, int] = {}
    current = None
    for line in hlo_text.splitlines():
        head = re.match(r"^\s*%?([\w.\-]+)\s*(?:\(|\{)", line) if not line.startswith(" ") else None
        if head and ("{" in line) and "=" not in line.split("{")[0]:
            current = head.group(1) if head.group(1) in bodies else None
            if current:
                counts[current] = 0
            continue
        if current and LAUNCHING.search(line):
            counts[current] += 1
    return counts


# ---- the trace ---------------------------------------------------------------------------------


def device_events(trace_dir: Path) -> list[dict]:
    """Complete events ("X") on device threads of the Perfetto trace under ``trace_dir``."""
    files = sorted(trace_dir.rglob("perfetto_trace.json.gz")) or sorted(trace_dir.rglob("*.trace.json.gz"))
    if not files:
        raise FileNotFoundError(f"no Perfetto trace under {trace_dir}")
    with gzip.open(files[-1], "rt") as fh:
        trace = json.load(fh)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    procs, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            procs[e["pid"]] = str(e.get("args", {}).get("name", ""))
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = str(e.get("args", {}).get("name", ""))
    device_pids = {pid for pid, n in procs.items() if re.search(r"/device:GPU", n, re.I)}

    def kernel(e) -> bool:
        if e.get("ph") != "X" or "dur" not in e:
            return False
        if device_pids:  # a GPU run: every event on a device stream is a kernel or a copy
            return e.get("pid") in device_pids
        # A CPU run: XLA's own operations carry the HLO instruction (not the whole-program events).
        return "hlo_op" in (e.get("args") or {}) and "XLAExecute" not in threads.get((e["pid"], e["tid"]), "")

    return [e for e in events if kernel(e)]


def attribute(events: list[dict], sources: dict[str, str]) -> dict:
    """Kernel count and device time (us) by source, and in all."""
    by_source: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    total_us = 0.0
    for e in events:
        args = e.get("args", {}) or {}
        op = str(args.get("hlo_op") or args.get("long_name") or e.get("name", ""))
        op = op.split(" ")[0].lstrip("%")
        label = sources.get(op)
        if label is None:
            name = e.get("name", "")
            label = ("LU / triangular solves (library)" if re.search(r"getrf|getrs|trsm|potrf|lu_|cublas|cusolver", name, re.I)
                     else "memory copies" if re.search(r"memcpy|memset|copy", name, re.I) else "other: " + name[:40])  # fmt: skip
        by_source[label][0] += 1
        by_source[label][1] += float(e["dur"])
        total_us += float(e["dur"])
    ranked = sorted(by_source.items(), key=lambda kv: -kv[1][1])
    return dict(kernels=len(events), device_us=total_us,
                by_source=[dict(source=k, kernels=int(n), device_us=t, share=t / total_us if total_us else 0.0)
                           for k, (n, t) in ranked])  # fmt: skip


def lockstep_iterations(lowered, mode: str) -> int:
    """Step-loop iterations of one evaluation: per chunk the most steps of its lanes, summed."""
    program_mode = "jacobian" if mode == "residuals_and_jacobian" else mode
    lanes = lowered.chunk_sizes.get(program_mode) or [len(lowered.problem.study)]
    steps = np.asarray(lowered.steps, dtype=np.int64)
    size = int(lanes[0]) if isinstance(lanes, (list, tuple)) else int(lanes)
    return int(sum(int(steps[i:i + size].max()) for i in range(0, steps.size, size)))


def profile_mode(lowered, mode: str, trace_root: Path) -> dict:
    theta = lowered.problem.nominal
    fn = getattr(lowered, mode)
    fn(theta)  # compiles
    fn(theta)
    t = time.perf_counter()
    fn(theta)
    wall_untraced = time.perf_counter() - t
    trace_dir = trace_root / mode
    with jax.profiler.trace(str(trace_dir), create_perfetto_trace=True):
        t = time.perf_counter()
        out = fn(theta)
        jax.block_until_ready(out)
        wall = time.perf_counter() - t
    program_mode = "jacobian" if mode == "residuals_and_jacobian" else mode
    hlo = "\n".join(p.compiled.as_text() for (m, _), p in lowered._programs.items() if m == program_mode)
    sources = hlo_sources(hlo)
    row = dict(mode=mode, wall_s=wall, wall_untraced_s=wall_untraced, **attribute(device_events(trace_dir), sources))
    iterations = lockstep_iterations(lowered, mode)
    row.update(
        lockstep_iterations=iterations,
        kernels_per_step=row["kernels"] / max(iterations, 1),
        us_per_step=wall * 1e6 / max(iterations, 1),
        device_busy=row["device_us"] / (wall * 1e6),
        loop_body_launching_instructions=loop_bodies(hlo),
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiments", type=int, default=10_000)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--quick", action="store_true", help="200 experiments (a CPU smoke run)")
    parser.add_argument("--out", type=Path, default=RESULTS / "profile_gpu_step.json")
    parser.add_argument("--trace-dir", type=Path, default=None, help="where the raw traces go (default: a temporary folder)")
    parser.add_argument("--dense-solve", nargs="+", choices=DENSE_SOLVES, default=["auto"],
                        help="Dense(solve=...) of the network; several are profiled one after the other "
                             "(auto: the inverse on a GPU, the LU on a CPU)")  # fmt: skip
    args = parser.parse_args()
    n = 200 if args.quick else args.experiments
    trace_root = args.trace_dir or Path(tempfile.mkdtemp(prefix="diffsoup-trace-"))
    _log(f"network study, {n} experiments, on {jax.devices()[0].device_kind}")
    rows = []
    for dense_solve in args.dense_solve:
        lowered = ds.lower(network_study(n, dense_solve=dense_solve), solver=SolverOptions(rtol=RTOL, atol=ATOL))
        for mode in args.modes:
            rows.append(dict(dense_solve=dense_solve, **profile_mode(lowered, mode, trace_root / dense_solve)))
            r = rows[-1]
            _log(f"Dense(solve={dense_solve!r}) {mode}: {r['wall_s']:.3f} s, {r['kernels']} kernels, device busy "
                 f"{r['device_busy']:.0%}, {r['lockstep_iterations']} lock-step iterations, "
                 f"{r['kernels_per_step']:.1f} kernels and {r['us_per_step']:.1f} us per step")  # fmt: skip
            for s in r["by_source"][:12]:
                print(f"    {s['share']:6.1%} {s['device_us'] / 1e3:9.2f} ms {s['kernels']:8d} kernels  {s['source']}")
    write_json(args.out, dict(machine=machine_info(), experiments=n, rtol=RTOL, atol=ATOL, rows=rows,
                              trace_dir=str(trace_root)))  # fmt: skip
    _log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
