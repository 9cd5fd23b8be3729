#!/usr/bin/env python3
#SBATCH --job-name=diffsoup-fit
#SBATCH --cpus-per-task=1
#SBATCH --mem=4G
#SBATCH --time=12:00:00
#SBATCH --output=diffsoup-fit-%j.log
"""Fit a study on a SLURM cluster: the driver (this script) runs in a small allocation or on a
login node, and dask-jobqueue SLURMCluster jobs bring the GPU workers (one worker process per GPU,
each with the worker resource GPU=1, scaled with adapt()). The study's experiments are split over
the workers by ``ds.distributed.run``; each optimizer step sends parameters and gathers residuals
and Jacobians.

    sbatch jobs/fit_study.py study.toml results/ jobs/profile.example.toml
    python jobs/fit_study.py study.toml results/ jobs/profile.example.toml     # from a login node

Run it with the Python of diffsoup's environment (activate .venv first: sbatch passes PATH on).
Results: results/results.zarr, results/summary.json, results/plots/*.png.
"""

import argparse
import os
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)  # diffsoup's default policy is float64

import diffsoup as ds  # noqa: E402
from distributed import Client  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", help="the study file (TOML)")
    parser.add_argument("out", help="output directory")
    parser.add_argument("profile", help="the SLURM profile (TOML), e.g. jobs/profile.example.toml")
    parser.add_argument("--starts", type=int, help="number of starts (default: the study file's)")
    parser.add_argument("--max-nfev", type=int, help="most evaluations per start")
    parser.add_argument("--keep-dashboard", type=float, default=0.0, metavar="SECONDS",
                        help="keep the scheduler, and so the dashboard's diffsoup page, up this long after the fit")
    args = parser.parse_args()

    study = ds.inference.load_study(args.study)  # errors name the file, line and field
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
        # ds.distributed.run(study, cluster=client) + ds.inference.fit + results, summary, plots:
        summary = ds.workflows.fit_study(study, args.out, client=client, starts=args.starts,
                                         max_nfev=args.max_nfev, progress=sys.stderr.isatty())
        if args.keep_dashboard > 0:
            print(f"fit done; the dashboard stays up {args.keep_dashboard:g} s", flush=True)
            time.sleep(args.keep_dashboard)
    cluster.close()
    print(f"objective {summary['objective']:.8g}; estimates {summary['parameters']}")
    print(f"summary: {args.out}/summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
