"""The noise of a study file: ``[noise]`` (and an experiment's ``noise``) read by :func:`read_noise`:
a noise model in ``/1``; in ``/2`` a :class:`NoiseSpec` (models with ``base``, Laplace, one per
observable column), turned into noise models by :func:`noise_model`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ..inference import Gaussian, Laplace, LogLaplace, LogNormal
from ._reader import TomlReader
from ._study_format import NOISE_COLUMN_KEYS_2, NOISE_KEYS, NOISE_KEYS_2, NOISE_MODELS, NOISE_MODELS_2
from ._study_format import refuse_newer_keys


def read_noise(r: TomlReader, table: Any, field: tuple, version: int = 1):
    """A noise model (/1), or a :class:`NoiseSpec` (/2: models with ``base``, Laplace, per observable)."""
    table = r.table(table, field)
    if version == 1:
        refuse_newer_keys(r, table, NOISE_KEYS_2, NOISE_KEYS, field)
        r.keys(table, NOISE_KEYS, field)
        model = r.string(table.get("model", "gaussian"), field + ("model",), NOISE_MODELS)
        sigma = table.get("sigma", 1.0 if model == "gaussian" else 0.1)
        if not isinstance(sigma, str):
            sigma = r.number(sigma, field + ("sigma",), positive=True)
        return (Gaussian if model == "gaussian" else LogNormal)(sigma)
    r.keys(table, NOISE_KEYS_2, field)
    default = _noise_column(r, {k: v for k, v in table.items() if k != "observables"}, field)
    per = {}
    for name, sub in r.table(table.get("observables", {}), field + ("observables",)).items():
        sub = r.table(sub, field + ("observables", name))
        r.keys(sub, NOISE_COLUMN_KEYS_2, field + ("observables", name))
        per[name] = _noise_column(r, {k: v for k, v in table.items() if k != "observables"} | sub,
                                  field + ("observables", name))  # fmt: skip
    return NoiseSpec(default, per, field)


def _noise_column(r: TomlReader, table: Mapping, field: tuple) -> dict:
    """One column's noise of a /2 file: ``{"model", "sigma", "base"}`` checked."""
    model = r.string(table.get("model", "gaussian"), field + ("model",), NOISE_MODELS_2)
    sigma = table.get("sigma", 1.0 if model in ("gaussian", "laplace") else 0.1)
    if not isinstance(sigma, str):
        sigma = r.number(sigma, field + ("sigma",), positive=True)
    base = None
    if "base" in table:
        if model not in ("lognormal", "loglaplace"):
            raise r.error(field + ("base",), f"only lognormal and loglaplace noise have a base (this is {model})")
        base = r.number(table["base"], field + ("base",), positive=True)
        if base == 1.0:
            raise r.error(field + ("base",), "the logarithm's base must not be 1 (use 2.718281828459045 or 10)")
    return {"model": model, "sigma": sigma, "base": base}


@dataclasses.dataclass(frozen=True)
class NoiseSpec:
    """The noise of a /2 file or experiment: a default column and per-observable columns."""

    default: dict
    per_observable: dict
    field: tuple

    def columns(self, names) -> list[dict]:
        return [self.per_observable.get(n, self.default) for n in names]


_NOISE_CLASSES = {"gaussian": Gaussian, "lognormal": LogNormal, "laplace": Laplace, "loglaplace": LogLaplace}


def noise_model(column: dict, spread):
    kw = {} if column["base"] is None else {"base": column["base"]}
    return _NOISE_CLASSES[column["model"]](spread, **kw)
