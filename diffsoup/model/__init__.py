"""Problem specification: ``ProblemSpec``, ``Problem``, ``ReactionNetwork``, sparsity patterns."""

from ._network import Reaction as Reaction
from ._network import ReactionNetwork as ReactionNetwork
from ._sparsity import SparsityPattern as SparsityPattern
from ._sparsity import color_columns as color_columns
from ._sparsity import detect_sparsity as detect_sparsity
from ._spec import Problem as Problem
from ._spec import ProblemSpec as ProblemSpec
