"""``ds.ForwardMode``: differentiate a solve by forward mode only."""

from __future__ import annotations

import dataclasses
import functools
from typing import final

import jax

from ._adjoint import AbstractAdjoint
from ._loop import forward_solve


@final
@dataclasses.dataclass(frozen=True)
class ForwardMode(AbstractAdjoint):
    """Differentiate by forward mode only (``jax.jvp``/``jax.jacfwd``, Gauss-Newton Jacobians).

    The loop is a plain ``lax.while_loop``: tangents ride along each step and reuse its
    factorization. Reverse mode (``jax.grad``) is not available with it.
    """

    def solve(self, problem, cfg, y0, p, t0, t_eval, discs):
        return solve_forward(problem, cfg, y0, p, t0, t_eval, discs)


@functools.partial(jax.jit, static_argnums=(0,))
def solve_forward(problem, cfg, y0, p, t0, t_eval, discs):
    """The forward pass, jitted per problem and static settings (``cfg``'s numbers are operands):
    ``(ys, status, stats)``."""
    return forward_solve(problem, cfg, y0, p, t0, t_eval, discs)
