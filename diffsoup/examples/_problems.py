"""Reference problems: ROBER, OREGO (Test Set for IVP Solvers), the 2-D Brusselator, random networks.

Reference values: Mazzia and Magherini, Test Set for IVP Solvers, release 2.4 (2008), computed
with RADAU at rtol = atol = 1.1e-18 (ROBER) and rtol 1.1e-18 / atol 1.1e-40 (OREGO).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..model import ProblemSpec, ReactionNetwork

ROBER_REFERENCE = {
    "t": 1e11,
    "y": np.array([0.2083340149701255e-07, 0.8333360770334713e-13, 0.9999999791665050e00]),
}
OREGO_REFERENCE = {
    "t": 360.0,
    "y": np.array([0.1000814870318523e01, 0.1228178521549917e04, 0.1320554942846706e03]),
}
# u at grid point (0, 0), t = 11.5, N = 32 (scipy BDF, rtol 1e-10; the reference's README).
BRUSSELATOR_U00_REFERENCE = 3.27231584


def scd(y, y_ref) -> float:
    """Significant correct digits of the Test Set: -log10 max_i |y_i - yref_i| / |yref_i|."""
    y, y_ref = np.asarray(y, float), np.asarray(y_ref, float)
    nz = y_ref != 0
    err = np.max(np.abs(y[nz] - y_ref[nz]) / np.abs(y_ref[nz]))
    return float(-np.log10(err)) if err > 0 else float("inf")


def rober() -> ProblemSpec:
    """Robertson's chemical kinetics (3 states, very stiff); integrate to t = 1e11."""

    def rhs(t, y, p):
        y1, y2, y3 = y[0], y[1], y[2]
        return jnp.stack(
            [
                -p["k1"] * y1 + p["k3"] * y2 * y3,
                p["k1"] * y1 - p["k2"] * y2 * y2 - p["k3"] * y2 * y3,
                p["k2"] * y2 * y2,
            ]
        )

    return ProblemSpec(
        rhs, states=["y1", "y2", "y3"], parameters={"k1": 0.04, "k2": 3e7, "k3": 1e4}, y0=[1.0, 0.0, 0.0],
        name="ROBER",
    )  # fmt: skip


def orego() -> ProblemSpec:
    """The Oregonator (Belousov-Zhabotinskii), 3 states; integrate to t = 360."""

    def rhs(t, y, p):
        s, q, w = p["s"], p["q"], p["w"]
        y1, y2, y3 = y[0], y[1], y[2]
        return jnp.stack([s * (y2 + y1 * (1 - q * y1 - y2)), (y3 - (1 + y1) * y2) / s, w * (y1 - y3)])

    return ProblemSpec(
        rhs, states=["y1", "y2", "y3"], parameters={"s": 77.27, "q": 8.375e-6, "w": 0.161}, y0=[1.0, 2.0, 3.0],
        name="OREGO",
    )  # fmt: skip


def brusselator_2d(n: int = 32, *, alpha: float = 10.0) -> ProblemSpec:
    """The 2-D Brusselator on a periodic N x N grid (2 N^2 states), SciML's variant.

    States are ``u`` then ``v``, each ``(N, N)`` indexed ``[i (x), j (y)]`` and flattened. The
    forcing switches on at t = 1.1: pass ``discontinuities=(1.1,)`` to ``simulate``.
    Parameters ``A`` (3.4), ``B`` (1.0) and ``alpha`` (the diffusion coefficient, 10).
    """
    xs = np.linspace(0.0, 1.0, n)
    dx = xs[1] - xs[0]
    X, Y = np.meshgrid(xs, xs, indexing="ij")
    spot = ((X - 0.3) ** 2 + (Y - 0.6) ** 2) <= 0.01
    u0 = 22.0 * (Y * (1.0 - Y)) ** 1.5
    v0 = 27.0 * (X * (1.0 - X)) ** 1.5

    def laplacian(w):
        return jnp.roll(w, 1, 0) + jnp.roll(w, -1, 0) + jnp.roll(w, 1, 1) + jnp.roll(w, -1, 1) - 4.0 * w

    def rhs(t, y, p):
        u = y[: n * n].reshape(n, n)
        v = y[n * n :].reshape(n, n)
        a = p["alpha"] / dx**2
        forcing = jnp.where(jnp.asarray(spot) & (t >= 1.1), 5.0, 0.0).astype(y.dtype)
        uuv = u * u * v
        du = a * laplacian(u) + p["B"] + uuv - (p["A"] + 1.0) * u + forcing
        dv = a * laplacian(v) + p["A"] * u - uuv
        return jnp.concatenate([du.ravel(), dv.ravel()])

    states = [f"u[{i},{j}]" for i in range(n) for j in range(n)] + [f"v[{i},{j}]" for i in range(n) for j in range(n)]
    return ProblemSpec(
        rhs, states=states, parameters={"A": 3.4, "B": 1.0, "alpha": alpha},
        y0=np.concatenate([u0.ravel(), v0.ravel()]), name=f"brusselator_2d(N={n})",
    )  # fmt: skip


def mass_action_network(n_species: int = 20, n_reactions: int = 25, *, seed: int = 0) -> ReactionNetwork:
    """A random, well-posed mass-action network: a chain of first-order conversions through all
    species plus random bimolecular reactions, rate constants spread over four decades (stiff)."""
    rng = np.random.default_rng(seed)
    species = [f"S{i}" for i in range(n_species)]
    reactions, params = [], {}
    for i in range(n_species - 1):
        if len(reactions) >= n_reactions:
            break
        k = f"k{len(reactions)}"
        reactions.append((f"S{i} -> S{i + 1}", k))
        params[k] = float(10 ** rng.uniform(-1, 2))
    while len(reactions) < n_reactions:
        a, b, c = rng.choice(n_species, size=3, replace=False)
        k = f"k{len(reactions)}"
        reactions.append((f"S{a} + S{b} -> S{c} + S{b}", k))
        params[k] = float(10 ** rng.uniform(-1, 2))
    return ReactionNetwork(species, reactions, params, name=f"mass_action_{n_species}x{len(reactions)}")
