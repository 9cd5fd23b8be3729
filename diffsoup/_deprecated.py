"""Renamed keywords: the old name keeps working, with a ``DeprecationWarning`` that names the new one.

Used where a keyword was renamed to say its unit (``chunk_size=`` became ``experiments_per_chunk=``
on ``ds.lower`` and ``draws_per_chunk=`` on the ensembles); imports nothing of ours.
"""

from __future__ import annotations

import warnings
from typing import Any


def renamed_keyword(where: str, old: str, old_value: Any, new: str, new_value: Any, *, stacklevel: int = 3) -> Any:
    """The value of keyword ``new``, or of its deprecated name ``old`` (with a warning).

    Both keywords default to None; ``stacklevel`` 3 points the warning at the caller of the
    function that calls this one.

    Raises:
        TypeError: when both names are given.
    """
    if old_value is None:
        return new_value
    if new_value is not None:
        raise TypeError(f"{where}: give {new}= only ({old}= is its deprecated name), not both.")
    warnings.warn(f"{where}: {old}= is deprecated; give {new}= instead (the same value, the same result).",
                  DeprecationWarning, stacklevel=stacklevel)  # fmt: skip
    return old_value
