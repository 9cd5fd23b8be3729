"""E5 of the stiff Test Set with the dense LU: its elimination order, and answers against the reference.

Dense once eliminated in the states' natural order, y1 (~1.8e-3) first; its rounding errors leaked
into the conserved y2 - y3 - y4 (the states are ~1e-22 at the end), and the run ended SUCCESS with
y2 = 4.3e-26 against the reference 8.87e-23. Dense now eliminates in a minimum-degree order of the
pattern (y2, y4, y1, y3 for E5), as sparse solvers do.
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

import diffsoup as ds
from diffsoup.linear._minimum_degree import minimum_degree_order
from conftest import klu_device
from linear_helpers import prepared, solve

# The Test Set's E5 (../shared/reference/README.md): y3' = y2' - y4', computed as its code does.
A, B, C, M = 7.89e-10, 1.1e7, 1.13e3, 1e6
Y_REF = np.array([0.1152903278711829e-290, 0.8867655517642120e-22, 0.8854814626268838e-22, 0.0])


def e5_rhs(t, y, p):
    prod1 = A * y[0]
    prod2 = B * y[0] * y[2]
    prod3 = M * C * y[1] * y[2]
    prod4 = C * y[3]
    d1 = -prod1 - prod2
    d2 = prod1 - prod3
    d4 = prod2 - prod4
    d3 = d2 - d4
    return jnp.stack([d1, d2, d3, d4])


E5 = ds.ProblemSpec(e5_rhs, states=4, y0=np.array([1.76e-3, 0.0, 0.0, 0.0]), name="e5")


@pytest.fixture(scope="module")
def e5_end_states():
    """y(1e13) for each solver and rtol, atol 1.1e-24 as the Test Set's report runs E5."""
    out = {}
    for name, solver in (("Dense", ds.linear.Dense()), ("KLU", ds.linear.KLU())):
        with klu_device() if name == "KLU" else contextlib.nullcontext():
            problem = E5.build(linear_solver=solver)
            for rtol in (1e-7, 1e-10):
                sol = ds.simulate(problem, t_eval=np.array([1e13]), rtol=rtol, atol=1.1e-24, max_steps=100_000)
                assert int(sol.status) == 0, (name, rtol, sol.status)
                out[name, rtol] = np.asarray(sol.ys[-1])
    return out


@pytest.mark.parametrize("rtol", [1e-7, 1e-10])
@pytest.mark.parametrize("name", ["Dense", "KLU"])
def test_e5_end_state_matches_the_reference(e5_end_states, name, rtol):
    y = e5_end_states[name, rtol]
    np.testing.assert_allclose(y[1:3], Y_REF[1:3], rtol=0.05)
    assert abs(y[0]) < 1.1e-24 and abs(y[3]) < 1.1e-24  # ~0 at t = 1e13, within atol


@pytest.mark.parametrize("rtol", [1e-7, 1e-10])
def test_e5_dense_agrees_with_klu(e5_end_states, rtol):
    dense, klu = e5_end_states["Dense", rtol], e5_end_states["KLU", rtol]
    np.testing.assert_allclose(dense[1:3], klu[1:3], rtol=0.03)


def test_e5_elimination_order_and_its_settings():
    pattern = E5.build(linear_solver=ds.linear.Dense()).pattern
    # Degrees in A + A^T: y1 3, y2 2, y3 3, y4 2. Pass 1 eliminates y2 and y4 (both degree 2, not
    # neighbours), pass 2 y1 (degree 1, the lower index), then y3.
    np.testing.assert_array_equal(E5.build(linear_solver=ds.linear.Dense()).prepared.order, [1, 3, 0, 2])
    # The layout's fill-reducing choices both mean that order; "natural" keeps the states' order.
    for layout in (ds.Layout(reorder="amd"), ds.Layout(reorder="metis")):
        np.testing.assert_array_equal(E5.build(linear_solver=ds.linear.Dense(), layout=layout).prepared.order, [1, 3, 0, 2])
    assert E5.build(linear_solver=ds.linear.Dense(reorder="natural")).prepared.order is None
    assert ds.linear.Dense(reorder="amd").prepare(pattern, ds.Precision()).order.tolist() == [1, 3, 0, 2]
    with pytest.raises(ValueError, match=r"Dense.reorder='metis'.*'natural'"):
        ds.linear.Dense(reorder="metis")


def _tree_pattern(n, rng):
    """A random tree (each node > 0 joined to an earlier one) plus the diagonal, shuffled."""
    parent = np.array([rng.integers(0, i) for i in range(1, n)])
    rows, cols = np.r_[np.arange(1, n), parent, np.arange(n)], np.r_[parent, np.arange(1, n), np.arange(n)]
    relabel = rng.permutation(n)
    return relabel[rows], relabel[cols]


def _fill(n, rows, cols, order):
    """Entries symbolic elimination adds to ``A[order][:, order]`` (symmetric pattern)."""
    g = np.zeros((n, n), bool)
    g[rows, cols] = True
    g = g | g.T
    g = g[np.ix_(order, order)]
    np.fill_diagonal(g, False)
    added = 0
    for k in range(n):
        nb = np.flatnonzero(g[k, k + 1 :]) + k + 1
        added += int((~g[np.ix_(nb, nb)]).sum() - len(nb))  # missing off-diagonal pairs
        g[np.ix_(nb, nb)] = True
        g[nb, nb] = False
    return added


@pytest.mark.parametrize("seed", range(5))
def test_minimum_degree_order_is_a_permutation_without_fill_on_trees(seed):
    rng = np.random.default_rng(seed)
    n = 40
    rows, cols = _tree_pattern(n, rng)
    order = minimum_degree_order(n, rows, cols)
    assert sorted(order.tolist()) == list(range(n))
    # A tree always has a leaf (degree <= 1): minimum degree eliminates leaves first and adds no fill.
    assert _fill(n, rows, cols, order) == 0
    # An arrow (y0 coupled to everyone): the hub goes last, no fill; first, it fills everything.
    hub = np.r_[np.zeros(n - 1, int), np.arange(n)], np.r_[np.arange(1, n), np.arange(n)]
    arrow = minimum_degree_order(n, *hub)
    assert arrow[-1] == 0 and _fill(n, *hub, arrow) == 0
    assert _fill(n, *hub, np.arange(n)) == (n - 1) * (n - 2)


@pytest.mark.parametrize("transpose", [False, True])
def test_reordered_dense_solves_match_numpy(transpose):
    rng = np.random.default_rng(7)
    n = 30
    m = sp.random(n, n, density=0.12, random_state=rng, format="csr") + sp.diags(rng.uniform(1.0, 2.0, n))
    m = sp.csr_matrix(m)
    prep, values, dense = prepared(ds.linear.Dense(), m)
    assert prep.order is not None and sorted(prep.order.tolist()) == list(range(n))
    assert not np.array_equal(prep.order, np.arange(n))  # the test exercises a real permutation
    ref_matrix = dense.T if transpose else dense
    b = rng.standard_normal(n)
    x, info, _ = solve(prep, values, jnp.asarray(b), "fp64", transpose)
    assert bool(info.ok)
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(ref_matrix, b), rtol=1e-12, atol=1e-12)
    # several right-hand sides, and vmap over matrices against a loop
    bs = rng.standard_normal((n, 3))
    xs, _, _ = solve(prep, values, jnp.asarray(bs), "fp64", transpose)
    np.testing.assert_allclose(np.asarray(xs), np.linalg.solve(ref_matrix, bs), rtol=1e-12, atol=1e-12)
    scales = jnp.asarray(rng.uniform(0.5, 2.0, 4))
    batched = jax.vmap(lambda s: solve(prep, values * s, jnp.asarray(b), "fp64", transpose)[0])(scales)
    for i in range(4):
        np.testing.assert_allclose(np.asarray(batched[i]), np.linalg.solve(ref_matrix * float(scales[i]), b), rtol=1e-12, atol=1e-12)
