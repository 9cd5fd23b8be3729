"""Helpers shared by the linear-solver tests: a prepared solver for a scipy matrix, and one jitted
begin / factor / solve / end cycle."""

import jax
import jax.numpy as jnp
import numpy as np

import diffsoup as ds
from diffsoup.model import SparsityPattern


def prepared(solver, matrix, precision=None):
    """``(prepared solver, values in CSR order, dense matrix)`` for a scipy sparse ``matrix``."""
    pattern = SparsityPattern.from_matrix(matrix != 0)
    values = np.asarray(matrix[pattern.rows, pattern.indices]).reshape(-1)
    return solver.prepare(pattern, precision or ds.Precision()), jnp.asarray(values), matrix.toarray()


def solve(prep, values, b, mode, transpose=False):
    """Factor ``values`` and solve once in ``mode``: ``(x, info, release token)``."""

    def run(values, b):
        ws = prep.begin(values, (mode,))
        fac = prep.factor(ws, values, (mode,))
        x, fac, info = prep.solve(fac, b, mode, transpose=transpose)
        return x, info, prep.end(ws, x)

    return jax.jit(run)(values, b)
