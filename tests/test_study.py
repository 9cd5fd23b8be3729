"""Experiments, studies and lowered objectives: validation naming the experiment and the field; the
objective against a likelihood computed by hand from ds.simulate and scipy.stats; adjoint gradient
vs forward-sensitivity Jacobian vs finite differences; one chunk vs many chunks vs 4 sharded CPU
devices; chunk sizing under a block limit; balance_steps."""

import functools
import json
import logging
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import diffsoup as ds
from diffsoup.inference import Gaussian, InferenceProblem, LogNormal, Parameter, SolverOptions

TRUE = {"k1": 1.0, "k2": 0.5, "k3": 0.3}


def tiny_network():
    return ds.ReactionNetwork(
        ["A", "B", "C"], [("A -> B", "k1"), ("B -> C", "k2"), ("A + C -> C + C", "k3")], dict(TRUE), name="tiny"
    )


@functools.cache
def tiny_problem():
    """The tiny network built once: compiled programs are cached per problem (it compares by
    identity), so the tests' studies of it share their programs instead of compiling them again."""
    return tiny_network().to_spec(y0=[1.0, 0.0, 0.0]).build()


def tiny_study(n=8, seed=0):
    """n experiments (3 or 4 times, one missing value, one with k3 fixed by its conditions), sigma 0.02."""
    problem = tiny_problem()
    rng = np.random.default_rng(seed)
    exps = []
    for i in range(n):
        a0 = float(rng.uniform(0.5, 2.0))
        times = np.array([0.3, 1.0, 2.5, 4.0])[: 3 + (i % 2)]
        sol = ds.simulate(problem, [a0, 0.0, 0.0], times, None, rtol=1e-10, atol=1e-12)
        data = np.asarray(sol.ys) + 0.02 * rng.standard_normal((times.size, 3))
        if i == 2:
            data[1, 0] = np.nan
        cond = {"k3": 0.3} if i == 3 else None
        exps.append(ds.Experiment(f"e{i}", times, data, noise=Gaussian(0.02), y0={"A": a0}, conditions=cond))
    params = [Parameter(k, v, v / 10, v * 10) for k, v in TRUE.items()]
    return ds.Study(problem, exps, params)


def oscillator_study():
    """16 damped oscillators; the first 4 ten times faster (about ten times the steps)."""
    spec = ds.ProblemSpec(
        lambda t, y, p: jnp.stack([y[1], -p["w"] ** 2 * y[0] - p["a"] * y[1]]),
        states=["x", "v"], parameters={"w": 1.0, "a": 0.1}, y0=[1.0, 0.0], name="oscillator",
    )  # fmt: skip
    problem = spec.build()
    times = np.linspace(1.0, 10.0, 5)
    exps = [ds.Experiment(f"o{i}", times, np.zeros((5, 2)), conditions={"w": 10.0 if i < 4 else 1.0})
            for i in range(16)]  # fmt: skip
    return ds.Study(problem, exps, [Parameter("a", 0.1, 0.01, 1.0)])


THETA = np.log10([1.2, 0.45, 0.33])


def _rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


# ---- validation ---------------------------------------------------------------------------------


def test_experiment_validation_names_experiment_and_field():
    ok = np.ones((3, 3))
    cases = [
        (dict(times=[1.0, 0.5, 2.0]), "Experiment 'x': times are out of order"),
        (dict(times=[-1.0, 0.5, 2.0]), "Experiment 'x': times must not be negative"),
        (dict(data=np.ones((2, 3))), r"Experiment 'x': data has shape \(2, 3\)"),
        (dict(data=np.full((3, 3), np.nan)), "Experiment 'x': data holds no measured value"),
        (dict(noise=Gaussian(np.nan)), "Experiment 'x': noise.sigma holds NaN"),
        (dict(noise=Gaussian(-0.1)), "Experiment 'x': noise.sigma must be positive"),
        (dict(noise=Gaussian(np.ones(2))), "Experiment 'x': noise.sigma has shape"),
        (dict(noise=LogNormal(0.1), data=-ok), "Experiment 'x': log-normal noise needs positive data"),
    ]
    for override, match in cases:
        kwargs = dict(times=[0.5, 1.0, 2.0], data=ok)
        kwargs.update(override)
        with pytest.raises(ValueError, match=match):
            ds.Experiment("x", kwargs.pop("times"), kwargs.pop("data"), **kwargs)


def test_study_validation_names_experiment_and_field():
    problem = tiny_network().to_spec(y0=[1.0, 0.0, 0.0]).build()
    params = [Parameter(k, v, v / 10, v * 10) for k, v in TRUE.items()]
    good = dict(times=[1.0, 2.0], data=np.ones((2, 3)))

    def study(**kw):
        args = {**good, **kw}
        return ds.Study(problem, [ds.Experiment("e7", args.pop("times"), args.pop("data"), **args)], params)

    with pytest.raises(ValueError, match="Experiment 'e7': parameters maps to unknown study parameter"):
        study(parameters={"k1": "kk"})
    with pytest.raises(ValueError, match="Experiment 'e7': parameters names unknown model parameter"):
        study(parameters={"kx": "k1"})
    with pytest.raises(ValueError, match="Experiment 'e7': conditions names unknown model parameter"):
        study(conditions={"kx": 1.0})
    with pytest.raises(ValueError, match=r"Experiment 'e7': data has shape \(2, 2\); .* must be \(2, 3\)"):
        study(data=np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"Experiment 'e7': data has shape \(2, 3\); .* must be \(2, 1\)"):
        study(observables=lambda y, p: y[:1])
    with pytest.raises(ValueError, match="Experiment 'e7': noise.sigma names 'sd'"):
        study(noise=Gaussian("sd"))
    with pytest.raises(ValueError, match="Experiment 'e7': y0 names unknown state"):
        study(y0={"Z": 1.0})
    with pytest.raises(ValueError, match="Experiment 'e7': groups has no member for level"):
        ds.Study(problem, [ds.Experiment("e7", [1.0], np.ones((1, 3)))], params, levels=("site",))
    with pytest.raises(ValueError, match="duplicate experiment ids"):
        ds.Study(problem, [ds.Experiment("a", [1.0], np.ones((1, 3)))] * 2, params)
    with pytest.raises(ValueError, match="Parameter 'k1': lower bound 2.0 is above the upper bound 1.0"):
        Parameter("k1", 1.5, 2.0, 1.0)
    with pytest.raises(ValueError, match="Parameter 'k1': scale='log10' needs positive values"):
        Parameter("k1", 1.0, -1.0, 2.0)
    with pytest.raises(ValueError, match="Parameter 'k1': nominal 5.0 lies outside"):
        Parameter("k1", 5.0, 0.1, 2.0)
    sigma_study = ds.Study(
        problem, [ds.Experiment("e7", [1.0], np.ones((1, 3)), noise=Gaussian("sd"))],
        params + [Parameter("sd", 0.1, 0.01, 1.0)],
    )  # fmt: skip
    with pytest.raises(ValueError, match="objective='chi2' with an estimated sigma"):
        InferenceProblem(sigma_study, objective="chi2")
    with pytest.raises(ValueError, match="unknown study parameter 'k9'"):
        InferenceProblem(sigma_study, parameters=["k9"])
    with pytest.raises(ValueError, match="hessian="):
        ds.lower(sigma_study, hessian="newton")


def test_levels_expand_parameters_per_member():
    problem = tiny_network().to_spec(y0=[1.0, 0.0, 0.0]).build()
    exps = [ds.Experiment(f"e{i}", [1.0], np.ones((1, 3)), groups={"site": f"s{i % 2}"}) for i in range(4)]
    params = [Parameter("k1", 1.0, 0.1, 10.0, level="site"), Parameter("k2", 0.5, 0.05, 5.0, level="experiment"),
              Parameter("k3", 0.3, 0.03, 3.0, estimate=False)]  # fmt: skip
    study = ds.Study(problem, exps, params, levels=("site",))
    assert study.entry_names == ("k1[s0]", "k1[s1]", "k2[e0]", "k2[e1]", "k2[e2]", "k2[e3]", "k3")
    plan = study.resolved["e3"]["plan"]
    assert plan == (("entry", 1), ("entry", 5), ("entry", 6))
    ip = InferenceProblem(study)
    assert ip.theta_names == study.entry_names[:6]
    with pytest.raises(ValueError, match="Experiment 'b': groups: member 'x' of level 'p' belongs to"):
        ds.Study(problem, [ds.Experiment("a", [1.0], np.ones((1, 3)), groups={"site": "s0", "p": "x"}),
                           ds.Experiment("b", [1.0], np.ones((1, 3)), groups={"site": "s1", "p": "x"})],
                 params[:1], levels=("site", "p"))  # fmt: skip


# ---- the objective ------------------------------------------------------------------------------


def _direct_nll(study, values, rtol=1e-6, atol=1e-9):
    """The negative log-likelihood from ds.simulate per experiment and scipy.stats, by hand."""
    problem = study.problem
    total = 0.0
    for e in study.experiments:
        p = {k: v for k, v in {**values, **e.conditions}.items() if k in problem.parameter_names}
        y0 = np.array(problem.spec.y0, float)
        y0[0] = e.y0["A"]
        ys = np.asarray(ds.simulate(problem, y0, e.times, p, rtol=rtol, atol=atol).ys)
        h = ys if e.observables is None else np.stack([np.asarray(e.observables(jnp.asarray(y), p)) for y in ys])
        m = np.isfinite(e.data)
        if isinstance(e.noise, LogNormal):
            sd = values[e.noise.sigma] if isinstance(e.noise.sigma, str) else e.noise.sigma
            total -= np.sum(stats.lognorm.logpdf(e.data[m], s=sd, scale=h[m]))
        else:
            total -= np.sum(stats.norm.logpdf(e.data[m], loc=h[m], scale=e.sigma[m]))
    return total


@pytest.fixture(scope="module")
def one_chunk():
    low = ds.lower(tiny_study(), hessian="fd")
    v, g = low.value_and_grad(THETA)
    fv, fg, H = low.gauss_newton(THETA)
    r, J = low.residuals_and_jacobian(THETA)
    return dict(low=low, value=v, grad=g, gn=H, r=r, J=J, gn_value=fv, gn_grad=fg)


def test_value_is_the_likelihood_computed_by_hand():
    study = tiny_study()
    low = ds.lower(study)
    values = dict(zip(TRUE, 10.0**THETA))
    assert _rel(low.value(THETA), _direct_nll(study, values)) < 1e-9
    chi2 = ds.lower(study, objective="chi2")
    r = np.concatenate([((np.asarray(ds.simulate(study.problem, study.resolved[e.id]["y0"], e.times,
                                                 {**values, **e.conditions}).ys) - e.data) / e.sigma).ravel()
                        for e in study.experiments])  # fmt: skip
    assert _rel(chi2.value(THETA), np.nansum(r**2)) < 1e-9


@pytest.mark.slow
def test_gradient_forward_adjoint_and_finite_differences_agree(one_chunk):
    low = one_chunk["low"]
    # value = scale * ||r||^2 + offset, and the adjoint gradient = 2 scale J^T r (forward sensitivities).
    assert _rel(one_chunk["value"], low.scale * one_chunk["r"] @ one_chunk["r"] + low.offset) < 1e-12
    assert _rel(one_chunk["gn_value"], one_chunk["value"]) < 1e-12
    assert _rel(one_chunk["grad"], 2 * low.scale * one_chunk["J"].T @ one_chunk["r"]) < 1e-6
    assert _rel(one_chunk["gn_grad"], one_chunk["grad"]) < 1e-6
    assert _rel(one_chunk["gn"], one_chunk["J"].T @ one_chunk["J"]) < 1e-12
    tight = ds.lower(tiny_study(), solver=SolverOptions(rtol=1e-11, atol=1e-13))
    g = tight.value_and_grad(THETA)[1]
    eps = 1e-5
    fd = [(tight.value(THETA + eps * e) - tight.value(THETA - eps * e)) / (2 * eps) for e in np.eye(3)]
    assert _rel(fd, g) < 1e-5
    g_adjoint = ds.lower(tiny_study(), solver=SolverOptions(rtol=1e-11, atol=1e-13), gradient="adjoint")
    assert _rel(fd, g_adjoint.value_and_grad(THETA)[1]) < 1e-5


def test_adjoint_and_forward_gradients_agree_and_auto_picks_by_the_size_of_theta(one_chunk, monkeypatch):
    from diffsoup.inference.objective import _lowered_study

    study = tiny_study()
    adjoint = ds.lower(study, gradient="adjoint")
    forward = ds.lower(study, gradient="forward")
    assert (adjoint.gradient_kind, forward.gradient_kind) == ("adjoint", "forward")
    va, ga = adjoint.value_and_grad(THETA)
    vf, gf = forward.value_and_grad(THETA)
    assert _rel(va, vf) < 1e-12 and _rel(ga, gf) < 1e-9
    assert _rel(ga, 2 * adjoint.scale * one_chunk["J"].T @ one_chunk["r"]) < 1e-6
    # Differenced Hessians run the chosen gradient program: they agree with each other and, to the
    # differencing error, with the exact Hessian (forward over the adjoint).
    fd_adjoint = ds.lower(study, gradient="adjoint", hessian="fd").hessian(THETA)
    fd_forward = ds.lower(study, gradient="forward", hessian="fd").hessian(THETA)
    assert _rel(fd_adjoint, fd_forward) < 1e-5 and _rel(fd_forward, forward.hessian(THETA)) < 1e-4
    assert forward.hessian_kind == "exact"
    assert ds.lower(study).gradient_kind == "forward"  # 3 entries of theta
    monkeypatch.setattr(_lowered_study, "FORWARD_GRADIENT_MAX_THETA", 2)
    assert ds.lower(study).gradient_kind == "adjoint"
    assert ds.lower(study).restrict([0, 1]).gradient_kind == "adjoint"
    with pytest.raises(ValueError, match="gradient='reverse' must be one of"):
        ds.lower(study, gradient="reverse")


def test_chunk_size_is_a_deprecated_name_of_experiments_per_chunk():
    """``ds.lower(chunk_size=)`` (and ``LoweredStudy(chunk_size=)``) still work, warn naming
    ``experiments_per_chunk``, and give the same chunks and values; both at once is refused."""
    study = tiny_study()
    new = ds.lower(study, experiments_per_chunk=3)
    with pytest.warns(DeprecationWarning, match="chunk_size= is deprecated; give experiments_per_chunk="):
        old = ds.lower(study, chunk_size=3)
    assert old.experiments_per_chunk == new.experiments_per_chunk == 3
    assert old.value(THETA) == new.value(THETA)
    assert old.chunk_sizes == new.chunk_sizes == {"value": [3]}
    with pytest.warns(DeprecationWarning, match="LoweredStudy: chunk_size= is deprecated"):
        assert ds.inference.LoweredStudy(new.problem, chunk_size=3).experiments_per_chunk == 3
    with pytest.raises(TypeError, match="give experiments_per_chunk= only"):
        ds.lower(study, chunk_size=3, experiments_per_chunk=3)
    with pytest.raises(ValueError, match="experiments_per_chunk=0 must be a positive integer"):
        ds.lower(study, experiments_per_chunk=0)


@pytest.mark.slow
def test_many_chunks_match_one_chunk(one_chunk):
    low = ds.lower(tiny_study(), experiments_per_chunk=3, hessian="fd")
    v, g = low.value_and_grad(THETA)
    _, _, H = low.gauss_newton(THETA)
    assert low.chunk_sizes["value_and_grad"] == [3] and low.chunk_sizes["jacobian"] == [3]
    assert _rel(v, one_chunk["value"]) < 1e-10
    assert _rel(g, one_chunk["grad"]) < 1e-10
    assert _rel(H, one_chunk["gn"]) < 1e-10
    # The fd Hessian (differences of adjoint gradients) against Gauss-Newton near a good fit.
    Hfd = low.hessian(THETA)
    assert low.hessian_kind == "fd"
    assert _rel(Hfd, one_chunk["gn"]) < 0.2


def test_lanes_in_lock_step_and_one_after_the_other_agree_and_auto_chooses_by_the_steps():
    """``lane_mode``: the lanes of a chunk in lock-step (vmap) or one after the other (map) give the
    same numbers in every mode; "auto" (on the CPU) runs them one after the other once the step
    counts of an evaluation differ so much that lock-step costs more, and stays in lock-step when
    they are alike."""
    study = oscillator_study()
    theta = np.array([-0.8])
    lowered = {mode: ds.lower(study, lane_mode=mode, hessian="exact") for mode in ("vmap", "map", "auto")}
    results = {}
    for mode, low in lowered.items():
        v, g = low.value_and_grad(theta)
        r, J = low.residuals_and_jacobian(theta)
        results[mode] = (low.value(theta), v, g, r, J, low.gauss_newton(theta)[2], low.hessian(theta))
    # On the CPU the modes agree to rounding; a GPU's lock-step kernels sum in other orders.
    tolerance = 1e-12 if jax.default_backend() == "cpu" else 1e-10
    for mode in ("map", "auto"):
        for a, b in zip(results[mode], results["vmap"]):
            assert _rel(a, b) < tolerance
    steps = lowered["vmap"].steps
    assert steps[:4].min() > 5 * steps[4:].max()  # the fast oscillators take many more steps
    auto = lowered["auto"]
    alike = ds.lower(tiny_study())
    alike.value(THETA)
    alike.gauss_newton(THETA)
    assert set(alike.lane_modes.values()) == {"vmap"}
    with pytest.raises(ValueError, match="lane_mode='serial' must be one of"):
        ds.lower(study, lane_mode="serial")
    if jax.default_backend() == "gpu":
        # On a GPU the lanes of a chunk run side by side whatever their steps.
        auto.value_and_grad(theta)
        assert set(auto.lane_modes.values()) == {"vmap"}
        return
    # The first evaluation (value_and_grad) knew no step counts yet: lock-step; the later ones not.
    assert auto.lane_modes == {("value_and_grad", 0): "vmap", ("jacobian", 0): "map", ("hessian", 0): "map",
                               ("value", 0): "map"}  # fmt: skip
    # The step counts were known before those modes' programs were first asked for: their lock-step
    # programs were never compiled.
    assert {(key.kind, key.lane_mode) for key in auto._compiled} == {
        (auto._function_kind("value_and_grad", "value_and_grad"), "vmap"), ("jacobian", "map"), ("exact", "map"),
        ("value", "map")}
    auto.value_and_grad(theta)
    assert auto.lane_modes[("value_and_grad", 0)] == "map"


def test_auto_switches_how_lanes_run_with_a_margin_before_compiling_the_other_program():
    """``lane_mode="auto"`` near its rule's boundary (step counts set by hand: one lane of ``a``
    steps, 15 of 100): a chunk keeps running as it last ran unless the other way is
    ``LANE_MODE_SWITCH_MARGIN`` cheaper by the rule, or its program is compiled already; a chunk
    whose step counts were known when its program was first asked for is compiled one after the
    other alone."""
    if jax.default_backend() != "cpu":
        pytest.skip("off the CPU, auto runs every chunk's lanes in lock-step")
    from diffsoup.inference.objective._lowering_options import LANE_MODE_SWITCH_MARGIN

    assert LANE_MODE_SWITCH_MARGIN == 1.25  # the ratios below are chosen about it
    low = ds.lower(oscillator_study())

    def steps(a):
        low.steps[:] = 100
        low.steps[0] = a

    value = low._program("value", 0)  # no step counts yet: lock-step
    assert (value.lane_mode, value.lanes) == ("vmap", 16)
    # The rule's ratio (lock-step / one after the other) for values: 16 a / (2.2 (a + 1500)).
    steps(267)  # 1.10: cheaper one after the other, but not by the margin, and not compiled: stays
    assert low._next_lane_mode(value, 0) == "vmap"
    steps(390)  # 1.50
    assert low._next_lane_mode(value, 0) == "map"
    low.lane_modes[("value", 0)] = low._variant(value, 0, low.device, "map").lane_mode
    steps(212)  # 0.90: both programs compiled, so the rule alone decides
    assert low._next_lane_mode(value, 0) == "vmap"
    # For Jacobians: 16 max(a, 100) / (1.3 (a + 1500)).
    steps(390)  # 2.54 when first asked for: compiled one after the other, and only so
    jacobian = low._program("jacobian", 0)
    assert jacobian.lane_mode == "map"
    assert {key.lane_mode for key in low._compiled if key.kind == "jacobian"} == {"map"}
    steps(118)  # 0.90: lock-step would be cheaper, not by the margin
    assert low._next_lane_mode(jacobian, 0) == "map"
    steps(100)  # 0.77, every lane alike
    assert low._next_lane_mode(jacobian, 0) == "vmap"


def test_compile_includes_the_program_with_lanes_one_after_the_other():
    """``compile()`` with ``lane_mode="auto"`` on a CPU compiles the sequential program as well: the
    evaluation that switches to it compiles nothing."""
    from diffsoup.inference.objective._lower import clear_program_cache

    clear_program_cache()  # programs of other tests would hide a compilation
    theta = np.array([-0.8])
    low = ds.lower(oscillator_study()).compile(["value"])
    # The compile logger's own records from here on, whatever its level and propagation outside.
    records: list = []
    listener = logging.Handler(logging.INFO)
    listener.emit = records.append
    logger = logging.getLogger("diffsoup.compile")
    level = logger.level
    logger.addHandler(listener)
    logger.setLevel(logging.INFO)
    try:
        low.value(theta)
        low.value(theta)
        assert low.lane_modes[("value", 0)] == ("map" if jax.default_backend() == "cpu" else "vmap")
        assert [r.getMessage() for r in records] == []
        low.value_and_grad(theta)  # not compiled beforehand: it is heard
        assert records and all("value_and_grad" in r.getMessage() for r in records)
    finally:
        logger.removeHandler(listener)
        logger.setLevel(level)


def test_small_block_limit_picks_a_smaller_chunk_that_fits():
    study = tiny_study()
    full = ds.lower(study).compile(["value"])
    whole = full.scratch_bytes["value"]
    assert full.chunk_sizes["value"] == [8]
    limit = whole - 1
    small = ds.lower(study, block_limit_bytes=limit).compile(["value"])
    (size,) = small.chunk_sizes["value"]
    assert size < 8
    prog = small._programs[("value", 0)]
    assert prog.scratch <= limit
    assert prog.compiled.memory_analysis().temp_size_in_bytes <= limit  # the program that runs
    assert _rel(small.value(THETA), full.value(THETA)) < 1e-12
    with pytest.raises(RuntimeError, match="block_limit_bytes"):
        ds.lower(study, block_limit_bytes=1).compile(["value"])


def test_estimated_sigma_lognormal_observables():
    problem = tiny_network().to_spec(y0=[1.0, 0.0, 0.0]).build()
    rng = np.random.default_rng(3)

    def total_and_c(y, p):
        return jnp.stack([y[0] + y[1], y[2] + 0.1])

    exps = []
    for i in range(4):
        data = np.exp(rng.normal(0.0, 0.1, (3, 2))) * np.array([[0.9, 0.2], [0.6, 0.5], [0.3, 0.8]])
        exps.append(ds.Experiment(f"e{i}", [0.5, 1.5, 3.0], data, observables=total_and_c,
                                  noise=LogNormal("sd"), y0={"A": 1.0 + 0.1 * i}))  # fmt: skip
    study = ds.Study(problem, exps, [Parameter(k, v, v / 10, v * 10) for k, v in TRUE.items()]
                     + [Parameter("sd", 0.15, 0.01, 1.0)])  # fmt: skip
    low = ds.lower(study)
    theta = np.append(THETA, np.log10(0.12))
    values = {**dict(zip(TRUE, 10.0**THETA)), "sd": 0.12}
    v = low.value(theta)
    assert _rel(v, _direct_nll(study, values)) < 1e-9
    r = low.residuals(theta)
    assert r.shape == (low.n_residuals,) == (4 * 3 * 2 * 2,)
    assert _rel(v, low.scale * r @ r + low.offset) < 1e-12


def test_failed_solve_is_nan_and_named():
    study = tiny_study(4)
    low = ds.lower(study, solver=SolverOptions(max_steps=12))
    assert np.isnan(low.value(THETA))
    assert set(low.last_failures) == {"e0", "e1", "e2", "e3"}
    assert all(s == ds.Status.MAX_STEPS for s in low.last_failures.values())


# ---- sharding over 4 CPU devices, balance_steps ------------------------------------------------

_SHARDED = r"""
import json, sys
sys.path.insert(0, {tests!r})
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np
import diffsoup as ds
from test_study import THETA, oscillator_study, tiny_study
assert len(jax.devices()) == 4
layout = ds.Layout(mesh=ds.global_mesh(("data",)))
low = ds.lower(tiny_study(), layout=layout)
v, g = low.value_and_grad(THETA)
_, _, H = low.gauss_newton(THETA)
out = dict(value=v, grad=g.tolist(), gn=H.tolist(), devices=sorted(set(low.placement.values())),
           chunks=low.chunk_sizes)
osc = oscillator_study()
plain = ds.lower(osc, layout=layout)
plain.value(plain.nominal)
out["loads_plain"] = plain.device_loads().tolist()
bal = ds.lower(osc, layout=ds.Layout(mesh=ds.global_mesh(("data",)), balance_steps=True))
out["loads_balanced"] = bal.device_loads().tolist()
out["value_plain"], out["value_balanced"] = plain.value(plain.nominal), bal.value(bal.nominal)
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow
def test_sharded_over_four_devices_and_balance_steps(one_chunk):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
               JAX_ENABLE_X64="1")  # fmt: skip
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    code = _SHARDED.format(tests=os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert line, f"exit {proc.returncode}\nstdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-3000:]}"
    out = json.loads(line[0][len("RESULT"):])
    assert out["devices"] == [0, 1, 2, 3]
    assert _rel(out["value"], one_chunk["value"]) < 1e-10
    assert _rel(out["grad"], one_chunk["grad"]) < 1e-10
    assert _rel(out["gn"], one_chunk["gn"]) < 1e-10
    plain, balanced = np.array(out["loads_plain"]), np.array(out["loads_balanced"])
    assert plain.max() > 2 * plain.min()  # the fast oscillators all start on device 0
    assert balanced.max() <= 1.25 * balanced.min(), balanced
    assert _rel(out["value_balanced"], out["value_plain"]) < 1e-10


@pytest.mark.slow
def test_exact_hessian_matches_differences_and_auto_falls_back(one_chunk):
    study = tiny_study()
    exact = ds.lower(study, hessian="exact")
    He = exact.hessian(THETA)
    assert exact.hessian_kind == "exact" and np.allclose(He, He.T)
    fd_low = one_chunk["low"]
    Hfd = fd_low.hessian(THETA)
    assert fd_low.hessian_kind == "fd"
    assert _rel(Hfd, He) < 1e-4
    # Under a limit the exact program exceeds but the gradient program meets, "auto" keeps the
    # chunk and takes differences of gradients.
    exact_bytes = exact.scratch_bytes["hessian"]
    grad_bytes = fd_low.scratch_bytes["value_and_grad"]
    assert grad_bytes < exact_bytes
    auto = ds.lower(study, hessian="auto", block_limit_bytes=grad_bytes)
    Ha = auto.hessian(THETA)
    assert auto.hessian_kind == "fd" and auto.chunk_sizes["hessian"] == [8]
    kinds = [row[3] for row in auto.search_log]
    if jax.default_backend() == "cpu":
        assert kinds == ["exact", "fd"]
    else:  # a GPU's search starts from a probe of its own: exact at the probe and the estimate
        assert kinds[0] == "exact" and kinds[-1] == "fd"
    assert _rel(Ha, Hfd) < 1e-12


def test_infinite_data_is_reported_as_inf_not_as_missing():
    times = [0.5, 1.0]
    with pytest.raises(ValueError, match=r"Experiment 'e7': data holds 4 non-finite value\(s\) \(Inf\), the first in "
                       r"column 0 \(observable 0\) at times\[0\]=0.5") as info:  # fmt: skip
        ds.Experiment("e7", times, np.full((2, 2), np.inf))
    assert "NaN" not in str(info.value).split(";")[0]
    with pytest.raises(ValueError, match=r"1 non-finite value\(s\) \(Inf\), the first in column 1 \(observable 1\) "
                       r"at times\[1\]=1.0 \(data\[1, 1\] = -inf\)"):  # fmt: skip
        ds.Experiment("e7", times, [[1.0, np.nan], [np.nan, -np.inf]])
    with pytest.raises(ValueError, match=r"no measured value \(all NaN\)"):
        ds.Experiment("e7", times, np.full((2, 2), np.nan))


def test_restriction_chooses_its_chunk_by_the_same_rule(monkeypatch):
    """A restriction (what a Dask worker's shard is) of a study lowered without ``experiments_per_chunk`` picks
    its chunk as the study would (on a GPU from one probe), not from the CPU search's start as if a
    chunk size were given; a given chunk size carries over."""
    study = tiny_study(n=100)
    reference = ds.lower(study, experiments_per_chunk=60).restrict(range(60)).value(THETA)
    part = ds.lower(study).restrict(range(60))
    monkeypatch.setattr(part, "platform", "gpu")
    np.testing.assert_allclose(part.value(THETA), reference, rtol=1e-12)
    assert part.search_log[0][5] == "probe" and part.chunk_sizes["value"] == [60]
    given = ds.lower(study, experiments_per_chunk=16).restrict(range(60))
    monkeypatch.setattr(given, "platform", "gpu")
    given.value(THETA)
    assert given.chunk_sizes["value"] == [15] and "probe" not in [row[5] for row in given.search_log]


def test_gpu_chunk_choice_extrapolates_from_one_probe(monkeypatch):
    """On a GPU (here: the CPU posing as one, the rule is platform logic only) the default chunk is
    the largest that fits the block limit, from one 32-lane probe and one final compile; the
    value is the same whatever the chunking."""
    study = tiny_study(n=100)
    reference = ds.lower(study, experiments_per_chunk=100).value(THETA)
    roomy = ds.lower(study)
    monkeypatch.setattr(roomy, "platform", "gpu")
    np.testing.assert_allclose(roomy.value(THETA), reference, rtol=1e-12)
    assert roomy.chunk_sizes["value"] == [100]  # everything fits: one chunk
    assert [row[2] for row in roomy.search_log] == [32, 100]  # the probe, then the chunk
    probe_scratch = roomy.search_log[0][4]
    limit = 2.5 * probe_scratch  # room for about 2.5 probes' lanes (less the fixed scratch)
    tight = ds.lower(study, block_limit_bytes=limit)
    monkeypatch.setattr(tight, "platform", "gpu")
    np.testing.assert_allclose(tight.value(THETA), reference, rtol=1e-12)
    (chunk,) = tight.chunk_sizes["value"]
    assert 32 < chunk < 100 and tight.scratch_bytes["value"] <= limit
    assert len(tight.search_log) <= 3  # the probe, the estimate, at most one correction
    # The CPU rule (and any given experiments_per_chunk) keeps the halving search from the start given.
    cpu = ds.lower(study, block_limit_bytes=limit)
    monkeypatch.setattr(cpu, "platform", "cpu")
    cpu.value(THETA)
    assert cpu.chunk_sizes["value"][0] <= chunk and cpu.search_log[0][2] == 100
