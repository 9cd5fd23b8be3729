"""The analytic parameters of a campaign's lowered study, found once per process.

Every task of a multistart campaign (a start, or a block of starts as lanes) optimizes the same
parameters analytically (``fit``'s ``hierarchical``: by default the noise levels that qualify).
Finding them evaluates the study a few times, so a process finds them once for the lowered study
and choice its tasks last used (:func:`analytic_once`), and a driver that runs tasks in its own
process hands over what it found (:func:`remember_analytic`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..inference import AbstractLoweredStudy
from ..inference.fitting._hierarchical import AnalyticParameters

# The analytic parameters of the lowered study a process's tasks last used, found once per study
# and choice: [lowered, choice, AnalyticParameters or None].
_ANALYTIC: list = [None, None, None]


def _choice_key(choice: Any) -> Any:
    """A hashable form of a ``hierarchical`` choice (None, a boolean or names)."""
    return tuple(choice) if isinstance(choice, (list, tuple)) else choice


def analytic_once(lowered: AbstractLoweredStudy, choice: bool | Sequence[str] | None) -> AnalyticParameters | None:
    """``AnalyticParameters.find(lowered, choice)`` (None for False or no names), found once per
    process for the last lowered study and choice: the tasks of a campaign (a start or a block of
    starts each) share it (a driver running them in its own process hands over what it found:
    :func:`remember_analytic`)."""
    key = _choice_key(choice)
    if _ANALYTIC[0] is not lowered or _ANALYTIC[1] != key:
        found = AnalyticParameters.find(lowered, choice) if choice is None or choice else None
        remember_analytic(lowered, choice, found)
    return _ANALYTIC[2]


def remember_analytic(lowered: AbstractLoweredStudy, choice: bool | Sequence[str] | None,
                      found: AnalyticParameters | None) -> None:  # fmt: skip
    """Record ``found`` as what :func:`analytic_once` gives for ``(lowered, choice)``."""
    _ANALYTIC[:] = [lowered, _choice_key(choice), found]
