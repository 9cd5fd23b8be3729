"""Import hygiene: diffsoup never flips JAX's global settings, loads Dask/zarr/GPU code lazily,
and a float64 policy without x64 says how to turn it on."""

import os
import subprocess
import sys
import textwrap



def _run(code, **env):
    full_env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    full_env.update(env)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_import_leaves_jax_config_and_heavy_modules_alone():
    out = _run(
        """
        import sys, jax
        before = dict(jax.config.values)
        import diffsoup as ds
        import diffsoup.inference, diffsoup.linear
        after = dict(jax.config.values)
        changed = {k for k in before if before[k] != after.get(k)}
        assert not changed, changed
        heavy = [m for m in ("dask", "distributed", "zarr", "klujax", "diffsoup.linear._cudss_binding") if m in sys.modules]
        assert not heavy, heavy
        print("ok")
        """
    )
    assert out.strip().endswith("ok")


def test_using_klu_leaves_jax_config_as_the_user_had_it():
    out = _run(
        """
        import jax
        jax.config.update("jax_enable_x64", True)
        before = dict(jax.config.values)
        import diffsoup as ds
        from diffsoup.examples import brusselator_2d
        problem = brusselator_2d(6).build(linear_solver=ds.linear.KLU())
        sol = ds.simulate(problem, t_eval=[0.5], discontinuities=(1.1,))
        import sys
        assert "klujax" in sys.modules
        after = dict(jax.config.values)
        changed = {k: (before[k], after.get(k)) for k in before if before[k] != after.get(k)}
        assert not changed, changed
        print("ok", float(sol.ys[-1, 0]))
        """
    )
    assert out.startswith("ok")


def test_float64_policy_without_x64_says_how_to_turn_it_on():
    out = _run(
        """
        import jax, diffsoup as ds
        from diffsoup.examples import rober
        assert not jax.config.values["jax_enable_x64"]
        try:
            rober().build()
        except RuntimeError as err:
            msg = str(err)
            assert "JAX_ENABLE_X64=1" in msg and 'jax.config.update("jax_enable_x64", True)' in msg, msg
        else:
            raise SystemExit("a float64 policy was accepted with x64 off")
        # float32 end to end needs no x64
        problem = rober().build(precision=ds.Precision.fp32(), linear_solver=ds.linear.Dense())
        sol = ds.simulate(problem, t_eval=[1.0], rtol=1e-4, atol=1e-8)
        assert str(sol.ys.dtype) == "float32"
        print("ok")
        """
    )
    assert out.strip().endswith("ok")


def test_demo_runs_end_to_end_in_process(tmp_path):
    # The embedded Dask cluster's run of the demo is tests/test_cli.py's; this one fits in-process.
    out = _run(f"from diffsoup.cli import main; raise SystemExit(main(['demo', '--grid', '8', '--experiments', '10', "
               f"'--in-process', '-o', {str(tmp_path / 'demo')!r}]))")  # fmt: skip
    assert "ROBER to t=1e11" in out and "Brusselator 2-D N=8" in out and "relative difference" in out
    assert "recovered" in out.lower()


def test_cli_help_and_bad_arguments():
    out = subprocess.run([sys.executable, "-m", "diffsoup", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "demo" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "diffsoup", "demo", "--grid", "2"], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "--grid must be at least 4" in bad.stderr
