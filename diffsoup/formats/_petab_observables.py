"""The PEtab observable table: :class:`ObservableRow` and :func:`read_observables` (checked rows:
ids, formulas, transformations and noise distributions diffsoup has).
"""

from __future__ import annotations

import dataclasses
import re

from ._petab_cells import IDENTIFIER, cell_text, read_table_file, warn_unknown_columns
from ._petab_errors import Origin

TRANSFORMATIONS = ("lin", "log", "log10")
DISTRIBUTIONS = ("normal", "laplace")
OBSERVABLE_COLUMNS = ("observableId", "observableName", "observableFormula", "observableTransformation",
                      "noiseFormula", "noiseDistribution")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ObservableRow:
    """A row of the observable table (transformation and distribution with PEtab's defaults)."""

    id: str
    formula: str
    noise_formula: str
    transformation: str
    distribution: str
    origin: Origin

    def placeholders(self, kind: str) -> int:
        """How many ``observableParameter{n}_{id}`` (``kind="observable"``) or ``noiseParameter{n}_{id}``
        (``kind="noise"``) placeholders its formula has (the largest ``n``)."""
        text = self.formula if kind == "observable" else self.noise_formula
        found = [int(n) for n in re.findall(rf"\b{kind}Parameter(\d+)_{re.escape(self.id)}\b", text)]
        return max(found, default=0)


def read_observables(paths) -> dict:
    from petab.v1.observables import get_observable_df

    out: dict[str, ObservableRow] = {}
    for path in paths:
        df = read_table_file(path, get_observable_df)
        warn_unknown_columns(path, df.columns, OBSERVABLE_COLUMNS, "observable table")
        for row, (oid, rec) in enumerate(df.iterrows(), start=1):
            origin = Origin(path, row)
            oid = str(oid)
            if not IDENTIFIER.match(oid):
                raise origin.error(f"{oid!r} is not a valid id", "observableId")
            if oid in out:
                raise origin.error(f"{oid!r} is defined twice (also {out[oid].origin.path}, row {out[oid].origin.row})",
                                   "observableId")  # fmt: skip
            formula = cell_text(rec.get("observableFormula"))
            if not formula:
                raise origin.error("is empty", "observableFormula")
            noise = cell_text(rec.get("noiseFormula"))
            if not noise:
                raise origin.error("is empty; give a number, a parameter or a formula", "noiseFormula")
            transformation = cell_text(rec.get("observableTransformation")) or "lin"
            if transformation not in TRANSFORMATIONS:
                raise origin.error(f"{transformation!r} is not one of {', '.join(TRANSFORMATIONS)}",
                                   "observableTransformation")  # fmt: skip
            distribution = cell_text(rec.get("noiseDistribution")) or "normal"
            if distribution not in DISTRIBUTIONS:
                raise origin.error(f"{distribution!r} is not supported; diffsoup has {', '.join(DISTRIBUTIONS)}",
                                   "noiseDistribution")  # fmt: skip
            out[oid] = ObservableRow(oid, formula, noise, transformation, distribution, origin)
    return out
