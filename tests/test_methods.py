"""The integrator interface: Rosenbrock tableaus and their order conditions, Rodas5P as a method of
the interface, and implicit Euler (a Newton method with state of its own) behind it: convergence
order, a stiff system against its closed form, forward sensitivities, status codes."""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import diffsoup as ds
from diffsoup.integrate import (
    AbstractIntegrator,
    AbstractRosenbrock,
    ImplicitEuler,
    RosenbrockTableau,
)
from diffsoup.integrate._order_conditions import density, rooted_trees
from diffsoup.integrate._rodas5p import TABLEAU


# ---- rooted trees and the order conditions ----------------------------------------------------------


def test_rooted_trees_counts_and_densities():
    # OEIS A000081: 1, 1, 2, 4, 9, 20, 48 rooted trees with 1..7 vertices.
    assert [len(rooted_trees(n)) for n in range(1, 8)] == [1, 1, 2, 4, 9, 20, 48]
    for n in range(1, 8):
        tall, bushy = (), ()
        for _ in range(n - 1):
            tall = (tall,)
        bushy = ((),) * (n - 1)
        assert tall in rooted_trees(n) and bushy in rooted_trees(n)
        assert density(tall) == int(np.prod(np.arange(1, n + 1)))  # n!
        assert density(bushy) == n


def test_rodas5p_order_conditions_hold_to_order_five_and_four():
    solution, embedded, time = TABLEAU.order_residuals()
    assert len(solution) == 17 and len(embedded) == 8  # 1 + 1 + 2 + 4 + 9 trees, and to order 4
    assert max(abs(r) for r in solution.values()) < 1e-12, solution
    assert max(abs(r) for r in embedded.values()) < 1e-12, embedded
    assert time < 1e-12  # c_i = sum_j alpha_ij, d_i = sum_j gamma_ij: exact on non-autonomous problems
    # ...and no further: the solution is not of order 6, the embedded one not of order 5.
    six, five, _ = TABLEAU.order_residuals(order=6, error_order=5)
    assert max(abs(six[t]) for t in rooted_trees(6)) > 1e-4
    assert max(abs(five[t]) for t in rooted_trees(5)) > 1e-4


def test_classical_form_meets_hairer_wanner_table_7_1_to_order_four():
    # The polynomials in gamma of Hairer and Wanner's Table 7.1 (IV.7), written out independently
    # of the rooted-tree code: beta' = strictly lower part of alpha + Gamma.
    alpha, Gamma, b, _ = TABLEAU.classical()
    g = TABLEAU.gamma
    beta = alpha + np.tril(Gamma, -1)
    a, bp = alpha.sum(axis=1), beta.sum(axis=1)
    conditions = {
        "sum b = 1": (b.sum(), 1.0),
        "sum b beta' = 1/2 - g": (b @ bp, 0.5 - g),
        "sum b alpha^2 = 1/3": (b @ a**2, 1 / 3),
        "sum b beta beta' = 1/6 - g + g^2": (b @ beta @ bp, 1 / 6 - g + g**2),
        "sum b alpha^3 = 1/4": (b @ a**3, 0.25),
        "sum b alpha (alpha beta') = 1/8 - g/3": (b @ (a * (alpha @ bp)), 1 / 8 - g / 3),
        "sum b beta alpha^2 = 1/12 - g/3": (b @ beta @ a**2, 1 / 12 - g / 3),
        "sum b beta beta beta' = 1/24 - g/2 + 3g^2/2 - g^3": (b @ beta @ beta @ bp, 1 / 24 - g / 2 + 1.5 * g**2 - g**3),
    }
    for name, (value, exact) in conditions.items():
        assert abs(value - exact) < 1e-12, name
    # The classical form turned back into the W-transformed one gives the tableau's coefficients.
    Ginv = np.linalg.inv(Gamma)
    np.testing.assert_allclose(np.diag(np.full(8, 1 / g)) - Ginv, TABLEAU.C, atol=1e-9)
    np.testing.assert_allclose(alpha @ Ginv, TABLEAU.A, atol=1e-12)


def test_tableau_validation():
    kw = {f.name: getattr(TABLEAU, f.name) for f in dataclasses.fields(TABLEAU)}
    with pytest.raises(ValueError, match="strictly lower triangular"):
        RosenbrockTableau(**dict(kw, A=TABLEAU.A + np.eye(8)))
    with pytest.raises(ValueError, match="chained_from"):
        RosenbrockTableau(**dict(kw, chained_from=5))  # stage 5 is not stage 4 plus its increment
    with pytest.raises(ValueError, match=r"b has shape \(7,\)"):
        RosenbrockTableau(**dict(kw, b=TABLEAU.b[:7]))
    with pytest.raises(ValueError, match="c\\[0\\] must be 0"):
        RosenbrockTableau(**dict(kw, c=np.r_[0.1, TABLEAU.c[1:]]))
    assert not TABLEAU.A.flags.writeable  # constants stay constant


# ---- Rodas5P through the interface --------------------------------------------------------------------


def test_rodas5p_is_a_method_of_the_interface():
    m = ds.Rodas5P()
    assert isinstance(m, AbstractRosenbrock) and isinstance(m, AbstractIntegrator)
    assert m.tableau is TABLEAU and (m.order, m.error_order, m.tableau.stages) == (5, 4, 8)
    assert m == ds.Rodas5P() and hash(m) == hash(ds.Rodas5P())
    with pytest.raises(TypeError):
        AbstractIntegrator()  # abstract
    with pytest.raises(TypeError):
        AbstractRosenbrock()  # abstract: no tableau


def test_simulate_refuses_a_non_method_and_a_non_adjoint(rober_problem):
    with pytest.raises(TypeError, match="method=.*not a diffsoup integrator"):
        ds.simulate(rober_problem, t_eval=[1.0], method="rodas5p")
    with pytest.raises(TypeError, match="adjoint=.*CheckpointAdjoint"):
        ds.simulate(rober_problem, t_eval=[1.0], adjoint="forward")
    with pytest.raises(TypeError, match="controller=.*PIController"):
        ds.simulate(rober_problem, t_eval=[1.0], controller=0.1)


@dataclasses.dataclass(frozen=True)
class _UnchainedRodas5P(AbstractRosenbrock):
    """Rodas5P's coefficients with the chained stages written as plain rows of A and weights b."""

    tableau: ClassVar[RosenbrockTableau] = RosenbrockTableau(
        A=TABLEAU.A, C=TABLEAU.C, c=TABLEAU.c, d=TABLEAU.d, b=TABLEAU.b, b_error=TABLEAU.b_error,
        gamma=TABLEAU.gamma, order=5, error_order=4, chained_from=None,
    )  # fmt: skip


def test_a_tableau_without_chained_stages_gives_the_same_method(rober_problem):
    te = [1.0, 100.0, 1e4]
    kw = dict(t_eval=te, rtol=1e-8, atol=1e-12)
    a = ds.simulate(rober_problem, **kw)
    b = ds.simulate(rober_problem, method=_UnchainedRodas5P(), **kw)
    np.testing.assert_allclose(np.asarray(b.ys), np.asarray(a.ys), rtol=1e-9, atol=1e-16)
    assert abs(int(b.stats["n_steps"]) - int(a.stats["n_steps"])) <= 2  # the same method, up to rounding
    # reverse mode through the generic stage code as well
    g = lambda m: jax.grad(lambda p: jnp.sum(ds.simulate(rober_problem, params=p, method=m, **kw).ys[:, 0]))(  # noqa: E731
        rober_problem.parameter_vector()
    )
    np.testing.assert_allclose(np.asarray(g(_UnchainedRodas5P())), np.asarray(g(ds.Rodas5P())), rtol=1e-6)


def test_stages_as_a_loop_and_unrolled_agree_and_the_loop_is_the_smaller_program(rober_problem):
    loop, unrolled = ds.Rodas5P(stage_code="loop"), ds.Rodas5P(stage_code="unrolled")
    assert ds.Rodas5P().stage_code == "auto" and loop != unrolled
    with pytest.raises(ValueError, match="stage_code='fused' must be one of"):
        ds.Rodas5P(stage_code="fused")
    # "auto": unrolled for ROBER's small right-hand side, a loop for a network of 25 reactions.
    network = ds.examples.mass_action_network(20, 25, seed=3).to_spec(y0=np.ones(20)).build()
    for problem, expected in ((rober_problem, "unrolled"), (network, "loop")):
        y, p = jnp.ones(problem.n_states), problem.parameter_vector()
        assert ds.Rodas5P().resolved_stage_code(problem, jnp.zeros(()), y, p) == expected
        assert loop.resolved_stage_code(problem, jnp.zeros(()), y, p) == "loop"
    te = [1.0, 100.0, 1e4]
    kw = dict(t_eval=te, rtol=1e-8, atol=1e-12)
    a = ds.simulate(rober_problem, method=loop, **kw)
    b = ds.simulate(rober_problem, method=unrolled, **kw)
    # The same sums in the same order; XLA may fuse a multiply-add into an FMA in one program and
    # not the other, so the step sequences may part at rounding level.
    np.testing.assert_allclose(np.asarray(a.ys), np.asarray(b.ys), rtol=1e-9, atol=1e-16)
    assert abs(int(a.stats["n_steps"]) - int(b.stats["n_steps"])) <= 2
    p0 = rober_problem.parameter_vector()

    def loss(method, adjoint):
        return lambda p: jnp.sum(ds.simulate(rober_problem, params=p, method=method, adjoint=adjoint, **kw).ys[:, 1])

    for adjoint, diff in ((ds.CheckpointAdjoint(), jax.grad), (ds.ForwardMode(), jax.jacfwd)):
        np.testing.assert_allclose(np.asarray(diff(loss(loop, adjoint))(p0)),
                                   np.asarray(diff(loss(unrolled, adjoint))(p0)), rtol=1e-6)  # fmt: skip
    hvp = [jax.jvp(jax.grad(loss(m, ds.CheckpointAdjoint())), (p0,), (p0,))[1] for m in (loop, unrolled)]
    np.testing.assert_allclose(np.asarray(hvp[0]), np.asarray(hvp[1]), rtol=1e-6)

    # The loop traces the right-hand side of stages 1..7 once, the unrolled code seven times.
    traces = []

    def rhs(t, y, p):
        traces.append(1)
        return rober_problem.spec.rhs(t, y, p)

    counted = ds.ProblemSpec(rhs, states=3, parameters={"k1": 0.04, "k2": 3e7, "k3": 1e4}, y0=[1.0, 0.0, 0.0]).build()
    sizes = []
    for method in (loop, unrolled):
        traces.clear()
        jax.make_jaxpr(lambda y0: ds.simulate(counted, y0, te, method=method, adjoint=ds.ForwardMode()).ys)(  # noqa: B023
            jnp.asarray([1.0, 0.0, 0.0])
        )
        sizes.append(len(traces))
    assert sizes[1] - sizes[0] == TABLEAU.stages - 2, sizes


# ---- implicit Euler ---------------------------------------------------------------------------------------


def _forced_linear():
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    A = q @ np.diag([-1.0, -3.0, -10.0, -0.5]) @ q.T
    v = rng.standard_normal(4)
    spec = ds.ProblemSpec(lambda t, y, p: jnp.asarray(A, y.dtype) @ y + jnp.asarray(v, y.dtype) * jnp.sin(t), states=4)
    M = np.zeros((6, 6))
    M[:4, :4], M[:4, 4], M[4, 5], M[5, 4] = A, v, 1.0, -1.0
    y0 = rng.standard_normal(4)
    exact = (scipy.linalg.expm(M * 2.0) @ np.concatenate([y0, [0.0, 1.0]]))[:4]
    return spec.build(), y0, exact


def test_implicit_euler_converges_with_order_one():
    problem, y0, exact = _forced_linear()
    errors = []
    for h in [2.0**-5, 2.0**-6, 2.0**-7, 2.0**-8]:  # exact in binary: no sliver step at the end
        sol = ds.simulate(problem, y0, [2.0], method=ImplicitEuler(), controller=ds.ConstantStep(h), rtol=1e-10,
                          atol=1e-12)  # fmt: skip
        assert int(sol.stats["n_steps"]) == int(round(2.0 / h))
        # A linear problem: simplified Newton with the exact Jacobian converges in one correction
        # (the second confirms it), plus the error estimate's solve.
        assert int(sol.stats["n_solves"]) == 3 * int(sol.stats["n_steps"])
        errors.append(np.max(np.abs(np.asarray(sol.ys[-1]) - exact)))
    orders = np.log2(np.asarray(errors[:-1]) / np.asarray(errors[1:]))
    assert np.all(np.abs(orders - 1.0) < 0.05), orders


def test_implicit_euler_on_a_stiff_linear_system_matches_the_closed_form():
    # Eigenvalues -0.5, -1, -1e4, starting on the slow modes: the solution is smooth, but explicit
    # Euler would need h < 2e-4 (1e4 steps to t = 2) to stay stable.
    rng = np.random.default_rng(1)
    q, _ = np.linalg.qr(rng.standard_normal((3, 3)))
    A = q @ np.diag([-0.5, -1.0, -1e4]) @ q.T
    spec = ds.ProblemSpec(lambda t, y, p: jnp.asarray(A, y.dtype) @ y, states=3)
    y0 = q @ np.array([1.0, -2.0, 0.0])
    te = np.array([0.01, 0.5, 2.0])
    exact = np.stack([scipy.linalg.expm(A * t) @ y0 for t in te])
    sol = ds.simulate(spec.build(), y0, te, method=ImplicitEuler(), rtol=1e-6, atol=1e-9)
    assert sol.ok
    # First order: the global error is far above the tolerance per step (measured 9e-4).
    rel = np.max(np.abs(np.asarray(sol.ys) - exact) / np.abs(exact))
    assert rel < 2e-3, rel
    assert int(sol.stats["n_steps"]) < 5000
    # Tighter tolerances converge to the closed form (error per step ~ h^2, steps ~ 1/h).
    tight = ds.simulate(spec.build(), y0, te, method=ImplicitEuler(), rtol=1e-8, atol=1e-11)
    rel_tight = np.max(np.abs(np.asarray(tight.ys) - exact) / np.abs(exact))
    assert rel_tight < rel / 5, (rel, rel_tight)


def test_implicit_euler_forward_sensitivity_is_that_of_the_discrete_solution():
    # y' = -k y with steps h: y_N = y0 (1 + k h)^-N exactly, so dy_N/dk = -N h y0 (1 + k h)^(-N-1).
    spec = ds.ProblemSpec(lambda t, y, p: -p["k"] * y, states=1, parameters={"k": 3.0})
    problem = spec.build()
    h, n = 0.05, 40

    def y_end(k):
        sol = ds.simulate(problem, [2.0], [n * h], {"k": k}, method=ImplicitEuler(),
                          controller=ds.ConstantStep(h), adjoint=ds.ForwardMode(), rtol=1e-10, atol=1e-12)  # fmt: skip
        return sol.ys[-1, 0]

    k = 3.0
    np.testing.assert_allclose(float(y_end(k)), 2.0 * (1 + k * h) ** -n, rtol=1e-12)
    np.testing.assert_allclose(float(jax.jacfwd(y_end)(k)), -n * h * 2.0 * (1 + k * h) ** (-n - 1), rtol=1e-9)
    # jit and vmap: the same values
    ks = jnp.array([1.0, 3.0, 7.0])
    np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(y_end))(ks)), 2.0 * (1 + np.asarray(ks) * h) ** -n,
                               rtol=1e-12)  # fmt: skip


def test_implicit_euler_forward_sensitivities_through_newton_match_finite_differences():
    # Lotka-Volterra (nonlinear: several Newton corrections per step) with fixed steps, so that the
    # finite differences see the same discrete method; the derivative runs through the iterations.
    rhs = lambda t, y, p: jnp.stack([p["a"] * y[0] - p["b"] * y[0] * y[1], p["c"] * y[0] * y[1] - p["d"] * y[1]])  # noqa: E731
    problem = ds.ProblemSpec(rhs, states=2, parameters={"a": 1.5, "b": 1.0, "c": 1.0, "d": 3.0}).build()

    def loss(p):
        sol = ds.simulate(problem, jnp.array([1.0, 1.0]), jnp.array([2.0, 5.0]), p, method=ImplicitEuler(),
                          controller=ds.ConstantStep(2.0**-8), adjoint=ds.ForwardMode(), rtol=1e-8, atol=1e-10)  # fmt: skip
        return jnp.sum(sol.ys**2), sol.stats

    p0 = problem.parameter_vector()
    g, stats = jax.jacfwd(loss, has_aux=True)(p0)
    assert int(stats["n_solves"]) > 3 * int(stats["n_steps"])  # more than one correction per step on average
    value = jax.jit(lambda p: loss(p)[0])
    for i in range(4):
        d = np.zeros(4)
        d[i] = 1e-5 * float(p0[i])
        fd = (float(value(p0 + d)) - float(value(p0 - d))) / (2 * d[i])
        assert abs(fd - float(g[i])) <= 1e-7 * abs(float(g[i])), (i, fd, g[i])


def test_implicit_euler_with_klu_vmap_and_jacfwd_match_a_loop_and_dense():
    # The Newton loop under vmap (lanes iterate differently: a batched while loop over KLU handles)
    # and under jacfwd (tangents reuse the factorization), against a plain loop and dense LU.
    spec = ds.examples.brusselator_2d(6)
    y0 = jnp.asarray(spec.y0)
    kw = dict(t_eval=[2.0], method=ImplicitEuler(), rtol=1e-4, atol=1e-7, discontinuities=(1.1,), adjoint=ds.ForwardMode())
    klu, dense = spec.build(linear_solver=ds.linear.KLU()), spec.build(linear_solver=ds.linear.Dense())
    scales = jnp.array([0.8, 1.0, 1.3])
    batched = jax.vmap(lambda s: ds.simulate(klu, y0 * s, **kw).ys)(scales)
    for i in range(3):
        one = ds.simulate(klu, y0 * scales[i], **kw).ys
        np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(one), rtol=1e-10, atol=1e-13)
    p0 = klu.parameter_vector()
    jac = lambda pr: jax.jacfwd(lambda p: ds.simulate(pr, y0, params=p, **kw).ys[-1])(p0)  # noqa: E731
    np.testing.assert_allclose(np.asarray(jac(klu)), np.asarray(jac(dense)), rtol=1e-8, atol=1e-12)


def test_implicit_euler_newton_divergence_is_a_rejected_step():
    # y' = -y^3, y(0) = 1: y(t) = 1 / sqrt(1 + 2t). With h = 10 the simplified Newton iteration
    # from the explicit predictor (z0 = -9) diverges.
    spec = ds.ProblemSpec(lambda t, y, p: -(y**3), states=1)
    problem = spec.build()
    fixed = ds.simulate(problem, [1.0], [10.0], method=ImplicitEuler(), controller=ds.ConstantStep(10.0), throw=False)
    assert int(fixed.status) == ds.Status.STEP_TOO_SMALL  # a step that cannot shrink and does not converge
    assert int(fixed.stats["n_rejected"]) == 1 and int(fixed.stats["n_steps"]) == 0
    with pytest.raises(ds.SolveError, match="STEP_TOO_SMALL"):
        ds.simulate(problem, [1.0], [10.0], method=ImplicitEuler(), controller=ds.ConstantStep(10.0))
    # Adaptive: the same first step is rejected and retried smaller, then the solve succeeds.
    sol = ds.simulate(problem, [1.0], [10.0], method=ImplicitEuler(), h0=10.0, rtol=1e-6, atol=1e-9)
    assert int(sol.stats["n_rejected"]) >= 1
    np.testing.assert_allclose(float(sol.ys[-1, 0]), 1 / np.sqrt(21.0), rtol=1e-3)


def test_implicit_euler_status_codes_and_reverse_mode():
    blow_up = ds.ProblemSpec(lambda t, y, p: y * y, states=1).build()  # y = 1/(1 - t)
    sol = ds.simulate(blow_up, [1.0], [2.0], method=ImplicitEuler(), rtol=1e-2, throw=False)
    assert int(sol.status) == ds.Status.STEP_TOO_SMALL  # steps shrink towards t = 1 until below round-off
    sol = ds.simulate(blow_up, [1.0], [0.5], method=ImplicitEuler(), max_steps=5, throw=False)
    assert int(sol.status) == ds.Status.MAX_STEPS
    # The default adjoint runs the solve; reverse mode says what to use instead.
    decay = ds.ProblemSpec(lambda t, y, p: -p["k"] * y, states=1, parameters={"k": 1.0}).build()
    assert ds.simulate(decay, [1.0], [1.0], method=ImplicitEuler()).ok
    with pytest.raises(TypeError, match=r"ImplicitEuler has no discrete adjoint.*ForwardMode"):
        jax.grad(lambda k: ds.simulate(decay, [1.0], [1.0], {"k": k}, method=ImplicitEuler()).ys[0, 0])(1.0)


def test_implicit_euler_validation():
    with pytest.raises(ValueError, match="newton_tol"):
        ImplicitEuler(newton_tol=0.0)
    with pytest.raises(ValueError, match="max_newton_steps"):
        ImplicitEuler(max_newton_steps=0)


@dataclasses.dataclass(frozen=True)
class _UnchainedLoopedRodas5P(_UnchainedRodas5P):
    """The unchained tableau through the looped stage code (running sums forward, stacked
    increments in reverse), whose solution and error are the weighted sums of b and b_error."""

    @property
    def stage_code(self) -> str:
        return "loop"


def test_looped_stages_of_an_unchained_tableau_agree_in_value_tangents_and_gradient(rober_problem):
    te = [1.0, 100.0, 1e4]
    kw = dict(t_eval=te, rtol=1e-8, atol=1e-12)
    looped = _UnchainedLoopedRodas5P()
    p0 = rober_problem.parameter_vector()
    assert looped.resolved_stage_code(rober_problem, jnp.zeros(()), jnp.ones(3), p0) == "loop"
    a = ds.simulate(rober_problem, **kw)
    b = ds.simulate(rober_problem, method=looped, **kw)
    np.testing.assert_allclose(np.asarray(b.ys), np.asarray(a.ys), rtol=1e-9, atol=1e-16)

    def first_state(m, adjoint):
        return lambda p: jnp.sum(ds.simulate(rober_problem, params=p, method=m, adjoint=adjoint, **kw).ys[:, 0])

    reference = np.asarray(jax.grad(first_state(ds.Rodas5P(), ds.CheckpointAdjoint()))(p0))
    forward = np.asarray(jax.jacfwd(first_state(looped, ds.ForwardMode()))(p0))
    reverse = np.asarray(jax.grad(first_state(looped, ds.CheckpointAdjoint()))(p0))
    np.testing.assert_allclose(forward, reference, rtol=1e-6)
    np.testing.assert_allclose(reverse, reference, rtol=1e-6)
    np.testing.assert_allclose(forward, reverse, rtol=1e-9)  # the same discrete solution, two directions
