"""``ds.inference.Preequilibration``: an experiment that starts from a steady state.

The experiment is first solved from the pre-equilibration's initial state, under the experiment's
parameters overridden by the pre-equilibration's ``conditions``, until the state is steady
(``ds.integrate.SteadyState``); the experiment then starts from that state at its ``t0``, with the
states its own ``y0`` mapping names re-initialized (PEtab's semantics). Derivatives flow through the
steady state (it depends on the parameters through the solve to it).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import numpy as np

from ...integrate import SteadyState


def checked_parameter_values(values: Any, where: str, field: str) -> dict:
    """``values`` as a dict name -> float or study-parameter name (str).

    Raises:
        ValueError: naming ``where`` and ``field``, for a non-mapping, a bad name or a value that
            is neither a finite number nor a non-empty name.
    """
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise ValueError(f"{where}: {field} must be a mapping name -> number or study-parameter name.")
    out: dict = {}
    for k, v in values.items():
        if not isinstance(k, str) or not k:
            raise ValueError(f"{where}: {field} keys must be names (strings), got {k!r}.")
        if isinstance(v, str):
            if not v:
                raise ValueError(f"{where}: {field}[{k!r}] is an empty study-parameter name.")
            out[k] = v
            continue
        try:
            fv = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: {field}[{k!r}]={v!r} must be a number or a study-parameter name.") from None
        if not math.isfinite(fv):
            raise ValueError(f"{where}: {field}[{k!r}]={v!r} must be finite.")
        out[k] = fv
    return out


def checked_initial_state(y0: Any, where: str, field: str):
    """An initial state as an experiment takes it: None, a callable ``y0(p)``, a dict state name ->
    float or study-parameter name, or a finite 1-D float array.

    Raises:
        ValueError: naming ``where`` and ``field``.
    """
    if y0 is None or callable(y0):
        return y0
    if isinstance(y0, Mapping):
        return checked_parameter_values(y0, where, field)
    arr = np.asarray(y0, dtype=np.float64)
    if arr.ndim != 1 or not np.all(np.isfinite(arr)):
        raise ValueError(
            f"{where}: {field} must be a finite 1-D array, a mapping state name -> value (number or study-parameter "
            f"name), or a callable {field}(p)."
        )
    return arr


@dataclasses.dataclass(frozen=True, eq=False)
class Preequilibration:
    """Solve to a steady state first; the experiment starts there (see the module).

    Args:
        conditions: model parameter name -> number or study-parameter name: the parameters of the
            pre-equilibration that differ from the experiment's (the others are the experiment's).
        y0: where the pre-equilibration starts, as ``Experiment.y0`` takes it (None: the model's
            ``y0``; an array; a mapping state name -> number or study-parameter name over the
            model's ``y0``; a callable ``y0(p)`` of the pre-equilibration's model parameters).
        steady_state: the ``ds.integrate.SteadyState`` test that ends the solve (None: its
            defaults, ``SteadyState()``: the solve's own tolerances).

    Raises:
        ValueError: for conditions or y0 of the wrong form.
    """

    conditions: Mapping[str, Any] | None = None
    y0: Any = None
    steady_state: Any = None

    def __post_init__(self):
        where = "Preequilibration"
        object.__setattr__(self, "conditions", checked_parameter_values(self.conditions, where, "conditions"))
        object.__setattr__(self, "y0", checked_initial_state(self.y0, where, "y0"))

        if self.steady_state is None:
            object.__setattr__(self, "steady_state", SteadyState())
        elif not isinstance(self.steady_state, SteadyState):
            raise TypeError(
                f"{where}: steady_state must be a ds.integrate.SteadyState, not {type(self.steady_state).__name__}."
            )
