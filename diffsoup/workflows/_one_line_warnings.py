"""diffsoup's own warnings as one line on stderr (the command's display of them).

Python shows a warning with its file, line and source line (``warnings.warn(``), which reads as a
crash to someone running a command. The ``diffsoup`` command shows the warnings of diffsoup's own
classes (``ToleranceWarning``, ...) as ``diffsoup: warning: <message>``, each message once; other
warnings keep Python's form.
"""

from __future__ import annotations

import contextlib
import sys
import warnings


def one_line_warnings(stack: contextlib.ExitStack) -> None:
    """Show diffsoup's own warnings (a class of diffsoup's, as ``ToleranceWarning``) as one line
    ``diffsoup: warning: ...`` on stderr instead of Python's form (file, line and source line),
    each message once; other warnings keep Python's form. Undone when ``stack`` closes."""
    shown: set[str] = set()
    python_form = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if category.__module__.partition(".")[0] != "diffsoup":
            return python_form(message, category, filename, lineno, file, line)
        text = " ".join(str(message).split())
        if text not in shown:
            shown.add(text)
            print(f"diffsoup: warning: {text}", file=sys.stderr, flush=True)

    warnings.showwarning = show
    stack.callback(setattr, warnings, "showwarning", python_form)
