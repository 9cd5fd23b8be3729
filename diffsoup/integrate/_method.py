"""The integrator interface: what the integration loop needs from a method.

The loop (``_loop.py``) owns what every method shares: step-size control, landing on output times
and discontinuities, outputs, status codes and counters. A method owns its step: from ``(t, y)``
and a step size ``h`` it proposes ``y(t + h)`` and an error estimate, factoring and solving as it
needs, and it may carry a typed state of its own across steps (a Rosenbrock method keeps the
Jacobian for the retry after a rejection; a multistep method would keep its history and its
current order there).

A method whose accepted step can be recomputed as a differentiable function of ``(y, p)`` also
implements :class:`AbstractReversibleIntegrator`, which is what the checkpointed adjoint needs.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar, NamedTuple


class Work(NamedTuple):
    """What one step attempt cost (int32 scalars, or Python ints). The Newton counters are those
    of methods that iterate (reported in ``Solution.stats`` when the method sets
    :attr:`AbstractIntegrator.newton_stats`)."""

    n_jac: Any
    n_factor: Any
    n_solves: Any
    n_ir_steps: Any
    n_fallbacks: Any
    n_rhs: Any
    n_newton_iters: Any = 0
    n_newton_failures: Any = 0


class Attempt(NamedTuple):
    """A method's proposal for one step.

    Attributes:
        y: the state at ``t + h``, if the loop accepts the step.
        error: the local error estimate (a vector; the loop takes its weighted RMS norm).
        linear_ok: every linear solve succeeded (else, a step that cannot be retried ends the
            solve as ``LINEAR_SOLVE_FAILED``).
        converged: the method's own iterations converged (always true for methods without
            any); a step that did not is rejected and retried with a smaller step.
        work: counters of the attempt.
        state: the method's state after the attempt; :meth:`AbstractIntegrator.conclude` then
            sees whether the loop accepted it.
    """

    y: Any
    error: Any
    linear_ok: Any
    converged: Any
    work: Work
    state: Any


class AbstractIntegrator(abc.ABC):
    """A method the integration loop drives, one attempt at a time (``ds.Rodas5P()``,
    ``ds.integrate.ImplicitEuler()``).

    Implementations are frozen dataclasses (hashable: a method is part of the compiled program).
    Every hook is traced inside ``jit`` (and ``vmap``, and forward-mode autodiff).

    Class attributes a method may set (the defaults suit one-step methods):

    * ``lands_evenly``: when an output time or discontinuity lies between one and two steps
      ahead, the loop takes two equal steps to it instead of a full step and a sliver (a
      multistep method's history does not survive a sliver followed by a large step).
    * ``newton_stats``: ``Solution.stats`` also reports ``n_newton_iters`` and
      ``n_newton_failures`` (:class:`Work`'s Newton counters).
    """

    lands_evenly: ClassVar[bool] = False
    newton_stats: ClassVar[bool] = False

    @property
    @abc.abstractmethod
    def order(self) -> int:
        """Order of the solution."""

    @property
    @abc.abstractmethod
    def error_order(self) -> int:
        """Order of the embedded solution the error estimate compares with: the estimate grows as
        ``h ** (error_order + 1)``, which sets the first step size, and a rejected step shrinks
        as ``err ** (-1 / error_order)``."""

    @abc.abstractmethod
    def init(self, problem, t0, y0, p, f0) -> Any:
        """The method's state before the first step (``f0 = rhs(t0, y0, p)``); a pytree whose
        structure every later state keeps (it is part of the loop's carry)."""

    def start(self, problem, cfg, workspace, t0, y0, p, f0) -> Any:
        """The state before the first step as the loop builds it, with the loop's settings and the
        linear solver's workspace at hand (a method that keeps factors across steps needs their
        structure). Default: :meth:`init`."""
        return self.init(problem, t0, y0, p, f0)

    def proposed_step(self, state) -> Any:
        """The next step size, for a method that chooses its own (a variable-order method picks
        step size and order together); None (the default) leaves it to the loop's controller.
        ``state`` is the one :meth:`conclude` returned. Not consulted under ``ConstantStep``."""
        return None

    @abc.abstractmethod
    def attempt(self, problem, cfg, workspace, state, t, y, h, p, t_cap) -> Attempt:
        """One attempt of a step from ``(t, y)`` with step size ``h``.

        Args:
            problem: the built problem (its ``rhs``, ``jacobian_values``, ``prepared`` solver).
            cfg: the loop's settings (a ``LoopConfig``: ``rtol``, ``atol`` per state, solve
                ``modes``; its numbers are traced).
            workspace: the linear solver's workspace for this solve (``prepared.begin``).
            state: the method's state from :meth:`init` or the last :meth:`conclude`.
            t_cap: latest time the right-hand side may be evaluated at (just below a
                discontinuity the step lands on; ``inf`` otherwise).
        """

    @abc.abstractmethod
    def conclude(self, state, accepted) -> Any:
        """The method's state after the loop accepted (``accepted`` true) or rejected the attempt
        whose :attr:`Attempt.state` is ``state``."""


class AbstractReversibleIntegrator(AbstractIntegrator):
    """A method whose accepted step is a differentiable function of ``(y, p)`` (and of a history
    of its own, for a multistep method): what the checkpointed adjoint (``ds.CheckpointAdjoint``)
    needs to run its reverse sweep.

    The adjoint records, every so often, the loop's state on arrival at a step and
    :meth:`checkpoint` of the method's state; it replays segments of steps from those records
    (from :meth:`resume`) and differentiates each accepted step with :meth:`reverse_transition`.

    A one-step method implements :meth:`reverse_step` (the step as a function of ``(y, p)``) and
    nothing more. A method whose step also reads values it carried from earlier steps (a
    multistep method's history) declares them with :meth:`history` and :meth:`initial_history`
    and implements :meth:`reverse_transition` instead: the reverse sweep then carries a cotangent
    for that history as well as for ``y``. The rejected attempts before an accepted step must not
    change what :meth:`reverse_transition` reads from the state on arrival.
    """

    @abc.abstractmethod
    def checkpoint(self, state) -> Any:
        """What a step record keeps of the method's state on arrival at a step (a pytree)."""

    @abc.abstractmethod
    def resume(self, template, saved) -> Any:
        """The method's state on arrival at a recorded step, from :meth:`checkpoint`'s ``saved``
        and a ``template`` state (from :meth:`init`) for everything else."""

    def history(self, state) -> Any:
        """The values in ``state`` that an accepted step depends on differentiably besides ``y``
        (a pytree of arrays of the compute dtype); ``()`` for a one-step method."""
        return ()

    def initial_history(self, problem, t0, y0, p) -> Any:
        """:meth:`history` of the state before the first step, as a differentiable function of
        ``(y0, p)`` (the reverse sweep ends with its vector-Jacobian product)."""
        return ()

    def reverse_transition(self, problem, cfg, modes, workspace, state, history, t, y, h, p, t_cap):
        """The accepted step from ``(t, y)`` of size ``h`` as a function of ``(y, history, p)``,
        for ``jax.vjp``: returns ``(y(t + h), history after the step)``; ``state`` is the
        method's state on arrival (:meth:`resume` of the record) and ``cfg`` the loop's
        settings, for everything not differentiated. Default: :meth:`reverse_step` and an empty
        history."""
        return self.reverse_step(problem, modes, workspace, t, y, h, p, t_cap), ()

    def reverse_step(self, problem, modes, workspace, t, y, h, p, t_cap):
        """The accepted step from ``(t, y)`` of size ``h`` as a function of ``(y, p)``, for
        ``jax.vjp``: returns ``y(t + h)``, recomputing what it needs (its linear solves use
        ``custom_linear_solve`` with transposed solves in ``modes.reverse``). A one-step method
        implements this; a method with a :meth:`history` implements :meth:`reverse_transition`."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement reverse_step (a one-step method) or reverse_transition."
        )
