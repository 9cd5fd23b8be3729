"""ds.Precision and ds.Layout: fields, presets, inheritance, validation; meshes."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffsoup as ds


def test_default_is_float64_fp64():
    p = ds.Precision()
    assert p == ds.Precision.fp64()
    assert p.compute_dtype == np.float64 and p.solve_mode == "fp64"
    assert p.effective_adjoint_compute_dtype == np.float64
    assert p.effective_jacobian_values_dtype == np.float64
    assert p.effective_forward_sensitivity_solve_mode == "fp64"
    assert p.effective_reverse_sensitivity_solve_mode == "fp64"
    assert p.adjoint_ir_tol is None


def test_presets():
    p = ds.Precision.fp32()
    assert p.compute_dtype == np.float32 and p.effective_solve_mode == "fp32"
    assert p.effective_forward_sensitivity_solve_mode == "fp32"
    assert p.effective_reverse_sensitivity_solve_mode == "fp32"
    assert not p.uses_float64
    p = ds.Precision.fp32_factor()
    assert p.compute_dtype == np.float64 and p.solve_mode == "fp32"
    assert p.effective_forward_sensitivity_solve_mode == "fp32"
    assert p.effective_reverse_sensitivity_solve_mode == "fp64"
    p = ds.Precision.fp32_ir()
    assert p.solve_mode == "fp32_ir" and p.effective_forward_sensitivity_solve_mode == "fp32_ir"
    assert p.effective_reverse_sensitivity_solve_mode == "fp64"


def test_fp64_reads_as_fp32_under_float32_compute():
    p = ds.Precision(compute_dtype=jnp.float32, solve_mode="fp64")
    assert p.solve_mode == "fp64"  # stored as given
    assert p.effective_solve_mode == "fp32"
    assert p.effective_forward_sensitivity_solve_mode == "fp32"


def test_inheritance_of_none_fields():
    p = ds.Precision(solve_mode="fp32_ir", adjoint_compute_dtype=None, forward_sensitivity_solve_mode=None)
    assert p.effective_forward_sensitivity_solve_mode == "fp32_ir"
    assert p.effective_reverse_sensitivity_solve_mode == "fp32_ir"
    p = ds.Precision(compute_dtype="float32", adjoint_compute_dtype="float64")
    assert p.effective_adjoint_compute_dtype == np.float64
    assert p.effective_reverse_sensitivity_solve_mode == "fp64"  # the wider reverse sweep keeps fp64


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(solve_mode="fp16"), "solve_mode='fp16' is not a solve mode"),
        (dict(forward_sensitivity_solve_mode="exact"), "forward_sensitivity_solve_mode"),
        (dict(compute_dtype=np.float64, adjoint_compute_dtype=np.float32), "narrower than compute_dtype"),
        (dict(compute_dtype=np.float32, jacobian_values_dtype=np.float64), "wider than compute_dtype"),
        (dict(adjoint_ir_tol=0.0), "adjoint_ir_tol=0.0 must be a positive"),
        (dict(adjoint_ir_tol=-1e-8), "must be a positive"),
        (dict(compute_dtype=np.int32), "not a real floating dtype"),
        (dict(compute_dtype=np.float32, solve_mode="fp32_ir"), "float64 residual"),
    ],
)
def test_precision_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ds.Precision(**kwargs)


def test_precision_is_frozen_and_hashable():
    p = ds.Precision.fp32_ir()
    with pytest.raises(Exception):
        p.solve_mode = "fp64"
    assert hash(p) == hash(ds.Precision.fp32_ir())


def test_layout_defaults_and_fields():
    lay = ds.Layout()
    assert (lay.mesh, lay.dof_sharding, lay.reorder, lay.hybrid_memory) == (None, None, "amd", False)
    assert (lay.hybrid_device_memory_limit_mb, lay.balance_steps, lay.processes) == (None, False, None)
    assert lay.data_size == 1 and lay.model_size == 1
    marker = object()
    assert ds.Layout(dof_sharding=marker).dof_sharding is marker  # stored, not read


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(reorder="rcm"), "reorder='rcm'"),
        (dict(hybrid_device_memory_limit_mb=512), "set hybrid_memory=True"),
        (dict(hybrid_memory=True, hybrid_device_memory_limit_mb=0), "positive integer"),
        (dict(hybrid_memory=True, hybrid_device_memory_limit_mb=-5), "positive integer"),
        (dict(processes=0), "processes=0"),
        (dict(processes=2.5), "processes=2.5"),
    ],
)
def test_layout_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ds.Layout(**kwargs)


def test_layout_accepted_by_build(rober_problem):
    from diffsoup.examples import rober

    lay = ds.Layout(hybrid_memory=True, hybrid_device_memory_limit_mb=1024)
    assert rober().build(layout=lay).layout is lay
    with pytest.raises(TypeError, match="layout= must be a ds.Layout"):
        rober().build(layout="data")


def test_global_mesh_single_device():
    mesh = ds.global_mesh(("data",))
    assert mesh.axis_names == ("data",) and mesh.shape["data"] == len(jax.devices())
    with pytest.raises(ValueError, match="needs shape"):
        ds.global_mesh(("data", "model"))
    with pytest.raises(ValueError, match="distinct names"):
        ds.global_mesh(("data", "data"))
    with pytest.raises(ValueError, match="distinct names"):
        ds.global_mesh(("batch",))
    assert ds.mesh_groups(ds.global_mesh(("model",)), [1])[0].axis_names == ("model",)


def test_meshes_over_four_cpu_devices():
    code = textwrap.dedent(
        """
        import jax, diffsoup as ds
        assert len(jax.devices()) == 4
        mesh = ds.global_mesh(("data",))
        groups = ds.mesh_groups(mesh, [1, 3])
        assert [g.shape["data"] for g in groups] == [1, 3]
        assert set(groups[0].devices.flat).isdisjoint(groups[1].devices.flat)
        m2 = ds.global_mesh(("data", "model"), shape=(2, 2))
        assert [g.shape["data"] for g in ds.mesh_groups(m2, [1, 1])] == [1, 1]
        try:
            ds.Layout(mesh=mesh, processes=2)
        except ValueError as e:
            assert "processes=2" in str(e)
        else:
            raise SystemExit("processes=2 over a 4-device data axis was accepted")
        assert ds.Layout(mesh=mesh, processes=1).data_size == 4
        try:
            ds.mesh_groups(mesh, [2, 1])
        except ValueError as e:
            assert "sum to the data axis width 4" in str(e)
        else:
            raise SystemExit("bad sizes accepted")
        print("ok")
        """
    )
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


def test_model_axis_over_several_devices_is_refused_at_build():
    # No solver factors one problem across devices yet: Dense and KLU used to ignore the axis
    # silently, CuDSS raised NotImplementedError at prepare. One ValueError at build for all.
    code = textwrap.dedent(
        """
        import re
        import jax
        jax.config.update("jax_enable_x64", True)
        import diffsoup as ds
        from diffsoup.examples import rober
        from diffsoup.model import SparsityPattern
        assert len(jax.devices()) == 2
        pattern = "Layout.mesh has a 'model' axis over 2 devices.*ds.linear.CuDSS on several GPUs.*not available yet.*Drop the 'model' axis.*shard experiments over 'data' with ds.lower"
        model = ds.Layout(mesh=ds.global_mesh(("data", "model"), shape=(1, 2)))
        only_model = ds.Layout(mesh=ds.global_mesh(("model",)))
        for layout in (model, only_model):
            for solver in (None, ds.linear.Dense(), ds.linear.KLU(), ds.linear.CuDSS()):
                try:
                    rober().build(layout=layout, linear_solver=solver)
                except ValueError as e:
                    assert re.search(pattern, str(e)), str(e)
                    assert "\\n" not in str(e)
                else:
                    raise SystemExit(f"{solver} accepted a model axis over 2 devices")
        # A prepare called directly says the same (CuDSS's was a NotImplementedError).
        p = SparsityPattern.from_matrix(rober().build().pattern.to_scipy())
        for solver in (ds.linear.Dense(), ds.linear.KLU(), ds.linear.CuDSS()):
            try:
                solver.prepare(p, ds.Precision(), layout=model)
            except ValueError as e:
                assert re.search(pattern, str(e)), str(e)
            else:
                raise SystemExit(f"{solver}.prepare accepted a model axis over 2 devices")
        # A model axis of one device is no model split: accepted, and the data axis too.
        data = ds.Layout(mesh=ds.global_mesh(("data", "model"), shape=(2, 1)))
        assert rober().build(layout=data, linear_solver=ds.linear.KLU()).layout is data
        print("ok")
        """
    )
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().endswith("ok")
