"""The terms of the negative log-likelihood that no parameter changes, summed on the host.

Per measured value, ``log_normaliser`` of its noise model, ``log s`` of a known spread and the
model's ``log_jacobian`` of the datum (``log(d ln b)`` on a logarithmic scale); a spread from a
parameter or a function adds ``log s`` in the program instead (:func:`dynamic_cells` counts those).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def term_constants(data: np.ndarray, sigma: np.ndarray | None, columns: tuple) -> np.ndarray:
    """The ``nll`` terms that no parameter changes, per experiment ``(E,)``, of data ``(E, m, k)``,
    known spreads broadcastable to it (NaN or None: not known) and a noise model per column: each
    model's ``log_normaliser`` (``0.5 log 2 pi`` normal, ``log 2`` Laplace), ``log s`` of the known
    spreads, each model's ``log_jacobian`` of its data (``log(d ln b)`` of logarithmic columns)."""
    mask = np.isfinite(data)
    count = np.sum(mask, axis=(1, 2))
    normalisers = [col.log_normaliser for col in columns]
    distinct = list(dict.fromkeys(normalisers))
    if len(distinct) == 1:
        c = distinct[0] * count
    else:
        c = 0.0
        for value in distinct:
            cols = np.array([x == value for x in normalisers])
            c = c + value * np.sum(mask & cols[None, None, :], axis=(1, 2))
    if sigma is not None:
        # The logarithm of the spreads as given (a number, a column, ...), broadcast afterwards.
        s = np.asarray(sigma, dtype=np.float64)
        known = np.isfinite(s) & (s > 0)
        log_s = np.log(np.where(known, s, 1.0))
        if s.size == 1:
            c = c + float(log_s.reshape(-1)[0]) * count
        else:
            c = c + np.sum(np.where(mask & np.broadcast_to(known, data.shape), np.broadcast_to(log_s, data.shape), 0.0),
                           axis=(1, 2))  # fmt: skip
    jacobian = np.zeros(data.shape)
    for j, col in enumerate(columns):
        measured = mask[..., j]
        jacobian[..., j] = np.where(measured, col.log_jacobian(np.where(measured, data[..., j], 1.0)), 0.0)
    c = c + np.sum(jacobian, axis=(1, 2))
    return np.asarray(c, dtype=np.float64)


def dynamic_cells(arrays: Any) -> np.ndarray:
    """Measured values per experiment whose spread comes from a parameter or a function ``(E,)``."""
    measured = np.isfinite(arrays.data)
    if arrays.sigma_name is not None:
        return np.sum(measured, axis=(1, 2))
    dynamic = np.array([f is not None for f in arrays.sigma_functions])[None, None, :]
    if arrays.sigma_names is not None:
        dynamic = dynamic | (arrays.sigma_names != "")
    if not dynamic.any():
        return np.zeros(len(arrays), dtype=np.int64)
    return np.sum(measured & dynamic, axis=(1, 2))
