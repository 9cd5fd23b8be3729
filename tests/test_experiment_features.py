"""Experiment features: noise models (normal/Laplace, lin/log/log10; per column, per cell, spread
functions), observables of time and observable parameters, initial states of parameters,
pre-equilibration, steady-state times, resets and discontinuities.

Independent facts: the negative log-likelihood against ``petab.v1.calculate_llh`` on closed-form
simulations of ``A -> B`` (``A = a0 exp(-k t)``); the value's identity with the residuals; adjoint
vs forward gradients vs central differences; the Gauss-Newton Jacobian vs differences of
residuals; a pre-equilibrated study against scipy's ``solve_ivp`` at rtol 1e-12 and a hand-written
likelihood."""

import contextlib
import math

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

import diffsoup as ds
from diffsoup.inference import (
    Gaussian,
    InferenceProblem,
    Laplace,
    LogLaplace,
    LogNormal,
    Parameter,
    Preequilibration,
    SolverOptions,
)

TIGHT = SolverOptions(rtol=1e-11, atol=1e-13, max_steps=4000)


def decay_problem():
    """``A -> B`` at rate ``k``; ``a0`` is a model parameter the right-hand side does not use (for
    initial states as functions of the parameters)."""
    spec = ds.ProblemSpec(
        lambda t, y, p: jnp.stack([-p["k"] * y[0], p["k"] * y[0]]),
        states=["A", "B"], parameters={"k": 0.7, "a0": 2.0}, y0=[1.0, 0.0], name="decay",
    )  # fmt: skip
    return spec.build()


def decay(t, k, a0):
    """The closed form of ``decay_problem`` from ``(a0, 0)`` at ``t = 0``."""
    t = np.asarray(t, dtype=np.float64)
    a = a0 * np.exp(-k * t)
    return np.stack([a, a0 - a], axis=-1)


def _rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def _central(f, x, h=1e-6):
    """Central differences (truncation O(h^2), below 1e-10 relative here; rounding ~1e-10)."""
    cols = []
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = h
        cols.append((np.asarray(f(x + e)) - np.asarray(f(x - e))) / (2 * h))
    return np.stack(cols, axis=-1)


# ---- a study with every noise model, per-cell and functional spreads ---------------------------

TIMES = np.array([0.2, 0.5, 1.0, 2.0, 3.5])
NOMINAL = {"k": 0.7, "a0": 2.0, "s": 1.5, "sd_a": 0.2, "sd_b": 0.15, "lsd": 0.3}

COLUMNS = [  # (noise model class, petab distribution, petab transformation)
    (Gaussian, "normal", "lin"),
    (lambda s: LogNormal(s), "normal", "log"),
    (lambda s: LogNormal(s, base=10), "normal", "log10"),
    (Laplace, "laplace", "lin"),
    (lambda s: LogLaplace(s), "laplace", "log"),
    (lambda s: LogLaplace(s, base=10.0), "laplace", "log10"),
]


def six_observables(y, p):
    """Six positive observables of the states, with the observable parameters ``scale``, ``offset``."""
    a, b = y[0], y[1]
    return jnp.stack([p["scale"] * a + p["offset"], b + 0.1, a + b, a, p["scale"] * b + 0.05, a * a])


def six_values(sim, scale, offset):
    a, b = sim[:, 0], sim[:, 1]
    return np.stack([scale * a + offset, b + 0.1, a + b, a, scale * b + 0.05, a * a], axis=1)


def damped(t, y, p):
    """Observables that see time: ``A e^{-t/10}`` and ``B`` times the observable parameter ``gain``."""
    return jnp.stack([y[0] * jnp.exp(-0.1 * t), p["gain"] * y[1]])


def damped_values(times, sim, gain):
    return np.stack([sim[:, 0] * np.exp(-0.1 * times), gain * sim[:, 1]], axis=1)


def sigma_of_b(t, h, p):
    """A spread function (noise model of column 1): ``noise_b + 0.1 h_1``."""
    return p["noise_b"] + 0.1 * h[1]


def sigma_of_time(t, h, p):
    """A spread function of time for both columns: ``lsd (1 + t / 10)``."""
    return jnp.full((2,), p["lsd"] * (1.0 + 0.1 * t))


def noise_study(data_seed=0):
    """Two experiments: ``six`` (one noise model per column, spreads of numbers, names and a
    function; observable parameters ``scale`` (estimated, one per experiment) and ``offset`` (a
    number); estimated initial amount ``a0``) and ``damped`` (observables of time, a log10
    normal model with a spread function of time, ``y0(p)`` of the model parameter ``a0``)."""
    problem = decay_problem()
    rng = np.random.default_rng(data_seed)
    sim = decay(TIMES, NOMINAL["k"], NOMINAL["a0"])
    h6 = six_values(sim, NOMINAL["s"], 0.1)
    data6 = h6 * np.exp(0.1 * rng.standard_normal(h6.shape))
    data6[1, 2] = np.nan
    # Column spreads: numbers and names per cell; column 1 a function; Laplace/log columns numbers.
    spread_a = np.array(["sd_a", 0.25, "sd_a", 0.3, "sd_a"], dtype=object)
    spreads = [spread_a, sigma_of_b, 0.2, np.array([0.1, 0.2, 0.3, 0.2, 0.1]), "lsd", 0.15]
    noise = [make(s) for (make, _, _), s in zip(COLUMNS, spreads)]
    six = ds.Experiment("six", TIMES, data6, observables=six_observables, noise=noise, y0={"A": "a0"},
                        observable_parameters={"scale": "s", "offset": 0.1, "noise_b": "sd_b"})  # fmt: skip
    sim2 = decay(TIMES, NOMINAL["k"], 0.72)
    h2 = damped_values(TIMES, sim2, 0.8)
    data2 = h2 * np.exp(0.1 * rng.standard_normal(h2.shape))
    damped_exp = ds.Experiment("damped", TIMES, data2, observables=damped, noise=LogNormal(sigma_of_time, base=10),
                               y0=lambda p: jnp.stack([0.6 * p["a0"], 0.0 * p["a0"]]), conditions={"a0": 1.2},
                               observable_parameters={"gain": 0.8, "lsd": "lsd"})  # fmt: skip
    params = [
        Parameter("k", NOMINAL["k"], 0.1, 5.0),
        Parameter("a0", NOMINAL["a0"], 0.5, 5.0),
        Parameter("s", NOMINAL["s"], 0.5, 5.0, level="experiment"),
        Parameter("sd_a", NOMINAL["sd_a"], 0.01, 1.0),
        Parameter("sd_b", NOMINAL["sd_b"], 0.01, 1.0),
        Parameter("lsd", NOMINAL["lsd"], 0.01, 1.0),
    ]
    return ds.Study(problem, [six, damped_exp], params)


def petab_llh(study):
    """``petab.v1.calculate_llh`` of the study at the nominal values, on closed-form simulations."""
    petab_calc = pytest.importorskip("petab.v1.calculate")
    six, dmp = study.experiments
    obs_rows, meas_rows, sim_rows = [], [], []
    sim6 = six_values(decay(TIMES, NOMINAL["k"], NOMINAL["a0"]), NOMINAL["s"], 0.1)
    for j, (_, dist, trafo) in enumerate(COLUMNS):
        oid = f"six_{j}"
        formula = f"noiseParameter1_{oid}" + (f" + 0.1 * {oid}" if j == 1 else "")
        obs_rows.append(dict(observableId=oid, observableFormula="0", noiseFormula=formula,
                             observableTransformation=trafo, noiseDistribution=dist))  # fmt: skip
        for i, t in enumerate(TIMES):
            if not np.isfinite(six.data[i, j]):
                continue
            spread = {0: six.noise_columns[0].spread[i], 1: "sd_b", 4: "lsd"}.get(j)
            if spread is None:
                spread = float(np.broadcast_to(six.noise_columns[j].spread, TIMES.shape)[i])
            row = dict(observableId=oid, simulationConditionId="c6", time=t, noiseParameters=spread)
            meas_rows.append(dict(row, measurement=six.data[i, j]))
            sim_rows.append(dict(row, simulation=sim6[i, j]))
    sim2 = damped_values(TIMES, decay(TIMES, NOMINAL["k"], 0.72), 0.8)
    for j in range(2):
        oid = f"damped_{j}"
        obs_rows.append(dict(observableId=oid, observableFormula="0", noiseFormula=f"noiseParameter1_{oid}",
                             observableTransformation="log10", noiseDistribution="normal"))  # fmt: skip
        for i, t in enumerate(TIMES):
            row = dict(observableId=oid, simulationConditionId="c2", time=t,
                       noiseParameters=NOMINAL["lsd"] * (1 + 0.1 * t))  # fmt: skip
            meas_rows.append(dict(row, measurement=dmp.data[i, j]))
            sim_rows.append(dict(row, simulation=sim2[i, j]))
    observables = pd.DataFrame(obs_rows).set_index("observableId")
    parameters = pd.DataFrame([dict(parameterId=k, nominalValue=v) for k, v in NOMINAL.items()]).set_index("parameterId")
    return petab_calc.calculate_llh(pd.DataFrame(meas_rows), pd.DataFrame(sim_rows), observables, parameters)


@pytest.fixture(scope="module")
def noise_lowered():
    study = noise_study()
    problem = InferenceProblem(study, solver=TIGHT)
    return study, problem, ds.lower(problem, gradient="forward"), ds.lower(problem, gradient="adjoint")


def test_noise_models_match_petab_calculate_llh(noise_lowered):
    study, problem, low, _ = noise_lowered
    assert len(problem.groups) == 2
    value = low.value(problem.nominal)
    assert abs(value + petab_llh(study)) <= 1e-9 * abs(value), (value, petab_llh(study))


def test_noise_value_residual_identity_and_derivatives(noise_lowered):
    _, problem, fwd, adj = noise_lowered
    assert problem.theta_names == ("k", "a0", "s[six]", "s[damped]", "sd_a", "sd_b", "lsd")
    theta = problem.nominal + np.array([0.02, -0.03, 0.05, 0.0, 0.04, -0.02, 0.03])
    v, g = fwd.value_and_grad(theta)
    va, ga = adj.value_and_grad(theta)
    r, J = fwd.residuals_and_jacobian(theta)
    assert abs(fwd.scale * float(r @ r) + fwd.offset - v) <= 1e-11 * abs(v)
    assert abs(va - v) <= 1e-12 * abs(v)
    assert _rel(ga, g) <= 1e-8
    fd = _central(fwd.value, theta)
    assert _rel(g, fd) <= 1e-6, (g, fd)
    assert g[3] == 0.0  # s[damped]: the damped experiment does not use s
    Jfd = _central(fwd.residuals, theta)
    assert _rel(J, Jfd) <= 1e-6
    # Gauss-Newton sums agree with the residuals and Jacobian.
    value, jtr, jtj = fwd.gauss_newton(theta)
    assert abs(value - v) <= 1e-11 * abs(v)
    np.testing.assert_allclose(jtj, 2 * fwd.scale * J.T @ J, rtol=1e-10, atol=1e-12)


def test_predictions_see_observable_parameters(noise_lowered):
    study, problem, _, _ = noise_lowered
    pred = problem.predict(problem.nominal, points=4)
    sim = decay(TIMES, NOMINAL["k"], NOMINAL["a0"])
    np.testing.assert_allclose(pred["six"]["observables"], six_values(sim, NOMINAL["s"], 0.1), rtol=1e-8)
    np.testing.assert_allclose(pred["damped"]["observables"],
                               damped_values(TIMES, decay(TIMES, NOMINAL["k"], 0.72), 0.8), rtol=1e-8)  # fmt: skip
    curve_t = pred["damped"]["curve_times"]
    np.testing.assert_allclose(pred["damped"]["curve"],
                               damped_values(curve_t, decay(curve_t, NOMINAL["k"], 0.72), 0.8), rtol=1e-8, atol=1e-12)  # fmt: skip


def test_single_named_sigma_keeps_its_group_and_numbers_compile_nothing():
    """Experiments that differ only by numbers (spreads, observable parameter values, initial
    amounts) share one group; a name where another has a number makes a second group."""
    problem = decay_problem()
    params = [Parameter("k", 0.7, 0.1, 5.0), Parameter("sd", 0.1, 0.01, 1.0)]

    def exp(i, sigma, offset, a0):
        data = decay(TIMES, 0.7, 1.0)[:, :1] + 0.1
        return ds.Experiment(f"e{i}", TIMES, data, observables=lambda y, p: y[:1] + p["off"], y0={"A": a0},
                             noise=Laplace(sigma), observable_parameters={"off": offset})  # fmt: skip

    obs = lambda y, p: y[:1] + p["off"]  # noqa: E731 (one function object for all)
    exps = [exp(0, 0.1, 0.1, 1.0), exp(1, np.linspace(0.1, 0.2, 5)[:, None], 0.2, 1.5), exp(2, "sd", 0.1, 1.0)]
    for e in exps:
        e.observables = obs
    study = ds.Study(problem, exps, params)
    ip = InferenceProblem(study, ["k", "sd"])
    assert [g.members for g in ip.groups] == [(0, 1), (2,)]
    theta = ip.nominal[:1]
    first = ds.lower(study, parameters=["k"]).value(theta)
    with counting() as n:  # the fixed sd is a number of the program, not a constant
        again = ds.lower(study, parameters=["k"], values={"sd": 0.2}).value(theta)
    assert n["compiles"] == 0, n
    assert again != first


@contextlib.contextmanager
def counting():
    """Counts XLA compilations inside the block."""
    counts = {"compiles": 0}

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            counts["compiles"] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield counts
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


# ---- initial states of parameters --------------------------------------------------------------


def test_initial_state_callable_and_estimated_amounts_gradients():
    """``y0(p)`` of a model parameter and ``y0={"A": "a0"}`` give the same value and gradient."""
    problem = decay_problem()
    data = decay(TIMES, 0.7, 2.0) * 1.05
    params = [Parameter("k", 0.7, 0.1, 5.0), Parameter("a0", 2.0, 0.5, 5.0)]
    named = ds.Study(problem, [ds.Experiment("e", TIMES, data, noise=Gaussian(0.1), y0={"A": "a0"})], params)
    by_fn = ds.Study(problem, [ds.Experiment("e", TIMES, data, noise=Gaussian(0.1),
                                             y0=lambda p: jnp.stack([p["a0"], 0.0 * p["a0"]]))], params)  # fmt: skip
    theta = np.log10([0.8, 1.7])
    out = []
    for study in (named, by_fn):
        low = ds.lower(study, solver=TIGHT, gradient="adjoint")
        out.append(low.value_and_grad(theta))
        assert low.problem.groups[0].y0_entries == (study is named)
    (v1, g1), (v2, g2) = out
    sim = decay(TIMES, 0.8, 1.7)
    r = (sim - data) / 0.1
    expected = 0.5 * np.sum(r * r) + data.size * (math.log(0.1) + 0.5 * math.log(2 * math.pi))
    assert abs(v1 - expected) <= 1e-9 * abs(expected)
    assert abs(v2 - v1) <= 1e-12 * abs(v1)
    assert _rel(g2, g1) <= 1e-10
    fd = _central(lambda th: ds.lower(named, solver=TIGHT).value(th), theta)
    assert _rel(g1, fd) <= 1e-6


# ---- validation --------------------------------------------------------------------------------


def test_feature_validation_names_the_field():
    problem = decay_problem()
    params = [Parameter("k", 0.7, 0.1, 5.0), Parameter("sd", 0.1, 0.01, 1.0)]
    ok = np.ones((3, 2))

    def experiment(**kw):
        return ds.Experiment("x", kw.pop("times", [0.5, 1.0, 2.0]), kw.pop("data", ok), **kw)

    with pytest.raises(ValueError, match="Experiment 'x': noise gives 3 models for 2 observable column"):
        experiment(noise=[Gaussian(0.1)] * 3)
    with pytest.raises(ValueError, match=r"Experiment 'x': noise\[1\].scale must be positive"):
        experiment(noise=[Gaussian(0.1), Laplace(-1.0)])
    with pytest.raises(ValueError, match=r"Experiment 'x': noise\[0\].sigma has shape \(2,\)"):
        experiment(noise=[Gaussian([0.1, 0.2]), Gaussian(0.1)])
    with pytest.raises(ValueError, match="Experiment 'x': log-Laplace noise needs positive data"):
        experiment(noise=[Gaussian(0.1), LogLaplace(0.1)], data=-ok)
    with pytest.raises(ValueError, match="LogNormal: base=1"):
        LogNormal(0.1, base=1)
    with pytest.raises(ValueError, match=r"\+inf \(the steady state\) may only end the times"):
        experiment(times=[0.5, np.inf, 2.0])
    with pytest.raises(ValueError, match="with preequilibration, y0 must be None or a mapping"):
        experiment(preequilibration=Preequilibration(), y0=[1.0, 0.0])
    with pytest.raises(TypeError, match="preequilibration must be a ds.inference.Preequilibration"):
        experiment(preequilibration={"k": 1.0})
    with pytest.raises(ValueError, match="multiple shooting .* does not support preequilibration"):
        experiment(preequilibration=Preequilibration(), trajectory=ds.inference.Multishoot(windows=2))

    def study(**kw):
        return ds.Study(problem, [experiment(**kw)], params)

    with pytest.raises(ValueError, match=r"Experiment 'x': noise\[1\].sigma names 'sx', which is not a study param"):
        study(noise=[Gaussian(0.1), Gaussian(np.array([0.1, "sx", 0.1], dtype=object))])
    with pytest.raises(ValueError, match="observable_parameters names \\['k'\\], which are model parameters"):
        study(observable_parameters={"k": 1.0})
    with pytest.raises(ValueError, match=r"observable_parameters\['off'\] names 'nope', which is not a study"):
        study(observable_parameters={"off": "nope"})
    with pytest.raises(ValueError, match=r"y0\['A'\] names 'nope', which is not a study parameter"):
        study(y0={"A": "nope"})
    with pytest.raises(ValueError, match=r"y0\(p\) must return shape \(2,\)"):
        study(y0=lambda p: jnp.stack([p["k"]]))
    with pytest.raises(ValueError, match="preequilibration.conditions names unknown model parameter"):
        study(preequilibration=Preequilibration(conditions={"kx": 1.0}))
    with pytest.raises(ValueError, match=r"noise.sigma\(t, h, p\) must return shape"):
        study(noise=Gaussian(lambda t, h, p: jnp.ones(3)))
    laplace = ds.Study(problem, [experiment(noise=Laplace(0.1))], params)
    with pytest.raises(ValueError, match="objective='chi2' .* Laplace noise"):
        InferenceProblem(laplace, ["k"], objective="chi2")
    functional = ds.Study(problem, [experiment(noise=Gaussian(lambda t, h, p: 0.1 + 0.0 * h))], params)
    with pytest.raises(ValueError, match="objective='chi2' with an estimated sigma"):
        InferenceProblem(functional, ["k"], objective="chi2")
