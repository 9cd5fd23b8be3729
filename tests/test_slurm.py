"""The job scripts on a real Slurm (a single-node cluster that ``.ci/slurm-up`` installs and starts):
a fit through ``jobs/fit_study.py``, a campaign through ``jobs/campaign.py`` whose first allocation
is cancelled mid-campaign (scancel) and whose second finishes it, reusing the window starts, and a
job holding 2 generic GPUs whose 2 worker processes each see one.

The GPUs of the test cluster are character devices made with mknod (gres File=/dev/nvidia[0-1]);
Slurm sets CUDA_VISIBLE_DEVICES from them, and JAX stays on the CPU (``jax_platforms = "cpu"``).
Without Slurm these tests skip, unless ``DIFFSOUP_REQUIRE_SLURM=1`` (set by ``.ci/run``) makes
them fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "jobs"

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _slurm_ready() -> str | None:
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return "Slurm is not installed (run .ci/slurm-up as root)"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"sinfo failed: {exc}"
    states = out.stdout.split()
    if out.returncode != 0 or not any(s.rstrip("*") in ("idle", "mixed", "allocated") for s in states):
        return f"no usable Slurm node (sinfo: {out.stdout.strip() or out.stderr.strip()})"
    return None


@pytest.fixture(scope="module")
def slurm():
    problem = _slurm_ready()
    if problem:
        if os.environ.get("DIFFSOUP_REQUIRE_SLURM") == "1":
            pytest.fail(f"DIFFSOUP_REQUIRE_SLURM=1 but {problem}")
        pytest.skip(problem)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"  # the job's python3 is this venv's
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("DIFFSOUP_CACHE_DIR", None)
    return env


def profile(directory: Path, **extra) -> Path:
    table = {"cores": 1, "processes": 1, "gpus": 1, "jax_platforms": "cpu", "memory": "3GB",
             "walltime": "00:30:00", "minimum_jobs": 1, "maximum_jobs": 1,
             "shared_dir": str(directory / "shared"), **extra}  # fmt: skip
    lines = ["[slurm]"] + [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    path = directory / "profile.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def study(directory: Path, n_experiments: int, multishoot: int = 0) -> Path:
    from diffsoup._demo_study import write_demo_study

    path = write_demo_study(directory, n_experiments=n_experiments)
    text = path.read_text()
    line = 'data = "data/measurements.csv"\n'
    text = text.replace(line, line + 'multishoot = { windows = 2, init = "simulate" }\n', multishoot)
    path.write_text(text)
    return path


def sbatch(script: Path, *args, env, cwd: Path, log: Path) -> str:
    out = subprocess.run(["sbatch", "--parsable", f"--output={log}", f"--chdir={cwd}", str(script), *map(str, args)],
                         capture_output=True, text=True, env=env, timeout=60, check=True)  # fmt: skip
    return out.stdout.strip().split(";")[0]


def running(job: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=30)
    return bool(out.stdout.strip())


def wait_for(predicate, timeout: float, what: str, log: Path | None = None, interval: float = 0.5):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(interval)
    tail = log.read_text()[-4000:] if log is not None and log.exists() else ""
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{tail}")


def cancel_all(env) -> None:
    subprocess.run(["scancel", "-u", os.environ.get("USER", "root")], env=env, timeout=30)
    wait_for(lambda: not subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout.strip(), 120,
             "the cancelled jobs to leave the queue")  # fmt: skip


def watch_dashboard(job: str, log: Path, timeout: float = 600) -> dict:
    """Read diffsoup's page and its studies route on the job's dashboard (its URL is in the job's
    log) until the job ends, or until a read after the fit is done (the job's log says so; its
    dashboard stays up a few seconds more): the page's HTML and the last study's experiment count
    and statuses."""
    seen: dict = {"page": None, "experiments": None, "statuses": None}
    end = time.monotonic() + timeout
    url = None
    while time.monotonic() < end and running(job):
        text = log.read_text() if log.exists() else ""
        if url is None:
            match = re.search(r"diffsoup page: (http\S+)/diffsoup\b", text)
            url = match.group(1) if match else None
        if url is not None:
            try:
                if seen["page"] is None:
                    seen["page"] = urllib.request.urlopen(f"{url}/diffsoup", timeout=10).read().decode()
                studies = json.loads(urllib.request.urlopen(f"{url}/diffsoup/studies.json", timeout=10).read())
            except (OSError, ValueError):
                studies = {}
            for record in studies.get("studies", {}).values():
                statuses = [e["status"] for e in record["experiments"].values() if e["status"] is not None]
                seen["experiments"] = len(record["experiments"])
                seen["statuses"] = {s: statuses.count(s) for s in set(statuses)}
            if studies and "fit done; the dashboard stays up" in text:
                break  # read after the fit: the final statuses
        time.sleep(0.5)
    return seen


def ledger_states(path: Path) -> dict:
    try:
        tasks = json.loads(path.read_text())["tasks"]
    except (OSError, ValueError, KeyError):
        return {}
    return {k: v["state"] for k, v in tasks.items()}


def test_fit_job_script_fits_a_study_through_slurm_workers(slurm, tmp_path):
    import zarr

    from diffsoup._demo_study import TRUTH

    path = study(tmp_path, 6)
    log = tmp_path / "fit.log"
    job = sbatch(JOBS / "fit_study.py", path, tmp_path / "out", profile(tmp_path), "--starts", 2, "--max-nfev", 30,
                 "--keep-dashboard", 8, env=slurm, cwd=tmp_path, log=log)  # fmt: skip
    # diffsoup's page on the SLURMCluster's dashboard, read while the job runs: the study's
    # experiments arrive in its JSON route, and the page itself is served.
    seen = watch_dashboard(job, log)
    wait_for(lambda: not running(job), 600, f"fit job {job}", log)
    text = log.read_text()
    assert "#SBATCH --gres=gpu:1" in text and "--resources GPU=1" in text and "Dask dashboard:" in text, text[-3000:]
    assert seen["page"] and "bokeh" in seen["page"].lower(), text[-3000:]
    assert seen["experiments"] == 6 and seen["statuses"] == {"SUCCESS": 6}, (seen, text[-3000:])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["where"].startswith("Dask scheduler") and summary["experiment_status"] == {"SUCCESS": 6}
    for name, true in TRUTH.items():
        z = (np.log10(summary["parameters"][name]) - np.log10(true)) / summary["standard_errors"][name]
        assert abs(z) < 5, (name, z)
    root = zarr.open_group(str(tmp_path / "out" / "results.zarr"), mode="r")
    assert root.attrs["complete"] is True and root["experiments/5/states"].shape == (10, 5)


def test_campaign_survives_a_cancelled_allocation_and_reuses_window_starts(slurm, tmp_path):
    path = study(tmp_path, 8, multishoot=2)
    prof = profile(tmp_path)
    out = tmp_path / "out"
    ledger = out / "campaign.json"
    args = (path, out, prof, "--starts", 8, "--max-nfev", 25)

    # Allocation 1: cancelled once a few starts are accepted.
    log1 = tmp_path / "campaign-1.log"
    job1 = sbatch(JOBS / "campaign.py", *args, env=slurm, cwd=tmp_path, log=log1)
    wait_for(lambda: list(ledger_states(ledger).values()).count("accepted") >= 2, 600,
             "two accepted starts in allocation 1", log1, interval=0.2)  # fmt: skip
    subprocess.run(["scancel", job1], env=slurm, timeout=30, check=True)
    cancel_all(slurm)  # the worker jobs too (they would otherwise wait for their lost scheduler)
    first = json.loads(ledger.read_text())["tasks"]
    accepted1 = {k for k, v in first.items() if v["state"] == "accepted"}
    assert 2 <= len(accepted1) < 8, f"allocation 1 was meant to stop mid-campaign: {len(accepted1)} accepted"
    assert not (out / "summary.json").exists()
    assert "window-start solves" not in log1.read_text()  # it never got that far

    # Allocation 2: the same script again finishes the campaign.
    log2 = tmp_path / "campaign-2.log"
    job2 = sbatch(JOBS / "campaign.py", *args, env=slurm, cwd=tmp_path, log=log2)
    wait_for(lambda: not running(job2), 600, f"campaign job {job2}", log2)
    text = log2.read_text()
    summary = json.loads((out / "summary.json").read_text())
    c = summary["campaign"]
    assert c["accepted"] == 8 and c["failed"] == 0, text[-3000:]
    assert c["resumed"] == len(accepted1)
    # Window starts were computed once, in allocation 1, and read from the shared store after.
    assert c["window_solves"] == 0 and "every window start came from the store" in text
    store = list((tmp_path / "shared").glob("windows*"))
    assert store, list((tmp_path / "shared").iterdir())
    final = json.loads(ledger.read_text())["tasks"]
    jobs1 = {first[k]["result"]["slurm_job"] for k in accepted1}
    for k in accepted1:  # not run again: same result, same worker job, one attempt
        assert final[k]["result"] == first[k]["result"] and final[k]["attempts"] == 1
    later = {final[k]["result"]["slurm_job"] for k in set(final) - accepted1}
    assert jobs1.isdisjoint(later), (jobs1, later)  # the rest ran in allocation 2's worker job
    assert summary["starts"]["total"] == 8 and summary["experiment_status"] == {"SUCCESS": 8}


def test_job_with_two_gpus_pins_one_gpu_per_worker_process(slurm, tmp_path, monkeypatch):
    from distributed import Client

    import diffsoup as ds

    for key, value in slurm.items():
        if key in ("PATH", "JAX_PLATFORMS"):
            monkeypatch.setenv(key, value)
    cluster = ds.distributed.slurm_cluster(profile(tmp_path, cores=2, processes=2, gpus=2))
    try:
        script = cluster.job_script()
        assert "#SBATCH --gres=gpu:2" in script and "DIFFSOUP_GPUS_PER_WORKER=1" in script
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=300)
            seen = client.run(lambda: (os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("SLURM_JOB_ID")))
            resources = {w["name"]: w["resources"] for w in client.scheduler_info(n_workers=-1)["workers"].values()}
    finally:
        cluster.close()
    devices = sorted(d for d, _ in seen.values())
    assert devices == ["0", "1"], seen  # each worker process sees its own GPU
    assert len({j for _, j in seen.values()}) == 1  # both in one job
    assert all(r == {"GPU": 1.0} for r in resources.values()), resources
