"""The public seam between a lowered study and its execution: ``restrict`` to a subset of the
experiments, ``evaluate`` into typed parts, ``combine_parts`` over a split. The parts of a split
(two groups of experiments, three pieces of unequal size) combine into the whole study's part for
every mode, to rounding; a restricted study is the objective of its own experiments (value =
scale ||r||^2 + offset, offsets adding up to the whole one); a DistributedStudy over an in-process
backend agrees with the local study and ``fit`` takes it; bad input is named."""

import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import diffsoup as ds
from diffsoup.distributed._run import DistributedStudy, serve_request
from diffsoup.inference import Gaussian, fit
from diffsoup.inference.objective._abstract_lowered import AbstractLoweredStudy
from diffsoup.inference.objective._parts import (
    GaussNewtonPart,
    GradientPart,
    HessianPart,
    JacobianPart,
    ResidualsPart,
    ValuePart,
    combine_parts,
)

sys.path.insert(0, os.path.dirname(__file__))
from test_study import THETA, tiny_study  # noqa: E402

MODES = ("value", "value_and_grad", "residuals", "jacobian", "gauss_newton", "hessian")
SPLIT = ([0, 3, 9], ["e1", "e2", "e4", "e5", "e7"], [6, 8])  # indices or ids; both groups in two pieces


def two_group_study():
    """tiny_study's 8 experiments and 2 observing A + B only (a second group: k = 1)."""
    base = tiny_study(8)
    rng = np.random.default_rng(7)
    extra = []

    def a_plus_b(y, p):
        return jnp.stack([y[0] + y[1]])

    for i in (8, 9):
        times = np.array([0.5, 1.5, 3.0])
        sol = ds.simulate(base.problem, [1.0 + 0.2 * i, 0.0, 0.0], times, None, rtol=1e-10, atol=1e-12)
        data = np.asarray(sol.ys)[:, :1] + np.asarray(sol.ys)[:, 1:2] + 0.02 * rng.standard_normal((3, 1))
        extra.append(ds.Experiment(f"e{i}", times, data, observables=a_plus_b,
                                   noise=Gaussian(0.02), y0={"A": 1.0 + 0.2 * i}))  # fmt: skip
    return ds.Study(base.problem, list(base.experiments) + extra, list(base.parameters))


def _rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


@pytest.fixture(scope="module")
def whole():
    low = ds.lower(two_group_study(), hessian="fd", experiments_per_chunk=2)  # several chunks of each group
    assert len(low.groups) == 2
    return low


@pytest.fixture(scope="module")
def pieces(whole):
    return [whole.restrict(s) for s in SPLIT]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_parts_of_a_split_combine_into_the_whole(whole, pieces, mode):
    full = whole.evaluate(mode, THETA)
    parts = [p.evaluate(mode, THETA) for p in pieces]
    joined = combine_parts(parts)
    assert type(joined) is type(full) and type(joined).mode == mode
    assert sorted(joined.steps) == sorted(full.steps) == list(range(10))
    assert joined.steps == full.steps and joined.failures == full.failures == {}
    if mode in ("value", "value_and_grad"):
        assert _rel(joined.value, full.value) < 1e-12
    if mode == "value_and_grad":
        assert _rel(joined.grad, full.grad) < 1e-12
    if mode in ("residuals", "jacobian"):
        assert joined.residuals.keys() == full.residuals.keys()
        for i in full.residuals:
            assert _rel(joined.residuals[i], full.residuals[i]) < 1e-12
    if mode == "jacobian":
        for i in full.jacobian:
            assert _rel(joined.jacobian[i], full.jacobian[i]) < 1e-12
    if mode == "gauss_newton":
        assert _rel(joined.sum_sq, full.sum_sq) < 1e-12
        assert _rel(joined.jtr, full.jtr) < 1e-12 and _rel(joined.jtj, full.jtj) < 1e-12
    if mode == "hessian":
        assert _rel(joined.hessian, full.hessian) < 1e-10  # differences of gradients over 2 fd_step


@pytest.mark.slow
def test_a_restricted_study_is_the_objective_of_its_experiments(whole, pieces):
    assert [p.experiment_indices for p in pieces] == [(0, 3, 9), (1, 2, 4, 5, 7), (6, 8)]
    assert pieces[1].experiment_ids == ("e1", "e2", "e4", "e5", "e7")
    assert _rel(sum(p.offset for p in pieces), whole.offset) < 1e-14
    a = pieces[0]
    v = a.value(THETA)
    r, J = a.residuals_and_jacobian(THETA)
    assert r.shape == (a.n_residuals,) and J.shape == (a.n_residuals, 3)
    assert a.n_residuals == 2 * 12 + 3  # e0 (3 times x 3), e3 (4 x 3), e9 (3 x 1)
    assert _rel(v, a.scale * r @ r + a.offset) < 1e-12  # the value is scale ||r||^2 + offset
    fv, fg, H = a.gauss_newton(THETA)
    assert _rel(fv, v) < 1e-12 and _rel(H, 2 * a.scale * J.T @ J) < 1e-12 and _rel(fg, 2 * a.scale * J.T @ r) < 1e-12
    # its residuals are the whole study's rows of its experiments
    rw = whole.residuals(THETA)
    for eid, sl in a.residual_slices.items():
        assert np.array_equal(r[sl], rw[whole.residual_slices[eid]])
    # the sum of the pieces' values is the whole value
    assert _rel(sum(p.value(THETA) for p in pieces), whole.value(THETA)) < 1e-12
    # steps are recorded for its experiments only
    assert np.all(a.steps[[0, 3, 9]] > 0) and np.all(a.steps[[1, 2, 4, 5, 6, 7, 8]] == -1)
    # a piece of a piece
    assert pieces[1].restrict(["e2"]).experiment_indices == (2,)


def test_restrict_and_combine_name_bad_input():
    low = ds.lower(tiny_study(4))
    piece = low.restrict([0, 1])
    with pytest.raises(ValueError, match=r"restrict: experiments \['e2'\] are not evaluated"):
        piece.restrict([1, 2])
    with pytest.raises(ValueError, match="'zz' is not an experiment id"):
        low.restrict(["zz"])
    with pytest.raises(ValueError, match="index 4 is out of range"):
        low.restrict([4])
    with pytest.raises(ValueError, match="named twice"):
        low.restrict([1, "e1"])
    with pytest.raises(ValueError, match="at least one"):
        low.restrict([])
    with pytest.raises(TypeError, match="sequence of study indices"):
        low.restrict("e1")
    with pytest.raises(ValueError, match="evaluate: unknown mode 'newton'"):
        low.evaluate("newton", THETA)
    with pytest.raises(ValueError, match=r"theta has shape \(2,\)"):
        low.evaluate("value", THETA[:2])
    a = ValuePart(value=1.0, steps={0: 5})
    b = ValuePart(value=2.0, steps={1: 7}, failures={"e1": ds.Status.MAX_STEPS})
    c = combine_parts([a, b])
    assert c.value == 3.0 and c.steps == {0: 5, 1: 7} and c.failures == {"e1": ds.Status.MAX_STEPS}
    with pytest.raises(ValueError, match=r"experiments \[0\] .* are in two parts"):
        combine_parts([a, a])
    with pytest.raises(TypeError, match="combine parts of one mode"):
        combine_parts([a, HessianPart(hessian=np.eye(2), steps={1: 1})])
    with pytest.raises(ValueError, match="no parts"):
        combine_parts([])
    with pytest.raises(TypeError, match="abstract"):
        AbstractLoweredStudy(low.problem)  # the interface has no evaluation of its own
    with pytest.raises(AttributeError):
        a.value = 2.0  # parts are frozen
    for part_type in (GradientPart, ResidualsPart, JacobianPart, GaussNewtonPart):
        assert part_type.mode in MODES


class SerialBackend:
    """Shards evaluated one after the other in this process (what a Dask run does on workers)."""

    def __init__(self, base, members):
        self.shards = [base.restrict(m) for m in members]
        self.calls = []

    def __call__(self, mode, argument):
        self.calls.append(mode)
        return [serve_request(s, mode, argument) for s in self.shards]


@pytest.mark.slow
def test_a_distributed_study_agrees_with_the_local_one_and_fits():
    study = tiny_study(6)
    local = ds.lower(study, hessian="fd", experiments_per_chunk=2)  # chunks of the shards' size: one program each
    members = [[0, 4], [1, 5], [2, 3]]
    backend = SerialBackend(local, members)
    dist = DistributedStudy(ds.lower(study, hessian="fd"), backend, members, "f" * 16)
    assert isinstance(dist, AbstractLoweredStudy) and not isinstance(dist, ds.inference.LoweredStudy)
    assert dist.shards == (("e0", "e4"), ("e1", "e5"), ("e2", "e3"))
    assert dist.placement["e3"] == 2 and dist.theta_names == local.theta_names and dist.offset == local.offset
    assert dist.compile(["value", "gauss_newton"]) is dist and backend.calls == ["compile"]
    assert _rel(dist.value(THETA), local.value(THETA)) < 1e-12
    (v, g), (v0, g0) = dist.value_and_grad(THETA), local.value_and_grad(THETA)
    assert _rel(v, v0) < 1e-12 and _rel(g, g0) < 1e-12
    assert _rel(dist.residuals(THETA), local.residuals(THETA)) < 1e-12
    (r, J), (r0, J0) = dist.residuals_and_jacobian(THETA), local.residuals_and_jacobian(THETA)
    assert _rel(r, r0) < 1e-12 and _rel(J, J0) < 1e-12
    for x, y in zip(dist.gauss_newton(THETA), local.gauss_newton(THETA)):
        assert _rel(x, y) < 1e-12
    assert _rel(dist.hessian(THETA), local.hessian(THETA)) < 1e-10
    assert np.array_equal(dist.steps, local.steps) and dist.evaluations == 6
    start = np.log10([1.2, 0.45, 0.33])
    res, ref = fit(dist, starts=0, x0=start), fit(local, starts=0, x0=start)
    assert np.max(np.abs(res.theta - ref.theta)) < 1e-10 and res.n_evaluations == ref.n_evaluations
    with pytest.raises(ValueError, match="must split the base study's experiments"):
        DistributedStudy(local, backend, [[0, 1]], "f" * 16)


@pytest.mark.slow
def test_failures_travel_in_the_parts():
    study = tiny_study(4)
    members = [[0, 1], [2, 3]]
    base = ds.lower(study, solver=ds.inference.SolverOptions(max_steps=12), experiments_per_chunk=2)
    backend = SerialBackend(base, members)
    dist = DistributedStudy(base, backend, members, "0" * 16)
    assert np.isnan(dist.value(THETA))
    assert dist.last_failures == {e: ds.Status.MAX_STEPS for e in ("e0", "e1", "e2", "e3")}
    assert backend.shards[1].last_failures.keys() == {"e2", "e3"}
    assert np.all(dist.steps > 0)
