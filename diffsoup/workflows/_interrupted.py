"""What a command stopped by Ctrl-C says, and what it leaves behind.

The command's SIGINT handler (:class:`QuietInterrupt`) silences Dask's loggers at once, so that
the shutdown of the cluster that follows prints nothing, and raises ``KeyboardInterrupt`` (again,
until the command has caught it, where Python dropped it).

The command prints one line (what finished, what is kept, how to go on) instead of the tracebacks
of the client, the scheduler and the workers, and removes what the run created and left empty (the
output folder of a fit stopped before its results, an empty ``plots/``). What finished is kept
where it can be resumed from:

- ``campaign``: the ledger ``<out>/campaign.json`` holds every finished start; the same command runs
  the others.
- ``profile``: the ledger ``<out>/profile-ledger.json`` holds every finished profile.
- ``simulate --samples``: ``<out>/simulation.zarr`` holds the finished chunks.
- ``fit``: its starts run inside one call of ``ds.inference.fit`` and none is kept; the line points
  to ``campaign``, which runs the same starts (the same points) resumably.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any


def _finished(ledger: Path) -> tuple[int, int] | None:
    """``(accepted, recorded)`` tasks of a ledger, or None when it cannot be read."""
    try:
        tasks = json.loads(ledger.read_text()).get("tasks", {})
    except (OSError, ValueError, AttributeError):
        return None
    return sum(1 for t in tasks.values() if t.get("state") == "accepted"), len(tasks)


def remove_empty_folders(out: Path, existed: bool) -> None:
    """Remove what a stopped run left empty: ``<out>/plots``, and ``out`` itself when this run
    created it (other empty folders in an output folder that was there are not the run's)."""
    for folder in (out / "plots", *(() if existed else (out,))):
        try:
            folder.rmdir()  # only an empty one goes
        except OSError:
            pass


def interrupted_message(command: str, args: Any, *, starts: int | None = None, options: tuple[str, ...] = ()) -> str:
    """The one line of a command stopped by Ctrl-C (``args``: the command's parsed arguments;
    ``starts``: the number of starts, when known; ``options``: a fit's options, repeated in the
    ``campaign`` command it offers)."""
    out = Path(args.out)
    if command in ("campaign", "profile"):
        ledger = out / ("campaign.json" if command == "campaign" else "profile-ledger.json")
        what = "starts" if command == "campaign" else "profiles"
        counts = _finished(ledger) if ledger.is_file() else None
        if counts is None:
            return f"interrupted before any of the {what} finished; nothing to keep"
        total = starts if command == "campaign" and starts else counts[1]
        return (f"interrupted after {counts[0]} of {total} {what}; the ledger {ledger} keeps the finished ones: run "
                f"the same command again to run the others")  # fmt: skip
    if command == "simulate" and getattr(args, "samples", None) is not None:
        store = out / "simulation.zarr"
        if store.exists():
            return (f"interrupted; {store} keeps the finished chunks: run the same command again to simulate the "
                    f"others")  # fmt: skip
        return "interrupted before any chunk was written; nothing to keep"
    if command == "fit":
        tail = " ".join(shlex.quote(a) for a in options)
        of = f" of {starts} starts" if starts else ""
        return (f"interrupted; fit keeps none{of}: 'diffsoup campaign {shlex.quote(str(args.study))} -o "
                f"{shlex.quote(str(out))}{(' ' + tail) if tail else ''}' runs the same starts as a campaign, "
                f"whose ledger keeps each finished start (a rerun after Ctrl-C runs only the others)")  # fmt: skip
    return "interrupted"


def fit_argv(args: Any) -> tuple[str, ...]:
    """The fit options given on the command line, as the ``campaign`` command takes them."""
    argv: list[str] = []
    for name in ("method", "hessian", "starts", "seed", "max_nfev"):
        if getattr(args, name, None) is not None:
            argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if getattr(args, "hierarchical", None) is not None:
        argv.append("--hierarchical" if args.hierarchical else "--no-hierarchical")
    for name in ("scheduler", "slurm", "workers"):
        if getattr(args, name, None) is not None:
            argv += [f"--{name}", str(getattr(args, name))]
    if getattr(args, "in_process", False):
        argv.append("--in-process")
    return tuple(argv)


# A KeyboardInterrupt raised while Python runs a weakref callback or a ``__del__`` (the garbage
# collector runs them between any two bytecodes) is printed as "Exception ignored" and dropped, and
# the command went on as if Ctrl-C had not come (seen once in a full test run: a fit on the embedded
# cluster finished its 60 starts). So the handler delivers the interrupt again every this many
# seconds until the command acknowledges it, except while a KeyboardInterrupt is being unwound
# (its cleanup, the cluster's shutdown, is not interrupted).
REDELIVER_S = 0.5


class QuietInterrupt:
    """The command's SIGINT handler: silences Dask's loggers at once (the cluster's shutdown that
    follows prints nothing; the levels come back when ``stack`` closes) and raises
    KeyboardInterrupt, again every :data:`REDELIVER_S` seconds until :meth:`acknowledge` where the
    first was swallowed (a swallowed one prints nothing). The command acknowledges when it catches
    the interrupt, and before it puts the previous handler back."""

    def __init__(self, stack: contextlib.ExitStack):
        self.stack = stack
        self._acknowledged = threading.Event()
        self._redelivering: threading.Thread | None = None

    def __call__(self, signum, frame):
        if _unwinding_an_interrupt():
            return
        if self._redelivering is None:
            from ..distributed._clusters import quiet_dask_logs

            self.stack.enter_context(quiet_dask_logs())
            self.stack.enter_context(_swallowed_interrupts_unprinted())
            main = threading.main_thread().ident
            self._redelivering = threading.Thread(target=self._redeliver, args=(main,), daemon=True,
                                                  name="diffsoup-interrupt")  # fmt: skip
            self._redelivering.start()
        raise KeyboardInterrupt

    def acknowledge(self) -> None:
        """The command has caught the interrupt: no more deliveries."""
        self._acknowledged.set()

    def _redeliver(self, main_thread: int) -> None:
        while not self._acknowledged.wait(REDELIVER_S):
            signal.pthread_kill(main_thread, signal.SIGINT)


def _unwinding_an_interrupt() -> bool:
    """Whether the main thread runs the cleanup (an ``except``, ``finally`` or ``__exit__``) of a
    KeyboardInterrupt, or of an exception raised during one."""
    exc = sys.exception()
    while exc is not None:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc = exc.__context__
    return False


@contextlib.contextmanager
def _swallowed_interrupts_unprinted():
    """A KeyboardInterrupt that Python drops (raised in a weakref callback or ``__del__``) prints
    nothing: it is delivered again."""
    previous = sys.unraisablehook

    def hook(unraisable):
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


def interrupt_quietly(stack: contextlib.ExitStack) -> QuietInterrupt:
    """The command's SIGINT handler (:class:`QuietInterrupt`); what it changes comes back when
    ``stack`` closes."""
    return QuietInterrupt(stack)


def install_quiet_interrupt(stack: contextlib.ExitStack) -> QuietInterrupt | None:
    """Make :func:`interrupt_quietly`'s handler the SIGINT handler until ``stack`` closes (None,
    nothing installed, off the main thread or where SIGINT's handler is not Python's)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        return None
    handler = interrupt_quietly(stack)
    stack.callback(signal.signal, signal.SIGINT, signal.signal(signal.SIGINT, handler))
    stack.callback(handler.acknowledge)  # first at the close: nothing delivered once the handler is gone
    return handler
