"""The progress bar of a campaign, on stderr."""

from __future__ import annotations

import importlib.util
import sys
import time


class ProgressBar:
    """A progress bar on stderr: tqdm's when tqdm is installed, else a one-line bar of our own.

    Our own bar redraws in place at most ten times a second on a terminal; when stderr is a file
    or a pipe (CI logs) it writes a line at each tenth of the way instead of flooding the log.

    Args:
        total: the number of tasks.
        done: tasks finished (accepted or failed) before the bar starts.
        failed: how many of those failed.
        enabled: False draws nothing (and so does a campaign of no tasks).
        desc: the bar's label.
    """

    def __init__(self, total: int, done: int, failed: int, enabled: bool, desc: str = "diffsoup campaign"):
        self.total, self.desc = total, desc
        self.enabled = enabled and total > 0
        self._tqdm = None
        self._start = time.monotonic()
        self._last_draw = -1.0
        self._drawn: tuple[int, int] | None = None
        self._done, self._failed = done, failed
        if self.enabled and tqdm_installed():
            from tqdm.auto import tqdm

            self._tqdm = tqdm(total=total, initial=done, desc=desc, unit="task", file=sys.stderr)
            self._tqdm.set_postfix(failed=failed)

    def update(self, done: int, failed: int) -> None:
        """Show ``done`` finished tasks (accepted or failed), ``failed`` of them failed."""
        if not self.enabled:
            return
        if self._tqdm is not None:
            if (done, failed) != (self._done, self._failed):
                self._tqdm.set_postfix(failed=failed, refresh=False)
                self._tqdm.update(done - self._done)
            self._done, self._failed = done, failed
            return
        self._done, self._failed = done, failed
        self._draw()

    def _draw(self, final: bool = False) -> None:
        stream = sys.stderr
        tty = getattr(stream, "isatty", lambda: False)()
        now = time.monotonic()
        state = (self._done, self._failed)
        if tty:
            if not final and now - self._last_draw < 0.1:
                return
        elif state == self._drawn or not final and self._drawn is not None and (
            self._done * 10 // self.total == self._drawn[0] * 10 // self.total
        ):
            return
        self._last_draw, self._drawn = now, state
        width = 30
        filled = width * self._done // self.total
        line = (
            f"{self.desc} [{'#' * filled}{'.' * (width - filled)}] {self._done}/{self.total} "
            f"failed {self._failed} {now - self._start:6.1f}s"
        )
        stream.write(f"\r{line}" + ("\n" if final else "") if tty else line + "\n")
        stream.flush()

    def close(self) -> None:
        """End the bar (our own bar draws its last state on a line of its own)."""
        if not self.enabled:
            return
        if self._tqdm is not None:
            self._tqdm.close()
        else:
            self._draw(final=True)


def tqdm_installed() -> bool:
    """Whether tqdm (not a dependency) can be imported."""
    return importlib.util.find_spec("tqdm") is not None
