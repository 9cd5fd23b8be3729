"""Preload of the embedded cluster's worker processes: Ctrl-C belongs to the driver.

Ctrl-C at a terminal sends SIGINT to every process of the foreground group: the ``diffsoup``
command and the worker processes of its embedded cluster. Each worker would die with a
``KeyboardInterrupt`` traceback of its own; with SIGINT ignored here, the command alone handles
it (one line saying what was kept) and closes its cluster, which ends the workers. Only the
embedded cluster's workers get this preload: workers started by hand (``dask worker``) keep their
Ctrl-C. The same workers keep the warning that a task was cancelled to themselves (the logger
:data:`CANCELLATION_LOGGER` at ERROR): the driver cancels the running evaluation when it is
interrupted, and that warning would be the one line of Dask's on the terminal after diffsoup's own.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any


def ignore_interrupts() -> None:
    """Ignore SIGINT in this process (only the main thread may set signal handlers; elsewhere nothing is done)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


# Where a worker reports an instruction that ended with CancelledError (a cancelled evaluation).
CANCELLATION_LOGGER = "distributed.worker.state_machine"


def dask_setup(worker: Any = None) -> None:
    """Dask's preload hook: ignore SIGINT in the worker process; keep cancellations quiet."""
    ignore_interrupts()
    logging.getLogger(CANCELLATION_LOGGER).setLevel(logging.ERROR)


ignore_interrupts()  # at import too: a preload module is imported in the worker process's main thread
