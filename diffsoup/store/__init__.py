"""Stores: the JSON ledger of campaigns (and, beside it, the Zarr stores of windows and results).

Importing this package imports neither Dask nor zarr.
"""

from ._ledger import LEDGER_VERSION as LEDGER_VERSION
from ._ledger import TASK_STATES as TASK_STATES
from ._ledger import Ledger as Ledger
from ._ledger import LedgerConflictError as LedgerConflictError
from ._ledger import LedgerError as LedgerError
from ._ledger import LedgerLockedError as LedgerLockedError
from ._ledger import backup_ledger as backup_ledger
from ._ledger import fingerprint as fingerprint
from ._ledger import write_text_durably as write_text_durably
