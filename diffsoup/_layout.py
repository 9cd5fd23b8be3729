"""Placement of experiments and factorizations on devices: ``Layout``, ``global_mesh``, ``mesh_groups``.

A mesh has up to two named axes: ``"data"`` splits experiments (``ds.lower(..., layout=)``) and
``"model"`` is meant to factor one problem across devices (``spec.build(..., layout=)``), which needs
cuDSS on several GPUs and is not available yet: ``spec.build`` refuses a model axis over several
devices.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

AXIS_NAMES = ("data", "model")
REORDERINGS = ("amd", "metis")


@dataclasses.dataclass(frozen=True)
class Layout:
    """Placement of experiments and factorizations on the devices of a mesh.

    Args:
        mesh: a ``jax.sharding.Mesh`` from :func:`global_mesh` with axes named ``"data"`` and/or
            ``"model"``, or None for one device.
        dof_sharding: stored on the layout and not read by the library.
        reorder: fill-reducing ordering of cuDSS: ``"amd"`` (default) keeps cuDSS's own,
            ``"metis"`` selects nested dissection; ``ds.linear.Dense`` eliminates in a
            minimum-degree order for either (``Dense(reorder="natural")`` opts out).
        hybrid_memory: if True, cuDSS keeps part of the factor in host memory; a model axis across
            processes takes this from the layout alone.
        hybrid_device_memory_limit_mb: positive device memory cap in MB for the hybrid mode, which
            needs ``hybrid_memory=True``.
        balance_steps: if True, move experiments between devices by their step counts when a
            device holds several.
        processes: number of processes the run must have, or None for any; None or 1 when the data
            axis spans several devices.
    """

    mesh: Any = None
    dof_sharding: Any = None
    reorder: str = "amd"
    hybrid_memory: bool = False
    hybrid_device_memory_limit_mb: int | None = None
    balance_steps: bool = False
    processes: int | None = None

    def __post_init__(self):
        if self.mesh is not None:
            names = tuple(getattr(self.mesh, "axis_names", ()))
            if not names or any(n not in AXIS_NAMES for n in names):
                raise ValueError(
                    f"Layout.mesh has axes {names}; diffsoup reads axes named 'data' and 'model'. "
                    'Build it with ds.global_mesh(("data",)) or ds.global_mesh(("data", "model"), shape=...).'
                )
        if self.reorder not in REORDERINGS:
            raise ValueError(f"Layout.reorder={self.reorder!r} is not one of {REORDERINGS}.")
        if not isinstance(self.hybrid_memory, bool):
            raise ValueError(f"Layout.hybrid_memory must be True or False, not {self.hybrid_memory!r}.")
        limit = self.hybrid_device_memory_limit_mb
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
                raise ValueError(
                    f"Layout.hybrid_device_memory_limit_mb={limit!r} must be a positive integer number of MB."
                )
            if not self.hybrid_memory:
                raise ValueError(
                    "Layout.hybrid_device_memory_limit_mb caps the device memory of cuDSS's hybrid mode; "
                    "set hybrid_memory=True with it, or leave the limit None."
                )
        procs = self.processes
        if procs is not None:
            if isinstance(procs, bool) or not isinstance(procs, int) or procs < 1:
                raise ValueError(f"Layout.processes={procs!r} must be None or a positive integer.")
            if procs != 1 and self.data_size > 1:
                raise ValueError(
                    f"Layout.processes={procs} with a data axis over {self.data_size} devices: a data axis "
                    "across devices is run by one process (processes=None or 1); use ds.distributed.run "
                    "to spread experiments over processes."
                )

    @property
    def data_size(self) -> int:
        """Number of devices along the ``"data"`` axis (1 without a mesh or data axis)."""
        return _axis_size(self.mesh, "data")

    @property
    def model_size(self) -> int:
        """Number of devices along the ``"model"`` axis (1 without a mesh or model axis)."""
        return _axis_size(self.mesh, "model")

    def check_one_device_factorization(self, solver_name: str) -> None:
        """Raise if the mesh's ``"model"`` axis spans several devices: no solver uses it yet.

        Factoring one problem across devices needs cuDSS on several GPUs, which ``ds.linear.CuDSS``
        does not do yet; ``Dense`` and ``KLU`` factor on one device. Without this check the axis
        would be silently ignored. A ``"model"`` axis of size 1 is accepted.

        Raises:
            ValueError: naming ``Layout.mesh``'s ``"model"`` axis and the remedies.
        """
        size = self.model_size
        if size > 1:
            raise ValueError(
                f"Layout.mesh has a 'model' axis over {size} devices, to factor one problem across devices: that "
                f"needs ds.linear.CuDSS on several GPUs, which is not available yet (CuDSS factors on one GPU; "
                f"{solver_name} on one device). Drop the 'model' axis (e.g. ds.global_mesh((\"data\",))), or "
                "shard experiments over 'data' with ds.lower(..., layout=ds.Layout(mesh=...))."
            )


def _axis_size(mesh, name: str) -> int:
    if mesh is None or name not in mesh.axis_names:
        return 1
    return int(mesh.shape[name])


def global_mesh(axis_names: Sequence[str], *, shape: Sequence[int] | None = None):
    """Build a mesh over every device JAX sees, across all processes.

    Args:
        axis_names: distinct names from ``("data", "model")``.
        shape: devices per axis, whose product must equal the device count; needed for two axes.

    Returns:
        A ``jax.sharding.Mesh`` for ``Layout(mesh=...)``.
    """
    names = tuple(axis_names)
    if not names or len(set(names)) != len(names) or any(n not in AXIS_NAMES for n in names):
        raise ValueError(f"axis_names={names!r} must be distinct names from {AXIS_NAMES}.")
    devices = jax.devices()
    count = len(devices)
    if shape is None:
        if len(names) != 1:
            raise ValueError(f"A mesh with axes {names} needs shape=, e.g. shape=({count}, 1).")
        shape = (count,)
    shape = tuple(int(s) for s in shape)
    if len(shape) != len(names) or any(s < 1 for s in shape):
        raise ValueError(f"shape={shape} must give one positive size per axis of {names}.")
    if math.prod(shape) != count:
        raise ValueError(f"shape={shape} holds {math.prod(shape)} devices, but JAX sees {count}.")
    return Mesh(np.asarray(devices, dtype=object).reshape(shape), names)


def mesh_groups(mesh, sizes: Sequence[int]):
    """Split a mesh along its data axis into consecutive submeshes.

    Args:
        mesh: mesh to split, usually from :func:`global_mesh`.
        sizes: number of data devices in each group, positive and summing to the axis width.

    Returns:
        One mesh per entry of ``sizes``, or ``(mesh,)`` when it has no data axis.
    """
    if "data" not in mesh.axis_names:
        return (mesh,)
    sizes = tuple(int(s) for s in sizes)
    width = int(mesh.shape["data"])
    if not sizes or any(s < 1 for s in sizes) or sum(sizes) != width:
        raise ValueError(f"sizes={sizes} must be positive and sum to the data axis width {width}.")
    axis = mesh.axis_names.index("data")
    groups, start = [], 0
    for size in sizes:
        index = [slice(None)] * len(mesh.axis_names)
        index[axis] = slice(start, start + size)
        groups.append(Mesh(mesh.devices[tuple(index)], mesh.axis_names))
        start += size
    return tuple(groups)
