"""Profile likelihoods of a fitted study file (``diffsoup profile``): ``ds.inference.profile`` from
the optimum of a fit's result store, each parameter's profile a task of a resumable campaign.

Output directory layout::

    <out>/intervals.tsv        one row per parameter: estimate and confidence interval, scaled
                               (the optimizer's coordinates) and linear, open sides and why
    <out>/profiles.json        every profile's points (ProfileResult.to_json; from_json reads it)
    <out>/profile-ledger.json  the campaign's JSON ledger (a rerun computes only what is missing)
    <out>/summary.json         the intervals, the optimum, the campaign's counts, the paths
    <out>/plots/profiles.png   each profile against the chi-square threshold

The paths in ``summary.json`` are relative to ``<out>``.
"""

from __future__ import annotations

import csv
import json
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ._output_folder import check_output_folder
from ._study_runs import SUMMARY_FORMAT, StudyLowering, _describe, _relative, _study_file, study_digest

LEDGER = "profile-ledger.json"
INTERVAL_COLUMNS = ("parameter", "scale", "estimate", "lower", "upper", "estimate_linear", "lower_linear",
                    "upper_linear", "lower_open", "upper_open", "lower_reason", "upper_reason", "evaluations",
                    "seconds")  # fmt: skip


def fit_store_of(from_fit: Any) -> Path:
    """The result store of ``--from-fit``: a fit's output directory (its ``results.zarr``) or the
    store itself.

    Raises:
        FileNotFoundError: naming the path, when there is no such directory or store.
    """
    path = Path(from_fit)
    if (path / "results.zarr").exists():
        return path / "results.zarr"
    if not path.exists():
        raise FileNotFoundError(f"--from-fit: {from_fit} not found; give the output directory of 'diffsoup fit' or "
                                "'diffsoup campaign' (or its results.zarr)")  # fmt: skip
    return path


def _fit_optimum(store: Path, theta_names: Sequence[str]) -> tuple[np.ndarray, float]:
    """The best point (scaled) and objective held by a fit's result store, checked against the
    lowered study's theta names.

    Raises:
        ValueError: for what is not a fit's store, or a fit of other parameters.
    """
    from ..store import read_fit

    try:
        fit = read_fit(store)
    except Exception as exc:  # noqa: BLE001 (zarr's errors for what is not a store vary by version)
        raise ValueError(f"--from-fit: {store} is not a diffsoup fit's result store ({type(exc).__name__}: {exc}); give "
                         "the output directory of a fit or campaign") from None  # fmt: skip
    if "theta" not in fit:
        raise ValueError(f"--from-fit: {store} holds a simulation, not a fit; give the output directory of a fit or "
                         "campaign")  # fmt: skip
    names = list(fit["attrs"].get("theta_names", []))
    if names != list(theta_names):
        raise ValueError(f"--from-fit: {store} is a fit of the parameters {names}, but the study estimates "
                         f"{list(theta_names)}; give the fit of this study file")  # fmt: skip
    return np.asarray(fit["theta"], dtype=np.float64), float(fit["attrs"]["objective"])


def _write_intervals(rows: list[dict], path: Path) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=INTERVAL_COLUMNS, delimiter="\t", lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (repr(float(v)) if isinstance(v, float) else v) for k, v in row.items()})
    return path


def _resumed(ledger: Path, task_ids: set[str], began: datetime) -> int:
    """Profiles accepted by an earlier run of the campaign (finished before this one began)."""
    records = json.loads(ledger.read_text()).get("tasks", {})
    return sum(1 for task_id, r in records.items()
               if task_id in task_ids and r.get("state") == "accepted" and r.get("finished")
               and datetime.fromisoformat(r["finished"]) < began)  # fmt: skip


def profile_study(study: Any, out: Any, *, from_fit: Any, parameters: Sequence[str] | None = None,
                  confidence: float = 0.95, simultaneous: bool = False, method: str = "fides",
                  max_steps: int | None = None, hierarchical: bool | Sequence[str] | None = None,
                  client: Any = None, resume: bool = True, on_conflict: str = "error", progress: bool = True, plots: bool = True, log: Callable = print,
                  no_worker_timeout: float | None = None) -> dict:  # fmt: skip
    """Profile likelihoods of a fitted study file and their confidence intervals.

    The optimum is the best point of the fit's result store (``from_fit``); its objective is
    evaluated anew on the study file as it is now. Each parameter's profile
    (``ds.inference.profile``) is a task of a ``checkpointed_map`` campaign with the ledger
    ``<out>/profile-ledger.json``: run here one after another (``client=None``), or each on a Dask
    worker offering ``GPU=1`` (each worker lowers the study file once). A rerun keeps the profiles
    already finished and computes the rest.

    Args:
        study: the study file (a path or a loaded ``StudyFile``), or a PEtab problem's YAML file.
        out: the output directory (created).
        from_fit: the output directory of ``diffsoup fit`` / ``campaign``, or its ``results.zarr``.
        parameters: theta names to profile (None: every estimated parameter).
        confidence: of the intervals.
        simultaneous: intervals of the joint confidence region (``n_theta`` degrees of freedom).
        method: the re-optimization at each profile point (``fides``, ``trf`` or ``lbfgsb``).
        max_steps: most profile points per direction (None: ``ProfileOptions``' default).
        hierarchical: offsets, scaling factors and noise levels optimized analytically at each profile point
            (True, False or their names; None: the file's ``[fit] hierarchical``, as the fit, and
            none where the file does not say).
        client: a ``distributed.Client``, or None to run here.
        resume, on_conflict: as for ``checkpointed_map``.
        progress: a progress bar over the profiles on stderr.
        plots: write ``<out>/plots/profiles.png``.
        log: where progress lines go.
        no_worker_timeout: as for :func:`~diffsoup.workflows.campaign_study`.

    Returns:
        The summary (also in ``<out>/summary.json``; its paths are relative to ``out``).

    Raises:
        FileNotFoundError, ValueError: for a ``from_fit`` that is not a fit of this study file,
            an unknown parameter or a bad option (each names what to change).
        RuntimeError: when every profile failed (the ledger holds the errors).
    """
    from ..distributed._profile_runs import profile
    from ..inference import ProfileOptions
    from ..inference.fitting._fit import optimizer_of
    from ..store import write_summary, write_text_durably

    sf = _study_file(study)
    out = check_output_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    lowered = sf.lower()  # compiles nothing until evaluated
    names = tuple(lowered.problem.theta_names)
    store = fit_store_of(from_fit)
    theta, fit_objective = _fit_optimum(store, names)
    if hierarchical is None:  # the file's; where it does not say, profiles optimize every parameter (ProfileOptions')
        hierarchical = sf.fit["hierarchical"] if sf.fit["hierarchical"] is not None else False
    options = ProfileOptions(confidence=float(confidence), simultaneous=bool(simultaneous), optimizer=optimizer_of(method),
                             hierarchical=hierarchical)  # fmt: skip
    hierarchical = options.hierarchical if isinstance(options.hierarchical, bool) else list(options.hierarchical)
    if max_steps is not None:
        options = replace(options, max_steps=int(max_steps))
    chosen = list(parameters) if parameters else list(names[: getattr(lowered.problem, "n_parameters", len(names))])
    unknown = [p for p in chosen if p not in names]
    if unknown:
        raise ValueError(f"--parameters: {unknown} are not estimated parameters of {sf.name}; its estimated parameters: "
                         f"{', '.join(names)}")  # fmt: skip
    ledger = out / LEDGER
    where = _describe(client) if client is not None else "in this process"
    log(f"[diffsoup] profiling {sf.name}: {len(chosen)} parameter{'' if len(chosen) == 1 else 's'} "
        f"({', '.join(chosen[:6])}{', ...' if len(chosen) > 6 else ''}), {options.confidence:g} confidence, "
        f"re-optimized by {method}{', hierarchical' if hierarchical else ''}, from {store}; ledger {ledger}, "
        f"{where}")  # fmt: skip
    began = datetime.now(timezone.utc)
    t0 = time.perf_counter()
    campaign: dict[str, Any] = dict(ledger_path=ledger, resume=resume, on_conflict=on_conflict, progress=progress)
    if client is None:
        target: Any = lowered
    else:
        target = StudyLowering(str(sf.path.resolve()), study_digest(sf))
        campaign.update(execution="dask", client=client, no_worker_timeout=no_worker_timeout)
    # The optimum's objective is evaluated here (the study file may have changed since the fit).
    result = profile(target, theta, parameters=chosen, options=options, **campaign)
    seconds = time.perf_counter() - t0
    if abs(result.objective - fit_objective) > 1e-6 * max(1.0, abs(fit_objective)):
        log(f"[diffsoup] note: the objective at the fit's optimum is {result.objective:.10g} now, {fit_objective:.10g} "
            "in the fit's store (the study file or the solver settings changed since the fit)")  # fmt: skip
    for name, error in result.failures.items():
        log(f"[diffsoup] warning: the profile of {name} failed: {error}")
    if not result.profiles:
        raise RuntimeError(f"profile: every profile failed; see {ledger} (first: {next(iter(result.failures.values()), 'none')}).")
    better = result.better
    if better is not None:
        log(f"[diffsoup] warning: a profile point reached objective {better[0]:.10g}, below the fit's "
            f"{result.objective:.10g}: the fit had not found the optimum; fit again (more starts) and profile that fit")  # fmt: skip
    rows = result.table()
    intervals = _write_intervals(rows, out / "intervals.tsv")
    data = out / "profiles.json"
    write_text_durably(data, json.dumps(result.to_json()) + "\n")
    pictures = []
    if plots:
        from ..plots import plot_profiles

        pictures.append(plot_profiles(result, out / "plots" / "profiles.png",
                                      title=f"{sf.name}: profiles ({options.confidence:g} confidence)"))  # fmt: skip
    task_ids = {f"profile:{n}" for n in chosen}
    summary = {
        "format": SUMMARY_FORMAT, "command": "profile", "study": sf.name, "study_file": _relative(sf.path, out),
        "from_fit": _relative(store, out), "objective": float(result.objective), "fit_objective": fit_objective,
        "confidence": float(result.confidence), "simultaneous": bool(simultaneous), "delta": float(result.delta),
        "method": method, "hierarchical": hierarchical,
        "intervals": {r["parameter"]: r for r in rows}, "failures": dict(result.failures),
        "better_optimum": None if better is None else float(better[0]),
        "evaluations": int(sum(p.n_evaluations for p in result.profiles.values())), "seconds": round(seconds, 3),
        "where": where if client is not None else "in-process",
        "campaign": {"ledger": _relative(ledger, out), "tasks": len(chosen), "accepted": len(result.profiles),
                     "failed": len(result.failures), "resumed": _resumed(ledger, task_ids, began)},
        "intervals_table": _relative(intervals, out), "profiles": _relative(data, out),
        "plots": [_relative(p, out) for p in pictures],
    }  # fmt: skip
    write_summary(out / "summary.json", summary)
    return summary


def format_intervals(summary: dict) -> str:
    """The intervals of a profile summary as a table (scaled and linear; ``open`` where the profile
    did not cross the threshold on that side)."""
    lines = [f"{'parameter':<24} {'scale':<6} {'estimate':>11} {'lower':>11} {'upper':>11}   "
             f"{'linear: estimate':>16} {'lower':>11} {'upper':>11}"]  # fmt: skip
    for name, r in summary["intervals"].items():
        lo = f"{r['lower']:.5g}" + ("*" if r["lower_open"] else "")
        hi = f"{r['upper']:.5g}" + ("*" if r["upper_open"] else "")
        lines.append(f"{name:<24} {r['scale']:<6} {r['estimate']:>11.5g} {lo:>11} {hi:>11}   "
                     f"{r['estimate_linear']:>16.5g} {r['lower_linear']:>11.5g} {r['upper_linear']:>11.5g}")  # fmt: skip
    if any(r["lower_open"] or r["upper_open"] for r in summary["intervals"].values()):
        lines.append("* open: the profile did not cross the threshold on that side (a bound, or max steps ran out: "
                     "see intervals.tsv's reasons)")  # fmt: skip
    return "\n".join(lines)
