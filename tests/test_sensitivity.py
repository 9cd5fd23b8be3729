"""Sensitivities: forward mode (jvp/jacfwd) and the checkpointed adjoint (grad/vjp) agree with each
other and with finite differences; they reuse the forward factorizations; HVPs; transformations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffsoup as ds
from diffsoup.examples import brusselator_2d, rober
from conftest import klu_device

FWD = ds.ForwardMode()


def _rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)


# ---- ROBER: all parameters and y0 ----------------------------------------------------------------


@pytest.fixture(scope="module")
def rober_setup():
    problem = rober().build()
    te = jnp.array([1.0, 10.0, 1e3, 1e5])
    weights = jnp.array([[1.0, 1e4, 1.0], [0.5, 2e4, 1.0], [1.0, 1e4, 2.0], [2.0, 1e4, 1.0]])

    def loss(theta, adjoint):
        # theta = (log k1, log k2, log k3, y0_1, y0_2, y0_3): parameters on the log scale, as fitted.
        p = jnp.exp(theta[:3])
        sol = ds.simulate(problem, theta[3:], te, p, rtol=1e-10, atol=1e-14, adjoint=adjoint)
        return jnp.sum(weights * sol.ys)

    theta = jnp.concatenate([jnp.log(problem.parameter_vector()), jnp.array([1.0, 0.0, 0.0])])
    return loss, theta


def test_rober_forward_and_reverse_agree(rober_setup):
    loss, theta = rober_setup
    g_rev = jax.grad(loss)(theta, ds.CheckpointAdjoint(checkpoints=16))
    g_fwd = jax.jacfwd(loss)(theta, FWD)
    assert _rel(g_rev, g_fwd) < 1e-7


def test_rober_gradient_matches_central_differences(rober_setup):
    loss, theta = rober_setup
    g = np.asarray(jax.grad(loss)(theta, ds.CheckpointAdjoint()))
    rng = np.random.default_rng(0)
    value = jax.jit(lambda th: loss(th, FWD))
    # y2 lives at ~1e-5 on a 1e-8 time scale: perturb it on its own scale, or the differences
    # leave the linear regime.
    scale = np.array([1.0, 1.0, 1.0, 1.0, 1e-6, 1.0])
    for _ in range(5):
        d = rng.standard_normal(theta.shape[0]) * scale
        d /= np.linalg.norm(d)
        eps = 1e-3  # theta is O(1) (log-parameters, states): truncation ~eps^2, noise ~rtol/eps
        fd = (float(value(theta + eps * d)) - float(value(theta - eps * d))) / (2 * eps)
        assert abs(fd - g @ d) <= 1e-5 * max(abs(fd), np.max(np.abs(g)) * 1e-3), (fd, g @ d)


@pytest.mark.klu
def test_jacfwd_reuses_the_primal_factorizations():
    problem = brusselator_2d(6).build(linear_solver=ds.linear.KLU())
    y0 = jnp.asarray(problem.spec.y0)

    def run(p):
        sol = ds.simulate(problem, y0, [2.0], p, rtol=1e-6, adjoint=FWD, discontinuities=(1.1,))
        return sol.ys, sol.stats

    p = problem.parameter_vector()
    jac, stats = jax.jacfwd(run, has_aux=True)(p)
    _, primal_stats = run(p)
    assert int(stats["n_factor"]) == int(primal_stats["n_factor"])

    def refactors(jaxpr):
        found = []
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "diffsoup_klu_refactor":
                found.append(eqn.invars[2].aval.shape)
            for sub in jax.core.subjaxprs(eqn) if hasattr(jax.core, "subjaxprs") else _subjaxprs(eqn):
                found += refactors(sub)
        return found

    primal = refactors(jax.make_jaxpr(lambda p: run(p)[0])(p).jaxpr)
    tangent = refactors(jax.make_jaxpr(jax.jacfwd(lambda p: run(p)[0]))(p).jaxpr)
    assert len(tangent) == len(primal)  # no factorization per parameter...
    assert all(shape[0] == 1 for shape in tangent)  # ...and none batched over the 3 tangents


def _subjaxprs(eqn):
    for value in eqn.params.values():
        items = value if isinstance(value, (tuple, list)) else (value,)
        for item in items:
            if hasattr(item, "jaxpr") and hasattr(item.jaxpr, "eqns"):
                yield item.jaxpr
            elif hasattr(item, "eqns"):
                yield item


# ---- Brusselator N = 16 ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def brusselator_setup():
    spec = brusselator_2d(16)
    te = jnp.array([1.5, 3.0])
    w = jnp.asarray(np.random.default_rng(3).uniform(0.5, 1.5, (2, spec.n_states)))

    def make_loss(problem):
        def loss(p, y0, adjoint=ds.CheckpointAdjoint()):
            sol = ds.simulate(problem, y0, te, p, rtol=1e-10, atol=1e-10, adjoint=adjoint, discontinuities=(1.1,))
            return jnp.sum(w * sol.ys)

        return loss

    with klu_device():
        problem = spec.build(linear_solver=ds.linear.KLU())
    return spec, make_loss, problem, problem.parameter_vector(), jnp.asarray(spec.y0)


@pytest.mark.klu
def test_brusselator_forward_reverse_and_finite_differences(brusselator_setup):
    _, make_loss, problem, p, y0 = brusselator_setup
    loss = make_loss(problem)
    gp, gy = jax.grad(loss, argnums=(0, 1))(p, y0)
    assert _rel(gp, jax.jacfwd(loss)(p, y0, FWD)) < 1e-7
    rng = np.random.default_rng(1)
    value = jax.jit(lambda p, y0: loss(p, y0, FWD))
    for _ in range(5):
        dp = rng.standard_normal(3) * np.asarray(p)  # relative directions for A, B, alpha
        dy = rng.standard_normal(y0.shape[0]) * (1 + np.abs(np.asarray(y0)))
        _, jvp = jax.jvp(lambda p, y0: loss(p, y0, FWD), (p, y0), (jnp.asarray(dp), jnp.asarray(dy)))
        rev = float(gp @ dp + gy @ dy)
        assert abs(float(jvp) - rev) <= 1e-7 * abs(rev)
        eps = 1e-4
        fd = (float(value(p + eps * dp, y0 + eps * dy)) - float(value(p - eps * dp, y0 - eps * dy))) / (2 * eps)
        assert abs(fd - rev) <= 1e-5 * abs(rev), (fd, rev)


@pytest.mark.klu
def test_fp32_ir_gradients_match_fp64(brusselator_setup):
    spec, make_loss, problem, p, y0 = brusselator_setup
    g64 = jax.grad(make_loss(problem), argnums=(0, 1))(p, y0)
    mixed = spec.build(linear_solver=ds.linear.KLU(), precision=ds.Precision.fp32_ir())
    g32 = jax.grad(make_loss(mixed), argnums=(0, 1))(p, y0)
    assert _rel(g32[0], g64[0]) < 1e-6 and _rel(g32[1], g64[1]) < 1e-6


def test_hessian_vector_product_matches_differences_of_gradients():
    problem = rober().build()
    te = jnp.array([1.0, 40.0])

    def loss(theta):
        sol = ds.simulate(problem, theta[3:], te, jnp.exp(theta[:3]), rtol=1e-9, atol=1e-13,
                          adjoint=ds.CheckpointAdjoint(checkpoints=8))  # fmt: skip
        return jnp.sum(sol.ys[:, 0] ** 2) + 1e8 * jnp.sum(sol.ys[:, 1] ** 2)

    theta = jnp.concatenate([jnp.log(problem.parameter_vector()), jnp.array([1.0, 0.0, 0.0])])
    grad = jax.jit(jax.grad(loss))
    v = jnp.asarray(np.random.default_rng(2).standard_normal(6) * np.array([1, 1, 1, 1, 1e-6, 1]))
    _, hvp = jax.jvp(grad, (theta,), (v,))  # forward over reverse
    eps = 1e-4
    fd = (grad(theta + eps * v) - grad(theta - eps * v)) / (2 * eps)
    assert _rel(hvp, fd) < 1e-4


# ---- transformations and checkpoints ----------------------------------------------------------------


def test_checkpoints_jit_and_vmap_give_the_same_gradient(rober_setup):
    loss, theta = rober_setup
    ref = jax.grad(loss)(theta, ds.CheckpointAdjoint(checkpoints=32))
    for c in (1, 4):
        assert _rel(jax.grad(loss)(theta, ds.CheckpointAdjoint(checkpoints=c)), ref) < 1e-12
    grad4 = jax.jit(jax.grad(lambda th: loss(th, ds.CheckpointAdjoint(checkpoints=4))))
    assert _rel(grad4(theta), ref) < 1e-12
    shifts = jnp.array([[0.0] * 6, [0.1, -0.2, 0.05, 0, 0, 0], [-0.3, 0.1, 0.2, 0, 0, 0]])
    batched = jax.vmap(jax.grad(lambda th: loss(th, ds.CheckpointAdjoint(checkpoints=4))))(theta[None, :] + shifts)
    for i in range(3):  # vmap against a loop of the jitted gradient (one program for the three points)
        assert _rel(batched[i], grad4(theta + shifts[i])) < 1e-10


@pytest.mark.klu
def test_reverse_memory_does_not_grow_with_max_steps():
    problem = brusselator_2d(8).build(linear_solver=ds.linear.KLU())
    y0 = jnp.asarray(problem.spec.y0)

    def scratch(max_steps):
        def loss(p):
            sol = ds.simulate(problem, y0, [2.0], p, rtol=1e-6, max_steps=max_steps, discontinuities=(1.1,),
                              adjoint=ds.CheckpointAdjoint(checkpoints=16))  # fmt: skip
            return jnp.sum(sol.ys)

        compiled = jax.jit(jax.grad(loss)).lower(problem.parameter_vector()).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    small, large = scratch(1_000), scratch(1_000_000)
    assert large == small, (small, large)


def test_failed_forward_solve_gives_nan_gradients():
    spec = ds.ProblemSpec(lambda t, y, p: p["a"] * y * y, states=1, parameters={"a": 1.0})
    problem = spec.build()

    def loss(a):
        sol = ds.simulate(problem, jnp.array([1.0]), [2.0], {"a": a}, throw=False)  # blows up at t = 1/a
        return jnp.sum(sol.ys), sol.status

    (value, status), g = jax.value_and_grad(loss, has_aux=True)(1.0)
    assert int(status) != 0 and np.isnan(float(g))
