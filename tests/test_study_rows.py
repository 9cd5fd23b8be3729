"""What a study knows of its rows (``Study.rows``, ``ids``, ``times_of``, ``n_observables``,
``members``, ``shooting``, ``shape_examples``) and ``InferenceProblem.predict_arrays`` are the same
whether the study was built from ``ds.Experiment`` objects or from arrays; the objective and its
gradient too (to rounding: the two readers sum in another order)."""

import numpy as np
import pytest

import diffsoup as ds
from diffsoup.inference import Gaussian, InferenceProblem, Parameter

from test_study import THETA, tiny_study
from test_study_arrays import _levels_objects, arrays_of


@pytest.fixture(scope="module")
def pair():
    objects = tiny_study()
    arrays = ds.Study.from_arrays(objects.problem, noise=Gaussian(0.02), parameters=objects.parameters,
                                  **arrays_of(objects))  # fmt: skip
    return objects, arrays


def test_rows_of_objects_and_of_arrays_agree(pair):
    objects, arrays = pair
    assert objects.ids == arrays.ids == tuple(f"e{i}" for i in range(8))
    assert objects.n_measured == arrays.n_measured == sum(int(np.isfinite(e.data).sum()) for e in objects.experiments)
    assert objects.n_observables == arrays.n_observables == 3
    np.testing.assert_array_equal(objects.rows.n_times, arrays.rows.n_times)
    np.testing.assert_array_equal(objects.rows.n_times, [3, 4] * 4)
    for i, e in enumerate(objects.experiments):
        np.testing.assert_array_equal(objects.times_of(i), e.times)
        np.testing.assert_array_equal(arrays.times_of(i), e.times)
        assert objects.index_of(e.id) == arrays.index_of(e.id) == i
    assert objects.index_of("nope") is arrays.index_of("nope") is None
    assert objects.shooting == arrays.shooting == ()
    # Objects: every experiment is its own shape; arrays: one shape, the first row stands for it.
    assert [e.id for e in objects.shape_examples()] == list(objects.ids)
    assert [e.id for e in arrays.shape_examples()] == ["e0"]


def test_members_of_levels_agree():
    objects, sites = _levels_objects()
    a = arrays_of(objects)
    a["data"] = np.where(np.isfinite(a["data"]), np.abs(a["data"]) + 0.01, np.nan)
    arrays = ds.Study.from_arrays(objects.problem, noise=ds.inference.LogNormal("sd"), groups={"site": sites},
                                  parameters=objects.parameters, **a)  # fmt: skip
    assert objects.members("site") == arrays.members("site") == ("south", "north")
    assert objects.members("experiment") == arrays.members("experiment") == objects.ids
    with pytest.raises(ValueError, match="unknown level 'ward'"):
        objects.members("ward")


def test_objective_gradient_and_predictions_agree(pair):
    objects, arrays = pair
    po, pa = InferenceProblem(objects), InferenceProblem(arrays)
    assert po.offset == pytest.approx(pa.offset, rel=1e-12)
    lo, la = ds.lower(po), ds.lower(pa)
    vo, go = lo.value_and_grad(THETA)
    va, ga = la.value_and_grad(THETA)
    np.testing.assert_allclose(va, vo, rtol=1e-12)
    np.testing.assert_allclose(ga, go, rtol=1e-9)
    ao, aa = po.predict_arrays(THETA), pa.predict_arrays(THETA)
    assert ao["states"].shape == aa["states"].shape == (8, 4, 3)
    np.testing.assert_array_equal(ao["status"], aa["status"])
    for key in ("states", "observables"):
        np.testing.assert_allclose(ao[key], aa[key], rtol=1e-12, atol=1e-14)
        # NaN exactly at the padded times (experiments of 3 times).
        np.testing.assert_array_equal(np.isnan(ao[key][:, 3]).all(axis=-1), [True, False] * 4)


def test_predict_arrays_of_objects_of_other_shapes_pads_with_nan():
    """Experiments of two observables and of three: the arrays take the most, each row is its
    experiment's ``predict`` and NaN past its times and observables."""
    base = tiny_study(n=2)
    e0, e1 = base.experiments
    first_two = ds.Experiment("two", e1.times, e1.data[:, :2], noise=Gaussian(0.02), y0=e1.y0,
                              observables=lambda y, p: y[:2])  # fmt: skip
    study = ds.Study(base.problem, [e0, first_two], base.parameters)
    assert study.n_observables == 3 and study.shape_examples()[1].id == "two"
    problem = InferenceProblem(study)
    assert len(problem.groups) == 2
    each = problem.predict(THETA)
    a = problem.predict_arrays(THETA)
    assert a["observables"].shape == (2, 4, 3)
    np.testing.assert_array_equal(a["observables"][0, :3], each["e0"]["observables"])
    np.testing.assert_array_equal(a["states"][1], each["two"]["states"])
    np.testing.assert_array_equal(a["observables"][1, :, :2], each["two"]["observables"])
    assert np.isnan(a["observables"][1, :, 2]).all() and np.isnan(a["observables"][0, 3]).all()


def test_multiple_shooting_experiments_are_named_by_the_study():
    base = tiny_study(n=3)
    e = base.experiments
    shot = e[1].with_trajectory(ds.inference.Multishoot(windows=2))
    study = ds.Study(base.problem, [e[0], shot, e[2]], base.parameters)
    assert study.shooting == (1,)
    assert base.shooting == ()


def test_parameter_rows_keep_their_home():
    """``Parameter`` moved to its own module; its old import path still names the same class."""
    from diffsoup.inference.study._parameter import Parameter as moved
    from diffsoup.inference.study._study import Parameter as old

    assert moved is old is Parameter
    with pytest.raises(ValueError, match="lower bound 2.0 is above the upper bound 1.0"):
        Parameter("k", 1.0, 2.0, 1.0)
