"""``ds.inference.Parameter``: one row of a study's parameter table (name, nominal value, bounds,
scale, whether it is estimated, the level that owns it), and :class:`Entry`, one entry of the
expanded study parameter vector."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

SCALES = ("lin", "log", "log10")
EXPERIMENT_LEVEL = "experiment"


class ParameterError(ValueError):
    """A bad :class:`Parameter` row; ``key`` is the field at fault (``"lower"``, ``"nominal"``, ...),
    so that a study file can point at that key's line."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One row of a study's parameter table.

    Args:
        name: the study parameter's name (experiments map model parameters to it).
        nominal: its value on the linear scale (the value it keeps when fixed, and a start).
            None (the default) takes the midpoint of ``lower`` and ``upper`` on the parameter's
            scale (the geometric mean for ``"log"``/``"log10"``); the bounds must then be finite.
        lower, upper: bounds on the linear scale; finite for an estimated parameter, positive
            for the log scales.
        scale: ``"lin"``, ``"log"`` or ``"log10"``: the coordinates the optimizer works in.
        estimate: True to estimate it, False to hold it at ``nominal``.
        level: None for one value shared by all experiments; ``"experiment"`` for one value per
            experiment; a level name of the study for one value per member of that level. The
            entries are named ``name[member]``.

    Raises:
        ValueError: naming the parameter and the field (its ``key`` attribute names the field).
    """

    name: str
    nominal: float | None = None
    lower: float = -math.inf
    upper: float = math.inf
    scale: str = "log10"
    estimate: bool = True
    level: str | None = None

    def __post_init__(self):
        where = f"Parameter {self.name!r}"
        if not isinstance(self.name, str) or not self.name or "[" in self.name:
            raise ParameterError(f"Parameter name {self.name!r} must be a non-empty string without '['.", "name")
        if self.scale not in SCALES:
            raise ParameterError(f"{where}: scale={self.scale!r} must be one of {SCALES}.", "scale")
        for field in ("lower", "upper") + (("nominal",) if self.nominal is not None else ()):
            value = getattr(self, field)
            try:
                object.__setattr__(self, field, float(value))
            except (TypeError, ValueError):
                raise ParameterError(f"{where}: {field}={value!r} must be a number.", field) from None
            if math.isnan(getattr(self, field)):
                raise ParameterError(f"{where}: {field} is NaN; give a number.", field)
        if self.lower > self.upper:
            raise ParameterError(
                f"{where}: lower bound {self.lower} is above the upper bound {self.upper}; swap them.", "upper"
            )
        if self.scale != "lin" and self.lower <= 0:
            raise ParameterError(
                f"{where}: scale={self.scale!r} needs positive values; lower={self.lower} (use scale='lin' or "
                "positive bounds).", "lower"
            )  # fmt: skip
        if self.nominal is None:
            if not (math.isfinite(self.lower) and math.isfinite(self.upper)):
                raise ParameterError(
                    f"{where}: give nominal=, or finite lower= and upper= (nominal then defaults to their midpoint "
                    f"on the {self.scale} scale).", "nominal"
                )  # fmt: skip
            lo, hi = self.lower, self.upper
            midpoint = lo / 2 + hi / 2 if self.scale == "lin" else math.sqrt(lo) * math.sqrt(hi)
            object.__setattr__(self, "nominal", midpoint)
        if not math.isfinite(self.nominal):
            raise ParameterError(f"{where}: nominal={self.nominal} must be finite.", "nominal")
        if self.estimate and not (math.isfinite(self.lower) and math.isfinite(self.upper)):
            raise ParameterError(
                f"{where}: an estimated parameter needs finite bounds (lower=, upper=) for the multistart; "
                "give them or set estimate=False.", "upper" if math.isfinite(self.lower) else "lower"
            )  # fmt: skip
        if self.scale != "lin" and self.nominal <= 0:
            raise ParameterError(
                f"{where}: scale={self.scale!r} needs positive values; nominal={self.nominal} (use scale='lin' or "
                "a positive nominal).", "nominal"
            )  # fmt: skip
        if not (self.lower <= self.nominal <= self.upper):
            raise ParameterError(f"{where}: nominal {self.nominal} lies outside [{self.lower}, {self.upper}].",
                                 "nominal")
        if self.level is not None and (not isinstance(self.level, str) or not self.level):
            raise ParameterError(f"{where}: level must be None, 'experiment' or a level name of the study.", "level")

    def to_scale(self, value):
        """Linear value -> optimizer coordinate."""
        return {"lin": lambda v: v, "log": np.log, "log10": np.log10}[self.scale](np.asarray(value, dtype=np.float64))

    def from_scale(self, value):
        """Optimizer coordinate -> linear value (numpy)."""
        v = np.asarray(value, dtype=np.float64)
        return {"lin": lambda v: v, "log": np.exp, "log10": lambda v: 10.0**v}[self.scale](v)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One entry of the expanded study parameter vector (a parameter, or its value for one member)."""

    name: str
    parameter: Parameter
    member: str | None
