"""Lanes that finish early leave the loop (issue 42): ``ds.integrate.LaneCompaction`` regroups a
vmapped loop's unfinished lanes into a narrower loop; every lane computes what it computes in
lock-step. Checked against plain ``jax.vmap`` (the lock-step loop) at every level: the loop itself,
``ds.simulate`` with its adjoint, and ``ds.lower(lane_mode=...)`` with ``"auto"``'s choice."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffsoup as ds
from diffsoup.inference import Parameter
from diffsoup.inference.objective._lane_mode_rule import compacted_lane_steps, lane_mode_costs
from diffsoup.inference.objective._lowering_options import COMPACT_OFF_CPU_COST, SEQUENTIAL_COST_OTHERS
from diffsoup.integrate import LaneCompaction, compacting_lanes
from diffsoup.integrate._lane_compaction import lane_while_loop

jax.config.update("jax_enable_x64", True)

# 100 lanes: every tenth runs ten times the iterations (100 against 10).
ITERATIONS = np.where(np.arange(100) % 10 == 0, 100, 10).astype(np.int32)
RATES = np.linspace(0.1, 0.9, 100)


def _lane(compaction):
    def lane(n, a):
        def cond(c):
            return c[0] < n

        def body(c):  # closes over the lane's n and a (per lane under vmap)
            return c[0] + 1, c[1] * a + jnp.sin(c[1]), c[2].at[c[0] % 3].add(a)

        return lane_while_loop(cond, body, (jnp.int32(0), jnp.float64(0.5), jnp.zeros(3)), compaction)

    return lane


def _assert_equal(out, ref):
    for x, y in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_regrouped_loop_equals_lock_step_lane_by_lane():
    """Three narrower loops (25, 7 and 2 of the 100 lanes)."""
    lock_step, regrouped = _lane(None), _lane(LaneCompaction(shrink=4, levels=3, min_lanes=16))
    _assert_equal(jax.jit(jax.vmap(regrouped))(ITERATIONS, RATES), jax.jit(jax.vmap(lock_step))(ITERATIONS, RATES))
    # A closure shared by every lane (unbatched), and one lane alone (no vmap: lax.while_loop).
    shared = jax.vmap(regrouped, in_axes=(0, None))(ITERATIONS, 0.3)
    _assert_equal(shared, jax.vmap(lock_step, in_axes=(0, None))(ITERATIONS, 0.3))
    _assert_equal(regrouped(7, 0.3), lock_step(7, 0.3))
    assert int(regrouped(7, 0.3)[0]) == 7
    # Forward mode through the regrouped loop, and a vmap around the vmap.
    def tangent(f):
        return jax.jvp(lambda a: jax.vmap(f)(ITERATIONS, a)[1], (RATES,), (np.ones(100),))[1]

    def nested(f):
        return jax.vmap(lambda s: jax.vmap(f)(ITERATIONS, RATES * s))(jnp.array([1.0, 0.5]))

    np.testing.assert_array_equal(tangent(regrouped), tangent(lock_step))
    _assert_equal(nested(regrouped), nested(lock_step))


def test_the_regrouped_loop_runs_the_unfinished_lanes_in_a_narrower_loop():
    """The program holds a second loop whose body computes ceil(100 / 8) = 13 lanes, and the lane
    costs the rule counts for it: 100 lanes for 10 iterations (until at most 13 are unfinished),
    then 13 lanes for the slowest lane's other 90."""
    compaction = LaneCompaction(min_lanes=16)
    assert compaction.widths(100) == (100, 13) and compaction.widths(15) == (15,)
    assert LaneCompaction(shrink=4, levels=3).widths(100) == (100, 25, 7, 2)
    text = str(jax.make_jaxpr(jax.vmap(_lane(compaction)))(ITERATIONS, RATES))
    assert "f64[13,3]" in text and "f64[100,3]" in text
    assert "f64[13,3]" not in str(jax.make_jaxpr(jax.vmap(_lane(None)))(ITERATIONS, RATES))
    assert compacted_lane_steps(ITERATIONS, (100, 13)) == 100 * 10 + 13 * 90
    assert compacted_lane_steps(ITERATIONS, (100,)) == 100 * 100
    with pytest.raises(ValueError, match="LaneCompaction.shrink=1 must be an integer of at least 2"):
        LaneCompaction(shrink=1)


# ---- ds.simulate: the forward pass and the adjoint's sweep ---------------------------------------


def _rober_lanes(lanes: int = 80):
    """A jitted, vmapped ``(loss, (states, status, steps)), gradient in the rate scales`` of
    ``lanes`` Robertson solves, every tenth to t = 1e5 instead of 10 (about four times the steps),
    and its inputs."""
    problem = ds.examples.rober().build()
    y0, p0 = jnp.asarray(problem.spec.y0), problem.parameter_vector()

    def loss(s, te):
        sol = ds.simulate(problem, y0, jnp.stack([te / 2, te]), p0 * s, rtol=1e-8, atol=1e-10, throw=False)
        return jnp.sum(sol.ys[:, 1]) * 1e4, (sol.ys, sol.status, sol.stats["n_steps"])

    t_end = np.where(np.arange(lanes) % 10 == 0, 1e5, 1e1)
    scale = np.linspace(0.8, 1.2, lanes)
    scale[0] = np.nan  # lane 0 (a slow one) cannot start: NONFINITE_STATE
    return jax.jit(jax.vmap(jax.value_and_grad(loss, has_aux=True))), (scale, t_end)


def test_simulate_with_lanes_regrouped_equals_lock_step_and_so_does_its_adjoint_gradient():
    """The forward pass (which records the adjoint's checkpoints) and the adjoint's sweep regrouped
    give lock-step's states, statuses, step counts and gradients; a lane that cannot start keeps
    its status and leaves its neighbours as lock-step does."""
    lock_step, inputs = _rober_lanes()
    (_, (ref_ys, ref_status, ref_steps)), ref_grad = lock_step(*inputs)
    with compacting_lanes(LaneCompaction()):
        regrouped, _ = _rober_lanes()
        (_, (ys, status, steps)), grad = regrouped(*inputs)
    assert int(status[0]) == int(ds.integrate.Status.NONFINITE_STATE) and np.all(status[1:] == 0)
    assert steps[1:].max() > 3 * steps[1:].min()  # the slow tenth
    np.testing.assert_array_equal(status, ref_status)
    np.testing.assert_array_equal(steps, ref_steps)
    np.testing.assert_allclose(ys[1:], ref_ys[1:], rtol=1e-12, atol=0)
    np.testing.assert_allclose(grad[1:], ref_grad[1:], rtol=1e-10, atol=0)
    assert np.isnan(grad[0]) and np.isnan(ref_grad[0])
    # The setting is read when the solve is traced: the program traced outside the context is
    # lock-step (the narrower loop holds 10 of the 80 lanes' 3 states).
    assert "f64[10,3]" in str(jax.make_jaxpr(regrouped)(*inputs))
    assert "f64[10,3]" not in str(jax.make_jaxpr(lock_step)(*inputs))


@pytest.mark.klu
def test_a_solver_with_handles_keeps_its_lanes_in_lock_step():
    """KLU keeps numeric handles across a solve's steps: its lanes are not regrouped."""
    problem = ds.examples.rober().build(linear_solver=ds.linear.KLU())
    y0 = jnp.asarray(problem.spec.y0)

    def lane(te):
        return ds.simulate(problem, y0, jnp.stack([te]), problem.parameter_vector(), throw=False).ys

    t_end = np.where(np.arange(80) % 10 == 0, 1e5, 1e1)
    with compacting_lanes(LaneCompaction()):
        text = str(jax.make_jaxpr(jax.vmap(lane))(t_end))
    assert "f64[10,3]" not in text


# ---- ds.lower(lane_mode=...) ---------------------------------------------------------------------------


def _spread_study(n: int = 80):
    """``n`` decaying oscillators; every tenth ten times faster (about ten times the steps)."""
    spec = ds.ProblemSpec(
        lambda t, y, p: jnp.stack([y[1], -p["w"] ** 2 * y[0] - p["a"] * y[1]]),
        states=["x", "v"], parameters={"w": 1.0, "a": 0.1}, y0=[1.0, 0.0], name="spread",
    )  # fmt: skip
    times = np.linspace(1.0, 10.0, 5)
    rng = np.random.default_rng(0)
    exps = [ds.Experiment(f"o{i}", times, rng.normal(0.0, 0.1, (5, 2)),
                          conditions={"w": 10.0 if i % 10 == 0 else 1.0 + 0.01 * i}) for i in range(n)]  # fmt: skip
    return ds.Study(spec.build(), exps, [Parameter("a", 0.1, 0.01, 1.0)])


def test_lower_with_lanes_regrouped_gives_lock_steps_numbers_and_auto_chooses_it_by_the_costs():
    """Values and forward-sensitivity Jacobians (the adjoint is checked through ``ds.simulate``)."""
    study, theta = _spread_study(), np.array([-0.8])
    results = {}
    for mode in ("vmap", "compact", "auto"):
        low = ds.lower(study, lane_mode=mode, experiments_per_chunk=80)
        results[mode] = (low.value(theta), low.value(theta), *low.residuals_and_jacobian(theta))
        if mode == "auto":
            auto = low
    for mode in ("compact", "auto"):
        for a, b in zip(results[mode], results["vmap"]):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14)
    # auto's first value knew no step counts (lock-step); from the second on, lanes regrouped: on the
    # CPU it costs 80 x (the 11th most steps: until 10 lanes are unfinished) + 10 x (the slowest
    # lane's steps beyond), against 80 x (the most steps) in lock-step and 2.2 x (their sum) one
    # after the other.
    steps = auto.steps
    assert steps.max() > 4 * np.sort(steps)[-11]
    assert set(auto.lane_modes.values()) == {"compact"}
    costs = lane_mode_costs(steps, np.arange(80).reshape(1, 1, 80), "value", on_cpu=True)
    slow_first = np.sort(steps)[::-1]
    assert costs["compact"] == 80 * slow_first[10] + 10 * (slow_first[0] - slow_first[10])
    assert costs["vmap"] == 80 * slow_first[0] and costs["map"] == SEQUENTIAL_COST_OTHERS[1] * steps.sum()
    assert min(costs, key=costs.get) == "compact"
    # Off the CPU: no "map", and regrouping counted at COMPACT_OFF_CPU_COST times its lane-steps.
    off = lane_mode_costs(steps, np.arange(80).reshape(1, 1, 80), "value", on_cpu=False)
    assert set(off) == {"vmap", "compact"} and off["compact"] == COMPACT_OFF_CPU_COST * costs["compact"]
    # Lanes alike: lock-step stays.
    alike = ds.lower(_spread_study(), lane_mode="auto", experiments_per_chunk=80)
    alike.steps[:] = 50
    assert alike._next_lane_mode(alike._program("value", 0), 0) == "vmap"
