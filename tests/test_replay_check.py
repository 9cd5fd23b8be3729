"""The checkpointed adjoint's replay check with a linear solver that is not bit-reproducible.

cuDSS's uniform batches on a GPU gave NaN adjoint gradients (the values were right): the reverse
sweep replays forward steps from records and checked that each replay ended on the next record
bit for bit, which a solver whose results differ in the last bits from call to call never passes.
Here a dense LU whose solutions are scaled by ``1 + jitter * s`` (``s`` = +-1 drawn at
random at each call, through a host callback) stands for such a solver, on the CPU.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffsoup as ds
from diffsoup.integrate import _checkpoint

_signs = np.random.default_rng(0)


def _sign(x):
    return np.full(np.shape(x), _signs.choice([-1.0, 1.0]), np.float64)


class _PreparedJittery(ds.linear.AbstractPreparedSolver):
    def __init__(self, solver, pattern, precision):
        super().__init__(solver, pattern, precision)
        self.dense = ds.linear.Dense().prepare(pattern, precision)

    def _raw_begin(self, values, slot):
        return self.dense._raw_begin(values, slot)

    def _raw_factor(self, workspace, values, slot):
        return self.dense._raw_factor(workspace, values, slot)

    def _raw_solve(self, factors, b, transpose, slot):
        x = self.dense._raw_solve(factors, b, transpose, slot)
        # The callback's operand depends on b, so that XLA cannot hoist it out of a loop.
        s = jax.pure_callback(_sign, jax.ShapeDtypeStruct((), jnp.float64), b.reshape(-1)[0], vmap_method="broadcast_all")
        return x * (1.0 + self.solver.jitter * s)

    def _raw_end(self, workspace, after):
        return self.dense._raw_end(workspace, after)


@dataclasses.dataclass(frozen=True)
class _Jittery(ds.linear.AbstractLinearSolver):
    jitter: float = 1e-15

    def prepare(self, pattern, precision, *, layout=None):
        return _PreparedJittery(self, pattern, precision)


# To t = 5 (past the discontinuity at 1.1): the jittery solves' host callbacks, ~15,000 per
# gradient, are most of the time; to t = 10 it took 4x as many.
T_EVAL = jnp.array([1.0, 2.5, 5.0])


def _gradient(linear_solver):
    """Gradient of a sum of squares of the Brusselator (N = 3) at three times, with few checkpoints
    so that the reverse sweep replays segments of several steps."""
    problem = ds.examples.brusselator_2d(3).build(linear_solver=linear_solver)
    p0 = problem.parameter_vector()

    def loss(p):
        sol = ds.simulate(problem, params=p, t_eval=T_EVAL, rtol=1e-8, atol=1e-10,
                          adjoint=ds.CheckpointAdjoint(checkpoints=4))  # fmt: skip
        return jnp.sum(sol.ys**2)

    return np.asarray(jax.grad(loss)(p0))


@pytest.fixture(scope="module")
def dense_gradient():
    return _gradient(ds.linear.Dense())


def test_rounding_level_differences_pass_the_replay_check(dense_gradient):
    got = _gradient(_Jittery(jitter=1e-15))
    assert np.all(np.isfinite(got))
    # The perturbed solves take slightly other steps (a different discrete solution, within rtol
    # 1e-8 of the same trajectory): the gradients agree to 2e-7 - 4e-7 (measured over three draws
    # of the signs; 1e-7 - 2.3e-6 to t = 10), not to rounding; the exact adjoint and forward
    # gradients agree to 5e-13.
    np.testing.assert_allclose(got, dense_gradient, rtol=5e-6)


def test_bit_for_bit_check_fails_the_same_solver(monkeypatch):
    """The case the tolerance is for: with bit-for-bit equality asked, the same solves give NaN."""
    monkeypatch.setattr(_checkpoint, "REPLAY_TIME_SHARE", 0.0)
    monkeypatch.setattr(_checkpoint, "REPLAY_STATE_SHARE", 0.0)
    assert np.all(np.isnan(_gradient(_Jittery(jitter=1e-15))))


def test_a_replay_that_does_not_retrace_is_still_caught():
    """Solutions 1e-9 off from call to call: the replays land whole steps and many tolerances away
    from the records, and the gradient is NaN rather than silently wrong."""
    assert np.all(np.isnan(_gradient(_Jittery(jitter=1e-9))))
