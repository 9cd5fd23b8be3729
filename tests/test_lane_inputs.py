"""The packed lane inputs: one typed pytree (``LaneInputs``) whose fields one function allocates,
filled alike from ``Experiment`` objects and from arrays (host work only: nothing compiles).

Independent facts: the same experiments held as objects and as arrays pack to equal fields; a
padding lane is not valid and measures nothing; the fields present are the group's features'."""

import jax
import numpy as np

import diffsoup as ds
from diffsoup.inference import InferenceProblem
from diffsoup.inference.objective._lane_inputs import LaneInputs, allocate
from test_study import tiny_study
from test_study_arrays import arrays_of


def _pack(study, order):
    problem = InferenceProblem(study)
    (group,) = problem.groups
    return group, problem.pack(group, order)


def test_objects_and_arrays_pack_the_same_fields_and_numbers():
    objects = tiny_study()
    arrays = ds.Study.from_arrays(objects.problem, noise=ds.inference.Gaussian(0.02), parameters=objects.parameters,
                                  **arrays_of(objects))  # fmt: skip
    order = [3, 0, 5, -1]
    group_o, a = _pack(objects, order)
    group_a, b = _pack(arrays, order)
    assert isinstance(a, LaneInputs) and isinstance(b, LaneInputs)
    assert [n for n, _ in a.items()] == [n for n, _ in b.items()]
    for (name, x), (_, y) in zip(a.items(), b.items()):
        assert x.dtype == y.dtype and x.shape == y.shape, name
        if name == "sigma":  # a spread is read where a value is measured (the paths pad it differently)
            x, y = np.where(a.mask, x, 0.0), np.where(b.mask, y, 0.0)
        np.testing.assert_array_equal(x, y, err_msg=name)
    # The padding lane: not valid, nothing measured, no constant.
    assert a.valid.tolist() == [True, True, True, False] and not a.mask[3].any() and a.const[3] == 0.0
    # k3 fixed by experiment 3's conditions: its entry -1 and the value in p_fixed.
    k3 = objects.problem.parameter_names.index("k3")
    assert a.p_entry[0, k3] == -1 and a.p_fixed[0, k3] == 0.3 and a.p_entry[1, k3] >= 0
    # The structure is the allocation's: the same pytree as allocate gives for the group.
    empty = allocate(group_o, len(order), objects.problem.n_states, len(objects.problem.parameter_names))
    assert jax.tree.structure(empty) == jax.tree.structure(a) == jax.tree.structure(b)
    assert a.sigma_entries is None and a.win_idx is None and a.pre_y0 is None  # features the group lacks


def test_objects_are_packed_once_into_a_block_and_chunks_take_its_rows(monkeypatch):
    """Studies of objects and of arrays end in the same representation: per group one block of
    arrays with an experiment axis. A group of objects is packed once per problem (a chunk's lanes
    are rows of it); a study held as arrays is its own block (each chunk gathered from it, the
    study not copied). Both give the same chunk."""
    from diffsoup.inference.objective import _study_rows

    calls = []
    for name in ("pack_experiments", "pack_arrays"):
        original = getattr(_study_rows, name)
        monkeypatch.setattr(_study_rows, name, lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k))
    objects = tiny_study()
    arrays = ds.Study.from_arrays(objects.problem, noise=ds.inference.Gaussian(0.02), parameters=objects.parameters,
                                  **arrays_of(objects))  # fmt: skip
    order = [6, 2, -1]
    problem = InferenceProblem(objects)
    (block,) = problem.row_blocks.blocks
    assert calls == ["pack_experiments"]  # one fill for the whole group
    assert block.rows.valid.shape == (8,) and block.rows.valid.all() and block.rows.data.shape == (8, 4, 3)
    a = problem.pack(block.group, order)
    assert calls == ["pack_experiments"]  # a chunk packs nothing more
    np.testing.assert_array_equal(a.times, block.rows.times[[6, 2, 0]])
    np.testing.assert_array_equal(a.data[:2], block.rows.data[[6, 2]])
    assert a.valid.tolist() == [True, True, False] and not a.mask[2].any() and a.const[2] == 0.0
    assert (a.data[2] == 1.0).all() and block.rows.valid.all()  # the block itself unchanged
    calls.clear()
    from_arrays = InferenceProblem(arrays)
    assert calls == []  # nothing packed for the whole study
    (array_block,) = from_arrays.row_blocks.blocks
    b = from_arrays.pack(array_block.group, order)
    assert calls == ["pack_arrays"]
    for (name, x), (_, y) in zip(a.items(), b.items()):
        if name == "sigma":
            x, y = np.where(a.mask, x, 0.0), np.where(b.mask, y, 0.0)
        np.testing.assert_array_equal(x, y, err_msg=name)
    # The entries each block reads agree: the model parameters' and the spreads'.
    for field in ("p_entry", "sigma_entry", "sigma_entries", "y0_entry", "win_idx"):
        assert block.entries(field) == array_block.entries(field), field
    assert block.entries("p_entry")
