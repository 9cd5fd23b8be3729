"""Campaigns: checkpointed_map (serial and on Dask), its ledger under SIGKILL, and world()."""

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

import diffsoup.inference as inference
from diffsoup.distributed import CampaignResult, TaskRecord, World, checkpointed_map, world
from diffsoup.distributed import _gpus, _progress
from diffsoup.store import Ledger, LedgerConflictError, LedgerError, LedgerLockedError

REPO = Path(__file__).resolve().parents[1]


def square(item):
    return {"x": item["x"], "square": item["x"] ** 2, "pair": (item["x"], "t")}


def square_or_fail(item):
    if item["x"] == 2:
        raise RuntimeError(f"task {item['task_id']} cannot converge")
    return square(item)


def _items(n, **extra):
    return [{"task_id": f"t{i}", "x": i, **extra} for i in range(n)]


# --------------------------------------------------------------------------------------------
# Serial execution and the ledger
# --------------------------------------------------------------------------------------------


def test_serial_results_failures_and_records(tmp_path):
    path = tmp_path / "campaign" / "ledger.json"  # the directory is created
    result = checkpointed_map(square_or_fail, _items(5), ledger_path=path, progress=False)

    assert isinstance(result, CampaignResult)
    # Accepted results in item order and in JSON form: the tuple came back as a list.
    assert list(result.results) == ["t0", "t1", "t3", "t4"]
    assert result.results["t3"] == {"x": 3, "square": 9, "pair": [3, "t"]}
    assert list(result.failures) == ["t2"]
    failure = result.failures["t2"]
    assert failure.state == "failed" and failure.result is None
    assert failure.error == "RuntimeError: task t2 cannot converge"
    assert "square_or_fail" in failure.traceback

    assert [r.task_id for r in result.records] == ["t0", "t1", "t2", "t3", "t4"]
    for record in result.records:
        assert isinstance(record, TaskRecord)
        assert record.attempts == 1
        assert record.worker.endswith(f"pid {os.getpid()}")
        assert record.started <= record.finished
    on_disk = json.loads(path.read_text())
    assert on_disk["function"].endswith("square_or_fail")
    assert {k: v["state"] for k, v in on_disk["tasks"].items()} == {
        "t0": "accepted", "t1": "accepted", "t2": "failed", "t3": "accepted", "t4": "accepted"
    }
    assert on_disk["tasks"]["t3"]["result"] == result.results["t3"]


def test_resume_keeps_accepted_tasks_and_reruns_failed_ones(tmp_path):
    path = tmp_path / "ledger.json"
    first = checkpointed_map(square_or_fail, _items(4), ledger_path=path, progress=False)
    calls = []

    def now_fine(item):
        calls.append(item["task_id"])
        return square(item)

    second = checkpointed_map(now_fine, _items(4), ledger_path=path, progress=False)
    assert calls == ["t2"]
    assert second.failures == {}
    assert list(second.results) == ["t0", "t1", "t2", "t3"]
    # Results read back from the ledger equal those computed: both are the JSON form.
    assert all(second.results[t] == first.results[t] for t in first.results)
    assert second.results["t2"] == {"x": 2, "square": 4, "pair": [2, "t"]}
    attempts = {r.task_id: r.attempts for r in second.records}
    assert attempts == {"t0": 1, "t1": 1, "t2": 2, "t3": 1}
    # Accepted records are not rewritten: their start times are those of the first run.
    assert second.records[0].started == first.records[0].started

    # A longer item list extends the campaign; the known tasks are not run again.
    calls.clear()
    third = checkpointed_map(now_fine, _items(6), ledger_path=path, progress=False)
    assert calls == ["t4", "t5"] and len(third.results) == 6


def test_resume_false_runs_everything_and_keeps_the_old_ledger(tmp_path):
    path = tmp_path / "ledger.json"
    checkpointed_map(square, _items(3), ledger_path=path, progress=False)
    old = path.read_bytes()
    calls = []

    def counted(item):
        calls.append(item["task_id"])
        return square(item)

    result = checkpointed_map(counted, _items(3), ledger_path=path, resume=False, progress=False)
    assert calls == ["t0", "t1", "t2"]
    assert all(r.attempts == 1 for r in result.records)
    backups = list(tmp_path.glob("ledger.json.*.bak"))
    assert len(backups) == 1 and backups[0].read_bytes() == old


@dataclasses.dataclass(frozen=True)
class Start:
    task_id: str
    theta: tuple


def test_items_may_be_objects_with_a_task_id(tmp_path):
    items = [Start("start-a", (0.1, 2.0)), Start("start-b", (0.3, 1.0))]
    result = checkpointed_map(lambda s: sum(s.theta), items, ledger_path=tmp_path / "l.json", progress=False)
    assert result.results == {"start-a": 2.1, "start-b": 1.3}


def test_an_interrupted_task_runs_again_on_resume(tmp_path):
    path = tmp_path / "ledger.json"

    def interrupted_at_t2(item):
        if item["task_id"] == "t2":
            raise KeyboardInterrupt
        return square(item)

    with pytest.raises(KeyboardInterrupt):
        checkpointed_map(interrupted_at_t2, _items(4), ledger_path=path, progress=False)
    states = {k: v["state"] for k, v in json.loads(path.read_text())["tasks"].items()}
    assert states == {"t0": "accepted", "t1": "accepted", "t2": "running", "t3": "pending"}

    calls = []

    def counted(item):
        calls.append(item["task_id"])
        return square(item)

    result = checkpointed_map(counted, _items(4), ledger_path=path, progress=False)
    assert calls == ["t2", "t3"]
    assert {r.task_id: r.attempts for r in result.records} == {"t0": 1, "t1": 1, "t2": 2, "t3": 1}


@pytest.mark.parametrize("execution", ["serial", "processes", "dask"])
def test_a_running_task_is_counted_in_the_ledger_before_it_runs(tmp_path, execution, request):
    path = tmp_path / "ledger.json"
    options = {"client": request.getfixturevalue("gpu_cluster")} if execution == "dask" else {}

    def look(item):
        # What a rerun would find if this process were killed now.
        record = Ledger.load(path).get(item["task_id"])
        return {"state": record["state"], "attempts": record["attempts"]}

    result = checkpointed_map(look, _items(3), ledger_path=path, execution=execution, progress=False, **options)
    assert result.results == {f"t{i}": {"state": "running", "attempts": 1} for i in range(3)}
    assert all(r.attempts == 1 for r in result.records)


@pytest.mark.parametrize(
    "value, detail",
    [(object(), "Object of type object is not JSON serializable"), (float("nan"), "Out of range float")],
)
def test_a_non_json_result_fails_its_task_and_not_the_ledger(tmp_path, value, detail):
    path = tmp_path / "ledger.json"

    def bad_at_t1(item):
        return value if item["task_id"] == "t1" else item["x"]

    result = checkpointed_map(bad_at_t1, _items(3), ledger_path=path, progress=False)
    assert result.results == {"t0": 0, "t2": 2}
    error = result.failures["t1"].error
    assert error.startswith("result of task 't1' is not JSON-serializable: ")
    assert detail in error
    assert Ledger.load(path).get("t1")["state"] == "failed"


def test_numpy_results_come_back_as_lists(tmp_path):
    np = pytest.importorskip("numpy")
    result = checkpointed_map(
        lambda item: {"theta": np.linspace(0, 1, 3), "n": np.int64(item["x"])},
        _items(1),
        ledger_path=tmp_path / "l.json",
        progress=False,
    )
    assert result.results["t0"] == {"theta": [0.0, 0.5, 1.0], "n": 0}


@pytest.mark.parametrize(
    "items, error, message",
    [
        ([{"task_id": "a"}, {"task_id": "b"}, {"task_id": "a"}], ValueError, r"duplicate task_id 'a' \(items 0 and 2\)"),
        ([{"task_id": "a"}, {"task_id": ""}], ValueError, "item 1 has an empty task_id"),
        ([{"task_id": "   "}], ValueError, "item 0 has an empty task_id"),
        ([{"task_id": "a"}, {"x": 1}], TypeError, "item 1 has no 'task_id' key"),
        ([{"task_id": 3}], TypeError, "task_id must be a string"),
        ([object()], TypeError, r"item 0 \(object\) has no task_id attribute"),
        ({"task_id": "a"}, TypeError, "items must be a sequence of tasks, not a dict"),
    ],
)
def test_bad_task_ids_are_refused_before_anything_runs(tmp_path, items, error, message):
    path = tmp_path / "ledger.json"
    with pytest.raises(error, match=message):
        checkpointed_map(square, items, ledger_path=path, progress=False)
    assert not path.exists()


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"execution": "threads"}, ValueError, r"execution='threads' is not one of \('serial', 'dask', 'processes'\)"),
        ({"execution": "processes", "resources": {"GPU": 1}}, ValueError,
         "resources= applies to execution='dask', not execution='processes'"),
        ({"device_groups": [[0]]}, ValueError, "device_groups applies to execution='processes'"),
        ({"on_conflict": "merge"}, ValueError, r"on_conflict='merge' is not one of \('error', 'restart'\)"),
        ({"resources": {"GPU": 1}}, ValueError, "resources= applies to execution='dask'"),
        ({"execution": "dask", "resources": {"GPU": 0}}, ValueError, r"resources\['GPU'\] = 0"),
        ({"execution": "dask", "no_worker_timeout": 0}, ValueError, "no_worker_timeout=0 must be a positive"),
        ({"resume": "yes"}, TypeError, "resume must be True or False"),
    ],
)
def test_bad_options_are_refused(tmp_path, options, error, message):
    with pytest.raises(error, match=message):
        checkpointed_map(square, _items(1), ledger_path=tmp_path / "l.json", progress=False, **options)
    assert not (tmp_path / "l.json").exists()


def test_a_corrupted_ledger_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "ledger.json"
    checkpointed_map(square, _items(3), ledger_path=path, progress=False)
    damaged = path.read_bytes()[:-25]
    path.write_bytes(damaged)
    calls = []
    with pytest.raises(LedgerError, match=f"the ledger {path} is corrupted: it is not valid JSON"):
        checkpointed_map(lambda i: calls.append(i), _items(3), ledger_path=path, progress=False)
    assert calls == [] and path.read_bytes() == damaged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.json"]  # the lock file goes with the lock

    # resume=False starts anew and keeps the damaged file, byte for byte, as a backup.
    result = checkpointed_map(square, _items(3), ledger_path=path, resume=False, progress=False)
    assert len(result.results) == 3
    (backup,) = tmp_path.glob("ledger.json.*.bak")
    assert backup.read_bytes() == damaged


def test_a_hand_edited_result_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "ledger.json"
    checkpointed_map(square, _items(3), ledger_path=path, progress=False)
    edited = path.read_text().replace('"square": 4,', '"square": 5,')
    assert edited != path.read_text()
    path.write_text(edited)
    calls = []
    with pytest.raises(LedgerError) as info:
        checkpointed_map(lambda i: calls.append(i), _items(3), ledger_path=path, progress=False)
    message = str(info.value)
    assert message.startswith(f"the ledger {path} does not match its checksum: a task record (a result")
    assert "resume=False" in message and "--restart" in message and ".bak" in message
    assert "\n" not in message
    assert calls == [] and path.read_text() == edited
    # resume=False starts anew and keeps the edited file as a backup.
    result = checkpointed_map(square, _items(3), ledger_path=path, resume=False, progress=False)
    assert result.results["t2"]["square"] == 4
    (backup,) = tmp_path.glob("ledger.json.*.bak")
    assert backup.read_text() == edited


def test_a_ledger_of_the_previous_format_resumes_and_is_written_with_a_checksum(tmp_path):
    from diffsoup.store import LEDGER_VERSION

    path = tmp_path / "ledger.json"
    checkpointed_map(square_or_fail, _items(3), ledger_path=path, progress=False)
    # The same ledger as the previous version wrote it: version 1, no checksum.
    data = json.loads(path.read_text())
    del data["checksum"]
    data["version"] = 1
    path.write_text(json.dumps(data))
    calls = []

    def counted(item):
        calls.append(item["task_id"])
        return square(item)

    result = checkpointed_map(counted, _items(3), ledger_path=path, progress=False)
    assert calls == ["t2"] and result.results["t0"] == data["tasks"]["t0"]["result"]
    written = json.loads(path.read_text())
    assert written["version"] == LEDGER_VERSION == 2 and len(written["checksum"]) == 64


# Run as root, a command obeys file modes once CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH are out of
# its capability bounding set: this prefix drops them (prctl PR_CAPBSET_DROP) and execs the rest.
_WITHOUT_ROOT_OVERRIDE = (
    "import ctypes, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH\n"
    "    if libc.prctl(24, capability, 0, 0, 0) != 0:\n"
    "        raise OSError(ctypes.get_errno(), 'prctl(PR_CAPBSET_DROP)')\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


def _as_unprivileged(command):
    """``command`` so that a read-only directory is read-only for it, root or not."""
    return [sys.executable, "-c", _WITHOUT_ROOT_OVERRIDE, *command] if os.geteuid() == 0 else command


@pytest.mark.parametrize("layout", ["new-ledger", "existing-ledger", "missing-subdirectory"])
def test_a_read_only_directory_gives_one_line_naming_it(tmp_path, layout):
    directory = tmp_path / "ro"
    directory.mkdir()
    path = directory / "sub" / "ledger.json" if layout == "missing-subdirectory" else directory / "ledger.json"
    if layout == "existing-ledger":
        checkpointed_map(square, _items(1), ledger_path=path, progress=False)  # and removes its lock file
    code = (
        "import sys; from diffsoup.distributed import checkpointed_map\n"
        "try:\n"
        f"    checkpointed_map(lambda i: i['x'], [{{'task_id': 't0', 'x': 0}}, {{'task_id': 't1', 'x': 1}}], "
        f"ledger_path={str(path)!r}, progress=False)\n"
        "except Exception as exc:\n"
        "    print(type(exc).__module__ + '.' + type(exc).__name__); print(exc); sys.exit(3)\n"
    )
    directory.chmod(0o555)
    try:
        out = subprocess.run(_as_unprivileged([sys.executable, "-c", code]), cwd=REPO, capture_output=True,
                             text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    finally:
        directory.chmod(0o755)
    assert out.returncode == 3, out.stderr
    kind, message = out.stdout.strip().split("\n")  # one line of message
    assert kind == "diffsoup.store._ledger.LedgerError"
    assert message.startswith(f"cannot write the ledger {path}: Permission denied in the directory {directory} ")
    assert message.endswith("another ledger_path (the diffsoup command: another --out).")
    assert sorted(p.name for p in directory.iterdir()) == (
        ["ledger.json"] if layout == "existing-ledger" else []
    )


def test_an_unreadable_ledger_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "ledger.json"
    path.mkdir()
    with pytest.raises(LedgerError, match=f"cannot read the ledger {path}"):
        checkpointed_map(square, _items(1), ledger_path=path, progress=False)
    assert path.is_dir()


def test_the_ledger_of_another_campaign(tmp_path):
    path = tmp_path / "ledger.json"
    checkpointed_map(square, _items(3), ledger_path=path, progress=False)
    theirs = path.read_bytes()
    other = [{"task_id": "t0", "x": 0}, {"task_id": "t1", "x": 10}, {"task_id": "t2", "x": 20}]
    with pytest.raises(LedgerConflictError, match=r"recorded task 't1' \(and 1 other tasks\) for a different item"):
        checkpointed_map(square, other, ledger_path=path, progress=False)
    assert path.read_bytes() == theirs

    calls = []

    def counted(item):
        calls.append(item["task_id"])
        return square(item)

    first_t0 = Ledger.load(path).get("t0")
    result = checkpointed_map(counted, other, ledger_path=path, on_conflict="restart", progress=False)
    assert calls == ["t1", "t2"]  # only the tasks whose items changed ran again
    assert [r["square"] for r in result.results.values()] == [0, 100, 400]
    assert all(r.attempts == 1 for r in result.records)
    t0 = Ledger.load(path).get("t0")
    assert t0 == first_t0  # kept as it was: the same attempts, start, finish and result
    (backup,) = tmp_path.glob("ledger.json.*.bak")
    assert backup.read_bytes() == theirs


def test_restart_after_a_conflict_reruns_the_changed_and_new_tasks_and_keeps_the_rest(tmp_path):
    path = tmp_path / "ledger.json"
    first = checkpointed_map(square_or_fail, _items(5), ledger_path=path, progress=False)
    assert list(first.failures) == ["t2"]
    # t1 changed, t2 (failed before) and t3, t4 the same, t0 dropped from the items, t5 new.
    items = [{"task_id": "t1", "x": 11}] + _items(5)[2:] + [{"task_id": "t5", "x": 5}]
    calls = []

    def counted(item):
        calls.append(item["task_id"])
        return square(item)

    result = checkpointed_map(counted, items, ledger_path=path, on_conflict="restart", progress=False)
    assert sorted(calls) == ["t1", "t2", "t5"]  # the changed, the failed and the new one
    assert result.results["t1"]["square"] == 121 and result.results["t3"] == first.results["t3"]
    attempts = {r.task_id: r.attempts for r in result.records}
    assert attempts == {"t1": 1, "t2": 2, "t3": 1, "t4": 1, "t5": 1}
    ledger = Ledger.load(path)
    # The task no longer among the items keeps its record, as in any resume.
    assert ledger.get("t0")["state"] == "accepted" and ledger.get("t0")["result"] == first.results["t0"]
    assert ledger.get("t3")["started"] == first.records[3].started


def test_one_writer_per_ledger(tmp_path):
    path = tmp_path / "ledger.json"

    def nested(item):
        # A second campaign on the same ledger while this one runs.
        return checkpointed_map(square, _items(1), ledger_path=path, progress=False)

    result = checkpointed_map(nested, _items(1), ledger_path=path, progress=False)
    assert result.failures["t0"].error.startswith("LedgerLockedError: ledger ")
    assert "is in use by another process" in result.failures["t0"].error
    assert issubclass(LedgerLockedError, RuntimeError)


def test_progress_bar_on_stderr(tmp_path, capsys, monkeypatch):
    # Without tqdm (not a dependency) the campaign draws its own bar; with it, tqdm's.
    has_tqdm = _progress.tqdm_installed()
    checkpointed_map(square_or_fail, _items(3), ledger_path=tmp_path / "a.json")
    err = capsys.readouterr().err
    assert "3/3" in err
    if not has_tqdm:
        assert err.splitlines()[-1].startswith("diffsoup campaign [")
        assert "failed 1" in err.splitlines()[-1]
    checkpointed_map(square, _items(3), ledger_path=tmp_path / "b.json", progress=False)
    assert capsys.readouterr().err == ""


def test_import_loads_no_dask():
    code = (
        "import sys, diffsoup, diffsoup.inference as inf, diffsoup.distributed, diffsoup.store; "
        "inf.checkpointed_map, inf.CampaignResult, inf.world, inf.World; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.stdout.strip() == "[]"
    assert inference.checkpointed_map is checkpointed_map and inference.World is World


# --------------------------------------------------------------------------------------------
# SIGKILL at random moments
# --------------------------------------------------------------------------------------------


def test_campaign_survives_sigkill_at_random_moments(tmp_path):
    ledger = tmp_path / "ledger.json"
    runlog = tmp_path / "runs.log"
    n_tasks, sleep = 50, 0.010
    command = [
        sys.executable, str(REPO / "tests" / "campaign_worker_script.py"),
        str(ledger), str(runlog), str(n_tasks), str(sleep),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rng = random.Random(20260713)
    accepted_seen = {}  # task_id -> the accepted result, which must never change
    running_at_kill = {}  # task_id -> attempts the ledger showed while the task was running
    remaining = n_tasks
    for _ in range(10):
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            # A random moment within the first 30 % of the work left (each task takes at least
            # its sleep), so that every one of the ten kills lands before the campaign ends.
            time.sleep(rng.uniform(0.0, 0.3 * remaining * sleep))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            proc.kill()
            proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
        if not ledger.exists():
            continue  # killed before the first write
        state = Ledger.load(ledger)  # always parses, and passes every check
        remaining = n_tasks
        for task_id in state.task_ids():
            record = state.get(task_id)
            if record["state"] == "accepted":
                remaining -= 1
                assert accepted_seen.setdefault(task_id, record["result"]) == record["result"]
            elif record["state"] == "running":
                running_at_kill[task_id] = record["attempts"]
        assert remaining > 0

    final = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert final.returncode == 0, final.stderr
    assert final.stdout.split()[-3:] == ["done", str(n_tasks), "0"]
    state = Ledger.load(ledger)
    assert len(state.task_ids()) == n_tasks
    assert 0 < len(accepted_seen) < n_tasks  # the kills left work for the last run
    runs = [line.split() for line in runlog.read_text().splitlines()]
    for task_id in state.task_ids():
        record = state.get(task_id)
        assert record["state"] == "accepted"
        assert accepted_seen.setdefault(task_id, record["result"]) == record["result"]
        # The accepted result is that of one real execution of this task.
        assert [task_id, record["result"]["nonce"]] in runs
        if task_id in running_at_kill:
            assert record["attempts"] > running_at_kill[task_id]
    assert running_at_kill  # some kills caught a task mid-run
    assert not list(tmp_path.glob(".ledger.json.*.tmp"))


# --------------------------------------------------------------------------------------------
# world()
# --------------------------------------------------------------------------------------------

_MPI_VARIABLES = [
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE", "PMI_RANK",
    "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK", "PMIX_SIZE", "PMIX_RANK",
]


@pytest.fixture
def no_mpi(monkeypatch):
    for name in _MPI_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_world_outside_mpi_is_process_0_of_1(no_mpi):
    no_mpi.setitem(sys.modules, "mpi4py", None)  # importing it would now fail: it must not be tried
    assert world() == World(0, 1)
    assert world().rank == 0 and world().size == 1


def test_world_reads_mpi4py_under_an_mpi_launch(no_mpi):
    comm = types.SimpleNamespace(Get_rank=lambda: 2, Get_size=lambda: 4)
    fake = types.ModuleType("mpi4py")
    fake.MPI = types.SimpleNamespace(COMM_WORLD=comm)
    no_mpi.setitem(sys.modules, "mpi4py", fake)
    no_mpi.setitem(sys.modules, "mpi4py.MPI", fake.MPI)
    no_mpi.setenv("PMIX_RANK", "2")
    assert world() == World(2, 4)


def test_world_under_mpi_without_mpi4py_says_what_to_install(no_mpi):
    no_mpi.setitem(sys.modules, "mpi4py", None)
    no_mpi.setenv("OMPI_COMM_WORLD_SIZE", "4")
    no_mpi.setenv("OMPI_COMM_WORLD_RANK", "1")
    with pytest.raises(ImportError, match=r"launched under MPI \(OMPI_COMM_WORLD_SIZE=4\).*pip install mpi4py"):
        world()
    no_mpi.setenv("OMPI_COMM_WORLD_SIZE", "1")
    no_mpi.setenv("OMPI_COMM_WORLD_RANK", "0")
    assert world() == World(0, 1)


# --------------------------------------------------------------------------------------------
# Dask
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"CUDA_VISIBLE_DEVICES": "2,3"}, ["2", "3"]),
        ({"CUDA_VISIBLE_DEVICES": "0,-1,1"}, ["0"]),
        ({"CUDA_VISIBLE_DEVICES": ""}, []),
        ({"CUDA_VISIBLE_DEVICES": "0", "JAX_PLATFORMS": "cpu"}, []),
        ({"CUDA_VISIBLE_DEVICES": "GPU-5f2a", "JAX_PLATFORMS": "cuda,cpu"}, ["GPU-5f2a"]),
    ],
)
def test_embedded_cluster_counts_visible_gpus(monkeypatch, env, expected):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _gpus.visible_gpus() == expected


def _worker_address():
    from distributed import get_worker

    return get_worker().address


def report_worker(item):
    time.sleep(item.get("sleep", 0.05))
    if item["x"] == 3:
        raise ValueError("bad start")
    if item["x"] == 4:
        return {"not json": object()}
    return {"x": item["x"], "worker": _worker_address()}


def die_once(item):
    """Kill the worker process under the first attempt of task t2."""
    marker = Path(item["marker"])
    if item["task_id"] == "t2" and not marker.exists():
        marker.write_text(_worker_address())
        time.sleep(0.5)  # let the start event reach the client before the process dies
        os._exit(1)
    time.sleep(0.1)
    return _worker_address()


@pytest.fixture(scope="module")
def gpu_cluster():
    """Two worker processes with GPU=1 and one without, on 127.0.0.1 only."""
    distributed = pytest.importorskip("distributed")
    spec = {"nthreads": 1, "host": "127.0.0.1"}
    workers = {
        "gpu-0": {"cls": distributed.Nanny, "options": {**spec, "resources": {"GPU": 1}}},
        "gpu-1": {"cls": distributed.Nanny, "options": {**spec, "resources": {"GPU": 1}}},
        "cpu-0": {"cls": distributed.Nanny, "options": spec},
    }
    scheduler = {"cls": distributed.Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"}}
    with distributed.SpecCluster(workers=workers, scheduler=scheduler) as cluster:
        with distributed.Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(3, timeout=60)
            yield client


def _workers(client):
    gpu, cpu = set(), set()
    for address, info in client.scheduler_info(n_workers=-1)["workers"].items():
        (gpu if info["resources"].get("GPU") else cpu).add(address)
    return gpu, cpu


def test_dask_tasks_run_only_on_gpu_workers(gpu_cluster, tmp_path):
    from distributed import get_task_stream

    client = gpu_cluster
    gpu, cpu = _workers(client)
    assert len(gpu) == 2 and len(cpu) == 1
    path = tmp_path / "ledger.json"
    with get_task_stream(client) as stream:
        result = checkpointed_map(
            report_worker, _items(12), ledger_path=path, execution="dask", client=client, progress=False
        )
    assert list(result.failures) == ["t3", "t4"]
    assert result.failures["t3"].error == "ValueError: bad start"
    assert result.failures["t4"].error.startswith("result of task 't4' is not JSON-serializable")
    assert len(result.results) == 10
    for record in result.records:
        assert record.worker in gpu and record.attempts == 1
        if record.state == "accepted":
            assert record.result["worker"] == record.worker  # what the ledger says is where it ran
    assert len({r.worker for r in result.records}) == 2  # both GPU workers took tasks
    # Task names read well on the dashboard.
    keys = {entry["key"] for entry in stream.data}
    assert {k.rsplit("-", 1)[0] for k in keys} == {f"diffsoup-t{i}" for i in range(12)}
    assert Ledger.load(path).get("t5")["worker"] in gpu

    # A rerun, serial this time, reads the accepted results back and reruns the failures.
    again = checkpointed_map(lambda item: "fixed", _items(12), ledger_path=path, progress=False)
    assert again.results["t3"] == "fixed" and again.results["t5"] == result.results["t5"]


def test_dask_campaign_survives_a_killed_gpu_worker(gpu_cluster, tmp_path):
    client = gpu_cluster
    gpu_before, cpu = _workers(client)
    marker = tmp_path / "killed-worker"
    items = _items(8, marker=str(marker))
    result = checkpointed_map(
        die_once, items, ledger_path=tmp_path / "ledger.json", execution="dask", client=client, progress=False
    )
    assert result.failures == {}
    assert len(result.results) == 8
    killed = marker.read_text()
    assert killed in gpu_before
    client.wait_for_workers(3, timeout=60)  # the nanny restarts the killed worker
    gpu_after, _ = _workers(client)
    for record in result.records:
        assert record.worker in gpu_before | gpu_after and record.worker not in cpu
        assert record.result == record.worker
    t2 = result.records[2]
    assert t2.attempts == 2 and t2.worker != killed
    assert Ledger.load(tmp_path / "ledger.json").get("t2")["attempts"] == 2


def test_dask_attempts_are_counted_before_tasks_run_when_the_client_is_killed(gpu_cluster, tmp_path):
    # Each task logs every run of its own; three of them SIGKILL the campaign's client (another
    # process) during their first run, right after logging it. Reruns resume the campaign.
    ledger, runlog, pidfile, markers = (tmp_path / name for name in ("ledger.json", "runs.log", "pid", "markers"))
    markers.mkdir()
    address = gpu_cluster.scheduler_info()["address"]
    command = [sys.executable, str(REPO / "tests" / "campaign_dask_driver_script.py"), address, str(ledger),
               str(runlog), str(pidfile), str(markers), "8", "t1,t4,t6"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    outcomes = []
    for _ in range(5):
        run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
        outcomes.append(run.returncode)
        if run.returncode == 0:
            break
        assert run.returncode == -signal.SIGKILL, run.stderr[-3000:]
    assert outcomes[0] == -signal.SIGKILL and outcomes[-1] == 0, outcomes
    assert run.stdout.split()[-3:] == ["done", "8", "0"]
    assert sorted(p.name for p in markers.iterdir()) == ["t1", "t4", "t6"]
    time.sleep(1.0)  # tasks of a killed client that were running still finish on their workers
    runs = [line.split() for line in runlog.read_text().splitlines()]
    state = Ledger.load(ledger)
    for task_id in state.task_ids():
        record = state.get(task_id)
        ran = sum(t == task_id for t, _ in runs)
        assert record["state"] == "accepted" and [task_id, record["result"]["nonce"]] in runs
        # Every run was counted before it ran, the killers' first runs included.
        assert record["attempts"] >= ran >= 1, (task_id, record["attempts"], ran)
    assert sum(t in ("t1", "t4", "t6") for t, _ in runs) >= 6  # each killer ran twice at least


def test_dask_task_no_worker_can_run_fails_within_the_timeout(gpu_cluster, tmp_path):
    client = gpu_cluster
    outcome = {}

    def run():
        outcome["result"] = checkpointed_map(
            report_worker,
            _items(3),
            ledger_path=tmp_path / "ledger.json",
            execution="dask",
            client=client,
            resources={"TPU": 2},
            no_worker_timeout=1.0,
            progress=False,
        )

    # In a daemon thread, so that a regression fails this test instead of hanging CI.
    thread = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(timeout=30)
    elapsed = time.monotonic() - started
    if thread.is_alive():  # the module's cluster teardown ends the thread
        pytest.fail("a task no worker can run was still waiting after 30 s")
    result = outcome["result"]
    assert 1.0 <= elapsed < 1.0 + 2.0  # the timeout plus the documented second of polling, with slack
    assert list(result.failures) == ["t0", "t1", "t2"]
    for record in result.failures.values():
        assert record.attempts == 0  # never started
        assert f"task '{record.task_id}' waited" in record.error
        assert "no_worker_timeout=1 s" in record.error
        assert "asks for resources {'TPU': 2} and no worker offers them" in record.error
        assert "{'GPU': 1}" in record.error  # the workers' resources are listed
    # The scheduler forgot the cancelled tasks: nothing keeps waiting.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        k.startswith("diffsoup-") for k in client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.tasks))
    ):
        time.sleep(0.1)
    assert not any(k.startswith("diffsoup-") for k in client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.tasks)))


def test_dask_uses_the_active_client(gpu_cluster, tmp_path):
    from distributed import Client

    gpu, _ = _workers(gpu_cluster)
    with Client(gpu_cluster.scheduler_info()["address"]):  # becomes the default client
        result = checkpointed_map(
            report_worker, _items(3), ledger_path=tmp_path / "ledger.json", execution="dask", progress=False
        )
    assert {r.worker for r in result.records} <= gpu


def test_dask_embedded_default_cluster(tmp_path):
    from distributed import default_client

    with pytest.raises(ValueError):
        default_client()  # no active client: the embedded default is started
    result = checkpointed_map(
        report_worker, _items(3), ledger_path=tmp_path / "ledger.json", execution="dask", progress=False
    )
    assert len(result.results) == 3
    workers = {r.worker for r in result.records}
    assert all(w.startswith("tcp://127.0.0.1:") for w in workers)
    with pytest.raises(ValueError):
        default_client()  # and it was closed at the end


# --------------------------------------------------------------------------------------------
# Settings: no_worker_timeout=None reads diffsoup.campaign.no-worker-timeout
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def late_lane_cluster():
    """An in-process cluster whose workers (none at first) carry LANE=1, not GPU."""
    distributed = pytest.importorskip("distributed")
    # In-process workers (processes=False): no sockets but the dashboard's.
    with distributed.LocalCluster(n_workers=0, threads_per_worker=1, processes=False, resources={"LANE": 1},
                                  dashboard_address="127.0.0.1:0") as cluster:  # fmt: skip
        with distributed.Client(cluster, set_as_default=False) as client:
            yield cluster, client


def _in_thread(run, limit):
    """``run()`` in a daemon thread (a regression fails instead of hanging); (result, seconds)."""
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("result", run()), daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(timeout=limit)
    if thread.is_alive():
        pytest.fail(f"the campaign was still waiting after {limit} s")
    return outcome["result"], time.monotonic() - started


def test_dask_default_timeout_is_the_setting_and_fails_every_waiting_task(late_lane_cluster, tmp_path):
    import dask

    from diffsoup.distributed import DEFAULT_NO_WORKER_TIMEOUT

    from diffsoup.distributed._config import get

    assert DEFAULT_NO_WORKER_TIMEOUT == 60.0 == get("campaign.no-worker-timeout")
    cluster, client = late_lane_cluster
    with dask.config.set({"diffsoup.campaign.no-worker-timeout": 1.0}):
        # No no_worker_timeout given (as `diffsoup campaign --scheduler` does): the setting applies.
        result, elapsed = _in_thread(lambda: checkpointed_map(
            report_worker, _items(2), ledger_path=tmp_path / "a.json", execution="dask", client=client,
            progress=False), 30)  # fmt: skip
    assert 1.0 <= elapsed < 1.0 + 2.0
    assert list(result.failures) == ["t0", "t1"]
    for record in result.failures.values():
        assert record.attempts == 0
        assert "no_worker_timeout=1 s" in record.error
        assert "asks for resources {'GPU': 1} and no worker offers them" in record.error
        assert "no workers are connected" in record.error


def test_dask_math_inf_waits_for_a_worker_that_arrives_late(late_lane_cluster, tmp_path):
    import math

    import dask

    cluster, client = late_lane_cluster
    timer = threading.Timer(2.5, cluster.scale, args=(1,))  # a LANE worker joins after 2.5 s
    with dask.config.set({"diffsoup.campaign.no-worker-timeout": 1.0}):
        timer.start()
        try:
            result, elapsed = _in_thread(lambda: checkpointed_map(
                lambda item: item["x"] + 1, _items(2), ledger_path=tmp_path / "b.json", execution="dask",
                client=client, resources={"LANE": 1}, no_worker_timeout=math.inf, progress=False), 60)  # fmt: skip
        finally:
            timer.cancel()
    assert elapsed >= 2.5  # it waited past the configured second for the late worker
    assert result.failures == {} and result.results == {"t0": 1, "t1": 2}


def test_campaign_resources_default_is_the_setting(late_lane_cluster, tmp_path):
    import dask

    cluster, client = late_lane_cluster
    cluster.scale(1)
    client.wait_for_workers(1, timeout=30)
    with dask.config.set({"diffsoup.campaign.resources": {"LANE": 1}}):
        result = checkpointed_map(lambda item: item["x"], _items(3), ledger_path=tmp_path / "c.json",
                                  execution="dask", client=client, progress=False)  # fmt: skip
    assert result.results == {"t0": 0, "t1": 1, "t2": 2}


@pytest.mark.parametrize("value", [0, -5, "soon", None])
def test_a_bad_configured_timeout_names_the_setting(tmp_path, value):
    import dask

    with dask.config.set({"diffsoup.campaign.no-worker-timeout": value}):
        with pytest.raises(ValueError, match=r"the setting diffsoup.campaign.no-worker-timeout=.* must be a positive"):
            checkpointed_map(square, _items(1), ledger_path=tmp_path / "l.json", execution="dask", progress=False)
    assert not (tmp_path / "l.json").exists()


def test_serial_campaign_loads_no_dask(tmp_path):
    code = (
        "import sys; from diffsoup.distributed import checkpointed_map; "
        "r = checkpointed_map(lambda i: i['x'], [{'task_id': 'a', 'x': 1}], "
        f"ledger_path={str(tmp_path / 'l.json')!r}, progress=False, no_worker_timeout=5); "
        "assert r.results == {'a': 1}; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert out.stdout.strip() == "[]"


def test_settings_come_from_dask_environment_variables(tmp_path):
    # Dask reads DASK_* variables when it is imported: a fresh process shows it.
    code = (
        "from diffsoup.distributed._dask_campaign import DaskRunner; r = DaskRunner(); "
        "print(r.no_worker_timeout, r.resources)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "DASK_DIFFSOUP__CAMPAIGN__NO_WORKER_TIMEOUT": "7.5",
           "DASK_DIFFSOUP__CAMPAIGN__RESOURCES": "{'LANE': 2}"}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split(maxsplit=1) == ["7.5", "{'LANE': 2}\n"]
    env.pop("DASK_DIFFSOUP__CAMPAIGN__RESOURCES")
    env["DASK_DIFFSOUP__CAMPAIGN__NO_WORKER_TIMEOUT"] = "inf"  # not a Python literal: Dask passes the text
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "inf {'GPU': 1}"
