"""``petab.v1``'s own reading of a problem and its ``lint_problem``, with petab's log collected
rather than printed; lint errors raised as one :class:`~diffsoup.formats._petab_errors.PetabError`.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from ._petab_cells import mixed_columns_quiet
from ._petab_errors import PetabError


def petab_problem(yaml_path: Path):
    import petab.v1 as petab

    try:
        with quiet_petab(), mixed_columns_quiet():
            return petab.Problem.from_yaml(str(yaml_path))
    except Exception as exc:  # noqa: BLE001 (petab's errors vary)
        raise PetabError(f"petab.v1 cannot read the problem: {type(exc).__name__}: {exc}", path=yaml_path) from None


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@contextlib.contextmanager
def quiet_petab():
    """petab's log messages collected (not printed); yields the handler holding them."""
    logger = logging.getLogger("petab")
    handler = _Records()
    logger.addHandler(handler)
    propagate = logger.propagate
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def lint(tables) -> None:
    """``petab.v1.lint_problem``; its errors raised as one :class:`PetabError`."""
    import petab.v1 as petab

    with quiet_petab() as log:
        failed = petab.lint_problem(tables.problem)
    if failed:
        errors = [r.getMessage() for r in log.records if r.levelno >= logging.ERROR] or ["(no message)"]
        raise PetabError("petab.v1.lint_problem found errors: " + "; ".join(errors[:8])
                         + (f"; ... ({len(errors)} in all)" if len(errors) > 8 else ""), path=tables.yaml_path)  # fmt: skip
