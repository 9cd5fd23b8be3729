#!/usr/bin/env python3
#SBATCH --job-name=diffsoup-ensemble
#SBATCH --cpus-per-task=1
#SBATCH --mem=4G
#SBATCH --time=12:00:00
#SBATCH --output=diffsoup-ensemble-%j.log
"""A study simulated at many parameter draws on a SLURM cluster, streamed into Zarr, surviving its
allocation: the draws (Latin hypercube or Sobol' points from the study's parameter table, fixed by
--seed) are an ensemble (ds.distributed.ensemble) whose chunks are Dask tasks on GPU workers (worker
resource GPU=1) of dask-jobqueue SLURMCluster jobs; each chunk lands in OUT/simulation.zarr as it is
solved, and the store records which chunks are complete. If the allocation ends (walltime, scancel,
node failure), submit the same command again: the new allocation computes only the chunks not yet
in the store. Read the result with xarray.open_zarr("OUT/simulation.zarr").

    sbatch jobs/ensemble.py study.toml results/ jobs/profile.example.toml --samples 1000000
    sbatch jobs/ensemble.py study.toml results/ jobs/profile.example.toml --samples 1000000   # resumes

Run it with the Python of diffsoup's environment (activate .venv first: sbatch passes PATH on).
"""

import argparse
import os
import sys

import jax

jax.config.update("jax_enable_x64", True)  # diffsoup's default policy is float64

import diffsoup as ds  # noqa: E402
from diffsoup.cli import read_renamed_flags  # noqa: E402
from distributed import Client  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", help="the study file (TOML)")
    parser.add_argument("out", help="output directory; holds simulation.zarr and summary.json")
    parser.add_argument("profile", help="the SLURM profile (TOML), e.g. jobs/profile.example.toml")
    parser.add_argument("--samples", type=int, required=True, help="parameter draws (sobol: a power of 2)")
    parser.add_argument("--sampler", choices=("lhs", "sobol"), default="lhs", help="Latin hypercube or Sobol' points")
    parser.add_argument("--seed", type=int, default=0, help="fixes the draws (keep it to resume)")
    parser.add_argument("--draws-per-chunk", type=int,
                        help="parameter draws per chunk (default: the setting diffsoup.ensemble.chunk-size, in "
                        "simulations' worth)")  # fmt: skip
    # The deprecated name of --draws-per-chunk: still read (with a warning on stderr), not listed.
    parser.add_argument("--chunk-size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    read_renamed_flags(args, parser)

    study = ds.inference.load_study(args.study)
    profile = ds.distributed.read_slurm_profile(args.profile)  # checked: errors name the file and the key
    if profile.shared_dir is not None:
        # The driver shares the compilation cache with its workers (slurm_cluster passes shared_dir
        # to the workers only, in their job script).
        os.environ.setdefault("DIFFSOUP_CACHE_DIR", str(profile.shared_dir.resolve()))
    ds.enable_compilation_cache()
    cluster = ds.distributed.slurm_cluster(profile)  # a dask-jobqueue SLURMCluster, adapt()ing
    print("Worker job script:\n" + cluster.job_script(), flush=True)
    with Client(cluster) as client:
        print(ds.distributed.dashboard_line(client) or "the scheduler serves no dashboard", flush=True)
        # The chunks wait for workers from the batch queue (simulate_samples waits for the first).
        summary = ds.workflows.simulate_samples(study, args.out, samples=args.samples, sampler=args.sampler,
                                                seed=args.seed, client=client, draws_per_chunk=args.draws_per_chunk,
                                                progress=sys.stderr.isatty())
    cluster.close()
    print(f"ensemble: {summary['chunks_written']} chunks written in this allocation, {summary['chunks_resumed']} "
          f"already in the store; status {summary['simulation_status']}")
    print(f"store: {args.out}/{summary['results']}; summary: {args.out}/summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
