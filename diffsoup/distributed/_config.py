"""The ``diffsoup`` namespace of Dask's configuration: execution settings of runs, campaigns and
clusters (dask-jobqueue's pattern).

Defaults ship in ``diffsoup.yaml`` beside this module and are added to Dask's defaults when this
module is first imported (only the execution layer imports it, and it imports Dask). A keyword
argument that a function leaves ``None`` reads its setting here, so users change defaults with
Dask's own mechanisms: a YAML file under ``~/.config/dask/``, ``DASK_DIFFSOUP__RUN__RETRIES=5``, or
``dask.config.set({"diffsoup.run.retries": 5})``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dask.config
import yaml

DEFAULTS_FILE = Path(__file__).with_name("diffsoup.yaml")

with DEFAULTS_FILE.open() as _f:
    DEFAULTS: dict = yaml.safe_load(_f)

dask.config.update_defaults(DEFAULTS)


def get(key: str, value: Any = None) -> Any:
    """``value`` if it is not None, else the setting ``diffsoup.<key>`` (e.g. ``"run.retries"``).

    Raises:
        KeyError: for a key the namespace does not have (a bug in diffsoup, or a config file that
            removed it).
    """
    if value is not None:
        return value
    return dask.config.get(f"diffsoup.{key}")
