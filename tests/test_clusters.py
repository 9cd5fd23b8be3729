"""SLURM profiles, the job script they give, and the GPU each worker process of a job keeps
(no Slurm needed: tests/test_slurm.py runs the jobs)."""

from __future__ import annotations

import os

import pytest

import diffsoup as ds
from diffsoup.distributed._worker import GPUUnavailableError, pin_gpus


def test_each_worker_process_keeps_its_own_gpus():
    # dask worker --nworkers N names processes <name>-0 ... <name>-(N-1)
    assert pin_gpus("SLURMCluster-3-0", "0,1", 1) == "0"
    assert pin_gpus("SLURMCluster-3-1", "0,1", 1) == "1"
    assert pin_gpus("SLURMCluster-0-1", "4,5,6,7", 2) == "6,7"
    assert pin_gpus("SLURMCluster-0", "2", 1) is None  # one GPU already: nothing to do
    assert pin_gpus("w-0", None, 1) is None
    with pytest.raises(GPUUnavailableError, match="ask the job for as many GPUs as processes"):
        pin_gpus("SLURMCluster-0-2", "0,1", 1)


def test_profile_errors_name_the_key(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("[slurm]\ncores = 2\nproceses = 2\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['proceses'\]"):
        ds.distributed.read_slurm_profile(path)
    with pytest.raises(ValueError, match="slurm.gpus = 3 is not a multiple of slurm.processes = 2"):
        ds.distributed.read_slurm_profile({"slurm": {"processes": 2, "cores": 2, "gpus": 3}})
    with pytest.raises(ValueError, match="slurm.cores = 1 is fewer than slurm.processes = 2"):
        ds.distributed.read_slurm_profile({"processes": 2, "cores": 1})
    with pytest.raises(ValueError, match="slurm.memory"):
        ds.distributed.read_slurm_profile({"memory": 4})
    path.write_text("[slurm\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        ds.distributed.read_slurm_profile(path)


def test_example_profile_reads_and_gives_a_gpu_job_script(tmp_path, monkeypatch):
    from pathlib import Path

    monkeypatch.delenv("DIFFSOUP_CACHE_DIR", raising=False)
    example = Path(__file__).resolve().parents[1] / "jobs" / "profile.example.toml"
    profile = ds.distributed.read_slurm_profile(example)
    assert profile.gpus == 2 and profile.processes == 2
    cluster = ds.distributed.slurm_cluster(example, shared_dir=str(tmp_path / "shared"), minimum_jobs=0,
                                           maximum_jobs=0)  # fmt: skip
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    for line in ("#SBATCH -p gpu", "#SBATCH --gres=gpu:2", "#SBATCH -n 1", "#SBATCH --cpus-per-task=4",
                 "export DIFFSOUP_GPUS_PER_WORKER=1", "export JAX_PLATFORMS=cuda",
                 f"export DIFFSOUP_CACHE_DIR={tmp_path / 'shared'}", "--resources GPU=1",
                 "--preload diffsoup.distributed._worker", "--nworkers 2", "--nthreads 2"):  # fmt: skip
        assert line in script, (line, script)


# --------------------------------------------------------------------------------------------
# SlurmProfile: a frozen, checked profile whose missing keys read the diffsoup.slurm settings
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "table, message",
    [
        ({"processes": "2"}, r"slurm.processes = '2' must be a non-negative integer"),
        ({"gpus": True}, r"slurm.gpus = True must be a non-negative integer"),
        ({"maximum_jobs": -1}, r"slurm.maximum_jobs = -1 must be a non-negative integer"),
        ({"queue": ""}, r"slurm.queue = '' must be a non-empty string"),
        ({"job_extra": "--qos=high"}, r"slurm.job_extra = '--qos=high' must be a list of strings"),
        ({"prologue": ["module load cuda", 3]}, r"slurm.prologue = .* must be a list of strings"),
        ({"shared_dir": 5}, r"slurm.shared_dir = 5 must be a directory path"),
        ({"processes": 0}, r"slurm.processes = 0: a job needs at least 1 worker process"),
        ({"minimum_jobs": 3, "maximum_jobs": 2}, r"slurm.minimum_jobs = 3 is more than slurm.maximum_jobs = 2"),
    ],
)
def test_profile_refuses_bad_values_naming_the_field(table, message):
    with pytest.raises(ValueError, match=message):
        ds.distributed.SlurmProfile.from_mapping({"slurm": table})
    with pytest.raises(ValueError, match=message):
        ds.distributed.SlurmProfile(**table)


def test_profile_unknown_keys_name_the_nearest_known_key(tmp_path):
    path = tmp_path / "site.toml"
    path.write_text('[slurm]\nwalltim = "01:00:00"\nmax_jobs = 4\nfoo = 1\n')
    with pytest.raises(ValueError) as info:
        ds.distributed.read_slurm_profile(path)
    text = str(info.value)
    assert text.startswith(f"SLURM profile {path}: unknown key(s) ['foo', 'max_jobs', 'walltim']")
    assert "'walltim': did you mean 'walltime'?" in text and "'max_jobs': did you mean 'maximum_jobs'?" in text
    assert "'foo': did you mean" not in text  # nothing near it
    overrides = r"overrides: unknown key\(s\) \['gpu'\] in \[slurm\] \('gpu': did you mean 'gpus'\?\)"
    with pytest.raises(ValueError, match=overrides):
        ds.distributed.slurm_cluster({"gpus": 0}, gpu=1)
    with pytest.raises(TypeError, match="a mapping or a TOML file, not int"):
        ds.distributed.read_slurm_profile(42)


def test_profile_is_frozen_and_its_lists_are_tuples():
    import dataclasses

    profile = ds.distributed.SlurmProfile(processes=2, gpus=4, job_extra=["--qos=high"], shared_dir="~/shared")
    assert profile.job_extra == ("--qos=high",) and profile.gpus_per_worker == 2
    assert str(profile.shared_dir) == os.path.expanduser("~/shared")
    assert profile.job_cores == 2  # cores left out: one per worker process
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.gpus = 8
    assert ds.distributed.read_slurm_profile(profile) is profile
    assert profile.replace(processes=4, gpus=4).job_cores == 4


def test_read_profile_is_a_deprecated_name_of_read_slurm_profile():
    table = {"slurm": {"processes": 2, "gpus": 2, "memory": "8GB"}}
    with pytest.warns(DeprecationWarning, match="read_slurm_profile"):
        old = ds.distributed.read_profile(table)
    assert old == ds.distributed.read_slurm_profile(table)


def test_profile_defaults_come_from_the_diffsoup_slurm_settings():
    import dask

    from diffsoup.distributed._clusters import jobqueue_options

    shipped = ds.distributed.SlurmProfile()
    assert (shipped.walltime, shipped.memory, shipped.processes, shipped.gpus) == ("01:00:00", "4GB", 1, 0)
    assert (shipped.minimum_jobs, shipped.maximum_jobs, shipped.queue, shipped.job_extra) == (1, 1, None, ())
    site = {"diffsoup.slurm.memory": "96GB", "diffsoup.slurm.queue": "h200", "diffsoup.slurm.maximum-jobs": 8,
            "diffsoup.slurm.job-extra": ["--qos=long"], "diffsoup.cluster.resources": {"GPU": 1, "LANE": 2}}  # fmt: skip
    with dask.config.set(site):
        profile = ds.distributed.read_slurm_profile({"slurm": {"memory": "8GB", "gpus": 1}})
        options = jobqueue_options(profile)
    assert profile.memory == "8GB"  # the profile's own key wins
    assert (profile.queue, profile.maximum_jobs, profile.job_extra) == ("h200", 8, ("--qos=long",))
    assert options["queue"] == "h200" and options["memory"] == "8GB"
    assert options["job_extra_directives"] == ["--qos=long", "--gres=gpu:1"]
    assert options["worker_extra_args"][:2] == ["--resources", "GPU=1,LANE=2"]
    # Outside the block the shipped defaults hold again.
    assert ds.distributed.SlurmProfile().memory == "4GB"


def test_slurm_cluster_leaves_this_process_environment_alone(tmp_path, monkeypatch):
    from pathlib import Path

    monkeypatch.delenv("DIFFSOUP_CACHE_DIR", raising=False)
    monkeypatch.delenv("DIFFSOUP_JAX_CACHE_DIR", raising=False)
    before = dict(os.environ)
    example = Path(__file__).resolve().parents[1] / "jobs" / "profile.example.toml"
    shared = tmp_path / "shared"
    cluster = ds.distributed.slurm_cluster(example, shared_dir=str(shared), minimum_jobs=0,
                                           maximum_jobs=0)  # fmt: skip
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    assert dict(os.environ) == before
    assert shared.is_dir()  # made for the workers
    # The workers get the shared directory through their job script instead.
    assert f"export DIFFSOUP_CACHE_DIR={shared}" in script
    assert "DIFFSOUP_JAX_CACHE_DIR" not in script  # deprecated: the cache is $DIFFSOUP_CACHE_DIR/jax


def test_embedded_cluster_reads_its_worker_count_and_resources_from_the_settings(monkeypatch):
    import dask

    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # no GPU worker: the CPU worker count applies
    with dask.config.set({"diffsoup.cluster.n-workers": 1, "diffsoup.cluster.resources": {"LANE": 3},
                          "diffsoup.cluster.threads-per-worker": 3}):  # fmt: skip
        cluster, client = ds.distributed.embedded_cluster()
    try:
        client.wait_for_workers(1, timeout=60)
        workers = client.scheduler_info(n_workers=-1)["workers"]
        assert len(workers) == 1
        assert [(w["resources"], w["nthreads"]) for w in workers.values()] == [({"LANE": 3}, 3)]
    finally:
        client.close()
        cluster.close()


def test_worker_threads_are_two_where_a_resource_serializes_the_solves_else_one(monkeypatch):
    import dask

    assert ds.distributed.worker_threads({"GPU": 1}) == 2  # the shipped default
    assert ds.distributed.worker_threads({}) == 1  # nothing would keep two solves off one GPU
    assert ds.distributed.worker_threads({}, 4) == 4  # asked for explicitly
    monkeypatch.setenv("DASK_DIFFSOUP__CLUSTER__THREADS_PER_WORKER", "3")
    dask.config.refresh()
    try:
        assert ds.distributed.worker_threads({"GPU": 1}) == 3
    finally:
        monkeypatch.delenv("DASK_DIFFSOUP__CLUSTER__THREADS_PER_WORKER")
        dask.config.refresh()
    with pytest.raises(ValueError, match=r"threads_per_worker=0 must be a positive integer"):
        ds.distributed.worker_threads({"GPU": 1}, 0)
    with dask.config.set({"diffsoup.cluster.threads-per-worker": 1.5}):
        with pytest.raises(ValueError, match=r"the setting diffsoup.cluster.threads-per-worker=1.5 must be"):
            ds.distributed.worker_threads({"GPU": 1})


# --------------------------------------------------------------------------------------------
# cluster_client(scheduler=...): a scheduler that does not answer is one clear error, quickly
# --------------------------------------------------------------------------------------------


def _closed_port() -> int:
    """A port of 127.0.0.1 on which nothing listens."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_dead_scheduler_address_is_one_clear_error_within_the_timeout():
    import time

    from diffsoup.distributed._clusters import ClusterConnectionError

    address = f"tcp://127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    with pytest.raises(ClusterConnectionError) as info:
        with ds.distributed.cluster_client(scheduler=address, connect_timeout=1.5):
            pytest.fail("connected to nothing")
    assert time.monotonic() - started < 1.5 + 5
    message = str(info.value)
    assert message.startswith(f"cannot connect to the Dask scheduler at {address} within 1.5 s (OSError: ")
    assert "`dask scheduler`" in message and "diffsoup.cluster.connect-timeout" in message and "\n" not in message
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, OSError)


def test_the_connect_timeout_is_a_setting_and_the_command_prints_no_traceback(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    code = (
        "import dask, sys\n"
        "from diffsoup.distributed import cluster_client\n"
        "try:\n"
        f"    with cluster_client(scheduler='tcp://127.0.0.1:{_closed_port()}'):\n"
        "        pass\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(repo), "DASK_DIFFSOUP__CLUSTER__CONNECT_TIMEOUT": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ClusterConnectionError cannot connect to the Dask scheduler at tcp://127.0.0.1:")
    assert " within 1 s " in out.stdout
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr


@pytest.mark.parametrize(
    "scheduler, message",
    [
        ("127.0.0.1", r"scheduler='127.0.0.1' is not a Dask scheduler address \(missing port number"),
        ("nonsense://x:1", r"scheduler='nonsense://x:1' is not a Dask scheduler address \(unknown address scheme"),
    ],
)
def test_a_malformed_scheduler_address_names_the_expected_form(scheduler, message):
    with pytest.raises(ValueError, match=message + r".*give tcp://HOST:PORT"):
        with ds.distributed.cluster_client(scheduler=scheduler, connect_timeout=1):
            pass


@pytest.mark.parametrize("value", [0, -1, "soon", float("inf")])
def test_a_bad_connect_timeout_names_its_source(value):
    import dask

    with pytest.raises(ValueError, match=r"connect_timeout=.* must be a positive, finite number of seconds"):
        with ds.distributed.cluster_client(scheduler="tcp://127.0.0.1:1", connect_timeout=value):
            pass
    with dask.config.set({"diffsoup.cluster.connect-timeout": value}):
        with pytest.raises(ValueError, match=r"the setting diffsoup.cluster.connect-timeout=.* must be a positive"):
            with ds.distributed.cluster_client(scheduler="tcp://127.0.0.1:1"):
                pass


def test_a_live_scheduler_address_connects():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address="127.0.0.1:0") as cluster:  # fmt: skip
        with ds.distributed.cluster_client(scheduler=cluster.scheduler_address, connect_timeout=5) as (client, _):
            assert client.submit(lambda x: x + 1, 1).result(timeout=30) == 2
