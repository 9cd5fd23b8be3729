"""Rodas5P: a stiffly accurate Rosenbrock method of order 5 with an embedded order-4 estimate.

Method:
    order 5 (error estimate of order 4), 8 stages, one factorization of ``W = I/(h gamma) - J``
    per step and one solve per stage, no Newton iteration.
Stability:
    L-stable and stiffly accurate (the last two stages evaluate at ``t + h``, and the solution is
    the last internal stage plus its correction), which suits very stiff problems and DAEs of
    index 1; it keeps its order on problems where ``J`` is only approximate (W-method conditions
    of order 3) and improves Rodas5's order reduction on Prothero-Robinson problems.
Dense output:
    the method has a stiffly accurate interpolant (``H``); diffsoup does not use it, since every
    output time is a step endpoint (steps are clipped to land on measurement times), which keeps
    outputs exact and the discrete adjoint a plain sequence of steps.

Formulation (Hairer and Wanner's W-transformed form, as in OrdinaryDiffEq.jl):

    W k_i = f(t + c_i h, y + sum_j A_ij k_j) + sum_j (C_ij / h) k_j + D_i h f_t,    i = 1..8
    with W = I/(h gamma) - J; stages 6-8 evaluate at t + h and
    u_6 = y + sum_j A_6j k_j + k_6,  u_7 = u_6 + k_7,  y_new = u_7 + k_8,  error estimate = k_8
    (1-based; u_6 is the state of stage 7, u_7 that of stage 8).

``TABLEAU`` is these constants as a :class:`~diffsoup.integrate.RosenbrockTableau` (stages 7 and 8
chained, ``chained_from=6`` 0-based); ``tests/test_methods.py`` checks its order conditions (5 for
the solution, 4 for the embedded estimate) in the classical form. :class:`Rodas5P` is the method.

Coefficients: G. Steinebach, "Construction of Rosenbrock-Wanner method Rodas5P and numerical
benchmarks within the Julia Differential Equations package", BIT Numerical Mathematics 63, 27
(2023), as tabulated in OrdinaryDiffEq.jl (``Rodas5PTableau``).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, final

import numpy as np

from ._rosenbrock import STAGE_CODES, AbstractRosenbrock
from ._tableau import RosenbrockTableau

ORDER = 5
ERROR_ORDER = 4
STAGES = 8
GAMMA = 0.21193756319429014

# A[i, j]: stage i's state is y + sum_j A[i, j] k_j (rows 0..5 given; stages 6, 7 chain as above,
# which TABLEAU fills in).
A = np.zeros((STAGES, STAGES))
A[1, 0] = 3.0
A[2, :2] = [2.849394379747939, 0.45842242204463923]
A[3, :3] = [-6.954028509809101, 2.489845061869568, -10.358996098473584]
A[4, :4] = [2.8029986275628964, 0.5072464736228206, -0.3988312541770524, -0.04721187230404641]
A[5, :5] = [-7.502846399306121, 2.561846144803919, -11.627539656261098, -0.18268767659942256,
            0.030198172008377946]  # fmt: skip

# C[i, j]: stage i's right-hand side adds sum_j (C[i, j] / h) k_j.
C = np.zeros((STAGES, STAGES))
C[1, 0] = -14.155112264123755
C[2, :2] = [-17.97296035885952, -2.859693295451294]
C[3, :3] = [147.12150275711716, -1.41221402718213, 71.68940251302358]
C[4, :4] = [165.43517024871676, -0.4592823456491126, 42.90938336958603, -5.961986721573306]
C[5, :5] = [24.854864614690072, -3.0009227002832186, 47.4931110020768, 5.5814197821558125,
            -0.6610691825249471]  # fmt: skip
C[6, :6] = [30.91273214028599, -3.1208243349937974, 77.79954646070892, 34.28646028294783,
            -19.097331116725623, -28.087943162872662]  # fmt: skip
C[7, :7] = [37.80277123390563, -3.2571969029072276, 112.26918849496327, 66.9347231244047,
            -40.06618937091002, -54.66780262877968, -9.48861652309627]  # fmt: skip

# c_i: stage times t + c_i h.
C_TIME = np.array([0.0, 0.6358126895828704, 0.4095798393397535, 0.9769306725060716,
                   0.4288403609558664, 1.0, 1.0, 1.0])  # fmt: skip
# D_i: coefficients of h f_t (time derivative), zero for stages 6-8.
D_TIME = np.array([0.21193756319429014, -0.42387512638858027, -0.3384627126235924,
                   1.8046452872882734, 2.325825639765069, 0.0, 0.0, 0.0])  # fmt: skip

TABLEAU = RosenbrockTableau.chained(
    A=A, C=C, c=C_TIME, d=D_TIME, gamma=GAMMA, order=ORDER, error_order=ERROR_ORDER, chained_from=6
)


@final
@dataclasses.dataclass(frozen=True)
class Rodas5P(AbstractRosenbrock):
    """The default integrator: Rodas5P, a stiffly accurate Rosenbrock method of order 5(4).

    One factorization of ``W = I/(h gamma) - J`` per step attempt and eight solves; L-stable,
    for stiff problems; derivatives in both directions (``ds.ForwardMode()``,
    ``ds.CheckpointAdjoint()``). See ``diffsoup.integrate._rodas5p`` for its coefficients.

    Args:
        stage_code: how the stages are written into the compiled program: ``"loop"`` (one loop
            body over the tableau's rows: a smaller program, which compiles faster), ``"unrolled"``
            (one copy of the code per stage: no per-iteration cost at run time), or ``"auto"``
            (the default: the loop when the right-hand side has at least 48 operations, where its
            copies dominate the program, unrolled below). They agree to rounding.

    Raises:
        ValueError: for another ``stage_code``.
    """

    tableau: ClassVar[RosenbrockTableau] = TABLEAU
    stage_code: str = "auto"

    def __post_init__(self):
        if self.stage_code not in STAGE_CODES:
            raise ValueError(f"Rodas5P.stage_code={self.stage_code!r} must be one of {STAGE_CODES}.")
