"""The adjoint interface: how ``ds.simulate`` is differentiated (``adjoint=``).

An adjoint owns the whole solve: it runs the loop in a way that supports its direction of
differentiation (``ds.ForwardMode``: a plain loop that ``jax.jvp`` runs through;
``ds.CheckpointAdjoint``: a ``custom_vjp`` with a checkpointed reverse sweep), as diffrax's
``adjoint=`` does.
"""

from __future__ import annotations

import abc


class AbstractAdjoint(abc.ABC):
    """How a solve is differentiated; final implementations are frozen dataclasses (hashable)."""

    @abc.abstractmethod
    def solve(self, problem, cfg, y0, p, t0, t_eval, discs):
        """Run the solve: ``(ys, status, stats)`` for the built ``problem`` with the loop's
        settings ``cfg`` (a ``LoopConfig`` pytree: traced numbers, its method and solve modes
        static), from ``y0`` with parameters ``p``, outputs at ``t_eval`` and discontinuities
        ``discs``. ``cfg`` is not differentiated."""
