"""Outputs at ``t = +inf``: the steady state (:class:`SteadyState`, the criterion the loop evaluates).

``ds.simulate`` reads ``t_eval`` entries equal to ``+inf`` (at its end) as the steady state: past
the last finite output the solve goes on until ``max_i |f_i(y)| / (atol_i + rtol |y_i|) <= 1``
holds at an accepted step, and writes that step's state into every ``+inf`` output. The test costs
one right-hand side per accepted step of that last stretch, and only programs that have ``+inf``
outputs contain it (the :class:`SteadyCriterion` in the loop's settings is their static flag).

Derivatives are those of the discrete solution with the accepted steps held fixed, as everywhere
in diffsoup: the steady output is the state after the last accepted step, differentiated through
every step. The sensitivities relax with the same rates as the state, so when the solve starts
away from the steady state (the transient moves every direction the parameters move) this agrees
with the implicit-function derivative ``dy*/dp = -J^{-1} df/dp`` (conserved quantities kept) to
about the tolerances. A solve that starts at or very near a steady state stops after a few short
steps, before the sensitivities have relaxed: starting exactly at it, the derivative is that of
the initial state. Put a finite output time before the ``+inf`` ones to make such a solve run
long enough (a few times the slowest relaxation time). A study's pre-equilibrations do not depend
on this: they differentiate their steady state by the implicit function theorem
(:mod:`diffsoup.integrate._steady_state_derivative`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SteadyState:
    """When ``+inf`` outputs are steady: ``simulate(..., steady_state=SteadyState(...))``.

    The state is steady at an accepted step when every state's rate of change is within its
    tolerance per unit time: ``max_i |f_i(t, y)| / (atol_i + rtol |y_i|) <= 1``. What is left to
    go is then about ``|f| / lambda`` for the slowest decay rate ``lambda`` of the system: for
    slow systems tighten ``rtol``/``atol``.

    Args:
        rtol: relative tolerance of the test. None (default): the solve's own ``rtol``, so the
            state counts as steady once it moves per unit time by less than the accuracy the
            solve already keeps for it (AMICI's default too).
        atol: absolute tolerance(s), a scalar or one per state. None (default): the solve's ``atol``.
        horizon: how long past the last finite output (or ``t0``) the solve may look for it before
            it stops with ``Status.STEADY_STATE_NOT_REACHED``. Default ``1e9``: far beyond the
            time scales of models in seconds, minutes or hours (1e9 s is 30 years), and cheap to
            reach once the state settles (the steps grow up to tenfold each). A budget of
            ``max_steps`` running out during the search also reports ``STEADY_STATE_NOT_REACHED``
            (an oscillating system never settles).

    Its numbers are operands of the compiled solve (new values compile nothing) and may be traced.
    """

    rtol: Any = None
    atol: Any = None
    horizon: Any = 1e9

    def __post_init__(self):
        # Only concrete numbers are checked: JAX rebuilds this pytree with tracers and placeholders.
        for name in ("rtol", "atol", "horizon"):
            if isinstance(getattr(self, name), (str, bool)):
                raise TypeError(f"SteadyState.{name}={getattr(self, name)!r} must be a number.")
        for name in ("rtol", "horizon"):
            value = getattr(self, name)
            if not _is_number(value):
                continue
            if not float(value) > 0 or (name == "rtol" and not np.isfinite(float(value))):
                finite = " and finite" if name == "rtol" else ""
                raise ValueError(f"SteadyState.{name}={value!r} must be positive{finite}.")
        if _is_number(self.atol) or isinstance(self.atol, (list, tuple)):
            arr = np.asarray(self.atol, dtype=np.float64)
            if arr.ndim > 1 or not (np.all(arr > 0) and np.all(np.isfinite(arr))):
                raise ValueError(
                    f"SteadyState.atol={self.atol!r} must be positive and finite (a scalar or one per state)."
                )


def _is_number(x) -> bool:
    return isinstance(x, (int, float, np.number, np.ndarray)) and not isinstance(x, bool)


class SteadyCriterion(NamedTuple):
    """The steady-state test as the loop runs it (operands of the compiled solve): tolerances
    ``rtol`` (scalar) and ``atol`` ``(n,)``, and ``t_end``, the time at which the search gives up."""

    rtol: Any
    atol: Any
    t_end: Any


def is_steady(criterion: SteadyCriterion, f, y):
    """Whether ``max_i |f_i| / (atol_i + rtol |y_i|) <= 1`` (no derivative: a decision)."""
    f, y = jax.lax.stop_gradient((f, y))
    return jnp.max(jnp.abs(f) / (criterion.atol + criterion.rtol * jnp.abs(y))) <= 1.0


def steady_criterion(rtol, atol, horizon, t0, t_eval) -> SteadyCriterion:
    """The test for a solve from ``t0`` with outputs ``t_eval``: the search starts at the last
    finite output (or ``t0``) and gives up ``horizon`` later."""
    start = jnp.maximum(t0, jnp.max(jnp.where(jnp.isfinite(t_eval), t_eval, t0)))
    return SteadyCriterion(rtol, atol, (start + horizon).astype(t_eval.dtype))
