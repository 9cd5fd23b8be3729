"""Reference problems from the literature, with their published reference values."""

from ._problems import OREGO_REFERENCE as OREGO_REFERENCE
from ._problems import ROBER_REFERENCE as ROBER_REFERENCE
from ._problems import BRUSSELATOR_U00_REFERENCE as BRUSSELATOR_U00_REFERENCE
from ._problems import brusselator_2d as brusselator_2d
from ._problems import mass_action_network as mass_action_network
from ._problems import orego as orego
from ._problems import rober as rober
from ._problems import scd as scd
