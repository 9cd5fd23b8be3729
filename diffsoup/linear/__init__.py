"""Linear solvers behind one interface: ``Dense``, ``KLU`` (CPU) and ``CuDSS`` (GPU)."""

import jax

from ._base import AbstractLinearSolver as AbstractLinearSolver
from ._base import AbstractPreparedSolver as AbstractPreparedSolver
from ._base import Factorization as Factorization
from ._base import Factors as Factors
from ._base import LinearSolver as LinearSolver
from ._base import PreparedSolver as PreparedSolver
from ._base import SolveInfo as SolveInfo
from ._base import Workspace as Workspace
from ._dense import Dense as Dense
from ._klu import KLU as KLU
from ._cudss import CuDSS as CuDSS
from ._cudss import has_cudss as has_cudss


# Largest systems solved by batched dense LU when no solver is given, by platform. CPU: KLU wins
# above 64 states (bench_linear.py). GPU: dense LU batched over experiments beats cuDSS's uniform
# batches up to 512 states for the gradient (bench_gpu_study.py on an H200, 1,000 Brusselators:
# 128 states dense 2.4x faster in every mode; 512 states dense 1.5x faster for value_and_grad,
# cuDSS 1.3x faster for the value alone); above it the dense factors' n^3 work takes over.
DENSE_MAX_STATES = {"cpu": 64, "gpu": 512}


def default_solver(n_states: int, platform: str | None = None) -> LinearSolver:
    """The solver ``spec.build`` picks when none is given, by measured crossovers
    (:data:`DENSE_MAX_STATES`): dense LU up to 64 states on a CPU and 512 on a GPU; above that KLU
    on a CPU and cuDSS on a GPU where it can run (dense LU otherwise)."""
    platform = platform or jax.default_backend()
    if n_states <= DENSE_MAX_STATES.get(platform, DENSE_MAX_STATES["cpu"]):
        return Dense()
    if platform == "cpu":
        return KLU()
    if platform == "gpu" and has_cudss():
        return CuDSS()
    return Dense()
