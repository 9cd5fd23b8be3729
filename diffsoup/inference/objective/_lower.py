"""``ds.lower``: a study compiled into chunked, sharded objective programs (a ``LoweredStudy``).

The tiled-objective pattern (DESIGN.md, ``reference/seeds/004``) with chunks of experiments as the
tiles. Experiments of one :class:`~diffsoup.inference.objective._problem.Group` (same observables, noise and
observable count; measurement times padded with the last time and masked) are stacked and
vmapped, ``lanes`` of them per chunk. Each evaluation mode has its own program:

============== =============================================== ================================
mode           program (per chunk)                             derivative
============== =============================================== ================================
value          sum of the experiments' terms                   none (forward solve)
value_and_grad value and gradient                              forward sensitivities (jacfwd) up
                                                               to 16 entries of theta, else the
                                                               checkpointed adjoint (reverse)
residuals      the residuals                                   none
jacobian       residuals and their Jacobian                    forward sensitivities (jacfwd)
hessian        ``"exact"``: jacfwd of the gradient (HVPs);      forward over reverse, or
               ``"fd"``: the gradient program, differenced      central differences of gradients
============== =============================================== ================================

Forward sensitivities carry tangents through the solves only for the entries of theta that reach
them (``LaneTerms.solve_theta``: model parameters, initial states, window starts); offsets,
scalings and spreads enter only the observation, which is differentiated in all of theta with the
solves' sensitivities as a linear term. On the benchmark collection's problems this took a
Gauss-Newton evaluation from 108 to 77 ms (Weber: 26 of 36 entries reach the solves), 89 to 72 ms
(Brannmark, 15 of 22) and 79 to 70 ms (Fujita, 16 of 19), with the same numbers to the last bit.

The compiled programs take the problem's numbers -- tolerances, step budget, fixed parameter values
(:class:`~diffsoup.inference.objective._problem.TermOperands`) -- as arguments, not constants. A program is a
function of its :class:`ProgramKey` alone (:func:`chunk_function` builds it from the key's fields),
and the process keeps its recent programs by key: lowering the same study again with another
``SolverOptions(rtol=...)``, ``max_steps`` or ``values`` traces and compiles nothing.

A mode's chunk size is chosen the first time the mode is used (or by :meth:`LoweredStudy.compile`)
from the program's scratch (``compiled.memory_analysis().temp_size_in_bytes``, the single block XLA
asks for) against the block limit -- nothing is run to find out:

* on a GPU, by default, the largest chunk that fits: a probe program of ``PROBE_LANES`` lanes is
  compiled, its scratch per lane extrapolated to the block limit (scratch grows linearly in the
  lanes; the probe's share of fixed scratch makes the estimate err small), and the program of that
  size compiled; should it not fit after all, the lanes shrink in proportion and it compiles again.
  A GPU runs lanes in parallel until it is full, so one large chunk beats many small ones
  (issue 22: 10,000 experiments in one chunk 15x faster than 40 of 250);
* on a CPU, and wherever ``experiments_per_chunk`` is given, from it (CPU default 256
  experiments), halved until it fits: a CPU core runs lanes one after the other, so beyond a few
  hundred lanes larger chunks gain nothing and only cost host memory.

``hessian="auto"`` tries the exact Hessian, then differences of gradients, at each size. The
compiled program of the chosen size is the one evaluations run. Chunk results are summed (or
concatenated) on the device and brought to the host with one transfer per evaluation.

Every evaluation first forms a typed *part* (``diffsoup.inference.objective._parts``: sums before the
objective's scale and offset, residual rows by experiment), which the public methods of
:class:`~diffsoup.inference.objective._abstract_lowered.AbstractLoweredStudy` finish. ``restrict(experiments)``
gives a lowered study of the same problem that evaluates a subset of the experiments; the parts of
the studies of a split combine (``combine_parts``) into the part of the whole, which is how
``ds.distributed.run`` spreads a study over Dask workers or processes. ``gauss_newton`` forms
``J^T J`` and ``J^T r`` on the device chunk by chunk (:func:`gauss_newton_sums`), for a whole study and
for each shard alike.

With ``layout=ds.Layout(mesh=ds.global_mesh(("data",)))`` each chunk is split over the data axis
(``shard_map``: every device runs its own lanes' solves, the sums are ``psum``-ed). Each device owns a
fixed block of experiments, the same for every mode and chunk size; with ``balance_steps=True`` the
blocks are chosen by :func:`balance_owners` weighted by the step counts measured at the nominal
point, and within a block experiments are sorted by step count so that lanes that run in lock-step
take similar numbers of steps. That pays when each device runs several chunks: with one chunk per
device, a device holding one slow experiment runs as long as one holding only slow ones (lanes run
in lock-step), so balancing evens the step totals without shortening the evaluation; give a
``experiments_per_chunk`` that makes several chunks per device when step counts differ widely.

Where the programs run (``device=``, ``_program_device``): on a GPU machine without a data mesh,
``"auto"`` runs programs of fewer than ``HOST_LANES_BELOW`` lanes on the host's CPU device (a GPU's
per-step kernel latency dominates few lanes); the chunk data, operands and programs are kept per
device (the device is part of the :class:`ProgramKey`), and the chunk search and ``lane_mode``
follow the device a program runs on.

Chunk sizes count experiments (all devices together): ``experiments_per_chunk=`` (``chunk_size=``
is its deprecated name) and :attr:`LoweredStudy.chunk_sizes`, the sizes chosen, per mode and group.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..._deprecated import renamed_keyword
from ..study._study import Study
from ._chunk_programs import PROGRAM_CACHE_SIZE as PROGRAM_CACHE_SIZE
from ._chunk_programs import Program as Program
from ._chunk_programs import ProgramKey as ProgramKey
from ._chunk_programs import chunk_function as chunk_function
from ._chunk_programs import clear_program_cache as clear_program_cache
from ._chunk_programs import gauss_newton_sums as gauss_newton_sums
from ._lowered_study import LoweredStudy as LoweredStudy
from ._chunk_programs import device_blocks as device_blocks
from ._lowering_options import BFC_BLOCK_CAP as BFC_BLOCK_CAP
from ._lowering_options import CPU_BLOCK_CAP as CPU_BLOCK_CAP
from ._lowering_options import DEFAULT_CHUNK as DEFAULT_CHUNK
from ._lowering_options import FORWARD_GRADIENT_MAX_THETA as FORWARD_GRADIENT_MAX_THETA
from ._lowering_options import GPU_FILL as GPU_FILL
from ._lowering_options import GRADIENTS as GRADIENTS
from ._lowering_options import HESSIAN_COMPUTATIONS as HESSIAN_COMPUTATIONS
from ._lowering_options import LANE_MODE_SWITCH_MARGIN as LANE_MODE_SWITCH_MARGIN
from ._lowering_options import LANE_MODES as LANE_MODES
from ._lowering_options import MODES as MODES
from ._lowering_options import PROBE_LANES as PROBE_LANES
from ._lowering_options import SEQUENTIAL_COST as SEQUENTIAL_COST
from ._lowering_options import SEQUENTIAL_COST_OTHERS as SEQUENTIAL_COST_OTHERS
from ._lowering_options import default_block_limit as default_block_limit
from ._problem import InferenceProblem, SolverOptions
from ._program_device import HOST_LANES_BELOW as HOST_LANES_BELOW
from ._program_device import program_device as program_device
from ._same_functions import DEFAULT_MAX_PROGRAM_GROUPS, check_program_groups


def lower(
    study: Study | InferenceProblem,
    *,
    objective: str | None = None,
    parameters: Sequence[str] | None = None,
    values: Mapping[str, float] | None = None,
    solver: SolverOptions | None = None,
    layout: Any = None,
    hessian: str = "auto",
    experiments_per_chunk: int | None = None,
    block_limit_bytes: float | None = None,
    fd_step: float = 1e-3,
    gradient: str = "auto",
    lane_mode: str = "auto",
    chunk_size: int | None = None,
    max_program_groups: int = DEFAULT_MAX_PROGRAM_GROUPS,
    device: Any = "auto",
) -> LoweredStudy:
    """Lower a study (or an :class:`InferenceProblem`) into chunked, sharded objective programs.

    Args:
        study: a ``ds.Study`` or an ``InferenceProblem``.
        objective: ``"nll"`` (default) or ``"chi2"``; with an ``InferenceProblem``, leave it None.
        parameters, values, solver: as for :class:`InferenceProblem` (Study only).
        layout: ``ds.Layout(mesh=ds.global_mesh(("data",)), balance_steps=...)`` to shard
            experiments over the data axis; None for one device.
        hessian: ``"exact"`` (forward-over-reverse products), ``"fd"`` (central differences of
            gradients) or ``"auto"`` (exact where it fits under the block limit).
        experiments_per_chunk: experiments per chunk (all devices together) to start the search
            from, capped at the group's size and halved until the program fits. Default: on a GPU
            the largest chunk that fits the block limit (extrapolated from a probe program's
            scratch), on a CPU 256.
        block_limit_bytes: the largest scratch block a program may ask for; None reads
            :func:`default_block_limit` from the device.
        fd_step: the difference step for ``hessian="fd"``, in theta's units (scaled parameters).
        gradient: how ``value_and_grad`` differentiates the solves: ``"adjoint"`` (the checkpointed
            adjoint), ``"forward"`` (forward sensitivities, one tangent per entry of theta) or
            ``"auto"`` (forward up to ``FORWARD_GRADIENT_MAX_THETA`` entries, where it runs and
            compiles faster, the adjoint above). Both are exact derivatives of the discrete
            solution; they agree to rounding.
        lane_mode: how the experiments of a chunk run: ``"vmap"`` in lock-step (one vectorized
            loop, which runs until its slowest experiment is done), ``"compact"`` in lock-step
            until few lanes are unfinished, which then run on in a narrower loop
            (``ds.integrate.LaneCompaction``: lanes that finish early leave the program),
            ``"map"`` one after the other within the program (each takes only its own steps), or
            ``"auto"`` (default), per evaluation from the step counts of the last one: on a CPU
            ``"map"`` when they differ so much between lanes that lock-step would cost more
            (``SEQUENTIAL_COST``), ``"vmap"`` otherwise; on a GPU, which runs lanes in parallel,
            ``"compact"`` when lock-step would compute more than ``COMPACT_WASTE`` times the
            lane-steps the lanes need, ``"vmap"`` otherwise. A chunk's first program is the one
            its known step counts ask for; a switch that would compile the other needs a margin
            (``LANE_MODE_SWITCH_MARGIN``), and ``.compile()`` compiles both on a CPU. The same
            numbers every way, to rounding.
        chunk_size: the deprecated name of ``experiments_per_chunk`` (warns).
        max_program_groups: the most groups of experiments (each compiles its own program per
            mode) the lowering accepts; past it ``lower`` raises before compiling anything.
            Experiments given equivalent functions (the same code with the same constants) share a
            group.
        device: where the programs run: ``"auto"`` (default) the host's CPU device where the
            default backend is a GPU, no data mesh is given and a program runs fewer than
            ``HOST_LANES_BELOW`` lanes (experiments, times points for the points-as-lanes
            Jacobian of ``method="batched"``) -- there a GPU's per-step latency dominates -- the
            default device otherwise; ``"default"`` always the default device (or the mesh); a
            ``jax.Device`` pins every program to it. ``LoweredStudy.devices_used`` says where
            each mode ran.

    Returns:
        A :class:`LoweredStudy`; programs compile on first use of each mode (or ``.compile()``).

    Raises:
        ValueError, TypeError: for bad options, problem options given with an InferenceProblem, or
            more groups than ``max_program_groups``.
    """
    if isinstance(study, InferenceProblem):
        given = [n for n, v in (("objective", objective), ("parameters", parameters), ("values", values),
                                ("solver", solver)) if v is not None]  # fmt: skip
        if given:
            raise ValueError(f"lower: {given} belong to the InferenceProblem; set them there, not on lower().")
        problem = study
    elif isinstance(study, Study):
        problem = InferenceProblem(study, parameters, objective=objective or "nll", values=values,
                                   solver=solver or SolverOptions())  # fmt: skip
    else:
        raise TypeError(f"lower: study must be a ds.Study or ds.inference.InferenceProblem, not {type(study).__name__}.")
    check_program_groups(problem, max_program_groups)
    experiments_per_chunk = renamed_keyword("lower", "chunk_size", chunk_size, "experiments_per_chunk",
                                            experiments_per_chunk)  # fmt: skip
    return LoweredStudy(problem, layout=layout, hessian=hessian, experiments_per_chunk=experiments_per_chunk,
                        block_limit_bytes=block_limit_bytes, fd_step=fd_step, gradient=gradient,
                        lane_mode=lane_mode, device=device)  # fmt: skip
