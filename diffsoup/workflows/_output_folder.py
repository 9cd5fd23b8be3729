"""The output folder of a command, checked before any work: one message naming the folder and the fix.

A run that cannot write its results should say so before it spends minutes (or a cluster's hours)
on them: :func:`check_output_folder` is called by the ``diffsoup`` command before the study is
lowered or a cluster starts, and by the workflows (``fit_study``, ``simulate_study``,
``campaign_study``, ``profile_study``) before they create the folder. It creates nothing, so a run
stopped early leaves no empty folder behind.

A folder that does not exist yet is fine when the nearest folder above it that exists can be
written (the missing ones are created then, as ``mkdir -p`` does); a file where a folder should
be, or a folder this process may not write, is an :class:`OutputFolderError`.
"""

from __future__ import annotations

import os
from pathlib import Path


class OutputFolderError(ValueError):
    """An output folder that this process cannot create or write (a ``ValueError``)."""


def check_output_folder(out: str | os.PathLike) -> Path:
    """``out`` as a path, checked: it is (or can be created as) a folder this process can write.

    Returns:
        The path (nothing is created).

    Raises:
        OutputFolderError: naming the folder, what is in the way and the fix: a file at ``out`` or
            above it, or a folder (``out`` or the nearest existing one above it) that cannot be
            written.
    """
    out = Path(out)
    probe = out
    while not probe.exists() and not probe.is_symlink() and probe != probe.parent:
        probe = probe.parent  # the nearest existing path: the missing folders are created in it
    if probe.is_symlink() and not probe.exists():
        raise OutputFolderError(f"cannot write the output folder {out}: {probe} is a broken symbolic link; give "
                                f"another --out, or remove the link.")  # fmt: skip
    if not probe.is_dir():
        what = "is a file" if probe == out else f"lies under the file {probe}"
        raise OutputFolderError(f"cannot write the output folder {out}: it {what}, not a folder; give another --out "
                                f"(a folder), or move {probe} away.")  # fmt: skip
    if not os.access(probe, os.W_OK | os.X_OK):
        where = "" if probe == out else f" (it would be created in {probe})"
        raise OutputFolderError(f"cannot write the output folder {out}{where}: permission denied; give another --out "
                                f"(a folder this process can write), or make {probe} writable.")  # fmt: skip
    return out
