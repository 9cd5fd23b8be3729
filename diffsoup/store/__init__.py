"""Stores: the JSON ledger of campaigns (with the fingerprints of its items and its durable
writes), and beside it the Zarr stores of window starts, results and ensembles.

Importing this package imports neither Dask nor zarr: the Zarr stores load on first access.
"""

from ._ledger import LEDGER_VERSION as LEDGER_VERSION
from ._ledger import TASK_STATES as TASK_STATES
from ._ledger import Ledger as Ledger
from ._ledger import LedgerConflictError as LedgerConflictError
from ._ledger import LedgerError as LedgerError
from ._ledger import LedgerLockedError as LedgerLockedError
from ._durable_files import backup_ledger as backup_ledger
from ._durable_files import write_text_durably as write_text_durably
from ._fingerprint import fingerprint as fingerprint

from .._settings import cache_dir as cache_dir

from .._lazy import lazy_attributes

# name -> module that defines it, loaded on first attribute access (keeps zarr out of the import).
__getattr__, __dir__ = lazy_attributes(
    __name__,
    {
        "WindowStore": "diffsoup.store._windows",
        "WindowStoreWarning": "diffsoup.store._windows",
        "write_fit": "diffsoup.store._results",
        "read_fit": "diffsoup.store._results",
        "read_experiment_arrays": "diffsoup.store._results",
        "write_simulation": "diffsoup.store._results",
        "write_summary": "diffsoup.store._results",
        "EnsembleStore": "diffsoup.store._ensemble_store",
        "EnsembleLayout": "diffsoup.store._ensemble_store",
        "ENSEMBLE_FORMAT": "diffsoup.store._ensemble_store",
    },
)
