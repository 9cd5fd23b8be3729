"""The noise of a study file: ``[noise]`` (and an experiment's ``noise``) read by :func:`read_noise`:
a noise model in ``/1``; in ``/2`` a :class:`NoiseSpec` (models with ``base``, Laplace, one per
observable column), turned into noise models by :func:`noise_model`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ..inference.study._noise import noise_class, noise_names
from ._reader import TomlReader
from ._study_format import NOISE_COLUMN_KEYS_2, NOISE_KEYS, NOISE_KEYS_2, NOISE_MODELS
from ._study_format import refuse_newer_keys


def read_noise(r: TomlReader, table: Any, field: tuple, version: int = 1):
    """A noise model (/1), or a :class:`NoiseSpec` (/2: models with ``base``, Laplace, per observable)."""
    table = r.table(table, field)
    if version == 1:
        refuse_newer_keys(r, table, NOISE_KEYS_2, NOISE_KEYS, field)
        r.keys(table, NOISE_KEYS, field)
        model = r.string(table.get("model", "gaussian"), field + ("model",), NOISE_MODELS)
        sigma = table.get("sigma", _default_spread(noise_class(model)))
        if not isinstance(sigma, str):
            sigma = r.number(sigma, field + ("sigma",), positive=True)
        return noise_model({"model": model, "base": None}, sigma)
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
    model = r.string(table.get("model", "gaussian"), field + ("model",), noise_names())
    cls = noise_class(model)
    sigma = table.get("sigma", _default_spread(cls))
    if not isinstance(sigma, str):
        sigma = r.number(sigma, field + ("sigma",), positive=True)
    base = None
    if "base" in table:
        if not cls.logarithmic:
            logarithmic = [name for name in noise_names() if noise_class(name).logarithmic]
            raise r.error(field + ("base",), f"only {' and '.join(logarithmic)} noise have a base (this is {model})")
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


def _default_spread(cls: type):
    """The default spread of a noise model class (its spread field's default)."""
    field = next(f for f in dataclasses.fields(cls) if f.name == cls.spread_field)
    return field.default


def noise_model(column: dict, spread):
    """The registered noise model ``column["model"]`` with ``spread`` (and ``base`` where given)."""
    cls = noise_class(column["model"])
    kw = {} if column["base"] is None else {"base": column["base"]}
    return cls(**{cls.spread_field: spread}, **kw)
