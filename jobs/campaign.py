#!/usr/bin/env python3
#SBATCH --job-name=diffsoup-campaign
#SBATCH --cpus-per-task=1
#SBATCH --mem=4G
#SBATCH --time=12:00:00
#SBATCH --output=diffsoup-campaign-%j.log
"""A multistart campaign on a SLURM cluster that survives its allocation: each start of the fit is
one task of ``ds.inference.checkpointed_map``, run as a Dask task on a GPU worker (worker resource
GPU=1) of dask-jobqueue SLURMCluster jobs, and recorded in the JSON ledger OUT/campaign.json. If
the allocation ends (walltime, scancel, node failure), submit the same command again: the new
allocation runs only the starts not yet accepted, and reuses the window starts of
multiple-shooting experiments from the shared store (the profile's shared_dir).

    sbatch jobs/campaign.py study.toml results/ jobs/profile.example.toml --starts 64
    sbatch jobs/campaign.py study.toml results/ jobs/profile.example.toml --starts 64   # resumes

Run it with the Python of diffsoup's environment (activate .venv first: sbatch passes PATH on).
"""

import argparse
import math
import os
import sys

import jax

jax.config.update("jax_enable_x64", True)  # diffsoup's default policy is float64

import diffsoup as ds  # noqa: E402
from distributed import Client  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", help="the study file (TOML)")
    parser.add_argument("out", help="output directory; holds the ledger campaign.json")
    parser.add_argument("profile", help="the SLURM profile (TOML), e.g. jobs/profile.example.toml")
    parser.add_argument("--starts", type=int, help="number of starts (default: the study file's)")
    parser.add_argument("--max-nfev", type=int, help="most evaluations per start")
    args = parser.parse_args()

    study = ds.inference.load_study(args.study)
    profile = ds.distributed.read_slurm_profile(args.profile)  # checked: errors name the file and the key
    if profile.shared_dir is not None:
        # This driver shares the window-start store and the compilation cache with its workers
        # (slurm_cluster passes shared_dir to the workers only, in their job script).
        os.environ.setdefault("DIFFSOUP_CACHE_DIR", str(profile.shared_dir.resolve()))
    # JAX's compilation cache (jax/ under DIFFSOUP_CACHE_DIR, the workers' too): a rerun loads the
    # programs this driver compiled instead of compiling them again.
    ds.enable_compilation_cache()
    cluster = ds.distributed.slurm_cluster(profile)  # a dask-jobqueue SLURMCluster, adapt()ing
    print("Worker job script:\n" + cluster.job_script(), flush=True)
    with Client(cluster) as client:
        print(ds.distributed.dashboard_line(client) or "the scheduler serves no dashboard", flush=True)
        # ds.inference.checkpointed_map over the starts (ledger OUT/campaign.json), then the best
        # start written as a fit. Workers come from the batch queue: tasks wait for them.
        summary = ds.workflows.campaign_study(study, args.out, client=client, starts=args.starts,
                                              max_nfev=args.max_nfev, progress=sys.stderr.isatty(),
                                              no_worker_timeout=math.inf)
    cluster.close()
    c = summary["campaign"]
    print(f"campaign: {c['accepted']}/{c['tasks']} accepted, {c['resumed']} resumed from the ledger, "
          f"{c['window_solves']} window-start solves in this run; objective {summary['objective']:.8g}")
    print(f"summary: {args.out}/summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
