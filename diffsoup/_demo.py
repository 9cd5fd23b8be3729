"""The demo behind ``diffsoup demo`` (and the README's first command), on the embedded default (CPU):
stiff reference problems solved, differentiated and checked against published values, then a
reaction network fitted to synthetic experiments (true vs recovered parameters)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import diffsoup as ds

from ._compilation_cache import enable_compilation_cache


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    _block(out)
    first = time.perf_counter() - start
    start = time.perf_counter()
    out = fn()
    _block(out)
    return out, first, time.perf_counter() - start


def _block(tree):
    jax.block_until_ready(tree)


def run(n_grid: int = 32, out=print) -> list[dict]:
    """Solve ROBER (Test Set for IVP Solvers) and the 2-D Brusselator, print a table, return its rows."""
    jax.config.update("jax_enable_x64", True)  # an entry point of diffsoup's own: float64 is the default policy
    enable_compilation_cache()
    from diffsoup.examples import BRUSSELATOR_U00_REFERENCE, ROBER_REFERENCE, brusselator_2d, rober, scd

    out(f"diffsoup {ds.__version__} demo on {jax.devices()[0].platform.upper()} "
        f"(JAX {jax.__version__}); compile time is the first call minus the second.\n")  # fmt: skip
    rows = []

    rober_problem = rober().build()
    for rtol in (1e-6, 1e-10):
        sol, first, t = _timed(
            lambda: ds.simulate(rober_problem, t_eval=[ROBER_REFERENCE["t"]], rtol=rtol, atol=1e-4 * rtol)
        )
        rows.append(dict(problem="ROBER to t=1e11", solver="Dense", rtol=rtol, sol=sol, first=first, time=t,
                         accuracy=scd(sol.ys[-1], ROBER_REFERENCE["y"]), reference="Test Set scd"))  # fmt: skip

    spec = brusselator_2d(n_grid)
    # KLU on a CPU, cuDSS on a GPU (dense LU where cuDSS is missing), as spec.build() picks them.
    sparse = ds.linear.default_solver(spec.n_states)
    bruss = spec.build(linear_solver=sparse)
    for rtol in (1e-6, 1e-8):
        sol, first, t = _timed(
            lambda: ds.simulate(bruss, t_eval=[11.5], rtol=rtol, atol=1e-2 * rtol, discontinuities=(1.1,))
        )
        err = abs(float(sol.ys[-1, 0]) - BRUSSELATOR_U00_REFERENCE) / BRUSSELATOR_U00_REFERENCE
        # The published u(0,0) is for N = 32; other grids have no reference value.
        digits = -np.log10(max(err, 1e-16)) if n_grid == 32 else float("nan")
        rows.append(dict(problem=f"Brusselator 2-D N={n_grid} ({spec.n_states} states)", solver=sparse.name, rtol=rtol,
                         sol=sol, first=first, time=t, accuracy=digits,
                         reference="u(0,0) digits" if n_grid == 32 else "no reference at this N"))  # fmt: skip

    header = f"{'problem':<38} {'solver':<6} {'rtol':>6} {'time s':>7} {'compile s':>9} {'steps':>6} {'rejected':>8} {'LU':>6} {'digits':>6}  reference"
    out(header)
    out("-" * len(header))
    for r in rows:
        st = r["sol"].stats
        out(f"{r['problem']:<38} {r['solver']:<6} {r['rtol']:>6.0e} {r['time']:>7.2f} {max(r['first'] - r['time'], 0):>9.1f} "
            f"{int(st['n_steps']):>6} {int(st['n_rejected']):>8} {int(st['n_factor']):>6} {r['accuracy']:>6.2f}  {r['reference']}")  # fmt: skip

    # Sensitivities: d u(0,0; t=11.5) / d(A, B, alpha), by the adjoint and by forward mode.
    def u00(p, adjoint):
        return ds.simulate(bruss, t_eval=[11.5], params=p, rtol=1e-6, atol=1e-8, discontinuities=(1.1,),
                           adjoint=adjoint).ys[-1, 0]  # fmt: skip

    p = bruss.parameter_vector()
    g_rev, first_rev, t_rev = _timed(lambda: jax.grad(u00)(p, ds.CheckpointAdjoint()))
    g_fwd, first_fwd, t_fwd = _timed(lambda: jax.jacfwd(u00)(p, ds.ForwardMode()))
    agree = float(jnp.max(jnp.abs(g_rev - g_fwd)) / jnp.max(jnp.abs(g_fwd)))
    out(f"\nd u(0,0)/d(A, B, alpha) at t=11.5, N={n_grid}, rtol 1e-6:")
    out(f"  adjoint (jax.grad)      {np.asarray(g_rev)}   {t_rev:.2f} s")
    out(f"  forward (jax.jacfwd)    {np.asarray(g_fwd)}   {t_fwd:.2f} s")
    out(f"  relative difference     {agree:.1e}")

    return rows


def run_study(directory, *, n_experiments: int = 24, in_process: bool = False, workers: int | None = None,
              out=print) -> dict:
    """The main job: write the demo study file (an enzyme with substrate inhibition, synthetic
    data) into ``directory``, fit it as ``diffsoup fit`` does -- on the embedded default, a local
    Dask cluster, unless ``in_process`` -- and print true vs recovered rate constants."""
    from ._demo_study import TRUTH, write_demo_study
    from .workflows import fit_study

    study = write_demo_study(directory, n_experiments=n_experiments)
    out(f"\nWrote the demo study {study} ({n_experiments} experiments, data in {study.parent / 'data'}).")
    if in_process:
        summary = fit_study(study, directory, log=out)
    else:
        from .distributed import cluster_client

        out("[diffsoup] starting the embedded default: a local Dask cluster on 127.0.0.1 ...")
        with cluster_client(n_workers=workers) as (client, _dashboard):  # fit_study prints the dashboard
            summary = fit_study(study, directory, client=client, log=out)
    est, se = summary["parameters"], summary["standard_errors"]
    out(f"\n{'parameter':<10} {'true':>10} {'recovered':>10} {'std err (log10)':>16} {'z':>6}")
    z = {}
    for name, true in TRUTH.items():
        se_name = math.nan if se[name] is None else se[name]  # None: withheld (at a bound, not identifiable)
        z[name] = (np.log10(est[name]) - np.log10(true)) / se_name
        out(f"{name:<10} {true:>10.4g} {est[name]:>10.4g} {se_name:>16.3g} {z[name]:>6.2f}")
    starts = summary["starts"]
    out(f"\n{starts['at_best']} of {starts['total']} starts reached the best objective {summary['objective']:.6g} "
        f"({summary['evaluations']} evaluations, {summary['seconds']:.1f} s); max |z| {max(map(abs, z.values())):.2f}.")
    directory = Path(directory)  # the summary's paths are relative to it; show them under it, as given
    out(f"Results: {directory / summary['results']}\nSummary: {directory / 'summary.json'}\nPlots:   "
        + "\n         ".join(str(directory / p) for p in summary["plots"]))  # fmt: skip
    summary["z"] = z
    return summary
