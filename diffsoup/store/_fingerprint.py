"""Fingerprints of campaign items: :func:`fingerprint`, a hash that is the same for the same item in
every process and on every machine (the ledger keys each task's record by it and refuses a rerun
whose item changed).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import re
from collections.abc import Mapping, Set
from typing import Any

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _canonical(value: Any, where: str) -> Any:
    """A JSON-able form of ``value`` that is the same in every process and on every machine.

    Sets are sorted (their iteration order depends on PYTHONHASHSEED), objects become their type
    name plus their fields, arrays their nested lists; a repr holding a memory address would
    differ between runs, so it is refused rather than silently making every rerun a conflict.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        # json writes nan/inf as NaN/Infinity; fine for a hash, and keeps 1.0 != 1.
        return value
    if isinstance(value, enum.Enum):
        return {"__enum__": f"{type(value).__qualname__}.{value.name}"}
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            name = key if isinstance(key, str) else repr(_canonical(key, where))
            out[name] = _canonical(item, f"{where}[{key!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [_canonical(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, (Set, frozenset)):
        parts = [_canonical(item, f"{where}{{...}}") for item in value]
        return {"__set__": sorted(parts, key=lambda p: json.dumps(p, sort_keys=True))}
    if isinstance(value, (bytes, bytearray)):
        return {"__bytes__": bytes(value).hex()}
    tolist = getattr(value, "tolist", None)
    if callable(tolist) and hasattr(value, "dtype"):
        # NumPy and JAX arrays and scalars; a scalar counts as the Python number it holds, as a
        # NumPy float64 (a float subclass) already does above.
        if getattr(value, "ndim", None) == 0:
            return _canonical(tolist(), where)
        return {"__array__": _canonical(tolist(), where), "dtype": str(value.dtype)}
    if isinstance(value, type) or callable(value) and hasattr(value, "__qualname__"):
        return {"__callable__": f"{getattr(value, '__module__', '')}.{value.__qualname__}"}
    if dataclasses.is_dataclass(value):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"__type__": type(value).__qualname__, "fields": _canonical(fields, where)}
    if hasattr(value, "__dict__"):
        return {"__type__": type(value).__qualname__, "fields": _canonical(vars(value), where)}
    text = repr(value)
    if _ADDRESS.search(text):
        raise TypeError(
            f"{where} = {text} cannot be fingerprinted stably: its repr holds a memory address, "
            "which changes from run to run. Give it a __repr__ without the address, make it a "
            "dataclass, or pass a mapping."
        )
    return {"__repr__": f"{type(value).__qualname__}:{text}"}


def fingerprint(item: Any) -> str:
    """A stable hash of a campaign item: the same item gives the same string in any process.

    Args:
        item: a mapping, a dataclass, an object with a ``__dict__``, or any value whose ``repr``
            does not hold a memory address. Nested values follow the same rules; NumPy and JAX
            arrays count by their values and dtype, sets regardless of order.

    Returns:
        The hex SHA-256 of the item's canonical JSON (sorted keys, no whitespace).

    Raises:
        TypeError: if part of the item only has a repr with a memory address.
    """
    canonical = _canonical(item, "item")
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
