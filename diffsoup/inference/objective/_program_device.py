"""Where a lowered study's programs run: ``ds.lower(..., device=...)``.

A GPU runs the lanes of a program (experiments, or points times experiments) in parallel, but
every step of the solve loop costs it a fixed kernel latency whatever the lanes; a CPU core pays
per lane and per step. With few lanes the latency dominates and the host CPU wins:
``device="auto"`` runs such programs on the host's CPU device (``jax.devices("cpu")[0]``, which
exists on GPU machines too), the others on the default device.
"""

from __future__ import annotations

import logging
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

try:  # JAX 0.12 deprecates the class's constructor for this function
    from jax.sharding import make_single_device_sharding
except ImportError:  # JAX 0.11
    from jax.sharding import SingleDeviceSharding as make_single_device_sharding

# device="auto" on a GPU: a program of fewer lanes than this (experiments per program, times points
# where points are lanes) runs on the host CPU. Measured (issue 42): a 12-parameter one-condition
# PEtab model (Boehm) took 252 ms per value and 341 ms per value_and_grad on an H200 against 3.5 and
# 12 ms on a 2-core CPU -- the GPU's per-step kernel latency, about 250 ms per evaluation whatever
# the lanes, against about 3.5 ms per lane-solve on the CPU: the two cost the same at about 64
# lanes (the 20-species network with 10,000 experiments took 0.22 s per value on the H200, where
# the GPU wins by far).
HOST_LANES_BELOW = 64
DEVICE_OPTIONS = ("auto", "default")


def default_backend() -> str:
    """JAX's default backend (a function of its own, so that tests can say ``"gpu"``)."""
    return jax.default_backend()


def check_device_option(device: Any, n_devices: int) -> Any:
    """Check ``device=`` of ``ds.lower``: ``"auto"``, ``"default"`` or a ``jax.Device``.

    Raises:
        ValueError: for another string, or a pinned device with a data mesh of several devices.
        TypeError: for something neither a string nor a ``jax.Device``.
    """
    if isinstance(device, str):
        if device not in DEVICE_OPTIONS:
            raise ValueError(f"lower: device={device!r} must be one of {DEVICE_OPTIONS} or a jax.Device.")
        return device
    if not isinstance(device, jax.Device):
        raise TypeError(f"lower: device must be 'auto', 'default' or a jax.Device, not {type(device).__name__}.")
    if n_devices > 1:
        raise ValueError("lower: device= pins the programs to one device, but the layout splits the experiments "
                         f"over {n_devices} devices; leave device='auto' (or 'default') with a data mesh.")  # fmt: skip
    return device


def program_device(default_backend: str, lanes: int, mesh: Any, device_option: Any, *,
                   host_can_run: bool = True) -> Any:  # fmt: skip
    """Where a program of ``lanes`` lanes runs: ``"default"`` (the default device, or the data
    mesh), ``"host"`` (the host's CPU device) or the ``jax.Device`` that ``device_option`` pins.

    ``"auto"`` picks the host where the default backend is a GPU, no data mesh is given, the
    program runs fewer than :data:`HOST_LANES_BELOW` lanes, and the host can run the problem's
    solves (``host_can_run``: not with ``ds.linear.CuDSS``, a GPU-only solver).

    Args:
        default_backend: ``jax.default_backend()`` (``"cpu"``, ``"gpu"``, ...).
        lanes: the lanes the program runs at once.
        mesh: the data mesh of several devices, or None.
        device_option: ``"auto"``, ``"default"`` or a ``jax.Device``.
        host_can_run: whether the problem's programs compile for a CPU.
    """
    if isinstance(device_option, jax.Device):
        return device_option
    if device_option == "default" or mesh is not None or default_backend == "cpu" or not host_can_run:
        return "default"
    return "host" if lanes < HOST_LANES_BELOW else "default"


def resolve_device(choice: Any) -> jax.Device | None:
    """The ``jax.Device`` of a :func:`program_device` choice; None for ``"default"`` (the default
    placement: the default device, or the data mesh)."""
    if isinstance(choice, str):
        return jax.devices("cpu")[0] if choice == "host" else None
    return choice


def program_shardings(device: jax.Device | None, mesh: Any) -> tuple:
    """(lanes', replicated operands') shardings of a program on ``device``; for None (the default
    placement) over the ``mesh``'s data axis, or (None, None) without a mesh."""
    if device is not None:
        return (make_single_device_sharding(device),) * 2
    if mesh is not None:
        return NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())
    return None, None


def device_label(device: jax.Device | None, mesh: Any) -> str:
    """Where a program runs, in words: the device, or the mesh's devices."""
    if device is not None:
        return str(device)
    return f"mesh of {mesh.devices.size} devices" if mesh is not None else str(jax.devices()[0])


def announce_host(name: str, lanes: int) -> None:
    """One line on the ``diffsoup.compile`` logger (where the compile lines go): ``device="auto"``
    runs the programs of problem ``name`` on the host CPU."""
    logging.getLogger("diffsoup.compile").info(
        "running the programs of %r on the host CPU: %d lane(s) per program, fewer than HOST_LANES_BELOW=%d "
        "(a GPU's per-step latency would dominate)", name, lanes, HOST_LANES_BELOW)
