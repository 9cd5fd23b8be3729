"""Fit, campaign and simulation of a study file, with results, summary and plots.

Output directory layout (each command writes its own files; reruns replace them)::

    <out>/results.zarr       fit / campaign: the best fit (diffsoup.store.write_fit)
    <out>/simulation.zarr    simulate: trajectories at the measurement times (write_simulation)
    <out>/simulation.tsv     a PEtab problem (fit / campaign / simulate): the PEtab simulation table
    <out>/summary.json       a short summary: objective, estimates, standard errors, starts, status
    <out>/campaign.json      campaign: the JSON ledger of the starts (a rerun resumes from it)
    <out>/plots/fits.png     each experiment's model against its data
    <out>/plots/waterfall.png, <out>/plots/estimates.png   fit / campaign

The paths in ``summary.json`` are relative to ``<out>``, so the directory can move as a whole. A
study whose every experiment fails to solve raises :class:`StudyFailedError` (after writing what
it can), naming the statuses and what to change in the study file.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ._auto_method import choose_method, default_backend, file_method
from ._honest_answers import check_tolerance, honest_entries
from ._output_folder import check_output_folder
from ..integrate import Status

SUMMARY_FORMAT = "diffsoup.summary/1"
CURVE_POINTS = 120


def _study_file(study: Any):
    from ..formats import StudyFile, load_study

    return study if isinstance(study, StudyFile) else load_study(study)


def study_digest(study: Any) -> str:
    """A SHA-256 (16 hex digits) of a study file and the data files it reads: the campaign's items
    carry it, so a ledger written for another version of the study is not resumed silently."""
    sf = _study_file(study)
    h = hashlib.sha256(sf.path.read_bytes())
    for data in sf.data_files:
        h.update(str(data.relative_to(sf.path.parent.resolve(), walk_up=True)).encode() + b"\0" + data.read_bytes())
    return h.hexdigest()[:16]


class StudyLowering:
    """A picklable factory of a study file's lowered study, for campaign tasks (the starts of
    ``diffsoup campaign``, the profiles of ``diffsoup profile``) on Dask workers: each worker
    process lowers the file once and keeps it in its cache of lowered studies under
    :attr:`fingerprint`, which names the file's path and its digest, so another version of the
    file does not share that lowered study."""

    def __init__(self, study_path: str, digest: str):
        self.study_path, self.digest = study_path, digest

    @property
    def fingerprint(self) -> str:
        """What the workers' cache of lowered studies knows this study by."""
        return "study-file:" + hashlib.sha256(f"{self.study_path}\0{self.digest}".encode()).hexdigest()[:16]

    def __call__(self):
        return _study_file(self.study_path).lower()

    def __repr__(self) -> str:
        return f"StudyLowering({self.study_path!r}, {self.digest!r})"


def _status_counts(predictions: Mapping[str, dict]) -> dict[str, int]:
    return dict(Counter(Status(int(p["status"])).name for p in predictions.values()))


class StudyFailedError(RuntimeError):
    """Every experiment of a study failed to solve (a ``ds.Status`` other than SUCCESS), so there
    is nothing to fit or show; the message names the statuses and the remedy.

    Attributes:
        status: status name -> number of experiments.
        summary: the summary written to ``<out>/summary.json`` (None when nothing was written).
    """

    def __init__(self, message: str, status: Mapping[str, int], summary: dict | None = None):
        super().__init__(message)
        self.status, self.summary = dict(status), summary


# What to change in the study file, by status (the Status messages speak of keyword arguments).
_REMEDIES = {
    "MAX_STEPS": "raise [solver] max_steps (now {max_steps}) or loosen rtol/atol",
    "STEP_TOO_SMALL": "loosen [solver] rtol/atol (now {rtol:g}/{atol:g}) or check the model where it fails",
    "NONFINITE_STATE": "the solution blows up: check the model, y0 and the parameter values and bounds",
    "LINEAR_SOLVE_FAILED": 'W = I/(h gamma) - J is singular or float32 refinement stalled: set [model] precision = '
                           '"fp64" or check the model\'s Jacobian',
}  # fmt: skip


def failure_report(sf: Any, status: Mapping[str, int], where: str = "") -> str | None:
    """One line on the experiments that failed (``status``: name -> count), with the remedy for
    each status; None when every experiment succeeded."""
    failed = {k: v for k, v in status.items() if k != "SUCCESS"}
    if not failed:
        return None
    n, bad = sum(status.values()), sum(failed.values())
    head = f"all {n} experiments failed{where}" if bad == n else f"{bad} of {n} experiments failed{where}"
    options = {"max_steps": sf.solver.max_steps, "rtol": sf.solver.rtol, "atol": sf.solver.atol}
    remedies = "; ".join(_REMEDIES.get(k, "see ds.Status").format(**options) for k in failed)
    names = ", ".join(k if len(failed) == 1 else f"{k} ({v})" for k, v in failed.items())
    return f"{head}: {names} -- {remedies} (in {sf.path})"


def _check_status(sf: Any, status: Mapping[str, int], where: str, log: Callable, summary: dict | None) -> None:
    """Raise :class:`StudyFailedError` when every experiment failed; log a line when some did."""
    report = failure_report(sf, status, where)
    if report is None:
        return
    if status.get("SUCCESS", 0) == 0:
        raise StudyFailedError(report, status, summary)
    log(f"[diffsoup] warning: {report}")


def _explain_failed_fit(sf: Any, exc: RuntimeError, *, solve_failures: bool = False) -> None:
    """A fit whose every start failed: when every experiment also fails at the nominal values
    (a solver setting, not the starts, is at fault), raise :class:`StudyFailedError` naming
    the statuses; otherwise return (the caller re-raises ``exc``)."""
    if not (solve_failures or str(exc).startswith("fit: every start failed")):  # FitResult.from_starts
        return
    from ..inference import InferenceProblem

    problem = InferenceProblem(sf.study, objective=sf.fit["objective"], solver=sf.solver)
    status = _status_counts(problem.predict(problem.nominal))
    if status.get("SUCCESS", 0) == 0:
        raise StudyFailedError(f"{str(exc).rstrip('.')}: {failure_report(sf, status, ' at the nominal values')}",
                               status) from exc  # fmt: skip


def _relative(path: Path, out: Path) -> str:
    """``path`` relative to the output directory (summary.json moves with its directory)."""
    return os.path.relpath(Path(path).resolve(), Path(out).resolve())


def _finish_fit(sf: Any, lowered: Any, result: Any, out: Path, *, command: str, plots: bool, log: Callable,
                extra: Mapping[str, Any], at_best_tolerance: float | None = None) -> dict:  # fmt: skip
    """Write the fit's store, plots and summary; return the summary."""
    from ..store import write_fit, write_summary

    prob = lowered.problem
    honest = honest_entries(lowered, result, at_best_tolerance)
    for line in honest.pop("advice"):
        log(f"[diffsoup] warning: {line}")
    if result.analytic:
        log(f"[diffsoup] optimized analytically at each evaluation: {', '.join(result.analytic)}")
    log(f"[diffsoup] writing results to {out} ...")
    out.mkdir(parents=True, exist_ok=True)
    predictions = prob.predict(result.theta, points=CURVE_POINTS)
    store = write_fit(result, out / "results.zarr", lowered, overwrite=True, observables=sf.observables,
                      predictions=predictions)  # fmt: skip
    extra = dict(extra, **_petab_table(sf, predictions, out))
    pictures = []
    if plots:
        from ..plots import plot_estimates, plot_fits, plot_waterfall

        pictures.append(plot_fits(sf.study, predictions, out / "plots" / "fits.png", observables=sf.observables,
                                  title=f"{sf.name}: model (lines) against data (dots)"))  # fmt: skip
        pictures.append(plot_waterfall([s.objective for s in result.starts], out / "plots" / "waterfall.png",
                                       title=f"{sf.name}: multistart waterfall"))  # fmt: skip
        k = getattr(prob, "n_parameters", len(result.theta_names))
        names = list(result.theta_names[:k])
        pictures.append(plot_estimates(
            names, result.theta[:k], [result.standard_errors[n] for n in names], out / "plots" / "estimates.png",
            lower=np.asarray(lowered.lower)[:k], upper=np.asarray(lowered.upper)[:k],
            scale_label="estimate in the optimizer's coordinates (log10 for log10-scaled parameters)",
            title=f"{sf.name}: estimates (grey: bounds)"))  # fmt: skip
    failures: Counter = Counter()
    for s in result.starts:
        for eid, name, count in s.failures:
            failures[f"{eid}:{name}"] += count
    summary = {
        "format": SUMMARY_FORMAT, "command": command, "study": sf.name, "study_file": _relative(sf.path, out),
        "experiments": len(sf.study.experiments), "objective": float(result.objective),
        "parameters": {k: float(v) for k, v in result.parameters.items()},
        "standard_errors": {k: None if k in honest["standard_errors_withheld"] else float(result.standard_errors[k])
                            for k in result.parameters},
        "scales": {p.name: p.scale for p in sf.study.parameters},
        "method": result.method, **honest,
        "analytic": list(result.analytic),
        "evaluations": int(result.n_evaluations), "seconds": round(float(result.seconds), 3),
        "experiment_status": _status_counts(predictions), "failed_solves_during_fit": dict(failures),
        "results": _relative(store, out), "plots": [_relative(p, out) for p in pictures], **extra,
    }  # fmt: skip
    write_summary(out / "summary.json", summary)
    _check_status(sf, summary["experiment_status"], " at the estimate", log, summary)
    return summary


def fit_study(study: Any, out: Any, *, client: Any = None, method: str | None = None, starts: int | None = None,
              seed: int | None = None, max_nfev: int | None = None, hessian: str | None = None,
              hierarchical: bool | Sequence[str] | None = None, progress: bool = True, plots: bool = True,
              log: Callable = print, at_best_tolerance: float | None = None) -> dict:  # fmt: skip
    """Fit a study file: multistart, the study lowered over the workers of ``client`` (by
    ``ds.distributed.run``: each worker holds a shard of the experiments) or, with
    ``client=None``, in this process. With method ``"batched"`` and a client, the starts go to the
    workers instead, in blocks (``ds.inference.multistart(method="batched", execution="dask")``:
    each worker lowers the whole study and runs its blocks' starts as lanes), and the best distinct
    optima are polished here.

    Args:
        study: the study file (a path or a loaded ``StudyFile``).
        out: the output directory (created).
        client: a ``distributed.Client``, or None to fit here.
        method, starts, seed, max_nfev, hessian, hierarchical: override the file's ``[fit]`` settings
            (``hessian``: fides' Hessian, ``ds.inference.Fides(hessian=...)``, with method fides only;
            ``hierarchical``: as for ``ds.inference.fit``, True or the parameters' names). Method
            ``"auto"`` (the default where the file's ``[fit]`` names none) is ``"batched"`` where
            the default JAX backend is a GPU and there are at least 16 starts, else ``"fides"``
            (:mod:`._auto_method`); the log and the summary's ``method_auto`` say why.
        progress: progress bars on stderr.
        plots: write the PNG plots.
        log: where progress lines go.
        at_best_tolerance: starts within this of the best objective count as "at the best"
            (default ``ds.inference`` 's 1e-3, PEtab benchmarks' criterion).

    Returns:
        The summary (also written to ``<out>/summary.json``; its paths are relative to ``out``):
        see :func:`honest_entries` for its ``starts``, ``at_bound`` and ``nominal_objective``.

    Raises:
        StudyFailedError: when every experiment fails to solve (at every start and at the
            nominal values, or at the estimate), naming the statuses and the remedy.
    """
    from ..inference import fit

    sf = _study_file(study)
    check_tolerance(at_best_tolerance)
    out = check_output_folder(out)  # created when the results are written: a stopped fit leaves no empty folder
    settings = _settings(sf, method, starts, seed, max_nfev, hessian, hierarchical, client=client)
    log(f"[diffsoup] fitting {sf.name}: {len(sf.study.experiments)} experiments, "
        f"{sum(p.estimate for p in sf.study.parameters)} estimated parameters, {settings['starts']} starts "
        f"({_method_label(settings)}), {'on ' + _describe(client) if client is not None else 'in this process'}")  # fmt: skip
    extra: dict[str, Any] = {"where": _describe(client) if client is not None else "in-process", **_fit_entries(settings)}
    start = time.perf_counter()
    fit_options = dict(method=_optimizer(settings), starts=settings["starts"], seed=settings["seed"],
                       max_nfev=settings["max_nfev"], hierarchical=settings["hierarchical"],
                       progress=progress)  # fmt: skip
    if client is None:
        lowered = sf.lower()
        result = _fit_or_explain(sf, fit, lowered, fit_options)
        return _finish_fit(sf, lowered, result, out, command="fit", plots=plots, log=log, extra=extra,
                           at_best_tolerance=at_best_tolerance)
    from ..distributed import run
    from ..distributed._dashboard import dashboard_line, dashboard_url
    from ..distributed._compile_forwarding import forward_compile_progress

    forward_compile_progress(client)  # the workers' compilations are shown while the bar waits for them
    if settings["method"] == "batched":  # blocks of starts on the workers, each lowering the whole study
        if dashboard_url(client):
            log(f"[diffsoup] {dashboard_line(client)}")  # the Dask dashboard and diffsoup's page
            extra["dashboard"] = dashboard_url(client)
        lowered, result = _fit_blocks(sf, client, fit_options)
        extra["wall_seconds"] = round(time.perf_counter() - start, 3)
        return _finish_fit(sf, lowered, result, out, command="fit", plots=plots, log=log, extra=extra,
                           at_best_tolerance=at_best_tolerance)
    with run(sf.study, cluster=client, objective=sf.fit["objective"], solver=sf.solver) as lowered:
        if getattr(lowered, "dashboard", None):
            log(f"[diffsoup] {dashboard_line(lowered.client)}")  # the Dask dashboard and diffsoup's page
            extra["dashboard"] = lowered.dashboard
        result = _fit_or_explain(sf, fit, lowered, fit_options)
        extra["wall_seconds"] = round(time.perf_counter() - start, 3)
        return _finish_fit(sf, lowered, result, out, command="fit", plots=plots, log=log, extra=extra,
                           at_best_tolerance=at_best_tolerance)


def _fit_blocks(sf: Any, client: Any, options: Mapping[str, Any]) -> tuple[Any, Any]:
    """The batched fit as blocks of starts on the workers of ``client`` (a throw-away ledger):
    ``(the lowered study here, the FitResult)``."""
    from ..distributed._start_runs import fit_of, plan_starts, run_starts

    t0 = time.perf_counter()
    # Blocks of starts sized for the workers' device (1,024 lanes on a GPU), not this process's.
    plan = plan_starts(StudyLowering(str(sf.path.resolve()), study_digest(sf)), starts=options["starts"],
                       seed=options["seed"], method=options["method"], max_nfev=options["max_nfev"],
                       resample_failed_starts=10, hierarchical=options["hierarchical"],
                       platform=default_backend(client))  # fmt: skip
    campaign = run_starts(plan, None, execution="dask", client=client, progress=options["progress"])
    try:
        return plan.lowered, fit_of(plan, campaign, seconds=time.perf_counter() - t0)
    except RuntimeError as exc:
        _explain_failed_fit(sf, exc, solve_failures=True)
        raise


def _fit_or_explain(sf: Any, fit: Callable, lowered: Any, options: Mapping[str, Any]):
    try:
        return fit(lowered, **options)
    except RuntimeError as exc:
        _explain_failed_fit(sf, exc)
        raise


def _settings(sf: Any, method, starts, seed, max_nfev, hessian=None, hierarchical=None, *, client: Any = None) -> dict:
    """The resolved ``[fit]`` settings: the file's, overridden by the arguments given; method
    ``"auto"`` (the default where the file names none) resolved to a method, and ``"auto"`` the
    reason (None where the method was named). ``client``: where the fit runs (its workers' JAX
    backend decides ``auto``; None: this process's)."""
    from ..inference.fitting._fit import METHODS

    s = dict(sf.fit)
    for key, value in (("method", method), ("starts", starts), ("seed", seed), ("max_nfev", max_nfev),
                       ("hessian", hessian), ("hierarchical", hierarchical)):  # fmt: skip
        if value is not None:
            s[key] = value
    if method is None:
        s["method"] = file_method(sf) or "auto"
    s["auto"] = None
    if s["method"] == "auto":
        if hessian is not None:  # a fides Hessian asked for: fides
            s["method"], s["auto"] = "fides", f"--hessian {hessian} is fides' option"
        else:
            s["method"], s["auto"] = choose_method(int(s["starts"]), default_backend(client))
    if s["method"] not in METHODS:
        raise ValueError(f"method={s['method']!r} must be one of {METHODS + ('auto',)}.")
    h = s["hierarchical"]  # kept as JSON writes it: the summary and the campaign's ledger hold it
    s["hierarchical"] = h if h is None or isinstance(h, bool) else [h] if isinstance(h, str) else list(h)
    if hessian is not None and s["method"] != "fides":
        if method is None:  # the method is the file's: the file and the override disagree
            from ..formats import StudyFileError

            raise StudyFileError(f"is {s['method']!r}, and a fides Hessian (hessian={hessian!r}, --hessian) applies to "
                                 "method 'fides' only: choose method 'fides' as well (--method fides) or leave the "
                                 "Hessian out.", path=sf.path, field="fit.method")  # fmt: skip
        raise ValueError(f"hessian={hessian!r} applies to method 'fides' only (method is {s['method']!r}).")
    if s["starts"] < 1:
        raise ValueError(f"starts={s['starts']} must be at least 1.")
    return s


def _optimizer(settings: Mapping[str, Any]) -> Any:
    """What ``fit(method=...)`` gets: ``Fides(hessian=...)`` for fides, else the method's name."""
    from ..inference import Fides

    return Fides(hessian=settings["hessian"]) if settings["method"] == "fides" else settings["method"]


def _method_label(settings: Mapping[str, Any]) -> str:
    label = f"fides, {settings['hessian']} Hessian" if settings["method"] == "fides" else settings["method"]
    label += ", hierarchical" if settings["hierarchical"] else ""
    return label + (f"; --method auto chose {settings['method']}: {settings['auto']}" if settings.get("auto") else "")


def _fit_entries(settings: Mapping[str, Any]) -> dict:
    """The summary's ``hessian`` (fides' Hessian; not there for the other methods) and
    ``hierarchical`` (false, true, the names, or null: ``fit``'s default, the noise levels) entries."""
    return {**({"hessian": settings["hessian"]} if settings["method"] == "fides" else {}),
            "hierarchical": settings["hierarchical"],
            **({"method_auto": settings["auto"]} if settings.get("auto") else {})}  # fmt: skip


def _describe(client: Any) -> str:
    try:
        workers = client.scheduler_info(n_workers=-1)["workers"]
        return f"Dask scheduler {client.scheduler.address} ({len(workers)} worker{'' if len(workers) == 1 else 's'} now)"
    except Exception:  # noqa: BLE001 (a description must not fail)
        return "a Dask cluster"


# --------------------------------------------------------------------------------------------
# Simulation
# --------------------------------------------------------------------------------------------


def simulate_study(study: Any, out: Any, *, parameters: Mapping[str, float] | None = None, from_fit: Any = None,
                   plots: bool = True, log: Callable = print) -> dict:  # fmt: skip
    """Simulate every experiment of a study file at the nominal parameter values, the estimates of
    a fit store (``from_fit``), and/or explicit ``parameters`` (linear values by name, applied last);
    write ``<out>/simulation.zarr``, ``<out>/summary.json`` and ``<out>/plots/fits.png``.

    Raises:
        ValueError: for a name in ``parameters`` that is not a study parameter, or a ``from_fit``
            that is not a result store.
        FileNotFoundError: for a ``from_fit`` store that does not exist.
        StudyFailedError: when every experiment failed to solve (after writing the outputs).
    """
    from ..inference import InferenceProblem
    from ..store import write_simulation, write_summary

    sf = _study_file(study)
    out = check_output_folder(out)  # created when the results are written
    values: dict[str, float] = {}
    if from_fit is not None:
        values.update(_fit_parameters(from_fit))
    values.update(parameters or {})
    known = {e.name for e in sf.study.entries} | {p.name for p in sf.study.parameters}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"simulate: {unknown} are not parameters of {sf.name}; its parameters: {sorted(known)}.")
    problem = InferenceProblem(sf.study, objective=sf.fit["objective"], solver=sf.solver, values=values or None)
    log(f"[diffsoup] simulating {len(sf.study.experiments)} experiments of {sf.name} ...")
    t0 = time.perf_counter()
    predictions = problem.predict(problem.nominal, points=CURVE_POINTS)
    seconds = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    used = {e.name: float(v) for e, v in zip(sf.study.entries, problem.values)}
    store = write_simulation(out / "simulation.zarr", sf.study, predictions, used, observables=sf.observables,
                             overwrite=True)  # fmt: skip
    tables = _petab_table(sf, predictions, out)
    pictures = []
    if plots:
        from ..plots import plot_fits

        pictures.append(plot_fits(sf.study, predictions, out / "plots" / "fits.png", observables=sf.observables,
                                  title=f"{sf.name}: simulation (lines) and data (dots)"))  # fmt: skip
    summary = {
        "format": SUMMARY_FORMAT, "command": "simulate", "study": sf.name, "study_file": _relative(sf.path, out),
        "experiments": len(sf.study.experiments), "parameters": used, "seconds": round(seconds, 3),
        "experiment_status": _status_counts(predictions), "results": _relative(store, out),
        "plots": [_relative(p, out) for p in pictures], **tables,
    }  # fmt: skip
    write_summary(out / "summary.json", summary)
    _check_status(sf, summary["experiment_status"], "", log, summary)
    return summary


def _petab_table(sf: Any, predictions: Mapping[str, dict], out: Path) -> dict:
    """A PEtab problem's simulation table ``<out>/simulation.tsv`` (the measurement table with the
    simulated values); the summary's entry for it (nothing for a study file)."""
    if getattr(sf, "petab", None) is None:
        return {}
    path = sf.petab.write_simulation_table(out / "simulation.tsv", predictions=predictions)
    return {"petab_simulation_table": _relative(path, out)}


def _fit_parameters(store: Any) -> dict[str, float]:
    """The estimates held by a fit's (or a simulation's) result store.

    Raises:
        FileNotFoundError: naming the path, when there is nothing there.
        ValueError: naming the path, when it is not a diffsoup result store.
    """
    from ..store import read_fit

    path = Path(store)
    if not path.exists():
        raise FileNotFoundError(f"--from-fit: {store} not found; give the results.zarr that 'diffsoup fit' or "
                                "'diffsoup campaign' wrote into its output directory")  # fmt: skip
    try:
        return dict(read_fit(path)["attrs"]["parameters"])
    except Exception as exc:  # noqa: BLE001 (zarr's errors for what is not a store vary by version)
        if str(exc).startswith("read_fit:"):  # a store, but not a complete diffsoup result: it says so
            raise
        raise ValueError(f"--from-fit: {store} is not a diffsoup result store ({type(exc).__name__}: {exc}); give "
                         "the results.zarr of a fit or campaign") from None  # fmt: skip
