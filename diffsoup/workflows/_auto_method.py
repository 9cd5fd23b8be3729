"""``--method auto`` (the command's default where the study file's ``[fit]`` names no method): the
batched optimizer where it was measured faster, else fides.

Measured (docs/benchmarks.md, ``benchmarks/bench_fits.py``): on one H200 the batched path fits
Bruno at 15.1 converged starts per second (1,000 starts as lanes; 7.6 with 512), against about 2 per second for
fides start by start on a CPU core; on the 2-core CPU neither wins clearly per converged start (from
the same 200 starts: Boehm 5.39 against fides' 6.24 CPU s, Bruno 0.419 against 0.404), since the
lanes' evaluations run one after the other there. So ``auto`` takes ``batched`` when the default JAX backend is a GPU and there are
at least :data:`AUTO_MIN_STARTS` starts (one program's worth of lanes: fewer leave lanes empty
and pay the compilation for little), and ``fides`` otherwise.
"""

from __future__ import annotations

import tomllib
from typing import Any

import jax

AUTO_MIN_STARTS = 16
"""Starts from which ``auto`` takes the batched optimizer on a GPU (fewer leave its program's lanes
nearly empty and pay its compilation for little; by default a GPU program has 1,024 lanes)."""
AUTO_LABEL = f"auto (batched on a GPU with >= {AUTO_MIN_STARTS} starts, else fides)"
"""How ``diffsoup check`` names the method of a file whose ``[fit]`` names none."""


def default_backend(client: Any = None) -> str:
    """JAX's default backend where the fit runs: this process's (``jax.default_backend()``), or,
    with a Dask client, ``"gpu"`` when any worker's is a GPU (else the first worker's)."""
    if client is not None:
        try:
            found = list(client.run(_worker_backend).values())
        except Exception:  # noqa: BLE001 (no workers yet, a cluster in trouble: decide by this process)
            found = []
        if found:
            return "gpu" if "gpu" in found else str(found[0])
    return jax.default_backend()


def _worker_backend() -> str:
    return jax.default_backend()


def choose_method(starts: int, backend: str) -> tuple[str, str]:
    """``(method, why)`` of ``auto`` for ``starts`` starts on ``backend`` (a JAX backend name)."""
    if backend != "gpu":
        return "fides", (f"the default JAX backend is {backend}, where the batched path measured no faster per converged "
                         "start (Bruno 0.419 against fides' 0.404 CPU s)")  # fmt: skip
    if starts < AUTO_MIN_STARTS:
        return "fides", (f"{starts} starts on the GPU are fewer than {AUTO_MIN_STARTS}, too few to fill the batched "
                         f"program's lanes (give --starts {AUTO_MIN_STARTS} or more, or --method batched)")  # fmt: skip
    return "batched", (f"the default JAX backend is a GPU and {starts} starts >= {AUTO_MIN_STARTS}: measured faster "
                       "there (H200, Bruno: 15.1 converged starts per second against fides' about 2)")  # fmt: skip


def file_method(sf: Any) -> str | None:
    """The method a study file's ``[fit]`` table names itself, or None (a PEtab problem has no
    ``[fit]``; a TOML file that does not say)."""
    if getattr(sf, "petab", None) is not None:
        return None
    try:
        with open(sf.path, "rb") as f:
            fit = tomllib.load(f).get("fit", {})
    except Exception:  # noqa: BLE001 (a file read before, now gone or not TOML: its settings stand)
        return sf.fit["method"]
    return fit.get("method") if isinstance(fit, dict) else None
