"""``ds.inference.profile``: profile likelihoods of a fit, one ``checkpointed_map`` task per parameter.

Each parameter's profile (:func:`diffsoup.inference.fitting._profile_likelihood.profile_parameter`: the
walk along the parameter with the others re-optimized, and the crossings of the chi-square
threshold) is one task of a campaign, so a rerun with the same ledger keeps the profiles already
finished and computes the others. The numerical part lives in ``diffsoup.inference`` and imports
nothing of this layer; this driver is re-exported there lazily, as ``checkpointed_map`` is.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..inference import AbstractLoweredStudy, FitResult
from ..inference.fitting._hierarchical import AnalyticParameters
from ..inference.fitting._profile_likelihood import ParameterProfile, ProfileOptions, ProfileResult, profile_parameter, threshold
from ._campaign import checkpointed_map
from ._lowered_cache import fingerprint_of, lowered_from

PROFILE_FORMAT = "diffsoup.profile/1"


class ProfileTask:
    """A campaign task: the profile of one parameter (the item names it), run where the task lands.

    Args:
        lowered: the lowered study, or a picklable zero-argument factory returning one (for tasks
            run on Dask workers: each worker process lowers it once, in the process's cache under
            the factory's fingerprint, shared with the multistart tasks of the same factory).
        options: the :class:`ProfileOptions`.
    """

    def __init__(self, lowered: AbstractLoweredStudy | Callable[[], AbstractLoweredStudy], options: ProfileOptions):
        self.lowered, self.options = lowered, options
        # Computed here, where the task is made: the workers get it with the task.
        self.fingerprint = None if isinstance(lowered, AbstractLoweredStudy) else fingerprint_of(lowered)

    def __call__(self, item: dict) -> dict:
        low, _ = lowered_from(self.lowered, self.fingerprint)
        result = profile_parameter(low, np.asarray(item["theta"], dtype=np.float64), float(item["objective"]),
                                   item["parameter"], self.options)  # fmt: skip
        return {"format": PROFILE_FORMAT, **result.to_json()}


def profile(
    lowered: AbstractLoweredStudy | Callable[[], AbstractLoweredStudy],
    result: FitResult | Any,
    parameters: Sequence[str] | None = None,
    *,
    options: ProfileOptions | None = None,
    confidence: float | None = None,
    ledger_path: str | os.PathLike | None = None,
    resume: bool = True,
    on_conflict: str = "error",
    execution: str = "serial",
    progress: bool = False,
    **campaign_options: Any,
) -> ProfileResult:
    """Profile likelihoods of a fit's parameters and their confidence intervals.

    Each parameter's profile is a task of :func:`~diffsoup.inference.checkpointed_map`: with a
    ``ledger_path``, a rerun keeps the profiles already computed and runs the rest (``resume``,
    ``on_conflict`` as there; another optimum, other options or other parameters fingerprint as
    other tasks).

    Args:
        lowered: the lowered study the fit ran on (``ds.lower``'s, or ``ds.distributed.run``'s:
            the profiles then run here, each evaluation spread over the workers), or a picklable
            factory ``() -> lowered study`` for ``execution="dask"`` (each worker builds its own).
        result: the fit (``FitResult``: its ``theta`` and ``objective``), or the optimum ``theta``
            itself (scaled; its objective is evaluated here).
        parameters: theta names to profile (None: every estimated parameter, window starts of
            multiple shooting excepted).
        options: :class:`~diffsoup.inference.ProfileOptions` (the optimizer, steps, tolerances).
        confidence: overrides ``options.confidence`` (0.95 by default).
        ledger_path: the campaign's JSON ledger; None runs the tasks with a throw-away ledger.
        resume, on_conflict, execution, progress, campaign_options: as for ``checkpointed_map``.

    Returns:
        A :class:`~diffsoup.inference.ProfileResult` (intervals, profiles; ``ds.plots.plot_profiles``
        draws it). A task that failed is listed in its ``failures``.

    Raises:
        ValueError: for an unknown parameter name, a theta of the wrong shape, or nothing to profile.
    """
    options = options if options is not None else ProfileOptions()
    if not isinstance(options, ProfileOptions):
        raise TypeError(f"profile: options must be a ds.inference.ProfileOptions, not {type(options).__name__}.")
    if confidence is not None:
        options = replace(options, confidence=float(confidence))
    task = ProfileTask(lowered, options)
    low, _ = lowered_from(lowered, task.fingerprint)  # a factory's study is the tasks' in this process
    prob = low.problem
    names = tuple(prob.theta_names)
    if isinstance(result, FitResult):
        theta, objective = np.asarray(result.theta, dtype=np.float64), float(result.objective)
    else:
        theta = np.asarray(result, dtype=np.float64)
        if theta.shape != (len(names),):
            raise ValueError(f"profile: theta has shape {theta.shape}; expected ({len(names)},) for {list(names)}.")
        objective = low.value(theta)
        if low.last_failures or not np.isfinite(objective):
            raise ValueError(f"profile: the objective at the given theta is not finite (failed solves: "
                             f"{sorted(low.last_failures)}).")  # fmt: skip
    n_par = getattr(prob, "n_parameters", len(names))
    chosen = list(names[:n_par]) if parameters is None else list(parameters)
    if isinstance(parameters, str):
        raise TypeError("profile: parameters is a sequence of theta names, not one string.")
    unknown = [p for p in chosen if p not in names]
    if unknown:
        raise ValueError(f"profile: {unknown} are not estimated parameters; theta is {list(names)}.")
    if not chosen:
        raise ValueError("profile: no parameter to profile.")
    if not isinstance(options.hierarchical, bool):  # named parameters that do not qualify fail here, not in every task
        AnalyticParameters.find(low, options.hierarchical, theta)
    items = [{"task_id": f"profile:{name}", "parameter": name, "theta": [float(v) for v in theta],
              "objective": objective, "options": options.as_dict()} for name in chosen]  # fmt: skip
    kwargs = dict(resume=resume, on_conflict=on_conflict, execution=execution, progress=progress, **campaign_options)
    if ledger_path is None:
        with tempfile.TemporaryDirectory(prefix="diffsoup-profile-") as tmp:
            campaign = checkpointed_map(task, items, ledger_path=os.path.join(tmp, "profiles.json"), **kwargs)
    else:
        campaign = checkpointed_map(task, items, ledger_path=ledger_path, **kwargs)
    profiles = {}
    for name in chosen:
        data = campaign.results.get(f"profile:{name}")
        if data is not None:
            profiles[name] = ParameterProfile.from_json({k: v for k, v in data.items() if k != "format"})
    failures = {r.task_id.split(":", 1)[1]: str(r.error) for r in campaign.failures.values()}
    dof = len(names) if options.simultaneous else 1
    scales = {n: prob.study.entries[i].parameter.scale for n, i in zip(names, prob.estimated)}
    return ProfileResult(profiles=profiles, theta=theta, objective=objective, confidence=options.confidence,
                         delta=threshold(low.scale, options.confidence, dof), scales=scales, failures=failures)  # fmt: skip
