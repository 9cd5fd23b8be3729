"""Compiling generated JAX source (the text :mod:`._sympy_jax` prints) into functions.

Apart from the printer so that a cached model compiles without importing sympy.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import jax.scipy.special as jsp

# The version of what the printer (._sympy_jax) emits; part of cache keys of generated code (bump on
# any change of the printer's output).
PRINTER_VERSION = 1


def compile_functions(source: str, filename: str = "<diffsoup generated>") -> dict[str, Callable]:
    """Compile generated source and return its functions by name.

    The source is our printer's output (or a cached copy of it): it names only ``jnp``, ``jsp``
    and the locals it made; no text of a model file reaches it but numbers it printed itself.
    """
    namespace: dict = {"jnp": jnp, "jsp": jsp}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own generated code
    return {k: v for k, v in namespace.items() if callable(v) and getattr(v, "__module__", None) is None}
