"""The ``[[experiments]]`` tables of a study file: :class:`ExperimentContext` reads each into a
``ds.Experiment`` (data file, observables, noise, conditions, parameters, initial state, groups,
multiple shooting), with the ``/2`` keys read by its part
:class:`~diffsoup.formats._study_v2.Version2Experiments`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..inference import Experiment, Multishoot
from ._data_files import DataTable, read_data_table
from ._expressions import Observables
from ._study_format import EXPERIMENT_KEYS, EXPERIMENT_KEYS_2, MULTISHOOT_KEYS, refuse_newer_keys
from ._study_noise import NoiseSpec, read_noise
from ._study_v2 import TimedObservables, Version2Experiments, parameter_values


class ExperimentContext(Version2Experiments):
    """What the ``[[experiments]]`` tables of one file share (the reader, the model's names, the
    defaults, the data files read); :meth:`experiment` reads one table."""

    def __init__(self, r, base, states, model_parameters, expressions, default_noise, study_names, levels, *,
                 version: int = 1):  # fmt: skip
        self.r, self.base = r, base
        self.version = version
        self.default_observable_parameters: dict = {}
        self.resets: dict[tuple, Any] = {}
        self.states, self.model_parameters = states, model_parameters
        self.expressions, self.default_noise = expressions, default_noise
        self.study_names, self.levels = study_names, levels
        self.observable_functions: dict[tuple, Any] = {}
        self.tables: dict[Path, DataTable] = {}

    def experiment(self, raw: Any, field: tuple):
        r = self.r
        raw = r.table(raw, field)
        if self.version == 1:
            refuse_newer_keys(r, raw, EXPERIMENT_KEYS_2, EXPERIMENT_KEYS, field)
        r.keys(raw, EXPERIMENT_KEYS_2 if self.version == 2 else EXPERIMENT_KEYS, field)
        for key in ("id", "data"):
            if key not in raw:
                raise r.error(field, f"an experiment needs {key} = ...")
        eid = r.string(raw["id"], field + ("id",))
        if "[" in eid or "]" in eid:
            raise r.error(field + ("id",), f"{eid!r} must not hold '[' or ']' (they name level members)")
        times, columns, data, sigmas = self.data(r.string(raw["data"], field + ("data",)), eid, field + ("data",))
        if "observables" in raw:
            names = r.names(raw["observables"], field + ("observables",))
            for n in names:
                r.known(n, list(self.states) + list(self.expressions), field + ("observables",), "observable "
                        "(a species or an [observables] name)")  # fmt: skip
                if n not in columns:
                    raise r.error(field + ("data",), f"the data file has no column {n!r} for observable {n!r} "
                                  f"(its columns: {', '.join(columns)})")  # fmt: skip
            order = [columns.index(n) for n in names]
            data, sigmas = data[:, order], sigmas[:, order]
        else:
            names = list(columns)
            for n in names:
                if n not in self.states and n not in self.expressions:
                    raise r.error(field + ("data",), f"column {n!r} of the data file is neither a species nor an "
                                  f"[observables] name; species: {', '.join(self.states)}")  # fmt: skip
        observables = self.observables(tuple(names))
        noise = self.default_noise if "noise" not in raw else read_noise(r, raw["noise"], field + ("noise",), self.version)
        if isinstance(noise, NoiseSpec):
            noise = self.noise_2(noise, names, sigmas, field)
        elif np.any(np.isfinite(sigmas)):
            if isinstance(noise.sigma, str):
                raise r.error(field + ("data",), "the data file gives sigma: columns but the noise's sigma is the "
                              f"estimated parameter {noise.sigma!r}; keep one")  # fmt: skip
            sigmas = np.where(np.isfinite(sigmas), sigmas, noise.sigma)
            noise = type(noise)(sigmas)
        if not isinstance(noise, list) and isinstance(noise.sigma, str):
            r.known(noise.sigma, self.study_names, field + ("noise", "sigma"), "study parameter")
        conditions = r.values(raw.get("conditions", {}), field + ("conditions",))
        for k in conditions:
            r.known(k, self.model_parameters, field + ("conditions", k), "model parameter")
        mapping = r.table(raw.get("parameters", {}), field + ("parameters",))
        for k, v in mapping.items():
            r.known(k, self.model_parameters, field + ("parameters", k), "model parameter")
            r.known(r.string(v, field + ("parameters", k)), self.study_names, field + ("parameters", k), "study parameter")
        y0 = None
        if "y0" in raw:
            y0 = self.initial_state(raw["y0"], field + ("y0",))
        groups = r.table(raw.get("groups", {}), field + ("groups",))
        for k, v in groups.items():
            r.known(k, self.levels, field + ("groups", k), "level")
            r.string(v, field + ("groups", k))
        for level in self.levels:
            if level not in groups:
                raise r.error(field + ("groups",), f"names no member of level {level!r}; write groups = {{{level} = \"...\"}}")
        t0 = r.number(raw.get("t0", 0.0), field + ("t0",))
        trajectory = self.multishoot(raw["multishoot"], field + ("multishoot",)) if "multishoot" in raw else None
        extra = self.version_2(raw, field, names) if self.version == 2 else {}
        try:
            experiment = Experiment(eid, times, data, observables=observables, noise=noise, conditions=conditions,
                                    parameters=mapping, y0=y0, groups=groups, t0=t0, trajectory=trajectory,
                                    **extra)  # fmt: skip
        except (ValueError, TypeError) as exc:
            raise r.error(field, str(exc)) from None
        return experiment, names

    def observables(self, names: tuple):
        if names == self.states:
            return None  # every state observed in order: data-initialized window starts work
        if names not in self.observable_functions:
            inner = Observables(names, self.states, self.expressions)
            self.observable_functions[names] = TimedObservables(inner) if self.version == 2 else inner
        return self.observable_functions[names]

    def initial_state(self, table: Any, field: tuple) -> dict:
        """An experiment's (or pre-equilibration's) ``y0``: species -> number (or, /2, a study
        parameter's name: an estimated initial amount)."""
        if self.version == 1:
            values: dict = self.r.values(table, field)
        else:
            values = parameter_values(self.r, table, field, self.study_names)
        for k in values:
            self.r.known(k, self.states, field + (k,), "species")
        return values

    def multishoot(self, raw: Any, field: tuple):
        raw = self.r.table(raw, field)
        self.r.keys(raw, MULTISHOOT_KEYS, field)
        try:
            return Multishoot(**raw)
        except (ValueError, TypeError) as exc:
            raise self.r.error(field, str(exc)) from None

    def data(self, name: str, eid: str, field: tuple):
        """(times, observable columns, values (m, k), sigmas (m, k) NaN where not given) of one experiment."""
        file = (self.base / name).resolve()
        if not file.is_file():
            raise self.r.error(field, f"data file {name!r} not found (looked for {file})")
        if file not in self.tables:
            self.tables[file] = read_data_table(file)
        data = self.tables[file].experiment(eid)
        if data is None:
            raise self.r.error(field, f"{name} has no rows whose experiment column is {eid!r}")
        return data
