"""Status codes of a solve: failures inside jit are values, turned into errors on the host."""

from __future__ import annotations

import enum

import numpy as np


class Status(enum.IntEnum):
    """Outcome of one solve (one per experiment under vmap)."""

    SUCCESS = 0
    MAX_STEPS = 1
    STEP_TOO_SMALL = 2
    NONFINITE_STATE = 3
    LINEAR_SOLVE_FAILED = 4
    STEADY_STATE_NOT_REACHED = 5

    @property
    def message(self) -> str:
        return _MESSAGES[self]


RUNNING = -1  # inside the loop only

_MESSAGES = {
    Status.SUCCESS: "success",
    Status.MAX_STEPS: "reached max_steps before the last output time; raise max_steps or loosen the tolerances",
    Status.STEP_TOO_SMALL: "the step size fell below the resolution of t (the problem may be singular there, "
    "or the tolerances too tight for the precision)",
    Status.NONFINITE_STATE: "the state became non-finite (NaN or inf): the solution blows up, or the "
    "initial state or parameters are not finite",
    Status.LINEAR_SOLVE_FAILED: "the linear solves failed (singular W = I/(h gamma) - J, or float32 refinement "
    "stalled); try solve_mode='fp64' or 'adaptive'",
    Status.STEADY_STATE_NOT_REACHED: "no steady state (t = inf outputs) within SteadyState.horizon or max_steps: the "
    "system may oscillate or drift; raise the horizon or max_steps, or loosen SteadyState's tolerances",
}


class SolveError(RuntimeError):
    """A solve did not reach the last output time (or a steady state); ``status`` holds the code(s)."""

    def __init__(self, status, where: str = ""):
        self.status = np.asarray(status)
        codes = sorted({int(c) for c in self.status.reshape(-1) if int(c) != 0})
        lines = [f"  {Status(c).name}: {Status(c).message}" for c in codes]
        count = int(np.sum(self.status != 0))
        total = int(self.status.size)
        head = f"ds.simulate failed{where}: {count} of {total} solve(s) did not succeed"
        super().__init__(head + "\n" + "\n".join(lines))
