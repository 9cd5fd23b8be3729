"""Studies on one GPU: default chunking against a sweep of chunk sizes, diffrax and the CPU.

The study of issue 22: experiments of the 20-species network (``mass_action_network(20, 25,
seed=3)``, every species observed at 4 times, its own initial state per experiment, rtol 1e-6,
atol 1e-9), and of the 2-D Brusselator (N = 8 and 16; ``B`` and the initial state per
experiment; u observed at 2 times) through ``CuDSS`` and ``Dense``. Every figure is the median
wall time of evaluations after the first (which compiles; its time is the "first s" column), in
the same process as its peers:

* ``network``: 1,000 / 10,000 / 100,000 experiments, modes ``value``, ``value_and_grad``
  (adjoint) and ``residuals_and_jacobian``, the default ``ds.lower`` (chunk chosen from device
  memory); an estimate of the floating-point work per value evaluation (LU and triangular solves
  of the steps the solves took) and the fraction of the device's float64 peak it reached.
* ``sweep``: 10,000 experiments, ``value_and_grad`` at chunk sizes 250 ... 10,000 against the
  default; diffrax ``Kvaerno5`` vmapped over the same experiments (same tolerances, its adjoint
  ``RecursiveCheckpointAdjoint``); diffsoup on the machine's CPU cores.
* ``diffrax``: diffrax's rows of the sweep alone (``--diffrax-sizes``), to run with ``network``.
* ``brusselator``: 1,000 experiments, N = 8 and 16, ``CuDSS`` and ``Dense``, the three modes.
* ``dask``: 10,000 experiments through ``ds.distributed.run`` on one Dask GPU worker (embedded
  LocalCluster) against the same study in-process.
* ``early``: 10,000 experiments of the oscillating Brusselator N = 4 (32 states, Dense) of which
  every tenth is measured until t = 70 instead of 2 (ten times the steps; the network's steps barely
  grow with its rates, it settles), ``value_and_grad`` in lock-step (in study order and after
  ``lowered.balance()``), regrouped as lanes finish (``lane_mode="compact"``), one after the other
  (CPU only) and by default, against the same study with every experiment short: what lock-step
  lanes cost and what each way gives back.
* ``host``: a one-condition PEtab model (Boehm, 12 parameters; issue 42) lowered with
  ``device="auto"`` (on a GPU machine its few lanes run on the host CPU) against
  ``device="default"`` (the GPU), ``value`` and ``value_and_grad``; plus the points-as-lanes
  Jacobian of 1,000 points (``--quick``: 8), which ``"auto"`` keeps on the GPU. On a CPU-only
  machine both rows run on the CPU.

Every ``Dense`` solver takes ``--dense-solve`` (``ds.linear.Dense(solve=...)``: ``auto``, the
default, is the explicit inverse on a GPU and the LU's triangular solves on a CPU; ``lu``;
``inverse``); several values run every part once per value in the same process, each row tagged
with its ``dense_solve`` (diffrax's rows once).

Run (GPU machine): ``python benchmarks/bench_gpu_study.py --part network sweep`` (``--part
host`` for issue 42's one-condition model; parts as
above; ``--quick`` shrinks every size for a CPU smoke run; ``--sizes 1000000 --modes
value_and_grad`` for one mode of the network part; ``--dense-solve lu inverse`` for both paths
of the dense solves). Writes
``benchmarks/results/bench_gpu_study_<parts>.json`` (or ``--out``) and prints a table per part.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, fmt, machine_info, median, write_json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import diffsoup as ds  # noqa: E402
from diffsoup.inference import Gaussian, Parameter, SolverOptions  # noqa: E402

RTOL, ATOL = 1e-6, 1e-9
TIMES = np.array([0.2, 1.0, 3.0, 6.0])
MODES = ("value", "value_and_grad", "residuals_and_jacobian")
DENSE_SOLVES = ("auto", "lu", "inverse")  # ds.linear.Dense(solve=...)
# Float64 peaks (FLOP/s) by device name: H200 SXM, vector units and tensor cores (NVIDIA's sheet).
FP64_PEAK = {"H200": (34e12, 67e12), "H100": (34e12, 67e12)}


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _timed(fn, repeats: int = 3, budget_s: float = 30.0):
    """(first call seconds, median of the later calls): at least one after the first (which
    compiles), up to ``repeats`` while they add up to less than ``budget_s``."""
    t = time.perf_counter()
    fn()
    first = time.perf_counter() - t
    times: list[float] = []
    while not times or (len(times) < repeats and sum(times) + times[-1] < budget_s):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return first, median(times)


# ---- studies --------------------------------------------------------------------------------------


def _network_problem(dense_solve: str = "auto"):
    from diffsoup.examples import mass_action_network

    net = mass_action_network(20, 25, seed=3)
    return net, net.to_spec(y0=np.ones(20)).build(linear_solver=ds.linear.Dense(solve=dense_solve))


def network_study(n: int, *, slow_fraction: float = 0.0, problem=None, dense_solve: str = "auto"):
    """``n`` experiments of the 20-species network, each with its own initial state; a
    ``slow_fraction`` of them with every rate constant ten times larger (ten times the steps);
    ``dense_solve`` is the ``Dense(solve=...)`` of the network's solves."""
    net, built = _network_problem(dense_solve)
    problem = problem or built
    rng = np.random.default_rng(0)
    y0s = rng.uniform(0.2, 2.0, (n, 20))
    data = np.ones((n, 4, 20))
    params = [Parameter(k, v, v / 100, v * 100) for k, v in net.parameters.items()]
    n_slow = int(round(slow_fraction * n))
    if hasattr(ds.Study, "from_arrays") and n_slow == 0:
        return ds.Study.from_arrays(problem, np.broadcast_to(TIMES, (n, 4)), data, y0=y0s,
                                    noise=Gaussian(0.05), parameters=params)  # fmt: skip
    fast = {k: float(v) for k, v in net.parameters.items()}
    slow = {k: 10.0 * v for k, v in fast.items()}
    exps = [ds.Experiment(f"x{i}", TIMES, data[i], noise=Gaussian(0.05), y0=y0s[i],
                          conditions=slow if i < n_slow else None) for i in range(n)]  # fmt: skip
    return ds.Study(problem, exps, params)


def brusselator_study(n_grid: int, n: int, linear_solver):
    problem = ds.examples.brusselator_2d(n_grid).build(linear_solver=linear_solver)
    times = np.array([0.5, 1.0])
    u0 = np.asarray(problem.spec.y0)
    rng = np.random.default_rng(1)
    n_states = 2 * n_grid * n_grid
    exps = []
    for i in range(n):
        y0 = u0 * rng.uniform(0.8, 1.2)
        exps.append(ds.Experiment(f"b{i}", times, np.ones((2, n_states)), noise=Gaussian(0.1), y0=y0,
                                  conditions={"B": float(rng.uniform(0.8, 1.2))}))  # fmt: skip
    params = [Parameter("A", 3.4, 1.0, 10.0), Parameter("alpha", 10.0, 1.0, 100.0)]
    return ds.Study(problem, exps, params)


def _modes(lowered, modes=MODES, repeats=3):
    theta = lowered.problem.nominal
    rows = []
    for mode in modes:
        fn = getattr(lowered, mode)
        first, per_call = _timed(lambda: fn(theta), repeats)
        # Norms of the outputs, to compare linear solvers and chunkings row by row.
        out = fn(theta)
        norms = [float(np.linalg.norm(np.asarray(o))) for o in (out if isinstance(out, tuple) else (out,))]
        rows.append(dict(mode=mode, first_s=first, per_call_s=per_call, output_norms=norms, chunk=lowered.chunk_sizes.get(
            "jacobian" if mode == "residuals_and_jacobian" else mode), scratch_bytes=lowered.scratch_bytes.get(
            "jacobian" if mode == "residuals_and_jacobian" else mode)))  # fmt: skip
        _log(f"  {mode}: first {first:.2f} s, per call {per_call:.4f} s, chunks {rows[-1]['chunk']}")
    return rows


def _work_per_value(study, sample: int = 256, dense_solve: str = "auto") -> dict:
    """Floating-point work of one value evaluation, estimated from the steps a sample of the
    experiments takes: per LU ``2/3 n^3``, per solve ``2 n^2`` (dense factors: two triangular
    solves, or one product with the inverse), and where the inverse is formed (``dense_solve``
    ``"inverse"``, or ``"auto"`` off the CPU) ``2 n^3`` more per factorization."""
    problem = study.problem
    exps = [study.experiments[i] for i in range(min(sample, len(study)))]
    y0 = jnp.asarray(np.stack([np.asarray(problem.spec.y0 if e.y0 is None else e.y0, float) for e in exps]))

    @jax.jit
    @jax.vmap
    def stats(y):
        return ds.simulate(problem, y, jnp.asarray(TIMES), None, rtol=RTOL, atol=ATOL).stats

    s = jax.tree.map(np.asarray, stats(y0))
    n = problem.n_states
    path = getattr(problem.prepared, "path", dense_solve)  # Dense's "auto" is the LU above 64 states
    inverse = path == "inverse" or (path == "auto" and jax.default_backend() != "cpu")
    per_factor = 2 / 3 * n**3 + (2 * n**3 if inverse else 0)
    per_exp = float(np.mean(s["n_factor"])) * per_factor + float(np.mean(s["n_solves"])) * 2 * n**2
    return dict(flops_per_experiment=per_exp, mean_steps=float(np.mean(s["n_steps"])),
                mean_factorizations=float(np.mean(s["n_factor"])))  # fmt: skip


# ---- parts ------------------------------------------------------------------------------------------


def part_network(sizes, modes, out, save, dense_solve="auto"):
    peak = next((v for k, v in FP64_PEAK.items() if k in str(jax.devices()[0].device_kind)), None)
    for n in sizes:
        _log(f"network: {n} experiments (building), Dense(solve={dense_solve!r})")
        t = time.perf_counter()
        study = network_study(n, dense_solve=dense_solve)
        build_s = time.perf_counter() - t
        lowered = ds.lower(study, solver=SolverOptions(rtol=RTOL, atol=ATOL))
        rows = _modes(lowered, modes)
        for r in rows:
            r.update(experiments=n, build_s=build_s)
        if rows[0]["mode"] == "value":
            work = _work_per_value(study, dense_solve=dense_solve)
            value_s = rows[0]["per_call_s"]
            flops = work["flops_per_experiment"] * n
            rows[0].update(work, flops_per_value=flops, flop_rate=flops / value_s,
                           fraction_of_fp64_peak=None if peak is None else flops / value_s / peak[0])  # fmt: skip
        out += rows
        save()


def part_sweep(n, chunk_sizes, cpu_sizes, diffrax_sizes, rows, save, dense_solve="auto"):
    _log(f"sweep: {n} experiments, Dense(solve={dense_solve!r})")
    study = network_study(n, dense_solve=dense_solve)
    solver = SolverOptions(rtol=RTOL, atol=ATOL)
    for chunk in [None, *chunk_sizes]:
        lowered = ds.lower(study, solver=solver, experiments_per_chunk=chunk)
        first, per_call = _timed(lambda: lowered.value_and_grad(lowered.problem.nominal))
        rows.append(dict(what="diffsoup", chunk_size=chunk or "default", chunks=lowered.chunk_sizes["value_and_grad"],
                         experiments=n, mode="value_and_grad", first_s=first, per_call_s=per_call))  # fmt: skip
        _log(f"  chunk {chunk or 'default'} -> {rows[-1]['chunks'][:3]}: {per_call:.3f} s")
        save()
    for m in diffrax_sizes:
        rows += _diffrax_rows(m)
        save()
    cpu = jax.devices("cpu")[0]
    per_experiment = None
    for m in cpu_sizes:
        if per_experiment is not None and per_experiment * m > 60.0:  # linear in m: lanes run in turn
            rows.append(dict(what=f"diffsoup on the CPU ({os.cpu_count()} cores)", experiments=m, mode="value_and_grad",
                             per_call_s=per_experiment * m, extrapolated_from=cpu_sizes[0]))  # fmt: skip
            save()
            continue
        with jax.default_device(cpu):
            lowered = ds.lower(network_study(m, dense_solve=dense_solve), solver=solver)
            first, per_call = _timed(lambda: lowered.value_and_grad(lowered.problem.nominal), repeats=1, budget_s=1)
        rows.append(dict(what=f"diffsoup on the CPU ({os.cpu_count()} cores)", experiments=m, mode="value_and_grad",
                         first_s=first, per_call_s=per_call, chunks=lowered.chunk_sizes["value_and_grad"]))  # fmt: skip
        per_experiment = per_call / m
        _log(f"  CPU {m}: {per_call:.3f} s")
        save()


def part_diffrax(sizes, rows, save):
    """diffrax's rows alone (the peer of the network part), for a run that skips the sweep."""
    for m in sizes:
        _log(f"diffrax: {m} experiments")
        rows += _diffrax_rows(m)
        save()


def _diffrax_rows(n):
    """diffrax Kvaerno5 vmapped over ``n`` experiments of the network: value (the same Gaussian
    NLL) and value_and_grad in the network's parameters."""
    import diffrax

    net, problem = _network_problem()
    rng = np.random.default_rng(0)
    y0s = jnp.asarray(rng.uniform(0.2, 2.0, (n, 20)))
    data = jnp.ones((n, 4, 20))
    p0 = jnp.asarray(problem.parameter_vector())
    term = diffrax.ODETerm(lambda t, y, p: problem.rhs(t, y, p))
    controller = diffrax.PIDController(rtol=RTOL, atol=ATOL)

    def nll_one(p, y0, d):
        sol = diffrax.diffeqsolve(term, diffrax.Kvaerno5(), 0.0, float(TIMES[-1]), None, y0, args=p,
                                  saveat=diffrax.SaveAt(ts=jnp.asarray(TIMES)), stepsize_controller=controller,
                                  max_steps=100_000, throw=False)  # fmt: skip
        return 0.5 * jnp.sum(((sol.ys - d) / 0.05) ** 2)

    def nll(p):
        return jnp.sum(jax.vmap(nll_one, in_axes=(None, 0, 0))(p, y0s, data))

    rows = []
    for mode, fn in (("value", jax.jit(nll)), ("value_and_grad", jax.jit(jax.value_and_grad(nll)))):
        first, per_call = _timed(lambda: jax.block_until_ready(fn(p0)))
        rows.append(dict(what="diffrax Kvaerno5 vmapped", experiments=n, mode=mode, first_s=first, per_call_s=per_call))
        _log(f"  diffrax {n} {mode}: {per_call:.3f} s")
    return rows


def part_brusselator(n, grids, rows, save, dense_solve="auto", with_cudss=True):
    solver = SolverOptions(rtol=RTOL, atol=ATOL)
    for grid in grids:
        linear = (("CuDSS", ds.linear.CuDSS()),) if with_cudss else ()
        for name, lin in linear + (("Dense", ds.linear.Dense(solve=dense_solve)),):
            _log(f"brusselator N={grid} {name}: {n} experiments")
            try:
                lowered = ds.lower(brusselator_study(grid, n, lin), solver=solver)
                for r in _modes(lowered):
                    rows.append(dict(r, grid=grid, linear_solver=name, experiments=n))
            except Exception as exc:  # a mode that fails is a row of the table, with its error
                rows.append(dict(grid=grid, linear_solver=name, experiments=n, error=f"{type(exc).__name__}: {exc}"))
                _log(f"  failed: {rows[-1]['error'][:300]}")
            save()


def part_dask(n, rows, save, dense_solve="auto"):
    study = network_study(n, dense_solve=dense_solve)
    solver = SolverOptions(rtol=RTOL, atol=ATOL)
    lowered = ds.lower(study, solver=solver)
    _, in_process = _timed(lambda: lowered.value_and_grad(lowered.problem.nominal))
    _log(f"dask: in-process {in_process:.3f} s")
    with ds.distributed.run(study, solver=solver) as remote:
        first, per_call = _timed(lambda: remote.value_and_grad(remote.problem.nominal))
    _log(f"dask: one GPU worker {per_call:.3f} s")
    rows.append(dict(experiments=n, in_process_s=in_process, dask_worker_s=per_call, dask_first_s=first,
                     ratio=per_call / in_process))  # fmt: skip
    save()


def early_study(n: int, slow_every: int, dense_solve: str = "auto"):
    """``n`` Brusselators (N = 4) measured at t = 1, 2; every ``slow_every``-th (0: none) at t = 35,
    70: ten times the steps, on the limit cycle."""
    problem = ds.examples.brusselator_2d(4).build(linear_solver=ds.linear.Dense(solve=dense_solve))
    u0 = np.asarray(problem.spec.y0)
    rng = np.random.default_rng(2)
    exps = [ds.Experiment(f"b{i}", np.array([35.0, 70.0]) if slow_every and i % slow_every == 0 else np.array([1.0, 2.0]),
                          np.ones((2, u0.size)), noise=Gaussian(0.1), y0=u0 * rng.uniform(0.9, 1.1))
            for i in range(n)]  # fmt: skip
    return ds.Study(problem, exps, [Parameter("A", 3.4, 1.0, 10.0), Parameter("alpha", 10.0, 1.0, 100.0)])


def part_early(n, rows, save, experiments_per_chunk=None, dense_solve="auto"):
    """Lock-step lanes: in study order every chunk holds slow lanes and runs as long as its slowest
    (``lane_mode="vmap"``); after ``lowered.balance()`` (experiments sorted by the steps of one
    evaluation, no recompilation) the slow ones share chunks of their own; regrouped as lanes finish
    (``"compact"``); on a CPU one after the other (``"map"``); and the default (``"auto"``, which
    chooses after its first evaluation). ``ratio``: per call over the all-short study's."""
    solver = SolverOptions(rtol=RTOL, atol=ATOL)
    on_cpu = jax.default_backend() == "cpu"
    cases = [("all short", 0, False, "auto"), ("a tenth 10x longer, lock-step", 10, False, "vmap"),
             ("a tenth 10x longer, lock-step, balance()", 10, True, "vmap"),
             ("a tenth 10x longer, regrouped", 10, False, "compact")]  # fmt: skip
    cases += [("a tenth 10x longer, one after the other", 10, False, "map")] if on_cpu else []
    cases += [("a tenth 10x longer, default", 10, False, "auto")]
    short = None
    for label, slow_every, balanced, lane_mode in cases:
        lowered = ds.lower(early_study(n, slow_every, dense_solve), solver=solver, lane_mode=lane_mode,
                           experiments_per_chunk=experiments_per_chunk)  # fmt: skip
        if balanced:
            lowered.balance()
        first, per_call = _timed(lambda: lowered.value_and_grad(lowered.problem.nominal))
        short = per_call if short is None else short
        steps = lowered.steps[list(lowered.experiment_indices)]
        ran = sorted(set(lowered.lane_modes.values()))
        rows.append(dict(study=label, experiments=n, lane_mode=lane_mode, ran_as="+".join(ran), per_call_s=per_call,
                         first_s=first, ratio=per_call / short, chunks=lowered.chunk_sizes["value_and_grad"],
                         steps_min=int(steps.min()), steps_max=int(steps.max()), steps_total=int(steps.sum())))  # fmt: skip
        _log(f"early: {label}: {per_call:.3f} s ({per_call / short:.2f}x the short study's; ran as {ran}, "
             f"chunks {rows[-1]['chunks']}, steps {steps.min()}-{steps.max()})")  # fmt: skip
        save()


BOEHM = "Boehm_JProteomeRes2014"
# The shared PEtab collection beside the checkout (as bench_fits.py reads it), else the tests' copy.
PETAB_DIRS = [Path(__file__).resolve().parents[2] / "shared" / "petab", Path("/work/shared/petab"),
              Path(__file__).resolve().parents[1] / "tests" / "data" / "petab"]  # fmt: skip


def part_host(points, rows, save, dense_solve="auto"):
    """Boehm's value and value_and_grad (and the Jacobian at ``points`` points at once) with
    ``device="auto"`` and ``device="default"``, each row naming where its programs ran."""
    import warnings

    path = next(d / BOEHM for d in PETAB_DIRS if (d / BOEHM).is_dir())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ds.petab.PetabWarning)  # the collection's extra columns
        problem = ds.petab.load(path / f"{BOEHM}.yaml")
    for device in ("auto", "default"):
        lowered = problem.lower(device=device)
        theta = np.asarray(lowered.nominal)
        thetas = theta + 1e-3 * np.random.default_rng(0).standard_normal((points, theta.size))
        calls = {"value": lambda: lowered.value(theta), "value_and_grad": lambda: lowered.value_and_grad(theta),
                 f"residuals_and_jacobians ({points} points)": lambda: lowered.residuals_and_jacobians(thetas)}
        for mode, fn in calls.items():
            first, per_call = _timed(fn, repeats=5, budget_s=20.0)
            ran_on = lowered.devices_used.get("jacobian (points)" if "points" in mode else mode)
            rows.append(dict(model=BOEHM, device_option=device, mode=mode, ran_on=ran_on, first_s=first,
                             per_call_s=per_call, value=float(lowered.value(theta))))  # fmt: skip
            _log(f"host: device={device} {mode} on {ran_on}: first {first:.2f} s, per call {per_call * 1e3:.1f} ms")
            save()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", nargs="+", default=["network"],
                        choices=["network", "sweep", "brusselator", "diffrax", "dask", "early", "host"])  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="small sizes (a CPU smoke run)")
    parser.add_argument("--sizes", nargs="+", type=int, help="network sizes (default 1000 10000 100000)")
    parser.add_argument("--modes", nargs="+", choices=MODES, help="modes of the network part (default: all three)")
    parser.add_argument("--out", help="JSON output path (default benchmarks/results/bench_gpu_study_<parts>.json)")
    parser.add_argument("--grids", nargs="+", type=int, help="Brusselator grids (default 8 16)")
    parser.add_argument("--diffrax-sizes", nargs="+", type=int, help="diffrax rows of the sweep (default 1000 10000)")
    parser.add_argument("--early-size", type=int, help="experiments of the early part (default 10000; --quick 40)")
    parser.add_argument("--experiments-per-chunk", "--chunk-size", type=int, dest="experiments_per_chunk",
                        help="experiments per chunk of the early part (default: ds.lower's choice)")  # fmt: skip
    parser.add_argument("--dense-solve", nargs="+", choices=DENSE_SOLVES, default=["auto"],
                        help="Dense(solve=...) of the Dense studies; several run every part once per value "
                             "(auto: the inverse on a GPU, the LU on a CPU)")  # fmt: skip
    args = parser.parse_args()
    q = args.quick
    payload = {"machine": machine_info(), "device": str(jax.devices()[0].device_kind), "rtol": RTOL, "atol": ATOL}
    out = Path(args.out) if args.out else RESULTS / f"bench_gpu_study_{'_'.join(args.part)}{'_quick' if q else ''}.json"
    # Peers that do not use Dense (diffrax, cuDSS) run with the first --dense-solve value only.
    diffrax_sizes = args.diffrax_sizes or ([20] if q else [1000, 10000])
    runs = {
        "network": lambda first, *a, **kw: part_network(args.sizes or ([20, 50] if q else [1000, 10000, 100000]),
                                                        tuple(args.modes or MODES), *a, **kw),
        "sweep": lambda first, *a, **kw: part_sweep(40 if q else 10000, [10, 40] if q else [1000, 2500, 10000],
                                                    [20] if q else [1000, 10000], diffrax_sizes if first else [],
                                                    *a, **kw),  # fmt: skip
        "brusselator": lambda first, *a, **kw: part_brusselator(4 if q else 1000, args.grids or ([4] if q else [8, 16]),
                                                                *a, with_cudss=first, **kw),  # fmt: skip
        "diffrax": lambda first, *a, **kw: part_diffrax(diffrax_sizes if first else [], *a),
        "dask": lambda first, *a, **kw: part_dask(20 if q else 10000, *a, **kw),
        "early": lambda first, *a, **kw: part_early(args.early_size or (40 if q else 10000), *a,
                                                    experiments_per_chunk=args.experiments_per_chunk, **kw),
        "host": lambda first, *a, **kw: part_host(8 if q else 1000, *a, **kw) if first else None,
    }
    payload["dense_solve"] = list(args.dense_solve)
    for k, dense_solve in enumerate(args.dense_solve):
        for part in args.part:
            # Rows are written as they come: a device call cut short keeps what it measured.
            rows = payload.setdefault(part, [])
            start = len(rows)
            runs[part](k == 0, rows, lambda: write_json(out, payload), dense_solve=dense_solve)
            for r in rows[start:]:
                if r.get("linear_solver", "Dense") == "Dense" and "diffrax" not in str(r.get("what", "")):
                    r["dense_solve"] = dense_solve
            write_json(out, payload)
    _print_tables(payload)
    print(f"wrote {out}")


def _print_tables(payload):
    for r in payload.get("network", []):
        print(f"network {r.get('dense_solve', ''):<7} {r['experiments']:>7} {r['mode']:<24} first {fmt(r['first_s'])} s"
              f"  per call {fmt(r['per_call_s'])} s  chunks {r['chunk']}"
              + (f"  {r['flop_rate'] / 1e9:.1f} GFLOP/s" if 'flop_rate' in r else ""))  # fmt: skip
    for r in payload.get("sweep", []):
        print(f"sweep {r['what']:<34} {r.get('dense_solve', ''):<7} {r['experiments']:>6} {r['mode']:<15} "
              f"chunk {str(r.get('chunk_size', '')):<8} per call {fmt(r['per_call_s'])} s")  # fmt: skip
    for r in payload.get("brusselator", []):
        print(f"brusselator N={r['grid']} {r['linear_solver']:<6} {r.get('dense_solve', ''):<7} " + (
            f"{r['mode']:<24} first {fmt(r['first_s'])} s  per call {fmt(r['per_call_s'])} s" if "mode" in r
            else f"FAILED {r['error'][:200]}"))  # fmt: skip
    for r in payload.get("dask", []):
        print(f"dask {r['experiments']}: in-process {fmt(r['in_process_s'])} s, one worker {fmt(r['dask_worker_s'])} s "
              f"(x{r['ratio']:.2f})")  # fmt: skip
    for r in payload.get("host", []):
        print(f"host {r['device_option']:<8} {r['mode']:<38} on {r['ran_on']:<12} per call {fmt(r['per_call_s'])} s "
              f"(first {fmt(r['first_s'])} s)")  # fmt: skip
    for r in payload.get("early", []):
        ratio = f" (x{r['ratio']:.2f} the short study's)" if "ratio" in r else ""
        print(f"early {r.get('dense_solve', ''):<7} {r['study']:<42} per call {fmt(r['per_call_s'])} s{ratio} "
              f"ran as {r.get('ran_as', '?')} chunks {r['chunks']} steps {r['steps_min']}-{r['steps_max']}")


if __name__ == "__main__":
    main()
