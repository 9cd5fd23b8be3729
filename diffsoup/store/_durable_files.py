"""Durable files: :func:`write_text_durably` (a crash leaves the old file or the new one, whole),
:func:`remove_stale_temporaries` (what a killed writer left), and :func:`backup_ledger` (a file
moved aside under a fresh ``.bak`` name, never replacing another).
"""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path

_TMP_SUFFIX = ".tmp"


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable; a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # Windows, or a file system that refuses it: the rename is still atomic.
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text_durably(path: str | os.PathLike, text: str) -> None:
    """Replace ``path`` by ``text`` so that a crash leaves either the old or the new file whole.

    Args:
        path: the file to write; its directory must exist.
        text: the full new content (UTF-8).

    Raises:
        OSError: if the directory cannot be written; the old file is then left as it was.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}{_TMP_SUFFIX}")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        # Whatever stopped us (a full disk, a KeyboardInterrupt), the old file is intact.
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete temporary files a killed writer left beside ``path``; call it holding the lock.

    Returns:
        The paths removed.
    """
    path = Path(path)
    removed = []
    prefix = f".{path.name}."
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if entry.name.startswith(prefix) and entry.name.endswith(_TMP_SUFFIX):
            try:
                entry.unlink()
                removed.append(entry)
            except OSError:
                pass
    return removed


def backup_ledger(path: str | os.PathLike) -> Path:
    """Move the ledger at ``path`` aside to ``<name>.<UTC time>.bak``, never replacing a file.

    Args:
        path: an existing ledger file (valid or not: a damaged file is kept as it is).

    Returns:
        The path of the backup.

    Raises:
        OSError: if the file cannot be moved; it is then still at ``path``.
    """
    path = Path(path)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    for n in range(1000):
        suffix = f".{stamp}.bak" if n == 0 else f".{stamp}-{n}.bak"
        target = path.with_name(path.name + suffix)
        try:
            # link() refuses an existing target, so no backup is ever overwritten.
            os.link(path, target)
        except FileExistsError:
            continue
        except OSError:
            if target.exists():
                continue
            # File systems without hard links: rename after the existence check above.
            os.rename(path, target)
        else:
            os.unlink(path)
        _fsync_dir(path.parent)
        return target
    raise OSError(f"could not find a free backup name for {path}")
