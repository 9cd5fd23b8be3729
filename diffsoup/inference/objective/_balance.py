"""``ds.inference.balance_owners``: place experiments in consecutive blocks of balanced load."""

from __future__ import annotations

import math
from typing import Any, Callable

from ..study._study import Study


def balance_owners(experiments: Any, lanes: int, *, weight: Callable | None = None) -> Any:
    """Reorder a study's experiments so that equal consecutive blocks of owners carry balanced loads.

    The owners are the members of the study's outermost level or cluster, or else the experiments
    themselves. Each owner's experiments stay together (in their order), and the owners are
    assigned heaviest first (ties in study order), each to the lightest block with room (ties to
    the first block). Block ``b`` holds positions ``[b * c, (b + 1) * c)`` of the owner list with
    ``c = ceil(n_owners / lanes)``, so every block but the last ones holds ``c`` owners; the owners
    of a block keep their study order. When every block has room until the end, the heaviest and
    lightest blocks differ by at most the heaviest owner's weight.

    Args:
        experiments: a ``Study`` or a sequence of ``Experiment``.
        lanes: the number of consecutive blocks, filled in order with ``ceil(n_owners / lanes)``
            owners each.
        weight: a function giving the load of one experiment, or None to count its measured values.

    Returns:
        The reordered study, or a tuple of the reordered experiments.

    Raises:
        ValueError: for ``lanes`` below 1 or a negative or non-finite weight.
    """
    if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
        raise ValueError(f"balance_owners: lanes={lanes!r} must be a positive integer.")
    study = experiments if isinstance(experiments, Study) else None
    exps = tuple(study.experiments if study is not None else experiments)
    if weight is None:
        weight = lambda e: e.n_measured  # noqa: E731
    # Owners in order of first appearance, each with its experiments in order.
    owners: dict[Any, list] = {}
    for i, e in enumerate(exps):
        key = e.groups[study.levels[0]] if study is not None and study.levels else i
        owners.setdefault(key, []).append(e)
    groups = list(owners.values())
    loads = []
    for g in groups:
        w = 0.0
        for e in g:
            we = float(weight(e))
            if not math.isfinite(we) or we < 0:
                raise ValueError(f"balance_owners: weight of experiment {getattr(e, 'id', e)!r} is {we}; "
                                 "it must be finite and non-negative.")  # fmt: skip
            w += we
        loads.append(w)
    blocks = assign_blocks(loads, lanes)
    order = sorted(range(len(groups)), key=lambda o: (blocks[o], o))
    out = tuple(e for o in order for e in groups[o])
    return study.replace(experiments=out) if study is not None else out


def assign_blocks(loads, lanes: int) -> list[int]:
    """Block of each owner: heaviest first, each to the lightest block with room.

    Block ``b`` has room for ``min(c, max(0, n - b * c))`` owners, ``c = ceil(n / lanes)``.
    """
    n = len(loads)
    if n == 0:
        return []
    cap = math.ceil(n / lanes)
    room = [min(cap, max(0, n - b * cap)) for b in range(lanes)]
    total = [0.0] * lanes
    out = [0] * n
    for o in sorted(range(n), key=lambda o: (-loads[o], o)):
        b = min((b for b in range(lanes) if room[b] > 0), key=lambda b: (total[b], b))
        out[o] = b
        total[b] += loads[o]
        room[b] -= 1
    return out
