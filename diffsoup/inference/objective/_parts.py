"""Partial results of a lowered study's evaluations: one typed part per evaluation mode.

A part holds what one evaluation of some experiments gives, in a form that adds up over disjoint
sets of experiments: sums (the value, the gradient, ``J^T J``, ...) before the study-wide scale and
offset are applied, residual rows keyed by experiment index. ``AbstractLoweredStudy.evaluate``
returns one; ``combine_parts`` (or ``SomePart.combine``) joins the parts of a split of the
experiments -- shards held by Dask workers, the processes of a run -- into the part of their union,
and the lowered study turns a part into the values its public methods return.

Every part also carries its experiments' bookkeeping: ``failures`` (experiment id -> ``ds.Status``
of each failed solve) and ``steps`` (experiment index, study order -> accepted steps).

=============== ======================= ===================================================
mode            part                    fields (sums over the part's experiments)
=============== ======================= ===================================================
value           :class:`ValuePart`      ``value``
value_and_grad  :class:`GradientPart`   ``value``, ``grad``
residuals       :class:`ResidualsPart`  ``residuals`` (index -> rows)
jacobian        :class:`JacobianPart`   ``residuals``, ``jacobian`` (index -> rows)
gauss_newton    :class:`GaussNewtonPart` ``sum_sq`` (``||r||^2``), ``jtr`` (``J^T r``), ``jtj``
hessian         :class:`HessianPart`    ``hessian`` (not symmetrised)
=============== ======================= ===================================================
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import numpy as np


@dataclasses.dataclass(frozen=True, kw_only=True)
class AbstractPart(abc.ABC):
    """What one evaluation of some experiments gives, ready to be combined with other parts.

    Attributes:
        failures: experiment id -> ``ds.Status`` of the solves that failed.
        steps: experiment index (study order) -> accepted steps; its keys are the experiments
            the part covers.
    """

    mode: ClassVar[str]

    failures: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    steps: Mapping[int, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def combine(cls, parts: Iterable["AbstractPart"]) -> "AbstractPart":
        """The part of the union of ``parts``' experiments (summed in the order given).

        Raises:
            ValueError: for no parts, or parts that share an experiment.
            TypeError: for a part of another mode.
        """
        parts = tuple(parts)
        if not parts:
            raise ValueError(f"{cls.__name__}.combine: no parts to combine.")
        for p in parts:
            if type(p) is not cls:
                raise TypeError(f"{cls.__name__}.combine: got a {type(p).__name__}; combine parts of one mode.")
        failures: dict = {}
        steps: dict = {}
        for p in parts:
            shared = steps.keys() & p.steps.keys()
            if shared:
                raise ValueError(f"{cls.__name__}.combine: experiments {sorted(shared)} (study indices) are in two "
                                 "parts; combine the parts of disjoint sets of experiments.")  # fmt: skip
            steps.update(p.steps)
            failures.update(p.failures)
        return cls(**cls._sum(parts), failures=failures, steps=steps)

    @classmethod
    @abc.abstractmethod
    def _sum(cls, parts: tuple) -> dict:
        """The mode's fields of the union of ``parts`` (by field name)."""


def _total(values):
    out = values[0]
    for v in values[1:]:
        out = out + v
    return out


def _merged_rows(maps) -> dict:
    out: dict = {}
    for m in maps:
        out.update(m)
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class ValuePart(AbstractPart):
    """``value``: the sum of the experiments' objective terms."""

    mode: ClassVar[str] = "value"
    value: float

    @classmethod
    def _sum(cls, parts):
        return {"value": float(_total([p.value for p in parts]))}


@dataclasses.dataclass(frozen=True, kw_only=True)
class GradientPart(AbstractPart):
    """``value`` and ``grad`` (the adjoint gradient), sums over the experiments."""

    mode: ClassVar[str] = "value_and_grad"
    value: float
    grad: np.ndarray

    @classmethod
    def _sum(cls, parts):
        return {"value": float(_total([p.value for p in parts])), "grad": _total([np.asarray(p.grad) for p in parts])}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResidualsPart(AbstractPart):
    """``residuals``: experiment index -> its residuals ``(R_e,)``."""

    mode: ClassVar[str] = "residuals"
    residuals: Mapping[int, np.ndarray]

    @classmethod
    def _sum(cls, parts):
        return {"residuals": _merged_rows(p.residuals for p in parts)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class JacobianPart(AbstractPart):
    """``residuals`` (index -> ``(R_e,)``) and ``jacobian`` (index -> ``(R_e, n_theta)``, forward
    sensitivities)."""

    mode: ClassVar[str] = "jacobian"
    residuals: Mapping[int, np.ndarray]
    jacobian: Mapping[int, np.ndarray]

    @classmethod
    def _sum(cls, parts):
        return {"residuals": _merged_rows(p.residuals for p in parts),
                "jacobian": _merged_rows(p.jacobian for p in parts)}  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class GaussNewtonPart(AbstractPart):
    """``sum_sq = r^T r``, ``jtr = J^T r``, ``jtj = J^T J`` over the experiments' residuals (before
    the objective's ``scale`` and ``offset``: value ``scale sum_sq + offset``, gradient ``2 scale jtr``,
    Gauss-Newton Hessian ``2 scale jtj``)."""

    mode: ClassVar[str] = "gauss_newton"
    sum_sq: float
    jtr: np.ndarray
    jtj: np.ndarray

    @classmethod
    def _sum(cls, parts):
        return {"sum_sq": float(_total([p.sum_sq for p in parts])), "jtr": _total([np.asarray(p.jtr) for p in parts]),
                "jtj": _total([np.asarray(p.jtj) for p in parts])}  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class HessianPart(AbstractPart):
    """``hessian``: the sum of the experiments' Hessians (exact or differences of gradients), not
    symmetrised."""

    mode: ClassVar[str] = "hessian"
    hessian: np.ndarray

    @classmethod
    def _sum(cls, parts):
        return {"hessian": _total([np.asarray(p.hessian) for p in parts])}


PART_TYPES: Mapping[str, type[AbstractPart]] = {
    t.mode: t for t in (ValuePart, GradientPart, ResidualsPart, JacobianPart, GaussNewtonPart, HessianPart)
}
EVALUATION_MODES = tuple(PART_TYPES)


def combine_parts(parts: Iterable[AbstractPart]) -> AbstractPart:
    """The part of the union of ``parts``' experiments; every part must be of one mode.

    Raises:
        ValueError: for no parts, or parts that share an experiment.
        TypeError: for parts of several modes, or something not a part.
    """
    parts = tuple(parts)
    if not parts:
        raise ValueError("combine_parts: no parts to combine.")
    first = type(parts[0])
    if not issubclass(first, AbstractPart):
        raise TypeError(f"combine_parts: {first.__name__} is not a part of an evaluation (ds.inference.*Part).")
    return first.combine(parts)
