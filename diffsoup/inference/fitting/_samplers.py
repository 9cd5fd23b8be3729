"""Parameter draws for ensembles: the box they come from (:class:`ParameterBox`, a study's parameter
table on its scales), Latin hypercube and Sobol' points (scipy.stats.qmc), Saltelli's design for
Sobol' indices, and the indices' estimators. NumPy only: the Dask arrays built from these live in
:mod:`diffsoup.distributed` (``sample``, ``saltelli``, ``sobol_indices``).

Draws are uniform on each parameter's scale between its bounds (log-uniform for ``"log"`` and
``"log10"``), independent across parameters; they are returned as linear values, what a model
is simulated at.

Sobol' indices (first order ``S_i``, total order ``T_i``) of an output ``f`` of independent inputs
use Saltelli's scheme: two independent matrices ``A`` and ``B`` of ``n`` draws (the first and last
``d`` coordinates of a ``2d``-dimensional scrambled Sobol' sequence) and, for each parameter ``i``,
``AB_i`` = ``A`` with column ``i`` taken from ``B``. With ``V`` the variance of ``f`` over the
``2n`` rows of ``A`` and ``B``:

- first order (Saltelli et al. 2010, eq. (b) of their table 2): ``S_i = mean(f(B) (f(AB_i) - f(A))) / V``;
- total order (Jansen 1999): ``T_i = mean((f(A) - f(AB_i))^2) / (2 V)``.

Both are means of per-draw terms, so each is a single pass of sums over the draws (what lets the
Dask version reduce chunk by chunk); their standard errors are the terms' standard deviations over
``sqrt(n)``, divided by ``V`` (the variance's own error is left out: it is of higher order).
Indices do not depend on the scale a parameter is drawn on (a monotone change of one independent
input leaves the variance decomposition as it is).

References: A. Saltelli, P. Annoni, I. Azzini, F. Campolongo, M. Ratto, S. Tarantola, "Variance
based sensitivity analysis of model output. Design and estimator for the total sensitivity index",
Comput. Phys. Commun. 181 (2010) 259-270. M. J. W. Jansen, "Analysis of variance designs for model
output", Comput. Phys. Commun. 117 (1999) 35-43.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Sequence

import numpy as np

from ..study._study import Parameter, Study

SAMPLING_METHODS = ("lhs", "sobol")

# How the rows of a Saltelli design are laid out: per draw j, the d + 2 rows
# A_j, B_j, AB_1j, ..., AB_dj follow each other, so that a chunk of whole groups holds everything
# its partial sums need (the estimators stream chunk by chunk).
ROW_A, ROW_B, FIRST_AB = 0, 1, 2


def _scale(scale: str, value):
    return {"lin": lambda v: v, "log": np.log, "log10": np.log10}[scale](np.asarray(value, dtype=np.float64))


def _unscale(scale: str, value):
    v = np.asarray(value, dtype=np.float64)
    return {"lin": lambda v: v, "log": np.exp, "log10": lambda v: 10.0**v}[scale](v)


@dataclasses.dataclass(frozen=True)
class ParameterBox:
    """The box that parameter draws come from: names, bounds (linear values) and the scale each
    parameter is drawn uniformly on.

    Make it from a study (``ParameterBox.of(study)``: its estimated parameters, one coordinate per
    entry, ``name[member]`` for a parameter with a level) or from ``Parameter`` rows
    (``ParameterBox.of([Parameter("k", lower=0.1, upper=10, scale="log10"), ...])``).

    Attributes:
        names: the parameters (the columns of every draw), in order.
        lower, upper: bounds on the linear scale, finite (positive for the log scales).
        scales: ``"lin"``, ``"log"`` or ``"log10"`` per parameter.

    Raises:
        ValueError: for a box without parameters, lengths that differ, duplicate names, bounds that
            are not finite, ``lower >= upper``, or non-positive bounds on a log scale.
    """

    names: tuple[str, ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    scales: tuple[str, ...]

    def __post_init__(self):
        for field in ("names", "lower", "upper", "scales"):
            value = getattr(self, field)
            if isinstance(value, str) or not isinstance(value, Sequence | np.ndarray):
                raise TypeError(f"ParameterBox: {field} must be a sequence (one entry per parameter).")
        names = tuple(str(n) for n in self.names)
        lower = tuple(float(v) for v in self.lower)
        upper = tuple(float(v) for v in self.upper)
        scales = tuple(self.scales)
        if not names:
            raise ValueError("ParameterBox: no parameters; give at least one (an estimated parameter of the study).")
        if not len(names) == len(lower) == len(upper) == len(scales):
            raise ValueError(
                f"ParameterBox: names, lower, upper and scales have lengths {len(names)}, {len(lower)}, "
                f"{len(upper)}, {len(scales)}; give one entry per parameter in each."
            )
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"ParameterBox: duplicate names {dup}.")
        for n, lo, hi, sc in zip(names, lower, upper, scales):
            if sc not in ("lin", "log", "log10"):
                raise ValueError(f"ParameterBox: {n!r} has scale {sc!r}; use 'lin', 'log' or 'log10'.")
            if not (math.isfinite(lo) and math.isfinite(hi)) or not lo < hi:
                raise ValueError(f"ParameterBox: {n!r} has bounds [{lo}, {hi}]; give finite bounds with lower < upper.")
            if sc != "lin" and lo <= 0:
                raise ValueError(f"ParameterBox: {n!r} is drawn on scale {sc!r}, so its lower bound {lo} must be > 0.")
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "scales", scales)

    @classmethod
    def of(cls, source: Any, parameters: Sequence[str] | None = None) -> "ParameterBox":
        """The box of a study's estimated parameters, or of a sequence of ``Parameter`` rows.

        Args:
            source: a :class:`~diffsoup.inference.Study` (its entries marked ``estimate=True``), a
                sequence of :class:`~diffsoup.inference.Parameter`, or a ``ParameterBox``
                (returned as it is, or narrowed to ``parameters``).
            parameters: the names to draw (entry names ``k[member]`` or parameter names, which
                cover all their entries); None takes every estimated one.

        Raises:
            TypeError: for another kind of ``source``.
            ValueError: for an unknown name in ``parameters``, or a parameter without finite bounds.
        """
        if isinstance(source, ParameterBox):
            rows = list(zip(source.names, source.lower, source.upper, source.scales, source.names))
        elif isinstance(source, Study):
            rows = [(e.name, e.parameter.lower, e.parameter.upper, e.parameter.scale, e.parameter.name)
                    for e in source.entries if e.parameter.estimate or parameters is not None]  # fmt: skip
        elif isinstance(source, Sequence) and all(isinstance(p, Parameter) for p in source) and source:
            rows = [(p.name, p.lower, p.upper, p.scale, p.name) for p in source]
        else:
            raise TypeError(
                "ParameterBox.of: give a ds.Study, a sequence of ds.inference.Parameter rows or a ParameterBox, "
                f"not {type(source).__name__}."
            )
        if parameters is not None:
            if isinstance(parameters, str):
                raise TypeError("ParameterBox.of: parameters= is a sequence of names, not one string.")
            known = {r[0] for r in rows} | {r[4] for r in rows}
            unknown = [n for n in parameters if n not in known]
            if unknown:
                raise ValueError(f"ParameterBox.of: unknown parameter(s) {unknown}; the table has {sorted(known)}.")
            wanted = set(parameters)
            rows = [r for r in rows if r[0] in wanted or r[4] in wanted]
        return cls(tuple(r[0] for r in rows), tuple(r[1] for r in rows), tuple(r[2] for r in rows),
                   tuple(r[3] for r in rows))  # fmt: skip

    @property
    def dimension(self) -> int:
        """How many parameters are drawn."""
        return len(self.names)

    def values(self, unit: Any) -> np.ndarray:
        """Linear values ``(..., d)`` of points ``unit`` of the unit cube ``[0, 1)^d``: uniform on
        each parameter's scale between its bounds."""
        unit = np.asarray(unit, dtype=np.float64)
        if unit.shape[-1:] != (self.dimension,):
            raise ValueError(f"ParameterBox.values: points have shape {unit.shape}; the last axis must be {self.dimension}.")
        out = np.empty_like(unit)
        for i, (lo, hi, sc) in enumerate(zip(self.lower, self.upper, self.scales)):
            a, b = _scale(sc, lo), _scale(sc, hi)
            out[..., i] = _unscale(sc, a + unit[..., i] * (b - a))
        return out

    def unit(self, values: Any) -> np.ndarray:
        """The inverse of :meth:`values`: points of the unit cube of linear values ``(..., d)``."""
        values = np.asarray(values, dtype=np.float64)
        if values.shape[-1:] != (self.dimension,):
            raise ValueError(f"ParameterBox.unit: values have shape {values.shape}; the last axis must be {self.dimension}.")
        out = np.empty_like(values)
        for i, (lo, hi, sc) in enumerate(zip(self.lower, self.upper, self.scales)):
            a, b = _scale(sc, lo), _scale(sc, hi)
            out[..., i] = (_scale(sc, values[..., i]) - a) / (b - a)
        return out


def check_count(n: Any, what: str = "n") -> int:
    """``n`` as a positive int, or a ValueError naming ``what``."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{what}={n!r} must be a positive integer (how many draws).")
    return int(n)


def check_method(method: str, n: int) -> str:
    """``method`` checked: ``"lhs"`` or ``"sobol"``; Sobol' points need ``n`` a power of 2.

    Raises:
        ValueError: naming the method or ``n`` and the fix.
    """
    if method not in SAMPLING_METHODS:
        raise ValueError(f"method={method!r} must be one of {SAMPLING_METHODS} (Latin hypercube or Sobol' points).")
    if method == "sobol" and n & (n - 1):
        below = 1 << (n.bit_length() - 1)
        raise ValueError(
            f"Sobol' points keep their balance only in counts that are powers of 2; n={n} is not. "
            f"Give n={below} or n={2 * below}, or method='lhs'."
        )
    return method


def latin_hypercube_unit(n: int, d: int, seed: int) -> np.ndarray:
    """``n`` Latin hypercube points ``(n, d)`` of the unit cube (scipy.stats.qmc, ``seed`` fixes them)."""
    from scipy.stats import qmc

    return qmc.LatinHypercube(d, rng=np.random.default_rng(seed)).random(n)


def sobol_unit(start: int, count: int, d: int, seed: int) -> np.ndarray:
    """Rows ``start .. start + count`` of the scrambled Sobol' sequence of dimension ``d`` that
    ``seed`` fixes (scipy.stats.qmc): any split of the sequence into pieces gives the same points."""
    from scipy.stats import qmc

    engine = qmc.Sobol(d, scramble=True, rng=np.random.default_rng(seed))
    if start:
        engine.fast_forward(start)
    with warnings.catch_warnings():
        # A piece of the sequence need not be a power of 2: the whole sequence's count is (check_method).
        warnings.filterwarnings("ignore", message=".*balance properties of Sobol.*", category=UserWarning)
        return engine.random(count)


def unit_draws(method: str, start: int, count: int, n: int, d: int, seed: int) -> np.ndarray:
    """Rows ``start .. start + count`` of ``n`` draws ``(n, d)`` of the unit cube by ``method``
    (the Latin hypercube is built whole, the Sobol' sequence from ``start``)."""
    if method == "sobol":
        return sobol_unit(start, count, d, seed)
    return latin_hypercube_unit(n, d, seed)[start : start + count]


def latin_hypercube(source: Any, n: int, *, seed: int = 0, parameters: Sequence[str] | None = None) -> np.ndarray:
    """``n`` Latin hypercube draws ``(n, d)`` (linear values) from a study's parameter table on
    its scales (see :class:`ParameterBox`; columns in the order of ``ParameterBox.of(source).names``).

    Raises:
        ValueError: for a bad ``n`` or parameter name.
    """
    box = ParameterBox.of(source, parameters)
    n = check_count(n)
    return box.values(latin_hypercube_unit(n, box.dimension, seed))


def sobol(source: Any, n: int, *, seed: int = 0, parameters: Sequence[str] | None = None) -> np.ndarray:
    """``n`` scrambled Sobol' draws ``(n, d)`` (linear values; ``n`` a power of 2) from a study's
    parameter table on its scales (columns as :func:`latin_hypercube`'s).

    Raises:
        ValueError: for a bad ``n`` (not a power of 2) or parameter name.
    """
    box = ParameterBox.of(source, parameters)
    n = check_count(n)
    check_method("sobol", n)
    return box.values(sobol_unit(0, n, box.dimension, seed))


def saltelli_unit(start: int, count: int, d: int, seed: int) -> np.ndarray:
    """Draws ``start .. start + count`` of Saltelli's design in the unit cube, as rows
    ``(count * (d + 2), d)``: per draw ``A_j, B_j, AB_1j, ..., AB_dj`` (``AB_ij`` is ``A_j`` with
    coordinate ``i`` from ``B_j``); ``A`` and ``B`` are the two halves of a ``2d``-dimensional
    scrambled Sobol' sequence."""
    both = sobol_unit(start, count, 2 * d, seed)
    a, b = both[:, :d], both[:, d:]
    rows = np.repeat(a[:, None, :], d + 2, axis=1)
    rows[:, ROW_B] = b
    index = np.arange(d)
    rows[:, FIRST_AB + index, index] = b[:, index]
    return rows.reshape(count * (d + 2), d)


class Moments(dict):
    """Count, mean and sum of squared deviations (``n``, ``mean``, ``m2``) of per-draw terms, merged
    chunk by chunk with Chan, Golub and LeVeque's update (no cancellation of large means)."""


def _moments(x: np.ndarray) -> Moments:
    n = np.full(x.shape[1:], float(x.shape[0]))
    mean = x.mean(axis=0)
    return Moments(n=n, mean=mean, m2=((x - mean) ** 2).sum(axis=0))


def _merge_moments(a: Moments, b: Moments) -> Moments:
    n = a["n"] + b["n"]
    with np.errstate(invalid="ignore", divide="ignore"):
        delta = b["mean"] - a["mean"]
        frac = np.where(n > 0, b["n"] / np.where(n > 0, n, 1.0), 0.0)
        return Moments(n=n, mean=a["mean"] + delta * frac, m2=a["m2"] + b["m2"] + delta * delta * a["n"] * frac)


def saltelli_partial(values: Any, d: int) -> dict[str, Moments]:
    """What Saltelli's estimators need from the whole draws held by ``values`` (rows in the layout
    of :func:`saltelli_unit`, any trailing shape ``S``): moments of ``f`` over the rows of ``A``
    and ``B`` (``"output"``, shape ``S``), of ``f(B) (f(AB_i) - f(A))`` (``"first"``, ``(d, *S)``)
    and of ``(f(A) - f(AB_i))^2 / 2`` (``"total"``). Merge partials with :func:`merge_partials`.

    Failed simulations (NaN) make the moments NaN where they count.

    Raises:
        ValueError: if the rows are not whole draws (a multiple of ``d + 2``).
    """
    values = np.asarray(values, dtype=np.float64)
    rows = values.shape[0]
    if rows % (d + 2):
        raise ValueError(f"saltelli_partial: {rows} rows are not whole draws of {d + 2} rows each.")
    v = values.reshape(rows // (d + 2), d + 2, *values.shape[1:])
    fa, fb, fab = v[:, ROW_A], v[:, ROW_B], v[:, FIRST_AB:]
    return {
        "output": _moments(np.concatenate([fa, fb])),
        "first": _moments(fb[:, None] * (fab - fa[:, None])),
        "total": _moments(0.5 * (fa[:, None] - fab) ** 2),
    }


def merge_partials(parts: Sequence[dict[str, Moments]]) -> dict[str, Moments]:
    """One partial of the draws of all ``parts`` (:func:`saltelli_partial`)."""
    parts = list(parts)
    out = parts[0]
    for p in parts[1:]:
        out = {k: _merge_moments(out[k], p[k]) for k in out}
    return out


@dataclasses.dataclass(frozen=True)
class SobolIndices:
    """Sobol' indices of every output cell, by parameter.

    Attributes:
        names: the parameters, in the order of the leading axis.
        first: first-order indices ``S_i`` ``(d, *S)`` (Saltelli 2010), ``S`` the outputs' shape.
        total: total-order indices ``T_i`` ``(d, *S)`` (Jansen 1999).
        first_error, total_error: their standard errors (sampling error of the estimators).
        variance: the output's variance ``S`` (indices are NaN where it is 0: a constant output).
        draws: the number of draws ``n`` (each ``d + 2`` simulations).
    """

    names: tuple[str, ...]
    first: np.ndarray
    total: np.ndarray
    first_error: np.ndarray
    total_error: np.ndarray
    variance: np.ndarray
    draws: int


def saltelli_indices(partial: dict[str, Moments], names: Sequence[str]) -> SobolIndices:
    """:class:`SobolIndices` from the partial of all draws (:func:`merge_partials`)."""
    out = partial["output"]
    with np.errstate(divide="ignore", invalid="ignore"):
        variance = out["m2"] / (out["n"] - 1)
        result = {}
        for name in ("first", "total"):
            m = partial[name]
            n = m["n"]
            result[name] = m["mean"] / variance
            result[f"{name}_error"] = np.sqrt(m["m2"] / np.maximum(n - 1, 1) / n) / variance
    draws = int(np.max(partial["first"]["n"])) if partial["first"]["n"].size else 0
    return SobolIndices(tuple(names), variance=variance, draws=draws, **result)
