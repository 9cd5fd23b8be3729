"""balance_owners: consecutive blocks of ceil(n_owners / lanes) owners, owners never split, loads
balanced within the heaviest owner's weight (hypothesis property tests), and the study form."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import diffsoup as ds
from diffsoup.inference import Parameter, balance_owners


def _owners_study(sizes, weights):
    """Experiments e{i} of owner o{j}: ``sizes[j]`` experiments with weight ``weights[j]`` each."""
    exps, w = [], {}
    for j, (n, wt) in enumerate(zip(sizes, weights)):
        for i in range(n):
            e = ds.Experiment(f"o{j}-e{i}", [1.0], [[1.0, 1.0]], groups={"site": f"o{j}"})
            exps.append(e)
            w[e.id] = wt
    return exps, w


def _check(ordered, original, weight, lanes, owner_of):
    owners = list(dict.fromkeys(owner_of(e) for e in ordered))
    # No owner is split: each owner's experiments are contiguous and in their original order.
    seen = [owner_of(e) for e in ordered]
    for o in owners:
        pos = [i for i, s in enumerate(seen) if s == o]
        assert pos == list(range(pos[0], pos[0] + len(pos)))
        assert [e.id for e in ordered if owner_of(e) == o] == [e.id for e in original if owner_of(e) == o]
    assert sorted(e.id for e in ordered) == sorted(e.id for e in original)
    # Blocks: consecutive runs of ceil(n / lanes) owners.
    cap = math.ceil(len(owners) / lanes)
    loads = np.zeros(lanes)
    counts = np.zeros(lanes, dtype=int)
    for b in range(lanes):
        block = owners[b * cap : (b + 1) * cap]
        counts[b] = len(block)
        loads[b] = sum(weight(e) for e in ordered if owner_of(e) in block)
    assert counts.sum() == len(owners) and np.all(counts <= cap)
    full = counts == cap
    heaviest = max(sum(weight(e) for e in ordered if owner_of(e) == o) for o in owners)
    # Blocks with room until the end (all full) balance within the heaviest owner's weight.
    if full.sum() >= 2:
        assert loads[full].max() - loads[full].min() <= heaviest + 1e-9
    return loads


@settings(max_examples=200, deadline=None)
@given(
    weights=st.lists(st.integers(0, 1000), min_size=1, max_size=40),
    lanes=st.integers(1, 9),
)
def test_experiments_as_owners(weights, lanes):
    exps = [ds.Experiment(f"e{i}", [1.0], [[1.0]]) for i in range(len(weights))]
    w = {e.id: float(x) for e, x in zip(exps, weights)}
    out = balance_owners(exps, lanes, weight=lambda e: w[e.id])
    assert isinstance(out, tuple)
    _check(out, exps, lambda e: w[e.id], lanes, lambda e: e.id)


@settings(max_examples=100, deadline=None)
@given(
    owners=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 500)), min_size=1, max_size=25),
    lanes=st.integers(1, 6),
)
def test_outer_level_members_are_owners(owners, lanes, tiny_problem):
    sizes, weights = zip(*owners)
    exps, w = _owners_study(sizes, weights)
    study = ds.Study(tiny_problem, exps, [Parameter("k", 1.0, 0.1, 10.0)], levels=("site",))
    out = balance_owners(study, lanes, weight=lambda e: w[e.id])
    assert isinstance(out, ds.Study) and out.levels == ("site",)
    _check(out.experiments, exps, lambda e: w[e.id], lanes, lambda e: e.groups["site"])


def test_default_weight_counts_measured_values():
    data = [[[1.0, np.nan]], [[np.nan, 1.0]], [[2.0, 2.0]], [[3.0, 3.0]]]
    exps = [ds.Experiment(f"e{i}", [1.0], d) for i, d in enumerate(data)]
    out = balance_owners(exps, 2)
    # Weights 1, 1, 2, 2: e2 -> b0, e3 -> b1, e0 -> b0, e1 -> b1; blocks keep study order.
    assert [e.id for e in out] == ["e0", "e2", "e1", "e3"]


def test_heaviest_first_to_lightest_block_with_room():
    exps = [ds.Experiment(f"e{i}", [1.0], [[1.0]]) for i in range(5)]
    w = {"e0": 1.0, "e1": 9.0, "e2": 5.0, "e3": 4.0, "e4": 3.0}
    out = balance_owners(exps, 2, weight=lambda e: w[e.id])
    # Rooms 3 and 2: e1 -> b0 (9), e2 -> b1 (5), e3 -> b1 (9, full), e4 -> b0 (12), e0 -> b0 (13).
    assert [e.id for e in out] == ["e0", "e1", "e4", "e2", "e3"]


def test_bad_lanes_and_weights():
    exps = [ds.Experiment("e0", [1.0], [[1.0]])]
    with pytest.raises(ValueError, match="lanes"):
        balance_owners(exps, 0)
    with pytest.raises(ValueError, match="weight of experiment 'e0'"):
        balance_owners(exps, 1, weight=lambda e: -1.0)


@pytest.fixture(scope="module")
def tiny_problem():
    net = ds.ReactionNetwork(["A", "B"], [("A -> B", "k")], {"k": 1.0})
    return net.to_spec(y0=[1.0, 0.0]).build()
