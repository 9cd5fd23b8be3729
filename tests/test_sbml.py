"""SBML import (diffsoup.formats._sbml): synthetic models against closed forms and scipy, math
against libsbml's own evaluator, the five PEtab benchmark models against libsbml evaluations and
the collection's simulated data, refusals of what is unsupported, and the code cache."""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

libsbml = pytest.importorskip("libsbml")
sympy = pytest.importorskip("sympy")

import diffsoup as ds  # noqa: E402
from diffsoup.formats._sbml import load_sbml  # noqa: E402
from diffsoup.formats._sbml_error import SBMLError  # noqa: E402

DATA = Path(__file__).parent / "data" / "petab"
MODELS = ["Boehm_JProteomeRes2014", "Bruno_JExpBot2016", "Fujita_SciSignal2010", "Brannmark_JBC2010", "Weber_BMC2015"]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Each test writes its generated code to its own cache (tests stay independent)."""
    monkeypatch.setenv("DIFFSOUP_CACHE_DIR", str(tmp_path / "cache"))


# ------------------------------------------------------------------------------------------------
# building SBML documents with libsbml's API
# ------------------------------------------------------------------------------------------------


def _check(code):
    assert code == libsbml.LIBSBML_OPERATION_SUCCESS, libsbml.OperationReturnValue_toString(code)


def _math(formula):
    node = libsbml.parseL3Formula(formula)
    assert node is not None, libsbml.getLastParseL3Error()
    return node


class Doc:
    """A small SBML Level 3 document built through libsbml."""

    def __init__(self, level=3, version=2):
        self.doc = libsbml.SBMLDocument(level, version)
        self.m = self.doc.createModel()
        self.m.setId("m")

    def compartment(self, cid, size, constant=True):
        c = self.m.createCompartment()
        _check(c.setId(cid))
        c.setSize(size)
        c.setConstant(constant)
        c.setSpatialDimensions(3)
        return c

    def species(self, sid, comp, *, conc=None, amount=None, hosu=False, boundary=False, constant=False):
        s = self.m.createSpecies()
        _check(s.setId(sid))
        s.setCompartment(comp)
        if conc is not None:
            s.setInitialConcentration(conc)
        if amount is not None:
            s.setInitialAmount(amount)
        s.setHasOnlySubstanceUnits(hosu)
        s.setBoundaryCondition(boundary)
        s.setConstant(constant)
        return s

    def parameter(self, pid, value=None, constant=True):
        p = self.m.createParameter()
        _check(p.setId(pid))
        if value is not None:
            p.setValue(value)
        p.setConstant(constant)
        return p

    def reaction(self, rid, reactants, products, formula, local=None, modifiers=()):
        r = self.m.createReaction()
        _check(r.setId(rid))
        r.setReversible(False)
        for refs, create in ((reactants, r.createReactant), (products, r.createProduct)):
            for sid, nu in refs.items():
                sr = create()
                sr.setSpecies(sid)
                sr.setStoichiometry(nu)
                sr.setConstant(True)
        for sid in modifiers:
            r.createModifier().setSpecies(sid)
        kl = r.createKineticLaw()
        for pid, value in (local or {}).items():
            lp = kl.createLocalParameter()
            lp.setId(pid)
            lp.setValue(value)
        _check(kl.setMath(_math(formula)))
        return r

    def assignment_rule(self, var, formula):
        rule = self.m.createAssignmentRule()
        rule.setVariable(var)
        _check(rule.setMath(_math(formula)))

    def rate_rule(self, var, formula):
        rule = self.m.createRateRule()
        rule.setVariable(var)
        _check(rule.setMath(_math(formula)))

    def initial_assignment(self, var, formula):
        ia = self.m.createInitialAssignment()
        ia.setSymbol(var)
        _check(ia.setMath(_math(formula)))

    def function(self, fid, formula):
        fd = self.m.createFunctionDefinition()
        fd.setId(fid)
        _check(fd.setMath(_math(formula)))

    def event(self, eid, trigger, assignments, *, initial_value=True):
        e = self.m.createEvent()
        if eid:
            e.setId(eid)
        e.setUseValuesFromTriggerTime(True)
        t = e.createTrigger()
        t.setInitialValue(initial_value)
        t.setPersistent(True)
        _check(t.setMath(_math(trigger)))
        for var, formula in assignments.items():
            ea = e.createEventAssignment()
            ea.setVariable(var)
            _check(ea.setMath(_math(formula)))
        return e

    def load(self):
        return load_sbml(self.doc)


def _simulate(model, times, params=None, *, y0=None, rtol=1e-10, atol=1e-12, discontinuities=()):
    problem = model.spec.build()
    p = model.parameter_vector(params)
    y0 = np.asarray(model.y0(p)) if y0 is None else y0
    sol = ds.simulate(problem, y0, np.asarray(times, float), p, rtol=rtol, atol=atol, discontinuities=discontinuities)
    return np.asarray(sol.ys)


# ------------------------------------------------------------------------------------------------
# synthetic models
# ------------------------------------------------------------------------------------------------


def test_decay_of_concentration_species_in_a_compartment_of_volume_v():
    """A -> B with rate k*A (amount per time) in volume V: d[A]/dt = -k [A] / V."""
    d = Doc()
    d.compartment("c", 2.5)
    d.species("A", "c", conc=3.0)
    d.species("B", "c", conc=0.5)
    d.parameter("k", 0.8)
    d.reaction("R", {"A": 1}, {"B": 1}, "k * A")
    model = d.load()
    assert model.state_ids == ("A", "B")
    assert model.parameter_ids == ("k", "c")
    np.testing.assert_allclose(model.spec.y0, [3.0, 0.5])
    times = np.array([0.5, 1.0, 3.0, 7.0])
    ys = _simulate(model, times)
    a = 3.0 * np.exp(-0.8 * times / 2.5)
    np.testing.assert_allclose(ys[:, 0], a, rtol=1e-8)
    np.testing.assert_allclose(ys[:, 1], 3.5 - a, rtol=1e-8)
    # The compartment size is a parameter: a condition can change it.
    ys4 = _simulate(model, times, {"c": 4.0})
    np.testing.assert_allclose(ys4[:, 0], 3.0 * np.exp(-0.8 * times / 4.0), rtol=1e-8)


def test_amount_species_and_initial_amounts_converted_by_the_compartment_size():
    d = Doc()
    d.compartment("c", 4.0)
    d.species("N", "c", conc=0.5, hosu=True)  # amount 0.5 * 4 = 2
    d.species("C", "c", amount=6.0)  # concentration 6 / 4 = 1.5
    d.species("P", "c", amount=0.0, hosu=True)
    d.parameter("k", 0.3)
    d.reaction("R1", {"N": 1}, {"P": 2}, "k * N")  # amount rate: dN/dt = -k N, dP/dt = 2 k N
    d.reaction("R2", {"C": 1}, {}, "k * C * c")  # amount rate k [C] V: d[C]/dt = -k [C]
    model = d.load()
    assert model.species["N"].only_substance_units and not model.species["C"].only_substance_units
    assert model.species["C"].initial == "amount"
    np.testing.assert_allclose(model.spec.y0, [2.0, 1.5, 0.0])
    times = np.array([1.0, 2.0, 5.0])
    ys = _simulate(model, times)
    np.testing.assert_allclose(ys[:, 0], 2.0 * np.exp(-0.3 * times), rtol=1e-8)
    np.testing.assert_allclose(ys[:, 1], 1.5 * np.exp(-0.3 * times), rtol=1e-8)
    np.testing.assert_allclose(ys[:, 2], 2 * (2.0 - 2.0 * np.exp(-0.3 * times)), rtol=1e-8)


def test_assignment_rules_in_kinetic_laws_and_as_derived_values():
    """keff = k1 * k2 (chained through kk = 2 * keff) and a boundary species S = 2 time set by a
    rule: dA/dt = -kk S A, so A = A0 exp(-2 keff t^2)."""
    d = Doc()
    d.compartment("c", 1.0)
    d.species("A", "c", conc=2.0)
    d.species("S", "c", conc=0.0, boundary=True)
    d.parameter("k1", 0.5)
    d.parameter("k2", 0.6)
    d.parameter("keff", constant=False)
    d.parameter("kk", constant=False)
    d.assignment_rule("kk", "2 * keff")
    d.assignment_rule("keff", "k1 * k2")
    d.assignment_rule("S", "time / 2")
    d.reaction("R", {"A": 1}, {}, "kk * S * A", modifiers=["S"])
    model = d.load()
    assert model.state_ids == ("A",)
    assert set(model.derived_ids) == {"S", "keff", "kk"}
    assert set(model.parameter_ids) == {"k1", "k2", "c"}
    assert model.species["S"].initial == "assignment_rule" and not model.species["S"].state
    p = model.parameter_vector()
    values = model.values(3.0, jnp.array([1.0]), p)
    assert float(values["keff"]) == pytest.approx(0.3) and float(values["kk"]) == pytest.approx(0.6)
    assert float(values["S"]) == pytest.approx(1.5)
    times = np.array([0.5, 1.0, 2.0])
    ys = _simulate(model, times)
    np.testing.assert_allclose(ys[:, 0], 2.0 * np.exp(-0.6 * times**2 / 4), rtol=1e-8)
    # The sympy view resolves the chain into the parameters.
    assert sympy.simplify(model.expressions.derived["kk"] - 2 * sympy.Symbol("k1", real=True) * sympy.Symbol("k2", real=True)) == 0


def test_rate_rules_on_a_parameter_a_species_and_a_growing_compartment():
    """x' = -a x (a parameter with a rate rule), B' = x (a boundary species with a rate rule),
    V' = g V: the concentration [S] of a reaction-free species dilutes, [S] = S0 exp(-g t)."""
    d = Doc()
    d.compartment("V", 2.0, constant=False)
    d.species("S", "V", conc=3.0)
    d.species("B", "V", conc=1.0, boundary=True)
    d.species("D", "V", conc=1.0)
    d.parameter("x", 4.0, constant=False)
    d.parameter("a", 0.7)
    d.parameter("g", 0.2)
    d.parameter("k", 0.5)
    d.rate_rule("x", "-a * x")
    d.rate_rule("B", "x")
    d.rate_rule("V", "g * V")
    d.reaction("R", {"D": 1}, {}, "k * D * V")  # d[D]/dt = -k [D] - g [D]
    model = d.load()
    assert model.state_ids == ("S", "B", "D", "V", "x")
    assert "V" not in model.parameter_ids and "x" not in model.parameter_ids
    times = np.array([0.5, 1.0, 2.5])
    ys = _simulate(model, times)
    np.testing.assert_allclose(ys[:, 0], 3.0 * np.exp(-0.2 * times), rtol=1e-8)
    np.testing.assert_allclose(ys[:, 4], 4.0 * np.exp(-0.7 * times), rtol=1e-8)
    np.testing.assert_allclose(ys[:, 1], 1.0 + 4.0 / 0.7 * (1 - np.exp(-0.7 * times)), rtol=1e-8)
    np.testing.assert_allclose(ys[:, 3], 2.0 * np.exp(0.2 * times), rtol=1e-8)
    np.testing.assert_allclose(ys[:, 2], np.exp(-0.7 * times), rtol=1e-8)


def test_initial_assignments_make_the_initial_state_a_function_of_the_parameters():
    d = Doc()
    d.compartment("c", 2.0)
    d.species("A", "c", conc=1.0)
    d.species("B", "c", amount=1.0)
    d.parameter("a", 3.0)
    d.parameter("b", 0.5)
    d.parameter("k", 0.2)
    d.parameter("k3", 0.0)  # constant, set by its initial assignment: a derived value, not a parameter
    d.initial_assignment("A", "2 * a + b")
    d.initial_assignment("B", "A * c")  # a concentration: amount A*c / size c ... of value A * c
    d.initial_assignment("k3", "3 * k")
    d.reaction("R", {"A": 1}, {}, "k3 * A * c")
    model = d.load()
    assert model.parameter_ids == ("a", "b", "k", "c")
    assert model.derived_ids == ("k3",)
    np.testing.assert_allclose(model.spec.y0, [6.5, 13.0])
    y0 = jax.jit(model.y0)(model.parameter_vector({"a": 1.0, "b": 2.0, "c": 5.0}))
    np.testing.assert_allclose(y0, [4.0, 20.0])
    grad = jax.grad(lambda p: model.y0(p)[1])(model.parameter_vector())
    np.testing.assert_allclose(grad, [4.0, 2.0, 0.0, 6.5])  # d(c (2a + b))/d(a, b, k, c)
    ys = _simulate(model, [1.0, 2.0], {"a": 1.0, "b": 2.0})
    np.testing.assert_allclose(ys[:, 0], 4.0 * np.exp(-0.6 * np.array([1.0, 2.0])), rtol=1e-8)
    ex = model.expressions
    a, b, c = (sympy.Symbol(s, real=True) for s in "abc")
    assert sympy.simplify(ex.initial["B"] - (2 * a + b) * c) == 0


def test_function_definitions_are_inlined():
    d = Doc()
    d.compartment("c", 1.0)
    d.species("A", "c", conc=2.0)
    d.species("E", "c", conc=0.4)
    d.parameter("vmax", 1.5)
    d.parameter("km", 0.7)
    d.function("mm", "lambda(s, v, k, v * s / (k + s))")
    d.function("scaled", "lambda(x, e, e * mm(x, 1, 0.5))")
    d.reaction("R", {"A": 1}, {}, "mm(A, vmax, km) + scaled(A, E) + local_k * A", local={"local_k": 0.25},
               modifiers=["E"])  # fmt: skip
    model = d.load()
    rng = np.random.default_rng(0)
    p = model.parameter_vector()
    for _ in range(3):
        y = rng.uniform(0.1, 3.0, 2)
        expected = -(1.5 * y[0] / (0.7 + y[0]) + y[1] * y[0] / (0.5 + y[0]) + 0.25 * y[0])
        np.testing.assert_allclose(model.rhs(0.0, y, p), [expected, 0.0], rtol=1e-14)


def test_piecewise_in_time_matches_scipy_of_a_hand_written_rhs():
    from scipy.integrate import solve_ivp

    d = Doc()
    d.compartment("c", 1.0)
    d.species("A", "c", conc=1.0)
    d.species("B", "c", conc=0.0)
    d.parameter("k1", 0.4)
    d.parameter("k2", 1.3)
    d.parameter("ton", 2.0)
    d.parameter("u", constant=False)
    d.assignment_rule("u", "piecewise(0, time < ton, piecewise(2, time <= 5 && B < 100, 1))")
    d.reaction("R1", {"A": 1}, {"B": 1}, "piecewise(k1, time < 3, k2) * A")
    d.reaction("R2", {}, {"A": 1}, "u")
    model = d.load()
    p = model.parameter_vector()
    switches = sorted(np.asarray(model.discontinuities(p)).tolist())
    assert switches == [2.0, 3.0, 5.0]
    assert model.switches_on_states  # B < 100 is a switch on a state

    def rhs(t, y):
        k = 0.4 if t < 3 else 1.3
        u = 0.0 if t < 2 else (2.0 if t <= 5 else 1.0)
        return [-k * y[0] + u, k * y[0]]

    times = np.array([1.0, 2.0, 2.5, 3.0, 4.0, 5.0, 6.5])
    ref, y, t0 = [], [1.0, 0.0], 0.0
    for t1 in (2.0, 3.0, 5.0, 6.5):  # integrate piece by piece: scipy does not land on switches
        sol = solve_ivp(rhs, (t0, t1), y, method="DOP853", rtol=1e-13, atol=1e-14, dense_output=True)
        ref += [sol.sol(t) for t in times if t0 < t <= t1]
        y, t0 = sol.y[:, -1], t1
    ys = _simulate(model, times, discontinuities=switches)
    np.testing.assert_allclose(ys, np.array(ref), rtol=1e-8, atol=1e-10)


def test_time_triggered_events_come_back_as_data_with_a_reset():
    d = Doc()
    d.compartment("c", 1.0)
    d.species("A", "c", conc=1.0)
    d.parameter("k", 0.5, constant=False)  # an event assigns it: a state
    d.parameter("te", 2.0)
    d.parameter("dose", 3.0)
    d.reaction("R", {"A": 1}, {}, "k * A")
    d.event("bolus", "time >= te + 1", {"A": "A + dose", "k": "2 * k"})
    d.event("late", "gt(time, 10)", {"A": "0"}, initial_value=False)
    d.event("", "lt(2 * te, time)", {"k": "k / 4"})
    model = d.load()
    assert model.state_ids == ("A", "k")
    assert model.parameter_ids == ("te", "dose", "c")
    bolus, late, third = model.events
    assert (bolus.id, bolus.targets, bolus.strict, bolus.time_parameters) == ("bolus", ("A", "k"), False, ("te",))
    assert (late.targets, late.strict, late.initial_value, late.time_parameters) == (("A",), True, False, ())
    assert third.id == "event#2" and third.strict and third.targets == ("k",)
    p = model.parameter_vector()
    assert float(bolus.time(p)) == 3.0 and float(late.time(p)) == 10.0 and float(third.time(p)) == 4.0
    assert float(bolus.time(model.parameter_vector({"te": 5.0}))) == 6.0
    np.testing.assert_allclose(bolus.reset(3.0, jnp.array([0.4, 0.5]), p), [3.4, 1.0])
    np.testing.assert_allclose(model.event_times(p), [3.0, 10.0, 4.0])
    ex = model.expressions.events[0]
    assert ex.time == sympy.Symbol("te", real=True) + 1
    # What a simulator does with them: solve to the event, reset, go on; against the closed form.
    problem = model.spec.build()
    y = np.asarray(model.y0(p))
    first = np.asarray(ds.simulate(problem, y, [1.0, 3.0], p, rtol=1e-10, atol=1e-12).ys)
    y = np.asarray(bolus.reset(3.0, first[-1], p))
    second = np.asarray(ds.simulate(problem, y, [3.5, 4.0], p, t0=3.0, rtol=1e-10, atol=1e-12).ys)
    a3 = math.exp(-1.5)
    np.testing.assert_allclose(first[:, 0], [math.exp(-0.5), a3], rtol=1e-8)
    np.testing.assert_allclose(second[:, 0], (a3 + 3.0) * np.exp(-1.0 * np.array([0.5, 1.0])), rtol=1e-8)


@pytest.mark.parametrize("level", [2, 3])
def test_stoichiometry_set_by_parameters(level):
    """Level 2 stoichiometryMath and a Level 3 species reference with an initial assignment:
    A -> nu B with nu = 2 n, so B(t) = 2 n (A0 - A(t))."""
    d = Doc(*((2, 4) if level == 2 else (3, 2)))
    d.compartment("c", 1.0)
    d.species("A", "c", conc=1.0)
    d.species("B", "c", conc=0.0)
    d.parameter("n", 1.5)
    d.parameter("k", 0.4)
    r = d.reaction("R", {"A": 1}, {"B": 1}, "k * A")
    if level == 2:
        _check(r.getProduct(0).createStoichiometryMath().setMath(_math("2 * n")))
    else:
        r.getProduct(0).setId("nu")
        d.initial_assignment("nu", "2 * n")
    model = d.load()
    p = model.parameter_vector({"n": 2.0})
    np.testing.assert_allclose(model.rhs(0.0, jnp.array([0.5, 0.0]), p), [-0.2, 0.8], rtol=1e-15)


def test_math_agrees_with_libsbmls_own_evaluator():
    formulas = [
        "max(a, 2, b)", "min(a, b)", "log10(a)", "ln(b)", "log(2, b)", "root(3, a)", "sqrt(a)", "exp(a) / b",
        "piecewise(1, a > 1 && b > 1, 2)", "piecewise(3, xor(a > 1, b > 1), 4)", "piecewise(5, !(a > 1), 6)",
        "piecewise(1, implies(a > 1, b > 1), 0)", "piecewise(a, lt(0, a, 1), b)", "piecewise(7, a >= 1 || b <= 3, 8)",
        "piecewise(a, eq(a, b), b)", "piecewise(1, neq(a, b), 0)", "exponentiale ^ a", "pi * a", "ceil(b)", "floor(b)",
        "factorial(3)", "abs(-a)", "sin(a) + cos(b) + tan(a)", "sec(a) + csc(a) + cot(a)", "sinh(a) + cosh(a) + tanh(a)",
        "sech(a) + csch(a) + coth(a)", "arcsin(a) + arccos(a) + arctan(b)", "arcsec(b) + arccsc(b) + arccot(a)",
        "arcsinh(a) + arccosh(b) + arctanh(a)", "arcsech(a) + arccsch(b) + arccoth(b)", "a ^ b", "b ^ -2", "1 / 3 * a",
        "avogadro * 1e-23", "piecewise(1, true, 0) + piecewise(0, false, 2)", "-a - -b", "2.5e-3 * b",
        "piecewise(time + 1, time < 1, 0)",
    ]  # fmt: skip
    d = Doc()
    d.compartment("c", 1.0)
    d.species("S", "c", conc=1.0)
    d.parameter("a", 0.7)
    d.parameter("b", 2.3)
    for i, f in enumerate(formulas):
        d.parameter(f"r{i}", constant=False)
        d.assignment_rule(f"r{i}", f)
    model = d.load()
    p = model.parameter_vector()
    got = np.asarray(model.derived(0.0, jnp.array([1.0]), p))
    # libsbml 5.21's evaluator swaps base and argument of a two-argument log (MathML
    # <log><logbase>2</logbase> b</log> is log2(b)): that one is checked by hand.
    by_hand = {"log(2, b)": math.log2(2.3)}
    for i, f in enumerate(formulas):
        libsbml.SBMLTransforms.clearComponentValues(d.m)
        expected = by_hand.get(f, libsbml.SBMLTransforms.evaluateASTNode(_math(f), d.m))
        assert model.derived_ids[i] == f"r{i}"
        assert got[i] == pytest.approx(expected, rel=1e-13, abs=1e-15), f


# ------------------------------------------------------------------------------------------------
# refusals
# ------------------------------------------------------------------------------------------------


def _base(level=3, version=2):
    d = Doc(level, version)
    d.compartment("c", 1.0)
    d.species("A", "c", conc=1.0)
    d.parameter("k", 0.5)
    return d


def _algebraic(d):
    rule = d.m.createAlgebraicRule()
    rule.setMath(_math("A - k"))


def _state_event(d):
    d.reaction("R", {"A": 1}, {}, "k * A")
    d.event("low", "A < 0.5", {"A": "1"})


def _delayed_event(d):
    e = d.event("later", "time >= 1", {"A": "1"})
    _check(e.createDelay().setMath(_math("2")))


def _priorities(d):
    e = d.event("first", "time >= 1", {"A": "1"})
    _check(e.createPriority().setMath(_math("1")))
    d.event("second", "time >= 1", {"A": "2"})


def _delay_math(d):
    d.reaction("R", {"A": 1}, {}, "k * delay(A, 1)")


def _fast(d):
    d.reaction("R", {"A": 1}, {}, "k * A").setFast(True)


def _no_kinetic_law(d):
    r = d.m.createReaction()
    r.setId("R")
    sr = r.createReactant()
    sr.setSpecies("A")
    sr.setConstant(True)


def _rule_on_reacting_species(d):
    d.species("B", "c", conc=0.0)
    d.reaction("R", {"A": 1}, {"B": 1}, "k * A")
    d.assignment_rule("B", "2 * time")


def _rate_of(d):
    d.reaction("R", {"A": 1}, {}, "rateOf(A)")


def _unknown_function(d):
    d.reaction("R", {"A": 1}, {}, "hill(A, k)")


def _time_id(d):
    d.parameter("time", 1.0)


def _shrinking_compartment(d):
    d.m.getCompartment("c").setConstant(False)
    d.assignment_rule("c", "1 + time")
    d.reaction("R", {"A": 1}, {}, "k * A")


def _variable_stoichiometry(d):
    r = d.reaction("R", {"A": 1}, {}, "k * A")
    r.getReactant(0).setId("nu")
    r.getReactant(0).setConstant(False)
    d.assignment_rule("nu", "1 + time")


def _conversion_factor(d):
    d.m.getSpecies("A").setConversionFactor("k")


def _event_on_volume(d):
    d.m.getCompartment("c").setConstant(False)
    d.event("grow", "time >= 1", {"c": "2"})


def _cyclic_rules(d):
    d.parameter("x", constant=False)
    d.parameter("z", constant=False)
    d.assignment_rule("x", "z + 1")
    d.assignment_rule("z", "2 * x")
    d.reaction("R", {"A": 1}, {}, "x * A")


def _stoichiometry_of_states(d):
    r = d.reaction("R", {"A": 1}, {}, "k * A")
    _check(r.getReactant(0).createStoichiometryMath().setMath(_math("A")))


def _unknown_name(d):
    d.reaction("R", {"A": 1}, {}, "k * A * ghost")


REFUSALS = {
    "algebraic rule": (_algebraic, "algebraic rule"),
    "state-triggered event": (_state_event, r"event 'low'.*state-triggered"),
    "event delay": (_delayed_event, r"event 'later'.*delay"),
    "event priorities": (_priorities, r"event 'first'.*priorit"),
    "delay function": (_delay_math, r"reaction 'R'.*delay"),
    "fast reaction": (_fast, r"reaction 'R'.*fast"),
    "no kinetic law": (_no_kinetic_law, r"reaction 'R'.*no kinetic law"),
    "rule on a reacting species": (_rule_on_reacting_species, r"species 'B'.*assignment rule.*boundaryCondition"),
    "rateOf": (_rate_of, r"reaction 'R'.*rateOf"),
    "unknown function": (_unknown_function, r"reaction 'R'.*'hill'"),
    "id time": (_time_id, r"'time'"),
    "compartment resized by a rule": (_shrinking_compartment, r"compartment 'c'.*assignment rule"),
    "variable stoichiometry": (_variable_stoichiometry, r"species reference 'nu'.*stoichiometry"),
    "conversion factor": (_conversion_factor, r"species 'A'.*conversion factor"),
    "event on a compartment of concentrations": (_event_on_volume, r"event 'grow'.*compartment 'c'"),
    "unknown identifier": (_unknown_name, r"reaction 'R'.*'ghost'"),
    "cyclic assignment rules": (_cyclic_rules, r"(x -> z -> x|z -> x -> z) form a cycle"),
    "stoichiometry varying with states": (_stoichiometry_of_states, r"reaction 'R'.*stoichiometry of 'A' varies"),
}


@pytest.mark.parametrize("feature", list(REFUSALS))
def test_unsupported_features_raise_sbml_errors_naming_the_element(feature):
    build, message = REFUSALS[feature]
    d = _base(*{_fast: (3, 1), _stoichiometry_of_states: (2, 4)}.get(build, (3, 2)))
    build(d)
    with pytest.raises(SBMLError, match=message):
        d.load()


def test_sbml_error_is_a_value_error_and_read_errors_are_reported(tmp_path):
    assert issubclass(SBMLError, ValueError)
    with pytest.raises(SBMLError, match="libsbml found"):
        load_sbml("<sbml><model><listOfSpecies><species/></listOfSpecies></model></sbml>")
    with pytest.raises(FileNotFoundError):
        load_sbml(tmp_path / "missing.xml")


# ------------------------------------------------------------------------------------------------
# the cache
# ------------------------------------------------------------------------------------------------


def test_second_load_comes_from_the_disk_cache(tmp_path):
    path = DATA / "Boehm_JProteomeRes2014" / "model_Boehm_JProteomeRes2014.xml"
    first = load_sbml(path, cache_dir=tmp_path)
    second = load_sbml(path, cache_dir=tmp_path)
    assert not first.from_cache and second.from_cache
    assert second.source == first.source and second.state_ids == first.state_ids
    assert list(second.spec.y0) == list(first.spec.y0)
    p = first.parameter_vector()
    y = jnp.linspace(1.0, 2.0, len(first.state_ids))
    np.testing.assert_array_equal(second.rhs(1.0, y, p), first.rhs(1.0, y, p))
    # The sympy view is rebuilt from the SBML on demand.
    assert second.expressions.rates == first.expressions.rates
    # A damaged entry is regenerated; no cache at all works too.
    (entry,) = (tmp_path / "sbml").glob("*.json")
    entry.write_text("{not json")
    third = load_sbml(path, cache_dir=tmp_path)
    assert not third.from_cache and third.source == first.source
    assert not load_sbml(path, cache=False, cache_dir=tmp_path / "unused").from_cache
    assert not (tmp_path / "unused").exists()


def test_a_cached_load_imports_neither_sympy_nor_libsbml(tmp_path):
    import os
    import subprocess
    import sys
    import textwrap

    path = DATA / "Bruno_JExpBot2016" / "model_Bruno_JExpBot2016.xml"
    code = textwrap.dedent(f"""
        import sys
        from diffsoup.formats._sbml import load_sbml
        model = load_sbml({str(path)!r})
        print(model.from_cache, "sympy" in sys.modules, "libsbml" in sys.modules)
    """)
    env = dict(os.environ, DIFFSOUP_CACHE_DIR=str(tmp_path))
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]  # fmt: skip
    assert [r.stdout.split() for r in runs] == [["False", "True", "True"], ["True", "False", "False"]], runs[-1].stderr


# ------------------------------------------------------------------------------------------------
# the five benchmark models
# ------------------------------------------------------------------------------------------------


def _nominal(name):
    petab = pytest.importorskip("petab.v1")

    problem = petab.Problem.from_yaml(DATA / name / f"{name}.yaml")
    return problem, {k: float(v) for k, v in problem.parameter_df["nominalValue"].items()}


def _condition_values(problem, nominal, model, condition):
    """Model parameters at the nominal point with a condition's overrides."""
    values = {k: v for k, v in nominal.items() if k in model.parameter_ids}
    for k, v in problem.condition_df.loc[condition].items():
        if k == "conditionName":
            continue
        values[k] = nominal[v] if isinstance(v, str) and v in nominal else float(v)
    return values


def _libsbml_reference(path, values, y):
    """d/dt and initial values of the species from libsbml's own evaluator: parameters set to
    ``values``, species to ``y`` (their SBML units), assignment rules evaluated at time 0 in
    order, d/dt = sum(stoichiometry * kinetic law) / compartment size for concentrations."""
    doc = libsbml.readSBMLFromFile(str(path))
    m = doc.getModel()

    def evaluate(math, model):  # libsbml caches the model's values: forget them first
        libsbml.SBMLTransforms.clearComponentValues(model)
        return libsbml.SBMLTransforms.evaluateASTNode(math, model)

    for k, v in values.items():
        if m.getParameter(k) is not None:
            m.getParameter(k).setValue(v)
        else:
            m.getCompartment(k).setSize(v)
    initial = {}
    for s in m.getListOfSpecies():
        ia = m.getInitialAssignment(s.getId())
        initial[s.getId()] = evaluate(ia.getMath(), m) if ia is not None else s.getInitialConcentration()
    species = [s.getId() for s in m.getListOfSpecies()]
    for sid, v in zip(species, y):
        m.removeInitialAssignment(sid)
        m.getSpecies(sid).setInitialConcentration(float(v))
    for _ in range(m.getNumRules()):  # enough passes for chains of rules
        for rule in m.getListOfRules():
            target = m.getParameter(rule.getVariable())
            target.setValue(evaluate(rule.getMath(), m))
    dydt, size = dict.fromkeys(species, 0.0), dict.fromkeys(species, 0.0)
    for r in m.getListOfReactions():
        rate = evaluate(r.getKineticLaw().getMath(), m)
        for sign, refs in ((-1, r.getListOfReactants()), (1, r.getListOfProducts())):
            for sr in refs:
                s = m.getSpecies(sr.getSpecies())
                assert not s.getHasOnlySubstanceUnits() and not s.getBoundaryCondition()
                term = sign * sr.getStoichiometry() * rate / m.getCompartment(s.getCompartment()).getSize()
                dydt[s.getId()] += term
                size[s.getId()] += abs(term)
    return tuple(np.array([table[s] for s in species]) for table in (dydt, size, initial))


@pytest.mark.parametrize("name", MODELS)
def test_benchmark_model_matches_libsbml_evaluation_and_petab_listing(name):
    SbmlModel = pytest.importorskip("petab.v1.models.sbml_model").SbmlModel

    path = DATA / name / f"model_{name}.xml"
    model = load_sbml(path)
    assert model.id == name and model.spec.name == name  # the model's id before the file's stem
    listing = SbmlModel.from_file(path)
    species = [s.getId() for s in listing.sbml_model.getListOfSpecies()]
    assert list(model.state_ids) == species  # none of the five has rules on species or parameters
    compartments = [c.getId() for c in listing.sbml_model.getListOfCompartments()]
    free = [k for k, _ in listing.get_free_parameter_ids_with_values()]
    assert list(model.parameter_ids) == free + compartments
    rules = [r.getVariable() for r in listing.sbml_model.getListOfRules()]
    assert set(model.derived_ids) == set(rules)

    problem, nominal = _nominal(name)
    values = {k: v for k, v in nominal.items() if k in model.parameter_ids}
    p = model.parameter_vector(values)
    y0 = np.asarray(model.y0(p))
    rng = np.random.default_rng(1)
    for y in (y0, y0 * rng.uniform(0.5, 1.5, y0.shape) + rng.uniform(0.0, 1.0, y0.shape)):
        ref, terms, ref_y0 = _libsbml_reference(path, values, y)
        np.testing.assert_allclose(y0, ref_y0, rtol=1e-14)
        got = np.asarray(jax.jit(model.rhs)(0.0, jnp.asarray(y), p))
        # Each d/dt to rounding of the sum of its terms' sizes (at a steady state the sum cancels).
        np.testing.assert_array_less(np.abs(got - ref), 1e-12 * terms + 1e-300)
    assert np.any(np.abs(ref) > 1e-3 * terms)  # the random state is no steady state
    # The ProblemSpec evaluates the same right-hand side from parameters by name.
    by_name = dict(zip(model.parameter_ids, p))
    np.testing.assert_allclose(model.spec.rhs(0.0, jnp.asarray(y0), by_name), model.rhs(0.0, y0, p), rtol=1e-15)


def test_jax_function_compiles_formulas_over_the_models_symbols():
    """What a PEtab loader does with an observable formula: sympy over the model's ids, compiled
    to JAX by the printer; checked against sympy's own evaluation."""
    from diffsoup.formats._sympy_jax import Argument, jax_function

    name = "Boehm_JProteomeRes2014"
    problem, _ = _nominal(name)
    from petab.v1.math import sympify_petab
    model = load_sbml(DATA / name / f"model_{name}.xml")
    ex = model.expressions
    formulas = [sympify_petab(f) for f in problem.observable_df["observableFormula"]]
    # petab's symbols carry no assumptions: map them onto the model's (real) symbols by name.
    formulas = [f.xreplace({s: ex.value_of(s.name) for s in f.free_symbols}) for f in formulas]
    formulas.append(ex.derived["BaF3_Epo"] * ex.time)
    states, params = list(ex.states.values()), list(ex.parameters.values())
    f = jax.jit(jax_function(formulas, [Argument("t", [ex.time], scalar=True), Argument("y", states),
                                        Argument("p", params)]))  # fmt: skip
    rng = np.random.default_rng(2)
    t, y, p = 1.7, rng.uniform(0.5, 2.0, len(states)), model.parameter_vector()
    point = {ex.time: t, **dict(zip(states, y)), **dict(zip(params, p))}
    expected = [float(g.xreplace(point)) for g in formulas]
    np.testing.assert_allclose(f(t, jnp.asarray(y), jnp.asarray(p)), expected, rtol=1e-14)


def _observable_values(problem, model, nominal, rows, times, ys, p):
    """The collection's observable formulas (parsed by petab) evaluated on a simulation."""
    from petab.v1.math import sympify_petab

    out = []
    for _, row in rows.iterrows():
        formula = sympify_petab(problem.observable_df.loc[row["observableId"], "observableFormula"])
        k = int(np.searchsorted(times, row["time"]))
        values = model.values(row["time"], ys[k], p)
        subs = {}
        for s in formula.free_symbols:
            if s.name.startswith("observableParameter"):
                op = row["observableParameters"]
                subs[s] = nominal[op] if op in nominal else float(op)
            else:
                subs[s] = float(values[s.name]) if s.name in values else nominal[s.name]
        out.append(float(formula.subs(subs)))
    return np.array(out)


# (model, simulation condition, pre-equilibration condition, relative agreement with simulatedData)
SIMULATED = [
    pytest.param("Boehm_JProteomeRes2014", "model1_data1", None, 1e-6, id="Boehm"),
    pytest.param("Bruno_JExpBot2016", "model1_data2", None, 1e-5, id="Bruno"),
    pytest.param("Brannmark_JBC2010", "Dose_100", "Dose_0", 1e-5, id="Brannmark"),
    pytest.param("Weber_BMC2015", "model1_data3", "model1_data1", 1e-6, id="Weber"),
]


@pytest.mark.parametrize("name, condition, preequilibration, rtol", SIMULATED)
def test_simulation_at_the_nominal_point_reproduces_the_collections_simulated_data(name, condition, preequilibration, rtol):
    import pandas as pd

    problem, nominal = _nominal(name)
    model = load_sbml(DATA / name / f"model_{name}.xml")
    built = model.spec.build()
    sim = pd.read_csv(DATA / name / f"simulatedData_{name}.tsv", sep="\t")
    rows = sim[sim["simulationConditionId"] == condition]
    p = model.parameter_vector(_condition_values(problem, nominal, model, condition))
    y0 = np.asarray(model.y0(p))
    if preequilibration is not None:  # to the steady state of the pre-equilibration condition
        pre = model.parameter_vector(_condition_values(problem, nominal, model, preequilibration))
        ys = ds.simulate(built, np.asarray(model.y0(pre)), [1e5, 1e6], pre, rtol=1e-10, atol=1e-12,
                         discontinuities=np.asarray(model.discontinuities(pre))).ys  # fmt: skip
        y0 = np.asarray(ys[-1])
        assert np.max(np.abs(np.asarray(model.rhs(0.0, y0, pre)))) < 1e-6 * np.max(np.abs(y0))
    times = np.unique(rows["time"].to_numpy(float))
    switches = [t for t in np.asarray(model.discontinuities(p)) if t > 0]
    ys = np.asarray(ds.simulate(built, y0, times, p, rtol=1e-10, atol=1e-12, discontinuities=switches).ys)
    got = _observable_values(problem, model, nominal, rows, times, ys, p)
    np.testing.assert_allclose(got, rows["simulation"].to_numpy(float), rtol=rtol, atol=1e-9 * np.abs(got).max())


@pytest.mark.slow
def test_fujita_input_switch_matches_scipy_on_an_independent_libsbml_rhs():
    """Fujita's EGF input (a piecewise of time) simulated by diffsoup and by scipy on a rhs that
    libsbml's evaluator computes (no code shared with the importer)."""
    from scipy.integrate import solve_ivp

    name = "Fujita_SciSignal2010"
    path = DATA / name / f"model_{name}.xml"
    problem, nominal = _nominal(name)
    model = load_sbml(path)
    values = _condition_values(problem, nominal, model, "condition_pulse_03_0")
    p = model.parameter_vector(values)
    y0 = np.asarray(model.y0(p))
    doc = libsbml.readSBMLFromFile(str(path))
    m = doc.getModel()
    for k, v in values.items():
        m.getParameter(k).setValue(v)
    for s in m.getListOfSpecies():
        m.removeInitialAssignment(s.getId())
    species = [s.getId() for s in m.getListOfSpecies()]
    egf_rule = m.getRule("EGF").getMath()
    laws = [(r.getKineticLaw().getMath(), [(s.getSpecies(), -s.getStoichiometry()) for s in r.getListOfReactants()]
             + [(s.getSpecies(), s.getStoichiometry()) for s in r.getListOfProducts()]) for r in m.getListOfReactions()]  # fmt: skip
    def evaluate(math, model):  # libsbml caches the model's values: forget them first
        libsbml.SBMLTransforms.clearComponentValues(model)
        return libsbml.SBMLTransforms.evaluateASTNode(math, model)

    # evaluateASTNode sees time = 0: the rule's time dependence is written out in rhs below.
    assert evaluate(egf_rule, m) == values["EGF_0"]
    m.removeRule("EGF")  # else libsbml's value map re-applies the rule (at time 0) over EGF's value
    size = {s.getId(): m.getCompartment(s.getCompartment()).getSize() for s in m.getListOfSpecies()}

    def rhs(t, y):
        for sid, v in zip(species, y):
            m.getSpecies(sid).setInitialConcentration(float(v))
        m.getParameter("EGF").setValue(values["EGF_0"] + values["EGF_rate"] * t if t <= values["EGF_end"] else 0.0)
        out = dict.fromkeys(species, 0.0)
        libsbml.SBMLTransforms.clearComponentValues(m)
        for law, refs in laws:
            rate = libsbml.SBMLTransforms.evaluateASTNode(law, m)
            for sid, nu in refs:
                out[sid] += nu * rate / size[sid]
        return [out[s] for s in species]

    times = np.array([30.0, 60.0, 120.0, 300.0, 900.0])
    end = values["EGF_end"]
    first = solve_ivp(rhs, (0, end), y0, method="LSODA", rtol=1e-11, atol=1e-12 * np.abs(y0).max(), dense_output=True)
    second = solve_ivp(rhs, (end, times[-1]), first.y[:, -1], method="LSODA", rtol=1e-11,
                       atol=1e-12 * np.abs(y0).max(), dense_output=True)  # fmt: skip
    ref = np.array([(first if t <= end else second).sol(t) for t in times])
    ys = _simulate(model, times, values, discontinuities=[end])
    np.testing.assert_allclose(ys, ref, rtol=1e-6, atol=1e-9 * np.abs(y0).max())
