"""Helpers shared by the stiff-solver benchmarks: timing, machine information, scipy and diffrax
peers on a built diffsoup problem, tables, JSON."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

RESULTS = Path(__file__).parent / "results"


# ----------------------------------------------------------------------------------------------
# Machine and timing
# ----------------------------------------------------------------------------------------------


def machine_info() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for pkg in ("diffsoup", "jax", "jaxlib", "numpy", "scipy", "klujax", "diffrax", "equinox", "lineax"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    if versions["diffsoup"] is None:
        import diffsoup

        versions["diffsoup"] = diffsoup.__version__
    mem = None
    try:
        import psutil

        mem = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    return {
        "cpu_count": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": mem,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "jax_backend": jax.default_backend(),
        "jax_devices": [str(d) for d in jax.devices()],
        "versions": versions,
        "load_average_at_start": os.getloadavg(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def block(x):
    return jax.block_until_ready(x)


def repeats_for(seconds_one_call: float, repeats: int, min_total: float = 1.0, max_repeats: int = 25) -> int:
    """At least ``repeats``; more for quick calls, so that the timed calls add up to ``min_total``
    seconds (at most ``max_repeats``): a median of milliseconds is otherwise noise on a busy machine."""
    if seconds_one_call <= 0:
        return max_repeats
    return max(repeats, min(max_repeats, math.ceil(min_total / seconds_one_call)))


def timed(fn, repeats: int, *, first: bool = True):
    """Run ``fn`` (which must block until its result is ready) once (the first call: compile +
    run) and then at least ``repeats`` more times (more for quick calls, see :func:`repeats_for`).
    Returns ``(first_seconds, [steady seconds], last_result)``."""
    t_first = None
    out = None
    if first:
        t = time.perf_counter()
        out = fn()
        t_first = time.perf_counter() - t
    times = []
    count = repeats
    while len(times) < count:
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
        if len(times) == 1:
            count = repeats_for(times[0], repeats)
    return t_first, times, out


def aot_compile_seconds(fn, *args) -> float:
    """Seconds to trace, lower and compile ``jax.jit(fn)`` for ``args`` (nothing is run)."""
    t = time.perf_counter()
    jax.jit(fn).lower(*args).compile()
    return time.perf_counter() - t


def median(xs):
    return float(statistics.median(xs)) if xs else float("nan")


def compile_seconds(first, steady):
    """First call minus the steady-state (median) call; never below zero."""
    if first is None or not steady:
        return None
    return max(first - median(steady), 0.0)


def fmt(x, spec=".3g", missing="–"):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return missing
    if isinstance(x, str):
        return x
    return format(x, spec)


def markdown_table(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    for row in rows:
        out.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(out)


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)

    def default(o):
        if isinstance(o, (np.integer,)):
            return int(o)
        if isinstance(o, (np.floating,)):
            return float(o)
        if isinstance(o, np.ndarray):
            return o.tolist()
        return str(o)

    def clean(o):
        if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
            return None if math.isnan(o) else ("inf" if o > 0 else "-inf")
        if isinstance(o, dict):
            return {str(k): clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        return o

    path.write_text(json.dumps(clean(payload), indent=1, default=default) + "\n")


# ----------------------------------------------------------------------------------------------
# Peers on a built diffsoup problem
# ----------------------------------------------------------------------------------------------


def jitted_fns(problem, params=None):
    """``f(t, y)`` and the exact sparse Jacobian ``jac(t, y)`` (CSC, for scipy) from a built
    problem: its jitted right-hand side and its colored Jacobian values on its pattern, warmed up."""
    import jax.numpy as jnp

    p = problem.parameter_vector(params)
    rhs = jax.jit(problem.rhs)
    jv = jax.jit(problem.jacobian_values)
    pattern = problem.pattern.to_scipy().tocsc()
    # values in CSR order -> CSC data order, once
    csr = problem.pattern.to_scipy(np.arange(problem.pattern.nnz, dtype=np.float64))
    order = csr.tocsc()
    order.sort_indices()
    perm = np.asarray(order.data, dtype=np.int64)
    indices, indptr, n = order.indices.copy(), order.indptr.copy(), problem.n_states
    import scipy.sparse as sp

    def f(t, y):
        return np.asarray(rhs(t, y, p))

    def jac(t, y):
        vals = np.asarray(jv(jnp.asarray(t, jnp.float64), jnp.asarray(y, jnp.float64), p))
        return sp.csc_matrix((vals[perm], indices, indptr), shape=(n, n))

    y = np.asarray(problem.spec.y0, float) if problem.spec.y0 is not None else np.ones(problem.n_states)
    f(0.0, y), jac(0.0, y)  # compile both before any timing
    return f, jac, pattern


def scipy_solve(f, jac, pattern, y0, pieces, method, rtol, atol):
    """``solve_ivp`` over consecutive ``pieces`` [(t0, t1), ...] (restarting at discontinuities);
    returns the final state and summed counters."""
    from scipy.integrate import solve_ivp

    y = np.asarray(y0, float)
    stats = {"n_steps": 0, "nfev": 0, "njev": 0, "nlu": 0, "status": 0}
    for a, b in pieces:
        sol = solve_ivp(f, (a, b), y, method=method, rtol=rtol, atol=atol, jac=jac, jac_sparsity=pattern)
        if sol.status != 0:
            stats["status"] = sol.status
            stats["message"] = sol.message
        y = sol.y[:, -1]
        stats["n_steps"] += len(sol.t) - 1
        stats["nfev"] += sol.nfev
        stats["njev"] += sol.njev
        stats["nlu"] += sol.nlu
    return y, stats


def diffrax_solver(problem, t0, t1, rtol, atol, jump_ts=(), max_steps=200_000, adjoint=None, throw=True):
    """A jitted ``(y0, p) -> (y(t1), stats)`` with diffrax ``Kvaerno5`` and a PID controller
    (``jump_ts`` through ``ClipStepSizeController``)."""
    import diffrax

    term = diffrax.ODETerm(lambda t, y, args: problem.rhs(t, y, args))
    controller = diffrax.PIDController(rtol=rtol, atol=atol)
    if jump_ts:
        controller = diffrax.ClipStepSizeController(controller, jump_ts=list(jump_ts))
    kwargs = {} if adjoint is None else {"adjoint": adjoint}

    def solve(y0, p):
        sol = diffrax.diffeqsolve(
            term, diffrax.Kvaerno5(), t0, t1, None, y0, args=p, saveat=diffrax.SaveAt(t1=True),
            stepsize_controller=controller, max_steps=max_steps, throw=throw, **kwargs,
        )  # fmt: skip
        stats = {k: sol.stats[k] for k in ("num_steps", "num_accepted_steps", "num_rejected_steps")}
        return sol.ys[-1], stats, sol.result == diffrax.RESULTS.successful

    return solve
