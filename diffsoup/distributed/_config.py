"""The ``diffsoup`` namespace of Dask's configuration: execution settings of runs, campaigns,
workers and clusters (dask-jobqueue's pattern).

Defaults ship in ``diffsoup.yaml`` beside this module and are read here without Dask, so that
``import diffsoup.distributed`` stays free of Dask and can still name a default (as
``DEFAULT_NO_WORKER_TIMEOUT`` does). A keyword argument that a function leaves ``None`` reads its
setting with :func:`get`: what Dask's configuration holds under ``diffsoup.<key>``, else the
shipped default. Users change settings with Dask's own mechanisms: a YAML file under
``~/.config/dask/``, ``DASK_DIFFSOUP__RUN__RETRIES=5``, or ``dask.config.set({"diffsoup.run.retries":
5})``.

The shipped defaults are not merged into Dask's configuration: Dask merges a default mapping into
a mapping the user set (``resources={"LANE": 1}`` would come back as ``{"LANE": 1, "GPU": 1}``),
so a user's mapping must be read as it is, with the default only where the user set nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

DEFAULTS_FILE = Path(__file__).with_name("diffsoup.yaml")

with DEFAULTS_FILE.open() as _f:
    DEFAULTS: dict = yaml.safe_load(_f)

_MISSING = object()


def default(key: str) -> Any:
    """The shipped default of ``diffsoup.<key>`` (what ``diffsoup.yaml`` says), without Dask.

    Raises:
        KeyError: for a key the namespace does not have.
    """
    node: Any = DEFAULTS["diffsoup"]
    for part in key.split("."):
        node = node[part.replace("_", "-")] if part.replace("_", "-") in node else node[part]
    return node


def get(key: str, value: Any = None) -> Any:
    """``value`` if it is not None, else the setting ``diffsoup.<key>`` (e.g. ``"run.retries"``):
    Dask's configuration's value, else the shipped default.

    Raises:
        KeyError: for a key the namespace does not have (a bug in diffsoup).
    """
    if value is not None:
        return value
    shipped = default(key)  # raises KeyError for a key that is not a setting
    import dask.config

    found = dask.config.get(f"diffsoup.{key}", default=_MISSING)
    return shipped if found is _MISSING else found
