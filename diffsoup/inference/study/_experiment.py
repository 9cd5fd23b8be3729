"""``ds.Experiment``: one experiment's conditions, measurement times, observables, data and noise."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...integrate import Reset, SteadyState
from ._multishoot import with_trajectory
from ._noise import NOISE_MODELS, AbstractNoise, Gaussian, Laplace, LogLaplace, LogNormal  # noqa: F401 (re-exported)
from ._preequilibration import Preequilibration, checked_initial_state, checked_parameter_values


def takes_time(fn: Callable) -> bool:
    """Whether ``observables`` is ``fn(t, y, p)`` (exactly three positional parameters without a
    default) rather than ``fn(y, p)`` (anything else, e.g. two parameters or ``*args``)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a callable without a signature: the (y, p) form
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [q for q in sig.parameters.values() if q.kind in positional and q.default is inspect.Parameter.empty]
    return len(required) == 3


class Experiment:
    """One experiment: conditions, measurement times, observables, data (NaN = missing) and noise.

    Args:
        id: a unique non-empty name.
        times: measurement times ``(m,)``, non-decreasing, at or after ``t0``; finite, except that
            the last ones may be ``+inf``: measurements of the steady state (the solve runs past the
            last finite time until the state is steady, see ``steady_state``).
        data: measured values ``(m, k)`` (``(m,)`` reads as ``(m, 1)``), NaN where missing.
        observables: a JAX function of the states at one time ``y`` ``(n,)`` and ``p`` (a dict by
            name of the model parameters and the ``observable_parameters``) returning ``(k,)``:
            ``observables(y, p)``, or ``observables(t, y, p)`` with ``t`` the measurement time (a
            scalar; ``+inf`` at steady state). The two are told apart by the number of positional
            parameters without a default (three: ``(t, y, p)``; otherwise ``(y, p)``). None
            observes every state (``k = n``). Experiments sharing the same function object are
            evaluated together.
        noise: a noise model (:class:`Gaussian`, :class:`LogNormal`, :class:`Laplace`,
            :class:`LogLaplace`), or a sequence of ``k`` of them, one per observable column (each
            spread then broadcastable to ``(m,)``, a callable returning a scalar or ``(k,)``).
        conditions: fixed model parameter values of this experiment, by model parameter name.
        parameters: model parameter name -> study parameter name. A model parameter not listed
            (and not in ``conditions``) maps to the study parameter of the same name, or else keeps
            the model's default value. A study parameter owned by a level (or by each experiment)
            resolves to this experiment's member of that level.
        y0: the initial state: None keeps the model's; an array ``(n,)``; a mapping state name ->
            number or study-parameter name (an estimated initial amount) overriding the model's
            ``y0``; or a callable ``y0(p) -> (n,)`` of the experiment's model parameters by name
            (JAX, differentiable). With ``preequilibration``, None or a mapping: its states are
            re-initialized after the pre-equilibration.
        groups: level name -> the member of that level this experiment belongs to (e.g.
            ``{"site": "A", "patient": "A-7"}``); needed for every level of the study.
        t0: initial time of the solve.
        trajectory: how the experiment is solved in a fit: None for single shooting (one solve
            from ``t0``), or a :class:`~diffsoup.inference.Multishoot` (windows whose starts are
            fitted too). ``experiment.with_trajectory(...)`` gives a copy with another one.
        observable_parameters: name -> number or study-parameter name: extra entries of the ``p``
            given to ``observables`` and to callable noise spreads (scaling factors, offsets,
            PEtab's observable and noise parameters). A name may not be a model parameter's.
            Study-parameter names resolve like ``parameters`` (levels included) and are
            differentiable.
        preequilibration: a :class:`~diffsoup.inference.Preequilibration`: the solve first runs
            to a steady state under its conditions, and the experiment starts there at ``t0``.
        resets: ``ds.Reset(time, apply)`` objects: at each time the state jumps to
            ``apply(t, y, p)`` (``p`` the model parameters by name); ``time`` a number or a callable
            ``time(p)``. An output at a reset time reports the state after the reset. Gradients
            flow through ``apply`` but not through the reset times.
        discontinuities: times where the right-hand side jumps (steps land on them): a sequence
            of numbers or a callable ``discontinuities(p) -> (d,)``.
        steady_state: the ``ds.integrate.SteadyState`` test of the ``+inf`` times (None: its
            defaults, ``SteadyState()``).

    Raises:
        ValueError: naming the experiment and the field, for times out of order, negative or not
            finite, data of the wrong shape, an experiment with no data, NaN or non-positive sigma,
            non-positive data of a logarithmic noise model, a preequilibration with a y0 that
            is neither None nor a mapping.
        TypeError: for a non-callable observable or an unknown noise model.
    """

    def __init__(
        self,
        id: str,
        times: Any,
        data: Any,
        *,
        observables: Callable | None = None,
        noise: AbstractNoise | Sequence[AbstractNoise] = Gaussian(),
        conditions: Mapping[str, float] | None = None,
        parameters: Mapping[str, str] | None = None,
        y0: Any = None,
        groups: Mapping[str, str] | None = None,
        t0: float = 0.0,
        trajectory: Any = None,
        observable_parameters: Mapping[str, float | str] | None = None,
        preequilibration: Preequilibration | None = None,
        resets: Sequence[Any] = (),
        discontinuities: Any = (),
        steady_state: Any = None,
    ):
        if not isinstance(id, str) or not id:
            raise ValueError(f"Experiment id must be a non-empty string, not {id!r}.")
        self.id = id
        where = f"Experiment {id!r}"
        self.t0 = float(t0)
        if not np.isfinite(self.t0):
            raise ValueError(f"{where}: t0={t0!r} must be finite.")
        self.times = _checked_times(times, self.t0, where)
        data = np.asarray(data, dtype=np.float64)
        if data.ndim == 1:
            data = data[:, None]
        if data.ndim != 2 or data.shape[0] != self.times.shape[0]:
            raise ValueError(
                f"{where}: data has shape {data.shape}; expected ({self.times.shape[0]}, k): one row per measurement "
                "time, one column per observable."
            )
        if np.any(np.isinf(data)):  # before the all-NaN check: all-Inf data is not "missing"
            i, j = (int(v) for v in np.argwhere(np.isinf(data))[0])
            raise ValueError(
                f"{where}: data holds {int(np.sum(np.isinf(data)))} non-finite value(s) (Inf), the first in column {j} "
                f"(observable {j}) at times[{i}]={self.times[i]} (data[{i}, {j}] = {data[i, j]}); measured values "
                "must be finite (use NaN for a missing value)."
            )
        if data.shape[1] == 0 or not np.any(np.isfinite(data)):
            raise ValueError(f"{where}: data holds no measured value (all NaN); an experiment needs data.")
        self.data = data
        if observables is not None and not callable(observables):
            raise TypeError(f"{where}: observables must be a function observables(y, p) -> (k,), or None.")
        self.observables = observables
        self.observables_take_time = observables is not None and takes_time(observables)
        self._noise(noise, where)
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
        self.observable_parameters = checked_parameter_values(observable_parameters, where, "observable_parameters")
        if preequilibration is not None and not isinstance(preequilibration, Preequilibration):
            raise TypeError(
                f"{where}: preequilibration must be a ds.inference.Preequilibration or None, not "
                f"{type(preequilibration).__name__}."
            )
        self.preequilibration = preequilibration
        self.y0 = checked_initial_state(y0, where, "y0")
        if preequilibration is not None and not (self.y0 is None or isinstance(self.y0, dict)):
            raise ValueError(
                f"{where}: with preequilibration, y0 must be None or a mapping state name -> value (the states "
                "re-initialized after the pre-equilibration); give a full initial state as Preequilibration(y0=...)."
            )
        self.resets = _checked_resets(resets, where)
        self.discontinuities = _checked_discontinuities(discontinuities, where)

        if steady_state is None:
            steady_state = SteadyState()
        elif not isinstance(steady_state, SteadyState):
            raise TypeError(f"{where}: steady_state must be a ds.integrate.SteadyState, not {type(steady_state).__name__}.")
        self.steady_state = steady_state
        self.groups = dict(groups or {})
        for k, v in self.groups.items():
            if not isinstance(k, str) or not isinstance(v, str) or not k or not v:
                raise ValueError(f"{where}: groups maps level names to member names (strings); got {k!r}: {v!r}.")
        self.trajectory = None
        if trajectory is not None:
            self.trajectory = self.with_trajectory(trajectory).trajectory

    def _noise(self, noise, where: str) -> None:
        """Check the noise models and lay out their spreads cell by cell: ``sigma_values`` ``(m, k)``
        (numbers; NaN elsewhere), ``sigma_names`` ``(m, k)`` (study-parameter names; None
        elsewhere), ``sigma_functions`` (per column: a callable spread or None)."""
        m, k = self.data.shape
        if isinstance(noise, AbstractNoise):
            columns, fields = (noise,) * k, ("noise",) * k
        elif isinstance(noise, (list, tuple)) and noise and all(isinstance(x, AbstractNoise) for x in noise):
            if len(noise) != k:
                raise ValueError(
                    f"{where}: noise gives {len(noise)} models for {k} observable column(s); give one model, or one "
                    "per column."
                )
            columns, fields = tuple(noise), tuple(f"noise[{j}]" for j in range(k))
        else:
            raise TypeError(
                f"{where}: noise must be ds.inference.Gaussian(...), LogNormal(...), Laplace(...) or LogLaplace(...), "
                f"or a sequence of one per observable column, not {noise!r}."
            )
        self.noise = noise
        self.noise_columns = columns
        values = np.full((m, k), np.nan)
        names = np.full((m, k), None, dtype=object)
        functions: list = [None] * k
        shared = isinstance(noise, AbstractNoise)
        for j0 in range(1 if shared else k):
            cols = list(range(k)) if shared else [j0]
            model = columns[j0]
            spread = model.spread
            label = f"{fields[j0]}.{model.spread_field}"
            if callable(spread):
                for j in cols:
                    functions[j] = spread
                continue
            if isinstance(spread, str):
                if not spread:
                    raise ValueError(f"{where}: {label} is an empty parameter name.")
                names[:, cols] = spread
                continue
            cells = _spread_cells(spread, (m, k) if shared else (m,), where, label, self.data.shape)
            if not shared:
                cells = cells[:, None]
            if cells.dtype == object:
                is_name = np.vectorize(lambda c: isinstance(c, str), otypes=[bool])(cells)
                numbers = _object_numbers(cells, where, label)
                for i, jj in zip(*np.nonzero(is_name)):
                    if not cells[i, jj]:
                        raise ValueError(f"{where}: {label} holds an empty parameter name (row {i}).")
                    names[i, cols[jj]] = cells[i, jj]
            else:
                is_name, numbers = np.zeros(cells.shape, dtype=bool), cells
            given = numbers[~is_name]
            if np.any(np.isnan(given)):
                raise ValueError(f"{where}: {label} holds NaN; give a positive standard deviation for every value.")
            if np.any(given <= 0) or np.any(~np.isfinite(given)):
                raise ValueError(f"{where}: {label} must be positive and finite (got min {given.min()}).")
            values[:, cols] = numbers
        for j, c in enumerate(columns):
            if c.log_base is None:
                continue
            measured = self.data[:, j][np.isfinite(self.data[:, j])]
            if np.any(measured <= 0):
                name = "log-normal" if isinstance(c, LogNormal) else "log-Laplace"
                raise ValueError(f"{where}: {name} noise needs positive data; found {measured[measured <= 0][0]}.")
        self.sigma_values = values
        self.sigma_names = names
        self.sigma_functions = tuple(functions)
        fixed = not any(functions) and not any(isinstance(x, str) for x in names.ravel())
        # The known spread of every value, (m, k) (None when some come from parameters or functions).
        self.sigma = values if fixed else None

    def with_trajectory(self, trajectory: Any) -> "Experiment":
        """A copy of this experiment solved with ``trajectory`` (None: single shooting).

        Raises:
            TypeError: for a trajectory that is not a ``Multishoot`` or None.
            ValueError: if its windows do not fit the experiment's time span.
        """
        return with_trajectory(self, trajectory)

    @property
    def n_measured(self) -> int:
        """Number of measured (non-NaN) values."""
        return int(np.sum(np.isfinite(self.data)))

    @property
    def n_observables(self) -> int:
        return int(self.data.shape[1])

    @property
    def n_steady_times(self) -> int:
        """How many of the measurement times are ``+inf`` (the steady state)."""
        return int(np.sum(np.isinf(self.times)))

    def __repr__(self) -> str:
        shoot = "" if self.trajectory is None else f", windows={self.trajectory.n_windows}"
        return (f"Experiment({self.id!r}, times={self.times.shape[0]}, observables={self.n_observables}, "
                f"measured={self.n_measured}{shoot})")  # fmt: skip


def _checked_times(times, t0: float, where: str) -> np.ndarray:
    times = np.asarray(times, dtype=np.float64)
    if times.ndim != 1:
        raise ValueError(f"{where}: times must be a 1-D array of measurement times, got shape {times.shape}.")
    if times.size == 0:
        raise ValueError(f"{where}: times is empty; an experiment needs at least one measurement (no data).")
    steady = np.isposinf(times)
    if np.any(np.isnan(times)) or np.any(np.isneginf(times)):
        raise ValueError(f"{where}: times must be finite (or +inf, the steady state, at the end).")
    if np.any(steady) and not np.all(steady[int(np.argmax(steady)):]):
        raise ValueError(f"{where}: times must be finite; +inf (the steady state) may only end the times.")
    if np.any(times < t0):
        raise ValueError(
            f"{where}: times must not be negative (before t0={t0}); first bad time {times[times < t0][0]}."
        )
    finite = times[~steady]
    if np.any(np.diff(finite) < 0):
        i = int(np.nonzero(np.diff(finite) < 0)[0][0])
        raise ValueError(
            f"{where}: times are out of order (times[{i}]={finite[i]} > times[{i + 1}]={finite[i + 1]}); sort them "
            "and the rows of data with them."
        )
    return times


def _spread_cells(spread, target: tuple, where: str, label: str, data_shape: tuple) -> np.ndarray:
    """``spread`` broadcast to ``target``: float64, or object when it holds names (strings)."""
    if isinstance(spread, np.ndarray) and spread.dtype.kind in "fiub":
        arr = spread.astype(np.float64)
    else:
        arr = np.array(spread, dtype=object)
        if not any(isinstance(c, str) for c in arr.ravel()):
            try:
                arr = arr.astype(np.float64)
            except (TypeError, ValueError):
                raise ValueError(f"{where}: {label} must hold numbers or study-parameter names.") from None
    if len(target) == 1 and arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    try:
        return np.broadcast_to(arr, target).copy()
    except ValueError:
        raise ValueError(
            f"{where}: {label} has shape {arr.shape}, which does not broadcast to the data shape {data_shape}"
            + ("" if len(target) == 2 else f" (a column's model takes {target})") + "."
        ) from None


def _object_numbers(cells: np.ndarray, where: str, label: str) -> np.ndarray:
    out = np.full(cells.shape, np.nan)
    for idx, c in np.ndenumerate(cells):
        if isinstance(c, str):
            continue
        try:
            out[idx] = float(c)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: {label} holds {c!r}; give numbers or study-parameter names.") from None
    return out


def _checked_resets(resets, where: str) -> tuple:
    if resets is None:
        return ()
    if isinstance(resets, Reset):
        return (resets,)
    if not isinstance(resets, (list, tuple)):
        raise TypeError(f"{where}: resets must be a sequence of ds.Reset(time, apply), not {type(resets).__name__}.")
    for i, r in enumerate(resets):
        if not isinstance(r, Reset):
            raise TypeError(f"{where}: resets[{i}] must be a ds.Reset(time, apply), not {r!r}.")
    return tuple(resets)


def _checked_discontinuities(discs, where: str):
    if discs is None:
        return ()
    if callable(discs):
        return discs
    arr = np.asarray(discs, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{where}: discontinuities must be finite times (or a callable discontinuities(p)).")
    return tuple(float(x) for x in np.sort(arr))


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
