"""The demo study: an enzyme reaction with substrate inhibition written as a study file with
synthetic data, so that ``diffsoup demo`` (and a newcomer) can run the same path as
``diffsoup fit study.toml``."""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import numpy as np

import diffsoup as ds

# Rate constants of the synthetic truth: binding and inhibition equilibrate within 0.1 time units,
# catalysis takes about 10; early and late measurement times see both.
TRUTH = {"kon": 20.0, "koff": 10.0, "kcat": 1.5, "ki": 40.0, "kr": 25.0}
BOUNDS = {"kon": (2.0, 200.0), "koff": (1.0, 100.0), "kcat": (0.15, 15.0), "ki": (4.0, 400.0),
          "kr": (2.5, 250.0)}  # fmt: skip
# The values before any fit, a rough guess (not the truth): the model's defaults in [model] and the
# nominal values in [[parameters]] are these same numbers, so a newcomer reads one value per rate.
GUESS = {"kon": 100.0, "koff": 50.0, "kcat": 1.0, "ki": 10.0, "kr": 100.0}
TIMES = (0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 12.0)
SIGMA = 0.01

STUDY_TOML = '''\
format = "diffsoup-study/1"
name = "enzyme-demo"
description = "Enzyme with substrate inhibition; {n} synthetic experiments (initial S and E varied)."

[model]
species = ["S", "E", "C", "P", "CI"]
reactions = [
  ["S + E -> C", "kon"],
  ["C -> S + E", "koff"],
  ["C -> E + P", "kcat"],
  ["C + S -> CI", "ki"],
  ["CI -> C + S", "kr"],
]
parameters = {{ {guess} }}   # a guess; the [[parameters]] nominals too
y0 = {{ S = 1.0, E = 0.1 }}

[observables]
bound = "C + CI"          # total enzyme-bound complex

[solver]
rtol = 1e-8
atol = 1e-10

[noise]
model = "gaussian"
sigma = {sigma}

[fit]
method = "trf"
starts = 4
seed = 1
max_nfev = 100
{parameters}
{experiments}'''


@functools.cache
def _true_trajectories():
    """The demo network's trajectories at :data:`TIMES` from initial states ``(n, 5)``, one jitted
    program per process (compiled once per number of experiments, not once per study written)."""
    species = ["S", "E", "C", "P", "CI"]
    network = ds.ReactionNetwork(
        species,
        [("S + E -> C", "kon"), ("C -> S + E", "koff"), ("C -> E + P", "kcat"), ("C + S -> CI", "ki"),
         ("CI -> C + S", "kr")],
        TRUTH,
    )  # fmt: skip
    problem = network.to_spec(y0=np.zeros(5)).build()
    times = np.asarray(TIMES)
    return jax.jit(jax.vmap(lambda y0: ds.simulate(problem, y0, times, rtol=1e-11, atol=1e-13).ys))


def write_demo_study(directory, *, n_experiments: int = 24, seed: int = 0) -> Path:
    """Write ``study.toml`` and ``data/measurements.csv`` (synthetic, from :data:`TRUTH`) into
    ``directory``; return the study file's path."""
    jax.config.update("jax_enable_x64", True)  # one of diffsoup's own entry points
    directory = Path(directory)
    (directory / "data").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    s0 = rng.uniform(0.5, 3.0, n_experiments)
    e0 = rng.uniform(0.05, 0.4, n_experiments)
    y0s = np.zeros((n_experiments, 5))
    y0s[:, 0], y0s[:, 1] = s0, e0
    times = np.asarray(TIMES)
    ys = np.asarray(_true_trajectories()(y0s))
    rows = ["experiment,time,S,P,bound"]
    blocks = []
    for i in range(n_experiments):
        eid = f"run{i:02d}"
        clean = np.stack([ys[i, :, 0], ys[i, :, 3], ys[i, :, 2] + ys[i, :, 4]], axis=1)
        noisy = clean + SIGMA * rng.standard_normal(clean.shape)
        for t, row in zip(times, noisy):
            rows.append(f"{eid},{t:g}," + ",".join(f"{v:.6g}" for v in row))
        blocks.append(
            f'[[experiments]]\nid = "{eid}"\ndata = "data/measurements.csv"\n'
            f"y0 = {{ S = {s0[i]:.6g}, E = {e0[i]:.6g} }}\n"
        )
    (directory / "data" / "measurements.csv").write_text("\n".join(rows) + "\n")
    params = "".join(
        f'\n[[parameters]]\nname = "{k}"\nnominal = {GUESS[k]:g}\nlower = {lo:g}\nupper = {hi:g}\n'
        f'scale = "log10"\n'
        for k, (lo, hi) in BOUNDS.items()
    )
    guess = ", ".join(f"{k} = {v!r}" for k, v in GUESS.items())
    path = directory / "study.toml"
    path.write_text(STUDY_TOML.format(n=n_experiments, sigma=SIGMA, guess=guess, parameters=params,
                                      experiments="\n".join(blocks)))  # fmt: skip
    return path
