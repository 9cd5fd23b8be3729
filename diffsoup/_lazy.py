"""Module attributes loaded on first access (PEP 562), so importing a package stays light."""

from __future__ import annotations

import importlib
from typing import Callable, Mapping


def lazy_attributes(module_name: str, names: Mapping[str, str]) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``module_name`` serving ``names`` (name -> defining module)."""

    def __getattr__(name):
        source = names.get(name)
        if source is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        setattr(importlib.import_module(module_name), name, value)
        return value

    def __dir__():
        return sorted(set(vars(importlib.import_module(module_name))) | set(names))

    return __getattr__, __dir__
