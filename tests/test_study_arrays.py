"""Studies held as arrays (``ds.Study.from_arrays`` / ``from_table``): the same objective, gradient and
residuals as the same experiments given as ``ds.Experiment`` objects; errors naming the experiment
and the field; ``study.experiments[i]`` views that round-trip; Dask and Zarr input; results stores
with an experiment axis."""

import numpy as np
import pandas as pd
import pytest

import diffsoup as ds
from diffsoup.inference import Gaussian, InferenceProblem, LogNormal, Parameter

from test_study import THETA, TRUE, tiny_study

# Objective and gradient of the same experiments agree to rounding (summation order only).
RTOL = 1e-12


def arrays_of(study):
    """The arrays of ``tiny_study``'s experiments: times padded with NaN, y0 per row, k3 NaN where
    the experiment does not fix it."""
    exps = study.experiments
    E = len(exps)
    times, data = np.full((E, 4), np.nan), np.full((E, 4, 3), np.nan)
    y0, k3 = np.zeros((E, 3)), np.full(E, np.nan)
    for i, e in enumerate(exps):
        m = e.times.shape[0]
        times[i, :m], data[i, :m] = e.times, e.data
        y0[i, 0] = e.y0["A"]
        k3[i] = e.conditions.get("k3", np.nan)
    return dict(times=times, data=data, ids=[e.id for e in exps], y0=y0, conditions={"k3": k3})


def table_of(study, seed=1):
    """``tiny_study`` as a long table, one row per measured value, rows shuffled."""
    rows = []
    for e in study.experiments:
        for i, t in enumerate(e.times):
            for j, name in enumerate(("A", "B", "C")):
                if np.isfinite(e.data[i, j]):
                    rows.append(dict(experiment=e.id, time=t, observable=name, value=e.data[i, j], sigma=0.02,
                                     k3=e.conditions.get("k3", np.nan), A0=e.y0["A"]))  # fmt: skip
    return pd.DataFrame(rows).sample(frac=1.0, random_state=seed).reset_index(drop=True)


@pytest.fixture(scope="module")
def studies():
    objects = tiny_study()
    arrays = ds.Study.from_arrays(objects.problem, noise=Gaussian(0.02), parameters=objects.parameters,
                                  **arrays_of(objects))  # fmt: skip
    table = ds.Study.from_table(objects.problem, table_of(objects), conditions=["k3"], y0={"A": "A0"},
                                parameters=objects.parameters)  # fmt: skip
    return objects, arrays, table


def test_arrays_table_and_objects_agree(studies):
    objects, arrays, table = studies
    assert arrays.arrays is not None and table.arrays is not None and objects.arrays is None
    ref = ds.lower(objects)
    v0, g0 = ref.value_and_grad(THETA)
    r0 = ref.residuals(THETA)
    for study in (arrays, table):
        low = ds.lower(study)
        v, g = low.value_and_grad(THETA)
        np.testing.assert_allclose(v, v0, rtol=RTOL)
        np.testing.assert_allclose(g, g0, rtol=1e-9)
        assert low.offset == pytest.approx(ref.offset, rel=RTOL)
        # Residuals in the objects' order (the table's experiments come in order of first appearance).
        r = low.residuals(THETA)
        for eid, sl in ref.residual_slices.items():
            np.testing.assert_allclose(r[low.residual_slices[eid]], r0[sl], rtol=1e-12, atol=1e-14)


def test_chunks_with_padding_lanes_match_one_chunk(studies):
    _, arrays, _ = studies
    one = ds.lower(arrays).value_and_grad(THETA)
    chunked = ds.lower(arrays, experiments_per_chunk=3)  # 8 experiments: chunks of 3, the last padded
    v, g = chunked.value_and_grad(THETA)
    assert chunked.chunk_sizes["value_and_grad"] == [3]
    np.testing.assert_allclose(v, one[0], rtol=RTOL)
    np.testing.assert_allclose(g, one[1], rtol=RTOL)


def test_views_round_trip(studies):
    objects, arrays, _ = studies
    assert len(arrays.experiments) == len(objects.experiments)
    for i in (0, 2, 3, -1):
        e, ref = arrays.experiments[i], objects.experiments[i]
        assert isinstance(e, ds.Experiment) and e.id == ref.id
        np.testing.assert_array_equal(e.times, ref.times)
        np.testing.assert_array_equal(e.data, ref.data)
        assert e.conditions == ref.conditions
        np.testing.assert_array_equal(e.sigma, ref.sigma)
    again = ds.Study(objects.problem, list(arrays.experiments), objects.parameters)
    assert again.arrays is None
    assert ds.lower(again).value(THETA) == pytest.approx(ds.lower(objects).value(THETA), rel=RTOL)
    # Reordered views of the same arrays stay arrays.
    swapped = arrays.replace(experiments=list(arrays.experiments)[::-1])
    assert swapped.arrays is not None and swapped.ids == arrays.ids[::-1]
    assert ds.lower(swapped).value(THETA) == pytest.approx(ds.lower(objects).value(THETA), rel=RTOL)
    assert arrays.index_of("e5") == 5 and "e5" in arrays.resolved
    assert arrays.resolved["e3"]["plan"] == objects.resolved["e3"]["plan"]


def test_dask_and_zarr_input(studies, tmp_path):
    import dask.array as da
    import zarr

    objects, arrays, _ = studies
    a = arrays_of(objects)
    ref = ds.lower(arrays).value(THETA)
    lazy = dict(a, times=da.from_array(a["times"], chunks=(3, 4)), data=da.from_array(a["data"], chunks=(3, 4, 3)))
    study = ds.Study.from_arrays(objects.problem, noise=Gaussian(0.02), parameters=objects.parameters, **lazy)
    assert isinstance(study.arrays.data, np.ndarray)
    assert ds.lower(study).value(THETA) == pytest.approx(ref, rel=RTOL)
    z = zarr.open_array(str(tmp_path / "data.zarr"), mode="w", shape=a["data"].shape, chunks=(5, 4, 3), dtype="f8")
    z[...] = a["data"]
    study = ds.Study.from_arrays(objects.problem, noise=Gaussian(0.02), parameters=objects.parameters, **dict(a, data=z))
    assert ds.lower(study).value(THETA) == pytest.approx(ref, rel=RTOL)
    # A Dask chunk's bad row is reported with its experiment id.
    bad = a["data"].copy()
    bad[6, 1, 2] = np.inf
    with pytest.raises(ValueError, match=r"experiment 'e6' \(row 6\): data\[1, 2\] = inf"):
        ds.Study.from_arrays(objects.problem, noise=Gaussian(0.02), parameters=objects.parameters,
                             **dict(a, data=da.from_array(bad, chunks=(3, 4, 3))))  # fmt: skip


def _levels_objects():
    """Experiments of two sites (k2 per site), an estimated sigma, log-normal noise."""
    objects = tiny_study()
    sites = ["north" if i % 3 else "south" for i in range(len(objects.experiments))]
    exps = [ds.Experiment(e.id, e.times, np.abs(e.data) + 0.01, noise=LogNormal("sd"), y0=e.y0, conditions=e.conditions,
                          groups={"site": s}) for e, s in zip(objects.experiments, sites)]  # fmt: skip
    params = [Parameter("k1", 1.0, 0.1, 10.0), Parameter("k2", 0.5, 0.05, 5.0, level="site"),
              Parameter("k3", 0.3, 0.03, 3.0), Parameter("sd", 0.1, 0.01, 1.0)]  # fmt: skip
    return ds.Study(objects.problem, exps, params, levels=("site",)), sites


def test_levels_and_estimated_sigma_agree():
    objects, sites = _levels_objects()
    a = arrays_of(objects)
    a["data"] = np.where(np.isfinite(a["data"]), np.abs(a["data"]), np.nan)
    arrays = ds.Study.from_arrays(objects.problem, noise=LogNormal("sd"), groups={"site": sites},
                                  parameters=objects.parameters, **a)  # fmt: skip
    assert arrays.entry_names == objects.entry_names == ("k1", "k2[south]", "k2[north]", "k3", "sd")
    ref, low = ds.lower(objects), ds.lower(arrays)
    theta = ref.nominal + 0.05
    v0, g0 = ref.value_and_grad(theta)
    v, g = low.value_and_grad(theta)
    np.testing.assert_allclose(v, v0, rtol=RTOL)
    np.testing.assert_allclose(g, g0, rtol=1e-9)
    np.testing.assert_allclose(low.residuals(theta), ref.residuals(theta), rtol=1e-12, atol=1e-14)


def test_bad_rows_name_the_experiment_and_the_field(studies):
    objects, _, _ = studies
    a = arrays_of(objects)
    kw = dict(noise=Gaussian(0.02), parameters=objects.parameters)
    problem = objects.problem

    def build(**change):
        return ds.Study.from_arrays(problem, **kw, **dict(a, **change))

    times = a["times"].copy()
    times[4, 1:3] = [2.0, 1.0]
    with pytest.raises(ValueError, match=r"experiment 'e4' \(row 4\): times are out of order .* sort them"):
        build(times=times)
    data = a["data"].copy()
    data[5] = np.nan
    with pytest.raises(ValueError, match=r"experiment 'e5' \(row 5\): data holds no measured value"):
        build(data=data)
    data = a["data"].copy()
    data[0, 3, 0] = 1.0  # e0 has 3 times: its fourth is padding
    with pytest.raises(ValueError, match=r"experiment 'e0' \(row 0\): data\[3, 0\] is measured at a padded"):
        build(data=data)
    sigma = np.full(a["data"].shape, 0.02)
    sigma[7, 0, 1] = -1.0
    with pytest.raises(ValueError, match=r"experiment 'e7' \(row 7\): the spread of data\[0, 1\] is -1.0"):
        ds.Study.from_arrays(problem, parameters=objects.parameters, noise=Gaussian(sigma), **a)
    with pytest.raises(ValueError, match=r"duplicate experiment ids \['e1'\]"):
        build(ids=["e0", "e1", "e1", "e3", "e4", "e5", "e6", "e7"])
    with pytest.raises(ValueError, match=r"conditions names unknown model parameter\(s\) \['kx'\]"):
        build(conditions={"kx": np.ones(8)})
    with pytest.raises(ValueError, match=r"y0 has shape \(8, 2\)"):
        build(y0=np.zeros((8, 2)))
    with pytest.raises(ValueError, match=r"experiment '2' \(row 2\): times\[0\] = -1.0 is before t0"):
        ds.Study.from_arrays(problem, np.where(np.arange(8)[:, None] == 2, -1.0, a["times"]), a["data"], **kw)
    # Levels: a member in two outer members.
    with pytest.raises(ValueError, match=r"experiment 'e1' \(row 1\): groups: member 'p1' of level 'patient'"):
        build(groups={"site": ["A", "B"] * 4, "patient": ["p1"] * 8})

    table = table_of(objects)
    bad = table.copy()
    bad.loc[3, "observable"] = "D"
    eid = bad.loc[3, "experiment"]
    with pytest.raises(ValueError, match=rf"row 3 \(experiment '{eid}'\), column 'observable': unknown observable 'D'"):
        ds.Study.from_table(problem, bad, parameters=objects.parameters)
    bad = table.copy()
    bad.loc[5, "sigma"] = 0.0
    eid = bad.loc[5, "experiment"]
    with pytest.raises(ValueError, match=rf"row 5 \(experiment '{eid}'\), column 'sigma': 0.0 is not a positive"):
        ds.Study.from_table(problem, bad, parameters=objects.parameters)
    bad = table.copy()
    rows = np.flatnonzero(bad["experiment"] == "e3")
    bad.loc[rows[-1], "k3"] = 0.9
    with pytest.raises(ValueError, match=rf"row {rows[-1]} \(experiment 'e3'\), column 'k3': 0.9 differs from the "):
        ds.Study.from_table(problem, bad, conditions=["k3"], parameters=objects.parameters)
    with pytest.raises(ValueError, match=r"the table has no column\(s\) \['when'\]"):
        ds.Study.from_table(problem, table, time="when", parameters=objects.parameters)


def test_table_files_and_replicates(studies, tmp_path):
    objects, arrays, _ = studies
    table = table_of(objects)
    path = tmp_path / "data.csv"
    table.to_csv(path, index=False)
    study = ds.Study.from_table(objects.problem, path, conditions=["k3"], y0={"A": "A0"}, parameters=objects.parameters)
    assert ds.lower(study).value(THETA) == pytest.approx(ds.lower(objects).value(THETA), rel=RTOL)
    # Wide: one row per time, a column per observable and its spread ("sigma:<observable>").
    wide = pd.DataFrame([dict(experiment=e.id, time=t, k3=e.conditions.get("k3", np.nan), A0=e.y0["A"],
                              **{n: e.data[i, j] for j, n in enumerate("ABC")}, **{f"sigma:{n}": 0.02 for n in "ABC"})
                         for e in objects.experiments for i, t in enumerate(e.times)])  # fmt: skip
    wide = wide.sample(frac=1.0, random_state=2)
    study = ds.Study.from_table(objects.problem, wide, conditions=["k3"], y0={"A": "A0"}, parameters=objects.parameters)
    assert ds.lower(study).value(THETA) == pytest.approx(ds.lower(objects).value(THETA), rel=RTOL)
    # A replicate (same experiment, time and observable) gets a time row of its own.
    twice = pd.concat([table, table[table["experiment"] == "e1"]], ignore_index=True)
    study = ds.Study.from_table(objects.problem, twice, conditions=["k3"], y0={"A": "A0"}, parameters=objects.parameters)
    e1 = study.experiments[study.index_of("e1")]
    np.testing.assert_array_equal(e1.times, np.repeat(objects.experiments[1].times, 2))
    v = ds.lower(study).value(THETA)
    one = ds.Study(objects.problem, [objects.experiments[1]], objects.parameters)
    assert v == pytest.approx(ds.lower(objects).value(THETA) + ds.lower(one).value(THETA), rel=RTOL)


def test_results_store_has_an_experiment_axis(studies, tmp_path):
    from diffsoup.store import read_experiment_arrays, read_fit, write_simulation

    objects, arrays, _ = studies
    problem = InferenceProblem(arrays)
    predicted = problem.predict_arrays(THETA)
    expect = InferenceProblem(objects).predict(THETA)
    path = write_simulation(tmp_path / "sim.zarr", arrays, predicted, {"k1": 1.0})
    stored = read_experiment_arrays(path)
    assert stored["states"].shape == (8, 4, 3) and list(stored["ids"][...]) == list(arrays.ids)
    back = read_fit(path)["experiments"]
    for eid, rec in expect.items():
        np.testing.assert_allclose(back[eid]["states"], rec["states"], rtol=1e-13)
        np.testing.assert_array_equal(back[eid]["times"], rec["times"])
        np.testing.assert_array_equal(back[eid]["data"], objects.experiments[objects.index_of(eid)].data)
        assert back[eid]["status"] == "SUCCESS"
    # The objects' study keeps one group per experiment.
    path = write_simulation(tmp_path / "old.zarr", objects, expect, {"k1": 1.0})
    with pytest.raises(ValueError, match="one group per experiment"):
        read_experiment_arrays(path)
    assert set(read_fit(path)["experiments"]) == set(expect)


def test_true_parameters_fit_from_arrays():
    """A fit of a study of arrays lands near the parameters that made its data."""
    objects = tiny_study(n=8, seed=3)
    a = arrays_of(objects)
    study = ds.Study.from_arrays(objects.problem, noise=Gaussian(0.02), parameters=objects.parameters, **a)
    result = ds.inference.fit(ds.lower(study), starts=2, seed=0)
    for name, value in TRUE.items():
        assert result.parameters[name] == pytest.approx(value, rel=0.2)


STUDY_FILE = """\
format = "diffsoup-study/2"
levels = ["lab"]

[model]
species = ["A", "B", "C"]
reactions = [["A -> B", "k1"], ["B -> C", "k2"]]
parameters = {{ k1 = 1.0, k2 = 0.5 }}
y0 = {{ A = 1.0 }}

[observables]
scaled = "2.5 * B + k2 * exp(-C)"

[noise]
sigma = 0.05

[[parameters]]
name = "k1"
lower = 0.1
upper = 10.0
level = "lab"

[[parameters]]
name = "k2"
lower = 0.05
upper = 5.0
{experiments}"""

COHORT = """experiment,time,A,scaled,sigma:A,lab,k2,A0
e1,0.5,0.61,0.9,0.02,north,0.4,1.0
e1,1.0,0.37,,0.02,north,0.4,1.0
e2,0.5,1.2,1.1,0.03,south,0.6,2.0
e2,1.0,0.74,1.0,0.03,south,0.6,2.0
e2,2.0,0.3,0.8,0.03,south,0.6,2.0
e3,1.0,0.5,0.7,0.02,north,0.5,1.5
"""


def test_study_file_experiment_table(tmp_path):
    """One [experiment_table] gives the study of the same [[experiments]] tables, held as arrays."""
    from diffsoup.formats import StudyFileError, load_study

    (tmp_path / "cohort.csv").write_text(COHORT)
    table = '\n[experiment_table]\ndata = "cohort.csv"\nobservables = ["A", "scaled"]\nconditions = ["k2"]\n' \
            'groups = {lab = "lab"}\ny0 = {A = "A0"}\n'  # fmt: skip
    rows = {"e1": ("north", 0.4, 1.0), "e2": ("south", 0.6, 2.0), "e3": ("north", 0.5, 1.5)}
    # The per-experiment reader reads every other column as an observable: its file has no more.
    plain = "\n".join(",".join(line.split(",")[:5]) for line in COHORT.splitlines()) + "\n"
    (tmp_path / "plain.csv").write_text(plain)
    tables = "".join(f'\n[[experiments]]\nid = "{e}"\ndata = "plain.csv"\nobservables = ["A", "scaled"]\n'
                     f'groups = {{lab = "{lab}"}}\nconditions = {{k2 = {k2}}}\ny0 = {{A = {a0}}}\n'
                     for e, (lab, k2, a0) in rows.items())  # fmt: skip
    (tmp_path / "table.toml").write_text(STUDY_FILE.format(experiments=table))
    (tmp_path / "objects.toml").write_text(STUDY_FILE.format(experiments=tables))
    arrays, objects = load_study(tmp_path / "table.toml"), load_study(tmp_path / "objects.toml")
    assert arrays.study.arrays is not None and arrays.study.ids == ("e1", "e2", "e3")
    assert arrays.observables["e2"] == ["A", "scaled"] and arrays.study.entry_names == objects.study.entry_names
    theta = np.log10([1.3, 0.7, 0.8])
    assert arrays.lower().value(theta) == pytest.approx(objects.lower().value(theta), rel=RTOL)
    (tmp_path / "bad.csv").write_text(COHORT.replace("e3,1.0,0.5,0.7,0.02,north", "e3,1.0,0.5,0.7,-1,north"))
    (tmp_path / "bad.toml").write_text(STUDY_FILE.format(experiments=table.replace("cohort.csv", "bad.csv")))
    with pytest.raises(StudyFileError, match=r"row 5 \(experiment 'e3'\), column 'sigma:A': -1.0 is not a positive"):
        load_study(tmp_path / "bad.toml")


def test_names_in_conditions_spreads_and_observable_parameters_resolve_as_the_views_do(studies):
    """Study parameters' names given per experiment (in conditions, spreads and observable
    parameters, numbers elsewhere): the vectorized plan is, row by row, what the object path
    resolves for the row's Experiment view; an unknown name is refused naming the experiment."""
    objects, _, _ = studies
    a = arrays_of(objects)
    E = len(a["ids"])
    k3 = np.array([0.25 if i % 2 else "k2" for i in range(E)], dtype=object)  # even rows: k3 is k2's entry
    gain = np.array(["k1" if i % 3 else 2.0 for i in range(E)], dtype=object)
    sigma = np.full(a["data"].shape[:2], 0.02).astype(object)
    sigma[::2, 1] = "k3"
    params = objects.parameters
    study = ds.Study.from_arrays(objects.problem, parameters=params, observable_parameters={"gain": gain},
                                 noise=[Gaussian(0.02), Gaussian(sigma), Gaussian("k1")],
                                 **dict(a, conditions={"k3": k3}))  # fmt: skip
    plan = study.array_plan
    for i, eid in enumerate(study.ids):
        view = study.resolved[eid]
        for j, (kind, value) in enumerate(view["plan"]):
            entry, fixed = (np.broadcast_to(x, (E,))[i] for x in plan.columns[j])
            assert (kind, value) == (("entry", entry) if entry >= 0 else ("fixed", fixed))
        ((name, (kind, value)),) = view["observable_plan"]
        entry, fixed = (np.broadcast_to(x, (E,))[i] for x in plan.observable_columns[0])
        assert name == "gain" and (kind, value) == (("entry", entry) if entry >= 0 else ("fixed", fixed))
        m = len(study.experiments[i].times)
        np.testing.assert_array_equal(np.broadcast_to(plan.sigma_cells, a["data"].shape)[i, :m], view["sigma_entries"])
    assert study.entry_index["k2"] in plan.columns[2][0] and study.entry_index["k3"] in plan.sigma_cells
    with pytest.raises(ValueError, match=r"experiment 'e0' \(row 0\): conditions\['k3'\] names 'nope', which is not"):
        ds.Study.from_arrays(objects.problem, parameters=params, noise=Gaussian(0.02),
                             **dict(a, conditions={"k3": np.where(k3 == "k2", "nope", k3)}))  # fmt: skip
    gain[4] = np.nan
    with pytest.raises(ValueError, match=r"experiment 'e4' \(row 4\): observable_parameters\['gain'\] is nan"):
        ds.Study.from_arrays(objects.problem, parameters=params, noise=Gaussian(0.02),
                             observable_parameters={"gain": gain}, **a)  # fmt: skip
