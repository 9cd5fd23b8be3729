"""Noise models of measured values: ``Gaussian``, ``LogNormal``, ``Laplace``, ``LogLaplace``, and the
:class:`AbstractNoise` a new model subclasses (one class, in any file: it registers itself by name).

Each model is a location-scale family of the measured value ``d`` given the observable ``h`` on a
comparison scale ``T`` (the identity, or ``log_b`` of any base: ``math.e``, or 10 for PEtab's
``log10``): with ``z = (T(h) - T(d)) / s`` and the spread ``s`` (``sigma`` of the normal models,
``scale`` of the Laplace ones), the negative log-likelihood of one value is

    ``nll = penalty(z) + log s + log_normaliser + log |T'(d)|``

(exactly ``-petab.v1.calculate_llh``'s per-measurement term for the four models here):

=================== ===================================================================
Gaussian            ``0.5 z^2 + log s + 0.5 log 2 pi``, ``z = (h - d) / s``
LogNormal (base b)  ``0.5 z^2 + log s + 0.5 log 2 pi + log(d ln b)``,
                    ``z = (log_b h - log_b d) / s``
Laplace             ``|z| + log 2s``
LogLaplace (base b) ``|z| + log(2 s d ln b)``
=================== ===================================================================

A model carries its maths as methods, pure ``jax.numpy`` on arrays (the objective calls them
inside jit, cell by cell): :meth:`AbstractNoise.transform` (``T``), :meth:`~AbstractNoise.penalty`
(the part of the nll that depends on ``z``), :meth:`~AbstractNoise.residual` (the Gauss-Newton
residual, with ``0.5 residual(z)^2 = penalty(z)``) and :meth:`~AbstractNoise.spread_nll` (``log
s``); on the host :attr:`~AbstractNoise.log_normaliser` and :meth:`~AbstractNoise.log_jacobian`
give the constants. Its spread is, per measured value:

- a positive number;
- the name of a study parameter (estimated, resolved like ``Experiment.parameters``: a level-owned
  parameter takes the experiment's member);
- an array broadcastable to the experiment's data shape ``(m, k)`` (``(m,)`` for a model of one
  column) whose cells are numbers or study-parameter names (an object array, e.g. PEtab's
  per-measurement ``noiseParameters``);
- a callable ``spread(t, h, p) -> (k,)`` of the measurement time ``t`` (a scalar), the observables
  ``h`` at that time ``(k,)`` and ``p``, the dict of the experiment's model parameters and
  observable parameters by name (a model of one column may return a scalar).

A subclass with a ``name`` class attribute registers itself: study files (``model = "<name>"``) and
PEtab problems (``noiseDistribution`` = its ``distribution``, on a logarithmic
``observableTransformation`` the subclass with ``logarithmic = True``) find it by that name
(:func:`noise_class`, :func:`petab_noise_class`).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
from typing import Any, ClassVar, NamedTuple

import jax.numpy as jnp
import numpy as np

NORMAL = "normal"
LAPLACE = "laplace"

# How a group of experiments gets its spreads: fixed numbers, one named spread per experiment
# (``noise.sigma="name"``), or a spread per cell.
SIGMA_FIXED, SIGMA_ENTRY, SIGMA_CELLS = "fixed", "entry", "cells"

# name -> noise model class, filled by AbstractNoise.__init_subclass__.
_REGISTRY: dict[str, type] = {}


class NoiseKind(NamedTuple):
    """What a compiled objective depends on of a noise model: its class and its fields other than
    the spread (hashable; equal kinds compile the same program).

    Attributes:
        model: the noise model's class.
        fields: ``(name, value)`` of its dataclass fields besides the spread (e.g. ``base``).
    """

    model: type
    fields: tuple

    def law(self) -> "AbstractNoise":
        """A model of this kind (with a unit spread, never read): the object whose methods the
        compiled term calls."""
        return _law(self)


@functools.cache
def _law(kind: NoiseKind) -> "AbstractNoise":
    return kind.model(**{kind.model.spread_field: 1.0}, **dict(kind.fields))


def _sqrt0(x):
    """``sqrt(x)`` for ``x >= 0`` with derivative 0 (not inf) at 0."""
    pos = x > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0)


class AbstractNoise(abc.ABC):
    """A noise model of an experiment's measured values (see the module's docstring).

    A subclass is a frozen dataclass (``@dataclasses.dataclass(frozen=True, eq=False)``) with a
    spread field; it implements :meth:`penalty`, :meth:`residual` and :attr:`log_normaliser`, and
    may override :meth:`transform` with :meth:`log_jacobian` (a logarithmic model sets
    :attr:`log_base`) and :meth:`spread_nll`.

    Class attributes:
        name: the registry name (study files' ``model = "..."``); a subclass that sets it registers
            itself (:func:`noise_class`).
        distribution: the density of ``z`` by PEtab's ``noiseDistribution`` name (``"normal"``,
            ``"laplace"``, or a name of its own).
        logarithmic: the model compares on ``log_b`` (PEtab's ``log``/``log10`` transformations
            map to it, with ``base=``).
        spread_field: the name of the spread's field, ``"sigma"`` or ``"scale"``.
        least_squares: ``penalty(z) = 0.5 residual(z)^2`` with ``residual(z) = z`` exactly (the
            normal models: ``objective="chi2"`` needs it).

    Attributes:
        spread: the spread as given (number, study-parameter name, array or callable).
        log_base: the base of the logarithmic scale, or None for the linear scale.
    """

    name: ClassVar[str]
    distribution: ClassVar[str]
    spread_field: ClassVar[str]
    logarithmic: ClassVar[bool] = False
    least_squares: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if name is None:
            return
        if not isinstance(name, str) or not name:
            raise TypeError(f"{cls.__name__}: the class attribute name must be a non-empty string, not {name!r}.")
        known = _REGISTRY.get(name)
        if known is not None and known.__qualname__ != cls.__qualname__:
            raise ValueError(f"{cls.__name__}: noise model name {name!r} is taken by {known.__qualname__}; give "
                             "the class another name = ...")  # fmt: skip
        _REGISTRY[name] = cls

    @property
    def spread(self) -> Any:
        return getattr(self, self.spread_field)

    @property
    def log_base(self) -> float | None:
        """The base of the logarithm the measured values are compared on (None: linear)."""
        return None

    @property
    def kind(self) -> NoiseKind:
        """What the compiled term depends on: the class and the fields besides the spread."""
        if not dataclasses.is_dataclass(self):
            raise TypeError(f"{type(self).__name__}: a noise model is a frozen dataclass; decorate it with "
                            "@dataclasses.dataclass(frozen=True, eq=False).")  # fmt: skip
        fields = tuple((f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != self.spread_field)
        return NoiseKind(type(self), fields)

    # -- the maths of one cell (jax.numpy, traced inside the objective's programs) ---------------
    def transform(self, x, *, clip: bool = False):
        """The comparison scale ``T(x)``: the identity, or ``log_b(x)`` for a logarithmic model
        (``clip``: of ``max(x, tiny)``, finite for a non-positive observable)."""
        base = self.log_base
        if base is None:
            return x
        lx = jnp.log(jnp.maximum(x, jnp.finfo(x.dtype).tiny)) if clip else jnp.log(x)
        return lx if base == math.e else lx / math.log(base)

    @abc.abstractmethod
    def penalty(self, z):
        """The part of the negative log-likelihood that depends on ``z = (T(h) - T(d)) / s``."""

    @abc.abstractmethod
    def residual(self, z):
        """The Gauss-Newton residual of ``z``: ``0.5 residual(z)^2 = penalty(z)``."""

    def spread_nll(self, s):
        """The spread's term of the negative log-likelihood, ``log s`` (a location-scale density
        ``g(z) / s``); with a spread from a parameter or a function it gets a residual of its own,
        ``sqrt(2 spread_nll(s) + K)`` (``K`` from the spreads' lower bounds)."""
        return jnp.log(s)

    # -- host constants (numpy) -----------------------------------------------------------------
    @property
    @abc.abstractmethod
    def log_normaliser(self) -> float:
        """The constant of the negative log-likelihood on the comparison scale (``-log g(0)``
        less ``penalty(0)``): ``0.5 log 2 pi`` normal, ``log 2`` Laplace."""

    def log_jacobian(self, d):
        """``log |T'(d)|`` of measured values ``d`` (numpy): ``log(d ln b)`` on a logarithmic
        scale (``log d`` for base e), 0 on the linear one."""
        base = self.log_base
        if base is None:
            return np.zeros(np.shape(d))
        out = np.log(d)
        return out if base == math.e else out + math.log(math.log(base))


def noise_class(name: str) -> type:
    """The registered noise model class called ``name`` (``"gaussian"``, ``"lognormal"``, ...).

    Raises:
        ValueError: for a name no class registered, listing the known ones.
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"noise model {name!r} is unknown; known models: {', '.join(noise_names())} (a subclass "
                         "of ds.inference.AbstractNoise with name = ... adds one).") from None  # fmt: skip


def noise_names() -> tuple[str, ...]:
    """The registered noise models' names, in registration order."""
    return tuple(_REGISTRY)


def petab_noise_class(distribution: str, transformation: str) -> tuple[type, dict]:
    """The noise model class and its keyword arguments for PEtab's ``noiseDistribution`` and
    ``observableTransformation`` (``"lin"``, ``"log"``, ``"log10"``).

    Raises:
        ValueError: for a distribution or transformation no registered class has.
    """
    bases = {"lin": None, "log": math.e, "log10": 10.0}
    if transformation not in bases:
        raise ValueError(f"observableTransformation {transformation!r} is unknown; PEtab has {', '.join(bases)}.")
    base = bases[transformation]
    for cls in _REGISTRY.values():
        if cls.distribution == distribution and cls.logarithmic == (base is not None):
            return cls, ({} if base is None else {"base": base})
    known = sorted({cls.distribution for cls in _REGISTRY.values()})
    raise ValueError(f"noiseDistribution {distribution!r} with observableTransformation {transformation!r} has no noise "
                     f"model; known distributions: {', '.join(known)}.")  # fmt: skip


def _checked_base(owner: str, base: Any) -> float:
    try:
        b = float(base)
    except (TypeError, ValueError):
        raise ValueError(f"{owner}: base={base!r} must be a number (math.e, 10, ...).") from None
    if not (b > 0 and math.isfinite(b) and b != 1.0):
        raise ValueError(f"{owner}: base={base!r} must be positive, finite and not 1.")
    return b


class _Normal(AbstractNoise):
    """The normal density of ``z``: ``penalty 0.5 z^2``, residual ``z``."""

    distribution: ClassVar[str] = NORMAL
    spread_field: ClassVar[str] = "sigma"
    least_squares: ClassVar[bool] = True

    def penalty(self, z):
        return 0.5 * z * z

    def residual(self, z):
        return z

    @property
    def log_normaliser(self) -> float:
        return 0.5 * math.log(2 * math.pi)


class _Laplace(AbstractNoise):
    """The Laplace density of ``z``: penalty ``|z|``, residual ``sqrt(2 |z|)`` (derivative 0 at 0)."""

    distribution: ClassVar[str] = LAPLACE
    spread_field: ClassVar[str] = "scale"

    def penalty(self, z):
        return jnp.abs(z)

    def residual(self, z):
        return _sqrt0(2.0 * jnp.abs(z))

    @property
    def log_normaliser(self) -> float:
        return math.log(2.0)


@dataclasses.dataclass(frozen=True, eq=False)
class Gaussian(_Normal):
    """Additive Gaussian noise: ``data = observable + sigma * N(0, 1)``.

    Args:
        sigma: the standard deviation: a positive number, a study-parameter name, an array of
            numbers or names broadcastable to the data shape ``(m, k)``, or a callable
            ``sigma(t, h, p)`` (see :mod:`diffsoup.inference.study._noise`).
    """

    sigma: Any = 1.0
    name: ClassVar[str] = "gaussian"


@dataclasses.dataclass(frozen=True, eq=False)
class LogNormal(_Normal):
    """Multiplicative (log-normal) noise: ``log_b(data) = log_b(observable) + sigma * N(0, 1)``.

    Data and observables must be positive. ``sigma`` is as for :class:`Gaussian`, on the log scale.

    Args:
        sigma: the standard deviation of ``log_b(data)``.
        base: the logarithm's base: ``math.e`` (default) or 10 (PEtab's ``log10``).
    """

    sigma: Any = 0.1
    base: float = math.e
    name: ClassVar[str] = "lognormal"
    logarithmic: ClassVar[bool] = True

    def __post_init__(self):
        object.__setattr__(self, "base", _checked_base("LogNormal", self.base))

    @property
    def log_base(self) -> float:
        return self.base


@dataclasses.dataclass(frozen=True, eq=False)
class Laplace(_Laplace):
    """Additive Laplace noise: density ``exp(-|data - observable| / scale) / (2 scale)``.

    Its Gauss-Newton residual, ``sqrt(2 |h - d| / scale)``, is not differentiable where the
    observable meets the data (its derivative is taken as 0 there).

    Args:
        scale: the Laplace scale (as ``sigma`` of :class:`Gaussian`).
    """

    scale: Any = 1.0
    name: ClassVar[str] = "laplace"


@dataclasses.dataclass(frozen=True, eq=False)
class LogLaplace(_Laplace):
    """Laplace noise of ``log_b(data)`` around ``log_b(observable)``; data and observables positive.

    Args:
        scale: the Laplace scale on the log scale (as ``sigma`` of :class:`Gaussian`).
        base: the logarithm's base: ``math.e`` (default) or 10.
    """

    scale: Any = 0.1
    base: float = math.e
    name: ClassVar[str] = "loglaplace"
    logarithmic: ClassVar[bool] = True

    def __post_init__(self):
        object.__setattr__(self, "base", _checked_base("LogLaplace", self.base))

    @property
    def log_base(self) -> float:
        return self.base


NOISE_MODELS = (Gaussian, LogNormal, Laplace, LogLaplace)
