"""One iteration of the trust region reflective least-squares method for one lane, in JAX.

The method is that of Branch, Coleman and Li (1999), as ``scipy.optimize.least_squares(method=
"trf")`` implements it (``scipy/optimize/_lsq/trf.py``, ``trf_bounds``, with ``x_scale=1`` and the
``"exact"`` subproblem solver), rewritten so that a lane is a handful of ``(k, k)`` operations that
``jax.vmap`` runs for many lanes at once (:mod:`diffsoup.inference.fitting._batched_trust_region` drives the
lanes). For the residuals ``r(x)`` of a box-bounded problem ``min 0.5 ||r(x)||^2, l <= x <= u``:

- **Scaling (Coleman and Li 1994, 1996).** ``v_i`` is the distance to the bound the gradient
  ``g = J^T r`` points towards (1 where that bound is infinite); in the variables ``x = D x^``,
  ``D = diag(v^1/2)``, the step shrinks near the bound it heads for, and the model gains the
  diagonal ``C = diag(g dv)`` (``dv``: the derivative of ``v``). The first-order condition of the
  bounded problem is ``||v g||_inf = 0``: the ``gtol`` test.
- **Subproblem.** ``min_p 0.5 p^T (D J^T J D + C) p + (D g)^T p, ||p|| <= Delta`` is solved
  exactly in the eigenbasis of the ``(k, k)`` matrix (Moré 1978: the Gauss-Newton step if it is
  inside, else the Levenberg-Marquardt parameter ``alpha`` by Newton's method on the secular
  equation, 10 iterations at most, to 1 % of ``Delta``). Only ``J^T J`` and ``J^T r`` enter, never
  ``J`` itself, so a lane's work does not grow with the number of residuals.
- **Bounds by reflection.** A step that leaves the box is cut at the first bound it meets and
  reflected there; the step taken is the best, by the quadratic model, of the cut step (pulled
  back by ``theta = max(0.995, 1 - ||v g||_inf)`` to stay strictly inside), the minimizer along the
  reflected direction, and the scaled Cauchy step. Iterates stay strictly feasible.
- **Acceptance and radius.** A step is taken when it lowers the cost; the radius becomes a quarter
  of the step when the ratio of actual to predicted reduction is below 0.25, doubles when it is
  above 0.75 and the step reached the radius. A trial point whose residuals are not finite (a
  failed solve) is rejected and the radius cut to a quarter of the step: NaN never enters ``x``,
  the cost or the model.
- **Convergence** (scipy's tests): ``ftol`` (``dF < ftol F`` on a step with ratio above 0.25),
  ``xtol`` (``||dx|| < xtol (xtol + ||x||)``), ``gtol`` (``||v g||_inf < gtol``); and one of ours,
  ``stall``: the cost fell by less than ``stall_rtol F`` over the last ``stall_window`` evaluations.
  In a flat valley scipy's test rarely fires (the model is poor there, so steps with a ratio below
  0.25 alternate with longer ones): from one Boehm start 899 evaluations crept along a
  non-identifiable direction, the cost falling 2e-6 relative per 40 evaluations. A start that is
  still far from its optimum is left to the polish (:mod:`diffsoup.inference.fitting._batched_fit`).

Convergence: with the Gauss-Newton model the iteration converges globally to a point satisfying the
first-order conditions (the scaled gradient vanishes) and, near a nondegenerate minimum where the
residuals are small or zero, locally quadratically (zero residuals) or linearly with a rate set by
the residuals' curvature (Branch et al. 1999, section 5; Coleman and Li 1996, theorems 3.4 and 3.11).
Why this method: it is what scipy's ``least_squares`` runs (so a newcomer can check a lane against
it), it needs nothing but ``J^T J`` and ``J^T r`` (small, dense, the same shapes in every lane), it
keeps every iterate strictly inside the box (ODE models are often undefined outside), and it has
no line search, only fixed-size work per iteration, which is what lanes in lock-step need.

References:
    M. A. Branch, T. F. Coleman, Y. Li, "A subspace, interior, and conjugate gradient method for
    large-scale bound-constrained minimization problems", SIAM J. Sci. Comput. 21 (1999) 1-23.
    T. F. Coleman, Y. Li, "An interior trust region approach for nonlinear minimization subject to
    bounds", SIAM J. Optim. 6 (1996) 418-445.
    J. J. Moré, "The Levenberg-Marquardt algorithm: implementation and theory", Numerical Analysis,
    Lecture Notes in Mathematics 630 (1978) 105-116.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

EPS = float(np.finfo(np.float64).eps)
SUBPROBLEM_ITERATIONS = 10  # scipy's solve_lsq_trust_region(max_iter=10)
SUBPROBLEM_RTOL = 0.01  # ... rtol=1e-2: the step's norm within 1 % of the radius


class LaneStatus(enum.IntEnum):
    """What a lane is doing, or how its start ended.

    ``EMPTY``: the lane holds no start (padding, or every start is done). ``STARTING``: its pending
    point is a start point, whose evaluation begins the start. ``RUNNING``: iterating. The others
    end a start: converged by ``gtol``, ``ftol`` or ``xtol``; ``MAX_EVALUATIONS`` (the budget is
    spent); ``FAILED_START`` (the start point's residuals are not finite: a solve failed);
    ``FAILED_SOLVES`` (``max_failed_in_a_row`` trial points in a row failed to solve);
    ``STALLED`` (the cost fell by less than ``stall_rtol`` relative over ``stall_window``
    evaluations: a function-value test over a window, counted as converged).
    """

    EMPTY = -1
    RUNNING = 0
    STARTING = 1
    GTOL = 2
    FTOL = 3
    XTOL = 4
    MAX_EVALUATIONS = 5
    FAILED_START = 6
    FAILED_SOLVES = 7
    STALLED = 8

    @property
    def converged(self) -> bool:
        return self in (LaneStatus.GTOL, LaneStatus.FTOL, LaneStatus.XTOL, LaneStatus.STALLED)

    @property
    def finished(self) -> bool:
        return self >= LaneStatus.GTOL


class LaneState(NamedTuple):
    """The lanes of a batched trust-region run: every field has a leading lane axis ``L``.

    Attributes:
        x: ``(L, k)`` the current (accepted) point; cost: ``(L,)`` ``0.5 ||r||^2`` there.
        g, H: ``(L, k)`` ``J^T r`` and ``(L, k, k)`` ``J^T J`` there.
        radius: ``(L,)`` the trust-region radius (in the scaled variables ``x^``).
        alpha: ``(L,)`` the Levenberg-Marquardt parameter of the last subproblem.
        trial: ``(L, k)`` the point the next evaluation is asked for (a step from ``x``, or the
            start point of a ``STARTING`` lane).
        predicted: ``(L,)`` the model's reduction of the cost for the trial step.
        step_norm, step_h_norm: ``(L,)`` the trial step's norm in ``x`` and in ``x^``.
        status: ``(L,)`` :class:`LaneStatus` codes.
        evaluations: ``(L,)`` evaluations of the start so far (its start point's included).
        accepted: ``(L,)`` accepted steps; failed: ``(L,)`` evaluations that failed to solve;
        failed_in_a_row: ``(L,)`` trial points in a row that failed to solve.
        window_cost, window_start: ``(L,)`` the cost and the evaluation count at the start of the
            current stall window.
    """

    x: np.ndarray
    cost: np.ndarray
    g: np.ndarray
    H: np.ndarray
    radius: np.ndarray
    alpha: np.ndarray
    trial: np.ndarray
    predicted: np.ndarray
    step_norm: np.ndarray
    step_h_norm: np.ndarray
    status: np.ndarray
    evaluations: np.ndarray
    accepted: np.ndarray
    failed: np.ndarray
    failed_in_a_row: np.ndarray
    window_cost: np.ndarray
    window_start: np.ndarray


def empty_lanes(lanes: int, k: int) -> LaneState:
    """``lanes`` lanes holding no start (host arrays, to be filled by the driver)."""
    f, i = np.float64, np.int32
    return LaneState(x=np.zeros((lanes, k), f), cost=np.zeros(lanes, f), g=np.zeros((lanes, k), f),
                     H=np.zeros((lanes, k, k), f), radius=np.ones(lanes, f), alpha=np.zeros(lanes, f),
                     trial=np.zeros((lanes, k), f), predicted=np.zeros(lanes, f), step_norm=np.zeros(lanes, f),
                     step_h_norm=np.zeros(lanes, f), status=np.full(lanes, int(LaneStatus.EMPTY), i),
                     evaluations=np.zeros(lanes, i), accepted=np.zeros(lanes, i), failed=np.zeros(lanes, i),
                     failed_in_a_row=np.zeros(lanes, i), window_cost=np.zeros(lanes, f),
                     window_start=np.zeros(lanes, i))  # fmt: skip


# -- the pieces of one lane's iteration (scipy's trf.py / common.py, one lane, no Python branches) ---
def scaling_vector(x, g, lower, upper):
    """Coleman and Li's ``v`` (distance to the bound that ``-g`` points to; 1 if it is infinite)
    and ``dv`` (its derivative: -1, 0 or 1)."""
    to_upper = (g < 0) & jnp.isfinite(upper)
    to_lower = (g > 0) & jnp.isfinite(lower)
    v = jnp.where(to_upper, upper - x, jnp.where(to_lower, x - lower, 1.0))
    dv = jnp.where(to_upper, -1.0, jnp.where(to_lower, 1.0, 0.0))
    return v, dv


def step_to_bound(x, s, lower, upper):
    """The largest ``t`` with ``x + t s`` in the box, and which coordinates meet a bound there
    (``sign(s)`` where they do, 0 elsewhere); ``inf`` for ``s = 0``."""
    moving = s != 0
    safe = jnp.where(moving, s, 1.0)
    steps = jnp.where(moving, jnp.maximum((lower - x) / safe, (upper - x) / safe), jnp.inf)
    t = jnp.min(steps)
    return t, jnp.where(steps == t, jnp.sign(s), 0.0)


def to_sphere(p, s, radius):
    """The positive ``t`` with ``||p + t s|| = radius`` (``p`` inside the sphere)."""
    a, b, c = s @ s, p @ s, p @ p - radius**2
    d = jnp.sqrt(jnp.maximum(b * b - a * c, 0.0))
    q = -(b + jnp.where(b >= 0, d, -d))
    q = jnp.where(q == 0, -EPS, q)
    return jnp.maximum(q / jnp.where(a == 0, 1.0, a), c / q)


def quadratic(Hh, diag, g, s):
    """The model ``0.5 s^T (Hh + diag) s + g^T s``."""
    return 0.5 * (s @ Hh @ s + (s * diag) @ s) + g @ s


def quadratic_1d(Hh, diag, g, s, s0):
    """``(a, b, c)`` of the model along ``s0 + t s``: ``a t^2 + b t + c``."""
    a = 0.5 * (s @ Hh @ s + (s * diag) @ s)
    b = g @ s + s0 @ Hh @ s + (s0 * diag) @ s
    c = quadratic(Hh, diag, g, s0)
    return a, b, c


def minimize_1d(a, b, lo, hi, c=0.0):
    """The minimizer of ``a t^2 + b t + c`` on ``[lo, hi]`` and its value."""
    extremum = -0.5 * b / jnp.where(a != 0, a, 1.0)
    inside = (a != 0) & (lo < extremum) & (extremum < hi)
    t = jnp.stack([lo, hi, jnp.where(inside, extremum, lo)])
    y = t * (a * t + b) + c
    i = jnp.argmin(y)
    return t[i], y[i]


def subproblem(w, V, q, radius, alpha, m):
    """The trust-region step ``p`` minimizing ``0.5 p^T B p + q'^T p`` over ``||p|| <= radius``,
    given ``B = V diag(w) V^T`` and ``q = V^T q'``, and its Levenberg-Marquardt parameter (Moré's
    method as scipy's ``solve_lsq_trust_region``, ``alpha`` the last one as its start)."""
    w = jnp.maximum(w, 0.0)
    n = w.shape[0]
    s = jnp.sqrt(w)
    full_rank = (m >= n) & (jnp.min(s) > EPS * m * jnp.max(s))
    q_norm = jnp.linalg.norm(q)
    p_gn = -V @ (q / jnp.where(full_rank, w, 1.0))
    gauss_newton = full_rank & (jnp.linalg.norm(p_gn) <= radius)

    def phi(a):
        denom = jnp.maximum(w + a, EPS * EPS)
        p_norm = jnp.maximum(jnp.linalg.norm(q / denom), jnp.finfo(w.dtype).tiny)
        return p_norm - radius, -jnp.sum(q**2 / denom**3) / p_norm

    upper = q_norm / radius
    phi0, dphi0 = phi(0.0)
    lower = jnp.where(full_rank, -phi0 / jnp.where(dphi0 == 0, -1.0, dphi0), 0.0)
    restart = jnp.maximum(0.001 * upper, jnp.sqrt(lower * upper))
    alpha = jnp.where(~full_rank & (alpha == 0), restart, alpha)

    def body(_, carry):
        alpha, lower, upper, done = carry
        a = jnp.where((alpha < lower) | (alpha > upper), jnp.maximum(0.001 * upper, jnp.sqrt(lower * upper)), alpha)
        value, slope = phi(a)
        upper_ = jnp.where(value < 0, a, upper)
        ratio = value / jnp.where(slope == 0, -1.0, slope)
        lower_ = jnp.maximum(lower, a - ratio)
        a_ = a - (value + radius) * ratio / radius
        finished = jnp.abs(value) < SUBPROBLEM_RTOL * radius
        keep = lambda new, old: jnp.where(done, old, new)  # noqa: E731
        return keep(a_, alpha), keep(lower_, lower), keep(upper_, upper), done | finished

    alpha, _, _, _ = jax.lax.fori_loop(0, SUBPROBLEM_ITERATIONS, body, (alpha, lower, upper, jnp.asarray(False)))
    p = -V @ (q / jnp.maximum(w + alpha, EPS * EPS))
    p = p * (radius / jnp.maximum(jnp.linalg.norm(p), jnp.finfo(w.dtype).tiny))
    return jnp.where(gauss_newton, p_gn, p), jnp.where(gauss_newton, 0.0, alpha)


def select_step(x, Hh, diag, g_h, p, p_h, d, radius, lower, upper, theta):
    """The reflective choice among the cut trust-region step, the reflected step and the scaled
    Cauchy step (scipy's ``select_step``): ``(step, step in x^, predicted reduction)``."""
    inside = jnp.all((x + p >= lower) & (x + p <= upper))
    inside_value = quadratic(Hh, diag, g_h, p_h)

    p_stride, hits = step_to_bound(x, p, lower, upper)
    r_h = jnp.where(hits != 0, -p_h, p_h)
    r = d * r_h
    p_cut, p_h_cut = p * p_stride, p_h * p_stride
    to_tr = to_sphere(p_h_cut, r_h, radius)
    to_bound, _ = step_to_bound(x + p_cut, r, lower, upper)
    r_stride = jnp.minimum(to_bound, to_tr)
    positive = r_stride > 0
    r_lo = jnp.where(positive, (1 - theta) * p_stride / jnp.where(positive, r_stride, 1.0), 0.0)
    r_hi = jnp.where(positive, jnp.where(r_stride == to_bound, theta * to_bound, to_tr), -1.0)
    a, b, c = quadratic_1d(Hh, diag, g_h, r_h, p_h_cut)
    t, r_value = minimize_1d(a, b, r_lo, r_hi, c)
    r_value = jnp.where(r_lo <= r_hi, r_value, jnp.inf)
    r_h = r_h * t + p_h_cut
    r = r_h * d

    p_cut, p_h_cut = p_cut * theta, p_h_cut * theta
    p_value = quadratic(Hh, diag, g_h, p_h_cut)
    ag_h = -g_h
    ag = d * ag_h
    to_tr = radius / jnp.maximum(jnp.linalg.norm(ag_h), jnp.finfo(x.dtype).tiny)
    to_bound, _ = step_to_bound(x, ag, lower, upper)
    ag_stride = jnp.where(to_bound < to_tr, theta * to_bound, to_tr)
    a, b, _ = quadratic_1d(Hh, diag, g_h, ag_h, jnp.zeros_like(ag_h))
    t, ag_value = minimize_1d(a, b, 0.0, ag_stride)
    ag_h, ag = ag_h * t, ag * t

    take_p = (p_value < r_value) & (p_value < ag_value)
    take_r = ~take_p & (r_value < p_value) & (r_value < ag_value)

    def choose(vp, vr, vag, vin):
        return jnp.where(inside, vin, jnp.where(take_p, vp, jnp.where(take_r, vr, vag)))

    return (choose(p_cut, r, ag, p), choose(p_h_cut, r_h, ag_h, p_h),
            -choose(p_value, r_value, ag_value, inside_value))  # fmt: skip


def strictly_feasible(x, lower, upper):
    """``x`` moved off any bound it lies on, by one floating-point step inwards."""
    x = jnp.where(x <= lower, jnp.nextafter(lower, upper), jnp.where(x >= upper, jnp.nextafter(upper, lower), x))
    return jnp.where((x < lower) | (x > upper), 0.5 * (lower + upper), x)


def propose(x, g, H, radius, alpha, lower, upper, m):
    """The next trial point from ``x`` (scipy's inner step): ``(trial, predicted reduction, step
    norm, step norm in x^, alpha)``."""
    v, dv = scaling_vector(x, g, lower, upper)
    g_norm = jnp.max(jnp.abs(g * v))
    d = jnp.sqrt(v)
    diag = g * dv
    g_h = d * g
    Hh = d[:, None] * H * d[None, :]
    w, V = jnp.linalg.eigh(Hh + jnp.diag(diag))
    p_h, alpha = subproblem(w, V, V.T @ g_h, radius, alpha, m)
    theta = jnp.maximum(0.995, 1.0 - g_norm)
    step, step_h, predicted = select_step(x, Hh, diag, g_h, d * p_h, p_h, d, radius, lower, upper, theta)
    trial = strictly_feasible(x + step, lower, upper)
    return trial, predicted, jnp.linalg.norm(step), jnp.linalg.norm(step_h), alpha


def initial_radius(x, g, lower, upper, given):
    """scipy's first radius ``||x / v^1/2||`` (1 where that is 0), or ``given`` when positive."""
    v, _ = scaling_vector(x, g, lower, upper)
    radius = jnp.linalg.norm(x / jnp.sqrt(v))
    radius = jnp.where(radius > 0, radius, 1.0)
    return jnp.where(given > 0, given, radius)


def lane_step(lane: LaneState, r, J, solved, lower, upper, options: tuple) -> LaneState:
    """One iteration of one lane (fields without the lane axis) given the residuals ``r`` and the
    Jacobian ``J`` at its trial point (``solved``: whether every solve there succeeded): accept
    or reject, update the radius, test convergence, and propose the next trial point.

    ``options``: ``(ftol, xtol, gtol, max_evaluations, max_failed_in_a_row, first_radius,
    stall_rtol, stall_window)``."""
    ftol, xtol, gtol, max_evaluations, max_failed_in_a_row, first_radius, stall_rtol, stall_window = options
    m = r.shape[0]
    cost_t, g_t, H_t = 0.5 * (r @ r), J.T @ r, J.T @ J
    finite = solved & jnp.isfinite(cost_t) & jnp.all(jnp.isfinite(g_t)) & jnp.all(jnp.isfinite(H_t))
    cost_t = jnp.where(finite, cost_t, jnp.inf)
    g_t, H_t = jnp.where(finite, g_t, 0.0), jnp.where(finite, H_t, 0.0)
    status = lane.status
    starting, running = status == int(LaneStatus.STARTING), status == int(LaneStatus.RUNNING)
    evaluated = starting | running

    # A running lane: the trial step's quality, the radius, the ftol/xtol tests.
    actual = lane.cost - cost_t
    predicted = lane.predicted
    ratio = jnp.where(predicted > 0, actual / jnp.where(predicted > 0, predicted, 1.0),
                      jnp.where((predicted == 0) & (actual == 0), 1.0, 0.0))  # fmt: skip
    grown = (ratio > 0.75) & (lane.step_h_norm > 0.95 * lane.radius)
    radius = jnp.where(ratio < 0.25, 0.25 * lane.step_h_norm, jnp.where(grown, 2.0 * lane.radius, lane.radius))
    radius = jnp.where(finite, radius, 0.25 * lane.step_h_norm)
    alpha = jnp.where(finite & (radius > 0), lane.alpha * lane.radius / jnp.where(radius > 0, radius, 1.0), lane.alpha)
    ftol_met = finite & (actual < ftol * lane.cost) & (ratio > 0.25)
    xtol_met = finite & (lane.step_norm < xtol * (xtol + jnp.linalg.norm(lane.x)))
    take = (starting & finite) | (running & finite & (actual > 0))
    failed_in_a_row = jnp.where(evaluated & ~finite, lane.failed_in_a_row + 1, jnp.where(evaluated, 0, lane.failed_in_a_row))

    x = jnp.where(take, lane.trial, lane.x)
    cost = jnp.where(take, cost_t, lane.cost)
    g = jnp.where(take, g_t, lane.g)
    H = jnp.where(take, H_t, lane.H)
    radius = jnp.where(starting, initial_radius(lane.trial, g_t, lower, upper, first_radius),
                       jnp.where(running, radius, lane.radius))  # fmt: skip
    alpha = jnp.where(starting, 0.0, jnp.where(running, alpha, lane.alpha))
    evaluations = lane.evaluations + evaluated
    new = jnp.where(starting, jnp.where(finite, int(LaneStatus.RUNNING), int(LaneStatus.FAILED_START)), status)
    new = jnp.where(running & ftol_met, int(LaneStatus.FTOL), new)
    new = jnp.where(running & ~ftol_met & xtol_met, int(LaneStatus.XTOL), new)
    new = jnp.where(running & (failed_in_a_row >= max_failed_in_a_row), int(LaneStatus.FAILED_SOLVES), new)

    # The stall window: a running lane whose cost fell by too little over it stops.
    window_full = running & (evaluations - lane.window_start >= stall_window)
    new = jnp.where(window_full & (new == int(LaneStatus.RUNNING)) & (lane.window_cost - cost <= stall_rtol * cost),
                    int(LaneStatus.STALLED), new)  # fmt: skip
    restart = starting | window_full
    window_cost = jnp.where(restart, cost, lane.window_cost)
    window_start = jnp.where(restart, evaluations, lane.window_start)
    # Still running: the gradient test and the budget at the (new) point, then the next trial.
    v, _ = scaling_vector(x, g, lower, upper)
    new = jnp.where((new == int(LaneStatus.RUNNING)) & (jnp.max(jnp.abs(g * v)) < gtol), int(LaneStatus.GTOL), new)
    new = jnp.where((new == int(LaneStatus.RUNNING)) & (evaluations >= max_evaluations), int(LaneStatus.MAX_EVALUATIONS), new)
    on = new == int(LaneStatus.RUNNING)
    trial, predicted, step_norm, step_h_norm, alpha_next = propose(x, g, H, jnp.where(on, radius, 1.0), alpha,
                                                                   lower, upper, m)  # fmt: skip
    keep = lambda a, b: jnp.where(on, a, b)  # noqa: E731
    return LaneState(x=x, cost=cost, g=g, H=H, radius=radius, alpha=keep(alpha_next, alpha),
                     trial=keep(trial, x), predicted=keep(predicted, 0.0), step_norm=keep(step_norm, 0.0),
                     step_h_norm=keep(step_h_norm, 0.0), status=new.astype(lane.status.dtype),
                     evaluations=evaluations.astype(lane.evaluations.dtype),
                     accepted=(lane.accepted + (running & take)).astype(lane.accepted.dtype),
                     failed=(lane.failed + (evaluated & ~finite)).astype(lane.failed.dtype),
                     failed_in_a_row=failed_in_a_row.astype(lane.failed_in_a_row.dtype), window_cost=window_cost,
                     window_start=window_start.astype(lane.window_start.dtype))  # fmt: skip
