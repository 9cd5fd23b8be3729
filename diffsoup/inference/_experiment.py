"""``ds.Experiment``: one experiment's conditions, measurement times, observables, data and noise."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np


@dataclasses.dataclass(frozen=True, eq=False)
class Gaussian:
    """Additive Gaussian noise: ``data = observable + sigma * N(0, 1)``.

    Args:
        sigma: a known standard deviation (a positive scalar, or an array broadcastable to the
            experiment's data shape ``(m, k)``), or the name of a study parameter to estimate
            (the same sigma for every value of the experiment).
    """

    sigma: Any = 1.0


@dataclasses.dataclass(frozen=True, eq=False)
class LogNormal:
    """Multiplicative (log-normal) noise: ``log(data) = log(observable) + sigma * N(0, 1)``.

    Data and observables must be positive. ``sigma`` is as for :class:`Gaussian`, on the log scale.
    """

    sigma: Any = 0.1


NOISE_MODELS = (Gaussian, LogNormal)


class Experiment:
    """One experiment: conditions, measurement times, observables, data (NaN = missing) and noise.

    Args:
        id: a unique non-empty name.
        times: measurement times ``(m,)``, finite, non-negative (at or after ``t0``), non-decreasing.
        data: measured values ``(m, k)`` (``(m,)`` reads as ``(m, 1)``), NaN where missing.
        observables: ``observables(y, p) -> (k,)``, a JAX function of the states at one time ``(n,)``
            and the model parameters (a dict by name); None observes every state (``k = n``).
            Experiments sharing the same function object are evaluated together.
        noise: :class:`Gaussian` or :class:`LogNormal`.
        conditions: fixed model parameter values of this experiment, by model parameter name.
        parameters: model parameter name -> study parameter name. A model parameter not listed
            (and not in ``conditions``) maps to the study parameter of the same name, or else keeps
            the model's default value. A study parameter owned by a level (or by each experiment)
            resolves to this experiment's member of that level.
        y0: initial state, an array ``(n,)`` or a mapping state name -> value overriding the
            model's ``y0``; None keeps the model's.
        groups: level name -> the member of that level this experiment belongs to (e.g.
            ``{"site": "A", "patient": "A-7"}``); needed for every level of the study.
        t0: initial time of the solve.
        trajectory: how the experiment is solved in a fit: None for single shooting (one solve
            from ``t0``), or a :class:`~diffsoup.inference.Multishoot` (windows whose starts are
            fitted too). ``experiment.with_trajectory(...)`` gives a copy with another one.

    Raises:
        ValueError: naming the experiment and the field, for times out of order, negative or not
            finite, data of the wrong shape, an experiment with no data, NaN or non-positive sigma,
            or non-positive log-normal data.
        TypeError: for a non-callable observable or an unknown noise model.
    """

    def __init__(
        self,
        id: str,
        times: Any,
        data: Any,
        *,
        observables: Callable | None = None,
        noise: Gaussian | LogNormal = Gaussian(),
        conditions: Mapping[str, float] | None = None,
        parameters: Mapping[str, str] | None = None,
        y0: Any = None,
        groups: Mapping[str, str] | None = None,
        t0: float = 0.0,
        trajectory: Any = None,
    ):
        if not isinstance(id, str) or not id:
            raise ValueError(f"Experiment id must be a non-empty string, not {id!r}.")
        self.id = id
        where = f"Experiment {id!r}"
        self.t0 = float(t0)
        if not np.isfinite(self.t0):
            raise ValueError(f"{where}: t0={t0!r} must be finite.")
        times = np.asarray(times, dtype=np.float64)
        if times.ndim != 1:
            raise ValueError(f"{where}: times must be a 1-D array of measurement times, got shape {times.shape}.")
        if times.size == 0:
            raise ValueError(f"{where}: times is empty; an experiment needs at least one measurement (no data).")
        if not np.all(np.isfinite(times)):
            raise ValueError(f"{where}: times must be finite.")
        if np.any(times < self.t0):
            raise ValueError(
                f"{where}: times must not be negative (before t0={self.t0}); first bad time {times[times < self.t0][0]}."
            )
        if np.any(np.diff(times) < 0):
            i = int(np.nonzero(np.diff(times) < 0)[0][0])
            raise ValueError(
                f"{where}: times are out of order (times[{i}]={times[i]} > times[{i + 1}]={times[i + 1]}); sort them "
                "and the rows of data with them."
            )
        self.times = times
        data = np.asarray(data, dtype=np.float64)
        if data.ndim == 1:
            data = data[:, None]
        if data.ndim != 2 or data.shape[0] != times.shape[0]:
            raise ValueError(
                f"{where}: data has shape {data.shape}; expected ({times.shape[0]}, k): one row per measurement "
                "time, one column per observable."
            )
        if np.any(np.isinf(data)):  # before the all-NaN check: all-Inf data is not "missing"
            i, j = (int(v) for v in np.argwhere(np.isinf(data))[0])
            raise ValueError(
                f"{where}: data holds {int(np.sum(np.isinf(data)))} non-finite value(s) (Inf), the first in column {j} "
                f"(observable {j}) at times[{i}]={times[i]} (data[{i}, {j}] = {data[i, j]}); measured values must be "
                "finite (use NaN for a missing value)."
            )
        if data.shape[1] == 0 or not np.any(np.isfinite(data)):
            raise ValueError(f"{where}: data holds no measured value (all NaN); an experiment needs data.")
        self.data = data
        if observables is not None and not callable(observables):
            raise TypeError(f"{where}: observables must be a function observables(y, p) -> (k,), or None.")
        self.observables = observables
        if not isinstance(noise, NOISE_MODELS):
            raise TypeError(f"{where}: noise must be ds.inference.Gaussian(...) or LogNormal(...), not {noise!r}.")
        self.noise = noise
        if isinstance(noise.sigma, str):
            if not noise.sigma:
                raise ValueError(f"{where}: noise.sigma is an empty parameter name.")
            self.sigma = None
        else:
            sigma = np.asarray(noise.sigma, dtype=np.float64)
            try:
                sigma = np.broadcast_to(sigma, data.shape).copy()
            except ValueError:
                raise ValueError(
                    f"{where}: noise.sigma has shape {sigma.shape}, which does not broadcast to the data shape "
                    f"{data.shape}."
                ) from None
            if np.any(np.isnan(sigma)):
                raise ValueError(f"{where}: noise.sigma holds NaN; give a positive standard deviation for every value.")
            if np.any(sigma <= 0) or np.any(~np.isfinite(sigma)):
                raise ValueError(f"{where}: noise.sigma must be positive and finite (got min {sigma.min()}).")
            self.sigma = sigma
        if isinstance(noise, LogNormal):
            measured = data[np.isfinite(data)]
            if np.any(measured <= 0):
                raise ValueError(f"{where}: log-normal noise needs positive data; found {measured[measured <= 0][0]}.")
        self.conditions = _float_mapping(conditions, where, "conditions")
        self.parameters = dict(parameters or {})
        for k, v in self.parameters.items():
            if not isinstance(k, str) or not isinstance(v, str) or not k or not v:
                raise ValueError(
                    f"{where}: parameters maps model parameter names to study parameter names (strings); "
                    f"got {k!r}: {v!r}."
                )
            if k in self.conditions:
                raise ValueError(f"{where}: model parameter {k!r} is both in conditions and in parameters; keep one.")
        if isinstance(y0, Mapping):
            self.y0 = _float_mapping(y0, where, "y0")
        elif y0 is None:
            self.y0 = None
        else:
            y0 = np.asarray(y0, dtype=np.float64)
            if y0.ndim != 1 or not np.all(np.isfinite(y0)):
                raise ValueError(f"{where}: y0 must be a finite 1-D array or a mapping state name -> value.")
            self.y0 = y0
        self.groups = dict(groups or {})
        for k, v in self.groups.items():
            if not isinstance(k, str) or not isinstance(v, str) or not k or not v:
                raise ValueError(f"{where}: groups maps level names to member names (strings); got {k!r}: {v!r}.")
        self.trajectory = None
        if trajectory is not None:
            self.trajectory = self.with_trajectory(trajectory).trajectory

    def with_trajectory(self, trajectory: Any) -> "Experiment":
        """A copy of this experiment solved with ``trajectory`` (None: single shooting).

        Raises:
            TypeError: for a trajectory that is not a ``Multishoot`` or None.
            ValueError: if its windows do not fit the experiment's time span.
        """
        from ._multishoot import with_trajectory

        return with_trajectory(self, trajectory)

    @property
    def n_measured(self) -> int:
        """Number of measured (non-NaN) values."""
        return int(np.sum(np.isfinite(self.data)))

    @property
    def n_observables(self) -> int:
        return int(self.data.shape[1])

    def __repr__(self) -> str:
        shoot = "" if self.trajectory is None else f", windows={self.trajectory.n_windows}"
        return (f"Experiment({self.id!r}, times={self.times.shape[0]}, observables={self.n_observables}, "
                f"measured={self.n_measured}{shoot})")  # fmt: skip


def _float_mapping(values, where, field):
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise ValueError(f"{where}: {field} must be a mapping name -> value.")
    out = {}
    for k, v in values.items():
        if not isinstance(k, str) or not k:
            raise ValueError(f"{where}: {field} keys must be names (strings), got {k!r}.")
        try:
            fv = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: {field}[{k!r}]={v!r} must be a number.") from None
        if not np.isfinite(fv):
            raise ValueError(f"{where}: {field}[{k!r}]={v!r} must be finite.")
        out[k] = fv
    return out
