"""Experiments grouped into programs (issue 40): loop-made functions of the same code and the same
constants share one group (one program per mode) and give the value of one shared function;
functions that capture different values stay apart and give the per-experiment value; many groups
from differing functions warn once; past ``max_program_groups`` ``ds.lower`` refuses before
compiling anything."""

import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import diffsoup as ds
from diffsoup.inference import Gaussian, InferenceProblem, Parameter, ProgramGroupsWarning
from diffsoup.inference.objective import _lower
from diffsoup.inference.objective._same_functions import function_key

TRUE = {"k1": 1.0, "k2": 0.5}
THETA = np.log10([1.2, 0.4])


def _problem():
    net = ds.ReactionNetwork(["A", "B"], [("A -> B", "k1"), ("B -> A", "k2")], dict(TRUE), name="pair")
    return net.to_spec(y0=[1.0, 0.0]).build()


def _study(observables, n=6):
    """``n`` experiments, experiment ``i`` observed through ``observables(i)``."""
    problem = _problem()
    times = np.array([0.5, 1.0, 2.0])
    exps = [ds.Experiment(f"e{i}", times, np.full((3, 1), 0.3 + 0.01 * i), noise=Gaussian(0.05),
                          y0={"A": 1.0 + 0.1 * i}, observables=observables(i)) for i in range(n)]  # fmt: skip
    return ds.Study(problem, exps, [Parameter(k, v, v / 10, v * 10) for k, v in TRUE.items()])


def _loop_made(scale):
    """A fresh function per call, the same code capturing ``scale`` in its closure."""
    return lambda y, p: y[1:] * scale


def test_loop_made_identical_functions_share_one_group():
    shared = lambda y, p: y[1:] * 2.0  # noqa: E731
    one = InferenceProblem(_study(lambda i: shared))
    many = InferenceProblem(_study(lambda i: _loop_made(2.0)))
    assert len(one.groups) == 1
    assert len(many.groups) == 1  # was 6 (one per function object)
    assert abs(ds.lower(many).value(THETA) - ds.lower(one).value(THETA)) <= 1e-12 * abs(ds.lower(one).value(THETA))


def test_functions_capturing_different_constants_stay_apart():
    scales = [1.0, 1.0, 2.0, 2.0]
    study = _study(lambda i: (lambda y, p, s=scales[i]: y[1:] * s), n=4)  # defaults differ
    closures = _study(lambda i: _loop_made(scales[i]), n=4)  # closures differ
    for s in (study, closures):
        problem = InferenceProblem(s)
        assert sorted(g.members for g in problem.groups) == [(0, 1), (2, 3)]
        # Reference: each experiment alone (its own function, its own program), summed.
        total = ds.lower(s).value(THETA)
        alone = sum(ds.lower(ds.Study(s.problem, [e], s.parameters)).value(THETA) for e in s.experiments)
        assert abs(total - alone) <= 1e-12 * abs(alone)

    def times(a):
        return lambda y, p: y * a

    assert function_key(times(np.array([1.0, 2.0]))) == function_key(times(np.array([1.0, 2.0])))
    assert function_key(times(np.array([1.0, -0.0]))) != function_key(times(np.array([1.0, 0.0])))
    assert function_key(times(jnp.ones(2))) == function_key(times(jnp.ones(2)))
    assert function_key(times(jnp.ones(2))) != function_key(times(jnp.zeros(2)))
    assert function_key(times([1.0])) != function_key(times([1.0]))  # a list: by identity


def test_many_differing_functions_warn_once():
    with pytest.warns(ProgramGroupsWarning) as record:
        problem = InferenceProblem(_study(lambda i: _loop_made(float(i))))
    assert len(problem.groups) == 6
    assert len([w for w in record if w.category is ProgramGroupsWarning]) == 1
    assert str(record[0].message).startswith(
        "6 experiments use 6 different observable functions: each group compiles its own program"
    )
    assert "define the function once" in str(record[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProgramGroupsWarning)
        InferenceProblem(_study(lambda i: _loop_made(2.0)))  # shared after all: no warning


def test_past_the_bound_lower_refuses_before_compiling(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("compiled past the bound")

    monkeypatch.setattr(_lower.LoweredStudy, "__init__", never)
    monkeypatch.setattr(_lower, "chunk_function", never)
    with pytest.warns(ProgramGroupsWarning):
        problem = InferenceProblem(_study(lambda i: _loop_made(float(i))))
    with pytest.raises(ValueError, match=r"split into 6 groups.*at most 3, max_program_groups.*"
                       r"6 experiments use 6 different observable functions.*define the function once"):
        ds.lower(problem, max_program_groups=3)
    with pytest.raises(ValueError, match="max_program_groups must be a positive integer"):
        ds.lower(problem, max_program_groups=0)
