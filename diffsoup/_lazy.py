"""The one mechanism for deferred imports: what a package names but loads on first use.

Two forms, both declared as data (module names as strings), so that importing a package stays
light and a layer may name something of a higher layer without importing it:

- :func:`lazy_attributes` gives a package's ``__getattr__`` and ``__dir__`` (PEP 562): public
  names re-exported from other modules, and subpackages, loaded on first attribute access;
- :class:`LazyReference` names one object (a default implementation, say) imported when
  :meth:`LazyReference.resolve` is called.

``tests/test_layers.py`` reads these declarations from the source (the calls' string arguments)
and lists the ones that point to a higher layer: they are the only upward references allowed.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Mapping, Sequence


def lazy_attributes(
    package: str, attributes: Mapping[str, str] | None = None, *, submodules: Sequence[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the module ``package``.

    Args:
        package: the module's ``__name__``.
        attributes: public name -> the module that defines it (imported on first access; the value
            is then kept on ``package``, so the lookup runs once).
        submodules: names of ``package``'s submodules loaded on first access (``ds.inference``).

    Returns:
        The module-level ``__getattr__`` and ``__dir__`` to assign in ``package``.
    """
    attributes = dict(attributes or {})
    submodules = tuple(submodules)
    clash = sorted(set(attributes) & set(submodules))
    if clash:
        raise ValueError(f"lazy_attributes({package!r}): {clash} declared both as attributes and submodules.")

    def __getattr__(name: str) -> Any:
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")  # the import binds it on the package
        source = attributes.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        setattr(importlib.import_module(package), name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(attributes) | set(submodules))

    return __getattr__, __dir__


@dataclasses.dataclass(frozen=True)
class LazyReference:
    """An object named by its module and attribute, imported when first resolved.

    Attributes:
        module: the defining module (absolute dotted name).
        name: the attribute of that module.
    """

    module: str
    name: str

    def resolve(self) -> Any:
        """The object (importing its module if needed)."""
        return getattr(importlib.import_module(self.module), self.name)
