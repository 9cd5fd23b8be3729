"""A noise model is one class: a Student-t noise defined in this file alone, with its maths
(penalty, residual, normaliser) as methods, registers itself by name and fits.

Independent facts: the negative log-likelihood against ``scipy.stats.t.logpdf`` (and
``scipy.stats.norm.logpdf`` for a Gaussian column beside it) on the closed form of ``A -> B``
(``A = a0 exp(-k t)``); the value's identity with the residuals; gradients and the Gauss-Newton
Jacobian against central differences; a fit against ``scipy.optimize.minimize`` of the same
likelihood on the closed form, and closer to the true parameters than a Gaussian fit of data with
outliers.
"""

import dataclasses
import math
from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
import scipy.special
import scipy.stats

import diffsoup as ds
from diffsoup.inference import AbstractNoise, Gaussian, InferenceProblem, Parameter, SolverOptions
from diffsoup.inference.study._noise import noise_class, noise_names, petab_noise_class

TIGHT = SolverOptions(rtol=1e-11, atol=1e-13, max_steps=4000)
TRUE = {"k": 0.7, "a0": 2.0}
TIMES = np.linspace(0.25, 4.0, 12)
NU = 3.0


@dataclasses.dataclass(frozen=True, eq=False)
class StudentT(AbstractNoise):
    """Student-t noise with ``nu`` degrees of freedom and scale ``sigma``:
    ``nll = (nu + 1)/2 log(1 + z^2/nu) + log sigma + lgamma(nu/2) - lgamma((nu+1)/2) + 0.5 log(nu pi)``."""

    sigma: Any = 1.0
    nu: float = 4.0
    name: ClassVar[str] = "student_t"
    distribution: ClassVar[str] = "student_t"
    spread_field: ClassVar[str] = "sigma"

    def penalty(self, z):
        return 0.5 * (self.nu + 1.0) * jnp.log1p(z * z / self.nu)

    def residual(self, z):
        # sign(z) sqrt(2 penalty(z)), written as z sqrt(...) so that it is smooth at z = 0.
        u = z * z / self.nu
        pos = u > 0
        ratio = jnp.where(pos, jnp.log1p(u) / jnp.where(pos, u, 1.0), 1.0)
        return z * jnp.sqrt((self.nu + 1.0) / self.nu * ratio)

    @property
    def log_normaliser(self) -> float:
        nu = self.nu
        return math.lgamma(nu / 2) - math.lgamma((nu + 1) / 2) + 0.5 * math.log(nu * math.pi)


def decay_problem():
    spec = ds.ProblemSpec(lambda t, y, p: jnp.stack([-p["k"] * y[0], p["k"] * y[0]]),
                          states=["A", "B"], parameters={"k": 0.7, "a0": 2.0}, y0=[1.0, 0.0], name="decay")  # fmt: skip
    return spec.build()


def decay(t, k, a0):
    a = a0 * np.exp(-k * np.asarray(t, dtype=np.float64))
    return np.stack([a, a0 - a], axis=-1)


def data_with_outliers(seed=0):
    rng = np.random.default_rng(seed)
    h = decay(TIMES, TRUE["k"], TRUE["a0"])
    data = h + 0.03 * rng.standard_t(NU, size=h.shape)
    data[[2, 7], 0] += [0.9, -0.6]  # two gross outliers of A
    return data


def study_of(noise, data, *, sigma_parameter=False):
    """One experiment observing both states from ``(a0, 0)``: ``a0`` and ``k`` estimated."""
    exp = ds.Experiment("e", TIMES, data, noise=noise, y0={"A": "a0"})
    params = [Parameter("k", TRUE["k"], 0.1, 5.0), Parameter("a0", TRUE["a0"], 0.5, 5.0)]
    if sigma_parameter:
        params.append(Parameter("sd", 0.05, 0.005, 1.0))
    return ds.Study(decay_problem(), [exp], params)


def reference_nll(k, a0, data, sigma_a, sigma_b, *, b_gaussian):
    h = decay(TIMES, k, a0)
    nll = -np.sum(scipy.stats.t.logpdf(data[:, 0], NU, loc=h[:, 0], scale=sigma_a))
    if b_gaussian:
        return nll - np.sum(scipy.stats.norm.logpdf(data[:, 1], loc=h[:, 1], scale=sigma_b))
    return nll - np.sum(scipy.stats.t.logpdf(data[:, 1], NU, loc=h[:, 1], scale=sigma_b))


def _rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def _central(f, x, h=1e-6):
    cols = []
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = h
        cols.append((np.asarray(f(x + e)) - np.asarray(f(x - e))) / (2 * h))
    return np.stack(cols, axis=-1)


def test_a_subclass_registers_by_name_and_petab_distribution():
    assert noise_class("student_t") is StudentT and "student_t" in noise_names()
    assert noise_class("gaussian") is Gaussian
    assert petab_noise_class("student_t", "lin") == (StudentT, {})
    assert petab_noise_class("laplace", "log10") == (ds.inference.LogLaplace, {"base": 10.0})
    with pytest.raises(ValueError, match="noise model 'cauchy' is unknown; known models: gaussian"):
        noise_class("cauchy")
    with pytest.raises(ValueError, match="noise model name 'gaussian' is taken by Gaussian"):
        type("Imposter", (StudentT,), {"name": "gaussian", "__qualname__": "Imposter"})
    with pytest.raises(ValueError, match="noiseDistribution 'student_t' with observableTransformation 'log'"):
        petab_noise_class("student_t", "log")
    # A model's kind (what a compiled program depends on) is its class and fields besides the spread.
    assert StudentT(0.1, nu=3.0).kind == StudentT(np.ones(3), nu=3.0).kind != StudentT(0.1, nu=5.0).kind


@pytest.mark.parametrize("b_gaussian", [True, False], ids=["with-gaussian-column", "student-t-only"])
def test_value_residuals_and_derivatives_against_scipy(b_gaussian):
    data = data_with_outliers()
    noise = [StudentT(0.03, nu=NU), Gaussian(0.05) if b_gaussian else StudentT(0.05, nu=NU)]
    problem = InferenceProblem(study_of(noise, data), solver=TIGHT)
    low = ds.lower(problem)
    theta = problem.nominal + np.array([0.02, -0.03])
    k, a0 = (problem.parameter_values(theta)[n] for n in ("k", "a0"))
    value = low.value(theta)
    assert abs(value - reference_nll(k, a0, data, 0.03, 0.05, b_gaussian=b_gaussian)) <= 1e-9 * abs(value)
    r, J = low.residuals_and_jacobian(theta)
    assert abs(low.scale * float(r @ r) + low.offset - value) <= 1e-11 * abs(value)
    v, g = low.value_and_grad(theta)
    assert _rel(g, _central(low.value, theta)) <= 1e-6
    assert _rel(J, _central(low.residuals, theta)) <= 1e-6


def test_estimated_scale_of_a_new_model():
    """A spread from a parameter: ``log s`` in the program and its residual, by the base class."""
    data = data_with_outliers(seed=1)
    problem = InferenceProblem(study_of(StudentT("sd", nu=NU), data, sigma_parameter=True), solver=TIGHT)
    low = ds.lower(problem)
    theta = problem.nominal + np.array([0.01, 0.02, -0.05])
    vals = problem.parameter_values(theta)
    value = low.value(theta)
    ref = reference_nll(vals["k"], vals["a0"], data, vals["sd"], vals["sd"], b_gaussian=False)
    assert abs(value - ref) <= 1e-9 * abs(value)
    r = low.residuals(theta)
    assert abs(low.scale * float(r @ r) + low.offset - value) <= 1e-11 * abs(value)
    assert _rel(low.value_and_grad(theta)[1], _central(low.value, theta)) <= 1e-6


def test_chi2_needs_least_squares_noise():
    with pytest.raises(ValueError, match="objective='chi2' .* StudentT noise"):
        InferenceProblem(study_of(StudentT(0.03), data_with_outliers()), objective="chi2")


def test_student_t_fit_matches_scipy_and_resists_outliers():
    data = data_with_outliers()
    data[:, 1] = np.nan  # A alone: the outliers' column
    fits = {}
    for label, noise in (("t", [StudentT(0.03, nu=NU), Gaussian(0.05)]), ("gauss", [Gaussian(0.03), Gaussian(0.05)])):
        result = ds.inference.fit(ds.lower(InferenceProblem(study_of(noise, data), solver=TIGHT)), starts=2, seed=0)
        fits[label] = np.array([result.parameters["k"], result.parameters["a0"]])
    finite = np.isfinite(data[:, 0])

    def nll(x):
        h = decay(TIMES, x[0], x[1])
        return -np.sum(scipy.stats.t.logpdf(data[finite, 0], NU, loc=h[finite, 0], scale=0.03))

    ref = scipy.optimize.minimize(nll, np.array([0.6, 1.8]), method="Nelder-Mead",
                                  options={"xatol": 1e-12, "fatol": 1e-14, "maxiter": 20000})  # fmt: skip
    assert ref.success
    np.testing.assert_allclose(fits["t"], ref.x, rtol=1e-5)
    truth = np.array([TRUE["k"], TRUE["a0"]])
    assert np.max(np.abs(fits["t"] / truth - 1)) < 0.02
    assert np.max(np.abs(fits["t"] / truth - 1)) < 0.5 * np.max(np.abs(fits["gauss"] / truth - 1)), fits


STUDY_FILE = """\
format = "diffsoup-study/2"

[model]
species = ["A", "B"]
reactions = [["A -> B", "k"]]
parameters = {k = 0.7}
y0 = {A = 2.0}

[noise]
model = "student_t"
sigma = 0.03
[noise.observables]
B = {model = "gaussian", sigma = 0.05}

[[parameters]]
name = "k"
lower = 0.1
upper = 5.0

[[experiments]]
id = "e"
data = "e.csv"
"""


def test_a_study_file_names_a_registered_model(tmp_path):
    (tmp_path / "study.toml").write_text(STUDY_FILE)
    (tmp_path / "e.csv").write_text("time,A,B\n0.5,1.4,0.6\n1.0,1.0,1.0\n")
    noise = ds.inference.load_study(tmp_path / "study.toml").study.experiments[0].noise
    assert [type(n) for n in noise] == [StudentT, Gaussian] and noise[0].sigma == 0.03 and noise[0].nu == 4.0
    (tmp_path / "study.toml").write_text(STUDY_FILE.replace('sigma = 0.03', 'sigma = 0.03\nbase = 10'))
    with pytest.raises(ds.inference.StudyFileError, match="only lognormal and loglaplace noise have a base"):
        ds.inference.load_study(tmp_path / "study.toml")
