"""Experiments, studies, objectives, fitting, and campaigns of independent fits.

``checkpointed_map`` and ``world`` live in :mod:`diffsoup.distributed` beside the other execution
code and keep their documented home here by re-export. They load on first access, so importing
this package imports neither Dask nor the execution layer.
"""

# name -> module that defines it, loaded on first attribute access.
_LAZY = {
    "checkpointed_map": "diffsoup.distributed",
    "CampaignResult": "diffsoup.distributed",
    "world": "diffsoup.distributed",
    "World": "diffsoup.distributed",
}


def __getattr__(name):
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
