"""First contact with the command (issue 40): output folders checked before any work, Ctrl-C that
keeps what finished and says so in one line, campaigns that grow and refuse other settings before
a cluster starts, and the small things (a tolerance below float64's floor, lock files, the
compilation of a fit on Dask)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_cli import write_decay_study

from diffsoup.cli import main

ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return write_decay_study(tmp_path_factory.mktemp("decay"))


# ------------------------------------------------------------------------------------------------
# Output folders: checked before any work
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["fit", "simulate", "campaign", "profile"])
def test_a_file_in_the_way_of_the_output_folder_is_one_line_before_any_work(study, tmp_path, capsys, monkeypatch, command):
    """A file where the output folder (or a folder above it) should be: exit status 2 and one line
    naming the folder and the fix, before the study file is read (so before any solve)."""
    import diffsoup.cli as cli

    monkeypatch.setattr(cli, "_load", lambda args: pytest.fail("the study was read before the folder was checked"))
    blocker = tmp_path / "taken"
    blocker.write_text("a file")
    extra = ["--from-fit", str(tmp_path)] if command == "profile" else []
    for out, what in ((blocker, "it is a file, not a folder"), (blocker / "sub" / "out", f"it lies under the file {blocker}, not a folder")):
        assert main([command, str(study), "-o", str(out), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert f"diffsoup {command}: cannot write the output folder {out}: {what}" in err
        assert "give another --out" in err and "Traceback" not in err


def test_an_unwritable_output_folder_is_one_line_before_any_work(study, tmp_path, capsys, monkeypatch):
    """A folder this process may not write (the check asks os.access, as root it is made to say
    no): exit status 2 and one line naming it, for the folder itself and for the folder a missing
    one would be created in; a missing folder in a writable one is fine and not created yet."""
    import diffsoup.cli as cli
    from diffsoup.workflows._output_folder import check_output_folder

    locked = tmp_path / "locked"
    locked.mkdir()
    if os.geteuid() == 0:  # root writes through chmod: the check is made to see what a user would
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real(p, mode))
    else:
        locked.chmod(0o555)
    monkeypatch.setattr(cli, "_load", lambda args: pytest.fail("the study was read before the folder was checked"))
    for out, where in ((locked, ""), (locked / "a" / "b", f" (it would be created in {locked})")):
        assert main(["fit", str(study), "-o", str(out), "--in-process"]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (f"diffsoup fit: cannot write the output folder {out}{where}: permission denied; give another "
                       f"--out (a folder this process can write), or make {locked} writable.")  # fmt: skip
    missing = tmp_path / "new" / "deeper"
    assert check_output_folder(missing) == missing and not (tmp_path / "new").exists()


# ------------------------------------------------------------------------------------------------
# Ctrl-C: one line, exit status 130, what finished kept, no empty folder, no lock
# ------------------------------------------------------------------------------------------------


def _interrupt(argv: list[str], ready, timeout: float = 240.0) -> tuple[int, str]:
    """Run ``diffsoup argv`` in its own process group, send SIGINT to the whole group (as a
    terminal's Ctrl-C does: the workers of an embedded cluster too) once ``ready(stderr so far)``
    holds, and return its exit status and stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "diffsoup", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True)  # fmt: skip
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(iter(lambda: proc.stderr.read(1), "")), daemon=True)
    reader.start()
    t0 = time.monotonic()
    try:
        while not ready("".join(err)):
            assert proc.poll() is None, "".join(err)
            assert time.monotonic() - t0 < timeout, "".join(err)
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join(10)
    return proc.returncode, "".join(err)


def _accepted(ledger: Path) -> int:
    try:
        return sum(t["state"] == "accepted" for t in json.loads(ledger.read_text())["tasks"].values())
    except (OSError, ValueError, KeyError):
        return 0


def test_ctrl_c_in_a_campaign_keeps_the_finished_starts_and_says_so_in_one_line(study, tmp_path):
    out = tmp_path / "out"
    rc, err = _interrupt(["campaign", study, "-o", out, "--in-process", "--starts", "60", "--method", "trf",
                          "--no-plots"], lambda _: _accepted(out / "campaign.json") >= 2)  # fmt: skip
    last = err.strip().splitlines()[-1]
    kept = _accepted(out / "campaign.json")
    assert rc == 130, err
    assert last == (f"diffsoup campaign: interrupted after {kept} of 60 starts; the ledger {out / 'campaign.json'} "
                    "keeps the finished ones: run the same command again to run the others")  # fmt: skip
    assert kept >= 2 and "Traceback" not in err and "KeyboardInterrupt" not in err
    assert not (out / "campaign.json.lock").exists()


def test_an_interrupt_python_drops_is_delivered_again_and_its_cleanup_is_not_interrupted(capsys):
    """A KeyboardInterrupt raised inside a weakref callback is dropped by Python (once, a fit on the
    embedded cluster ran on to its end after Ctrl-C): the command's handler delivers it again until
    the command catches it, prints nothing for the dropped one, and leaves the cleanup of a
    KeyboardInterrupt alone."""
    import contextlib
    import weakref

    from diffsoup.workflows._interrupted import REDELIVER_S, interrupt_quietly

    class Dropped:
        pass

    stack = contextlib.ExitStack()
    handler = interrupt_quietly(stack)
    stack.callback(signal.signal, signal.SIGINT, signal.signal(signal.SIGINT, handler))
    stack.callback(handler.acknowledge)
    cleanup_done = False
    with stack:
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            try:
                obj = Dropped()
                ref = weakref.ref(obj, lambda _: handler(signal.SIGINT, None))  # noqa: F841
                del obj  # the callback's KeyboardInterrupt is dropped here
                while time.monotonic() - t0 < 10 * REDELIVER_S:
                    sum(range(1000))
            finally:
                end = time.monotonic() + 3 * REDELIVER_S  # a cleanup longer than the re-delivery period
                while time.monotonic() < end:
                    sum(range(1000))
                cleanup_done = True
        handler.acknowledge()
        waited = time.monotonic() - t0
    assert cleanup_done and REDELIVER_S <= waited - 3 * REDELIVER_S < 3 * REDELIVER_S
    err = capsys.readouterr().err
    assert "Exception ignored" not in err and "KeyboardInterrupt" not in err


def test_ctrl_c_in_a_fit_on_the_embedded_cluster_is_one_line_and_leaves_no_folder(study, tmp_path):
    """On the embedded Dask cluster (its workers get the SIGINT too): one line pointing to the
    resumable form, no traceback from client, scheduler or workers, and no empty output folder."""
    out = tmp_path / "out"
    rc, err = _interrupt(["fit", study, "-o", out, "--workers", "1", "--starts", "60", "--method", "trf"],
                         lambda text: "2/60" in text)  # fmt: skip
    assert rc == 130, err
    assert err.strip().splitlines()[-1] == (
        f"diffsoup fit: interrupted; fit keeps none of 60 starts: 'diffsoup campaign {study} -o {out} --method trf "
        f"--starts 60 --workers 1' runs the same starts as a campaign, whose ledger keeps each finished start (a "
        "rerun after Ctrl-C runs only the others)")  # fmt: skip
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "distributed." not in err, err
    assert not out.exists()


# ------------------------------------------------------------------------------------------------
# Campaigns: grown without rerunning, other settings refused before any cluster starts
# ------------------------------------------------------------------------------------------------


def test_the_silenced_dask_logs_include_children_dask_gives_a_level_of_their_own():
    """Dask's configuration sets ``tornado.application`` to ERROR; through it the loop thread logs
    the traceback of a Ctrl-C that lands before Dask's ``sync`` started its future (seen in CI)."""
    import distributed  # noqa: F401  (applies Dask's logging configuration)

    from diffsoup.distributed._clusters import quiet_dask_logs

    logger = logging.getLogger("tornado.application")
    assert logger.level == logging.ERROR  # the premise: a level of its own, not the parent's
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        with quiet_dask_logs():
            logger.error("while the cluster closes")
        logger.error("after")
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == ["after"]
    assert logger.level == logging.ERROR


def test_a_campaign_grown_from_2_to_3_starts_runs_only_the_new_one(study, tmp_path):
    """The start points are a stream: the 2 starts of the first run are the first 2 of 3, found
    unchanged in the ledger (same records, same finish times), and only the third runs."""
    from diffsoup.workflows import campaign_study

    out = tmp_path / "out"
    settings = dict(seed=1, method="trf", max_nfev=20, hierarchical=False, progress=False, plots=False, log=lambda _: None)
    first = campaign_study(study, out, starts=2, **settings)
    before = json.loads((out / "campaign.json").read_text())["tasks"]
    grown = campaign_study(study, out, starts=3, **settings)
    after = json.loads((out / "campaign.json").read_text())["tasks"]
    assert first["campaign"]["accepted"] == 2
    assert grown["campaign"] | {"window_solves": 0} == {**grown["campaign"], "tasks": 3, "accepted": 3, "resumed": 2,
                                                       "failed": 0, "window_solves": 0}  # fmt: skip
    for task_id, record in before.items():
        assert after[task_id]["fingerprint"] == record["fingerprint"]
        assert after[task_id]["finished"] == record["finished"]


def test_a_campaign_rerun_with_other_settings_is_refused_before_the_cluster_starts(study, tmp_path, capsys,
                                                                                 monkeypatch):  # fmt: skip
    """One line naming each change and what to type (no Python API advice), exit status 2, before
    any cluster starts (the embedded default is not --in-process here) and before the study is lowered."""
    import diffsoup.cli as cli
    import diffsoup.workflows._study_campaign as campaign

    out = tmp_path / "out"
    assert main(["campaign", str(study), "-o", str(out), "--in-process", "--starts", "2", "--method", "trf",
                 "--seed", "1", "--no-plots"]) == 0  # fmt: skip
    capsys.readouterr()
    monkeypatch.setattr(cli, "_cluster", lambda args: pytest.fail("a cluster started before the conflict was found"))
    monkeypatch.setattr(campaign, "StudyLowering", lambda *a: pytest.fail("the study was lowered first"))
    assert main(["campaign", str(study), "-o", str(out), "--starts", "4", "--method", "lbfgsb", "--seed", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"diffsoup campaign: LedgerConflictError: the campaign in {out} ran with other settings (method trf, "
                   f"now lbfgsb; seed 1, now 2): its ledger {out / 'campaign.json'} holds other starts. Run it with "
                   "--restart to start anew (the ledger is kept as a .bak), with the earlier settings (--method trf, "
                   "--seed 1), or with another --out.")  # fmt: skip
    assert "on_conflict" not in err and "resume=" not in err


# ------------------------------------------------------------------------------------------------
# The small things
# ------------------------------------------------------------------------------------------------


def test_a_finished_campaign_leaves_no_lock_file(study, tmp_path):
    from diffsoup.workflows import campaign_study

    out = tmp_path / "out"
    campaign_study(study, out, starts=1, method="trf", max_nfev=5, progress=False, plots=False, log=lambda _: None)
    assert (out / "campaign.json").is_file()
    assert sorted(p.name for p in out.iterdir() if p.name.endswith(".lock")) == []


def test_an_rtol_below_float64s_floor_is_one_line_without_advice_to_use_float64(tmp_path):
    """rtol = 1e-20 in a study file: one line from diffsoup naming the floor it uses, not Python's
    warning form (file, line, source) advising a float64 policy already in force."""
    folder = tmp_path / "study"
    path = write_decay_study(folder)
    path.write_text(path.read_text().replace("rtol = 1e-10", "rtol = 1e-20"))
    proc = subprocess.run([sys.executable, "-m", "diffsoup", "simulate", str(path), "-o", str(tmp_path / "out"),
                           "--no-plots"], capture_output=True, text=True, env=ENV, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "rtol" in line]
    assert lines == ["diffsoup: warning: InferenceProblem: rtol=1e-20 is below what float64 computations resolve "
                     "(100 * eps = 2.2e-14); using rtol=2.2e-14."], proc.stderr  # fmt: skip
    assert "warnings.warn" not in proc.stderr


def test_compile_lines_of_dask_workers_reach_the_driver_each_named_by_its_worker():
    """A fit on Dask compiles on the workers: their ``diffsoup.compile`` records are forwarded to
    the driver's compile progress, one start and end per worker (two workers compiling the same
    program are two lines each, and no ticker is left running)."""
    from distributed import Client, LocalCluster

    from diffsoup.distributed._compile_forwarding import forward_compile_progress
    from diffsoup.workflows._compile_progress import install_compile_progress, remove_compile_progress

    lines: list[str] = []
    handler = install_compile_progress(lines.append, interval=0.05)
    try:
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
                Client(cluster) as client:  # fmt: skip
            assert forward_compile_progress(client)

            def compile_once():
                log = logging.getLogger("diffsoup.compile")
                log.info("start", extra={"diffsoup_compile": ("start", "value program", 0.0)})
                time.sleep(0.2)
                log.info("end", extra={"diffsoup_compile": ("end", "value program", 0.2)})
                return True

            workers = sorted(client.scheduler_info()["workers"])
            for w in workers:
                assert client.submit(compile_once, workers=[w], pure=False).result()
            deadline = time.monotonic() + 10
            while sum(line.startswith("compiled") for line in lines) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
        for w in workers:
            assert f"compiling the value program on worker {w} ..." in lines
            assert f"compiled the value program on worker {w} in 0.2 s" in lines
        assert not handler._running
    finally:
        remove_compile_progress()
