"""``ds.inference.SolverOptions``: tolerances and budgets of every solve of an objective."""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class SolverOptions:
    """Options of every solve of the objective.

    Args:
        rtol, atol: tolerances of ``ds.simulate``.
        max_steps: step attempts per experiment; more is recorded as a failed solve.
        checkpoints: records per level of the checkpointed adjoint (gradients, exact Hessians).
    """

    rtol: float = 1e-6
    atol: float = 1e-9
    max_steps: int = 10_000
    checkpoints: int = 64

    def __post_init__(self):
        for f in ("rtol", "atol"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
                raise ValueError(f"SolverOptions.{f}={v!r} must be a positive number.")
        for f in ("max_steps", "checkpoints"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"SolverOptions.{f}={v!r} must be a positive integer.")
