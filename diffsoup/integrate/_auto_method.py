"""``ds.AutoMethod``: pick the integrator from the problem (``ds.simulate(..., method=ds.AutoMethod())``).

The rule (``benchmarks/bench_stiff.py`` on a 2-core CPU): at a few thousand states with a sparse
factorization, the factorization is most of a step's cost, and BDF, which keeps one across tens
of steps, wins (the 2-D Brusselator: N = 32, 2,048 states, and N = 64, 8,192 states); on small
systems a step's fixed costs dominate and Rodas5P, which takes several times fewer steps, wins
(ROBER, 3 states). Under ``vmap`` BDF's reuse is lost (a conditional whose lanes disagree runs
both branches: every lane factors at every attempt), which again favours Rodas5P: batches of
experiments are batches of small systems in practice, so the size rule serves them too.
"""

from __future__ import annotations

import dataclasses
from typing import final

from ..linear import KLU
from ._bdf import BDF
from ._method import AbstractIntegrator
from ._rodas5p import Rodas5P


@final
@dataclasses.dataclass(frozen=True)
class AutoMethod:
    """Choose the integrator when the solve is set up: ``bdf`` for problems of at least
    ``min_states_for_bdf`` states factored by ``ds.linear.KLU`` (sparse, on the CPU),
    ``rosenbrock`` otherwise.

    Args:
        min_states_for_bdf: the size from which BDF is chosen (1,000: between the benchmark's
            512 states, where the two were within noise of each other, and 2,048, where BDF won).
        bdf: the BDF to use.
        rosenbrock: the method for the other problems.

    Raises:
        ValueError: for a ``min_states_for_bdf`` below 1; TypeError for methods of the wrong kind.
    """

    min_states_for_bdf: int = 1000
    bdf: AbstractIntegrator = BDF()
    rosenbrock: AbstractIntegrator = Rodas5P()

    def __post_init__(self):
        if isinstance(self.min_states_for_bdf, bool) or int(self.min_states_for_bdf) < 1:
            raise ValueError(f"AutoMethod.min_states_for_bdf={self.min_states_for_bdf!r} must be a positive integer.")
        for name in ("bdf", "rosenbrock"):
            if not isinstance(getattr(self, name), AbstractIntegrator):
                raise TypeError(f"AutoMethod.{name}={getattr(self, name)!r} must be a diffsoup integrator.")

    def choose(self, problem) -> AbstractIntegrator:
        """The method for ``problem`` (a built ``ds.Problem``)."""
        sparse_cpu = isinstance(problem.prepared.solver, KLU)
        return self.bdf if sparse_cpu and problem.n_states >= self.min_states_for_bdf else self.rosenbrock
