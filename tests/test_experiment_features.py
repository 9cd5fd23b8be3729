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
from diffsoup.inference.objective._problem import _prediction_program

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
    # Forward sensitivities carry tangents through the solves for k and six's initial amount a0
    # alone (damped's a0 is fixed by its conditions); the rest enter only the observation.
    assert [problem.solve_theta(group) for group in problem.groups] == [(0, 1), (0,)]
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


# ---- pre-equilibration and steady-state times --------------------------------------------------


def reversible_problem():
    """``A <-> B`` (``k1`` forward, ``k2`` back): the total is conserved and the steady state is
    ``A* = T k2 / (k1 + k2)``; ``a0`` is unused by the right-hand side (for ``y0(p)``)."""
    spec = ds.ProblemSpec(
        lambda t, y, p: jnp.stack([-p["k1"] * y[0] + p["k2"] * y[1], p["k1"] * y[0] - p["k2"] * y[1]]),
        states=["A", "B"], parameters={"k1": 1.0, "k2": 0.5, "a0": 1.0}, y0=[1.0, 0.0], name="reversible",
    )  # fmt: skip
    return spec.build()


PRE_TIMES = np.array([0.0, 0.3, 1.0, 2.5, np.inf])
PRE_NOMINAL = {"k1": 1.0, "k2": 0.5, "k1_pre": 0.2, "a_tot": 2.0, "b_add": 0.4, "sd": 0.05}


def preequilibrated_nll(v):
    """The study of :func:`preequilibrated_study` by hand (jax.numpy, so that jax.grad gives the
    closed form's own gradient): the steady state of the pre-equilibration, the re-initialized
    state, the relaxation ``A(t) = A_inf + (A(0) - A_inf) exp(-(k1 + k2) t)``."""
    k1, k2, sd = v["k1"], v["k2"], v["sd"]
    out = 0.0
    for e, (total, k1_pre, b_add) in preequilibrated_data().items():
        total = v["a_tot"] if total is None else total
        k1_pre = v["k1_pre"] if k1_pre is None else k1_pre
        b_add = v["b_add"] if b_add is None else b_add
        a_star = total * k2 / (k1_pre + k2)  # the pre-equilibration's steady state
        t_main = a_star + b_add  # B re-set to b_add after the pre-equilibration
        a_inf = t_main * k2 / (k1 + k2)
        t = np.where(np.isinf(PRE_TIMES), 0.0, PRE_TIMES)
        a = jnp.where(np.isinf(PRE_TIMES), a_inf, a_inf + (a_star - a_inf) * jnp.exp(-(k1 + k2) * t))
        h = jnp.stack([a, t_main - a], axis=1)
        d = DATA_PRE[e]
        out = out + jnp.sum(0.5 * ((h - d) / sd) ** 2 + jnp.log(sd) + 0.5 * math.log(2 * math.pi))
    return out


def preequilibrated_data():
    """Experiment id -> (pre-equilibration total (None: ``a_tot``), its k1 (None: ``k1_pre``),
    re-initialized B (None: ``b_add``))."""
    return {"named": (None, None, None), "numbers": (1.5, 0.3, 0.1)}


DATA_PRE = {
    "named": np.array([[0.9, 1.5], [0.8, 1.5], [0.7, 1.7], [0.75, 1.6], [0.8, 1.6]]),
    "numbers": np.array([[1.0, 0.6], [1.0, 0.6], [0.8, 0.7], [0.5, 1.0], [0.55, 1.05]]),
}


def preequilibrated_study():
    """Two pre-equilibrated experiments with measurements at t0 and at +inf: ``named`` (the
    pre-equilibration's k1, its start and the re-initialized B are estimated) and ``numbers``
    (numbers, and a start ``y0(p)`` of the model parameter ``a0``)."""
    problem = reversible_problem()
    named = ds.Experiment("named", PRE_TIMES, DATA_PRE["named"], noise=Gaussian("sd"), y0={"B": "b_add"},
                          preequilibration=Preequilibration(conditions={"k1": "k1_pre"},
                                                            y0={"A": "a_tot", "B": 0.0}))  # fmt: skip
    numbers = ds.Experiment("numbers", PRE_TIMES, DATA_PRE["numbers"], noise=Gaussian("sd"), y0={"B": 0.1},
                            conditions={"a0": 1.5},
                            preequilibration=Preequilibration(conditions={"k1": 0.3},
                                                              y0=lambda p: jnp.stack([p["a0"], 0.0 * p["a0"]])))  # fmt: skip
    params = [Parameter(k, v, v / 5, v * 5) for k, v in PRE_NOMINAL.items()]
    return ds.Study(problem, [named, numbers], params)


@pytest.mark.slow  # forward and adjoint programs of two groups with steady-state solves: ~40 s to compile
def test_preequilibration_and_steady_state_times_against_the_closed_form():
    study = preequilibrated_study()
    problem = InferenceProblem(study, solver=TIGHT)
    assert len(problem.groups) == 2 and all(g.steady_state is not None for g in problem.groups)
    theta = problem.nominal + np.linspace(-0.05, 0.05, problem.n_theta)
    values = {n: float(v) for n, v in problem.parameter_values(theta).items()}
    expected = float(preequilibrated_nll(values))
    fwd = ds.lower(problem, gradient="forward")
    adj = ds.lower(problem, gradient="adjoint")
    v, g = fwd.value_and_grad(theta)
    va, ga = adj.value_and_grad(theta)
    assert abs(v - expected) <= 1e-8 * abs(expected), (v, expected)
    assert abs(va - v) <= 1e-12 * abs(v)
    assert _rel(ga, g) <= 1e-7
    # The closed form's gradient, in theta (log10 scales): d/dtheta = value * ln 10 * d/dvalue.
    grad = jax.grad(lambda d: preequilibrated_nll(d))({k: jnp.asarray(x) for k, x in values.items()})
    exact = np.array([float(grad[n]) * values[n] * math.log(10.0) for n in problem.theta_names])
    assert _rel(g, exact) <= 1e-6, (g, exact)
    # Predictions: with curves longer than the measurements, the measurement times are padded to
    # the curve's length (+inf, the steady state, repeated), one program per group runs both, and
    # the values at the measurement times are those without curves, bit for bit.
    programs = _prediction_program()
    before = programs._cache_size()
    plain = problem.predict(theta)
    assert programs._cache_size() == before + len(problem.groups)
    pred = problem.predict(theta, points=40)
    assert programs._cache_size() == before + 2 * len(problem.groups)
    for eid, rec in plain.items():
        np.testing.assert_array_equal(pred[eid]["states"], rec["states"])
        np.testing.assert_array_equal(pred[eid]["observables"], rec["observables"])
    assert pred["named"]["curve"].shape[0] == 40 and np.all(np.isfinite(pred["named"]["curve"]))
    assert pred["named"]["curve_times"][-1] == 2.5


def test_study_with_core_features_matches_scipy():
    """Per-observable sigma (estimated), an initial state of the parameters, pre-equilibration with
    an input switched at t0: the value against scipy's solve_ivp at rtol 1e-12 and a hand-written
    negative log-likelihood."""
    from scipy.integrate import solve_ivp
    from scipy.optimize import fsolve

    def rhs(t, y, p):
        a, b, c = y[0], y[1], y[2]
        return jnp.stack([p["u"] - p["k1"] * a - p["k3"] * a * c, p["k1"] * a - p["k2"] * b, p["k2"] * b - p["kd"] * c])

    spec = ds.ProblemSpec(rhs, states=["A", "B", "C"], parameters={"u": 1.0, "k1": 0.8, "k2": 0.5, "k3": 0.3,
                                                                 "kd": 0.4, "a0": 1.0}, y0=[0.0, 0.0, 0.0])  # fmt: skip
    problem = spec.build()
    values = {"k1": 0.8, "k2": 0.5, "k3": 0.3, "kd": 0.4, "a0": 1.3, "c0": 0.7, "sd_a": 0.05, "sd_c": 0.08}
    times = np.array([0.5, 1.0, 2.0, 4.0, 8.0])
    data = {
        "pre": np.array([[1.2, 0.9], [1.4, 1.0], [1.5, 1.2], [1.6, 1.3], [1.6, 1.4]]),
        "fn": np.array([[1.0, 0.2], [0.8, 0.4], [0.7, 0.6], [0.9, 0.9], [1.0, 1.0]]),
    }
    obs = lambda y, p: jnp.stack([y[0], y[2]])  # noqa: E731
    noise = [Gaussian("sd_a"), Gaussian("sd_c")]
    exps = [
        ds.Experiment("pre", times, data["pre"], observables=obs, noise=noise, conditions={"u": 2.0},
                      y0={"C": "c0"}, preequilibration=Preequilibration(conditions={"u": 0.5})),
        ds.Experiment("fn", times, data["fn"], observables=obs, noise=noise, conditions={"u": 1.0},
                      y0=lambda p: jnp.stack([p["a0"], 0.5 * p["a0"], 0.0 * p["a0"]])),
    ]  # fmt: skip
    params = [Parameter(k, v, v / 4, v * 4) for k, v in values.items()]
    study = ds.Study(problem, exps, params)
    low = ds.lower(study, solver=SolverOptions(rtol=1e-11, atol=1e-13, max_steps=20000))
    value = low.value(low.nominal)

    def f(p):
        return lambda t, y: np.asarray(rhs(t, y, p), dtype=np.float64)

    def solve(y0, p):
        sol = solve_ivp(f(p), (0.0, times[-1]), y0, method="Radau", t_eval=times, rtol=1e-12, atol=1e-14)
        return sol.y.T

    base = {k: values[k] for k in ("k1", "k2", "k3", "kd")}
    pre_p = dict(base, u=0.5)
    long = solve_ivp(f(pre_p), (0.0, 200.0), [0.0, 0.0, 0.0], method="Radau", rtol=1e-12, atol=1e-14).y[:, -1]
    steady = fsolve(lambda y: np.asarray(rhs(0.0, y, pre_p)), long, xtol=1e-14)
    start = steady.copy()
    start[2] = values["c0"]
    sims = {"pre": solve(start, dict(base, u=2.0)),
            "fn": solve(np.array([1.3, 0.65, 0.0]), dict(base, u=1.0))}  # fmt: skip
    nll = 0.0
    for eid, sim in sims.items():
        h = sim[:, [0, 2]]
        sd = np.array([values["sd_a"], values["sd_c"]])[None, :]
        nll += np.sum(0.5 * ((h - data[eid]) / sd) ** 2 + np.log(sd) + 0.5 * math.log(2 * math.pi))
    assert abs(value - nll) <= 1e-8 * abs(nll), (value, nll)


# ---- resets and discontinuities ----------------------------------------------------------------


def pulse_problem():
    """``dA/dt = u [t < t_off] - k A``: an input switched off at ``t_off`` (a discontinuity)."""
    spec = ds.ProblemSpec(
        lambda t, y, p: jnp.stack([jnp.where(t < p["t_off"], p["u"], 0.0) - p["k"] * y[0]]),
        states=["A"], parameters={"u": 1.0, "k": 0.5, "t_off": 1.5, "dose": 0.5}, y0=[0.0], name="pulse",
    )  # fmt: skip
    return spec.build()


def pulse(t, k, u, t_off, dose, t_dose):
    """The closed form: input until ``t_off``, then a dose added to A at ``t_dose > t_off``."""
    a_off = u / k * (1 - jnp.exp(-k * t_off))
    before = u / k * (1 - jnp.exp(-k * jnp.minimum(t, t_off)))
    after = a_off * jnp.exp(-k * (t - t_off))
    a = jnp.where(t < t_off, before, after)
    return jnp.where(t >= t_dose, a + dose * jnp.exp(-k * (t - t_dose)), a)


def test_resets_and_discontinuities_against_the_closed_form():
    problem = pulse_problem()
    times = np.array([0.5, 1.5, 2.0, 2.5, 3.0, 4.0])
    data = np.array([0.4, 0.9, 0.7, 1.1, 0.9, 0.6])[:, None]
    add = lambda t, y, p: y + p["dose"]  # noqa: E731
    exps = [
        ds.Experiment("numbers", times, data, noise=Gaussian(0.1), conditions={"t_off": 1.5},
                      discontinuities=[1.5], resets=[ds.Reset(2.5, add)]),
        ds.Experiment("callables", times, data, noise=Gaussian(0.1), conditions={"t_off": 1.2},
                      discontinuities=lambda p: jnp.stack([p["t_off"]]),
                      resets=[ds.Reset(lambda p: p["t_off"] + 1.0, add)]),
    ]  # fmt: skip
    params = [Parameter("k", 0.5, 0.1, 2.0), Parameter("u", 1.0, 0.1, 5.0), Parameter("dose", 0.5, 0.1, 2.0)]
    study = ds.Study(problem, exps, params)
    problem_ = InferenceProblem(study, solver=TIGHT)
    assert len(problem_.groups) == 2
    theta = problem_.nominal + np.array([0.03, -0.02, 0.04])

    def nll(th):
        k, u, dose = (10.0 ** th[i] for i in range(3))
        total = 0.0
        for t_off, t_dose in ((1.5, 2.5), (1.2, 2.2)):
            h = pulse(jnp.asarray(times), k, u, t_off, dose, t_dose)[:, None]
            total = total + jnp.sum(0.5 * ((h - data) / 0.1) ** 2 + math.log(0.1) + 0.5 * math.log(2 * math.pi))
        return total

    # Forward mode only: adjoints through resets are tests/test_resets_steady_state.py's (and cost
    # twice the compile time).
    v, g = ds.lower(problem_, gradient="forward").value_and_grad(theta)
    expected = float(nll(jnp.asarray(theta)))
    assert abs(v - expected) <= 1e-9 * abs(expected), (v, expected)
    assert _rel(g, np.asarray(jax.grad(nll)(jnp.asarray(theta)))) <= 1e-6


def test_multishoot_from_an_estimated_initial_amount_and_offsets_of_subsets():
    """Window starts simulated from ``y0={"A": "a0"}`` at the nominal point: the multiple-shooting
    value equals the single-shooting one (continuity holds there); offsets of subsets add up."""
    problem = decay_problem()
    data = decay(TIMES, 0.7, 2.0) * 1.05
    params = [Parameter("k", 0.7, 0.1, 5.0), Parameter("a0", 2.0, 0.5, 5.0), Parameter("sd", 0.1, 0.01, 1.0)]
    single = ds.Experiment("e", TIMES, data, noise=[Gaussian("sd"), Laplace(0.2)], y0={"A": "a0"})
    shot = single.with_trajectory(ds.inference.Multishoot(windows=2, init="simulate"))
    values = []
    for e in (single, shot):
        ip = InferenceProblem(ds.Study(problem, [e], params), solver=TIGHT,
                              window_store=ds.inference.MemoryWindowCache())  # fmt: skip
        values.append(ds.lower(ip).value(ip.nominal))
    assert abs(values[1] - values[0]) <= 1e-8 * abs(values[0])
    two = ds.Study(problem, [single, ds.Experiment("f", TIMES, data, noise=Gaussian(0.1))], params)
    ip = InferenceProblem(two)
    assert ip.offset_of([0]) + ip.offset_of([1]) == pytest.approx(ip.offset, rel=1e-14)
    assert ip.offset_of([0, 1]) == ip.offset


@pytest.mark.slow  # forward and adjoint programs with a steady-state solve
def test_preequilibration_starting_at_its_steady_state_has_the_implicit_derivative():
    """A pre-equilibration that starts exactly at its steady state settles at once; the derivative
    of where it settles is still the steady state's (implicit function theorem, the conserved
    total kept), not the derivative of the start. PEtab's Weber_BMC2015 has such
    pre-equilibrations; its gradient now matches AMICI's (benchmarks/bench_petab.py)."""
    problem = reversible_problem()
    nominal = {"k1": 1.0, "k2": 0.5, "k1_pre": 0.2, "sd": 0.05}
    total = 2.0
    at_rest = {"A": total * 0.5 / 0.7, "B": total * 0.2 / 0.7}  # steady under k1_pre = 0.2, k2 = 0.5
    times = np.array([0.3, 1.0, np.inf])
    data = np.array([[1.1, 0.9], [1.0, 1.0], [0.7, 1.3]])
    exp = ds.Experiment("rest", times, data, noise=Gaussian("sd"),
                        preequilibration=Preequilibration(conditions={"k1": "k1_pre"}, y0=at_rest))  # fmt: skip
    study = ds.Study(problem, [exp], [Parameter(k, v, v / 5, v * 5) for k, v in nominal.items()])

    def nll(v):
        k1, k2, sd = v["k1"], v["k2"], v["sd"]
        a_star = total * v["k2"] / (v["k1_pre"] + v["k2"])
        a_inf = total * k2 / (k1 + k2)
        t = np.where(np.isinf(times), 0.0, times)
        a = jnp.where(np.isinf(times), a_inf, a_inf + (a_star - a_inf) * jnp.exp(-(k1 + k2) * t))
        h = jnp.stack([a, total - a], axis=1)
        return jnp.sum(0.5 * ((h - data) / sd) ** 2 + jnp.log(sd) + 0.5 * math.log(2 * math.pi))

    problem_ = InferenceProblem(study, solver=TIGHT)
    theta = problem_.nominal  # the pre-equilibration starts exactly at rest
    grad = jax.grad(nll)({k: jnp.asarray(x) for k, x in nominal.items()})
    exact = np.array([float(grad[n]) * nominal[n] * math.log(10.0) for n in problem_.theta_names])
    for gradient in ("forward", "adjoint"):
        value, g = ds.lower(problem_, gradient=gradient).value_and_grad(theta)
        assert abs(value - float(nll(nominal))) <= 1e-8 * abs(value)
        assert _rel(g, exact) <= 1e-6, (gradient, g, exact)
