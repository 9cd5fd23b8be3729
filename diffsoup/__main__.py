"""``python -m diffsoup``: the ``diffsoup`` command."""

import sys

from .cli import main

sys.exit(main())
