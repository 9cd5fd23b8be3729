"""PEtab import (``ds.petab``): the five benchmark problems against their reference
log-likelihoods and simulated data; synthetic problems for what the five do not use, checked
against ``petab.v1.calculate_llh`` on an independent scipy solve of hand-written right-hand sides;
gradients (adjoint, forward sensitivities, extrapolated central differences); a Python study with
the same features as its PEtab twin; the simulation table; the code cache; clear errors for what
is malformed or unsupported."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

libsbml = pytest.importorskip("libsbml")
petab = pytest.importorskip("petab.v1")
pd = pytest.importorskip("pandas")

import diffsoup as ds  # noqa: E402
from diffsoup.petab import PetabError, PetabWarning  # noqa: E402

DATA = Path(__file__).parent / "data" / "petab"
REFERENCE = json.loads((DATA / "reference.json").read_text())["models"]
TIGHT = ds.inference.SolverOptions(rtol=1e-10, atol=1e-12, max_steps=100_000)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Each test writes its generated code to its own cache (tests stay independent)."""
    monkeypatch.setenv("DIFFSOUP_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(autouse=True)
def _x64():
    import jax

    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)


# Unknown columns of the collection's tables: each load says so (a PetabWarning).
UNKNOWN_COLUMNS = {"Fujita_SciSignal2010": "priorType", "Brannmark_JBC2010": "experimentId"}


def _load(name, **options):
    path = DATA / name / f"{name}.yaml"
    if name in UNKNOWN_COLUMNS:
        with pytest.warns(PetabWarning, match=UNKNOWN_COLUMNS[name]):
            return ds.petab.load(path, **options)
    return ds.petab.load(path, **options)


# ------------------------------------------------------------------------------------------------
# the five benchmark problems
# ------------------------------------------------------------------------------------------------

FIVE = [
    pytest.param("Boehm_JProteomeRes2014", id="Boehm"),
    pytest.param("Bruno_JExpBot2016", id="Bruno"),
    pytest.param("Fujita_SciSignal2010", id="Fujita"),
    pytest.param("Brannmark_JBC2010", id="Brannmark"),
    pytest.param("Weber_BMC2015", id="Weber"),
]


@pytest.mark.parametrize("name", FIVE)
def test_benchmark_likelihood_at_the_nominal_point_matches_the_tight_reference(name, tmp_path):
    """The likelihood against the collection's reference and petab's own; for the problems with
    simulated data (SIMULATED), the simulation table against it (one load and lowering for both)."""
    problem = _load(name)
    assert problem.solver.rtol == problem.solver.atol == 1e-8  # AMICI's benchmark tolerances
    lowered = problem.lower(solver=TIGHT)
    assert lowered.theta_names == problem.theta_names
    np.testing.assert_array_equal(lowered.nominal, problem.nominal)
    at_nominal = {k: problem.nominal_values[k] for k in problem.theta_names}
    np.testing.assert_allclose(problem.theta_of(at_nominal), problem.nominal, rtol=1e-15)
    value = lowered.value(problem.nominal)
    ref = REFERENCE[name]["llh_roadrunner_rtol1e-12"]
    assert abs(-value - ref) <= 1e-6 * abs(ref), (value, ref)
    # The simulation table at the same point gives petab's own likelihood (noise formulas,
    # transformations and replicates evaluated by petab), the same number.
    predictions = problem.simulate(solver=TIGHT)
    sim = problem.simulation_table(predictions=predictions)
    pp = problem.petab_problem
    llh = petab.calculate_llh(pp.measurement_df, sim, pp.observable_df, pp.parameter_df)
    assert abs(llh + value) <= 1e-9 * abs(value)
    if name in SIMULATED:  # Fujita's simulatedData is left out (tests/data/petab/README.md)
        _simulation_table_reproduces_the_collections_simulated_data(problem, name, *SIMULATED[name], tmp_path)


# (relative agreement with simulatedData, conditions to leave out): see tests/data/petab/README.md
SIMULATED = {
    "Boehm_JProteomeRes2014": (1e-6, ()),
    "Bruno_JExpBot2016": (1e-5, ()),
    "Brannmark_JBC2010": (1e-5, ("TwoSteps",)),
    "Weber_BMC2015": (1e-6, ()),
}


def _simulation_table_reproduces_the_collections_simulated_data(problem, name, rtol, leave_out, tmp_path):
    path = problem.write_simulation_table(tmp_path / "simulation.tsv", solver=TIGHT)
    ours = petab.get_simulation_df(path)
    theirs = petab.get_simulation_df(DATA / name / f"simulatedData_{name}.tsv")
    key = ["observableId", "simulationConditionId", "time"]
    if "preequilibrationConditionId" in theirs:
        key.append("preequilibrationConditionId")
    for df in (ours, theirs):
        df["time"] = df["time"].astype(float)
        if "preequilibrationConditionId" in key:
            df["preequilibrationConditionId"] = df["preequilibrationConditionId"].astype(object).fillna("")
    theirs = theirs[~theirs["simulationConditionId"].isin(leave_out)]
    merged = theirs.merge(ours[key + ["simulation"]].drop_duplicates(key), on=key, suffixes=("_ref", ""))
    assert len(merged) == len(theirs) > 10
    got, ref = merged["simulation"].to_numpy(float), merged["simulation_ref"].to_numpy(float)
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=1e-9 * np.abs(ref).max())
    # the table keeps the measurement table's rows and columns, with simulation for measurement
    table = problem.petab_problem.measurement_df
    assert list(ours.columns) == [c if c != "measurement" else "simulation" for c in table.columns]
    assert len(ours) == len(table)


def test_boehm_load_lower_and_first_value_fit_in_a_minute(tmp_path):
    """The issue's budget, measured in a fresh process with a cold code cache (printed; the
    assertion is the budget)."""
    code = textwrap.dedent(f"""
        import time
        t0 = time.perf_counter()
        import jax
        jax.config.update("jax_enable_x64", True)
        import diffsoup as ds
        problem = ds.petab.load({str(DATA / 'Boehm_JProteomeRes2014' / 'Boehm_JProteomeRes2014.yaml')!r})
        t1 = time.perf_counter()
        lowered = problem.lower()
        value = lowered.value(problem.nominal)
        t2 = time.perf_counter()
        print(f"{{t1 - t0:.2f}} {{t2 - t1:.2f}} {{value:.10f}}")
    """)
    env = {**__import__("os").environ, "DIFFSOUP_CACHE_DIR": str(tmp_path / "cold")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    load, first, value = (float(x) for x in out.stdout.split())
    print(f"Boehm: import + load {load:.1f} s, lower + first value {first:.1f} s")
    assert load + first < 60
    assert abs(-value - REFERENCE["Boehm_JProteomeRes2014"]["llh_amici"]) < 1e-4 * 138  # at rtol 1e-8


def test_second_load_reads_the_generated_code_from_the_cache():
    first = _load("Boehm_JProteomeRes2014")
    second = _load("Boehm_JProteomeRes2014")
    assert not first.formulas.from_cache and second.formulas.from_cache
    assert second.model.from_cache and second.formulas.source == first.formulas.source
    theta = first.nominal + 0.01
    assert first.lower().value(theta) == second.lower().value(theta)


def test_a_cached_load_parses_no_formula_and_no_sbml(tmp_path):
    """In a second process the model's and the formulas' code come from the disk cache: with
    sympy's parser of PEtab formulas and the SBML import broken, the load still works."""
    code = textwrap.dedent(f"""
        import sys, jax
        jax.config.update("jax_enable_x64", True)
        import diffsoup as ds
        if sys.argv[1] == "second":
            import petab.v1.math, diffsoup.formats._sbml as sbml

            def broken(*args, **kwargs):
                raise AssertionError("parsed again")

            petab.v1.math.sympify_petab = broken
            sbml._import_document = broken
        problem = ds.petab.load({str(DATA / 'Bruno_JExpBot2016' / 'Bruno_JExpBot2016.yaml')!r}, validate=False)
        print(problem.formulas.from_cache, problem.model.from_cache, problem.lower().value(problem.nominal))
    """)
    env = {**__import__("os").environ, "DIFFSOUP_CACHE_DIR": str(tmp_path / "c")}
    runs = [subprocess.run([sys.executable, "-c", code, which], capture_output=True, text=True, env=env, timeout=300)
            for which in ("first", "second")]  # fmt: skip
    for out in runs:
        assert out.returncode == 0, out.stderr[-3000:]
    first, second = (o.stdout.split()[-3:] for o in runs)
    assert first[:2] == ["False", "False"] and second[:2] == ["True", "True"] and first[2] == second[2]


# ------------------------------------------------------------------------------------------------
# synthetic problems: SBML written with libsbml, tables with pandas
# ------------------------------------------------------------------------------------------------


class Model:
    """A small SBML Level 3 model built through libsbml."""

    def __init__(self):
        self.doc = libsbml.SBMLDocument(3, 1)
        self.m = self.doc.createModel()
        self.m.setId("synthetic")

    def compartment(self, cid, size):
        c = self.m.createCompartment()
        c.setId(cid)
        c.setSize(size)
        c.setConstant(True)
        c.setSpatialDimensions(3)

    def species(self, sid, comp, conc):
        s = self.m.createSpecies()
        s.setId(sid)
        s.setCompartment(comp)
        s.setInitialConcentration(conc)
        s.setHasOnlySubstanceUnits(False)
        s.setBoundaryCondition(False)
        s.setConstant(False)

    def parameter(self, pid, value, constant=True):
        p = self.m.createParameter()
        p.setId(pid)
        p.setValue(value)
        p.setConstant(constant)

    def reaction(self, rid, reactants, products, formula):
        r = self.m.createReaction()
        r.setId(rid)
        r.setReversible(False)
        r.setFast(False)
        for sid in reactants:
            ref = r.createReactant()
            ref.setSpecies(sid)
            ref.setStoichiometry(1.0)
            ref.setConstant(True)
        for sid in products:
            ref = r.createProduct()
            ref.setSpecies(sid)
            ref.setStoichiometry(1.0)
            ref.setConstant(True)
        r.createKineticLaw().setMath(_math(formula))

    def function(self, fid, formula):
        f = self.m.createFunctionDefinition()
        f.setId(fid)
        f.setMath(_math(formula))

    def rule(self, var, formula):
        rule = self.m.createAssignmentRule()
        rule.setVariable(var)
        rule.setMath(_math(formula))

    def initial_assignment(self, var, formula):
        ia = self.m.createInitialAssignment()
        ia.setSymbol(var)
        ia.setMath(_math(formula))

    def event(self, eid, trigger, assignments):
        e = self.m.createEvent()
        e.setId(eid)
        e.setUseValuesFromTriggerTime(True)
        t = e.createTrigger()
        t.setMath(_math(trigger))
        t.setInitialValue(True)
        t.setPersistent(True)
        for var, formula in assignments.items():
            ea = e.createEventAssignment()
            ea.setVariable(var)
            ea.setMath(_math(formula))

    def algebraic(self, formula):
        self.m.createAlgebraicRule().setMath(_math(formula))

    def text(self):
        return libsbml.writeSBMLToString(self.doc)


def _math(formula):
    node = libsbml.parseL3Formula(formula)
    assert node is not None, libsbml.getLastParseL3Error()
    return node


def write_problem(folder: Path, model: Model, *, conditions, observables, measurements, parameters) -> Path:
    """A PEtab v1 problem in ``folder`` from row dicts; returns the YAML file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.xml").write_text(model.text())
    pd.DataFrame(conditions).to_csv(folder / "conditions.tsv", sep="\t", index=False)
    # (petab.v1.calculate_llh needs the transformation and distribution written out)
    observables = [{"observableTransformation": "lin", "noiseDistribution": "normal", **o} for o in observables]
    pd.DataFrame(observables).to_csv(folder / "observables.tsv", sep="\t", index=False)
    pd.DataFrame(measurements).to_csv(folder / "measurements.tsv", sep="\t", index=False)
    pd.DataFrame(parameters).to_csv(folder / "parameters.tsv", sep="\t", index=False)
    yaml = folder / "problem.yaml"
    yaml.write_text(textwrap.dedent("""\
        format_version: 1
        parameter_file: parameters.tsv
        problems:
        - condition_files: [conditions.tsv]
          measurement_files: [measurements.tsv]
          observable_files: [observables.tsv]
          sbml_files: [model.xml]
        """))
    return yaml


def _par(pid, nominal, *, scale="log10", lower=1e-3, upper=1e3, estimate=1):
    return {"parameterId": pid, "parameterScale": scale, "lowerBound": lower, "upperBound": upper,
            "nominalValue": nominal, "estimate": estimate}  # fmt: skip


def _meas(obs, cond, value, time, *, pre="", op="", np_=""):
    return {"observableId": obs, "preequilibrationConditionId": pre, "simulationConditionId": cond,
            "measurement": value, "time": time, "observableParameters": op, "noiseParameters": np_}  # fmt: skip


def _solve(rhs, y0, times, *, pieces=(), resets=None):
    """scipy Radau at rtol 1e-12 from t = 0 through ``times`` (finite), restarting at each time of
    ``pieces`` (switches) and applying ``resets[t](y)`` there."""
    from scipy.integrate import solve_ivp

    resets = resets or {}
    edges = sorted({0.0, *pieces, max(times)})
    out = {}
    y = np.asarray(y0, dtype=float)
    for a, b in zip(edges[:-1], edges[1:]):
        if a in resets:
            y = resets[a](y)
        want = [t for t in times if a <= t <= b]
        sol = solve_ivp(rhs, (a, b), y, method="Radau", rtol=1e-12, atol=1e-14, dense_output=True)
        assert sol.success
        for t in want:
            if t not in out or t == a:
                out[t] = sol.sol(t)
        y = sol.y[:, -1]
    assert max(times) not in resets  # an output at a reset time is the state after it: from the next piece
    return out


def _check_against_petab(yaml, sim_values, *, rtol=1e-8, solver=TIGHT, validate=True):
    """``-lowered.value(nominal)`` equals petab.calculate_llh of the scipy simulation; our
    simulation table equals scipy's row by row. ``sim_values(row) -> observable value``."""
    problem = ds.petab.load(yaml, validate=validate)
    pp = problem.petab_problem
    sim = pp.measurement_df.copy().rename(columns={"measurement": "simulation"})
    sim["simulation"] = [sim_values(row) for _, row in pp.measurement_df.iterrows()]
    llh = petab.calculate_llh(pp.measurement_df, sim, pp.observable_df, pp.parameter_df)
    value = problem.lower(solver=solver).value(problem.nominal)
    assert abs(-value - llh) <= rtol * abs(llh), (value, llh)
    ours = problem.simulation_table(solver=solver)
    np.testing.assert_allclose(ours["simulation"], sim["simulation"], rtol=1e-8, atol=1e-12)
    return problem, value


# -- 1: log/log10 transformations, Laplace noise, observableParameters, replicates -------------


def _decay_model():
    m = Model()
    m.compartment("cell", 2.0)
    m.species("A", "cell", 1.0)
    m.species("B", "cell", 0.0)
    m.parameter("k1", 0.5)
    m.parameter("k2", 0.2)
    # kinetic laws are amounts per time: d[A]/dt = -k1 A / cell
    m.reaction("r1", ["A"], ["B"], "k1 * A")
    m.reaction("r2", ["B"], [], "k2 * B")
    return m


def _decay_rhs(k1, k2, cell):
    return lambda t, y: [-k1 * y[0] / cell, (k1 * y[0] - k2 * y[1]) / cell]


def test_transformations_laplace_noise_and_observable_parameters_match_petab(tmp_path):
    observables = [
        {"observableId": "a_log", "observableFormula": "A", "observableTransformation": "log",
         "noiseFormula": "noiseParameter1_a_log", "noiseDistribution": "normal"},
        {"observableId": "b_log10", "observableFormula": "observableParameter1_b_log10 * B",
         "observableTransformation": "log10", "noiseFormula": "sd_b", "noiseDistribution": "laplace"},
        {"observableId": "total", "observableFormula": "observableParameter1_total * (A + B) + observableParameter2_total",
         "observableTransformation": "lin", "noiseFormula": "noiseParameter1_total * total + 0.1 * sd_b",
         "noiseDistribution": "laplace"},
        {"observableId": "a_ln_laplace", "observableFormula": "A + time * 0.01", "observableTransformation": "log",
         "noiseFormula": "0.2", "noiseDistribution": "laplace"},
        {"observableId": "b_log10_normal", "observableFormula": "B", "observableTransformation": "log10",
         "noiseFormula": "sd_b", "noiseDistribution": "normal"},
    ]  # fmt: skip
    conditions = [{"conditionId": "c1", "k1": 0.5, "cell": 2.0}, {"conditionId": "c2", "k1": "k1_alt", "cell": 1.5}]
    rng = np.random.default_rng(3)
    meas = []
    for cond in ("c1", "c2"):
        for t in (0.5, 1.0, 2.0, 4.0):
            meas.append(_meas("a_log", cond, float(rng.uniform(0.3, 1.0)), t, np_=0.1 + 0.05 * t))
            meas.append(_meas("a_log", cond, float(rng.uniform(0.3, 1.0)), t, np_=0.15))  # a replicate
            meas.append(_meas("b_log10", cond, float(rng.uniform(0.05, 0.5)), t, op="scale_b"))
            # the same observable with two scalings (two columns) and a number as offset
            meas.append(_meas("total", cond, float(rng.uniform(0.5, 1.5)), t, op="scale_1;0.1", np_=0.05))
            meas.append(_meas("total", cond, float(rng.uniform(1.0, 3.0)), t, op="scale_2;offset", np_=0.1))
            meas.append(_meas("a_ln_laplace", cond, float(rng.uniform(0.3, 1.0)), t))
            meas.append(_meas("b_log10_normal", cond, float(rng.uniform(0.05, 0.5)), t + 0.25))
    parameters = [_par("k1_alt", 0.8), _par("k2", 0.2), _par("sd_b", 0.3), _par("scale_b", 1.3),
                  _par("scale_1", 0.9), _par("scale_2", 2.1), _par("offset", 0.2, scale="lin", lower=-1, upper=1)]  # fmt: skip
    yaml = write_problem(tmp_path / "p", _decay_model(), conditions=conditions, observables=observables,
                         measurements=meas, parameters=parameters)  # fmt: skip
    nominal = {p["parameterId"]: p["nominalValue"] for p in parameters}
    cond_values = {"c1": (0.5, 2.0), "c2": (nominal["k1_alt"], 1.5)}
    times = sorted({m["time"] for m in meas})
    states = {c: _solve(_decay_rhs(k1, nominal["k2"], cell), [1.0, 0.0], times) for c, (k1, cell) in cond_values.items()}

    def value(row):
        a, b = states[row["simulationConditionId"]][float(row["time"])]
        t = float(row["time"])
        ops = str(row["observableParameters"]).split(";")
        num = [nominal[o] if o in nominal else float(o) for o in ops] if ops != ["nan"] else []
        return {"a_log": lambda: a, "b_log10": lambda: num[0] * b, "total": lambda: num[0] * (a + b) + num[1],
                "a_ln_laplace": lambda: a + 0.01 * t, "b_log10_normal": lambda: b}[row["observableId"]]()  # fmt: skip

    # petab's lint does not let a noise formula name its observable (petab.v1.calculate_llh does)
    problem, _ = _check_against_petab(yaml, value, validate=False)
    # 'total' has two slots (columns), each experiment its own observable parameters per slot: objects
    assert problem.study.arrays is None and "'total'" in problem.objects_reason
    assert problem.columns == ("a_log", "b_log10", "total", "total/1", "a_ln_laplace", "b_log10_normal")
    noise = problem.study.experiments[0].noise
    kinds = [type(n).__name__ + ("" if getattr(n, "base", None) is None else f"{n.base:g}") for n in noise]
    assert kinds == ["LogNormal2.71828", "LogLaplace10", "Laplace", "Laplace", "LogLaplace2.71828", "LogNormal10"]


# -- 2: events, function definitions, piecewise switches, steady-state measurements ------------


def _pulse_model():
    m = Model()
    m.compartment("c", 1.0)
    m.species("X", "c", 0.5)
    for pid, v in (("kp", 2.0), ("kd", 0.7), ("basal", 0.3), ("t_off", 3.0), ("dose", 1.5), ("t_dose", 5.0)):
        m.parameter(pid, v)
    m.parameter("u", 1.0, constant=False)
    m.function("production", "lambda(input, rate, input * rate)")
    m.rule("u", "piecewise(1, time < t_off, 0)")
    m.reaction("make", [], ["X"], "production(u, kp) + basal")
    m.reaction("decay", ["X"], [], "kd * X")
    m.event("dosing", "time >= t_dose", {"X": "X + dose"})
    return m


def test_events_functions_switches_and_steady_state_measurements_match_petab(tmp_path):
    observables = [
        {"observableId": "x", "observableFormula": "X", "noiseFormula": "sd_x"},
        {"observableId": "x_scaled", "observableFormula": "scale_x * X + u", "noiseFormula": "0.1",
         "observableTransformation": "log"},
    ]  # fmt: skip
    conditions = [{"conditionId": "early", "t_dose": 5.0}, {"conditionId": "late", "t_dose": "t_late"}]
    rng = np.random.default_rng(5)
    meas = []
    for cond in ("early", "late"):
        for t in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, math.inf):
            meas.append(_meas("x", cond, float(rng.uniform(0.3, 3.0)), t))
            meas.append(_meas("x_scaled", cond, float(rng.uniform(0.3, 3.0)), t))
    parameters = [_par("kp", 2.0), _par("kd", 0.7), _par("basal", 0.3), _par("dose", 1.5), _par("sd_x", 0.4),
                  _par("scale_x", 1.2), _par("t_late", 6.5, scale="lin", lower=5.5, upper=7.5, estimate=0)]  # fmt: skip
    yaml = write_problem(tmp_path / "p", _pulse_model(), conditions=conditions, observables=observables,
                         measurements=meas, parameters=parameters)  # fmt: skip
    v = {p["parameterId"]: p["nominalValue"] for p in parameters}

    def rhs(t, y):
        u = 1.0 if t < 3.0 else 0.0
        return [u * v["kp"] + v["basal"] - v["kd"] * y[0]]

    states = {}
    for cond, t_dose in (("early", 5.0), ("late", v["t_late"])):
        finite = [m["time"] for m in meas if math.isfinite(m["time"])]
        states[cond] = _solve(rhs, [0.5], finite, pieces=(3.0, t_dose), resets={t_dose: lambda y: y + v["dose"]})
        states[cond][math.inf] = np.array([v["basal"] / v["kd"]])  # the steady state, u = 0

    def value(row):
        t = float(row["time"])
        (x,) = states[row["simulationConditionId"]][t]
        u = 1.0 if t < 3.0 else 0.0
        return x if row["observableId"] == "x" else v["scale_x"] * x + u

    # the steady state within the test's own tolerance (the solve's rtol: the default SteadyState)
    problem, _ = _check_against_petab(yaml, value, rtol=1e-7)
    # held as arrays: the events' resets, the switches and a condition mapping t_dose to t_late
    assert problem.study.arrays is not None and problem.study.arrays.resets


# -- 3: pre-equilibration, species and compartments in conditions, initial assignments ---------


def _receptor_model():
    m = Model()
    m.compartment("cyt", 1.0)
    m.species("R", "cyt", 0.0)
    m.species("Rp", "cyt", 0.0)
    for pid, v in (("ks", 2.0), ("kdeg", 0.5), ("kon", 1.5), ("koff", 0.8), ("L", 0.0)):
        m.parameter(pid, v)
    m.initial_assignment("R", "ks / kdeg")  # an initial state of the parameters
    m.reaction("synthesis", [], ["R"], "ks * cyt")
    m.reaction("degradation", ["R"], [], "kdeg * R * cyt")
    m.reaction("degradation_p", ["Rp"], [], "kdeg * Rp * cyt")
    m.reaction("binding", ["R"], ["Rp"], "kon * L * R * cyt")
    m.reaction("release", ["Rp"], ["R"], "koff * Rp * cyt")
    return m


def _receptor_rhs(ks, kdeg, kon, koff, L):
    return lambda t, y: [ks - kdeg * y[0] - kon * L * y[0] + koff * y[1], kon * L * y[0] - koff * y[1] - kdeg * y[1]]


RECEPTOR_PARAMETERS = [_par("ks", 2.0), _par("kdeg", 0.5), _par("kon", 1.5), _par("koff", 0.8),
                       _par("Rp0", 0.4), _par("sd_total", 0.2), _par("scale_f", 3.0)]  # fmt: skip


def _receptor_problem(tmp_path):
    observables = [
        {"observableId": "total", "observableFormula": "R + Rp", "noiseFormula": "sd_total"},
        {"observableId": "fraction", "observableFormula": "observableParameter1_fraction * Rp / (R + Rp)",
         "noiseFormula": "0.05"},
    ]  # fmt: skip
    conditions = [{"conditionId": "rest", "L": 0.0, "Rp": math.nan},
                  {"conditionId": "stim", "L": 1.0, "Rp": math.nan},
                  {"conditionId": "stim_primed", "L": 2.0, "Rp": "Rp0"}]  # fmt: skip
    rng = np.random.default_rng(7)
    meas = []
    for cond in ("stim", "stim_primed"):
        for t in (0.0, 0.5, 1.0, 2.0, 5.0):
            meas.append(_meas("total", cond, float(rng.uniform(3, 5)), t, pre="rest"))
            meas.append(_meas("fraction", cond, float(rng.uniform(0, 2)), t, pre="rest", op="scale_f"))
    meas.append(_meas("total", "rest", 4.1, 1.0))  # no pre-equilibration: from y0 = initial assignments
    return write_problem(tmp_path / "p", _receptor_model(), conditions=conditions, observables=observables,
                         measurements=meas, parameters=RECEPTOR_PARAMETERS)  # fmt: skip


def test_preequilibration_species_conditions_and_initial_assignments_match_petab(tmp_path):
    yaml = _receptor_problem(tmp_path)
    v = {p["parameterId"]: p["nominalValue"] for p in RECEPTOR_PARAMETERS}
    base = (v["ks"], v["kdeg"], v["kon"], v["koff"])
    steady = _solve(_receptor_rhs(*base, 0.0), [1.0, 0.0], [2000.0])[2000.0]  # rest: R = ks/kdeg, Rp = 0
    np.testing.assert_allclose(steady, [v["ks"] / v["kdeg"], 0.0], atol=1e-9)
    times = [0.0, 0.5, 1.0, 2.0, 5.0]
    states = {
        "stim": _solve(_receptor_rhs(*base, 1.0), steady, times),
        "stim_primed": _solve(_receptor_rhs(*base, 2.0), [steady[0], v["Rp0"]], times),  # Rp re-initialized
        "rest": _solve(_receptor_rhs(*base, 0.0), [v["ks"] / v["kdeg"], 0.0], [1.0]),
    }

    def value(row):
        r, rp = states[row["simulationConditionId"]][float(row["time"])]
        return r + rp if row["observableId"] == "total" else v["scale_f"] * rp / (r + rp)

    problem, _ = _check_against_petab(yaml, value)
    ids = [e.id for e in problem.study.experiments]
    assert ids == ["stim@rest", "stim_primed@rest", "rest"]


def test_a_python_study_with_the_same_features_gives_the_same_value_as_its_petab_twin(tmp_path):
    """The receptor problem written by hand with the core API: per-observable noise (an estimated
    sigma and a number), observable parameters, an initial state of the parameters, pre-
    equilibration with a re-initialized state."""
    import jax.numpy as jnp

    from diffsoup.inference import Experiment, Gaussian, Parameter, Preequilibration, Study

    twin = ds.petab.load(_receptor_problem(tmp_path))

    def rhs(t, y, p):
        r, rp = y[0], y[1]
        bind = p["kon"] * p["L"] * r - p["koff"] * rp
        return jnp.stack([p["ks"] - p["kdeg"] * r - bind, bind - p["kdeg"] * rp])

    spec = ds.ProblemSpec(rhs, states=("R", "Rp"), parameters={"ks": 2.0, "kdeg": 0.5, "kon": 1.5, "koff": 0.8,
                                                               "L": 0.0}, y0=[4.0, 0.0])  # fmt: skip

    def y0(p):
        return jnp.stack([p["ks"] / p["kdeg"], jnp.zeros_like(p["ks"])])

    def observables(y, p):
        return jnp.stack([y[0] + y[1], p["scale"] * y[1] / (y[0] + y[1])])

    noise = [Gaussian("sd_total"), Gaussian(0.05)]
    experiments = []
    for e in twin.study.experiments:  # the same data, times and layout
        pre = None if e.preequilibration is None else Preequilibration(conditions={"L": 0.0}, y0=y0)
        L = {"stim@rest": 1.0, "stim_primed@rest": 2.0, "rest": 0.0}[e.id]
        initial = {"Rp": "Rp0"} if e.id == "stim_primed@rest" else None
        experiments.append(Experiment(e.id, e.times, e.data, observables=observables, noise=noise,
                                      conditions={"L": L}, observable_parameters={"scale": "scale_f"},
                                      preequilibration=pre, y0=initial if pre is not None else y0))  # fmt: skip
    parameters = [Parameter(p["parameterId"], nominal=p["nominalValue"], lower=p["lowerBound"],
                            upper=p["upperBound"], scale=p["parameterScale"]) for p in RECEPTOR_PARAMETERS]  # fmt: skip
    study = Study(spec, experiments, parameters)
    lowered = ds.lower(study, solver=TIGHT)
    theirs = twin.lower(solver=TIGHT)
    assert lowered.theta_names == theirs.theta_names
    for theta in (twin.nominal, twin.nominal + np.linspace(-0.1, 0.1, twin.nominal.size)):
        np.testing.assert_allclose(lowered.value(theta), theirs.value(theta), rtol=1e-9)


# -- 4: many conditions: the study held as arrays ----------------------------------------------


def _cohort_model():
    m = Model()
    m.compartment("cell", 1.0)
    m.species("A", "cell", 1.0)
    m.species("B", "cell", 0.0)
    for pid, v in (("k1", 0.5), ("k2", 0.2), ("kin", 0.1)):
        m.parameter(pid, v)
    m.reaction("make", [], ["A"], "kin * cell")
    m.reaction("convert", ["A"], ["B"], "k1 * A * cell")
    m.reaction("decay", ["B"], [], "k2 * B * cell")
    return m


COHORT_PARAMETERS = [_par("k2", 0.2), _par("kin_lo", 0.05), _par("kin_hi", 0.2), _par("sd_a", 0.1),
                     _par("sd_b", 0.08), _par("scale_b", 1.5), _par("offset_b", 0.1, scale="lin", lower=-1, upper=1)]  # fmt: skip


def _cohort_problem(folder, n, edit=None):
    """``n`` conditions, each its own rate ``k1`` (a number), production rate (one of two estimated
    parameters), initial ``A`` (a number, or the model's); 3 or 4 times; observable parameters per
    condition (a parameter or a number), noise parameters per row (numbers, some a parameter), an
    estimated sigma, a log-Laplace observable with replicates; the measurement rows shuffled."""
    rng = np.random.default_rng(11)
    conditions, meas = [], []
    for c in range(n):
        cid = f"s{c}"
        conditions.append({"conditionId": cid, "k1": round(float(rng.uniform(0.2, 1.0)), 6),
                           "kin": "kin_lo" if c % 2 else "kin_hi",
                           "A": round(float(rng.uniform(0.5, 2.0)), 6) if c % 3 else math.nan})  # fmt: skip
        times = (0.5, 1.0, 2.0) + ((4.0,) if c % 4 == 0 else ())
        for t in times:
            meas.append(_meas("obs_a", cid, round(float(rng.uniform(0.3, 2.0)), 6), t))
            meas.append(_meas("obs_b", cid, round(float(rng.uniform(0.0, 1.0)), 6), t,
                              op="scale_b" if c % 2 else "2.0", np_="sd_b" if c % 5 == 0 else 0.05 + 0.02 * t))  # fmt: skip
        for _ in range(1 + (c % 7 == 0)):
            meas.append(_meas("obs_total", cid, round(float(rng.uniform(0.5, 2.5)), 6), times[-1]))
    meas = [meas[i] for i in rng.permutation(len(meas))]
    observables = [
        {"observableId": "obs_a", "observableFormula": "A", "noiseFormula": "sd_a"},
        {"observableId": "obs_b", "observableFormula": "observableParameter1_obs_b * B + offset_b",
         "noiseFormula": "noiseParameter1_obs_b"},
        {"observableId": "obs_total", "observableFormula": "A + B", "noiseFormula": "0.1",
         "observableTransformation": "log", "noiseDistribution": "laplace"},
    ]  # fmt: skip
    if edit is not None:
        edit(conditions, meas)
    return write_problem(folder, _cohort_model(), conditions=conditions, observables=observables, measurements=meas,
                         parameters=COHORT_PARAMETERS)  # fmt: skip


def test_many_conditions_are_held_as_arrays_and_match_the_experiment_objects(tmp_path):
    """300 conditions: the study is held as arrays (no Experiment object per condition), with the
    same experiments, placements, value and gradient as the same problem built as ds.Experiment
    objects, and the simulation table gives petab's own likelihood."""
    from diffsoup.inference.study._experiment_arrays import ExperimentViews

    yaml = _cohort_problem(tmp_path / "p", 300)
    arrays = ds.petab.load(yaml)
    objects = ds.petab.load(yaml, arrays=False)
    assert arrays.objects_reason is None and arrays.study.arrays is not None
    assert isinstance(arrays.study.experiments, ExperimentViews)  # views built on access, not a list
    assert objects.study.arrays is None and isinstance(objects.study.experiments[0], ds.Experiment)
    assert arrays.study.ids == objects.study.ids and len(arrays.study.ids) == 300
    assert arrays.columns == objects.columns == ("obs_a", "obs_b", "obs_total")
    for field in ("experiment", "row", "column"):
        np.testing.assert_array_equal(getattr(arrays.placements, field), getattr(objects.placements, field))
    # every measurement row lies where its value is
    mt = arrays.petab_problem.measurement_df
    data = arrays.study.arrays.data
    pl = arrays.placements
    np.testing.assert_array_equal(data[pl.experiment, pl.row, pl.column], mt["measurement"].to_numpy(float))
    assert arrays.placement(5) == objects.placement(5)
    # a view is the objects' experiment
    for i in (0, 5, 13):
        view, obj = arrays.study.experiments[i], objects.study.experiments[i]
        np.testing.assert_array_equal(view.times, obj.times)
        np.testing.assert_array_equal(view.data, obj.data)
        assert view.conditions == obj.conditions and view.parameters == obj.parameters
        assert view.observable_parameters == obj.observable_parameters
    theta = arrays.nominal + np.linspace(-0.1, 0.1, arrays.nominal.size)
    va, ga = arrays.lower(solver=TIGHT).value_and_grad(theta)
    vo, go = objects.lower(solver=TIGHT).value_and_grad(theta)
    assert va == pytest.approx(vo, rel=1e-12)
    np.testing.assert_allclose(ga, go, rtol=1e-12, atol=1e-12 * np.abs(go).max())
    sim = arrays.simulation_table(theta, solver=TIGHT)
    pp = arrays.petab_problem
    at_theta = pp.parameter_df.copy()
    for name, value in arrays.inference_problem().parameter_values(theta).items():
        at_theta.loc[name, "nominalValue"] = value
    llh = petab.calculate_llh(pp.measurement_df, sim, pp.observable_df, at_theta)
    assert abs(llh + va) <= 1e-9 * abs(va), (llh, va)


def _set_row(table, index, **values):
    def edit(conditions, meas):
        rows = conditions if table == "conditions" else meas
        rows[index] = {**rows[index], **values}

    return edit


# (edit, error pattern): the rows the arrays' vectorized checks refuse, named by file, row and column
COHORT_ERRORS = [
    pytest.param(_set_row("measurements", 17, observableId="obs_b", noiseParameters="-0.1", observableParameters="2.0"),
                 r"measurements.tsv, row 18 \(line 19\), column 'noiseParameters': the noise of 'obs_b' is -0.1",
                 id="negative-noise"),
    pytest.param(_set_row("measurements", 23, observableId="obs_total", measurement=0.0),
                 r"measurements.tsv, row 24 \(line 25\), column 'measurement': 0.0 is not positive; the observable "
                 r"'obs_total' is log-transformed", id="log-of-zero"),
    pytest.param(_set_row("measurements", 29, observableId="obs_b", noiseParameters="sd_nope", observableParameters="2.0"),
                 r"measurements.tsv, row 30 \(line 31\), column 'noiseParameters': 'sd_nope' is not a parameter",
                 id="unknown-noise-parameter"),
    pytest.param(_set_row("conditions", 6, kin="kin_nope"),
                 r"conditions.tsv, row 7 \(line 8\), column 'kin': 'kin_nope' is not a parameter", id="unknown-mapping"),
]


@pytest.mark.parametrize("edit, pattern", COHORT_ERRORS)
def test_bad_rows_of_many_conditions_are_named_by_file_row_and_column(tmp_path, edit, pattern):
    yaml = _cohort_problem(tmp_path / "p", 40, edit)
    with pytest.raises(PetabError, match=pattern) as info:
        ds.petab.load(yaml, validate=False)
    assert info.value.row is not None and info.value.column is not None


def test_what_arrays_cannot_hold_goes_to_experiment_objects(tmp_path):
    """Two sets of observable parameters of one observable in one condition need two columns:
    Experiment objects (arrays=True says why)."""

    def edit(conditions, meas):
        first = next(i for i, m in enumerate(meas) if m["observableId"] == "obs_b" and m["simulationConditionId"] == "s4")
        meas[first] = {**meas[first], "observableParameters": "3.0"}

    yaml = _cohort_problem(tmp_path / "p", 12, edit)
    problem = ds.petab.load(yaml, validate=False)
    assert problem.study.arrays is None and problem.columns == ("obs_a", "obs_b", "obs_b/1", "obs_total")
    assert "'obs_b' has different observableParameters or noiseParameters within condition 's4'" in problem.objects_reason
    with pytest.raises(PetabError, match=r"problem.yaml: the study cannot be held as arrays \(arrays=True\): "
                                         r"observable 'obs_b' .* condition 's4' \(measurements.tsv, rows \d+ and \d+\)"):
        ds.petab.load(yaml, validate=False, arrays=True)


# -- gradients ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_gradients_by_adjoint_forward_and_extrapolated_central_differences_agree(tmp_path):
    """On the receptor problem (7 parameters; pre-equilibration, an estimated initial amount, an
    estimated sigma, observable parameters) at rtol 1e-12."""
    problem = ds.petab.load(_receptor_problem(tmp_path))
    solver = ds.inference.SolverOptions(rtol=1e-12, atol=1e-14, max_steps=200_000)
    theta = problem.nominal + np.linspace(-0.05, 0.05, problem.nominal.size)
    value_f, g_forward = problem.lower(solver=solver, gradient="forward").value_and_grad(theta)
    value_a, g_adjoint = problem.lower(solver=solver, gradient="adjoint").value_and_grad(theta)
    assert value_f == pytest.approx(value_a, rel=1e-13)
    lowered = problem.lower(solver=solver)
    fd = np.empty_like(theta)
    for i in range(theta.size):
        def central(h, i=i):
            e = np.zeros_like(theta)
            e[i] = h
            return (lowered.value(theta + e) - lowered.value(theta - e)) / (2 * h)

        h = 1e-3
        fd[i] = (4 * central(h / 2) - central(h)) / 3  # Richardson: O(h^4)
    scale = np.abs(g_forward).max()
    np.testing.assert_allclose(g_adjoint, g_forward, rtol=1e-5, atol=1e-5 * scale)
    np.testing.assert_allclose(fd, g_forward, rtol=1e-5, atol=1e-5 * scale)


# ------------------------------------------------------------------------------------------------
# errors and warnings
# ------------------------------------------------------------------------------------------------


def _copy(name, tmp_path) -> Path:
    folder = tmp_path / name
    shutil.copytree(DATA / name, folder)
    return folder


def _edit(path: Path, edit):
    df = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False)
    edit(df)
    df.to_csv(path, sep="\t", index=False)


BOEHM = "Boehm_JProteomeRes2014"


def _boehm_table(folder, kind):
    return folder / f"{kind}_{BOEHM}.tsv"


def _set(row, column, value):
    def edit(df):
        if column not in df.columns:
            df[column] = ""
        df.loc[row, column] = value

    return edit


# (table, edit, error pattern): each error names the file, the row and the column
TABLE_ERRORS = [
    pytest.param("measurementData", _set(4, "time", "-1"), r"measurementData_\S+, row 5 \(line 6\), column 'time'",
                 id="negative-time"),
    pytest.param("measurementData", _set(2, "observableId", "nope"), r"row 3 \(line 4\), column 'observableId'.*'nope'",
                 id="unknown-observable"),
    pytest.param("measurementData", _set(0, "noiseParameters", "sd_pSTAT5A_rel;2"),
                 r"row 1 \(line 2\), column 'noiseParameters': gives 2 value\(s\)", id="placeholder-count"),
    pytest.param("measurementData", _set(7, "measurement", "abc"), r"row 8 \(line 9\), column 'measurement'",
                 id="not-a-number"),
    pytest.param("parameters", _set(0, "objectivePriorType", "normal"),
                 r"parameters_\S+, row 1 \(line 2\), column 'objectivePriorType': .*priors are not supported",
                 id="objective-prior"),
    pytest.param("parameters", _set(1, "parameterScale", "ln"), r"row 2 \(line 3\), column 'parameterScale'",
                 id="bad-scale"),
    pytest.param("observables", _set(0, "noiseDistribution", "cauchy"),
                 r"observables_\S+, row 1 \(line 2\), column 'noiseDistribution': 'cauchy' is not supported",
                 id="unsupported-distribution"),
    pytest.param("observables", _set(1, "observableFormula", "STAT5A * unknown_thing"),
                 r"row 2 \(line 3\), column 'observableFormula': 'unknown_thing'", id="unknown-symbol"),
    pytest.param("observables", _set(2, "noiseFormula", "noiseParameter1_rSTAT5A_rel * STAT5A"),
                 r"row 3 \(line 4\), column 'noiseFormula': .*depends on the model's states", id="noise-of-states"),
    pytest.param("experimentalCondition", _set(0, "not_in_model", "1"),
                 r"experimentalCondition_\S+, row 1 \(line 2\), column 'not_in_model'", id="unknown-condition-column"),
]


@pytest.mark.parametrize("table, edit, pattern", TABLE_ERRORS)
def test_table_errors_name_the_file_row_and_column(tmp_path, table, edit, pattern):
    folder = _copy(BOEHM, tmp_path)
    _edit(_boehm_table(folder, table), edit)
    with pytest.raises(PetabError, match=pattern) as info:
        ds.petab.load(folder / f"{BOEHM}.yaml", validate=False)
    assert info.value.path.name.startswith(table) and info.value.column is not None and info.value.row is not None


def test_unknown_columns_are_ignored_with_a_warning(tmp_path):
    folder = _copy(BOEHM, tmp_path)
    _edit(_boehm_table(folder, "measurementData"), _set(0, "myNotes", "x"))
    with pytest.warns(PetabWarning, match=r"measurement table column\(s\) \['myNotes'\].*ignored"):
        problem = ds.petab.load(folder / f"{BOEHM}.yaml", validate=False)
    plain = ds.petab.load(DATA / BOEHM / f"{BOEHM}.yaml")
    assert problem.lower().value(problem.nominal) == plain.lower().value(plain.nominal)


def test_lint_errors_are_raised_naming_the_yaml_file(tmp_path):
    folder = _copy(BOEHM, tmp_path)
    # a parameter the problem never uses, estimated: the rows alone are fine, petab's lint is not
    _edit(_boehm_table(folder, "parameters"), lambda df: df.loc.__setitem__(
        len(df), ["unused", "", "lin", "0", "1", "0.5", "1"] + [""] * (len(df.columns) - 7)))
    with pytest.raises(PetabError, match=rf"{BOEHM}.yaml: petab.v1.lint_problem found errors"):
        ds.petab.load(folder / f"{BOEHM}.yaml")


def test_unsupported_problem_features_are_refused_clearly(tmp_path):
    folder = _copy(BOEHM, tmp_path)
    yaml = folder / f"{BOEHM}.yaml"
    text = yaml.read_text()
    yaml.write_text(text.replace("format_version: 1", "format_version: 2.0.0"))
    with pytest.raises(PetabError, match="format_version.*diffsoup reads PEtab v1"):
        ds.petab.load(yaml)
    yaml.write_text(text + "  mapping_files: [mapping.tsv]\n")
    with pytest.raises(PetabError, match="mapping tables are not supported"):
        ds.petab.load(yaml)
    # an SBML feature diffsoup does not import: the SBML error, as a PetabError on the model file
    model = _pulse_model()
    model.parameter("z", 1.0, constant=False)
    model.algebraic("z - X")
    problem = write_problem(tmp_path / "alg", model, conditions=[{"conditionId": "c"}],
                            observables=[{"observableId": "x", "observableFormula": "X", "noiseFormula": "1"}],
                            measurements=[_meas("x", "c", 1.0, 1.0)], parameters=[_par("kd", 0.7)])  # fmt: skip
    with pytest.raises(PetabError, match=r"model.xml: SBML algebraic rule .* not supported"):
        ds.petab.load(problem, validate=False)
    # events with pre-equilibration
    problem = write_problem(tmp_path / "ev", _pulse_model(), conditions=[{"conditionId": "c", "kp": 1.0},
                                                                        {"conditionId": "d", "kp": 0.0}],
                            observables=[{"observableId": "x", "observableFormula": "X", "noiseFormula": "1"}],
                            measurements=[_meas("x", "c", 1.0, 1.0, pre="d")], parameters=[_par("kd", 0.7)])  # fmt: skip
    with pytest.raises(PetabError, match="events with pre-equilibration are not supported"):
        ds.petab.load(problem, validate=False)


def test_initialization_priors_are_ignored_with_a_warning(tmp_path):
    folder = _copy(BOEHM, tmp_path)
    _edit(_boehm_table(folder, "parameters"), _set(0, "initializationPriorType", "normal"))
    _edit(_boehm_table(folder, "parameters"), _set(0, "initializationPriorParameters", "0;1"))
    with pytest.warns(PetabWarning, match="initialization prior of 'Epo_degradation_BaF3' is ignored"):
        ds.petab.load(folder / f"{BOEHM}.yaml", validate=False)


# ------------------------------------------------------------------------------------------------
# the command line
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_command_checks_simulates_and_fits_a_petab_problem(tmp_path, capsys):
    from diffsoup.cli import main

    yaml = _receptor_problem(tmp_path)
    assert main(["check", str(yaml)]) == 0
    out = capsys.readouterr().out
    assert "PEtab v1" in out and "experiments: 3" in out and "parameters: 7 (7 estimated)" in out
    sim = tmp_path / "sim"
    assert main(["simulate", str(yaml), "-o", str(sim), "--no-plots"]) == 0
    summary = json.loads((sim / "summary.json").read_text())
    assert summary["experiment_status"] == {"SUCCESS": 3}
    table = petab.get_simulation_df(sim / "simulation.tsv")
    problem = ds.petab.load(yaml)
    expected = problem.simulation_table()
    np.testing.assert_allclose(table["simulation"], expected["simulation"], rtol=1e-10)
    fit = tmp_path / "fit"
    assert main(["fit", str(yaml), "-o", str(fit), "--in-process", "--starts", "1", "--max-nfev", "3",
                 "--no-plots"]) == 0  # fmt: skip
    # The noise level sd_total, the spread of its cells alone, is optimized analytically by default.
    assert "[diffsoup] optimized analytically at each evaluation: sd_total" in capsys.readouterr().out
    summary = json.loads((fit / "summary.json").read_text())
    assert set(summary["parameters"]) == set(problem.theta_names)
    assert summary["analytic"] == ["sd_total"]
    import zarr

    assert zarr.open_group(str(fit / "results.zarr"), mode="r").attrs["analytic"] == ["sd_total"]
    assert (fit / "results.zarr").exists() and (fit / "simulation.tsv").exists()


def test_restricted_lowerings_sum_to_the_whole_study():
    """A lowered study restricted to each experiment (what a distributed shard evaluates) keeps
    its share of the constant offset, with one noise model per observable column and spreads
    per measurement: the parts add up to the whole."""
    problem = _load("Bruno_JExpBot2016")
    lowered = problem.lower()
    theta = problem.nominal
    whole = lowered.value(theta)
    parts = [lowered.restrict([i]).value(theta) for i in range(len(problem.study.experiments))]
    assert len(parts) > 1
    np.testing.assert_allclose(sum(parts), whole, rtol=1e-12)
