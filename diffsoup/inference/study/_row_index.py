"""What a study knows of its rows (experiments) whichever way it holds them: :class:`RowIndex`.

A study holds its experiments as arrays with a leading experiment axis (``Study.from_arrays``,
``Study.from_table``) or as ``Experiment`` objects. Its ids, measurement times, counts, level
members and multiple-shooting experiments are laid out once, at construction, as numbers with
the experiment axis first (:func:`row_index_of_arrays`, :func:`row_index_of_experiments`), so
that what reads a study (the objective, the results store, the workflows) asks the study and
never which way it holds its rows.
"""

from __future__ import annotations

import functools
from typing import Callable, Mapping, Sequence

import numpy as np

from ._experiment_arrays import ExperimentArrays


class RowIndex:
    """A study's rows.

    Attributes:
        ids: the experiment ids in study order.
        times: ``(E, m)`` measurement times, each row padded at its end (with its last time).
        n_times: ``(E,)`` the measurement times of each experiment.
        n_observables: the most observables an experiment has (``k`` of the arrays).
        n_measured: the measured (finite) values of all experiments.
        members: level -> its members in order of first appearance.
        shooting: the rows of experiments solved by multiple shooting (a ``Multishoot``).
        shape_examples: one row for each distinct shape of experiment (observables, noise), to
            check what holds for all experiments of that shape.

    ``ids`` and ``n_measured`` may be given as functions, computed on first use (a study of many
    experiments held as arrays stays cheap to build).
    """

    def __init__(self, *, ids: tuple | Callable[[], tuple], times: np.ndarray, n_times: np.ndarray,
                 n_observables: int, n_measured: int | Callable[[], int], members: Mapping[str, tuple],
                 shooting: tuple = (), shape_examples: tuple = (0,)):  # fmt: skip
        self._ids, self._n_measured = ids, n_measured
        self.times, self.n_times, self.n_observables = times, n_times, int(n_observables)
        self.members, self.shooting, self.shape_examples = members, tuple(shooting), tuple(shape_examples)

    @functools.cached_property
    def ids(self) -> tuple:
        return tuple(self._ids() if callable(self._ids) else self._ids)

    @functools.cached_property
    def n_measured(self) -> int:
        return int(self._n_measured() if callable(self._n_measured) else self._n_measured)

    def times_of(self, row: int) -> np.ndarray:
        """The measurement times of experiment ``row`` (unpadded)."""
        return self.times[row, : int(self.n_times[row])]


def row_index_of_arrays(arrays: ExperimentArrays) -> RowIndex:
    """The rows of experiments held as arrays (one shape; no multiple shooting)."""
    E, m, _ = arrays.shape
    n_times = arrays.n_times if arrays.n_times is not None else np.full(E, m, dtype=np.int32)
    return RowIndex(
        ids=lambda: arrays.ids.tolist(), times=arrays.times, n_times=n_times, n_observables=arrays.shape[2],
        n_measured=lambda: np.isfinite(arrays.data).sum(),
        members={level: members for level, (_, members) in arrays.groups.items()},
    )  # fmt: skip


def row_index_of_experiments(experiments: Sequence, levels: Sequence[str]) -> RowIndex:
    """The rows of ``Experiment`` objects (each its own shape)."""
    n_times = np.array([e.times.shape[0] for e in experiments], dtype=np.int32)
    times = np.empty((len(experiments), int(n_times.max())))
    for i, e in enumerate(experiments):
        times[i, : n_times[i]] = e.times
        times[i, n_times[i] :] = e.times[-1]
    return RowIndex(
        ids=tuple(e.id for e in experiments), times=times, n_times=n_times,
        n_observables=max(e.n_observables for e in experiments), n_measured=sum(e.n_measured for e in experiments),
        members={level: tuple(dict.fromkeys(e.groups[level] for e in experiments)) for level in levels},
        shooting=tuple(i for i, e in enumerate(experiments) if e.trajectory is not None),
        shape_examples=tuple(range(len(experiments))),
    )  # fmt: skip
