"""Import hygiene: diffsoup never flips JAX's global settings, loads Dask/zarr/GPU code lazily,
``import diffsoup`` loads JAX and the numerical core only (no scipy, fides, sympy, inference or
fitting code), and a float64 policy without x64 says how to turn it on."""

import os
import subprocess
import sys
import textwrap

# Third-party packages ``import diffsoup`` leaves alone (top-level names in sys.modules).
NOT_AT_IMPORT = ("scipy", "fides", "pypesto", "sympy", "libsbml", "petab", "dask", "distributed", "zarr",
                 "matplotlib", "klujax")  # fmt: skip


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


def test_import_diffsoup_loads_jax_and_the_numerical_core_only():
    out = _run(
        f"""
        import sys
        import diffsoup as ds
        loaded = set(sys.modules)
        heavy = sorted({{m.split(".")[0] for m in loaded}} & set({NOT_AT_IMPORT!r}))
        assert heavy == [], heavy
        ours = sorted(m for m in loaded if m.startswith("diffsoup.inference"))
        assert ours == [], ours  # ds.Study, ds.lower and ds.inference are lazy
        assert "diffsoup.integrate._simulate" in loaded and "jax" in loaded  # the core is there

        study = ds.Study  # the inference layer without its fitting room
        assert study is ds.inference.Study and "diffsoup.inference.objective._lower" in sys.modules
        assert not [m for m in sys.modules if m.startswith("diffsoup.inference.fitting")]
        assert not {{m.split(".")[0] for m in sys.modules}} & {{"scipy", "fides", "pypesto"}}

        fit = ds.inference.fit  # positive control: the check sees fitting load on first use
        assert "diffsoup.inference.fitting._fit" in sys.modules
        from diffsoup.inference.fitting._fit import fit as defined
        assert fit is defined
        import numpy as np
        ds.model.SparsityPattern.from_matrix(np.eye(3))  # positive control: scipy.sparse on first use
        assert "scipy.sparse" in sys.modules
        print("ok")
        """
    )
    assert out.strip().endswith("ok")


def test_lazy_inference_names_are_listed_and_resolve():
    out = _run(
        """
        import diffsoup as ds
        import diffsoup.inference as inference
        listed = set(dir(inference))
        fitting = {"fit", "FitResult", "StartResult", "Fides", "TRF", "LBFGSB", "AbstractOptimizer", "ParameterBox",
                   "SobolIndices", "latin_hypercube", "sobol", "ParameterProfile", "ProfileOptions", "ProfileResult",
                   "profile_parameter", "pypesto_objective", "pypesto_problem", "fitting"}
        assert fitting <= listed, fitting - listed
        assert {"Study", "Experiment", "lower", "inference"} <= set(dir(ds))
        for name in sorted(listed):  # every listed name resolves, and resolving adds none
            getattr(inference, name)
        assert set(dir(inference)) == listed, set(dir(inference)) ^ listed
        from diffsoup.inference import TRF, ProfileOptions, fit
        assert fit is inference.fitting._fit.fit and TRF is inference.fitting._optimizers.TRF
        assert ds.lower is inference.lower
        assert ProfileOptions.__module__ == "diffsoup.inference.fitting._profile_likelihood"
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
    # The embedded Dask cluster's run of the demo, solver tables included, is tests/test_cli.py's;
    # this one fits in-process (the solver tables are the same code: skipped here).
    out = _run(f"from diffsoup.cli import main; raise SystemExit(main(['demo', '--skip-solvers', '--experiments', "
               f"'10', '--in-process', '-o', {str(tmp_path / 'demo')!r}]))")  # fmt: skip
    assert "ROBER to t=1e11" not in out and "Wrote the demo study" in out
    assert "recovered" in out.lower() and "starts reached the best objective" in out
    assert (tmp_path / "demo" / "summary.json").is_file()


def test_cli_help_and_bad_arguments():
    out = subprocess.run([sys.executable, "-m", "diffsoup", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "demo" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "diffsoup", "demo", "--grid", "2"], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "--grid must be at least 4" in bad.stderr


def test_the_lazy_names_are_declared_for_type_checkers_too():
    """Every name ``ds.inference`` loads lazily from its own rooms is repeated under ``if
    TYPE_CHECKING:`` from the same module (type checkers, IDEs and the API reference read those)."""
    import ast
    import re
    from pathlib import Path

    source = (Path(__file__).resolve().parents[1] / "diffsoup" / "inference" / "__init__.py").read_text()
    lazy = set(re.findall(r'"(\w+)": "diffsoup\.inference\.(fitting\.\w+)"', source))
    checked = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            checked |= {(a.asname, imp.module) for imp in node.body if isinstance(imp, ast.ImportFrom) for a in imp.names}
    assert lazy and lazy == checked
