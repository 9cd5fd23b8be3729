"""The options of ``ds.lower`` and their checks: the evaluation modes, how Hessians, gradients and
a chunk's lanes are computed (with the measured costs ``lane_mode="auto"`` and ``gradient="auto"``
choose by), the chunk-size defaults, and the largest scratch block a chunk program is planned for
(:func:`default_block_limit`)."""

from __future__ import annotations

import math
import os
from typing import Any

import jax

from ..._layout import Layout


# The programs' modes (``gauss_newton`` evaluations run the ``jacobian`` program).
MODES = ("value", "value_and_grad", "residuals", "jacobian", "hessian")
# How the exact Hessian is computed (not which Hessian an optimizer runs on: fitting._hessians).
HESSIAN_COMPUTATIONS = ("auto", "exact", "fd")
GRADIENTS = ("auto", "adjoint", "forward")
# How a chunk's lanes run: "vmap" in lock-step (one vectorized loop, as long as its slowest lane),
# "compact" in lock-step with the unfinished lanes regrouped into a narrower loop as lanes finish
# (ds.integrate.LaneCompaction), "map" one after the other inside the program (each lane takes its
# own steps), "auto" chosen per evaluation by what each would cost at the last step counts
# (_lane_mode_rule): one after the other only on a CPU (a GPU runs lanes in parallel).
LANE_MODES = ("auto", "vmap", "compact", "map")
# The costs are in lane-steps of lock-step. One after the other on a CPU: a lane's step run alone
# costs up to `cap` times its share of a step of L lanes in lock-step (lanes vectorize the step's small
# operations and share its fixed costs), about 1 + slope (L - 1) for few lanes: (sum of steps) x
# min(cap, 1 + slope (L - 1)). (slope, cap) measured on the 2-core CPU (PEtab problems of 2-8
# experiments, 5 points each): programs that carry forward tangents (0.06, 1.3) -- the tangents
# vectorize each lane's step already -- values and adjoint gradients (0.25, 2.2).
SEQUENTIAL_COST = {"jacobian": (0.06, 1.3), "forward_gradient": (0.06, 1.3)}
SEQUENTIAL_COST_OTHERS = (0.25, 2.2)
# Regrouped (LaneCompaction's widths): the lane-steps each width computes; off the CPU times this
# factor, since a GPU's narrower program is not proportionally faster (its steps are latency-bound:
# sorted chunks of 1,000 lanes ran 2.1x faster than one of 10,000 lanes holding a slow tenth, where
# lane-steps say 5x). Regrouping also costs a second copy of the loop body in the program (compile
# time +40-60 % on the 2-core CPU), which the switching margin below covers.
COMPACT_OFF_CPU_COST = 2.0
# A chunk that ran one way switches to another only when that is at least this factor cheaper by
# the costs above, or when the other program is compiled already: near the rule's boundary, step
# counts that move from point to point would otherwise compile both programs (seconds) to save a
# fraction of an evaluation (milliseconds).
LANE_MODE_SWITCH_MARGIN = 1.25
# gradient="auto": forward sensitivities up to this many entries of theta, the adjoint above. Forward
# mode carries one tangent per entry through every step (their solves reuse the step's factors); the
# adjoint costs a replay and a reverse step per step whatever theta's size, and its program (a second
# loop and a step differentiated to second order) takes about twice as long to compile.
FORWARD_GRADIENT_MAX_THETA = 16
DEFAULT_CHUNK = 256  # CPU start of the chunk search (experiments); GPUs take the largest that fits
PROBE_LANES = 32  # lanes of the GPU probe program whose scratch per lane sizes the chunk
GPU_FILL = 0.9  # share of the block limit a GPU chunk is planned to fill (the estimate's margin)
BFC_BLOCK_CAP = 3.5e9
CPU_BLOCK_CAP = 2**31


def default_block_limit(device: Any = None) -> int:
    """Largest single scratch block to plan a chunk for, in bytes.

    GPU: 3.5 GB under the BFC (JAX's default) and ``platform`` allocators, which may fail to grant
    one larger block however much memory is free (``XLA_PYTHON_CLIENT_ALLOCATOR``); otherwise 80 %
    of the device memory (never more than that in either case). CPU: 10 % of the physical memory,
    at most 2 GiB: the host's memory is shared with everything else the process holds, and chunks
    beyond that size gain nothing on a CPU.

    Args:
        device: a JAX device; None takes the first.

    Returns:
        Bytes.
    """
    dev = device if device is not None else jax.devices()[0]
    if dev.platform == "cpu":
        try:
            phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            phys = 8 * 2**30
        return int(min(CPU_BLOCK_CAP, 0.1 * phys))
    stats = dev.memory_stats() or {}
    total = float(stats.get("bytes_limit", BFC_BLOCK_CAP / 0.8))
    allocator = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default").lower()
    share = 0.8 * total
    if allocator in ("default", "bfc", "platform"):
        return int(min(BFC_BLOCK_CAP, share))
    return int(share)


def check_lowering_options(*, hessian: str, gradient: str, lane_mode: str, experiments_per_chunk: int | None,
                           block_limit_bytes: float | None, fd_step: float, layout: Any) -> Layout:
    """Check the options of ``ds.lower`` (and ``LoweredStudy``); return the layout (a default
    ``ds.Layout()`` for None).

    Raises:
        ValueError: for an option out of its range, naming it and what it may be.
        TypeError: for a layout that is not a ``ds.Layout``.
    """
    if hessian not in HESSIAN_COMPUTATIONS:
        raise ValueError(f"lower: hessian={hessian!r} must be one of {HESSIAN_COMPUTATIONS}.")
    if gradient not in GRADIENTS:
        raise ValueError(f"lower: gradient={gradient!r} must be one of {GRADIENTS}.")
    if lane_mode not in LANE_MODES:
        raise ValueError(f"lower: lane_mode={lane_mode!r} must be one of {LANE_MODES}.")
    per_chunk = experiments_per_chunk
    if per_chunk is not None and (isinstance(per_chunk, bool) or not isinstance(per_chunk, int) or per_chunk < 1):
        raise ValueError(f"lower: experiments_per_chunk={per_chunk!r} must be a positive integer (experiments "
                         "per chunk, all devices together).")  # fmt: skip
    if block_limit_bytes is not None and not (float(block_limit_bytes) > 0):
        raise ValueError(f"lower: block_limit_bytes={block_limit_bytes!r} must be positive.")
    if not (float(fd_step) > 0 and math.isfinite(fd_step)):
        raise ValueError(f"lower: fd_step={fd_step!r} must be positive (a step in theta's units).")
    layout = layout if layout is not None else Layout()
    if not isinstance(layout, Layout):
        raise TypeError(f"lower: layout must be a ds.Layout, not {type(layout).__name__}.")
    return layout
