"""The PEtab parameter table: :class:`ParameterRow` and :func:`read_parameters` (checked rows: scales,
bounds, nominal values; objective priors refused, initialization priors ignored with a warning).
"""

from __future__ import annotations

import dataclasses
import math

from ._petab_cells import (
    IDENTIFIER, cell_text, is_blank, parse_number, read_table_file, warn_ignored, warn_unknown_columns,
)
from ._petab_errors import Origin

SCALES = ("lin", "log", "log10")
PARAMETER_COLUMNS = ("parameterId", "parameterName", "parameterScale", "lowerBound", "upperBound", "nominalValue",
                     "estimate", "initializationPriorType", "initializationPriorParameters", "objectivePriorType",
                     "objectivePriorParameters")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ParameterRow:
    """A row of the parameter table (bounds and nominal value on the linear scale)."""

    id: str
    scale: str
    lower: float
    upper: float
    nominal: float
    estimate: bool
    origin: Origin


def read_parameters(paths) -> dict:
    from petab.v1.parameters import get_parameter_df

    out: dict[str, ParameterRow] = {}
    for path in paths:
        df = read_table_file(path, get_parameter_df)
        warn_unknown_columns(path, df.columns, PARAMETER_COLUMNS, "parameter table")
        for row, (pid, rec) in enumerate(df.iterrows(), start=1):
            origin = Origin(path, row)
            pid = str(pid)
            if not IDENTIFIER.match(pid):
                raise origin.error(f"{pid!r} is not a valid id", "parameterId")
            if pid in out:
                raise origin.error(f"{pid!r} is defined twice", "parameterId")
            for column in ("objectivePriorType", "objectivePriorParameters"):
                if not is_blank(rec.get(column)):
                    raise origin.error(f"parameter {pid!r} has an objective prior ({rec.get(column)!r}); diffsoup's "
                                       "objective is the likelihood alone: priors are not supported (remove the "
                                       "prior, or add it to the objective yourself)", column)  # fmt: skip
            for column in ("initializationPriorType", "initializationPriorParameters"):
                value = rec.get(column)
                if not is_blank(value) and not (column == "initializationPriorType" and str(value) == "parameterScaleUniform"):
                    warn_ignored(f"{path}, row {row}, column {column!r}: the initialization prior of {pid!r} is ignored "
                          "(diffsoup draws starts uniformly on the parameter's scale within its bounds)")
            scale = cell_text(rec.get("parameterScale")) or "lin"
            if scale not in SCALES:
                raise origin.error(f"{scale!r} is not one of {', '.join(SCALES)}", "parameterScale")
            estimate_text = cell_text(rec.get("estimate"))
            if estimate_text not in ("0", "1", "0.0", "1.0", "True", "False", "true", "false"):
                raise origin.error(f"{estimate_text!r} must be 0 or 1", "estimate")
            estimate = estimate_text in ("1", "1.0", "True", "true")
            lower = parse_number(origin, rec.get("lowerBound"), "lowerBound", required=estimate)
            upper = parse_number(origin, rec.get("upperBound"), "upperBound", required=estimate)
            nominal = parse_number(origin, rec.get("nominalValue"), "nominalValue", required=not estimate)
            if estimate:
                if not (math.isfinite(lower) and math.isfinite(upper) and lower < upper):
                    raise origin.error(f"estimated parameter {pid!r} needs finite bounds lowerBound < upperBound "
                                       f"(got {lower}, {upper})", "upperBound")  # fmt: skip
                if scale != "lin" and lower <= 0:
                    raise origin.error(f"parameter {pid!r} on scale {scale} needs a positive lowerBound (got {lower})",
                                       "lowerBound")  # fmt: skip
                if math.isnan(nominal):  # PEtab: optional for estimated parameters; the midpoint on the scale
                    lo, hi = (lower, upper) if scale == "lin" else (math.log(lower), math.log(upper))
                    nominal = 0.5 * (lo + hi) if scale == "lin" else math.exp(0.5 * (lo + hi))
                if not lower <= nominal <= upper:
                    raise origin.error(f"nominal value {nominal} of {pid!r} lies outside its bounds [{lower}, {upper}]",
                                       "nominalValue")  # fmt: skip
            if not math.isfinite(nominal):
                raise origin.error(f"nominal value of {pid!r} must be finite", "nominalValue")
            if scale != "lin" and nominal <= 0:
                raise origin.error(f"parameter {pid!r} on scale {scale} needs a positive nominal value (got {nominal})",
                                   "nominalValue")  # fmt: skip
            out[pid] = ParameterRow(pid, scale, lower, upper, nominal, estimate, origin)
    return out
