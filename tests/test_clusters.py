"""SLURM profiles, the job script they give, and the GPU each worker process of a job keeps
(no Slurm needed: tests/test_slurm.py runs the jobs)."""

from __future__ import annotations

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
        ds.distributed.read_profile(path)
    with pytest.raises(ValueError, match="slurm.gpus = 3 is not a multiple of slurm.processes = 2"):
        ds.distributed.read_profile({"slurm": {"processes": 2, "cores": 2, "gpus": 3}})
    with pytest.raises(ValueError, match="slurm.cores = 1 is fewer than slurm.processes = 2"):
        ds.distributed.read_profile({"processes": 2, "cores": 1})
    with pytest.raises(ValueError, match="slurm.memory"):
        ds.distributed.read_profile({"memory": 4})
    path.write_text("[slurm\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        ds.distributed.read_profile(path)


def test_example_profile_reads_and_gives_a_gpu_job_script(tmp_path, monkeypatch):
    from pathlib import Path

    monkeypatch.delenv("DIFFSOUP_CACHE_DIR", raising=False)
    example = Path(__file__).resolve().parents[1] / "jobs" / "profile.example.toml"
    table = ds.distributed.read_profile(example)
    assert table["gpus"] == 2 and table["processes"] == 2
    cluster = ds.distributed.slurm_cluster(example, shared_dir=str(tmp_path / "shared"), minimum_jobs=0,
                                           maximum_jobs=0)  # fmt: skip
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    for line in ("#SBATCH -p gpu", "#SBATCH --gres=gpu:2", "#SBATCH -n 1", "#SBATCH --cpus-per-task=4",
                 "export DIFFSOUP_GPUS_PER_WORKER=1", "export JAX_PLATFORMS=cuda",
                 f"export DIFFSOUP_CACHE_DIR={tmp_path / 'shared'}", "--resources GPU=1",
                 "--preload diffsoup.distributed._worker", "--nworkers 2", "--nthreads 1"):  # fmt: skip
        assert line in script, (line, script)
