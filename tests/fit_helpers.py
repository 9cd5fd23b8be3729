"""A fit whose optimum and standard errors are known independently: exponential decay observed
with Gaussian noise, ``h(t) = A exp(-k t)``, simulated by diffsoup as the ODE ``y' = -k y``,
``y(0) = 1``, observed as ``A y``; the reference optimum is scipy's least squares on the closed
form, its standard errors from the closed form's Jacobian."""

import numpy as np

import diffsoup as ds
from diffsoup.inference import Gaussian, Parameter, SolverOptions

TIMES = np.array([0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
TRUTH = {"A": 2.0, "k": 0.5}
SIGMA = 0.05
SOLVER = SolverOptions(rtol=1e-10, atol=1e-12)


def _rhs(t, y, p):
    return -p["k"] * y


def _observe(y, p):
    return p["A"] * y


_PROBLEM = None


def problem():
    global _PROBLEM
    if _PROBLEM is None:
        _PROBLEM = ds.ProblemSpec(_rhs, states=["y"], parameters=dict(TRUTH), y0=[1.0], name="decay").build()
    return _PROBLEM


def data(seed):
    rng = np.random.default_rng(seed)
    return (TRUTH["A"] * np.exp(-TRUTH["k"] * TIMES) + SIGMA * rng.standard_normal(TIMES.size))[:, None]


def decay_study(seed, *, sigma=SIGMA, estimate_sigma=False):
    """The study of one data set (seed); ``estimate_sigma`` adds the noise level as a parameter."""
    noise = Gaussian("sigma" if estimate_sigma else sigma)
    e = ds.Experiment("decay", TIMES, data(seed), observables=_observe, noise=noise, y0=[1.0])
    params = [Parameter("A", 1.0, 0.01, 100.0), Parameter("k", 1.0, 0.01, 100.0)]
    if estimate_sigma:
        params.append(Parameter("sigma", 0.1, 1e-3, 10.0))
    return ds.Study(problem(), [e], params)


def reference_fit(seed):
    """theta = (log10 A, log10 k) at the optimum by scipy on the closed form, and its standard
    errors ``sqrt(diag((J^T J)^-1))`` (J of the noise-weighted residuals)."""
    from scipy.optimize import least_squares

    d = data(seed)[:, 0]

    def residuals(theta):
        A, k = 10.0 ** theta
        return (A * np.exp(-k * TIMES) - d) / SIGMA

    def jacobian(theta):
        A, k = 10.0 ** theta
        h = A * np.exp(-k * TIMES)
        return np.stack([h * np.log(10.0), -k * TIMES * h * np.log(10.0)], axis=1) / SIGMA

    res = least_squares(residuals, np.log10([TRUTH["A"], TRUTH["k"]]), jac=jacobian, xtol=1e-15, ftol=1e-15, gtol=1e-15)
    J = jacobian(res.x)
    se = np.sqrt(np.diag(np.linalg.inv(J.T @ J)))
    nll = 0.5 * float(res.fun @ res.fun) + TIMES.size * (np.log(SIGMA) + 0.5 * np.log(2 * np.pi))
    return res.x, se, nll


def closed_form_interval(seed, index, delta):
    """The profile interval of theta[index] (log10 A or log10 k) of data set ``seed`` at the
    threshold rise ``delta``, from the closed form: scipy minimizes over the other coordinate at
    each value, brentq finds the threshold crossings."""
    from scipy.optimize import brentq, minimize_scalar

    d = data(seed)[:, 0]

    def nll(theta):
        A, k = 10.0 ** np.asarray(theta)
        r = (A * np.exp(-k * TIMES) - d) / SIGMA
        return 0.5 * float(r @ r)

    def profile(t):
        def inner(u):
            theta = [t, u] if index == 0 else [u, t]
            return nll(theta)

        return minimize_scalar(inner, bounds=(-2.0, 2.0), method="bounded", options={"xatol": 1e-12}).fun

    best, _, _ = reference_fit(seed)
    level = nll(best) + delta
    t0 = best[index]
    lo = brentq(lambda t: profile(t) - level, t0 - 1.0, t0, xtol=1e-12)
    hi = brentq(lambda t: profile(t) - level, t0, t0 + 1.0, xtol=1e-12)
    return lo, hi


def two_noise_levels_study(distribution=Gaussian, sd2_scale="log10", sd1_upper=10.0):
    """Two experiments with their own noise level (sd1, sd2) and one offset o over both (sd1's
    spread about 0.05: an upper bound below that holds its optimum at the bound)."""
    rng = np.random.default_rng(5)
    exps = []
    for i, sd in enumerate((0.05, 0.2)):
        d = (np.exp(-0.5 * TIMES) + 0.4 + sd * rng.standard_normal(TIMES.size))[:, None]
        exps.append(ds.Experiment(f"e{i}", TIMES, d, observables=lambda y, p: y + p["o"], y0=[1.0],
                                  noise=distribution(f"sd{i + 1}"), observable_parameters={"o": "o"}))  # fmt: skip
    params = [Parameter("k", 1.0, 0.01, 100.0), Parameter("o", 0.0, -5.0, 5.0, scale="lin"),
              Parameter("sd1", min(0.1, sd1_upper), 1e-3, sd1_upper), Parameter("sd2", 0.1, 1e-3, 10.0, scale=sd2_scale)]  # fmt: skip
    return ds.Study(problem(), exps, params)
