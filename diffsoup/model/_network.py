"""Reaction networks written as text: ``"2 A + B -> C"``, mass action or user rate laws."""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Callable, Mapping, Sequence

import jax.numpy as jnp
import numpy as np

from ._spec import ProblemSpec

_TERM = re.compile(r"^\s*(?:(\d+(?:\.\d*)?)\s*\*?\s*)?([A-Za-z_][A-Za-z0-9_]*)\s*$")
_EMPTY = {"", "0", "∅", "nothing"}


@dataclasses.dataclass(frozen=True)
class Reaction:
    """One reaction: reactant and product stoichiometries and its rate.

    ``rate`` is a parameter name (mass action: ``k * prod(c_i ** nu_i)``) or a function
    ``rate(t, c, p) -> flux`` of time, the concentrations (a dict by species) and the parameters.
    """

    reactants: tuple[tuple[str, float], ...]
    products: tuple[tuple[str, float], ...]
    rate: str | Callable
    text: str


def _side(text: str, equation: str) -> tuple[tuple[str, float], ...]:
    text = text.strip()
    if text in _EMPTY:
        return ()
    terms = []
    for part in text.split("+"):
        m = _TERM.match(part)
        if not m:
            raise ValueError(f"reaction {equation!r}: cannot read the term {part.strip()!r} (write e.g. '2 A + B').")
        coeff = float(m.group(1)) if m.group(1) else 1.0
        terms.append((m.group(2), coeff))
    return tuple(terms)


def _has_source(fn) -> bool:
    try:
        inspect.getsource(fn)
        return True
    except (OSError, TypeError):
        return False


def parse_reaction(equation: str) -> tuple[tuple, tuple, bool]:
    """``(reactants, products, reversible)`` of ``"2 A + B -> C"`` or ``"A <-> B"``."""
    if "<->" in equation:
        left, right = equation.split("<->", 1)
        reversible = True
    elif "->" in equation:
        left, right = equation.split("->", 1)
        reversible = False
    else:
        raise ValueError(f"reaction {equation!r} has no arrow; write 'A + B -> C' or 'A <-> B'.")
    return _side(left, equation), _side(right, equation), reversible


@dataclasses.dataclass(frozen=True, eq=False)
class _MassActionTable:
    """The mass-action reactions of a network as index arrays: flux ``k * prod(c_i ** nu_i)`` is
    ``k`` times the product over a row's factors, each factor a gathered concentration (a
    reactant of integer order ``nu`` is ``nu`` factors of power 1: exact products, where one array
    of per-row exponents would send every entry through ``pow``), the rows padded with a
    concentration of 1."""

    rates: tuple[str, ...]  # the rate parameters of the mass-action reactions
    factors: np.ndarray  # (rows, most factors) species index; n_species pads (the appended 1)
    powers: np.ndarray  # (rows, most factors) power of each factor (1 but for fractional orders)
    user_rows: tuple[int, ...]  # reactions with a rate law of their own
    order: np.ndarray  # reaction j's flux sits at order[j] of [mass action..., user laws...]

    @classmethod
    def of(cls, reactions, index) -> "_MassActionTable":
        pad = len(index)
        rows, rates, factor_rows, user_rows = [], [], [], []
        for j, rxn in enumerate(reactions):
            if callable(rxn.rate):
                user_rows.append(j)
                continue
            factors = []
            for s, c in rxn.reactants:
                whole = float(c).is_integer()
                factors += [(index[s], 1.0)] * int(c) if whole else [(index[s], float(c))]
            rows.append(j)
            rates.append(rxn.rate)
            factor_rows.append(factors)
        width = max((len(f) for f in factor_rows), default=0)
        factors = np.full((len(rows), width), pad, dtype=np.int32)
        powers = np.ones((len(rows), width))
        for r, row in enumerate(factor_rows):
            for k, (i, nu) in enumerate(row):
                factors[r, k], powers[r, k] = i, nu
        order = np.empty(len(reactions), dtype=np.int32)
        order[rows + user_rows] = np.arange(len(reactions))
        return cls(tuple(rates), factors, powers, tuple(user_rows), order)

    def fluxes(self, y, p):
        k = jnp.stack([jnp.asarray(p[name], y.dtype) for name in self.rates])
        padded = jnp.concatenate([y, jnp.ones((1,), y.dtype)])
        flux = k
        for column in range(self.factors.shape[1]):  # left to right, as k * c_a * c_b is written
            c = padded[self.factors[:, column]]
            fractional = self.powers[:, column] != 1.0
            if fractional.any():
                # Only the fractional entries go through pow (1 elsewhere, so no NaN of a negative
                # concentration to a power reaches a gradient through the unselected branch).
                powered = jnp.where(fractional, c, 1.0) ** jnp.asarray(self.powers[:, column], y.dtype)
                c = jnp.where(fractional, powered, c)
            flux = flux * c
        return flux


class ReactionNetwork:
    """A chemical reaction network that builds a :class:`ProblemSpec`.

    Args:
        species: species names (the states, in this order).
        reactions: ``(equation, rate)`` pairs; ``rate`` is a parameter name (mass action) or a
            function ``rate(t, c, p)``; a reversible ``"A <-> B"`` takes a pair of rates
            ``(forward, backward)``.
        parameters: parameter names with default values.
        name: a name for messages.

    Example::

        net = ds.ReactionNetwork(
            species=["A", "B", "C"],
            reactions=[("A -> B", "k1"), ("2 B -> B + C", "k2"), ("B + C -> A + C", "k3")],
            parameters={"k1": 0.04, "k2": 3e7, "k3": 1e4},
        )
        problem = net.to_spec(y0=[1, 0, 0]).build()
    """

    def __init__(
        self,
        species: Sequence[str],
        reactions: Sequence[tuple],
        parameters: Mapping[str, float] | Sequence[str] = (),
        *,
        name: str = "network",
    ):
        self.species = tuple(species)
        if not self.species:
            raise ValueError("ReactionNetwork: no species.")
        self.name = name
        self.parameters = dict(parameters) if isinstance(parameters, Mapping) else {k: None for k in parameters}
        index = {s: i for i, s in enumerate(self.species)}
        self.reactions: list[Reaction] = []
        for entry in reactions:
            if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
                raise ValueError(f"ReactionNetwork: each reaction is (equation, rate); got {entry!r}.")
            equation, rate = entry
            reactants, products, reversible = parse_reaction(equation)
            for sp_name, _ in reactants + products:
                if sp_name not in index:
                    raise ValueError(f"reaction {equation!r}: unknown species {sp_name!r}; species are {list(self.species)}.")
            rates = rate if reversible else (rate,)
            if reversible and not (isinstance(rate, (tuple, list)) and len(rate) == 2):
                raise ValueError(f"reaction {equation!r} is reversible: give (forward_rate, backward_rate).")
            for r in rates:
                if isinstance(r, str) and r not in self.parameters:
                    raise ValueError(f"reaction {equation!r}: unknown rate parameter {r!r}; parameters are {list(self.parameters)}.")
                if not (isinstance(r, str) or callable(r)):
                    raise ValueError(f"reaction {equation!r}: a rate is a parameter name or a function rate(t, c, p).")
            self.reactions.append(Reaction(reactants, products, rates[0], equation))
            if reversible:
                self.reactions.append(Reaction(products, reactants, rates[1], equation + " (backward)"))
        n_s, n_r = len(self.species), len(self.reactions)
        self.stoichiometry = np.zeros((n_s, n_r))
        for j, rxn in enumerate(self.reactions):
            for s, c in rxn.reactants:
                self.stoichiometry[index[s], j] -= c
            for s, c in rxn.products:
                self.stoichiometry[index[s], j] += c
        self._mass_action = _MassActionTable.of(self.reactions, index)

    def fluxes(self, t, y, p):
        """Reaction fluxes at concentrations ``y``: the mass-action ones as one gather and a few
        array products (not one small expression per reaction: the programs stay small and a
        lane's fluxes are one array, not a stack of scalars), user rate laws one by one."""
        table = self._mass_action
        fluxes = table.fluxes(y, p) if table.rates else jnp.zeros((0,), y.dtype)
        if not table.user_rows:
            return fluxes
        conc = {s: y[i] for i, s in enumerate(self.species)}
        laws = [jnp.asarray(self.reactions[j].rate(t, conc, p), y.dtype) for j in table.user_rows]
        # Mass-action fluxes first, then the user rate laws: put back in reaction order.
        return jnp.concatenate([fluxes, jnp.stack(laws)])[table.order]

    def rhs(self, t, y, p):
        """``dy/dt = S @ fluxes``."""
        return jnp.asarray(self.stoichiometry, y.dtype) @ self.fluxes(t, y, p)

    def to_spec(self, *, y0=None, jac_sparsity=None) -> ProblemSpec:
        """The network as a :class:`ProblemSpec` (states = species, parameters = rate constants)."""
        return ProblemSpec(
            self.rhs, states=self.species, parameters=self.parameters, y0=y0, jac_sparsity=jac_sparsity,
            name=self.name, identity=self._identity(),
        )  # fmt: skip

    def _identity(self) -> str:
        parts = []
        for rxn in self.reactions:
            rate = rxn.rate if isinstance(rxn.rate, str) else inspect.getsource(rxn.rate) if _has_source(rxn.rate) else rxn.rate.__qualname__
            parts.append(f"{rxn.reactants}->{rxn.products}@{rate}")
        return ";".join(parts)

    def __repr__(self) -> str:
        return f"ReactionNetwork({self.name!r}, species={len(self.species)}, reactions={len(self.reactions)})"
