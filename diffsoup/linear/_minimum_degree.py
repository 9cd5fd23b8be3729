"""A symmetric elimination order of a sparsity pattern: multiple minimum degree (Liu 1985).

The order is computed once per pattern, on the host, from the pattern alone (no values), on the
graph of ``A + A^T`` without its diagonal, the graph KLU's AMD also orders. Each *pass* finds the
smallest degree ``d`` left and eliminates, in index order, every node of degree ``d`` that no
elimination of this pass has touched (it is not a neighbour of a node eliminated in the pass);
eliminating a node joins its neighbours into a clique (the fill). An untouched node keeps its
exact degree, so every pick is a true minimum degree; passes only decide ties, in favour of nodes
far from the ones just eliminated, as Liu's multiple elimination does.

Why a dense LU wants it (``ds.linear.Dense``): on a stiff, badly scaled problem the natural order
can eliminate a large state first, whose rounding errors (``eps * |y|`` per solve) then leak into
directions the error control cannot see (E5's conserved ``y2 - y3 - y4``, ~1e-22 against
``y1 ~ 1.8e-3``). A sparse elimination order keeps the states that are not coupled apart, as
sparse solvers (KLU) do anyway.

The elimination graph is held as a dense boolean matrix: ``O(n^2)`` memory, like the dense LU
that uses the order.
"""

from __future__ import annotations

import numpy as np


def minimum_degree_order(n: int, rows, cols) -> np.ndarray:
    """Multiple-minimum-degree order of the pattern with entries at ``(rows[k], cols[k])``.

    Args:
        n: the matrix size.
        rows, cols: row and column of each entry (any order; duplicates and the diagonal allowed).

    Returns:
        ``order`` (int32, a permutation of ``range(n)``): ``order[k]`` is the index eliminated
        ``k``-th, so ``P A P^T = A[order][:, order]``.
    """
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    cols = np.asarray(cols, dtype=np.int64).reshape(-1)
    if rows.shape != cols.shape:
        raise ValueError(f"minimum_degree_order: rows has {rows.size} entries, cols {cols.size}.")
    if rows.size and (min(rows.min(), cols.min()) < 0 or max(rows.max(), cols.max()) >= n):
        raise ValueError(f"minimum_degree_order: an entry lies outside the {n} x {n} matrix.")
    graph = np.zeros((n, n), dtype=bool)
    graph[rows, cols] = True
    graph |= graph.T
    np.fill_diagonal(graph, False)
    alive = np.ones(n, dtype=bool)
    degree = graph.sum(axis=1)
    order: list[int] = []
    while len(order) < n:
        smallest = degree[alive].min()
        touched = np.zeros(n, dtype=bool)
        for node in np.flatnonzero(alive & (degree == smallest)):
            if touched[node]:
                continue  # its degree changed in this pass: next pass
            neighbours = np.flatnonzero(graph[node])
            graph[np.ix_(neighbours, neighbours)] = True  # the fill: a clique of its neighbours
            graph[neighbours, neighbours] = False
            graph[node, :] = False
            graph[:, node] = False
            alive[node] = False
            touched[neighbours] = True
            order.append(int(node))
        changed = np.flatnonzero(touched & alive)
        degree[changed] = graph[changed].sum(axis=1)
    return np.asarray(order, dtype=np.int32)
