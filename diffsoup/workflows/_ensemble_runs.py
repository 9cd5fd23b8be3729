"""``diffsoup simulate --samples N``: a study file simulated at N parameter draws, streamed into Zarr.

The draws come from the study's parameter table (its estimated parameters, uniform on their
scales within their bounds: Latin hypercube or Sobol' points, fixed by a seed); the study's
observables at every draw are an ensemble (``ds.distributed.ensemble``) written chunk by chunk to
``<out>/simulation.zarr`` (format ``diffsoup.ensemble/1``, readable with ``xarray.open_zarr``). The
same command run again after a crash or an ended allocation computes only the chunks not yet in
the store. ``<out>/summary.json`` says what was written.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from .._deprecated import renamed_keyword
from ._output_folder import check_output_folder
from ._study_runs import _describe, _relative, _study_file

SUMMARY_FORMAT = "diffsoup.summary/1"
SAMPLERS = ("lhs", "sobol")


def simulate_samples(study: Any, out: Any, *, samples: int, sampler: str = "lhs", seed: int = 0, client: Any = None,
                     draws_per_chunk: int | None = None, resume: bool = True, progress: bool = True,
                     log: Callable = print, chunk_size: int | None = None) -> dict:  # fmt: skip
    """Simulate a study file at ``samples`` draws from its parameter table into ``<out>/simulation.zarr``.

    Args:
        study: the study file (a path or a loaded ``StudyFile``).
        out: the output directory (created).
        samples: how many parameter draws (``"sobol"``: a power of 2).
        sampler: ``"lhs"`` (Latin hypercube) or ``"sobol"`` (scrambled Sobol' points).
        seed: fixes the draws (a rerun with the same seed resumes the same store).
        client: a ``distributed.Client`` to compute on (its GPU workers when they offer
            ``diffsoup.ensemble.resources``), or None for this process (Dask's threads).
        draws_per_chunk: parameter draws per chunk, each simulated once per experiment (None:
            ``diffsoup.ensemble.chunk-size`` simulations' worth).
        resume: finish the store of an earlier run of the same command; False replaces it.
        progress: a progress bar of the chunks on stderr.
        log: where progress lines go.
        chunk_size: the deprecated name of ``draws_per_chunk`` (warns).

    Returns:
        The summary (also in ``<out>/summary.json``; its paths are relative to ``out``).

    Raises:
        ValueError: for a bad ``samples``/``sampler`` (Sobol' needs a power of 2), or a store at
            ``<out>/simulation.zarr`` written for other draws (then pass ``resume=False``).
    """
    from ..distributed import ensemble, sample
    from ..store import write_summary

    draws_per_chunk = renamed_keyword("simulate_samples", "chunk_size", chunk_size, "draws_per_chunk",
                                      draws_per_chunk)  # fmt: skip
    if sampler not in SAMPLERS:
        raise ValueError(f"simulate: sampler={sampler!r} must be one of {SAMPLERS}.")
    sf = _study_file(study)
    out = check_output_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    draws = sample(sf.study, samples, method=sampler, seed=seed)
    if client is not None and not client.scheduler_info(n_workers=-1)["workers"]:
        # ensemble() pins the chunks to GPU workers when it sees one: wait for the first (SLURM
        # workers come from the batch queue).
        log("[diffsoup] waiting for the first Dask worker ...")
        client.wait_for_workers(1)
    names = {tuple(v) for v in sf.observables.values()}
    k = sf.study.n_observables
    output_names = next(iter(names)) if len(names) == 1 and len(next(iter(names))) == k else None
    ens = ensemble(sf.study, params=draws, solver=sf.solver, draws_per_chunk=draws_per_chunk, output_names=output_names,
                   client=client)  # fmt: skip
    path = out / "simulation.zarr"
    where = _describe(client) if client is not None else "in this process"
    log(f"[diffsoup] simulating {sf.name} at {samples} draws ({sampler}, seed {seed}) of "
        f"{len(ens.parameter_names)} parameters: {samples * len(sf.study.experiments)} simulations in "
        f"{ens.layout.n_chunks} chunk(s) of {ens.draws_per_chunk} draws, {where} -> {path}")  # fmt: skip
    t0 = time.perf_counter()
    try:
        written = ens.to_zarr(path, resume=resume, overwrite=not resume, client=client, progress=progress)
    except ValueError as exc:
        if "holds another ensemble" not in str(exc):
            raise
        raise ValueError(f"{exc} (From the command: --restart replaces it, or choose another --out.)") from None
    seconds = time.perf_counter() - t0
    resumed = written.chunks - written.written  # complete now: the others were there before
    log(f"[diffsoup] {written.written} chunks written in {seconds:.1f} s"
        + (f" ({resumed} were already in the store)" if resumed else "")
        + f"; status of the simulations: {', '.join(f'{k_}: {v}' for k_, v in written.status.items())}")  # fmt: skip
    summary = {
        "format": SUMMARY_FORMAT, "command": "simulate", "study": sf.name, "study_file": _relative(sf.path, out),
        "experiments": len(sf.study.experiments), "samples": int(samples), "sampler": sampler, "seed": int(seed),
        "parameters": list(ens.parameter_names), "chunks": written.chunks, "chunks_written": written.written,
        "chunks_resumed": resumed, "complete": written.complete, "run": written.run,
        "seconds": round(seconds, 3), "simulation_status": written.status, "where": where,
        "results": _relative(path, out), "plots": [],
    }  # fmt: skip
    write_summary(out / "summary.json", summary)
    return summary
