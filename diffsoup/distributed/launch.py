"""``python -m diffsoup.distributed.launch -n N script.py [args]``: N processes on this machine.

Each process runs ``script.py args`` with the coordinator of JAX's multi-process runtime set
(``DIFFSOUP_LAUNCH_COORDINATOR``, ``DIFFSOUP_LAUNCH_NUM_PROCESSES``, ``DIFFSOUP_LAUNCH_PROCESS_ID``),
so that ``ds.distributed.initialize()`` with no arguments starts the runtime; on CPU the
processes' collectives use gloo. The coordinator listens on 127.0.0.1 (a free port unless
``--port`` is given). ``JAX_ENABLE_X64=1`` is set unless the environment sets it.

The launcher waits for every process. When one fails, the others are given ``--grace`` seconds
(default 30) to end and are then terminated; the launcher exits with the first non-zero status
(or 0 when every process succeeded).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ._runtime import LAUNCH_COORDINATOR, LAUNCH_NUM_PROCESSES, LAUNCH_PROCESS_ID


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m diffsoup.distributed.launch",
        description="Start N processes of a script on this machine, with JAX's coordinator set.",
    )
    p.add_argument("-n", "--nproc", type=int, required=True, help="number of processes (>= 1)")
    p.add_argument("--port", type=int, default=None, help="coordinator port on 127.0.0.1 (default: a free one)")
    p.add_argument("--grace", type=float, default=30.0, help="seconds the others get after one process fails")
    p.add_argument("script", help="the Python script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the launcher; returns the exit status."""
    ns = _parser().parse_args(argv)
    if ns.nproc < 1:
        print(f"launch: -n {ns.nproc}: give at least one process.", file=sys.stderr)
        return 2
    if not Path(ns.script).is_file():
        print(f"launch: no such script {ns.script!r}.", file=sys.stderr)
        return 2
    address = f"127.0.0.1:{ns.port or _free_port()}"
    package_root = str(Path(__file__).resolve().parents[2])
    procs = []
    for rank in range(ns.nproc):
        env = dict(os.environ)
        env.setdefault("JAX_ENABLE_X64", "1")
        env[LAUNCH_COORDINATOR] = address
        env[LAUNCH_NUM_PROCESSES] = str(ns.nproc)
        env[LAUNCH_PROCESS_ID] = str(rank)
        # The processes import the same diffsoup as the launcher.
        env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        procs.append(subprocess.Popen([sys.executable, ns.script, *ns.args], env=env))
    status = 0
    failed_at = None
    try:
        while True:
            codes = [p.poll() for p in procs]
            bad = [c for c in codes if c not in (None, 0)]
            if bad and status == 0:
                status = bad[0]
                failed_at = time.monotonic()
            if all(c is not None for c in codes):
                break
            if failed_at is not None and time.monotonic() - failed_at > ns.grace:
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGTERM)
                time.sleep(2.0)
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        return 130
    for p in procs:
        p.wait()
    return status


if __name__ == "__main__":
    sys.exit(main())
