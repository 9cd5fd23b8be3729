"""A campaign run as its own process, for the SIGKILL test in test_campaign.py.

Usage: python tests/campaign_worker_script.py LEDGER RUNLOG N_TASKS SLEEP_SECONDS

Prints ``ready`` once imports are done (so the test times its kill from the campaign's start,
not from Python's), then runs a serial campaign of N_TASKS tasks. Each task sleeps, appends
``<task_id> <nonce>`` to RUNLOG and returns a result holding that fresh nonce: a task run twice
would change its result, so an accepted result that changes between runs means a task was
accepted twice.
"""

import os
import sys
import time
import uuid

from diffsoup.inference import checkpointed_map


def task(item):
    time.sleep(item["sleep"])
    nonce = uuid.uuid4().hex
    with open(item["runlog"], "a") as log:
        log.write(f"{item['task_id']} {nonce}\n")
    return {"task_id": item["task_id"], "square": item["x"] ** 2, "nonce": nonce, "pid": os.getpid()}


def main() -> None:
    ledger, runlog, n, sleep = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    items = [{"task_id": f"task-{i:02d}", "x": i, "sleep": sleep, "runlog": runlog} for i in range(n)]
    print("ready", flush=True)
    result = checkpointed_map(task, items, ledger_path=ledger, progress=False)
    print(f"done {len(result.results)} {len(result.failures)}", flush=True)


if __name__ == "__main__":
    main()
