"""Order conditions of Rosenbrock methods, from rooted trees (Hairer and Wanner, IV.7).

A Rosenbrock method in its classical form,

    (I - h gamma_ii J) k_i = h f(y + sum_{j<i} alpha_ij k_j) + h J sum_{j<i} gamma_ij k_j,
    y_1 = y + sum_j b_j k_j,

has order ``p`` when ``sum_j b_j Phi_j(t) = 1 / gamma(t)`` for every rooted tree ``t`` with at
most ``p`` vertices, where ``gamma(t)`` is the tree's density and the elementary weights follow the
tree's shape: a vertex with one child contributes ``beta = alpha + Gamma`` (the Jacobian term,
``Gamma`` with its diagonal), a vertex with ``m != 1`` children the product of ``alpha`` sums (the
``m``-th derivative of ``f``):

    Phi_j(.) = 1,   Phi_j([t_1]) = sum_k beta_jk Phi_k(t_1),
    Phi_j([t_1, ..., t_m]) = prod_i sum_k alpha_jk Phi_k(t_i)   (m >= 2).

Moving the diagonal ``gamma`` to the right-hand side gives the polynomials in ``gamma`` of Hairer
and Wanner's Table 7.1 (for example ``sum b_j beta'_j = 1/2 - gamma``); this form needs no table.
There are 1, 1, 2, 4, 9, 20 trees of orders 1 to 6.
"""

from __future__ import annotations

import functools

import numpy as np

Tree = tuple  # a rooted tree: the sorted tuple of its children's trees; () is a single vertex


@functools.cache
def rooted_trees(order: int) -> tuple[Tree, ...]:
    """The rooted trees with ``order`` vertices (canonical: children sorted)."""
    if order < 1:
        raise ValueError(f"rooted_trees: order={order} must be at least 1.")
    if order == 1:
        return ((),)
    found = set()

    def forests(remaining, smallest):
        # Multisets of trees with `remaining` vertices in all, each tree >= `smallest` (so that
        # every multiset comes out once, in sorted order).
        if remaining == 0:
            yield ()
            return
        for size in range(1, remaining + 1):
            for tree in rooted_trees(size):
                key = (size, tree)
                if smallest is not None and key < smallest:
                    continue
                for rest in forests(remaining - size, key):
                    yield (tree,) + rest

    for children in forests(order - 1, None):
        found.add(tuple(sorted(children)))
    return tuple(sorted(found))


def tree_order(tree: Tree) -> int:
    return 1 + sum(tree_order(child) for child in tree)


def density(tree: Tree) -> int:
    """``gamma(t)``: the tree's order times its children's densities."""
    return tree_order(tree) * int(np.prod([density(child) for child in tree], dtype=np.int64))


def elementary_weights(tree: Tree, alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """``Phi_j(t)`` for every stage ``j`` (see the module docstring)."""
    if not tree:
        return np.ones(alpha.shape[0])
    if len(tree) == 1:
        return beta @ elementary_weights(tree[0], alpha, beta)
    out = np.ones(alpha.shape[0])
    for child in tree:
        out = out * (alpha @ elementary_weights(child, alpha, beta))
    return out


def rosenbrock_residuals(alpha, gamma, b, order: int) -> dict[Tree, float]:
    """``sum_j b_j Phi_j(t) - 1/gamma(t)`` for every tree of order ``1..order``.

    Args:
        alpha: ``(s, s)`` strictly lower triangular.
        gamma: ``(s, s)`` lower triangular, with the diagonal.
        b: ``(s,)`` weights.
    """
    alpha, gamma, b = (np.asarray(x, np.float64) for x in (alpha, gamma, b))
    beta = alpha + gamma
    return {
        tree: float(b @ elementary_weights(tree, alpha, beta) - 1.0 / density(tree))
        for n in range(1, order + 1)
        for tree in rooted_trees(n)
    }
