"""Compilation progress of Dask workers, shown by the driver: ``compiling the ... program`` while a
fit on a cluster compiles.

A fit on Dask compiles its programs on the workers, at the first evaluation: the driver's progress
bar sits at 0 of its starts, for a minute on a large model, saying nothing. The workers' programs
announce each compilation on the ``diffsoup.compile`` logger (as in-process ones do, see
``diffsoup.workflows._compile_progress``); :func:`forward_compile_progress` sets that logger to
INFO on every worker (:class:`CompileLogLevel`, a worker plugin, so that workers joining later get
it too) and forwards its records to the driver's logger of the same name (Dask's
``Client.forward_logging``), where the command's handler prints them with the worker's address.
"""

from __future__ import annotations

import logging
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

COMPILE_LOGGER = "diffsoup.compile"
PLUGIN_NAME = "diffsoup-compile-progress"


class CompileLogLevel(WorkerPlugin):
    """A worker plugin setting the ``diffsoup.compile`` logger to INFO (records of each compilation)."""

    def setup(self, worker: Any) -> None:
        logging.getLogger(COMPILE_LOGGER).setLevel(logging.INFO)


def forward_compile_progress(client: Any) -> bool:
    """Forward the workers' compilation records of ``client``'s cluster to this process's
    ``diffsoup.compile`` logger, when something here shows them (a handler on that logger: the
    command's); returns whether it did."""
    if not logging.getLogger(COMPILE_LOGGER).handlers:
        return False
    client.register_plugin(CompileLogLevel(), name=PLUGIN_NAME)
    client.forward_logging(COMPILE_LOGGER, level=logging.INFO)
    return True
