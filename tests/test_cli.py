"""The ``diffsoup`` command end to end: the demo on the embedded default (a local Dask cluster),
fit / campaign / simulate on a study file, results read back with plain zarr, plots written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}


def diffsoup(*args, cwd=None, check=True):
    proc = subprocess.run([sys.executable, "-m", "diffsoup", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=ENV, timeout=900)  # fmt: skip
    if check and proc.returncode != 0:
        raise AssertionError(f"diffsoup {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def is_png(path) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(path) > 10_000


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """``diffsoup demo`` as the README runs it (small grid and study to keep CI short)."""
    out = tmp_path_factory.mktemp("demo") / "demo"
    proc = diffsoup("demo", "--grid", 8, "--experiments", 10, "-o", out)
    return out, proc


@pytest.mark.slow
def test_demo_runs_end_to_end_on_a_local_dask_cluster(demo):
    out, proc = demo
    text = proc.stdout
    assert "ROBER to t=1e11" in text and "Brusselator 2-D N=8" in text and "relative difference" in text
    assert "starting the embedded default: a local Dask cluster" in text
    assert "Dask dashboard: http://127.0.0.1:" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["where"].startswith("Dask scheduler tcp://127.0.0.1:")
    assert summary["experiment_status"] == {"SUCCESS": 10}
    from diffsoup._demo_study import TRUTH

    for name, true in TRUTH.items():  # the synthetic truth is recovered within 4 standard errors
        z = (np.log10(summary["parameters"][name]) - np.log10(true)) / summary["standard_errors"][name]
        assert abs(z) < 4, (name, z)
    assert summary["starts"]["at_best"] >= 2


@pytest.mark.slow
def test_results_store_reads_back_with_plain_zarr(demo):
    import zarr

    out, _ = demo
    summary = json.loads((out / "summary.json").read_text())
    root = zarr.open_group(str(out / "results.zarr"), mode="r")
    assert root.attrs["format"] == "diffsoup.fit/1" and root.attrs["complete"] is True
    assert root.attrs["parameters"] == summary["parameters"]
    theta = root["theta"][...]
    np.testing.assert_allclose(10.0 ** theta, [summary["parameters"][n] for n in root.attrs["theta_names"]], rtol=1e-12)
    assert root["starts/objective"].shape == (summary["starts"]["total"],)
    assert np.min(root["starts/objective"][...]) == pytest.approx(summary["objective"])
    g = root["experiments/0"]
    assert g.attrs["id"] == "run00" and g.attrs["status"] == "SUCCESS"
    assert g.attrs["observables"] == ["S", "P", "bound"]
    data, obs, states = g["data"][...], g["observables"][...], g["states"][...]
    assert data.shape == obs.shape == (10, 3) and states.shape == (10, 5)
    np.testing.assert_allclose(obs[:, 2], states[:, 2] + states[:, 4], rtol=1e-12)  # bound = C + CI
    assert np.max(np.abs(obs - data)) < 6 * 0.01  # the fit is within a few sigma everywhere


@pytest.mark.slow
def test_demo_plots_are_pngs(demo):
    out, _ = demo
    for name in ("fits", "waterfall", "estimates"):
        assert is_png(out / "plots" / f"{name}.png"), name


@pytest.mark.slow
def test_simulate_from_the_fit_reproduces_the_fitted_observables(demo, tmp_path):
    import zarr

    out, _ = demo
    diffsoup("simulate", out / "study.toml", "-o", tmp_path, "--from-fit", out / "results.zarr")
    sim = zarr.open_group(str(tmp_path / "simulation.zarr"), mode="r")
    fit = zarr.open_group(str(out / "results.zarr"), mode="r")
    assert sim.attrs["format"] == "diffsoup.simulation/1"
    for i in (0, 5):
        np.testing.assert_allclose(sim[f"experiments/{i}/observables"][...], fit[f"experiments/{i}/observables"][...],
                                   rtol=1e-10, atol=1e-12)  # fmt: skip
    assert is_png(tmp_path / "plots" / "fits.png")
    bad = diffsoup("simulate", out / "study.toml", "-o", tmp_path, "--set", "kcat=x", check=False)
    assert bad.returncode != 0 and "NAME=VALUE" in bad.stderr


@pytest.mark.slow
def test_campaign_in_process_resumes_from_its_ledger(demo, tmp_path):
    out, _ = demo
    first = diffsoup("campaign", out / "study.toml", "-o", tmp_path, "--starts", 2, "--max-nfev", 15, "--in-process")
    assert "2 of 2 starts accepted (0 from an earlier run)" in first.stdout
    ledger = json.loads((tmp_path / "campaign.json").read_text())
    assert sorted(ledger["tasks"]) == ["start-0000", "start-0001"]
    again = diffsoup("campaign", out / "study.toml", "-o", tmp_path, "--starts", 2, "--max-nfev", 15, "--in-process")
    assert "2 of 2 starts accepted (2 from an earlier run)" in again.stdout
    other = diffsoup("campaign", out / "study.toml", "-o", tmp_path, "--starts", 2, "--seed", 9, "--in-process",
                     check=False)  # fmt: skip
    assert other.returncode == 2 and "--restart" in other.stderr
    # The same starts with another optimizer (the file's is trf) are other tasks: refused, not
    # resumed from the ledger.
    fides = diffsoup("campaign", out / "study.toml", "-o", tmp_path, "--starts", 2, "--max-nfev", 15, "--method",
                     "fides", "--in-process", check=False)  # fmt: skip
    assert fides.returncode == 2 and "--restart" in fides.stderr
    hierarchical = diffsoup("campaign", out / "study.toml", "-o", tmp_path, "--starts", 2, "--max-nfev", 15,
                            "--hierarchical", "--in-process", check=False)  # fmt: skip
    assert hierarchical.returncode == 2 and "--restart" in hierarchical.stderr


def test_check_reports_a_malformed_file_by_line_and_field(tmp_path):
    study = tmp_path / "study.toml"
    study.write_text('format = "diffsoup-study/1"\n[model]\nspecies = ["A"]\nreactions = [["A -> ", "k"]]\n'
                     'parmeters = { k = 1.0 }\n')  # fmt: skip
    proc = diffsoup("check", study, check=False)
    assert proc.returncode == 2
    assert f"{study}:5: model.parmeters: unknown key 'parmeters'; did you mean 'parameters'?" in proc.stderr


def test_every_command_has_help(capsys):
    from diffsoup.cli import main

    for command in ("demo", "check", "simulate", "profile", "campaign"):  # in this process: argparse exits
        with pytest.raises(SystemExit) as exit_:
            main([command, "--help"])
        assert exit_.value.code == 0 and "usage: diffsoup " + command in capsys.readouterr().out
    text = diffsoup("fit", "--help").stdout  # the installed command's own
    assert "usage: diffsoup fit" in text
    for option in ("--scheduler", "--slurm", "--in-process", "--starts", "--method"):
        assert option in text
    assert diffsoup("fit", "nowhere.toml", check=False).returncode == 2
    from diffsoup.cli import FIT_METHODS
    from diffsoup.inference.fitting._fit import METHODS

    assert FIT_METHODS == METHODS  # the command's --method choices are fit's methods


@pytest.mark.slow
def test_fit_on_a_scheduler_address(demo, tmp_path):
    from distributed import LocalCluster

    out, _ = demo
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, resources={"GPU": 1}, host="127.0.0.1",
                      dashboard_address=":0") as cluster:  # fmt: skip
        proc = diffsoup("fit", out / "study.toml", "-o", tmp_path, "--scheduler", cluster.scheduler_address,
                        "--starts", 1, "--max-nfev", 10, "--no-plots")  # fmt: skip
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["where"].startswith(f"Dask scheduler {cluster.scheduler_address} (1 worker")
    assert summary["plots"] == [] and summary["experiment_status"] == {"SUCCESS": 10}
    assert "results" in proc.stdout


def test_simulate_with_an_unknown_parameter_says_so(tmp_path):
    from diffsoup._demo_study import write_demo_study

    study = write_demo_study(tmp_path, n_experiments=2)
    proc = diffsoup("simulate", study, "-o", tmp_path / "out", "--set", "kcatt=2", check=False)
    assert proc.returncode == 1 and "['kcatt'] are not parameters of enzyme-demo" in proc.stderr
    assert "Traceback" not in proc.stderr


PY_MODEL = '''\
import jax.numpy as jnp
import diffsoup as ds

print("the model file ran")


def make():
    def rhs(t, y, p):
        return jnp.stack([-p["k1"] * y[0], p["k1"] * y[0]])
    return ds.ProblemSpec(rhs, states=["A", "B"], parameters={"k1": 1.0}, y0=[1.0, 0.0])
'''

PY_STUDY = '''\
format = "diffsoup-study/1"
{levels}
[model]
python = "model.py:make"

[[parameters]]
name = "k1"
lower = 0.1
upper = 10.0
{level}
[[experiments]]
id = "e1"
data = "e.csv"
{group1}
[[experiments]]
id = "e2"
data = "e.csv"
{group2}'''


def python_study(tmp_path, with_levels=False):
    (tmp_path / "model.py").write_text(PY_MODEL)
    (tmp_path / "e.csv").write_text("time,A\n1.0,0.37\n2.0,0.14\n")
    fill = dict(levels='levels = ["lab"]', level='level = "lab"', group1='groups = { lab = "north" }',
                group2='groups = { lab = "south" }') if with_levels else dict(levels="", level="", group1="", group2="")  # fmt: skip
    study = tmp_path / "study.toml"
    study.write_text(PY_STUDY.format(**fill))
    return study


def test_check_says_it_runs_the_python_code_of_a_study_file_first(tmp_path):
    study = python_study(tmp_path)
    proc = diffsoup("check", study)
    notice = f"running Python code from {study}: model.py:make (a study file with Python is code, like a script)"
    assert notice in proc.stdout
    assert proc.stdout.index(notice) < proc.stdout.index("the model file ran")
    help_text = diffsoup("check", "--help").stdout
    assert "is code, like a script" in " ".join(help_text.split())


def test_check_counts_level_values_only_for_a_study_with_levels(tmp_path):
    proc = diffsoup("check", python_study(tmp_path))
    assert "  parameters: 1 (1 estimated)\n" in proc.stdout and "entries" not in proc.stdout
    proc = diffsoup("check", python_study(tmp_path, with_levels=True))
    assert "  parameters: 1 (1 estimated; 2 values once expanded over the members of their levels)" in proc.stdout
    assert "levels: lab (2 members)" in proc.stdout


def test_simulate_from_a_missing_fit_names_the_path_in_one_line(tmp_path):
    study = python_study(tmp_path)
    proc = diffsoup("simulate", study, "-o", tmp_path / "out", "--from-fit", tmp_path / "missing.zarr", check=False)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"--from-fit: {tmp_path / 'missing.zarr'} not found" in proc.stderr
    (tmp_path / "empty").mkdir()
    proc = diffsoup("simulate", study, "-o", tmp_path / "out", "--from-fit", tmp_path / "empty", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"--from-fit: {tmp_path / 'empty'} is not a diffsoup result store" in proc.stderr


@pytest.mark.slow
def test_a_study_whose_every_solve_fails_exits_non_zero_naming_the_status(tmp_path):
    from diffsoup._demo_study import write_demo_study

    study = write_demo_study(tmp_path / "demo", n_experiments=2)
    study.write_text(study.read_text().replace("atol = 1e-10\n", "atol = 1e-10\nmax_steps = 5\n"))
    out = tmp_path / "sim"
    proc = diffsoup("simulate", "demo/study.toml", "-o", "sim", cwd=tmp_path, check=False)  # relative paths
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "all 2 experiments failed: MAX_STEPS -- raise [solver] max_steps (now 5)" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    # the outputs are still written, paths relative to the output directory, printed as given
    summary = json.loads((out / "summary.json").read_text())
    assert summary["experiment_status"] == {"MAX_STEPS": 2}
    assert summary["results"] == "simulation.zarr" and summary["plots"] == ["plots/fits.png"]
    assert summary["study_file"] == os.path.join("..", "demo", "study.toml")
    assert f"results  {os.path.join('sim', 'simulation.zarr')}" in proc.stdout
    assert str(tmp_path) not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "(in demo/study.toml)" in proc.stderr
    proc = diffsoup("fit", study, "-o", tmp_path / "fit", "--in-process", "--starts", 1, "--max-nfev", 3, "--no-plots",
                    check=False)  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "every start failed" in proc.stderr and "all 2 experiments failed at the nominal values: MAX_STEPS" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = diffsoup("campaign", study, "-o", tmp_path / "campaign", "--in-process", "--starts", 1, "--max-nfev", 3,
                    "--no-plots", check=False)  # fmt: skip
    assert proc.returncode == 1 and "all 2 experiments failed at the nominal values: MAX_STEPS" in proc.stderr


@pytest.mark.slow
def test_campaign_on_a_scheduler_without_gpu_workers_fails_after_the_timeout(demo, tmp_path):
    # `campaign --scheduler` passes no no_worker_timeout: the setting diffsoup.campaign.no-worker-timeout
    # applies (60 s shipped; 3 s here through Dask's environment configuration).
    from distributed import LocalCluster

    out, _ = demo
    env = {**ENV, "DASK_DIFFSOUP__CAMPAIGN__NO_WORKER_TIMEOUT": "3"}
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster:  # fmt: skip  (no GPU resource)
        proc = subprocess.run([sys.executable, "-m", "diffsoup", "campaign", str(out / "study.toml"), "-o",
                               str(tmp_path), "--scheduler", cluster.scheduler_address, "--starts", "2", "--no-plots"],
                              capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "campaign: every start failed" in proc.stderr and "no_worker_timeout=3 s" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_diffsoup_errors_print_as_one_line(tmp_path, monkeypatch, capsys):
    import diffsoup as ds
    from diffsoup import cli
    from diffsoup.store import LedgerError
    from diffsoup.workflows import StudyFailedError

    study = tmp_path / "study.toml"
    study.write_text("")

    def failing(raise_it):
        monkeypatch.setattr(cli, "_check", lambda args: raise_it())
        monkeypatch.delenv("DIFFSOUP_TRACEBACK", raising=False)
        code = cli.main(["check", str(study)])
        return code, capsys.readouterr().err

    def solve_error():
        raise ds.SolveError(np.array([1, 0, 4]))

    def bad_parameter():
        ds.inference.Parameter("k", lower=1.0, upper=0.5)

    def bad_experiment():  # a plain ValueError raised by diffsoup's code
        ds.Experiment("", [1.0], [1.0])

    def ledger():
        raise LedgerError(f"{tmp_path}/campaign.json: its checksum does not match")

    def study_failed():
        raise StudyFailedError("all 3 experiments failed: MAX_STEPS", {"MAX_STEPS": 3})

    def denied():
        raise PermissionError(13, "Permission denied", str(tmp_path / "out"))

    cases = [(solve_error, "SolveError: ds.simulate failed: 2 of 3 solve(s) did not succeed; MAX_STEPS: reached"),
             (bad_parameter, "ParameterError: Parameter 'k': lower bound 1.0 is above the upper bound 0.5; swap"),
             (bad_experiment, "Experiment id must be a non-empty string, not ''."),
             (ledger, "LedgerError: "), (study_failed, "StudyFailedError: all 3 experiments failed: MAX_STEPS"),
             (denied, f"PermissionError: [Errno 13] Permission denied: '{tmp_path / 'out'}'")]  # fmt: skip
    for raise_it, words in cases:
        code, err = failing(raise_it)
        assert code == 1 and err.startswith(f"diffsoup check: {words}"), err
        assert len(err.strip().splitlines()) == 1 and "DIFFSOUP_TRACEBACK" not in err, err
    # an error from below diffsoup keeps the pointer to its traceback; a TypeError from below is a bug
    code, err = failing(lambda: np.zeros(2).reshape(3))
    assert code == 1 and len(err.strip().splitlines()) == 1 and "DIFFSOUP_TRACEBACK=1" in err
    with pytest.raises(TypeError):
        failing(lambda: np.zeros(2).reshape("x"))


# ------------------------------------------------------------------------------------------------
# PEtab problems: the commands take a PEtab YAML file wherever they take a study file
# ------------------------------------------------------------------------------------------------

PETAB = os.path.join(os.path.dirname(__file__), "data", "petab")


def test_check_reads_a_petab_problem_and_reports_a_bad_table_by_file_row_and_column(tmp_path):
    import shutil

    name = "Bruno_JExpBot2016"
    proc = diffsoup("check", os.path.join(PETAB, name, f"{name}.yaml"))
    assert f"PEtab v1 problem {name!r} (77 measurements" in proc.stdout
    assert "experiments: 6" in proc.stdout and "parameters: 13 (13 estimated)" in proc.stdout
    assert "solver: rtol=1e-08, atol=1e-08" in proc.stdout
    folder = tmp_path / name
    shutil.copytree(os.path.join(PETAB, name), folder)
    table = folder / f"measurementData_{name}.tsv"
    lines = table.read_text().splitlines()
    lines[3] = lines[3].replace("model1_data1", "no_such_condition", 1)
    table.write_text("\n".join(lines) + "\n")
    proc = diffsoup("check", folder / f"{name}.yaml", check=False)
    assert proc.returncode == 2
    assert (f"{table}, row 3 (line 4), column 'simulationConditionId': 'no_such_condition' is not in the condition "
            "table") in proc.stderr  # fmt: skip
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_campaign_on_a_petab_problem_writes_the_fit_and_the_simulation_table(tmp_path):
    name = "Boehm_JProteomeRes2014"
    yaml = os.path.join(PETAB, name, f"{name}.yaml")
    out = tmp_path / "campaign"
    diffsoup("campaign", yaml, "-o", out, "--starts", 2, "--max-nfev", 4, "--in-process", "--no-plots")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["campaign"]["accepted"] == 2 and summary["experiments"] == 1
    assert summary["petab_simulation_table"] == "simulation.tsv"
    assert len(summary["parameters"]) == 9
    import pandas as pd

    table = pd.read_csv(out / "simulation.tsv", sep="\t")
    assert len(table) == 48 and "simulation" in table and np.all(np.isfinite(table["simulation"]))


# ------------------------------------------------------------------------------------------------
# diffsoup profile: intervals of a fit, against the closed-form profile of the decay model
# ------------------------------------------------------------------------------------------------

DECAY_MODEL = '''\
import diffsoup as ds


def make():
    return ds.ProblemSpec(lambda t, y, p: -p["k"] * y, states=["y"], parameters={"k": 0.5, "A": 2.0}, y0=[1.0])
'''

DECAY_STUDY = '''\
format = "diffsoup-study/1"
name = "decay"

[model]
python = "model.py:make"

[observables]
h = "A * y"

[solver]
rtol = 1e-10
atol = 1e-12

[noise]
sigma = {sigma!r}

[[parameters]]
name = "A"
lower = 0.01
upper = 100.0
scale = "log10"

[[parameters]]
name = "k"
lower = 0.01
upper = 100.0
scale = "log10"

[[experiments]]
id = "decay"
data = "decay.csv"
'''


def write_decay_study(folder, fit: str = ""):
    """The decay model and data set 0 of tests/fit_helpers.py as ``folder/study.toml`` (with
    ``fit`` appended: a ``[fit]`` table), its model and data file beside it; returns the path."""
    import pandas as pd
    from fit_helpers import SIGMA, TIMES, data

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(DECAY_MODEL)
    (folder / "study.toml").write_text(DECAY_STUDY.format(sigma=SIGMA) + fit)
    pd.DataFrame({"time": TIMES, "h": data(0)[:, 0]}).to_csv(folder / "decay.csv", index=False, float_format="%.17g")
    return folder / "study.toml"


def test_campaign_tasks_find_the_analytic_parameters_once_and_end_where_fit_does(tmp_path, monkeypatch):
    """A campaign in this process finds the parameters optimized analytically once, before its
    tasks; a worker's tasks find them once per study and choice (not at every start), and a task
    ends where ``fit`` from the same point ends."""
    import pickle

    from diffsoup.distributed import _analytic_memo, _lowered_cache, _start_runs
    from diffsoup.inference import fit
    from diffsoup.inference.fitting._fit import optimizer_of
    from diffsoup.inference.fitting._hierarchical import AnalyticParameters
    from diffsoup.workflows import campaign_study, study_digest
    from diffsoup.workflows._study_runs import StudyLowering

    study = write_decay_study(tmp_path)  # A, a scaling of the observable: optimized analytically when named
    real = AnalyticParameters.find.__func__
    calls = []

    def counted(cls, lowered, names=True, theta=None):
        calls.append(names)
        return real(cls, lowered, names, theta)

    monkeypatch.setattr(AnalyticParameters, "find", classmethod(counted))
    summary = campaign_study(study, tmp_path / "campaign", starts=3, hierarchical=["A"], progress=False, plots=False,
                             log=lambda line: None)  # fmt: skip
    assert calls == [["A"]] and summary["analytic"] == ["A"]
    # A worker process (the task unpickled there, an empty cache): the study is lowered by the
    # first task, the parameters found once for both.
    monkeypatch.setattr(_lowered_cache, "LOWERED", _lowered_cache.LoweredCache())
    monkeypatch.setattr(_analytic_memo, "_ANALYTIC", [None, None, None])
    calls.clear()
    task = _start_runs.StartTask(StudyLowering(str(study.resolve()), study_digest(study)), optimizer_of("fides"),
                                 seed=0, resample_failed_starts=0, analytic=["A"])  # fmt: skip
    task = pickle.loads(pickle.dumps(task))
    points = [[0.5, -0.5], [1.5, -1.0]]
    done = [task({"index": i, "x0": p}) for i, p in enumerate(points)]
    assert [list(c) for c in calls] == [["A"]] and [d["built_here"] for d in done] == [True, False]
    lowered, built = _lowered_cache.lowered_from(task.lowered, task.fingerprint)
    assert not built and _lowered_cache.LOWERED.lowerings == 1
    for p, d in zip(points, done):
        expected = fit(lowered, starts=np.array([p]), hierarchical=["A"]).starts[0]
        assert d["objective"] == pytest.approx(expected.objective, abs=1e-10)
        np.testing.assert_allclose(d["x"], expected.x, atol=1e-10)
        assert d["n_evaluations"] == expected.n_evaluations


def test_campaign_reads_a_ledger_of_an_earlier_diffsoup_as_the_same_starts(tmp_path):
    """A ledger whose starts an earlier diffsoup named ``start-000``, ``start-001`` (with the
    fingerprints of its items) resumes: no start runs again and the fit is the same; the file is
    rewritten with today's ids, the old one kept as a .bak. A record under an old id of another
    start (another point) is a conflict, as it was."""
    from diffsoup.inference.fitting._fit import optimizer_of, start_points
    from diffsoup.store import Ledger, LedgerConflictError, fingerprint
    from diffsoup.workflows import campaign_study, study_digest

    study = write_decay_study(tmp_path / "study")
    settings = dict(starts=2, seed=3, method="trf", max_nfev=10, hierarchical=False, progress=False, plots=False)
    first = campaign_study(study, tmp_path / "new", log=lambda line: None, **settings)
    done = Ledger.load(tmp_path / "new" / "campaign.json")
    # The items of the earlier version, as it made them.
    from diffsoup.formats import load_study

    points = start_points(load_study(study).lower(), 2, 3)

    def old_ledger(folder, moved=()):
        records = {}
        for i, p in enumerate(points):
            x0 = [float(v) + (0.5 if i in moved else 0.0) for v in p]
            item = {"task_id": f"start-{i:03d}", "x0": x0, "study_digest": study_digest(study),
                    "optimizer": repr(optimizer_of("trf", max_nfev=10)), "hierarchical": False}  # fmt: skip
            record = done.get(f"start-{i:04d}")
            record["result"] = {k: v for k, v in record["result"].items() if k != "resampled"}  # not there before
            records[item["task_id"]] = {**record, "task_id": item["task_id"], "fingerprint": fingerprint(item)}
        folder.mkdir()
        Ledger(folder / "campaign.json", function="diffsoup.workflows._study_runs.FitStartTask", tasks=records).save()

    old_ledger(tmp_path / "old")
    lines = []
    again = campaign_study(study, tmp_path / "old", log=lines.append, **settings)
    assert again["campaign"]["resumed"] == 2 and again["campaign"]["accepted"] == 2
    assert again["objective"] == first["objective"] and again["parameters"] == first["parameters"]
    assert sorted(json.loads((tmp_path / "old" / "campaign.json").read_text())["tasks"]) == ["start-0000", "start-0001"]
    assert len(list((tmp_path / "old").glob("campaign.json.*.bak"))) == 1
    assert any("start-000, ...): read as start-0000" in line for line in lines), lines
    old_ledger(tmp_path / "moved", moved=(1,))
    with pytest.raises(LedgerConflictError, match="recorded task 'start-0001' for a different item"):
        campaign_study(study, tmp_path / "moved", log=lambda line: None, **settings)


@pytest.fixture(scope="module")
def decay_fit(tmp_path_factory):
    """The decay study of :func:`write_decay_study` fitted into ``fit/`` beside it (in this process),
    once for the tests that start from the fit: its folder and the fit's summary."""
    from diffsoup.workflows import fit_study

    folder = tmp_path_factory.mktemp("decay-fit")
    write_decay_study(folder)
    summary = fit_study(folder / "study.toml", folder / "fit", method="fides", starts=2, progress=False, plots=False,
                        log=lambda line: None)  # fmt: skip
    return folder, summary


def fitted_decay_study(folder, decay_fit):
    """The decay study of :func:`write_decay_study` in ``folder``, fitted into ``folder/fit`` (a copy
    of the fixture ``decay_fit``'s); returns the fit's summary."""
    import copy
    import shutil

    shutil.copytree(decay_fit[0], folder, dirs_exist_ok=True)
    return copy.deepcopy(decay_fit[1])


def test_the_summary_says_when_one_start_alone_reached_the_best(tmp_path, capsys, decay_fit):
    """A fit whose best objective one start alone reached says so and what to run (fides: more
    starts or the hybrid Hessian; another method: more starts); starts that agree say nothing."""
    from diffsoup import cli

    summary = fitted_decay_study(tmp_path, decay_fit)
    assert summary["starts"]["at_best"] == summary["starts"]["total"] == 2
    cli._print_summary(summary, tmp_path / "fit")
    assert "only one start" not in capsys.readouterr().out
    lone = {**summary, "starts": {**summary["starts"], "at_best": 1}}
    cli._print_summary(lone, tmp_path / "fit")
    assert "only one start reached the best objective: a lower one may exist; run more starts (--starts 4) or fides " \
           "with --hessian hybrid" in capsys.readouterr().out
    for other in ({"hessian": "hybrid"}, {"method": "trf"}):
        cli._print_summary({**lone, **other}, tmp_path / "fit")
        out = capsys.readouterr().out
        assert "run more starts (--starts 4)\n" in out and "hybrid" not in out


def test_profile_command_gives_the_closed_form_intervals_and_resumes(tmp_path, capsys, decay_fit):
    """``h(t) = A exp(-k t)`` with Gaussian noise (tests/fit_helpers.py) as a study file: the
    intervals of ``diffsoup profile`` match scipy's profile of the closed form; a rerun reads the
    profiles from the ledger."""
    import pandas as pd
    from fit_helpers import closed_form_interval

    from diffsoup import cli

    fit = fitted_decay_study(tmp_path, decay_fit)
    out = tmp_path / "profiles"
    assert cli.main(["profile", str(tmp_path / "study.toml"), "--from-fit", str(tmp_path / "fit"), "-o", str(out),
                     "--in-process"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "profiles: 2 of 2 computed (0 from an earlier run), 0 failed" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["objective"] == pytest.approx(fit["objective"], abs=1e-9)
    table = pd.read_csv(out / "intervals.tsv", sep="\t", index_col="parameter")
    for i, name in enumerate(["A", "k"]):
        lo, hi = closed_form_interval(0, i, summary["delta"])
        se = fit["standard_errors"][name]
        row = table.loc[name]
        # the crossing is located to 1e-2 in the objective (test_profile_likelihood.py)
        assert abs(row["lower"] - lo) < 5e-3 * se and abs(row["upper"] - hi) < 5e-3 * se, (name, row, lo, hi)
        assert not row["lower_open"] and not row["upper_open"]
        assert row["upper_linear"] == pytest.approx(10.0 ** row["upper"], rel=1e-12)
        assert summary["intervals"][name]["lower"] == row["lower"]
        assert f"{name:<24} log10" in text
    assert summary["delta"] == pytest.approx(1.920729410347062)
    assert is_png(out / "plots" / "profiles.png")
    from diffsoup.inference import ProfileResult

    saved = ProfileResult.from_json(json.loads((out / "profiles.json").read_text()))
    assert saved.profiles["k"].interval == (table.loc["k", "lower"], table.loc["k", "upper"])
    # a rerun computes nothing; a wider confidence is another campaign's items (--restart)
    assert cli.main(["profile", str(tmp_path / "study.toml"), "--from-fit", str(tmp_path / "fit" / "results.zarr"),
                     "-o", str(out), "--in-process", "--no-plots", "--parameters", "k"]) == 0  # fmt: skip
    assert "profiles: 1 of 1 computed (1 from an earlier run)" in capsys.readouterr().out
    assert cli.main(["profile", str(tmp_path / "study.toml"), "--from-fit", str(tmp_path / "fit"), "-o", str(out),
                     "--in-process", "--confidence", "0.99", "--parameters", "k"]) == 2  # fmt: skip
    assert "--restart" in capsys.readouterr().err
    assert cli.main(["profile", str(tmp_path / "study.toml"), "--from-fit", str(tmp_path / "fit"), "-o", str(out),
                     "--in-process", "--confidence", "0.99", "--parameters", "k", "--restart", "--no-plots"]) == 0  # fmt: skip
    wider = json.loads((out / "summary.json").read_text())["intervals"]["k"]
    assert wider["lower"] < table.loc["k", "lower"] and wider["upper"] > table.loc["k", "upper"]
    lo, hi = closed_form_interval(0, 1, 0.5 * 6.634896601021214)  # chi2.ppf(0.99, 1) / 2
    assert abs(wider["lower"] - lo) < 5e-3 * fit["standard_errors"]["k"]
    # --hierarchical: A (h is linear in it) optimized analytically at each point; the same intervals.
    assert cli.main(["profile", str(tmp_path / "study.toml"), "--from-fit", str(tmp_path / "fit"), "-o",
                     str(tmp_path / "analytic"), "--in-process", "--hierarchical", "--no-plots"]) == 0  # fmt: skip
    assert "re-optimized by fides, hierarchical" in capsys.readouterr().out
    summary = json.loads((tmp_path / "analytic" / "summary.json").read_text())
    assert summary["hierarchical"] is True
    for i, name in enumerate(["A", "k"]):
        lo, hi = closed_form_interval(0, i, summary["delta"])
        row, se = summary["intervals"][name], fit["standard_errors"][name]
        assert abs(row["lower"] - lo) < 5e-3 * se and abs(row["upper"] - hi) < 5e-3 * se, (name, row, lo, hi)


@pytest.mark.slow
def test_profile_command_runs_each_profile_as_a_task_on_the_embedded_dask_cluster(tmp_path, decay_fit):
    fitted_decay_study(tmp_path, decay_fit)
    here = tmp_path / "here"
    diffsoup("profile", tmp_path / "study.toml", "--from-fit", tmp_path / "fit", "-o", here, "--in-process", "--no-plots")
    out = tmp_path / "dask"
    proc = diffsoup("profile", tmp_path / "study.toml", "--from-fit", tmp_path / "fit", "-o", out, "--workers", 2,
                    "--no-plots")  # fmt: skip
    assert "profiles: 2 of 2 computed (0 from an earlier run), 0 failed" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["where"].startswith("Dask scheduler tcp://127.0.0.1:")
    ledger = json.loads((out / "profile-ledger.json").read_text())["tasks"]
    assert all(r["worker"].startswith("tcp://127.0.0.1:") for r in ledger.values())
    in_process = json.loads((here / "summary.json").read_text())["intervals"]
    for name, row in summary["intervals"].items():  # the same computation, wherever it ran
        assert row["lower"] == pytest.approx(in_process[name]["lower"], abs=1e-9)
        assert row["upper"] == pytest.approx(in_process[name]["upper"], abs=1e-9)


def test_profile_command_names_what_is_wrong_in_one_line(tmp_path, capsys):
    from diffsoup import cli

    study = python_study(tmp_path)
    code = cli.main(["profile", str(study), "--from-fit", str(tmp_path / "nothing"), "-o", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert code == 1 and f"--from-fit: {tmp_path / 'nothing'} not found" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit):
        cli.main(["profile", str(study), "--from-fit", str(tmp_path), "--confidence", "95"])
    assert "--confidence 95.0 must lie between 0 and 1" in capsys.readouterr().err


def test_fit_command_takes_fides_hessian_and_records_it(tmp_path):
    """``diffsoup fit --hessian hybrid`` (pyPESTO's default Hessian) reaches scipy's closed-form
    optimum of the decay study like the default Gauss-Newton run, and the summary says which
    Hessian ran; ``--hessian`` with another method is refused in one line."""
    from fit_helpers import reference_fit

    write_decay_study(tmp_path)
    theta, _, nll = reference_fit(0)
    for hessian in ("gauss_newton", "hybrid"):
        out = tmp_path / hessian
        diffsoup("fit", tmp_path / "study.toml", "-o", out, "--in-process", "--starts", 2, "--hessian", hessian,
                 "--no-plots")  # fmt: skip
        summary = json.loads((out / "summary.json").read_text())
        assert summary["method"] == "fides" and summary["hessian"] == hessian
        assert summary["objective"] == pytest.approx(nll, abs=1e-7)
        got = np.log10([summary["parameters"]["A"], summary["parameters"]["k"]])
        np.testing.assert_allclose(got, theta, atol=1e-5)
    proc = diffsoup("fit", tmp_path / "study.toml", "-o", tmp_path / "trf", "--in-process", "--method", "trf",
                    "--hessian", "hybrid", check=False)  # fmt: skip
    assert proc.returncode == 2
    assert "--hessian hybrid applies to --method fides only (not trf)" in proc.stderr
    # The file's method is trf and the command line asks for a Hessian: an input error naming the field.
    trf = write_decay_study(tmp_path / "trf", '\n[fit]\nmethod = "trf"\n')
    proc = diffsoup("fit", trf, "-o", tmp_path / "trf" / "out", "--in-process", "--hessian", "hybrid",
                    check=False)  # fmt: skip
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "fit.method: is 'trf'" in proc.stderr and "--method fides" in proc.stderr



def test_the_command_hessian_choices_are_the_optimizers():
    """``--hessian`` offers exactly the Hessians ``ds.inference.Fides`` accepts (one vocabulary,
    read by the command rather than copied), and each is accepted by Fides."""
    import argparse

    import diffsoup as ds
    from diffsoup.cli import build_parser
    from diffsoup.inference.fitting._hessians import FIDES_HESSIANS

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for command in ("fit", "campaign"):
        (option,) = [a for a in commands.choices[command]._actions if "--hessian" in a.option_strings]
        assert tuple(option.choices) == FIDES_HESSIANS == ("gauss_newton", "hybrid", "exact", "bfgs", "sr1")
    for hessian in FIDES_HESSIANS:
        assert ds.inference.Fides(hessian=hessian).hessian == hessian
    with pytest.raises(ValueError, match="hessian='newton' must be one of"):
        ds.inference.Fides(hessian="newton")


def test_fit_and_campaign_commands_fit_hierarchically(tmp_path):
    """``[fit] hierarchical = ["A"]`` optimizes the decay study's amplitude A analytically (h = A y
    is linear in it): the fit and the campaign both reach scipy's closed-form optimum, the
    summaries say so; ``--hierarchical`` (every observable-only parameter that qualifies) finds
    none here (A is declared a model parameter) and fits plainly to the same optimum; naming k,
    which h is not linear in, fails in one line that names it."""
    from fit_helpers import reference_fit

    study = write_decay_study(tmp_path, '\n[fit]\nhierarchical = ["A"]\n')
    theta, _, nll = reference_fit(0)
    for command, flag, analytic in (("fit", [], ["A"]), ("campaign", [], ["A"]), ("fit", ["--hierarchical"], [])):
        out = tmp_path / f"{command}{''.join(flag)}"
        diffsoup(command, study, "-o", out, "--in-process", "--starts", 2, *flag, "--no-plots")
        summary = json.loads((out / "summary.json").read_text())
        assert summary["hierarchical"] == (True if flag else ["A"]) and summary["analytic"] == analytic
        assert summary["objective"] == pytest.approx(nll, abs=1e-7)
        got = np.log10([summary["parameters"]["A"], summary["parameters"]["k"]])
        np.testing.assert_allclose(got, theta, atol=1e-5)
    k_study = write_decay_study(tmp_path / "k", '\n[fit]\nhierarchical = ["k"]\n')
    proc = diffsoup("fit", k_study, "-o", tmp_path / "k-fit", "--in-process", "--no-plots", check=False)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "'k' cannot be optimized analytically" in proc.stderr
    # The campaign checks the named parameters once, before any task runs (no ledger is written).
    proc = diffsoup("campaign", k_study, "-o", tmp_path / "k-campaign", "--in-process", "--no-plots",
                    check=False)  # fmt: skip
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "'k' cannot be optimized analytically" in proc.stderr
    assert not (tmp_path / "k-campaign" / "campaign.json").exists()


def test_chunk_size_flag_is_the_deprecated_name_of_draws_per_chunk(tmp_path, capsys):
    """``simulate --samples N --chunk-size K`` still works: it warns on stderr naming
    ``--draws-per-chunk`` and sets the same value; it is not listed in --help; both flags at once
    is a usage error."""
    from diffsoup.cli import build_parser, read_renamed_flags

    parser = build_parser()
    study = str(tmp_path / "study.toml")
    new = parser.parse_args(["simulate", study, "--samples", "8", "--draws-per-chunk", "3"])
    read_renamed_flags(new, parser)
    assert capsys.readouterr().err == ""
    old = parser.parse_args(["simulate", study, "--samples", "8", "--chunk-size", "3"])
    read_renamed_flags(old, parser)
    assert "--chunk-size is deprecated; give --draws-per-chunk" in capsys.readouterr().err
    assert vars(old) == vars(new) and new.draws_per_chunk == 3
    both = parser.parse_args(["simulate", study, "--samples", "8", "--chunk-size", "3", "--draws-per-chunk", "3"])
    with pytest.raises(SystemExit):
        read_renamed_flags(both, parser)
    assert "give --draws-per-chunk only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["simulate", "--help"])
    shown = capsys.readouterr().out
    assert "--draws-per-chunk" in shown and "--chunk-size" not in shown
