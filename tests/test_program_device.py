"""Where a lowered study's programs run (``ds.lower(device=...)``, ``_program_device``): the choice
as a pure function of the default backend, the lanes, the mesh and the option; a study pinned to
the CPU device gives the same numbers to the last bit as the default placement, under programs of
their own; and ``device="auto"`` on a (simulated) GPU backend runs few lanes on the host, points
as lanes counting as lanes."""

import logging

import jax
import numpy as np
import pytest
from fit_helpers import SOLVER, decay_study

import diffsoup as ds
from diffsoup.inference.objective import _program_device
from diffsoup.inference.objective._chunk_programs import ProgramKey
from diffsoup.inference.objective._program_device import (
    HOST_LANES_BELOW,
    check_device_option,
    program_device,
    resolve_device,
)

CPU = jax.devices("cpu")[0]


def test_auto_runs_few_lanes_on_the_host_only_on_a_gpu_backend_without_a_mesh():
    assert HOST_LANES_BELOW == 64
    assert program_device("gpu", 1, None, "auto") == "host"
    assert program_device("gpu", HOST_LANES_BELOW - 1, None, "auto") == "host"
    assert program_device("gpu", HOST_LANES_BELOW, None, "auto") == "default"
    assert program_device("gpu", 1_000, None, "auto") == "default"  # 1,000 starts of one condition
    assert program_device("cpu", 1, None, "auto") == "default"
    assert program_device("gpu", 1, object(), "auto") == "default"  # a data mesh of several devices
    assert program_device("gpu", 1, None, "default") == "default"
    assert program_device("gpu", 1, None, "auto", host_can_run=False) == "default"  # ds.linear.CuDSS
    assert program_device("gpu", 1_000, None, CPU) is CPU  # a pinned device, whatever the lanes
    assert resolve_device("host") is CPU and resolve_device("default") is None and resolve_device(CPU) is CPU


def test_bad_device_options_name_the_field():
    with pytest.raises(ValueError, match="device='gpu0' must be one of"):
        check_device_option("gpu0", 1)
    with pytest.raises(TypeError, match="device must be 'auto', 'default' or a jax.Device"):
        check_device_option(0, 1)
    with pytest.raises(ValueError, match="over 2 devices; leave device='auto'"):
        check_device_option(CPU, 2)
    with pytest.raises(ValueError, match="device='gpu0'"):
        ds.lower(decay_study(1), solver=SOLVER, device="gpu0")


def _keys(lowered):
    return [k for k in lowered._compiled if isinstance(k, ProgramKey)]


def test_a_study_pinned_to_the_cpu_device_matches_the_default_bit_for_bit_under_its_own_programs():
    study = decay_study(1)
    default = ds.lower(study, solver=SOLVER, device="default")
    pinned = ds.lower(study, solver=SOLVER, device=CPU)
    theta = default.nominal + np.array([0.1, -0.05])
    assert default.device is None and pinned.device is CPU
    assert default.value(theta) == pinned.value(theta)
    (v0, g0), (v1, g1) = default.value_and_grad(theta), pinned.value_and_grad(theta)
    assert v0 == v1 and np.array_equal(g0, g1)
    (r0, J0), (r1, J1) = default.residuals_and_jacobian(theta), pinned.residuals_and_jacobian(theta)
    assert np.array_equal(r0, r1) and np.array_equal(J0, J1)
    thetas = np.stack([theta, theta + 0.02])
    p0, p1 = default.residuals_and_jacobians(thetas), pinned.residuals_and_jacobians(thetas)
    assert all(np.array_equal(a, b) for a, b in zip(p0[:2], p1[:2]))
    # The same programs but for the device: never one key for both.
    default_keys, pinned_keys = _keys(default), _keys(pinned)
    assert {k.device for k in default_keys} == {None} and {k.device for k in pinned_keys} == {CPU}
    assert {(k.kind, k.lanes) for k in default_keys} == {(k.kind, k.lanes) for k in pinned_keys}
    assert not set(default_keys) & set(pinned_keys)
    assert pinned.devices_used["value"] == str(CPU) and "device=" in repr(pinned)
    assert pinned.restrict([0]).device is CPU


def test_auto_on_a_gpu_backend_runs_one_condition_on_the_host_and_many_points_on_the_default(monkeypatch, caplog):
    study = decay_study(2)
    default = ds.lower(study, solver=SOLVER, device="default")
    monkeypatch.setattr(_program_device, "default_backend", lambda: "gpu")
    with caplog.at_level(logging.INFO, logger="diffsoup.compile"):
        auto = ds.lower(study, solver=SOLVER)  # device="auto" is the default
    assert auto.device is CPU
    assert [r.getMessage() for r in caplog.records if "host CPU" in r.getMessage()] == [
        f"running the programs of {auto.problem.study.problem.spec.name!r} on the host CPU: 1 lane(s) per "
        f"program, fewer than HOST_LANES_BELOW={HOST_LANES_BELOW} (a GPU's per-step latency would dominate)"
    ]
    theta = default.nominal + np.array([-0.1, 0.05])
    assert auto.value(theta) == default.value(theta)
    assert auto.devices_used == {"value": str(CPU)}
    # Points as lanes: a few points stay on the host, HOST_LANES_BELOW of them go to the default device.
    few = np.stack([theta] * 2)
    many = np.stack([theta + 0.001 * i for i in range(HOST_LANES_BELOW)])
    assert np.array_equal(auto.residuals_and_jacobians(few)[1], default.residuals_and_jacobians(few)[1])
    assert auto.devices_used["jacobian (points)"] == str(CPU)
    r_auto, J_auto, _ = auto.residuals_and_jacobians(many)
    assert {k.device for k in _keys(auto) if k.lanes == 1} >= {CPU}
    assert [k[2].device for k in auto._compiled if isinstance(k, tuple) and k[0] == "points"] == [CPU, None]
    r_def, J_def, _ = default.residuals_and_jacobians(many)
    assert np.array_equal(r_auto, r_def) and np.array_equal(J_auto, J_def)
    # "default" keeps today's placement on the (simulated) GPU backend.
    assert ds.lower(study, solver=SOLVER, device="default").device is None
