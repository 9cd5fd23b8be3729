"""Progress lines while programs compile: which program, and how long so far.

``ds.lower``'s programs announce the start and end of each compilation on the
``diffsoup.compile`` logger (records with ``extra["diffsoup_compile"] = (event, what, seconds)``).
The command installs :class:`CompileProgress`, which prints a line when a compilation starts,
one every ``interval`` seconds while it runs, and one when it ends, so that a first evaluation
that compiles for a minute says what it is doing. A fit on Dask forwards its workers' records here
(``diffsoup.distributed._compile_forwarding``): their lines name the worker.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable


class CompileProgress(logging.Handler):
    """A logging handler printing compilation progress through ``emit_line``.

    Args:
        emit_line: where each line goes (e.g. ``print``).
        interval: seconds between "still compiling" lines.
    """

    def __init__(self, emit_line: Callable[[str], None], *, interval: float = 10.0):
        super().__init__(level=logging.INFO)
        self._emit_line = emit_line
        self._interval = float(interval)
        self._lock = threading.Lock()
        self._running: dict[str, threading.Event] = {}
        self.logger_was: tuple[int, bool] | None = None  # the logger's (level, propagate) before installation

    def emit(self, record: logging.LogRecord) -> None:
        info = getattr(record, "diffsoup_compile", None)
        if info is None:
            return
        event, what, seconds = info
        # A record forwarded from a Dask worker names it (Client.forward_logging): several workers
        # compile the same program at once, each announced and ended on its own.
        worker = getattr(record, "worker", None)
        label = f"{what} on worker {worker}" if worker else what
        if event == "start":
            self._emit_line(f"compiling the {label} ...")
            done = threading.Event()
            with self._lock:
                self._running[label] = done
            started = time.perf_counter()
            threading.Thread(target=self._tick, args=(label, started, done), daemon=True).start()
        else:
            with self._lock:
                done = self._running.pop(label, None)
            if done is not None:
                done.set()
            self._emit_line(f"compiled the {label} in {seconds:.1f} s")

    def stop(self) -> None:
        """End every ticker (compilations still running print nothing more)."""
        with self._lock:
            running, self._running = list(self._running.values()), {}
        for done in running:
            done.set()

    def _tick(self, what: str, started: float, done: threading.Event) -> None:
        while not done.wait(self._interval):
            self._emit_line(f"  still compiling the {what} ({time.perf_counter() - started:.0f} s so far)")


def install_compile_progress(emit_line: Callable[[str], None], *, interval: float = 10.0) -> CompileProgress:
    """Print compilation progress of this process through ``emit_line`` (once per process)."""
    logger = logging.getLogger("diffsoup.compile")
    for handler in logger.handlers:
        if isinstance(handler, CompileProgress):
            return handler
    handler = CompileProgress(emit_line, interval=interval)
    handler.logger_was = (logger.level, logger.propagate)  # given back by remove_compile_progress
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # our lines, not the root logger's format as well
    return handler


def remove_compile_progress() -> None:
    """Stop printing compilation progress (the command's handler, when it returns to a caller that
    runs it in-process): the handler is removed, its tickers stopped, and the logger's level and
    propagation set back to what they were before :func:`install_compile_progress`."""
    logger = logging.getLogger("diffsoup.compile")
    for handler in list(logger.handlers):
        if isinstance(handler, CompileProgress):
            logger.removeHandler(handler)
            handler.stop()
            if handler.logger_was is not None:
                logger.setLevel(handler.logger_was[0])
                logger.propagate = handler.logger_was[1]
