"""``multistart(method="batched")``: blocks of starts as campaign tasks (``block-0000``, ...).

Serial, single-process "processes" and Dask runs give the same end state per start (to 1e-10),
and the same as ``fit`` running every start as one block; the ledger resumes a rerun with the same
settings and refuses one with another ``starts_per_block`` or seed, naming it; a Dask run in which
a worker process dies in the middle of a block ends with the same best as the serial run, and a
rerun from its ledger runs nothing and gives that best again. The command: ``--method batched``
for ``fit`` and ``campaign``, and ``--method auto``."""

import dataclasses
import json
import os

import numpy as np
import pytest
from fit_helpers import SOLVER, decay_study, reference_fit, two_noise_levels_study

import diffsoup as ds
from diffsoup.distributed._start_runs import multistart
from diffsoup.inference import BatchedTrustRegion
from diffsoup.inference.fitting._starts import start_points
from diffsoup.store import LedgerConflictError

TIGHT = dict(ftol=1e-14, xtol=1e-14, gtol=1e-12, stall_rtol=0.0)
OPTIONS = BatchedTrustRegion(lanes=2, polish=0, **TIGHT)


class DecayLowering:
    """A picklable factory of the decay study of one data set (Dask workers lower it once each)."""

    def __init__(self, seed: int = 11):
        self.seed = seed

    def __call__(self):
        return ds.lower(decay_study(self.seed), solver=SOLVER)


class DyingDecayLowering(DecayLowering):
    """The decay study, whose first evaluation of a block in any process ends that process
    (``os._exit``) once: the marker file, made exclusively, says it happened."""

    def __init__(self, marker: str):
        super().__init__()
        self.marker = marker

    def __call__(self):
        low = super().__call__()
        evaluate = low.residuals_and_jacobians

        def dying(thetas, active=None, **options):
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return evaluate(thetas, active, **options)
            os._exit(1)  # a worker process killed in the middle of its block

        low.residuals_and_jacobians = dying
        return low


@pytest.fixture(scope="module")
def decay():
    return DecayLowering()()


def ends(result):
    return np.stack([s.x for s in result.starts]), np.array([s.objective for s in result.starts])


def test_blocks_run_serially_equal_fits_one_block_and_resume_from_the_ledger(decay, tmp_path):
    ledger = tmp_path / "blocks.json"
    serial = multistart(decay, starts=5, seed=0, method=OPTIONS, starts_per_block=2, ledger_path=ledger)
    records = json.loads(ledger.read_text())["tasks"]
    assert sorted(records) == ["block-0000", "block-0001", "block-0002"]
    assert [records[f"block-000{b}"]["result"]["starts"][0]["index"] for b in range(3)] == [0, 2, 4]
    assert len(records["block-0002"]["result"]["starts"]) == 1  # the last block holds the fifth start alone
    np.testing.assert_array_equal([s.x0 for s in serial.starts], start_points(decay, 5, 0))
    # The same starts as one block of fit's batched path (a lane's numbers are its start's alone).
    one_block = ds.inference.fit(decay, method=OPTIONS, starts=5, seed=0)
    # Blocks of other lane counts vectorize differently (rounding: 4e-10 after the iterations on
    # JAX 0.12.1): equal to the 1e-8 in parameters.
    for a, b in zip(ends(serial), ends(one_block)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-8)
    best, _, nll = reference_fit(11)
    np.testing.assert_allclose(serial.theta, best, rtol=0, atol=1e-7)
    assert serial.objective == pytest.approx(nll, abs=1e-9) and serial.method == "batched"
    assert serial.optima[0].count == 5 and all(s.message.startswith("batched:") for s in serial.starts)
    # execution="processes" in one process: the same blocks, one device group after another.
    processes = multistart(decay, starts=5, seed=0, method=OPTIONS, starts_per_block=2, execution="processes")
    for a, b in zip(ends(serial), ends(processes)):
        np.testing.assert_array_equal(a, b)
    # A rerun with the same settings runs nothing and gives the same end states.
    again = multistart(decay, starts=5, seed=0, method=OPTIONS, starts_per_block=2, ledger_path=ledger)
    assert all(r["attempts"] == 1 for r in json.loads(ledger.read_text())["tasks"].values())
    for a, b in zip(ends(serial), ends(again)):
        np.testing.assert_array_equal(a, b)


def test_more_starts_keep_every_accepted_block_a_partial_last_one_included(decay, tmp_path):
    """3 starts in blocks of 2 leave a partial block-0001 (start 2); 6 starts keep it, as it ran,
    and add block-0002 (starts 3, 4) and block-0003 (start 5); the end states equal a fresh run's."""
    ledger = tmp_path / "grow.json"
    multistart(decay, starts=3, seed=0, method=OPTIONS, starts_per_block=2, ledger_path=ledger)
    before = json.loads(ledger.read_text())["tasks"]
    grown = multistart(decay, starts=6, seed=0, method=OPTIONS, starts_per_block=2, ledger_path=ledger)
    records = json.loads(ledger.read_text())["tasks"]
    assert sorted(records) == ["block-0000", "block-0001", "block-0002", "block-0003"]
    assert [[r["index"] for r in records[f"block-000{b}"]["result"]["starts"]] for b in range(4)] == [[0, 1], [2], [3, 4], [5]]
    for b in ("block-0000", "block-0001"):  # kept as they ran: not run again
        assert records[b]["attempts"] == 1 and records[b]["result"] == before[b]["result"]
    fresh = multistart(decay, starts=6, seed=0, method=OPTIONS, starts_per_block=2)
    np.testing.assert_array_equal([s.x0 for s in grown.starts], start_points(decay, 6, 0))
    for a, b in zip(ends(grown), ends(fresh)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-8)
    # Without resuming, the blocks are laid out afresh: every block starts at b * starts_per_block.
    multistart(decay, starts=6, seed=0, method=OPTIONS, starts_per_block=2, ledger_path=ledger, resume=False)
    records = json.loads(ledger.read_text())["tasks"]
    assert [[r["index"] for r in records[f"block-000{b}"]["result"]["starts"]] for b in range(3)] == [[0, 1], [2, 3], [4, 5]]


def test_another_block_size_or_seed_is_a_ledger_conflict_naming_it(decay, tmp_path):
    ledger = tmp_path / "blocks.json"
    multistart(decay, starts=4, seed=0, method=OPTIONS, starts_per_block=2, ledger_path=ledger)
    with pytest.raises(LedgerConflictError, match=r"block-0000 ran with starts_per_block 2, now 4"):
        multistart(decay, starts=4, seed=0, method=OPTIONS, starts_per_block=4, ledger_path=ledger)
    with pytest.raises(LedgerConflictError, match=r"block-0000 ran with seed 0, now 1"):
        multistart(decay, starts=4, seed=1, method=OPTIONS, starts_per_block=2, ledger_path=ledger)
    # The polish acts on the host after the blocks: another polish count reruns none of them, and
    # polishes the ends as a fresh run with it does. No polish at all is another default budget.
    ledger = tmp_path / "polish.json"
    multistart(decay, starts=4, seed=0, method=dataclasses.replace(OPTIONS, polish=1), starts_per_block=2, ledger_path=ledger)
    before = json.loads(ledger.read_text())["tasks"]
    polishing = dataclasses.replace(OPTIONS, polish=2, polish_unfinished=1)
    polished = multistart(decay, starts=4, seed=0, method=polishing, starts_per_block=2, ledger_path=ledger)
    after = json.loads(ledger.read_text())["tasks"]
    assert all(after[b]["attempts"] == 1 and after[b]["result"] == before[b]["result"] for b in before)
    fresh = multistart(decay, starts=4, seed=0, method=polishing, starts_per_block=2)
    assert polished.objective == pytest.approx(fresh.objective, abs=1e-10)
    assert [("polished by" in s.message) for s in polished.starts] == [("polished by" in s.message) for s in fresh.starts]
    with pytest.raises(LedgerConflictError, match=r"block-0000 ran with optimizer .*polished=True.*now .*polished=False"):
        multistart(decay, starts=4, seed=0, method=OPTIONS, starts_per_block=2, ledger_path=ledger)
    with pytest.raises(ValueError, match="starts_per_block=0 must be a positive count"):
        multistart(decay, starts=4, method=OPTIONS, starts_per_block=0)
    with pytest.raises(ValueError, match="starts_per_block=2 applies to method='batched'"):
        multistart(decay, starts=4, method="trf", starts_per_block=2)
    with pytest.raises(ValueError, match=r"tags \['first'\]"):
        multistart(decay, starts=4, method=OPTIONS, tags={"first": 1})


def test_blocks_optimize_noise_levels_as_fit_does_and_a_change_of_them_is_a_conflict(tmp_path):
    """With noise levels to optimize analytically (the default), a block's lanes move the other
    coordinates as ``fit``'s do (the same end states); a rerun without them conflicts, naming them."""
    low = ds.lower(two_noise_levels_study(), solver=SOLVER)
    ledger = tmp_path / "blocks.json"
    blocks = multistart(low, starts=4, seed=0, method=OPTIONS, starts_per_block=2, ledger_path=ledger)
    whole = ds.inference.fit(low, method=OPTIONS, starts=4, seed=0)
    assert blocks.analytic == whole.analytic == ("sd1", "sd2")
    for a, b in zip(ends(blocks), ends(whole)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)
    with pytest.raises(LedgerConflictError, match=r"block-0000 ran with analytic parameters \['sd1', 'sd2'\], now \[\]"):
        multistart(low, starts=4, seed=0, method=OPTIONS, starts_per_block=2, ledger_path=ledger, hierarchical=False)


@pytest.mark.slow
def test_dask_blocks_equal_serial_blocks_and_polish_to_the_same_best(decay, tmp_path):
    distributed = pytest.importorskip("distributed")
    options = BatchedTrustRegion(lanes=2, polish=1, **TIGHT)
    serial = multistart(DecayLowering(), starts=6, seed=3, method=options, starts_per_block=2)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster:
        with distributed.Client(cluster, set_as_default=False) as client:
            dask = multistart(DecayLowering(), starts=6, seed=3, method=options, starts_per_block=2, execution="dask",
                              client=client, resources={}, ledger_path=tmp_path / "blocks.json")  # fmt: skip
    for a, b in zip(ends(serial), ends(dask)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)
    assert dask.optima[0].polished and "polished by fides" in dask.starts[dask.best].message
    assert dask.objective == pytest.approx(serial.objective, abs=1e-10)
    np.testing.assert_allclose(dask.theta, serial.theta, rtol=0, atol=1e-10)


@pytest.mark.slow
def test_a_dask_run_whose_worker_dies_mid_block_ends_with_the_serial_best(decay, tmp_path):
    """One of two worker processes exits in the middle of its first block; the block runs again
    (its ledger record counts two attempts), and the fit equals the serial run's. A rerun from
    the ledger runs nothing and gives the same best."""
    distributed = pytest.importorskip("distributed")
    options = BatchedTrustRegion(lanes=2, polish=1, **TIGHT)
    serial = multistart(decay, starts=6, seed=5, method=options, starts_per_block=2)
    ledger, marker = tmp_path / "blocks.json", tmp_path / "died"
    run = dict(starts=6, seed=5, method=options, starts_per_block=2, ledger_path=ledger)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0") as cluster:  # fmt: skip
        with distributed.Client(cluster, set_as_default=False) as client:
            dask = multistart(DyingDecayLowering(str(marker)), execution="dask", client=client, resources={}, **run)
    assert marker.exists()
    records = json.loads(ledger.read_text())["tasks"]
    assert all(r["state"] == "accepted" for r in records.values())
    assert sorted(r["attempts"] for r in records.values()) == [1, 1, 2]
    for a, b in zip(ends(serial), ends(dask)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)
    assert dask.objective == pytest.approx(serial.objective, abs=1e-10)
    resumed = multistart(DyingDecayLowering(str(marker)), **run)  # serial, from the ledger: nothing runs
    assert all(r["attempts"] <= 2 for r in json.loads(ledger.read_text())["tasks"].values())
    assert resumed.objective == pytest.approx(serial.objective, abs=1e-10)
    np.testing.assert_allclose(resumed.theta, serial.theta, rtol=0, atol=1e-10)


# --------------------------------------------------------------------------------------------
# The command: --method batched, and --method auto (the default where the file names no method)
# --------------------------------------------------------------------------------------------


def test_auto_takes_batched_on_a_gpu_with_enough_starts_and_fides_otherwise(tmp_path, monkeypatch, capsys):
    from test_cli import write_decay_study

    from diffsoup.formats import load_study
    from diffsoup.workflows import _study_runs
    from diffsoup.workflows._auto_method import AUTO_MIN_STARTS, choose_method

    assert choose_method(1000, "cpu")[0] == "fides" and "no faster" in choose_method(1000, "cpu")[1]
    assert choose_method(AUTO_MIN_STARTS - 1, "gpu")[0] == "fides"
    assert choose_method(AUTO_MIN_STARTS, "gpu")[0] == "batched"
    plain, named = load_study(write_decay_study(tmp_path / "a")), load_study(write_decay_study(tmp_path / "b", FIT_FIDES))
    monkeypatch.setattr(_study_runs, "default_backend", lambda client=None: "gpu")
    s = _study_runs._settings(plain, None, 32, None, None)
    assert s["method"] == "batched" and "GPU and 32 starts >= 16" in s["auto"]
    assert "--method auto chose batched: the default JAX backend is a GPU" in _study_runs._method_label(s)
    assert _study_runs._fit_entries(s)["method_auto"] == s["auto"]
    assert _study_runs._settings(plain, None, 4, None, None)["method"] == "fides"  # too few starts
    assert _study_runs._settings(plain, None, 32, None, None, "hybrid")["method"] == "fides"  # a fides Hessian
    assert _study_runs._settings(named, None, 32, None, None)["auto"] is None  # the file names fides
    assert _study_runs._settings(named, None, 32, None, None)["method"] == "fides"
    assert _study_runs._settings(plain, "auto", 32, None, None)["method"] == "batched"
    assert _study_runs._settings(named, "auto", 32, None, None)["method"] == "batched"  # the flag wins
    monkeypatch.setattr(_study_runs, "default_backend", lambda client=None: "cpu")
    s = _study_runs._settings(plain, None, 32, None, None)
    assert s["method"] == "fides" and "the default JAX backend is cpu" in s["auto"]
    # diffsoup check names the method the command will use.
    from diffsoup import cli

    capsys.readouterr()
    assert cli.main(["check", str(plain.path)]) == 0 and cli.main(["check", str(named.path)]) == 0
    out = capsys.readouterr().out
    assert "fit: auto (batched on a GPU with >= 16 starts, else fides)" in out and "fit: fides (gauss_newton" in out


def test_default_lanes_fill_a_gpu_and_size_the_blocks_for_where_they_run(decay):
    """``lanes=None`` (the default): 1,024 lanes on a GPU, where a program's lanes cost little more
    than one, 16 on a CPU; a given count wins. The blocks of a multistart are sized by the platform
    they run on, given or the lowered study's (this CPU here); ``starts_per_block`` wins over both."""
    from diffsoup.distributed._start_runs import plan_starts
    from diffsoup.inference.fitting._batched_trust_region import CPU_LANES, GPU_LANES

    assert (GPU_LANES, CPU_LANES) == (1024, 16)
    assert BatchedTrustRegion().lanes is None
    assert BatchedTrustRegion().lanes_on("gpu") == 1024 and BatchedTrustRegion().lanes_on("cpu") == 16
    assert BatchedTrustRegion(lanes=8).lanes_on("gpu") == 8
    with pytest.raises(ValueError, match="lanes=0 must be a positive integer"):
        BatchedTrustRegion(lanes=0)
    options = dict(starts=40, seed=0, method=BatchedTrustRegion(), max_nfev=None, resample_failed_starts=0,
                   hierarchical=False)  # fmt: skip
    sizes = lambda plan: [item["count"] for item in plan.items]  # noqa: E731
    assert sizes(plan_starts(decay, **options)) == [16, 16, 8]  # the study lowered here: on this CPU
    assert sizes(plan_starts(decay, **options, platform="gpu")) == [40]
    assert sizes(plan_starts(decay, **options, platform="gpu", starts_per_block=25)) == [25, 15]


FIT_FIDES = '\n[fit]\nmethod = "fides"\n'


@pytest.mark.slow
def test_fit_command_with_method_batched_and_with_auto(tmp_path, capsys):
    """``diffsoup fit --method batched`` (in this process) ends at the closed form's optimum, its
    results store holding every start; the default (auto) says what it chose and why."""
    from test_cli import write_decay_study

    from diffsoup import cli
    from diffsoup.store import read_fit

    study = write_decay_study(tmp_path)
    best, _, nll = reference_fit(0)  # the study file's data set: scipy on the closed form
    assert cli.main(["fit", str(study), "-o", str(tmp_path / "fit"), "--method", "batched", "--starts", "3",
                     "--in-process", "--no-plots"]) == 0  # fmt: skip
    summary = json.loads((tmp_path / "fit" / "summary.json").read_text())
    assert summary["method"] == "batched" and summary["objective"] == pytest.approx(nll, abs=1e-6)
    np.testing.assert_allclose([np.log10(summary["parameters"][k]) for k in "Ak"], best, rtol=0, atol=1e-5)
    assert read_fit(tmp_path / "fit" / "results.zarr")["starts"]["objective"].shape == (3,)
    capsys.readouterr()
    assert cli.main(["fit", str(study), "-o", str(tmp_path / "auto"), "--starts", "1", "--in-process", "--no-plots"]) == 0
    assert "--method auto chose fides: the default JAX backend is cpu" in capsys.readouterr().out
    assert json.loads((tmp_path / "auto" / "summary.json").read_text())["method_auto"].startswith("the default JAX")


@pytest.mark.slow
def test_campaign_command_with_method_batched_runs_blocks_and_resumes(tmp_path, capsys):
    """``diffsoup campaign --method batched`` (in this process): one block of three starts in the
    ledger, the closed form's optimum, and a rerun that resumes the block."""
    from test_cli import write_decay_study

    from diffsoup import cli

    study = write_decay_study(tmp_path)
    _, _, nll = reference_fit(0)
    args = ["campaign", str(study), "-o", str(tmp_path / "camp"), "--method", "batched", "--starts", "3", "--in-process",
            "--no-plots"]  # fmt: skip
    assert cli.main(args) == 0
    ledger = json.loads((tmp_path / "camp" / "campaign.json").read_text())["tasks"]
    assert sorted(ledger) == ["block-0000"] and len(ledger["block-0000"]["result"]["starts"]) == 3
    first = json.loads((tmp_path / "camp" / "summary.json").read_text())
    assert first["method"] == "batched" and first["objective"] == pytest.approx(nll, abs=1e-6)
    out = capsys.readouterr().out
    assert ": 1 block of starts (3 starts) (batched" in out and "campaign: 1 of 1 block of starts (3 starts) finished" in out
    assert cli.main(args) == 0
    assert "1 of 1 blocks of starts accepted (1 from an earlier run)" in capsys.readouterr().out
    assert json.loads((tmp_path / "camp" / "summary.json").read_text())["objective"] == first["objective"]


@pytest.mark.slow
def test_fit_study_with_method_batched_sends_blocks_to_the_dask_workers(tmp_path):
    """``diffsoup fit --method batched`` on a cluster: the starts go to the workers (offering
    ``GPU=1``, as the embedded default's do) in blocks, and the fit ends at the closed form's optimum."""
    distributed = pytest.importorskip("distributed")
    from test_cli import write_decay_study

    from diffsoup.workflows import fit_study

    study = write_decay_study(tmp_path)
    _, _, nll = reference_fit(0)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, resources={"GPU": 1},
                                  dashboard_address=":0") as cluster:  # fmt: skip
        with distributed.Client(cluster, set_as_default=False) as client:
            summary = fit_study(study, tmp_path / "fit", client=client, method="batched", starts=3, plots=False,
                                progress=False, log=lambda line: None)  # fmt: skip
    assert summary["method"] == "batched" and summary["objective"] == pytest.approx(nll, abs=1e-6)
    assert summary["starts"]["total"] == 3
