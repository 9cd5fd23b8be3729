"""Linear solvers behind one interface: ``Dense``, ``KLU`` (CPU) and ``CuDSS`` (GPU)."""

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


def default_solver(n_states: int, platform: str | None = None) -> LinearSolver:
    """The solver ``spec.build`` picks when none is given: dense LU for small systems, KLU on CPU,
    cuDSS on a GPU where it can run (dense LU otherwise)."""
    import jax

    platform = platform or jax.default_backend()
    if n_states <= 64:
        return Dense()
    if platform == "cpu":
        return KLU()
    if platform == "gpu" and has_cudss():
        return CuDSS()
    return Dense()
