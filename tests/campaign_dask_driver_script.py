"""A Dask campaign's client run as its own process, for the client-kill test in test_campaign.py.

Usage: python tests/campaign_dask_driver_script.py SCHEDULER LEDGER RUNLOG PIDFILE MARKERS N_TASKS KILLERS

Writes its pid to PIDFILE, then runs a Dask campaign of N_TASKS tasks on the scheduler at
SCHEDULER. Each task appends ``<task_id> <nonce>`` to RUNLOG as soon as it runs; the first run of
each task named in KILLERS (comma-separated) then SIGKILLs this client (the pid in PIDFILE), so the
client dies while that task runs. Prints ``done <accepted> <failed>`` when the campaign ends.
"""

import os
import signal
import sys
import time
import uuid
from pathlib import Path

from distributed import Client

from diffsoup.distributed import checkpointed_map


def task(item):
    nonce = uuid.uuid4().hex
    with open(item["runlog"], "a") as log:
        log.write(f"{item['task_id']} {nonce}\n")
    marker = Path(item["markers"]) / item["task_id"]
    if item["task_id"] in item["killers"] and not marker.exists():
        marker.write_text("")
        os.kill(int(Path(item["pidfile"]).read_text()), signal.SIGKILL)
    time.sleep(item["sleep"])
    return {"task_id": item["task_id"], "nonce": nonce}


def main() -> None:
    scheduler, ledger, runlog, pidfile, markers, n, killers = sys.argv[1:8]
    Path(pidfile).write_text(str(os.getpid()))
    items = [{"task_id": f"t{i}", "sleep": 0.2, "runlog": runlog, "pidfile": pidfile, "markers": markers,
              "killers": killers.split(",")} for i in range(int(n))]  # fmt: skip
    with Client(scheduler, set_as_default=False) as client:
        result = checkpointed_map(task, items, ledger_path=ledger, execution="dask", client=client, progress=False)
    print(f"done {len(result.results)} {len(result.failures)}", flush=True)


if __name__ == "__main__":
    main()
