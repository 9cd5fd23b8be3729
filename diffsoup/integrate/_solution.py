"""What ``ds.simulate`` returns: :class:`Solution`."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from ._status import SolveError, Status


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Solution:
    """States at the requested times and what it took to get them.

    Attributes:
        ts: the output times, ``(m,)`` (``+inf`` for steady-state outputs).
        ys: the states at those times, ``(m, n)`` (at ``+inf``: the steady state, see
            :class:`~diffsoup.integrate.SteadyState`); after a failure, the times the solve did
            not reach hold NaN (check ``status``).
        status: a :class:`Status` code (int32; one per experiment under vmap).
        stats: counters (int32): ``n_steps`` (accepted), ``n_rejected``, ``n_jac`` (Jacobian
            evaluations), ``n_factor`` (factorizations), ``n_solves``, ``n_ir_steps`` (refinement
            steps), ``n_fallbacks`` (adaptive float64 fallbacks), ``n_rhs`` (right-hand-side
            evaluations, Jacobian colors included).
    """

    ts: Any
    ys: Any
    status: Any
    stats: dict

    @property
    def ok(self) -> bool:
        """True when every solve succeeded (host-side)."""
        return bool(np.all(np.asarray(self.status) == Status.SUCCESS))

    def raise_if_failed(self) -> "Solution":
        """Raise :class:`SolveError` naming the failure(s); return ``self`` otherwise."""
        if not self.ok:
            raise SolveError(self.status)
        return self
