"""The study-file loader: a valid file gives the study one would build by hand; malformed files
are refused with errors naming the file, the line and the field."""

from __future__ import annotations

import textwrap

import jax
import numpy as np
import pytest

import diffsoup as ds
from diffsoup.formats import StudyFileError, load_study

jax.config.update("jax_enable_x64", True)

HEAD = """\
format = "diffsoup-study/1"
name = "tiny"
levels = ["lab"]

[model]
species = ["A", "B", "C"]
reactions = [["A -> B", "k1"], ["B -> C", "k2"]]
parameters = { k1 = 1.0, k2 = 0.5 }
y0 = { A = 1.0 }

[observables]
scaled = "2.5 * B + k2 * exp(-C)"

[solver]
rtol = 1e-9
atol = 1e-11

[noise]
sigma = 0.05

[[parameters]]
name = "k1"
nominal = 1.0
lower = 0.1
upper = 10.0
level = "lab"

[[parameters]]
name = "k2"
nominal = 0.5
lower = 0.05
upper = 5.0
"""

EXPERIMENTS = """
[[experiments]]
id = "e1"
data = "e1.csv"
groups = { lab = "north" }

[[experiments]]
id = "e2"
data = "both.csv"
observables = ["A", "scaled"]
y0 = { A = 2.0, B = 0.1 }
groups = { lab = "south" }
noise = { model = "lognormal", sigma = 0.1 }
"""

E1 = "time,A,C\n0.5,0.61,0.05\n1.0,0.37,\n2.0,0.14,0.4\n"
BOTH = "experiment,time,scaled,A,sigma:A\ne2,0.5,0.9,1.2,0.02\ne2,1.0,1.1,0.74,0.03\nother,1.0,1.0,1.0,0.1\n"


def write(tmp_path, text=HEAD + EXPERIMENTS, files=None):
    files = {"e1.csv": E1, "both.csv": BOTH} if files is None else files
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    path = tmp_path / "study.toml"
    path.write_text(text)
    return path


def error_of(tmp_path, text, files=None) -> StudyFileError:
    with pytest.raises(StudyFileError) as info:
        load_study(write(tmp_path, text, files))
    return info.value


def line_of(text: str, needle: str, occurrence: int = 0) -> int:
    lines = [i + 1 for i, line in enumerate(text.splitlines()) if needle in line]
    return lines[occurrence]


def test_valid_file_gives_the_study_built_by_hand(tmp_path):
    sf = load_study(write(tmp_path))
    study = sf.study
    assert sf.name == "tiny" and study.levels == ("lab",)
    assert [e.id for e in study.experiments] == ["e1", "e2"]
    assert study.entry_names == ("k1[north]", "k1[south]", "k2")
    assert sf.solver.rtol == 1e-9 and sf.fit["method"] == "fides" and sf.fit["starts"] == 4
    e1, e2 = study.experiments
    assert sf.observables == {"e1": ["A", "C"], "e2": ["A", "scaled"]}
    np.testing.assert_array_equal(e1.times, [0.5, 1.0, 2.0])
    assert np.isnan(e1.data[1, 1]) and e1.data[2, 1] == 0.4
    # e2 takes its rows of the shared file, its columns in the order asked for, sigma: columns
    np.testing.assert_array_equal(e2.data, [[1.2, 0.9], [0.74, 1.1]])
    assert isinstance(e2.noise, ds.inference.LogNormal)
    np.testing.assert_array_equal(e2.sigma, [[0.02, 0.1], [0.03, 0.1]])
    assert e2.y0 == {"A": 2.0, "B": 0.1}
    # The observables evaluate as written: A, C; and A, 2.5 B + k2 exp(-C).
    y = np.array([0.3, 0.2, 0.7])
    p = {"k1": 1.0, "k2": 0.5}
    np.testing.assert_allclose(e1.observables(y, p), [0.3, 0.7])
    np.testing.assert_allclose(e2.observables(y, p), [0.3, 2.5 * 0.2 + 0.5 * np.exp(-0.7)], rtol=1e-15)


def test_study_file_objective_matches_the_same_study_built_by_hand(tmp_path):
    sf = load_study(write(tmp_path))
    net = ds.ReactionNetwork(["A", "B", "C"], [("A -> B", "k1"), ("B -> C", "k2")], {"k1": 1.0, "k2": 0.5})
    problem = net.to_spec(y0=[1.0, 0.0, 0.0]).build()
    G, L = ds.inference.Gaussian, ds.inference.LogNormal
    scaled = lambda y, p: jax.numpy.stack([y[0], 2.5 * y[1] + p["k2"] * jax.numpy.exp(-y[2])])  # noqa: E731
    exps = [
        ds.Experiment("e1", [0.5, 1.0, 2.0], [[0.61, 0.05], [0.37, np.nan], [0.14, 0.4]],
                      observables=lambda y, p: jax.numpy.stack([y[0], y[2]]), noise=G(0.05), groups={"lab": "north"}),
        ds.Experiment("e2", [0.5, 1.0], [[1.2, 0.9], [0.74, 1.1]], observables=scaled,
                      noise=L(np.array([[0.02, 0.1], [0.03, 0.1]])), y0={"A": 2.0, "B": 0.1}, groups={"lab": "south"}),
    ]  # fmt: skip
    P = ds.inference.Parameter
    by_hand = ds.Study(problem, exps, [P("k1", 1.0, 0.1, 10.0, level="lab"), P("k2", 0.5, 0.05, 5.0)], levels=["lab"])
    theta = np.log10([1.3, 0.8, 0.4])
    solver = ds.inference.SolverOptions(rtol=1e-9, atol=1e-11)
    a = sf.lower().value(theta)
    b = ds.lower(by_hand, solver=solver).value(theta)
    assert a == pytest.approx(b, rel=1e-12)


def test_toml_syntax_error_names_the_line(tmp_path):
    text = HEAD.replace("rtol = 1e-9", "rtol = = 1e-9") + EXPERIMENTS
    err = error_of(tmp_path, text)
    assert err.line == line_of(text, "rtol = = 1e-9")
    assert "not valid TOML" in str(err) and f"study.toml:{err.line}" in str(err)


def test_unknown_key_names_its_line_and_suggests(tmp_path):
    text = HEAD + EXPERIMENTS.replace('id = "e2"', 'id = "e2"\nconditons = { k2 = 1.0 }')
    err = error_of(tmp_path, text)
    assert err.field == "experiments[1].conditons"
    assert err.line == line_of(text, "conditons")
    assert "did you mean 'conditions'" in str(err)
    text = HEAD.replace('name = "tiny"', 'nmae = "tiny"') + EXPERIMENTS
    err = error_of(tmp_path, text)
    assert err.field == "nmae" and err.line == 2


def test_missing_data_file(tmp_path):
    err = error_of(tmp_path, HEAD + EXPERIMENTS, files={"e1.csv": E1})
    assert err.field == "experiments[1].data"
    assert err.line == line_of(HEAD + EXPERIMENTS, 'data = "both.csv"')
    assert "'both.csv' not found" in str(err)


def test_data_file_with_a_short_row_names_the_csv_line(tmp_path):
    err = error_of(tmp_path, HEAD + EXPERIMENTS, files={"e1.csv": "time,A,C\n0.5,0.61,0.05\n1.0,0.37\n", "both.csv": BOTH})
    assert err.path.name == "e1.csv" and err.line == 3
    assert "2 values where the header has 3 columns" in str(err)


def test_data_file_with_text_in_a_number_names_the_csv_line(tmp_path):
    err = error_of(tmp_path, HEAD + EXPERIMENTS, files={"e1.csv": "time,A,C\n0.5,0.61,0.05\n1.0,lots,0.1\n", "both.csv": BOTH})
    assert err.path.name == "e1.csv" and err.line == 3 and "'lots' is not a number" in str(err)


def test_data_columns_that_are_not_observables(tmp_path):
    err = error_of(tmp_path, HEAD + EXPERIMENTS, files={"e1.csv": "time,A,D\n0.5,0.61,0.05\n", "both.csv": BOTH})
    assert err.field == "experiments[0].data" and "column 'D'" in str(err)
    text = HEAD + EXPERIMENTS.replace('observables = ["A", "scaled"]', 'observables = ["A", "B"]')
    err = error_of(tmp_path, text)
    assert err.field == "experiments[1].data" and "no column 'B'" in str(err)


def test_negative_sigma_names_the_field(tmp_path):
    text = HEAD + EXPERIMENTS.replace(
        'noise = { model = "lognormal", sigma = 0.1 }', 'noise = { model = "lognormal", sigma = -1.0 }')
    err = error_of(tmp_path, text)
    assert err.field == "experiments[1].noise.sigma" and "positive" in str(err)


@pytest.mark.parametrize(
    "old, new, field, words",
    [
        ('groups = { lab = "north" }', 'groups = { lab = "north" }\nconditions = { k9 = 1.0 }',
         "experiments[0].conditions.k9", "unknown model parameter 'k9'"),
        ('groups = { lab = "north" }', 'groups = { lab = "north" }\nparameters = { k1 = "k_one" }',
         "experiments[0].parameters.k1", "unknown study parameter 'k_one'"),
        ("y0 = { A = 2.0, B = 0.1 }", "y0 = { A = 2.0, Q = 0.1 }", "experiments[1].y0.Q", "unknown species 'Q'"),
        ('observables = ["A", "scaled"]', 'observables = ["A", "scaled2"]', "experiments[1].observables",
         "unknown observable"),
        ('groups = { lab = "south" }', 'groups = { site = "south" }', "experiments[1].groups.site", "unknown level"),
        ('groups = { lab = "south" }', "t0 = 0.0", "experiments[1].groups", "level 'lab'"),
    ],
)
def test_unknown_names_in_experiments(tmp_path, old, new, field, words):
    text = HEAD + EXPERIMENTS.replace(old, new)
    err = error_of(tmp_path, text)
    assert err.field == field, str(err)
    assert words in str(err)
    assert err.line is not None


def test_model_and_parameter_table_errors(tmp_path):
    text = HEAD.replace('scaled = "2.5 * B + k2 * exp(-C)"', 'scaled = "2.5 * B + kx"') + EXPERIMENTS
    err = error_of(tmp_path, text)
    assert err.field == "observables.scaled" and "'kx'" in str(err) and err.line == line_of(text, "scaled = ")
    text = HEAD.replace('scaled = "2.5 * B + k2 * exp(-C)"', 'scaled = "__import__(1)"') + EXPERIMENTS
    assert "not allowed" in str(error_of(tmp_path, text))
    text = HEAD.replace('y0 = { A = 1.0 }', 'y0 = { Z = 1.0 }') + EXPERIMENTS
    assert error_of(tmp_path, text).field == "model.y0.Z"
    text = HEAD.replace('level = "lab"', 'level = "site"') + EXPERIMENTS
    err = error_of(tmp_path, text)
    assert err.field == "parameters[0].level" and err.line == line_of(text, 'level = "site"')
    text = HEAD.replace("upper = 10.0", "upper = 0.01") + EXPERIMENTS
    err = error_of(tmp_path, text)
    assert err.field == "parameters[0].upper" and "swap them" in str(err)
    assert err.line == line_of(text, "upper = 0.01")


@pytest.mark.parametrize(
    "old, new, key, words",
    [
        ("lower = 0.05", "lower = -0.05", "lower", "needs positive values"),
        ("nominal = 0.5", "nominal = 50.0", "nominal", "nominal 50.0 lies outside"),
        ("nominal = 0.5", "nominal = nan", "nominal", "must be a number, not nan"),
        ("upper = 5.0", "upper = inf", "upper", "needs finite bounds"),
        ("nominal = 0.5", "nominal = 0.0", "nominal", "needs positive values; nominal=0.0"),
    ],
)
def test_parameter_bound_errors_point_at_the_key(tmp_path, old, new, key, words):
    # the second [[parameters]] table (k2): its header and its keys are on different lines
    split = HEAD.rindex("[[parameters]]")
    text = HEAD[:split] + HEAD[split:].replace(old, new, 1) + EXPERIMENTS
    err = error_of(tmp_path, text)
    assert err.field == f"parameters[1].{key}", str(err)
    assert words in str(err)
    assert err.line == line_of(text, new) and err.line != line_of(text, "[[parameters]]", 1)


def test_parameter_nominal_defaults_to_the_midpoint_on_its_scale(tmp_path):
    P = ds.inference.Parameter
    assert P("k", lower=0.01, upper=100.0).nominal == pytest.approx(1.0, rel=1e-15)  # log10: geometric mean
    assert P("k", lower=2.0, upper=8.0, scale="log").nominal == pytest.approx(4.0, rel=1e-15)
    assert P("k", lower=-1.0, upper=3.0, scale="lin").nominal == 1.0
    assert P("k", 0.3, 0.1, 10.0).nominal == 0.3  # DESIGN's positional order still holds
    with pytest.raises(ValueError, match="give nominal=, or finite lower= and upper="):
        P("k", lower=0.1, estimate=False)
    # a study file may leave nominal out when it gives both bounds
    text = HEAD.replace("name = \"k2\"\nnominal = 0.5\n", "name = \"k2\"\n") + EXPERIMENTS
    k2 = load_study(write(tmp_path, text)).study.table["k2"]
    assert k2.nominal == pytest.approx(np.sqrt(0.05 * 5.0), rel=1e-15)


def test_format_line_is_required_and_versioned(tmp_path):
    err = error_of(tmp_path, HEAD.replace('format = "diffsoup-study/1"\n', "") + EXPERIMENTS)
    assert "format" in str(err)
    err = error_of(tmp_path, HEAD.replace("diffsoup-study/1", "diffsoup-study/9") + EXPERIMENTS)
    assert err.field == "format" and err.line == 1 and "not supported" in str(err)


def test_python_model_and_multishoot(tmp_path):
    (tmp_path / "model.py").write_text(textwrap.dedent("""
        import jax.numpy as jnp
        import diffsoup as ds

        def make():
            def rhs(t, y, p):
                return jnp.stack([-p["k1"] * y[0], p["k1"] * y[0] - p["k2"] * y[1], p["k2"] * y[1]])
            return ds.ProblemSpec(rhs, states=["A", "B", "C"], parameters={"k1": 1.0, "k2": 0.5}, y0=[1.0, 0.0, 0.0])
    """))
    model = '[model]\npython = "model.py:make"\n'
    text = HEAD.replace(HEAD[HEAD.index("[model]"):HEAD.index("[observables]")], model)
    text += EXPERIMENTS.replace('groups = { lab = "north" }', 'groups = { lab = "north" }\nmultishoot = { windows = 2 }')
    sf = load_study(write(tmp_path, text))
    assert sf.study.problem.state_names == ("A", "B", "C")
    assert sf.study.experiments[0].trajectory.n_windows == 2
    text2 = text.replace("multishoot = { windows = 2 }", "multishoot = { windows = 1 }")
    err = error_of(tmp_path, text2)
    assert err.field == "experiments[0].multishoot" and "windows" in str(err)
    err = error_of(tmp_path, text.replace("model.py:make", "model.py:nothing"))
    assert err.field == "model.python" and "no 'nothing'" in str(err)


def test_demo_study_file_loads_and_recovers_its_truth(tmp_path):
    from diffsoup._demo_study import TRUTH, write_demo_study

    sf = load_study(write_demo_study(tmp_path, n_experiments=6))
    assert len(sf.study.experiments) == 6 and sf.observables["run00"] == ["S", "P", "bound"]
    # one value per rate before the fit: the model's defaults are the parameter table's nominals
    defaults = dict(zip(sf.study.problem.parameter_names, np.asarray(sf.study.problem.spec.parameter_defaults)))
    assert defaults == {p.name: p.nominal for p in sf.study.parameters}
    low = sf.lower()
    theta_true = np.log10([TRUTH[n] for n in low.problem.theta_names])
    # the data are the truth plus sigma-scaled noise: chi2 per value at the truth is about 1
    r = low.residuals(theta_true)
    assert 0.5 < np.mean(r**2) < 1.6


def observable_of(tmp_path, expression: str):
    """The study file's observable ``scaled`` written as ``expression``, as a function of (y, p)."""
    text = HEAD.replace('scaled = "2.5 * B + k2 * exp(-C)"', f'scaled = "{expression}"') + EXPERIMENTS
    return load_study(write(tmp_path, text)).study.experiments[1].observables


def test_observable_constants_are_floating_point(tmp_path):
    # In integer arithmetic 10 ** 20 wraps around in int64 (6.05e18 times A instead of 7.79e19).
    y, p = np.array([0.779, -0.4, 0.2]), {"k1": 1.0, "k2": 0.5}
    cases = {"A * 10 ** 20": 0.779e20, "B * 2 ** -1": -0.2, "B ** 2 + 2 * 3 * A": 0.16 + 6 * 0.779,
             "A * 10 ** 300": 0.779e300, "exp(2) * C / 4": np.exp(2.0) * 0.2 / 4, "B ** 3": -0.064}  # fmt: skip
    for expression, expected in cases.items():
        value = observable_of(tmp_path, expression)(y, p)[1]
        assert value == pytest.approx(expected, rel=1e-14), expression


@pytest.mark.parametrize(
    "expression, words",
    [
        ("A * 10 ** 10 ** 10", "'10 ** 10 ** 10' overflows floating point"),
        ("A * 1e999", "overflows floating point"),
        ("A * 10.0 ** 301", "evaluates to 1e+301"),
        ("A * exp(1000)", "'exp(1000)' overflows"),
        ("A * 1" + "0" * 400, "overflows floating point"),
        ("log(0) + A", "'log(0)' is not a finite real number"),
        ("(-8) ** (1 / 3) * A", "is not a real number"),
        ("A / (2 - 2)", "'A / (2 - 2)' divides by zero"),
    ],
)
def test_observable_constants_out_of_range_name_the_line(tmp_path, expression, words):
    import time

    t0 = time.perf_counter()
    text = HEAD.replace('scaled = "2.5 * B + k2 * exp(-C)"', f'scaled = "{expression}"') + EXPERIMENTS
    err = error_of(tmp_path, text)
    assert time.perf_counter() - t0 < 30  # 10 ** 10 ** 10 in integers would not end
    assert err.field == "observables.scaled" and err.line == line_of(text, "scaled = ")
    assert words in str(err)


@pytest.mark.parametrize("expression", ["-" * 300 + "A", "+".join(["A"] * 250), "+".join(["A"] * 20000),
                                        "exp(" * 250 + "A" + ")" * 250])  # fmt: skip
def test_deeply_nested_observables_are_refused_by_line(tmp_path, expression):
    text = HEAD.replace('scaled = "2.5 * B + k2 * exp(-C)"', f'scaled = "{expression}"') + EXPERIMENTS
    err = error_of(tmp_path, text)
    assert err.field == "observables.scaled" and err.line == line_of(text, "scaled = ")
    assert "nested" in str(err)
    # a sum of 150 species-sized terms is still an observable
    assert observable_of(tmp_path, "+".join(["A"] * 150))(np.array([0.5, 0.0, 0.0]), {"k2": 0.5})[1] == 75.0


# ------------------------------------------------------------------------------------------------
# diffsoup-study/2: what the core gained (per-observable noise, observable parameters and time,
# estimated initial amounts, pre-equilibration, resets, discontinuities)
# ------------------------------------------------------------------------------------------------

V2 = """\
format = "diffsoup-study/2"
name = "v2"
observable_parameters = {scale = "s", shift = 0.05}

[model]
species = ["A", "B"]
reactions = [["A -> B", "k1"], ["B -> A", "k2"], ["-> A", "k0"]]
parameters = { k1 = 1.0, k2 = 0.5, k0 = 0.3 }
y0 = { A = 1.0 }

[observables]
signal = "scale * B + shift * time"

[solver]
rtol = 1e-10
atol = 1e-12

[noise]
model = "laplace"
sigma = 0.1
[noise.observables]
A = {model = "lognormal", sigma = "sd_A", base = 10}

[[parameters]]
name = "k1"
lower = 0.1
upper = 10.0

[[parameters]]
name = "sd_A"
nominal = 0.2
lower = 0.01
upper = 1.0

[[parameters]]
name = "s"
nominal = 2.0
lower = 0.1
upper = 10.0

[[parameters]]
name = "A0"
nominal = 0.7
lower = 0.1
upper = 5.0

[[experiments]]
id = "plain"
data = "v2.csv"
y0 = {A = "A0"}
resets = [{time = 1.5, add = {B = 0.25}}]
discontinuities = [1.5]

[[experiments]]
id = "primed"
data = "v2.csv"
observable_parameters = {shift = 0.0}
preequilibration = {conditions = {k1 = 2.0}}
y0 = {B = 0.1}
noise = {model = "gaussian", sigma = 0.2, observables = {A = {model = "loglaplace", sigma = 0.3}}}
"""
V2_DATA = ("experiment,time,A,signal\nplain,0.5,0.8,0.6\nplain,1.5,0.7,1.1\nplain,3.0,0.75,1.4\n"
           "primed,0.5,0.5,1.0\nprimed,2.0,0.45,1.2\n")


@pytest.mark.parametrize("steady", [False, True], ids=["finite-times", "steady-state-row"])
def test_v2_file_gives_the_study_built_by_hand(tmp_path, steady):
    import jax.numpy as jnp

    from diffsoup.inference import Experiment, Gaussian, Laplace, LogLaplace, LogNormal, Parameter, Preequilibration

    # time = inf: a steady-state measurement (the data file's time column accepts 'inf').
    data = V2_DATA + ("primed,inf,0.46,1.3\n" if steady else "")
    sf = load_study(write(tmp_path, V2, {"v2.csv": data}))
    assert sf.format == "diffsoup-study/2"
    assert (sf.study.experiments[1].times[-1] == np.inf) == steady
    plain, primed = sf.study.experiments
    assert [type(n).__name__ for n in plain.noise] == ["LogNormal", "Laplace"] and plain.noise[0].base == 10
    assert [type(n).__name__ for n in primed.noise] == ["LogLaplace", "Gaussian"]
    assert plain.observable_parameters == {"scale": "s", "shift": 0.05}
    assert primed.observable_parameters == {"scale": "s", "shift": 0.0}
    assert plain.y0 == {"A": "A0"} and primed.preequilibration.conditions == {"k1": 2.0}

    network = ds.ReactionNetwork(["A", "B"], [("A -> B", "k1"), ("B -> A", "k2"), ("-> A", "k0")],
                                 {"k1": 1.0, "k2": 0.5, "k0": 0.3})  # fmt: skip

    def observables(t, y, p):
        return jnp.stack([y[0], p["scale"] * y[1] + p["shift"] * t])

    def add_b(t, y, p):
        return y.at[1].add(0.25)

    e1 = Experiment("plain", plain.times, plain.data, observables=observables,
                    noise=[LogNormal("sd_A", base=10), Laplace(0.1)], y0={"A": "A0"},
                    observable_parameters={"scale": "s", "shift": 0.05}, resets=(ds.Reset(1.5, add_b),),
                    discontinuities=[1.5])  # fmt: skip
    e2 = Experiment("primed", primed.times, primed.data, observables=observables,
                    noise=[LogLaplace(0.3), Gaussian(0.2)], y0={"B": 0.1},
                    observable_parameters={"scale": "s", "shift": 0.0},
                    preequilibration=Preequilibration(conditions={"k1": 2.0}))  # fmt: skip
    parameters = [Parameter("k1", lower=0.1, upper=10.0), Parameter("sd_A", 0.2, 0.01, 1.0),
                  Parameter("s", 2.0, 0.1, 10.0), Parameter("A0", 0.7, 0.1, 5.0)]  # fmt: skip
    by_hand = ds.lower(ds.Study(network.to_spec(y0=[1.0, 0.0]), [e1, e2], parameters), solver=sf.solver)
    lowered = sf.lower()
    for theta in (lowered.nominal, lowered.nominal + np.array([0.1, -0.05, 0.2, 0.1])):
        np.testing.assert_allclose(lowered.value(theta), by_hand.value(theta), rtol=1e-12)


@pytest.mark.parametrize("key, text", [
    ("observable_parameters", 'observable_parameters = {scale = 1.0}\n'),
    ("resets", '[[experiments]]\nid = "e9"\ndata = "e1.csv"\nresets = [{time = 1.0, set = {A = 0.0}}]\n'),
])
def test_v2_keys_in_a_v1_file_say_which_format_they_need(tmp_path, key, text):
    head = HEAD.replace("[model]", text + "\n[model]") if key == "observable_parameters" else HEAD
    body = EXPERIMENTS + ("" if key == "observable_parameters" else "\n" + text)
    err = error_of(tmp_path, head + body)
    assert f"'{key}' needs format = 'diffsoup-study/2'" in str(err)


def test_v2_errors_name_the_line_and_field(tmp_path):
    files = {"v2.csv": V2_DATA}
    err = error_of(tmp_path, V2.replace('base = 10', 'base = 1'), files)
    assert err.field == "noise.observables.A.base" and "must not be 1" in str(err)
    err = error_of(tmp_path, V2.replace('add = {B = 0.25}', 'add = {C = 0.25}'), files)
    assert err.field.startswith("experiments[0].resets") and "unknown species 'C'" in str(err)
    err = error_of(tmp_path, V2.replace('observable_parameters = {scale = "s", shift = 0.05}', 'observable_parameters = {scale = "s"}'), files)
    assert "shift" in str(err) and err.field.endswith("observable_parameters")
    err = error_of(tmp_path, V2.replace('y0 = {A = "A0"}', 'y0 = {A = "nope"}'), files)
    assert err.field == "experiments[0].y0.A" and "unknown study parameter 'nope'" in str(err)
    err = error_of(tmp_path, V2.replace('conditions = {k1 = 2.0}', 'conditions = {kx = 2.0}'), files)
    assert err.field == "experiments[1].preequilibration.conditions.kx"


def test_fit_hessian_is_read_checked_and_named_in_errors(tmp_path):
    """``[fit] hessian`` picks fides' Hessian (default Gauss-Newton); a value fides has not, or a
    Hessian with another method, is refused with the field's line."""
    assert load_study(write(tmp_path)).fit["hessian"] == "gauss_newton"
    fit = '\n[fit]\nmethod = "fides"\nhessian = "hybrid"\n'
    assert load_study(write(tmp_path, HEAD + fit + EXPERIMENTS)).fit["hessian"] == "hybrid"
    text = HEAD + fit.replace('"hybrid"', '"newton"') + EXPERIMENTS
    err = error_of(tmp_path, text)
    assert err.field == "fit.hessian" and err.line == line_of(text, "hessian =") and "'newton' is not one of" in str(err)
    text = HEAD + fit.replace('"fides"', '"trf"') + EXPERIMENTS
    err = error_of(tmp_path, text)
    assert err.field == "fit.hessian" and 'applies to method "fides" only' in str(err)


def test_fit_hierarchical_is_read_checked_and_named_in_errors(tmp_path):
    """``[fit] hierarchical`` is None where the file does not say (fit's default: the noise
    levels), false, true, or estimated parameters' names; anything
    else (a number, an empty list, a name that is not estimated) is refused with the field's line."""
    assert load_study(write(tmp_path)).fit["hierarchical"] is None
    for value, read in (("true", True), ('["k2"]', ("k2",))):
        text = HEAD + f"\n[fit]\nhierarchical = {value}\n" + EXPERIMENTS
        assert load_study(write(tmp_path, text)).fit["hierarchical"] == read
    for value, message in (("1", "must be true, false or a list of parameter names"), ("[]", "is an empty list"),
                           ('["k3"]', "unknown estimated parameter 'k3'")):  # fmt: skip
        text = HEAD + f"\n[fit]\nhierarchical = {value}\n" + EXPERIMENTS
        err = error_of(tmp_path, text)
        assert err.field == "fit.hierarchical" and err.line == line_of(text, "hierarchical =") and message in str(err)
