"""Stiff integrators and their sensitivities: ``simulate``, ``Solution``, status codes."""

from ._loop import ConstantStep as ConstantStep
from ._loop import PIController as PIController
from ._simulate import CheckpointAdjoint as CheckpointAdjoint
from ._simulate import ForwardMode as ForwardMode
from ._simulate import Rodas5P as Rodas5P
from ._simulate import Solution as Solution
from ._simulate import simulate as simulate
from ._status import SolveError as SolveError
from ._status import Status as Status
