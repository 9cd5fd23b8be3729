"""Jacobian sparsity: found from the jaxpr without a dense Jacobian, colored, and exact."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

import diffsoup as ds
from diffsoup.examples import brusselator_2d, mass_action_network, rober
from diffsoup.model import SparsityPattern, color_columns


def _dense_jacobian(problem, t, y):
    p = problem.parameter_vector()
    return np.asarray(jax.jacfwd(lambda y_: problem.rhs(t, y_, p))(y))


def test_colored_jacobian_equals_jacfwd_on_brusselator():
    problem = brusselator_2d(8).build(linear_solver=ds.linear.Dense())
    assert problem.sparsity_method == "jaxpr"
    rng = np.random.default_rng(1)
    y = jnp.asarray(problem.spec.y0 + rng.uniform(0.1, 1.0, problem.n_states))
    for t in (0.5, 2.0):  # before and after the forcing switches on
        dense = _dense_jacobian(problem, t, y)
        colored = problem.jacobian(t, y).toarray()
        np.testing.assert_array_equal(colored, dense)
    # The pattern holds exactly the structural entries plus the diagonal.
    expected = (np.abs(_dense_jacobian(problem, 2.0, y)) > 0) | np.eye(problem.n_states, dtype=bool)
    np.testing.assert_array_equal(problem.pattern.to_scipy().toarray(), expected)


@pytest.mark.parametrize("n", [8, 32, 128])
def test_brusselator_needs_at_most_12_colors(n):
    problem = brusselator_2d(n).build(linear_solver=ds.linear.Dense() if n == 8 else ds.linear.KLU())
    assert problem.sparsity_method == "jaxpr"  # traced, no Jacobian evaluated
    assert problem.pattern.nnz == 2 * n * n * 6  # 5-point stencil + the u-v coupling
    assert problem.pattern.n_colors <= 12


def test_coloring_is_valid_distance_two():
    rng = np.random.default_rng(0)
    m = sp.random(300, 300, density=0.02, random_state=rng, format="csr") != 0
    colors = color_columns(m)
    m = sp.csr_matrix(m)
    for r in range(m.shape[0]):
        cols = m.indices[m.indptr[r] : m.indptr[r + 1]]
        assert len(set(colors[cols])) == len(cols), f"row {r} has two columns of one color"


def test_reaction_network_pattern_and_jacobian():
    net = mass_action_network(20, 25, seed=3)
    problem = net.to_spec().build(linear_solver=ds.linear.Dense())
    assert problem.sparsity_method == "jaxpr"
    y = jnp.linspace(0.5, 2.0, 20)
    np.testing.assert_allclose(problem.jacobian(0.0, y).toarray(), _dense_jacobian(problem, 0.0, y), rtol=1e-14)
    structural = (np.abs(_dense_jacobian(problem, 0.0, y)) > 0) | np.eye(20, dtype=bool)
    np.testing.assert_array_equal(problem.pattern.to_scipy().toarray(), structural)


def test_stack_and_indexing_rober():
    problem = rober().build()
    assert problem.sparsity_method == "jaxpr"
    expected = np.array([[1, 1, 1], [1, 1, 1], [0, 1, 1]], dtype=bool)
    np.testing.assert_array_equal(problem.pattern.to_scipy().toarray(), expected)


def test_user_pattern_overrides_detection():
    pattern = np.ones((3, 3), dtype=bool)
    problem = rober().__class__(  # same rhs, given pattern
        rober().rhs, states=3, parameters={"k1": 0.04, "k2": 3e7, "k3": 1e4}, jac_sparsity=pattern
    ).build()
    assert problem.sparsity_method == "user" and problem.pattern.nnz == 9
    with pytest.raises(ValueError, match="jac_sparsity has shape"):
        ds.ProblemSpec(rober().rhs, states=3, parameters={"k1": 1.0, "k2": 1.0, "k3": 1.0}, jac_sparsity=np.ones((2, 2)))


def test_unknown_primitive_falls_back_to_probing_with_warning():
    def rhs(t, y, p):
        # A while loop the tracer does not follow: y[i] depends on y[i-1] (plus itself).
        def body(c):
            i, acc = c
            return i + 1, acc.at[i].set(acc[i] - y[i] + 0.5 * y[i - 1] * (i > 0))

        _, out = jax.lax.while_loop(lambda c: c[0] < y.shape[0], body, (0, jnp.zeros_like(y)))
        return out

    spec = ds.ProblemSpec(rhs, states=6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        problem = spec.build(linear_solver=ds.linear.Dense())
    assert problem.sparsity_method == "probing"
    assert any("probing" in str(w.message) for w in caught)
    expected = np.eye(6, dtype=bool) | np.eye(6, k=-1, dtype=bool)
    np.testing.assert_array_equal(problem.pattern.to_scipy().toarray(), expected)


def test_pattern_fingerprint_is_content_based():
    a = SparsityPattern.from_matrix(sp.eye(5) + sp.eye(5, k=1))
    b = SparsityPattern.from_matrix(np.eye(5) + np.eye(5, k=1))
    c = SparsityPattern.from_matrix(sp.eye(5))
    assert a.fingerprint == b.fingerprint != c.fingerprint
    np.testing.assert_array_equal(a.transpose_permutation.shape, (a.nnz,))


def test_problem_fingerprint_tells_networks_apart_and_is_stable():
    a = mass_action_network(8, 10, seed=1).to_spec().build(linear_solver=ds.linear.Dense())
    a2 = mass_action_network(8, 10, seed=1).to_spec().build(linear_solver=ds.linear.Dense())
    b = mass_action_network(8, 10, seed=2).to_spec().build(linear_solver=ds.linear.Dense())
    assert a.fingerprint == a2.fingerprint != b.fingerprint


def test_pattern_detection_warns_nothing():
    # A product with a constant (here 7.89e-10 * y[0], E5's first rate) went through scipy's
    # int8 diagonal, which warned about a float64 cast on every build.
    def rhs(t, y, p):
        return jnp.stack([-7.89e-10 * y[0] - 1.1e7 * y[0] * y[2], 2.0 * y[1], y[0] * y[1] * 3.0])

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        problem = ds.ProblemSpec(rhs, states=3).build(linear_solver=ds.linear.Dense())
    assert problem.sparsity_method == "jaxpr"
    expected = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 1]], bool)
    np.testing.assert_array_equal(problem.pattern.to_scipy().toarray(), expected)


def test_many_terms_on_one_state_keep_their_dependency():
    # 256 products on y0 summed: a count of contributions kept in int8 wrapped around to 0 and
    # dropped the whole column.
    n = 300

    def rhs(t, y, p):
        return y * 0.0 + jnp.sum(jnp.full((256,), 2.0) * y[0]) + jnp.dot(jnp.full((256,), 3.0), jnp.full((256,), y[1]))

    problem = ds.ProblemSpec(rhs, states=n).build(linear_solver=ds.linear.KLU())
    assert problem.sparsity_method == "jaxpr"
    dense = problem.pattern.to_scipy().toarray()
    expected = np.eye(n, dtype=bool)
    expected[:, :2] = True
    np.testing.assert_array_equal(dense, expected)
    y = jnp.linspace(0.5, 1.5, n)
    np.testing.assert_allclose(problem.jacobian(0.0, y).toarray(), _dense_jacobian(problem, 0.0, y), rtol=1e-14)


def test_columns_sharing_256_rows_get_different_colors():
    # Columns 0 and 1 share exactly 256 rows: an int8 count of shared rows wrapped to 0, and the
    # two columns got one color (their Jacobian entries then added up).
    n = 256
    pattern = np.eye(n, dtype=bool)
    pattern[:, :2] = True
    colors = color_columns(sp.csr_matrix(pattern))
    assert colors[0] != colors[1]
