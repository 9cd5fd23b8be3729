"""What the fit and campaign commands say about how far their answer can be trusted: the nominal
point beating the fit, estimates at a bound (no standard error), starts at the best counted
within 1e-3, starts that never moved or never became finite reported as failed, and no NaN in a
stored end point."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from fit_helpers import SOLVER, decay_study
from test_cli import write_decay_study

import diffsoup as ds
from diffsoup import cli
from diffsoup.inference.fitting._optimizers import AbstractOptimizer, Outcome, StartObjective
from diffsoup.inference.fitting._results import FitResult, StartResult
from diffsoup.inference.fitting._run_start import run_start


def _lowered(**kw):
    return ds.lower(decay_study(0, **kw), solver=SOLVER)


def test_the_command_says_when_the_nominal_parameters_beat_the_fit(tmp_path, capsys):
    """The decay data were drawn at A=2, k=0.5, the study's nominal values here: a fit of one
    start and one evaluation ends far above them, and the command says so, naming both objectives."""
    study = write_decay_study(tmp_path)
    text = study.read_text()
    for name, value in (("A", 2.0), ("k", 0.5)):
        text = text.replace(f'name = "{name}"\n', f'name = "{name}"\nnominal = {value}\n')
    study.write_text(text)
    code = cli.main(["fit", str(study), "-o", str(tmp_path / "fit"), "--in-process", "--starts", "1",
                     "--max-nfev", "1", "--method", "trf", "--no-plots"])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "fit" / "summary.json").read_text())
    lowered = _lowered()
    nominal = float(lowered.value(np.log10([2.0, 0.5])))  # the same data, the same noise level
    assert summary["nominal_objective"] == pytest.approx(nominal, rel=1e-9)
    assert summary["nominal_objective"] < summary["objective"] - 1.0
    assert (f"the nominal parameters give {summary['nominal_objective']:.8g}, lower than the fit's "
            f"{summary['objective']:.8g}: run more starts or --method batched") in out  # fmt: skip


def test_an_estimate_at_its_bound_is_flagged_and_has_no_standard_error(tmp_path, capsys):
    """k's bounds [0.01, 0.1] exclude the data's 0.5: the fit ends at the upper bound, which the
    table says ('at upper bound', std err '–') and the summary records (null, with the reason)."""
    study = write_decay_study(tmp_path)
    text = study.read_text().replace('name = "k"\nlower = 0.01\nupper = 100.0', 'name = "k"\nlower = 0.01\nupper = 0.1')
    study.write_text(text)
    assert cli.main(["fit", str(study), "-o", str(tmp_path / "fit"), "--in-process", "--starts", "2",
                     "--method", "trf", "--no-plots"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "fit" / "summary.json").read_text())
    assert summary["parameters"]["k"] == pytest.approx(0.1, rel=3e-3)
    assert summary["at_bound"] == {"k": "upper"}
    assert summary["standard_errors"]["k"] is None and "upper bound" in summary["standard_errors_withheld"]["k"]
    assert isinstance(summary["standard_errors"]["A"], float)
    row = next(line for line in out.splitlines() if line.startswith("k "))
    assert "–" in row and row.endswith("at upper bound")


def _fit_with_objectives(values, tmp_objective=None):
    """A FitResult of the decay study whose starts end at the objectives ``values`` (moved)."""
    lowered = _lowered()
    x = np.log10([2.0, 0.5])
    starts = [StartResult(x + 0.1, x + 1e-3 * i, v, True, "ok", 1, 1, 0.0, ()) for i, v in enumerate(values)]
    return lowered, FitResult.from_starts(lowered, starts, method="trf", seconds=0.0)


def test_starts_at_the_best_are_counted_within_1e_3_or_the_tolerance_given(tmp_path):
    """Three end points 0.02 apart are three optima, not one (the old count used 0.1)."""
    from diffsoup.workflows._honest_answers import honest_entries

    lowered, result = _fit_with_objectives([10.0, 10.02, 10.04])
    assert honest_entries(lowered, result)["starts"]["at_best"] == 1
    assert honest_entries(lowered, result, 0.05)["starts"]["at_best"] == 3
    lowered, result = _fit_with_objectives([10.0, 10.0005, 10.04])
    entries = honest_entries(lowered, result)
    assert entries["starts"]["at_best"] == 2 and entries["starts"]["at_best_tolerance"] == 1e-3
    with pytest.raises(ValueError, match="at_best_tolerance"):
        honest_entries(lowered, result, -1.0)

def test_a_negative_at_best_tolerance_is_refused_before_any_work(tmp_path, capsys):
    study = write_decay_study(tmp_path)
    assert cli.main(["fit", str(study), "-o", str(tmp_path / "fit"), "--in-process", "--at-best-tolerance", "-1"]) != 0
    assert "--at-best-tolerance" in capsys.readouterr().err and not (tmp_path / "fit").exists()


def test_a_start_that_never_moved_is_failed_not_finished():
    """A start whose end point is its start point, 4e16 above the best, failed; one that never
    became finite failed; the summary counts neither as finished."""
    from diffsoup.workflows._honest_answers import honest_entries

    lowered = _lowered()
    x = np.log10([2.0, 0.5])
    starts = [StartResult(x + 0.1, x, 5.0, True, "ok", 3, 2, 0.0, ()),
              StartResult(x + 2.0, x + 2.0, 4e16, True, "converged", 1, 0, 0.0, ()),
              StartResult(x - 2.0, x - 2.0, math.inf, False, "a solve failed at the start point", 1, 0, 0.0, ())]
    result = FitResult.from_starts(lowered, starts, method="trf", seconds=0.0)
    stalled = result.starts[1]
    assert stalled.stalled and not stalled.success and not stalled.finished
    assert stalled.message.startswith("never moved from its start point (objective 4e+16")
    assert result.starts[0].finished and not result.starts[2].finished
    entries = honest_entries(lowered, result)
    assert entries["starts"]["finished"] == 1 and entries["starts"]["failed"] == 2
    assert any("2 of 3 starts failed (1 never moved" in line for line in entries["advice"])


class _NaNOptimizer(AbstractOptimizer):
    """Ends at a point whose objective is NaN (a solve failed there)."""

    name = "nan"

    def minimize(self, objective, x0, f0):
        return Outcome(np.asarray(x0) + 1.0, math.nan, True, "done", 1)

    def with_max_evaluations(self, n):
        return self


def test_a_start_ending_at_nan_keeps_its_finite_start():
    lowered = _lowered()
    r = run_start(lowered, _NaNOptimizer(), np.log10([1.0, 1.0]))
    assert np.isfinite(r.objective) and np.all(np.isfinite(r.x))
    np.testing.assert_array_equal(r.x, np.log10([1.0, 1.0]))


def test_no_stored_end_point_holds_a_nan(monkeypatch):
    """The analytic noise level at the end point not found (NaN, as where a solve failed on the
    way while the objective is finite): the start point's value is kept and the start says so."""
    lowered = _lowered(estimate_sigma=True)
    real = StartObjective.theta

    def without_noise(self, x):
        theta = real(self, x)
        theta[-1] = math.nan
        return theta

    monkeypatch.setattr(StartObjective, "theta", without_noise)
    result = ds.inference.fit(lowered, method="trf", starts=2, seed=1, progress=False)
    for s in result.starts:
        assert np.all(np.isfinite(s.x)), s.x
        assert s.x[-1] == s.x0[-1] and "were not found at the end point" in s.message and not s.success
    assert np.all(np.isfinite(result.theta))


def test_from_starts_replaces_a_nan_end_point_and_fails_that_start():
    """A start recorded elsewhere (a batched fit, a campaign's ledger) with a NaN in its end point:
    the stored point takes the start point's value there, and the start is failed."""
    lowered = _lowered()
    x = np.log10([2.0, 0.5])
    starts = [StartResult(x + 0.1, x, 5.0, True, "ok", 3, 2, 0.0, ()),
              StartResult(x + 0.2, np.array([math.nan, x[1]]), 1.0, True, "ok", 3, 2, 0.0, ())]
    result = FitResult.from_starts(lowered, starts, method="trf", seconds=0.0)
    bad = result.starts[1]
    assert np.all(np.isfinite(bad.x)) and bad.x[0] == x[0] + 0.2 and not bad.success and bad.objective == math.inf
    assert "non-finite end point" in bad.message and result.best == 0


def test_standard_errors_are_unbounded_along_directions_the_data_do_not_determine():
    """Closed forms: a diagonal information gives 1/sqrt(w); a numerically zero eigenvalue makes
    every parameter with a share of its eigenvector unbounded, where the pseudo-inverse says ~0."""
    from diffsoup.inference.fitting._results import standard_errors

    cov, se = standard_errors(np.diag([4.0, 4e-17]))
    assert se[0] == pytest.approx(0.5, rel=1e-14) and se[1] == math.inf
    assert np.sqrt(np.diag(np.linalg.pinv(np.diag([4.0, 4e-17]), hermitian=True)))[1] < 1.0  # the old answer
    c, s = math.cos(0.5), math.sin(0.5)
    R = np.array([[c, -s], [s, c]])
    assert np.all(np.isinf(standard_errors(R @ np.diag([4.0, 1e-16]) @ R.T)[1]))  # both share the null direction
    F = np.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]])
    cov, se = standard_errors(F)
    np.testing.assert_allclose(cov, np.linalg.inv(F), rtol=1e-12)
    np.testing.assert_allclose(se, np.sqrt(np.diag(np.linalg.inv(F))), rtol=1e-12)


def _product_study(split: bool):
    """Decay observed as ``A B y`` (``split``: two parameters only their product reaches) or ``C y``."""
    spec = ds.ProblemSpec(lambda t, y, p: -p["k"] * y, states=["y"], parameters={"A": 1.0, "B": 1.0, "C": 1.0, "k": 0.5},
                          y0=[1.0], name="decay")  # fmt: skip
    times = np.linspace(0.2, 4.0, 12)
    data = 2.0 * np.exp(-0.5 * times) * (1.0 + 0.02 * np.random.default_rng(3).standard_normal(12))
    gain = (lambda y, p: p["A"] * p["B"] * y) if split else (lambda y, p: p["C"] * y)
    e = ds.Experiment("e", times, data[:, None], observables=gain, noise=ds.inference.Gaussian(0.05), y0=[1.0])
    names = ("A", "B") if split else ("C",)
    table = [ds.inference.Parameter(n, 1.5, 0.1, 10.0, scale="log10") for n in names]
    return ds.Study(spec.build(), [e], table + [ds.inference.Parameter("k", 0.4, 0.01, 10.0, scale="log10")])


def test_a_product_of_two_parameters_leaves_both_unidentifiable_and_the_rest_as_the_merged_model():
    """Only ``A B`` reaches the data: both get an unbounded standard error and the summary withholds
    theirs, while ``k``'s equals the one of the model with ``C = A B`` alone (the pseudo-inverse over
    the identifiable directions is that model's covariance)."""
    from diffsoup.workflows._honest_answers import honest_entries

    split = ds.lower(_product_study(True), solver=SOLVER)
    merged = ds.lower(_product_study(False), solver=SOLVER)
    both = ds.inference.fit(split, starts=2, seed=0, hierarchical=False)
    one = ds.inference.fit(merged, starts=2, seed=0, hierarchical=False)
    assert both.objective == pytest.approx(one.objective, abs=1e-7)
    assert both.parameters["A"] * both.parameters["B"] == pytest.approx(one.parameters["C"], rel=1e-5)
    assert math.isinf(both.standard_errors["A"]) and math.isinf(both.standard_errors["B"])
    assert both.standard_errors["k"] == pytest.approx(one.standard_errors["k"], rel=1e-4)
    honest = honest_entries(split, both)
    assert set(honest["standard_errors_withheld"]) == {"A", "B"}
    assert any("not identifiable" in line and "A, B" in line for line in honest["advice"])
