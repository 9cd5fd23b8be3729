"""Parameter draws as Dask arrays, Saltelli's design, and Sobol' indices reduced chunk by chunk.

The numbers come from :mod:`diffsoup.inference.fitting._samplers` (NumPy); this module lays them out as
lazy Dask arrays chunked like ensembles, and reduces an ensemble's values to Sobol' indices with a
tree of partial moments (one per chunk, merged ``split_every`` at a time), so that no more than a
few chunks are held at once, however many draws there are.

Latin hypercube draws are built whole in one task (scipy's construction needs all ``n`` at once:
``n * d`` floats) and then split into chunks; Sobol' draws are generated chunk by chunk (each chunk
fast-forwards the sequence to its first row).

Chunks are counted in rows, each row one parameter point (one draw of :func:`sample`, what an
ensemble simulates): ``sample(draws_per_chunk=)``, ``saltelli(rows_per_chunk=)`` (a Saltelli
draw is ``d + 2`` rows, and its chunks hold whole draws); ``chunk_size=`` is the deprecated name
of both.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Sequence

import numpy as np

from ..inference.fitting._samplers import (
    ParameterBox,
    SobolIndices,
    check_count,
    check_method,
    latin_hypercube_unit,
    merge_partials,
    saltelli_indices,
    saltelli_partial,
    saltelli_unit,
    sobol_unit,
)
from .._deprecated import renamed_keyword
from ._config import get

SPLIT_EVERY = 8


def _rows_per_chunk(rows: Any, group: int = 1, keyword: str = "rows_per_chunk") -> int:
    """Rows per chunk: ``rows`` (else the setting ``diffsoup.ensemble.chunk-size``), as a
    multiple of ``group`` rows (at least one group); errors name ``keyword``."""
    size = get("ensemble.chunk-size", rows)
    if isinstance(size, str):
        size = int(size)
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"{keyword}={size!r} must be a positive integer (rows, parameter points, per chunk).")
    return group * max(1, round(int(size) / group))


def _sobol_block(box: ParameterBox, seed: int, block_info=None):
    start, stop = block_info[None]["array-location"][0]
    return box.values(sobol_unit(start, stop - start, box.dimension, seed))


def _lhs_values(box: ParameterBox, n: int, seed: int) -> np.ndarray:
    return box.values(latin_hypercube_unit(n, box.dimension, seed))


def sample(source: Any, n: int, *, method: str = "sobol", seed: int = 0, parameters: Sequence[str] | None = None,
           draws_per_chunk: int | None = None, chunk_size: int | None = None):  # fmt: skip
    """``n`` parameter draws as a lazy Dask array ``(n, d)`` of linear values, uniform on each
    parameter's scale within its bounds (see :class:`~diffsoup.inference.ParameterBox`).

    Args:
        source: a ``ds.Study`` (its estimated parameters), ``Parameter`` rows or a ``ParameterBox``;
            the columns are ``ParameterBox.of(source, parameters).names``.
        n: how many draws (a power of 2 for ``"sobol"``).
        method: ``"sobol"`` (scrambled Sobol' points) or ``"lhs"`` (Latin hypercube).
        seed: fixes the draws (the same seed, the same array, in every process).
        parameters: the names to draw (default: every estimated parameter).
        draws_per_chunk: draws (rows) per chunk; None reads ``diffsoup.ensemble.chunk-size``.
        chunk_size: the deprecated name of ``draws_per_chunk`` (warns).

    Raises:
        ValueError: for a bad ``n``, ``method``, ``draws_per_chunk`` or parameter name.
    """
    import dask
    import dask.array as da
    from dask.base import tokenize

    box = ParameterBox.of(source, parameters)
    n = check_count(n)
    method = check_method(method, n)
    draws_per_chunk = renamed_keyword("sample", "chunk_size", chunk_size, "draws_per_chunk", draws_per_chunk)
    rows = _rows_per_chunk(draws_per_chunk, keyword="draws_per_chunk")
    d = box.dimension
    name = f"diffsoup-{method}-{tokenize(box, n, seed, rows)}"
    if method == "sobol":
        chunks = (tuple(min(rows, n - s) for s in range(0, n, rows)), (d,))
        return da.map_blocks(_sobol_block, box, seed, chunks=chunks, dtype=np.float64, name=name,
                             meta=np.empty((0, 0)))  # fmt: skip
    whole = dask.delayed(_lhs_values, pure=True)(box, n, seed, dask_key_name=f"{name}-whole")
    return da.from_delayed(whole, (n, d), dtype=np.float64, name=name).rechunk((rows, d))


@dataclasses.dataclass(frozen=True)
class SaltelliDesign:
    """Saltelli's design for Sobol' indices: ``n`` draws, each ``d + 2`` rows of parameters.

    Simulate ``params`` as an ensemble (``parameter_names=design.names``), then give the ensemble
    to :func:`sobol_indices`. Rows of draw ``j`` follow each other: ``A_j``, ``B_j``, then
    ``AB_ij`` (``A_j`` with parameter ``i`` from ``B_j``) for each parameter ``i``; ``A`` and
    ``B`` are the two halves of a scrambled Sobol' sequence of dimension ``2d``.

    Attributes:
        params: the parameter values, a Dask array ``(n (d + 2), d)`` chunked by whole draws.
        names: the parameters (the columns).
        draws: ``n``.
        rows_per_chunk: rows per chunk (a multiple of ``d + 2``): give it to ``ensemble`` as
            ``draws_per_chunk`` (an ensemble's draw is one row) so that the ensemble's chunks hold
            whole Saltelli draws too (else :func:`sobol_indices` rechunks). ``chunk_size`` is its
            deprecated name.
        box: the :class:`~diffsoup.inference.ParameterBox` drawn from.
    """

    params: Any
    names: tuple[str, ...]
    draws: int
    rows_per_chunk: int
    box: ParameterBox

    @property
    def chunk_size(self) -> int:
        """Deprecated name of :attr:`rows_per_chunk`."""
        warnings.warn("SaltelliDesign.chunk_size is deprecated; read SaltelliDesign.rows_per_chunk (the same "
                      "number).", DeprecationWarning, stacklevel=2)  # fmt: skip
        return self.rows_per_chunk


def _saltelli_block(box: ParameterBox, seed: int, group: int, block_info=None):
    start, stop = block_info[None]["array-location"][0]
    return box.values(saltelli_unit(start // group, (stop - start) // group, box.dimension, seed))


def saltelli(source: Any, n: int, *, seed: int = 0, parameters: Sequence[str] | None = None,
             rows_per_chunk: int | None = None, chunk_size: int | None = None) -> SaltelliDesign:  # fmt: skip
    """Saltelli's design of ``n`` draws (``n`` a power of 2) over a study's parameter table (or
    ``Parameter`` rows, or a ``ParameterBox``), lazily, as a :class:`SaltelliDesign`.

    Args:
        rows_per_chunk: about how many rows (parameter points) per chunk, rounded to whole
            draws of ``d + 2`` rows; None reads ``diffsoup.ensemble.chunk-size``.
        chunk_size: the deprecated name of ``rows_per_chunk`` (warns).

    Raises:
        ValueError: for a bad ``n`` (not a power of 2) or parameter name.
    """
    import dask.array as da
    from dask.base import tokenize

    box = ParameterBox.of(source, parameters)
    n = check_count(n)
    check_method("sobol", n)
    d = box.dimension
    group = d + 2
    rows_per_chunk = renamed_keyword("saltelli", "chunk_size", chunk_size, "rows_per_chunk", rows_per_chunk)
    rows = _rows_per_chunk(rows_per_chunk, group)
    total = n * group
    chunks = (tuple(min(rows, total - s) for s in range(0, total, rows)), (d,))
    params = da.map_blocks(_saltelli_block, box, seed, group, chunks=chunks, dtype=np.float64,
                           name=f"diffsoup-saltelli-{tokenize(box, n, seed, rows)}", meta=np.empty((0, 0)))  # fmt: skip
    return SaltelliDesign(params, box.names, n, rows, box)


def _partial(block: np.ndarray, d: int):
    return saltelli_partial(block, d)


def sobol_indices(values: Any, design: SaltelliDesign):
    """First and total order Sobol' indices of every output of an ensemble of ``design``.

    One partial (moments of the estimators' terms) per chunk of the ensemble, merged in a tree of
    Dask tasks: the ensemble streams through, chunk by chunk, and only the partials stay.

    Args:
        values: the ensemble (an :class:`~diffsoup.distributed.Ensemble` of ``design.params``; its
            ``values`` are used) or a Dask or NumPy array whose leading axis is the design's rows
            (any trailing shape, e.g. a quantity derived from the ensemble).
        design: the :class:`SaltelliDesign` that was simulated.

    Returns:
        A Dask ``Delayed`` of :class:`~diffsoup.inference.SobolIndices` (``.compute()`` it, or
        compute it with other collections); indices have shape ``(d, *values.shape[1:])``. A
        failed simulation (NaN) makes the indices of the outputs it touches NaN.

    Raises:
        TypeError: for a ``design`` that is not a ``SaltelliDesign``.
        ValueError: for values whose leading axis is not ``draws * (d + 2)`` rows.
    """
    import dask
    import dask.array as da

    if not isinstance(design, SaltelliDesign):
        raise TypeError(f"sobol_indices: design must be a SaltelliDesign (ds.distributed.saltelli), not {design!r}.")
    arr = getattr(values, "values", values)
    if not isinstance(arr, da.Array):
        arr = da.from_array(np.asarray(arr, dtype=np.float64), chunks=(design.rows_per_chunk,) + np.shape(arr)[1:])
    d = len(design.names)
    group = d + 2
    if arr.shape[0] != design.draws * group:
        raise ValueError(
            f"sobol_indices: values have {arr.shape[0]} rows; the design has {design.draws} draws of {group} rows "
            f"= {design.draws * group}. Give the ensemble of design.params."
        )
    if any(c % group for c in arr.chunks[0][:-1]) or any(len(c) > 1 for c in arr.chunks[1:]):
        # Whole draws in every chunk (the estimators pair rows of one draw), one chunk across.
        arr = arr.rechunk({0: _rows_per_chunk(arr.chunks[0][0], group), **{i: -1 for i in range(1, arr.ndim)}})
    blocks = arr.to_delayed(optimize_graph=False).reshape(-1)
    partial = dask.delayed(_partial, pure=True)
    merge = dask.delayed(merge_partials, pure=True)
    level = [partial(b, d) for b in blocks]
    while len(level) > 1:
        level = [merge(level[i : i + SPLIT_EVERY]) for i in range(0, len(level), SPLIT_EVERY)]
    return dask.delayed(saltelli_indices, pure=True)(level[0], design.names)
