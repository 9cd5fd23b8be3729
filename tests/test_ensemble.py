"""Ensembles as Dask arrays (ds.distributed.ensemble), their Zarr stores, the samplers and Sobol' indices.

Checked against independent facts: each row of an ensemble against its own ``ds.simulate`` call
(1e-12), a study ensemble against the closed form of its model, the Ishigami function's analytic
Sobol' indices (within the estimators' sampling error), scipy's own Sobol' sequence and the Latin
hypercube's defining property, and a killed writer's store against a fresh computation.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffsoup as ds
from diffsoup.distributed import _ensemble

ROOT = Path(__file__).resolve().parents[1]
TIMES = np.linspace(0.0, 4.0, 5)


@pytest.fixture(scope="module")
def network():
    net = ds.examples.mass_action_network(6, 8, seed=2)
    problem = net.to_spec(y0=np.linspace(1.0, 2.0, 6)).build()
    base = np.array(list(net.parameters.values()))
    params = base * 10 ** np.random.default_rng(7).uniform(-0.5, 0.5, (22, base.size))
    y0s = np.random.default_rng(8).uniform(0.5, 2.0, (22, 6))
    return problem, params, y0s


def _one_by_one(problem, params, y0s=None, observables=None, **options):
    """Each row by its own ds.simulate call (the reference)."""
    out, status = [], []
    for i in range(params.shape[0]):
        sol = ds.simulate(problem, None if y0s is None else y0s[i], TIMES, params[i], throw=False, **options)
        ys = np.asarray(sol.ys)
        if observables is not None:
            p = problem.params_dict(jnp.asarray(params[i]))
            ys = np.stack([np.asarray(observables(t, y, p)) for t, y in zip(TIMES, ys)])
        out.append(ys)
        status.append(int(sol.status))
    return np.stack(out), np.array(status)


def test_a_problem_ensemble_equals_simulate_row_by_row_for_numpy_and_dask_inputs(network):
    import dask.array as da

    problem, params, y0s = network
    ref, ref_status = _one_by_one(problem, params, rtol=1e-8, atol=1e-10)
    ens = ds.distributed.ensemble(problem, params=params, t_eval=TIMES, draws_per_chunk=8, rtol=1e-8, atol=1e-10)
    assert ens.shape == ens.values.shape == (22, 5, 6) and ens.status.shape == (22,)
    assert ens.values.chunks[0] == (8, 8, 6) and ens.dims == ("experiment", "time", "output")
    lazy_values, lazy_status = ens  # unpacks as the two lazy arrays
    assert lazy_values.shape == (22, 5, 6) and lazy_status.dtype == np.int32
    values, status = ens.compute(scheduler="sync")
    np.testing.assert_allclose(values, ref, rtol=1e-12, atol=1e-12)
    assert status.dtype == np.int32 and np.array_equal(status, ref_status) and np.all(status == 0)

    # Dask inputs (other chunks than the ensemble's), a y0 per row, observables(t, y, p).
    def observed(t, y, p):
        return jnp.stack([y[0] + y[1], p["k0"] * y[2] * jnp.exp(-t)])

    ref, _ = _one_by_one(problem, params, y0s, observed, rtol=1e-8, atol=1e-10)
    ens = ds.distributed.ensemble(problem, params=da.from_array(params, chunks=(5, 4)), y0=da.from_array(y0s, chunks=7),
                                  t_eval=TIMES, observables=observed, output_names=("AB", "scaled"), draws_per_chunk=8,
                                  rtol=1e-8, atol=1e-10)  # fmt: skip
    values, status = ens.compute()
    np.testing.assert_allclose(values, ref, rtol=1e-12, atol=1e-12)
    assert ens.coords["output"][1].tolist() == ["AB", "scaled"]
    np.testing.assert_array_equal(ens.params.compute(), params)


def test_named_parameter_columns_keep_the_other_defaults(network):
    problem, params, _ = network
    names = ("k3", "k1")
    ens = ds.distributed.ensemble(problem, params={"k3": params[:6, 3], "k1": params[:6, 1]}, t_eval=TIMES,
                                  y0=np.ones(6))  # fmt: skip
    assert ens.parameter_names == names
    full = np.repeat(np.asarray(problem.parameter_vector(None))[None], 6, axis=0)
    full[:, [3, 1]] = params[:6, [3, 1]]
    ref, _ = _one_by_one(problem, full, np.ones((6, 6)))
    np.testing.assert_allclose(ens.compute()[0], ref, rtol=1e-12, atol=1e-12)


def test_the_chunk_size_setting_sets_the_chunks(network):
    import dask

    problem, params, _ = network
    with dask.config.set({"diffsoup.ensemble.chunk-size": 10}):
        ens = ds.distributed.ensemble(problem, params=params, t_eval=TIMES)
        draws = ds.distributed.sample(_box(), 32, seed=0)
    assert ens.values.chunks[0] == (10, 10, 2) and draws.chunks[0] == (10, 10, 10, 2)
    assert ds.distributed.ensemble(problem, params=params, t_eval=TIMES).draws_per_chunk == 1024  # shipped default
    study = _decay_study()
    with dask.config.set({"diffsoup.ensemble.chunk-size": 9}):  # a study's chunks: that many simulations' worth
        assert ds.distributed.ensemble(study, params=np.ones((5, 1))).draws_per_chunk == 4


def test_bad_input_names_the_field(network):
    problem, params, _ = network
    with pytest.raises(ValueError, match="give t_eval"):
        ds.distributed.ensemble(problem, params=params)
    with pytest.raises(ValueError, match="params has 8 columns; expected 2"):
        ds.distributed.ensemble(problem, params=params, parameter_names=("k0", "k1"), t_eval=TIMES)
    with pytest.raises(ValueError, match=r"unknown parameter name\(s\) \['nope'\]"):
        ds.distributed.ensemble(problem, params=params[:, :1], parameter_names=("nope",), t_eval=TIMES)
    with pytest.raises(TypeError, match=r"unknown ds.simulate option\(s\) \['rtoll'\]"):
        ds.distributed.ensemble(problem, params=params, t_eval=TIMES, rtoll=1e-3)
    with pytest.raises(ValueError, match="draws_per_chunk=0 must be a positive integer"):
        ds.distributed.ensemble(problem, params=params, t_eval=TIMES, draws_per_chunk=0)
    with pytest.raises(TypeError, match="built ds.Problem"):
        ds.distributed.ensemble(problem.spec, params=params, t_eval=TIMES)


def test_chunk_size_is_the_deprecated_name_of_draws_per_chunk_and_rows_per_chunk(network):
    """``chunk_size=`` of ensemble and sample (now ``draws_per_chunk=``) and of saltelli (now
    ``rows_per_chunk=``), and the ``chunk_size`` attributes, warn naming the new name and give the
    same chunks and numbers; both names at once are refused."""
    problem, params, _ = network
    new = ds.distributed.ensemble(problem, params=params[:6], t_eval=TIMES, draws_per_chunk=4)
    with pytest.warns(DeprecationWarning, match="ensemble: chunk_size= is deprecated; give draws_per_chunk="):
        old = ds.distributed.ensemble(problem, params=params[:6], t_eval=TIMES, chunk_size=4)
    assert old.values.chunks == new.values.chunks and old.layout.fingerprint == new.layout.fingerprint
    np.testing.assert_array_equal(old.compute()[0], new.compute()[0])
    with pytest.warns(DeprecationWarning, match="Ensemble.chunk_size is deprecated; read Ensemble.draws_per_chunk"):
        assert old.chunk_size == new.draws_per_chunk == 4
    with pytest.raises(TypeError, match="give draws_per_chunk= only"):
        ds.distributed.ensemble(problem, params=params, t_eval=TIMES, draws_per_chunk=4, chunk_size=4)

    with pytest.warns(DeprecationWarning, match="sample: chunk_size= is deprecated; give draws_per_chunk="):
        old = ds.distributed.sample(_box(), 16, seed=2, chunk_size=5)
    new = ds.distributed.sample(_box(), 16, seed=2, draws_per_chunk=5)
    assert old.chunks == new.chunks == ((5, 5, 5, 1), (3,)) and old.name == new.name
    np.testing.assert_array_equal(old.compute(), new.compute())

    with pytest.warns(DeprecationWarning, match="saltelli: chunk_size= is deprecated; give rows_per_chunk="):
        old = ds.distributed.saltelli(_box(), 8, seed=2, chunk_size=12)
    new = ds.distributed.saltelli(_box(), 8, seed=2, rows_per_chunk=12)
    assert old.rows_per_chunk == new.rows_per_chunk == 10  # whole draws of d + 2 = 5 rows
    np.testing.assert_array_equal(old.params.compute(), new.params.compute())
    with pytest.warns(DeprecationWarning, match="SaltelliDesign.chunk_size is deprecated"):
        assert old.chunk_size == 10


def test_a_dask_input_larger_than_a_chunk_stays_lazy_until_computed(network):
    import dask.array as da

    problem, params, _ = network
    evaluated = []

    def rows(block, block_info=None):
        evaluated.append(block_info[None]["chunk-location"][0])
        return block

    lazy = da.from_array(params, chunks=(4, 8)).map_blocks(rows, dtype=np.float64)
    ens = ds.distributed.ensemble(problem, params=lazy, t_eval=TIMES, draws_per_chunk=4)
    values, status = ens.values, ens.status
    assert ens.values.numblocks[0] == 6 and evaluated == []
    program = _ensemble._PROGRAMS[next(reversed(_ensemble._PROGRAMS))]
    assert program._jitted is None  # nothing compiled, nothing solved
    first = values[:4].compute(scheduler="sync")  # one chunk computes one chunk's input
    assert sorted(evaluated) == [0] and first.shape == (4, 5, 6)
    evaluated.clear()
    import dask

    dask.compute(values, status, scheduler="sync")
    assert sorted(evaluated) == list(range(6))


def _blow_up_problem():
    # dy/dt = k y^2 from y(0) = 1 blows up at t = 1/k: rows with k > 1/4 fail before t = 4.
    spec = ds.ProblemSpec(lambda t, y, p: p["k"] * y * y, states=["y"], parameters={"k": 0.1}, y0=np.ones(1),
                          name="blow_up")  # fmt: skip
    return spec.build()


def test_failures_are_status_values_not_failed_chunks():
    problem = _blow_up_problem()
    k = np.array([[0.05], [0.1], [0.5], [0.2], [2.0], [0.01]])
    ens = ds.distributed.ensemble(problem, params=k, t_eval=TIMES, draws_per_chunk=4)
    values, status = ens.compute(scheduler="sync")
    _, ref_status = _one_by_one(problem, k)
    assert np.array_equal(status, ref_status)
    failed = k[:, 0] > 0.25
    assert np.all(status[failed] != 0) and np.all(status[~failed] == 0)
    assert np.all(np.isnan(values[failed, -1])) and np.all(np.isfinite(values[~failed]))
    np.testing.assert_allclose(values[~failed, :, 0], 1.0 / (1.0 - k[~failed] * TIMES[None, :]), rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# Zarr stores
# ------------------------------------------------------------------------------------------------


def test_to_zarr_writes_a_store_xarray_reads_labelled(network, tmp_path):
    import xarray as xr
    import zarr

    problem = _blow_up_problem()
    k = np.array([[0.05], [0.1], [0.5], [0.2], [2.0], [0.01], [0.03]])
    ens = ds.distributed.ensemble(problem, params=k, t_eval=TIMES, draws_per_chunk=3)
    values, status = ens.compute(scheduler="sync")
    seen = []
    written = ens.to_zarr(tmp_path / "e.zarr", progress=lambda done, total: seen.append((done, total)))
    assert (written.run, written.chunks, written.written, written.complete) == (1, 3, 3, True)
    assert written.status["SUCCESS"] == 5 and sum(written.status.values()) == 7 and seen[-1] == (3, 3)
    x = xr.open_zarr(tmp_path / "e.zarr")
    assert x["outputs"].dims == ("experiment", "time", "output") and x["status"].dims == ("experiment",)
    np.testing.assert_array_equal(x["time"].values, TIMES)
    assert x["output"].values.tolist() == ["y"] and x["parameter"].values.tolist() == ["k"]
    np.testing.assert_array_equal(x["outputs"].values, values)
    np.testing.assert_array_equal(x["status"].values, status)
    np.testing.assert_array_equal(x["parameters"].sel(parameter="k").values, k[:, 0])
    meanings = dict(zip(x["status"].attrs["flag_values"], x["status"].attrs["flag_meanings"].split()))
    assert meanings[0] == "SUCCESS" and meanings[-1] == "NOT_WRITTEN"
    assert {meanings[int(s)] for s in status[status != 0]} <= {s.name for s in ds.integrate.Status}
    assert x.attrs["format"] == "diffsoup.ensemble/1" and x.attrs["complete"] is True
    root = zarr.open_group(str(tmp_path / "e.zarr"), mode="r")  # plain zarr too
    assert root["chunk_run"][:].tolist() == [1, 1, 1]
    # A second write finds nothing to do; another ensemble at the same path is refused.
    again = ens.to_zarr(tmp_path / "e.zarr")
    assert (again.run, again.written, again.complete) == (0, 0, True)
    other = ds.distributed.ensemble(problem, params=k[:6], t_eval=TIMES, draws_per_chunk=3)
    with pytest.raises(ValueError, match="holds another ensemble"):
        other.to_zarr(tmp_path / "e.zarr")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        ens.to_zarr(tmp_path / "e.zarr", resume=False)
    assert other.to_zarr(tmp_path / "e.zarr", overwrite=True).written == 2


@pytest.mark.slow
def test_a_killed_writer_resumes_and_every_chunk_is_written_once(tmp_path):
    import zarr

    from ensemble_writer_script import build_ensemble

    store = tmp_path / "killed.zarr"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "ensemble_writer_script.py"), str(store),
                             "--delay", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        done = 0
        while time.monotonic() < deadline and proc.poll() is None:
            if (store / "chunk_run").exists():
                try:
                    done = int(np.count_nonzero(zarr.open_array(str(store / "chunk_run"), mode="r")[:]))
                except Exception:  # noqa: BLE001 (metadata being written)
                    done = 0
                if done >= 2:
                    break
            time.sleep(0.05)
        assert proc.poll() is None, f"the writer ended before it could be killed:\n{proc.stdout.read()}"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    before = zarr.open_array(str(store / "chunk_run"), mode="r")[:]
    n_before = int(np.count_nonzero(before))
    assert 2 <= n_before < 10 and set(np.unique(before)) <= {0, 1}
    ens = build_ensemble()
    written = ens.to_zarr(store)
    assert (written.run, written.written, written.complete) == (2, 10 - n_before, True)
    after = zarr.open_array(str(store / "chunk_run"), mode="r")[:]
    # Each chunk written once: the first run's chunks were not computed again.
    assert np.array_equal(after[before == 1], before[before == 1]) and np.all(after[before == 0] == 2)
    root = zarr.open_group(str(store), mode="r")
    runs = root.attrs["runs"]
    assert [r["run"] for r in runs] == [1, 2] and runs[0]["finished"] is None and runs[1]["chunks_written"] == 10 - n_before
    values, status = ens.compute()
    np.testing.assert_array_equal(root["outputs"][:], values)
    np.testing.assert_array_equal(root["status"][:], status)


# ------------------------------------------------------------------------------------------------
# Execution on a cluster: resources, one program per worker
# ------------------------------------------------------------------------------------------------


def test_chunks_run_on_workers_offering_the_gpu_resource_and_compile_once(network, monkeypatch, tmp_path):
    from distributed import Client, Scheduler, SpecCluster, Worker, get_task_stream

    problem, params, _ = network
    builds = []
    original = _ensemble._ProblemChunk._build
    monkeypatch.setattr(_ensemble._ProblemChunk, "_build", lambda self: builds.append(1) or original(self))
    workers = {"gpu": {"cls": Worker, "options": {"nthreads": 1, "resources": {"GPU": 1}}},
               "cpu": {"cls": Worker, "options": {"nthreads": 1}}}  # fmt: skip
    cluster = SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {"dashboard_address": ":0"}},
                          asynchronous=False)  # fmt: skip
    try:
        with Client(cluster, set_as_default=False) as client:
            names = {info["name"]: addr for addr, info in client.scheduler_info(n_workers=-1)["workers"].items()}
            assert _ensemble.ensemble_resources(None, client) == {"GPU": 1}
            ens = ds.distributed.ensemble(problem, params=params, t_eval=TIMES, draws_per_chunk=4, client=client)
            with get_task_stream(client) as stream:
                values, status = ens.compute(client=client)
            solved = {t["worker"] for t in stream.data if "diffsoup-ensemble" in str(t["key"])}
            assert solved == {names["gpu"]}
            with get_task_stream(client) as stream:  # the annotation, where the graph is not fused
                client.compute([ens.values, ens.status], optimize_graph=False, sync=True)
            assert {t["worker"] for t in stream.data if "diffsoup-ensemble" in str(t["key"])} == {names["gpu"]}
            with get_task_stream(client) as stream:
                written = ens.to_zarr(tmp_path / "pinned.zarr", client=client)
            assert written.complete
            assert {t["worker"] for t in stream.data if "diffsoup-ensemble" in str(t["key"])} == {names["gpu"]}
            assert len(builds) == 1  # six chunks, three computations: one program in the worker process
            np.testing.assert_allclose(values, _one_by_one(problem, params)[0], rtol=1e-12, atol=1e-12)
            # Without a worker offering it, nothing is pinned (CPU clusters); {} never pins.
            assert _ensemble.ensemble_resources(None, None) == {}
            assert _ensemble.ensemble_resources({}, client) == {}
            import dask

            with dask.config.set({"diffsoup.ensemble.resources": {"TPU": 1}}):
                assert _ensemble.ensemble_resources(None, client) == {}
    finally:
        cluster.close()


def test_writes_run_beside_the_next_solve_while_solves_take_turns_on_the_gpu(network, monkeypatch, tmp_path):
    """A GPU worker's two threads: the solve tasks ask for the GPU and never overlap; the Zarr
    writes ask for nothing and overlap solves, so the write costs no solve time."""
    from distributed import Client, Scheduler, SpecCluster, Worker, get_task_stream

    from diffsoup.store._ensemble_store import ChunkWriter

    problem, params, _ = network
    pause = 0.4  # each solve and each write made this long (the workers run in this process)
    solve, write = _ensemble._ProblemChunk.__call__, ChunkWriter.__setitem__
    monkeypatch.setattr(_ensemble._ProblemChunk, "__call__", lambda self, *b: time.sleep(pause) or solve(self, *b))
    monkeypatch.setattr(ChunkWriter, "__setitem__", lambda self, k, v: time.sleep(pause) or write(self, k, v))
    threads = ds.distributed.worker_threads({"GPU": 1})
    assert threads == 2 and ds.distributed.worker_threads({}) == 1
    workers = {"gpu": {"cls": Worker, "options": {"nthreads": threads, "resources": {"GPU": 1}}}}
    cluster = SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {"dashboard_address": ":0"}},
                          asynchronous=False)  # fmt: skip
    try:
        with Client(cluster, set_as_default=False) as client:
            ens = ds.distributed.ensemble(problem, params=params, t_eval=TIMES, draws_per_chunk=4, client=client)
            assert ens.resources == {"GPU": 1}
            with get_task_stream(client) as stream:
                written = ens.to_zarr(tmp_path / "overlap.zarr", client=client)
    finally:
        cluster.close()
    assert written.complete and written.chunks == 6

    def spans(prefix):
        return sorted((s["start"], s["stop"]) for t in stream.data if str(t["key"]).startswith(f"('{prefix}")
                      for s in t["startstops"] if s["action"] == "compute")  # fmt: skip

    solves, writes = spans("diffsoup-ensemble"), spans("store-map")
    assert len(solves) == len(writes) == 6
    # One solve at a time (the worker records a task's stop a few ms after releasing its resource).
    assert all(b[0] >= a[1] - 0.1 for a, b in zip(solves, solves[1:])), (solves, writes)
    overlapping = [w for w in writes if any(s[0] < w[1] - 0.1 and w[0] < s[1] - 0.1 for s in solves)]
    assert len(overlapping) >= 3, (solves, writes)
    import zarr

    x = zarr.open_group(str(tmp_path / "overlap.zarr"), mode="r")
    np.testing.assert_allclose(x["outputs"][:], _one_by_one(problem, params)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_to_zarr_on_the_embedded_cluster_of_worker_processes(network, tmp_path):
    import xarray as xr

    problem, params, _ = network
    with ds.distributed.cluster_client(n_workers=2) as (client, _dashboard):
        ens = ds.distributed.ensemble(problem, params=params, t_eval=TIMES, draws_per_chunk=4, client=client)
        written = ens.to_zarr(tmp_path / "c.zarr", client=client)
    assert (written.chunks, written.written, written.complete) == (6, 6, True)
    x = xr.open_zarr(tmp_path / "c.zarr")
    np.testing.assert_allclose(x["outputs"].values, _one_by_one(problem, params)[0], rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# Samplers and Sobol' indices
# ------------------------------------------------------------------------------------------------


def _box():
    P = ds.inference.Parameter
    return [P("a", lower=0.1, upper=10.0, scale="log10"), P("b", lower=-1.0, upper=3.0, scale="lin"),
            P("c", lower=1.0, upper=math.e**2, scale="log")]  # fmt: skip


def test_latin_hypercube_draws_one_point_per_stratum_on_each_scale():
    box = ds.inference.ParameterBox.of(_box())
    n = 37
    x = ds.inference.latin_hypercube(_box(), n, seed=3)
    unit = np.column_stack([np.log10(x[:, 0] / 0.1) / 2, (x[:, 1] + 1) / 4, np.log(x[:, 2]) / 2])
    np.testing.assert_allclose(box.unit(x), unit, rtol=1e-12, atol=1e-15)
    for column in unit.T:  # exactly one draw in each of the n strata
        assert sorted(np.floor(column * n).astype(int)) == list(range(n))
    lazy = ds.distributed.sample(_box(), n, method="lhs", seed=3, draws_per_chunk=10)
    assert lazy.chunks[0] == (10, 10, 10, 7)
    np.testing.assert_array_equal(lazy.compute(), x)
    assert not np.array_equal(ds.inference.latin_hypercube(_box(), n, seed=4), x)


def test_sobol_draws_are_scipys_sequence_in_any_chunking():
    from scipy.stats import qmc

    box = ds.inference.ParameterBox.of(_box())
    unit = qmc.Sobol(3, scramble=True, rng=np.random.default_rng(5)).random(64)
    expected = box.values(unit)
    np.testing.assert_allclose(ds.inference.sobol(_box(), 64, seed=5), expected, rtol=1e-13)
    lazy = ds.distributed.sample(_box(), 64, method="sobol", seed=5, draws_per_chunk=24)
    assert lazy.chunks[0] == (24, 24, 16)
    np.testing.assert_allclose(lazy.compute(), expected, rtol=1e-13)
    again = ds.distributed.sample(_box(), 64, method="sobol", seed=5, draws_per_chunk=24)
    assert again.name == lazy.name  # the same draws are the same array (a rerun resumes its store)
    with pytest.raises(ValueError, match="n=100 is not. Give n=64 or n=128"):
        ds.distributed.sample(_box(), 100, method="sobol")
    with pytest.raises(ValueError, match="bounds"):
        ds.inference.ParameterBox(("x",), (1.0,), (1.0,), ("lin",))


def _ishigami_problem():
    """The Ishigami function as a trivial ODE: dy/dt = f(x) from y(0) = 0, so y(1) = f(x)."""

    def rhs(t, y, p):
        f = jnp.sin(p["x1"]) + 7.0 * jnp.sin(p["x2"]) ** 2 + 0.1 * p["x3"] ** 4 * jnp.sin(p["x1"])
        return jnp.zeros_like(y) + f

    spec = ds.ProblemSpec(rhs, states=["y"], parameters={"x1": 0.0, "x2": 0.0, "x3": 0.0}, y0=np.zeros(1),
                          name="ishigami")  # fmt: skip
    return spec.build()


def test_sobol_indices_of_the_ishigami_function_within_sampling_error():
    import dask

    P = ds.inference.Parameter
    box = [P(f"x{i}", lower=-math.pi, upper=math.pi, scale="lin") for i in (1, 2, 3)]
    design = ds.distributed.saltelli(box, 2**12, seed=11, rows_per_chunk=1000)
    assert design.rows_per_chunk % 5 == 0 and design.params.shape == (5 * 2**12, 3)
    ens = ds.distributed.ensemble(_ishigami_problem(), params=design.params, parameter_names=design.names,
                                  t_eval=[1.0], draws_per_chunk=1024)  # fmt: skip (not whole draws: rechunked)
    with dask.config.set(scheduler="sync"):
        s = ds.distributed.sobol_indices(ens, design).compute()
    a, b = 7.0, 0.1
    v1 = 0.5 * (1 + b * math.pi**4 / 5) ** 2
    v2 = a**2 / 8
    v13 = b**2 * math.pi**8 * (1 / 18 - 1 / 50)
    var = v1 + v2 + v13
    first = np.array([v1, v2, 0.0]) / var
    total = np.array([v1 + v13, v2, v13]) / var
    assert s.names == ("x1", "x2", "x3") and s.first.shape == (3, 1, 1) and s.draws == 2**12
    np.testing.assert_allclose(s.variance[0, 0], var, rtol=0.05)
    for got, err, want in ((s.first, s.first_error, first), (s.total, s.total_error, total)):
        got, err = got[:, 0, 0], err[:, 0, 0]
        assert np.all(err < 0.03)  # the estimators' own spread at n = 4096
        assert np.all(np.abs(got - want) < 4 * err + 1e-3), (got, want, err)


# ------------------------------------------------------------------------------------------------
# Studies
# ------------------------------------------------------------------------------------------------


def _decay_study():
    spec = ds.ProblemSpec(lambda t, y, p: -p["k"] * y, states=["A", "B"], parameters={"k": 1.0, "g": 2.0},
                          y0=np.array([1.0, 2.0]), name="decay")  # fmt: skip
    P = ds.inference.Parameter
    params = [P("k", lower=0.1, upper=2.0, scale="log10"), P("g", 2.0, lower=1.0, upper=3.0, estimate=False)]

    def scaled(y, p):
        return jnp.stack([p["g"] * y[0]])

    experiments = [
        ds.Experiment("e1", [0.5, 1.0, 2.0], np.ones((3, 2))),
        ds.Experiment("e2", [1.0, 3.0], np.ones((2, 1)), observables=scaled, y0={"A": 3.0}),
    ]
    return ds.Study(spec, experiments, params)


def test_a_study_ensemble_gives_each_experiments_observables_at_each_draw(tmp_path):
    import xarray as xr

    study = _decay_study()
    draws = ds.distributed.sample(study, 6, method="lhs", seed=1, draws_per_chunk=4)
    ens = ds.distributed.ensemble(study, params=draws, draws_per_chunk=4,
                                  solver=ds.inference.SolverOptions(rtol=1e-10, atol=1e-12))  # fmt: skip
    assert ens.parameter_names == ("k",) and ens.dims == ("draw", "experiment", "time_index", "observable")
    values, status = ens.compute()
    assert values.shape == (6, 2, 3, 2) and status.shape == (6, 2) and np.all(status == 0)
    k = draws.compute()[:, 0]
    t1, t2 = np.array([0.5, 1.0, 2.0]), np.array([1.0, 3.0])
    decay1 = np.exp(-k[:, None] * t1[None, :])
    np.testing.assert_allclose(values[:, 0, :, 0], decay1, rtol=1e-7)
    np.testing.assert_allclose(values[:, 0, :, 1], 2 * decay1, rtol=1e-7)
    np.testing.assert_allclose(values[:, 1, :2, 0], 2.0 * 3.0 * np.exp(-k[:, None] * t2[None, :]), rtol=1e-7)
    assert np.all(np.isnan(values[:, 1, 2])) and np.all(np.isnan(values[:, 1, :, 1]))  # padding
    ens.to_zarr(tmp_path / "s.zarr")
    x = xr.open_zarr(tmp_path / "s.zarr")
    assert x["experiment"].values.tolist() == ["e1", "e2"] and "time" in x.coords
    np.testing.assert_array_equal(x["time"].values[1], [1.0, 3.0, np.nan])
    np.testing.assert_array_equal(x["observables"].values, values)


def test_simulate_samples_writes_a_resumable_ensemble_of_a_study_file(tmp_path):
    import json

    import xarray as xr

    from diffsoup._demo_study import write_demo_study
    from diffsoup.workflows import simulate_samples

    path = write_demo_study(tmp_path / "study", n_experiments=2)
    lines = []
    summary = simulate_samples(path, tmp_path / "out", samples=4, seed=2, draws_per_chunk=2, progress=False,
                               log=lines.append)  # fmt: skip
    assert summary["chunks"] == 2 and summary["chunks_written"] == 2 and summary["complete"]
    assert summary["simulation_status"] == {"SUCCESS": 8} and summary["results"] == "simulation.zarr"
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["samples"] == 4
    x = xr.open_zarr(tmp_path / "out" / "simulation.zarr")
    assert x["observables"].shape == (4, 2, x.sizes["time_index"], 3)
    assert x["observable"].values.tolist() == ["S", "P", "bound"]
    again = simulate_samples(path, tmp_path / "out", samples=4, seed=2, draws_per_chunk=2, progress=False,
                             log=lines.append)  # fmt: skip
    assert again["chunks_written"] == 0 and again["chunks_resumed"] == 2
    # chunk_size= (the deprecated name) warns and means the same chunks: the store resumes whole.
    with pytest.warns(DeprecationWarning, match="chunk_size= is deprecated; give draws_per_chunk="):
        old = simulate_samples(path, tmp_path / "out", samples=4, seed=2, chunk_size=2, progress=False,
                               log=lines.append)  # fmt: skip
    assert old["chunks_written"] == 0 and old["chunks_resumed"] == 2
