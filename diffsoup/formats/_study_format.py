"""The study-file formats ``diffsoup-study/1`` and ``/2``: their names, the keys each table may
hold (``/2`` adds to ``/1``), the values some keys take, the ``[fit]`` defaults, and
:func:`refuse_newer_keys`, which refuses a ``/2`` key in a ``/1`` file naming the format it needs.
"""

from __future__ import annotations

from typing import Mapping

from ..inference.fitting._hessians import DEFAULT_HESSIAN
from ..inference.fitting._fit import DEFAULT_METHOD
from ._reader import TomlReader

FORMAT = "diffsoup-study/1"
FORMAT_2 = "diffsoup-study/2"
FORMATS = (FORMAT, FORMAT_2)
FORMAT_PREFIX = "diffsoup-study/"

TOP_KEYS = ("format", "name", "description", "levels", "model", "observables", "solver", "noise", "fit",
            "parameters", "experiments")  # fmt: skip
MODEL_KEYS = ("species", "reactions", "parameters", "y0", "python", "linear_solver", "precision")
SOLVER_KEYS = ("rtol", "atol", "max_steps", "checkpoints")
NOISE_KEYS = ("model", "sigma")
FIT_KEYS = ("method", "hessian", "hierarchical", "starts", "seed", "max_nfev", "objective")
PARAMETER_KEYS = ("name", "nominal", "lower", "upper", "scale", "estimate", "level")
EXPERIMENT_KEYS = ("id", "data", "observables", "y0", "conditions", "parameters", "groups", "noise", "t0",
                   "multishoot")  # fmt: skip
MULTISHOOT_KEYS = ("windows", "boundaries", "continuity_weight", "state_scale", "init", "lower", "upper")
LINEAR_SOLVERS = ("auto", "dense", "klu", "cudss")
PRECISIONS = ("fp64", "fp32", "fp32_factor", "fp32_ir")
NOISE_MODELS = ("gaussian", "lognormal")
# diffsoup-study/2: what the core gained (issue 19), each key refused with a pointer in /1 files.
TOP_KEYS_2 = TOP_KEYS + ("observable_parameters", "experiment_table")
EXPERIMENT_TABLE_KEYS = ("data", "observables", "conditions", "groups", "y0", "t0")
EXPERIMENT_KEYS_2 = EXPERIMENT_KEYS + ("observable_parameters", "preequilibration", "resets", "discontinuities",
                                       "steady_state")  # fmt: skip
NOISE_KEYS_2 = ("model", "sigma", "base", "observables")
NOISE_COLUMN_KEYS_2 = ("model", "sigma", "base")
# /2 files name any registered noise model (ds.inference.AbstractNoise subclasses with a name).
PREEQUILIBRATION_KEYS = ("conditions", "y0")
RESET_KEYS = ("time", "set", "add")
STEADY_STATE_KEYS = ("rtol", "atol", "horizon")
TIME = "time"  # the measurement time's name in observable expressions (/2)
OBJECTIVES = ("nll", "chi2")
PETAB_SUFFIXES = (".yaml", ".yml")  # load_study reads these as PEtab v1 problems (ds.petab.load)
# The [fit] settings a file does not give (and a PEtab problem's, which has no [fit]).
DEFAULT_FIT = {"method": DEFAULT_METHOD, "hessian": DEFAULT_HESSIAN, "starts": 4, "seed": 0, "max_nfev": None,
               "objective": "nll", "hierarchical": None}


def refuse_newer_keys(r: TomlReader, table: Mapping, newer: tuple, allowed: tuple, field: tuple) -> None:
    """A diffsoup-study/2 key in a /1 file: say which format it needs."""
    for key in table:
        if key in newer and key not in allowed:
            raise r.error(field + (key,), f"{key!r} needs format = {FORMAT_2!r} (this file says {FORMAT!r})")
