"""Noise models of measured values: ``Gaussian``, ``LogNormal``, ``Laplace``, ``LogLaplace``.

Each model is a distribution (normal or Laplace) of the measured value given the observable, on a
linear or a logarithmic scale (any base: ``math.e``, or 10 for PEtab's ``log10``). Its spread
(``sigma`` of the normal models, ``scale`` of the Laplace ones) is, per measured value:

- a positive number;
- the name of a study parameter (estimated, resolved like ``Experiment.parameters``: a level-owned
  parameter takes the experiment's member);
- an array broadcastable to the experiment's data shape ``(m, k)`` (``(m,)`` for a model of one
  column, see below) whose cells are numbers or study-parameter names (an object array, e.g.
  PEtab's per-measurement ``noiseParameters``);
- a callable ``spread(t, h, p) -> (k,)`` of the measurement time ``t`` (a scalar), the observables
  ``h`` at that time ``(k,)`` and ``p``, the dict of the experiment's model parameters and
  observable parameters by name (a model of one column may return a scalar).

The negative log-likelihood of one measured value ``d`` with observable ``h`` and spread ``s``
(exactly ``-petab.v1.calculate_llh``'s per-measurement term):

=================== ===================================================================
Gaussian            ``0.5 r^2 + log s + 0.5 log 2 pi``, ``r = (h - d) / s``
LogNormal (base b)  ``0.5 r^2 + log s + 0.5 log 2 pi + log(d ln b)``,
                    ``r = (log_b h - log_b d) / s``
Laplace             ``|h - d| / s + log 2s``
LogLaplace (base b) ``|log_b h - log_b d| / s + log(2 s d ln b)``
=================== ===================================================================
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any, ClassVar

NORMAL = "normal"
LAPLACE = "laplace"

# How a group of experiments gets its spreads: fixed numbers, one named spread per experiment
# (``noise.sigma="name"``), or a spread per cell.
SIGMA_FIXED, SIGMA_ENTRY, SIGMA_CELLS = "fixed", "entry", "cells"


class AbstractNoise(abc.ABC):
    """A noise model of an experiment's measured values (see the module's table).

    Attributes:
        distribution: ``"normal"`` or ``"laplace"`` (class attribute).
        spread_field: the name of the spread's field, ``"sigma"`` or ``"scale"`` (class attribute).
        spread: the spread as given (number, study-parameter name, array or callable).
        log_base: the base of the logarithmic scale, or None for the linear scale.
    """

    distribution: ClassVar[str]
    spread_field: ClassVar[str]

    @property
    def spread(self) -> Any:
        return getattr(self, self.spread_field)

    @property
    @abc.abstractmethod
    def log_base(self) -> float | None:
        """The base of the logarithm the measured values are compared on (None: linear)."""

    @property
    def kind(self) -> tuple:
        """What the compiled term depends on: ``(distribution, log_base)``."""
        return (self.distribution, self.log_base)


def _checked_base(owner: str, base: Any) -> float:
    try:
        b = float(base)
    except (TypeError, ValueError):
        raise ValueError(f"{owner}: base={base!r} must be a number (math.e, 10, ...).") from None
    if not (b > 0 and math.isfinite(b) and b != 1.0):
        raise ValueError(f"{owner}: base={base!r} must be positive, finite and not 1.")
    return b


@dataclasses.dataclass(frozen=True, eq=False)
class Gaussian(AbstractNoise):
    """Additive Gaussian noise: ``data = observable + sigma * N(0, 1)``.

    Args:
        sigma: the standard deviation: a positive number, a study-parameter name, an array of
            numbers or names broadcastable to the data shape ``(m, k)``, or a callable
            ``sigma(t, h, p)`` (see :mod:`diffsoup.inference.study._noise`).
    """

    sigma: Any = 1.0
    distribution: ClassVar[str] = NORMAL
    spread_field: ClassVar[str] = "sigma"

    @property
    def log_base(self) -> None:
        return None


@dataclasses.dataclass(frozen=True, eq=False)
class LogNormal(AbstractNoise):
    """Multiplicative (log-normal) noise: ``log_b(data) = log_b(observable) + sigma * N(0, 1)``.

    Data and observables must be positive. ``sigma`` is as for :class:`Gaussian`, on the log scale.

    Args:
        sigma: the standard deviation of ``log_b(data)``.
        base: the logarithm's base: ``math.e`` (default) or 10 (PEtab's ``log10``).
    """

    sigma: Any = 0.1
    base: float = math.e
    distribution: ClassVar[str] = NORMAL
    spread_field: ClassVar[str] = "sigma"

    def __post_init__(self):
        object.__setattr__(self, "base", _checked_base("LogNormal", self.base))

    @property
    def log_base(self) -> float:
        return self.base


@dataclasses.dataclass(frozen=True, eq=False)
class Laplace(AbstractNoise):
    """Additive Laplace noise: density ``exp(-|data - observable| / scale) / (2 scale)``.

    Its Gauss-Newton residual, ``sqrt(2 |h - d| / scale)``, is not differentiable where the
    observable meets the data (its derivative is taken as 0 there).

    Args:
        scale: the Laplace scale (as ``sigma`` of :class:`Gaussian`).
    """

    scale: Any = 1.0
    distribution: ClassVar[str] = LAPLACE
    spread_field: ClassVar[str] = "scale"

    @property
    def log_base(self) -> None:
        return None


@dataclasses.dataclass(frozen=True, eq=False)
class LogLaplace(AbstractNoise):
    """Laplace noise of ``log_b(data)`` around ``log_b(observable)``; data and observables positive.

    Args:
        scale: the Laplace scale on the log scale (as ``sigma`` of :class:`Gaussian`).
        base: the logarithm's base: ``math.e`` (default) or 10.
    """

    scale: Any = 0.1
    base: float = math.e
    distribution: ClassVar[str] = LAPLACE
    spread_field: ClassVar[str] = "scale"

    def __post_init__(self):
        object.__setattr__(self, "base", _checked_base("LogLaplace", self.base))

    @property
    def log_base(self) -> float:
        return self.base


NOISE_MODELS = (Gaussian, LogNormal, Laplace, LogLaplace)
