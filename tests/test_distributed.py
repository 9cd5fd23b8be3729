"""ds.distributed: the runtime API in one process, ``run`` over a Dask LocalCluster of 3 CPU workers
carrying the GPU resource (the same fit as in-process to 1e-10; every evaluation mode equal to the
local study's; a worker killed mid-fit changes nothing; the scheduler's diffsoup route answers with
per-experiment states), run's execution options apart from its lowering options (an unknown keyword
named, the diffsoup Dask config read for options left None and obeyed), a worker asked to use CUDA
on a machine without a GPU fails at start, and checkpointed_map(execution="processes") in one
process. The multi-process behaviour is in test_launch.py."""

import json
import os
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import diffsoup as ds
from diffsoup import distributed as dd
from diffsoup.distributed import _lowered_cache, _run, _runtime
from diffsoup.inference import fit
from diffsoup.inference.objective._abstract_lowered import AbstractLoweredStudy

sys.path.insert(0, os.path.dirname(__file__))
from test_study import tiny_study  # noqa: E402

from conftest import has_gpu  # noqa: E402

ROOT = str(Path(__file__).resolve().parents[1])
START = np.log10([1.2, 0.45, 0.33])


# -- the runtime in one process ----------------------------------------------------------------


def test_configure_adds_only_what_is_unset():
    env = {"XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=false --xla_dump_to=/tmp/x",
           "XLA_CLIENT_MEM_FRACTION": "0.5", "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}  # fmt: skip
    _runtime._configure_env(env, gpu=True)
    assert env["XLA_FLAGS"] == "--xla_gpu_enable_latency_hiding_scheduler=false --xla_dump_to=/tmp/x"
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in env  # both fraction variables break the CUDA plugin
    env = {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    _runtime._configure_env(env, gpu=True)
    assert env["XLA_FLAGS"].split() == ["--xla_dump_to=/tmp/x", *_runtime.DEFAULT_XLA_GPU_FLAGS]
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" and env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.75"
    env = {}
    _runtime._configure_env(env, gpu=False)
    assert "XLA_FLAGS" not in env


def test_runtime_in_one_process(monkeypatch):
    import jax
    from jax.sharding import PartitionSpec as P

    for name in ("DIFFSOUP_LAUNCH_COORDINATOR", "DIFFSOUP_COORDINATOR", "SLURM_STEP_ID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="process_id"):
        dd.initialize(coordinator_address="127.0.0.1:1234", num_processes=2)
    with pytest.raises(ValueError, match="coordinator_address"):
        dd.initialize(num_processes=2, process_id=0)
    dd.initialize()  # nothing launched: does nothing
    assert not _runtime.is_initialized()
    assert dd.is_primary()
    mesh = ds.global_mesh(("data",))
    assert dd.owns(mesh)
    with pytest.raises(TypeError, match="Mesh"):
        dd.owns("mesh")
    assert dd.any_process(True) is True and dd.any_process(False) is False
    assert dd.any_process(jax.numpy.asarray(True)) is True
    with pytest.raises(ValueError, match="scalar"):
        dd.any_process(np.array([True, False]))
    x = dd.from_local_data(np.arange(6.0).reshape(3, 2), mesh, P("data"))
    assert isinstance(x, jax.Array) and x.shape == (3, 2)
    value = dd.local_value(x, dtype=np.float32)
    assert value.dtype == np.float32 and np.array_equal(value, np.arange(6.0).reshape(3, 2))
    assert np.array_equal(dd.local_value([1, 2]), [1, 2])
    with pytest.raises(TypeError, match="PartitionSpec"):
        dd.from_local_data(np.zeros(2), mesh, ("data",))
    assert np.array_equal(jax.random.key_data(dd.key(5)), jax.random.key_data(jax.random.key(5)))
    with pytest.raises(TypeError, match="integer"):
        dd.key(1.5)


def test_run_checks_its_arguments():
    with pytest.raises(TypeError, match="ds.Study"):
        with dd.run(object()):
            pass
    with pytest.raises(ValueError, match=r"processes=2.*1 process"):
        with dd.run(tiny_study(2), layout=ds.Layout(processes=2)):
            pass


def test_checkpointed_map_processes_in_one_process(tmp_path):
    import jax

    def task(item):
        group = dd.device_group()
        assert group is not None and list(group.devices.flat)[0] in jax.devices()
        return {"y": item["x"] ** 2}

    items = [{"task_id": f"t{i}", "x": i} for i in range(3)]
    ledger = tmp_path / "ledger.json"
    res = dd.checkpointed_map(task, items, ledger_path=ledger, execution="processes", progress=False)
    assert res.results == {"t0": {"y": 0}, "t1": {"y": 1}, "t2": {"y": 4}} and not res.failures
    assert dd.device_group() is None
    again = dd.checkpointed_map(task, items, ledger_path=ledger, execution="processes", progress=False)
    assert [r.attempts for r in again.records] == [1, 1, 1]  # resumed: nothing ran again
    with pytest.raises(ValueError, match="disjoint"):
        mesh = ds.global_mesh(("data",))
        dd.checkpointed_map(task, items, ledger_path=tmp_path / "x.json", execution="processes",
                            device_groups=[mesh, mesh])  # fmt: skip


# -- Dask ----------------------------------------------------------------------------------------


@pytest.mark.skipif(has_gpu(), reason="checks a machine without a GPU")
def test_worker_asked_for_cuda_without_gpu_fails_at_start(capfd):
    from distributed import LocalCluster

    with pytest.raises(RuntimeError):
        LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1", dashboard_address=None,
                     env={"JAX_PLATFORMS": "cuda", "PYTHONPATH": ROOT}, preload=["diffsoup.distributed._worker"])  # fmt: skip
    err = capfd.readouterr().err
    assert "JAX_PLATFORMS='cuda' asks for a GPU, but JAX cannot start one" in err


@pytest.fixture(scope="module")
def cluster():
    from distributed import Client, LocalCluster

    local = LocalCluster(n_workers=3, threads_per_worker=1, processes=True, resources={"GPU": 1},
                         host="127.0.0.1", dashboard_address="127.0.0.1:0",
                         env={"JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT},
                         preload=["diffsoup.distributed._worker"])  # fmt: skip
    client = Client(local, set_as_default=False)
    yield client
    client.close()
    local.close()


@pytest.fixture(scope="module")
def study_and_reference():
    study = tiny_study(6)
    return study, fit(ds.lower(study), starts=0, x0=START)


@pytest.mark.slow
def test_fit_through_run_on_3_workers_equals_in_process_fit(cluster, study_and_reference):
    study, ref = study_and_reference
    with dd.run(study, cluster=cluster, name="fit") as low:
        assert isinstance(low, AbstractLoweredStudy) and isinstance(low.base, ds.inference.LoweredStudy)
        assert sorted(len(s) for s in low.shards) == [2, 2, 2]  # balance_owners over 3 worker lanes
        res = fit(low, starts=0, x0=START)
        workers = {s["worker"] for s in low.backend.exp_state.values()}
        assert len(workers) == 3  # one shard per worker
    assert np.max(np.abs(res.theta - ref.theta)) < 1e-10
    assert abs(res.objective - ref.objective) < 1e-10
    assert res.n_evaluations == ref.n_evaluations
    # the shards were released on leaving the block
    assert sum(cluster.run(lambda: len(_lowered_cache.LOWERED)).values()) == 0


@pytest.mark.slow
def test_worker_killed_mid_fit_gives_the_same_fit(cluster, study_and_reference):
    study, ref = study_and_reference
    with dd.run(study, cluster=cluster, name="fault") as low:
        backend = low.backend
        pids = cluster.run(os.getpid)
        calls = [0]
        killed = []

        def evaluate(mode, theta):
            calls[0] += 1
            if calls[0] == 3:  # kill the worker of shard 0 while this evaluation runs
                victim = backend.pin[0]
                timer = threading.Timer(0.05, lambda: (os.kill(pids[victim], signal.SIGKILL), killed.append(victim)))
                timer.start()
            return type(backend).__call__(backend, mode, theta)

        low.backend = evaluate
        res = fit(low, starts=0, x0=START)
        assert killed and backend.rebuilds >= 1
        assert killed[0] not in backend.pin.values()
    assert np.max(np.abs(res.theta - ref.theta)) < 1e-10
    assert abs(res.objective - ref.objective) < 1e-10


def test_dashboard_route_answers_during_a_run(cluster):
    study = tiny_study(3)
    with dd.run(study, cluster=cluster, name="dash") as low:
        url = low.dashboard
        assert url.startswith("http://127.0.0.1:")
        before = json.loads(urllib.request.urlopen(f"{url}/diffsoup/studies.json", timeout=10).read())
        assert before["schema"] == "diffsoup.studies/1"
        state = before["studies"][low.fingerprint]
        assert state["state"] == "running" and state["evaluations"] == 0
        assert {e["state"] for e in state["experiments"].values()} == {"pending"}
        low.residuals(START)
        # Published asynchronously, at most every 0.5 s (diffsoup.distributed._dashboard_publish).
        deadline = time.monotonic() + 10
        while True:
            after = json.loads(urllib.request.urlopen(f"{url}/diffsoup/studies/{low.fingerprint}.json", timeout=10).read())
            if after["evaluations"] == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert after["evaluations"] == 1 and after["last_mode"] == "residuals"
        assert set(after["experiments"]) == {"e0", "e1", "e2"}
        assert all(e["state"] == "ok" and e["status"] == "SUCCESS" and e["steps"] > 0 for e in after["experiments"].values())
    closed = json.loads(urllib.request.urlopen(f"{url}/diffsoup/studies.json", timeout=10).read())
    assert closed["studies"][low.fingerprint]["state"] == "closed"


# -- execution options apart from lowering options ------------------------------------------------


def test_run_options_are_checked_and_kept_apart_from_lowering_options():
    study = tiny_study(2)
    with pytest.raises(TypeError, match=r"unknown keyword 'retry'\. Execution options: cluster, .*retries.*"
                                        r"lowering options \(passed to ds.lower\): objective, .*chunk_size"):  # fmt: skip
        with dd.run(study, retry=3):
            pass
    with pytest.raises(TypeError, match="execution= must be a ds.distributed.RunOptions"):
        with dd.run(study, execution={"retries": 1}):
            pass
    with pytest.raises(ValueError, match=r"\['retries'\] given both as keywords and in execution="):
        with dd.run(study, retries=1, execution=_run.RunOptions(retries=2)):
            pass
    with pytest.raises(ValueError, match="RunOptions.name='my-fit' must be letters and underscores"):
        with dd.run(study, name="my-fit"):
            pass
    for field, bad in (("retries", -1), ("worker_timeout", 0), ("n_workers", 1.5), ("resources", {"GPU": -1})):
        with pytest.raises(ValueError, match=f"RunOptions.{field}="):
            _run.RunOptions(**{field: bad})
    execution, lowering = _run.split_options({"retries": 4, "objective": "chi2", "chunk_size": 2})
    assert execution == _run.RunOptions(retries=4) and lowering == {"objective": "chi2", "chunk_size": 2}
    assert execution.given() == ("retries",)


def test_execution_options_left_none_read_the_dask_config():
    import dask.config

    shipped = _run.RunOptions().resolved()
    assert shipped == _run.RunOptions(resources={"GPU": 1}, name="study", n_workers=2, retries=2, worker_timeout=60.0)
    with dask.config.set({"diffsoup.run.retries": 7, "diffsoup.run.worker-timeout": 1.5,
                          "diffsoup.run.resources": {"TPU": 2}}):  # fmt: skip
        got = _run.RunOptions(retries=1).resolved()
    assert got.retries == 1 and got.worker_timeout == 1.5 and got.resources == {"TPU": 2}  # a keyword wins
    with dask.config.set({"diffsoup.run.retries": -2}):
        with pytest.raises(ValueError, match="RunOptions.retries=-2"):
            _run.RunOptions().resolved()


def test_run_obeys_the_dask_config(cluster):
    import time

    import dask.config

    study = tiny_study(3)
    with dask.config.set({"diffsoup.run.retries": 5}):
        with dd.run(study, cluster=cluster, name="config") as low:
            assert low.backend.retries == 5
    # no worker offers the resources: the run gives up after the configured timeout
    t0 = time.monotonic()
    with dask.config.set({"diffsoup.run.worker-timeout": 0.5, "diffsoup.run.resources": {"TPU": 1}}):
        with pytest.raises(RuntimeError, match=r"no worker offers resources \{'TPU': 1\} after 0.5 s"):
            with dd.run(study, cluster=cluster):
                pass
    assert time.monotonic() - t0 < 20


@pytest.mark.slow
def test_every_mode_through_run_equals_the_local_study(cluster):
    study = tiny_study(6)
    local = ds.lower(study, hessian="fd")
    with dd.run(study, cluster=cluster, name="modes", hessian="fd") as low:
        assert _rel(low.value(START), local.value(START)) < 1e-12
        (v, g), (v0, g0) = low.value_and_grad(START), local.value_and_grad(START)
        assert _rel(v, v0) < 1e-12 and _rel(g, g0) < 1e-12
        assert _rel(low.residuals(START), local.residuals(START)) < 1e-12
        (r, J), (r0, J0) = low.residuals_and_jacobian(START), local.residuals_and_jacobian(START)
        assert _rel(r, r0) < 1e-12 and _rel(J, J0) < 1e-12
        for x, y in zip(low.gauss_newton(START), local.gauss_newton(START)):
            assert _rel(x, y) < 1e-12
        assert _rel(low.hessian(START), local.hessian(START)) < 1e-10
        assert np.array_equal(low.steps, local.steps) and low.last_failures == {}
        assert len(low.backend.last_seconds) == len(low.shards) == 3


def _rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))
