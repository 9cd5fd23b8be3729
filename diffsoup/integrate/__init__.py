"""Stiff integrators and their sensitivities: ``simulate`` (with state ``Reset`` s and
``SteadyState`` outputs at ``t = inf``), ``Solution``, status codes; the
integrator interface (``AbstractIntegrator``, ``AbstractRosenbrock`` with a ``RosenbrockTableau``),
its methods (``Rodas5P``, ``BDF``, ``ImplicitEuler``; ``AutoMethod`` chooses), the adjoint interface
(``AbstractAdjoint``), and ``compacting_lanes`` (a vmapped ``simulate`` whose lanes leave the loop as
they finish: ``LaneCompaction``)."""

from ._adjoint import AbstractAdjoint as AbstractAdjoint
from ._auto_method import AutoMethod as AutoMethod
from ._bdf import BDF as BDF
from ._checkpoint import CheckpointAdjoint as CheckpointAdjoint
from ._forward_mode import ForwardMode as ForwardMode
from ._implicit_euler import ImplicitEuler as ImplicitEuler
from ._lane_compaction import LaneCompaction as LaneCompaction
from ._lane_compaction import compacting_lanes as compacting_lanes
from ._loop import ConstantStep as ConstantStep
from ._loop import PIController as PIController
from ._method import AbstractIntegrator as AbstractIntegrator
from ._method import AbstractReversibleIntegrator as AbstractReversibleIntegrator
from ._method import Attempt as Attempt
from ._method import Work as Work
from ._rodas5p import Rodas5P as Rodas5P
from ._rosenbrock import AbstractRosenbrock as AbstractRosenbrock
from ._reset import Reset as Reset
from ._simulate import simulate as simulate
from ._solution import Solution as Solution
from ._status import SolveError as SolveError
from ._status import Status as Status
from ._steady_state import SteadyState as SteadyState
from ._tolerance import ToleranceWarning as ToleranceWarning
from ._tableau import RosenbrockTableau as RosenbrockTableau
