"""Numbers are operands, not constants, of the compiled programs: another tolerance, step budget,
first step or controller constant compiles nothing, in ``ds.simulate`` and in ``ds.lower``; results
equal those of a program compiled for the new numbers alone. Also: outputs a failed solve did not
reach are NaN, and tolerances below the compute dtype's resolution are raised with a warning."""

import contextlib
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffsoup as ds
from diffsoup.examples import rober
from diffsoup.inference import Gaussian, InferenceProblem, Parameter, SolverOptions
from diffsoup.inference.objective._lower import clear_program_cache
from diffsoup.integrate import ToleranceWarning

COMPILE = "/jax/core/compile/backend_compile_duration"
TRACE = "/jax/core/compile/jaxpr_trace_duration"


@contextlib.contextmanager
def counting():
    """Counts XLA compilations (``compiles``) and traces (``traces``) inside the block."""
    counts = {"compiles": 0, "traces": 0}

    def listener(event, duration, **kwargs):
        if event == COMPILE:
            counts["compiles"] += 1
        elif event == TRACE:
            counts["traces"] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield counts
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def test_the_counter_sees_a_compile():
    with counting() as n:
        jax.jit(lambda x: x * 3.0 + 1.0)(jnp.arange(7.0)).block_until_ready()
    assert n["compiles"] >= 1 and n["traces"] >= 1


TE = [1.0, 100.0, 1e4]


def test_simulate_with_new_numbers_compiles_nothing(rober_problem):
    p = rober_problem
    ds.simulate(p, t_eval=TE, rtol=1e-6)  # warm: this settings' program
    variants = [
        dict(rtol=1e-8), dict(rtol=1e-7, atol=[1e-10, 1e-12, 1e-10]), dict(atol=1e-11), dict(h0=1e-6),
        dict(max_steps=5000), dict(controller=ds.PIController(safety=0.8, factor_max=5.0)),
    ]  # fmt: skip
    with counting() as n:
        sols = [ds.simulate(p, t_eval=TE, **kw) for kw in variants]
    assert n["compiles"] == 0, n
    # The numbers were used: each changes the step sequence.
    steps = [int(s.stats["n_steps"]) for s in sols]
    base = int(ds.simulate(p, t_eval=TE, rtol=1e-6).stats["n_steps"])
    assert steps[0] > base and all(s != base for s in steps[:4] + steps[5:]), (steps, base)
    # Fixed steps: another h compiles nothing either.
    ds.simulate(p, t_eval=[1e-3], controller=ds.ConstantStep(2.0**-16))
    with counting() as n:
        fixed = ds.simulate(p, t_eval=[1e-3], controller=ds.ConstantStep(2.0**-15))
    assert n["compiles"] == 0 and int(fixed.stats["n_steps"]) == 2**15 // 1000 + 1


def test_simulate_jitted_over_rtol_compiles_once_and_matches_separate_programs(rober_problem):
    p = rober_problem
    solve = jax.jit(lambda rtol, atol: ds.simulate(p, t_eval=TE, rtol=rtol, atol=atol))
    with counting() as n:
        a = solve(1e-6, 1e-9)
        b = solve(1e-9, 1e-12)
    assert n["compiles"] == 1, n
    for sol, (rtol, atol) in ((a, (1e-6, 1e-9)), (b, (1e-9, 1e-12))):
        alone = jax.jit(lambda: ds.simulate(p, t_eval=TE, rtol=rtol, atol=atol))()  # noqa: B023
        assert int(sol.stats["n_steps"]) == int(alone.stats["n_steps"])
        np.testing.assert_allclose(np.asarray(sol.ys), np.asarray(alone.ys), rtol=1e-14, atol=0)
    assert int(b.stats["n_steps"]) > 2 * int(a.stats["n_steps"])


def test_gradients_at_a_new_rtol_compile_nothing(rober_problem):
    p = rober_problem

    def grad(rtol):
        return jax.grad(lambda k: jnp.sum(ds.simulate(p, t_eval=TE, params=k, rtol=rtol).ys[:, 1]))(
            p.parameter_vector()
        )

    g6 = grad(1e-6)
    with counting() as n:
        g8 = grad(1e-8)
    assert n["compiles"] == 0, n
    # The gradient at rtol 1e-8 is the more accurate one: central differences agree with it.
    k = np.asarray(p.parameter_vector())
    e = np.array([1e-6 * k[0], 0.0, 0.0])

    def f(kk):
        return float(jnp.sum(ds.simulate(p, t_eval=TE, params=kk, rtol=1e-11, atol=1e-14).ys[:, 1]))

    fd = (f(k + e) - f(k - e)) / (2 * e[0])
    assert abs(float(g8[0]) - fd) < abs(float(g6[0]) - fd) + 1e-3 * abs(fd)
    assert abs(float(g8[0]) - fd) < 1e-4 * abs(fd)


@functools.cache
def _study():
    """One study for both gradients (built once: its data come from compiled solves)."""
    problem = rober().build()
    times = np.array([1e-2, 1.0, 1e2, 1e4])
    exps = []
    for i, y0 in enumerate(([1.0, 0.0, 0.0], [0.9, 1e-5, 0.1])):
        sol = ds.simulate(problem, y0, times, rtol=1e-10, atol=1e-14)
        exps.append(ds.Experiment(f"r{i}", times, np.asarray(sol.ys) * 1.01, noise=Gaussian(0.01), y0=y0))
    params = [Parameter(k, v, v / 10, v * 10, scale="log10") for k, v in (("k1", 0.04), ("k2", 3e7), ("k3", 1e4))]
    return ds.Study(problem, exps, params)


@pytest.mark.parametrize("gradient", ["adjoint", "forward"])
def test_lowering_again_with_other_solver_options_compiles_nothing(gradient):
    study = _study()
    first = ds.lower(study, solver=SolverOptions(rtol=1e-6, atol=1e-9), gradient=gradient)
    theta = first.nominal + 0.01
    v6, g6 = first.value_and_grad(theta)
    first.residuals_and_jacobian(theta)
    first.value(theta)
    with counting() as n:
        second = ds.lower(study, solver=SolverOptions(rtol=1e-9, atol=1e-12), gradient=gradient)
        v9, g9 = second.value_and_grad(theta)
        r9, J9 = second.residuals_and_jacobian(theta)
        failing = ds.lower(study, solver=SolverOptions(rtol=1e-9, atol=1e-12, max_steps=20), gradient=gradient)
        v_fail = failing.value(theta)
    assert n["compiles"] == 0 and n["traces"] == 0, n
    assert np.isnan(v_fail) and set(failing.last_failures) == {"r0", "r1"}
    assert abs(v9 - v6) > 1e-9 * abs(v6)  # the new tolerance was used
    # The same numbers as programs compiled for rtol 1e-9 alone.
    clear_program_cache()
    with counting() as n:
        alone = ds.lower(study, solver=SolverOptions(rtol=1e-9, atol=1e-12), gradient=gradient)
        va, ga = alone.value_and_grad(theta)
        ra, Ja = alone.residuals_and_jacobian(theta)
    assert n["compiles"] >= 2
    assert va == v9
    np.testing.assert_array_equal(ga, g9)
    np.testing.assert_array_equal(ra, r9)
    np.testing.assert_array_equal(Ja, J9)
    # ... and as the solves themselves at that tolerance.
    e = study.experiments[0]
    ys = ds.simulate(study.problem, e.y0 if e.y0 is not None else study.resolved[e.id]["y0"], e.times,
                     study.problem.parameter_vector(alone.problem.parameter_values(theta)), rtol=1e-9, atol=1e-12).ys  # fmt: skip
    np.testing.assert_allclose(ra[alone.residual_slices["r0"]], ((np.asarray(ys) - e.data) / 0.01).reshape(-1),
                               rtol=1e-9, atol=1e-9)  # fmt: skip


def test_the_outputs_a_failed_solve_did_not_reach_are_nan(rober_problem):
    te = [1e-6, 1e-3, 1e2, 1e11]
    sol = ds.simulate(rober_problem, t_eval=te, max_steps=40, throw=False)
    assert int(sol.status) == ds.Status.MAX_STEPS
    ys = np.asarray(sol.ys)
    reached = np.all(np.isfinite(ys), axis=1)
    assert reached[0] and not reached[-1], ys
    assert np.all(np.isnan(ys[~reached]))
    # The reached ones are the solution there.
    ok = ds.simulate(rober_problem, t_eval=np.asarray(te)[reached])
    np.testing.assert_allclose(ys[reached], np.asarray(ok.ys), rtol=1e-12, atol=1e-15)
    # The same under vmap, forward mode and with the checkpointed adjoint's forward pass.
    both = jax.vmap(lambda y0: ds.simulate(rober_problem, y0, te, max_steps=40, throw=False).ys)(
        jnp.asarray([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    )
    np.testing.assert_array_equal(np.isnan(np.asarray(both[0])), ~reached[:, None].repeat(3, axis=1))
    fwd = ds.simulate(rober_problem, t_eval=te, max_steps=40, throw=False, adjoint=ds.ForwardMode())
    np.testing.assert_array_equal(np.asarray(fwd.ys), ys)
    # A failed solve's cotangents stay NaN (the failure is not differentiated into a number).
    g = jax.grad(lambda k: jnp.nansum(ds.simulate(rober_problem, t_eval=te, params=k, max_steps=40,
                                                  throw=False).ys))(rober_problem.parameter_vector())  # fmt: skip
    assert np.all(np.isnan(np.asarray(g)))


def test_rtol_below_float32_resolution_is_raised_with_a_warning():
    p32 = rober().build(precision=ds.Precision.fp32(), linear_solver=ds.linear.Dense())
    floor = 100 * float(np.finfo(np.float32).eps)
    with pytest.warns(ToleranceWarning, match=r"rtol=1e-10 is below what float32 computations resolve.*1\.2e-05"):
        tight = ds.simulate(p32, t_eval=[1.0, 10.0], rtol=1e-10, atol=1e-8)
    assert tight.ok
    at_floor = ds.simulate(p32, t_eval=[1.0, 10.0], rtol=floor, atol=1e-8)
    np.testing.assert_array_equal(np.asarray(tight.ys), np.asarray(at_floor.ys))
    # float64 resolves it: no warning, and the tolerance is kept.
    with warnings.catch_warnings():
        warnings.simplefilter("error", ToleranceWarning)
        s64 = ds.simulate(rober().build(), t_eval=[1.0, 10.0], rtol=1e-10, atol=1e-14)
    assert int(s64.stats["n_steps"]) > int(tight.stats["n_steps"])
    with pytest.warns(ToleranceWarning, match="rtol=1e-15 is below what float64"):
        ds.simulate(rober().build(), t_eval=[1.0], rtol=1e-15)
    # At lowering time, once, with the study's compute dtype.
    study32 = ds.Study(p32, [ds.Experiment("e", [1.0], np.ones((1, 3)), noise=Gaussian(0.1))],
                       [Parameter("k1", 0.04, 0.01, 0.1)])  # fmt: skip
    with pytest.warns(ToleranceWarning, match="InferenceProblem: rtol=1e-10") as record:
        problem = InferenceProblem(study32, solver=SolverOptions(rtol=1e-10))
    assert len([w for w in record if issubclass(w.category, ToleranceWarning)]) == 1
    assert problem.operands().rtol == np.float64(floor)
