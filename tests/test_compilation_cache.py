"""JAX's persistent compilation cache for diffsoup (``diffsoup._compilation_cache``, public as
``ds.enable_compilation_cache``): where it goes, that JAX's own settings win, the deprecated
``DIFFSOUP_JAX_CACHE_DIR``, the Dask worker set-up, and that a second process loads diffsoup's
programs (dense and KLU simulations, a lowered study's gradient) from the cache instead of
compiling them.

Everything that turns the cache on runs in a fresh subprocess: the setting is process-wide, and
this test process must not start writing to the user's cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from diffsoup._settings import settings

ROOT = Path(__file__).resolve().parents[1]


def _clean_environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    dropped = ("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE", "JAX_ENABLE_COMPILATION_CACHE", "DIFFSOUP_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", JAX_ENABLE_X64="1")
    env["DIFFSOUP_CACHE_DIR"] = str(tmp_path / "cache")
    env.update(extra)
    return env


def _run(code: str, env: dict[str, str], timeout: float = 600) -> dict:
    """Run :data:`STATE` and then ``code`` in a fresh interpreter; it prints one JSON line last."""
    out = subprocess.run([sys.executable, "-c", STATE + textwrap.dedent(code)], env=env, capture_output=True, text=True,
                         timeout=timeout, cwd=str(ROOT))  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


STATE = """
import json, warnings
import jax
from diffsoup._compilation_cache import enable_compilation_cache


def state(result):
    return {"returned": None if result is None else str(result),
            "dir": jax.config.jax_compilation_cache_dir,
            "min": jax.config.jax_persistent_cache_min_compile_time_secs}
"""


# ------------------------------------------------------------------------------------------------
# Settings
# ------------------------------------------------------------------------------------------------


def test_the_cache_goes_to_jax_under_diffsoup_cache_dir_and_a_second_call_changes_nothing(tmp_path):
    got = _run("""
        first = state(enable_compilation_cache())
        second = state(enable_compilation_cache())
        print(json.dumps({"first": first, "second": second}))
        """, _clean_environment(tmp_path))  # fmt: skip
    expected = str(tmp_path / "cache" / "jax")
    assert got["first"] == {"returned": expected, "dir": expected, "min": 0.1}
    assert got["second"] == got["first"]
    assert (tmp_path / "cache" / "jax").is_dir()


def test_an_explicit_path_and_minimum_are_used(tmp_path):
    got = _run(f"""
        print(json.dumps(state(enable_compilation_cache({str(tmp_path / "mine")!r}, min_compile_seconds=0))))
        """, _clean_environment(tmp_path))  # fmt: skip
    assert got == {"returned": str(tmp_path / "mine"), "dir": str(tmp_path / "mine"), "min": 0.0}
    assert not (tmp_path / "cache").exists()


def test_jax_own_settings_are_kept(tmp_path):
    env = _clean_environment(tmp_path, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax-own"),
                             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="3")  # fmt: skip
    got = _run(f"""
        plain = state(enable_compilation_cache())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            other = state(enable_compilation_cache({str(tmp_path / "elsewhere")!r}))
        print(json.dumps({{"plain": plain, "other": other, "warnings": [str(w.message) for w in caught]}}))
        """, env)  # fmt: skip
    own = str(tmp_path / "jax-own")
    assert got["plain"] == {"returned": own, "dir": own, "min": 3.0}
    assert got["other"] == got["plain"]
    assert len(got["warnings"]) == 1 and "is ignored" in got["warnings"][0] and own in got["warnings"][0]
    assert not (tmp_path / "cache").exists() and not (tmp_path / "elsewhere").exists()


def test_jax_config_set_in_code_is_kept(tmp_path):
    got = _run(f"""
        jax.config.update("jax_compilation_cache_dir", {str(tmp_path / "by-code")!r})
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 2.5)
        print(json.dumps(state(enable_compilation_cache())))
        """, _clean_environment(tmp_path))  # fmt: skip
    assert got == {"returned": str(tmp_path / "by-code"), "dir": str(tmp_path / "by-code"), "min": 2.5}


def test_a_minimum_set_through_jax_is_kept_with_diffsoup_directory(tmp_path):
    got = _run("""
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 4.0)
        print(json.dumps(state(enable_compilation_cache())))
        """, _clean_environment(tmp_path))  # fmt: skip
    assert got["dir"] == str(tmp_path / "cache" / "jax") and got["min"] == 4.0


def test_cache_switched_off_through_jax_stays_off(tmp_path):
    got = _run("""
        print(json.dumps(state(enable_compilation_cache())))
        """, _clean_environment(tmp_path, JAX_ENABLE_COMPILATION_CACHE="false"))  # fmt: skip
    assert got == {"returned": None, "dir": None, "min": 1.0}
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_bad_minimum_is_refused(bad):
    from diffsoup._compilation_cache import enable_compilation_cache

    with pytest.raises(ValueError, match="min_compile_seconds"):
        enable_compilation_cache(min_compile_seconds=bad)


def test_the_old_variable_is_honoured_with_a_deprecation_warning(tmp_path):
    environ = {"DIFFSOUP_CACHE_DIR": str(tmp_path / "root"), "DIFFSOUP_JAX_CACHE_DIR": str(tmp_path / "old")}
    with pytest.warns(DeprecationWarning, match="DIFFSOUP_JAX_CACHE_DIR.*deprecated.*DIFFSOUP_CACHE_DIR"):
        got = settings(environ)
    assert got.jax_cache_dir == tmp_path / "old" and got.cache_dir == tmp_path / "root"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning without the old variable
        assert settings({"DIFFSOUP_CACHE_DIR": str(tmp_path / "root")}).jax_cache_dir == tmp_path / "root" / "jax"


def test_dask_workers_set_the_cache_up_through_the_same_function(tmp_path):
    code = """
        import dask
        from diffsoup.distributed._worker import setup_worker_environment

        with dask.config.set({"diffsoup.worker.cache-min-compile-seconds": %s}):
            setup_worker_environment()
        print(json.dumps(state(jax.config.jax_compilation_cache_dir)))
        """
    got = _run(code % "None", _clean_environment(tmp_path))
    assert got["dir"] == str(tmp_path / "cache" / "jax") and got["min"] == 0.1
    got = _run(code % "0.5", _clean_environment(tmp_path))
    assert got["min"] == 0.5
    got = _run(code % "None", _clean_environment(tmp_path, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax-own")))
    assert got["dir"] == str(tmp_path / "jax-own") and got["min"] == 1.0


# ------------------------------------------------------------------------------------------------
# A second process loads the programs
# ------------------------------------------------------------------------------------------------

# Runs one of diffsoup's programs with the cache on (every program written: minimum 0 s) and
# reports JAX's cache events (jax.monitoring) seen while it ran.
PROGRAMS = """
import json, sys
import jax
import numpy as np
from jax import monitoring

from diffsoup._compilation_cache import enable_compilation_cache

enable_compilation_cache(min_compile_seconds=0.0)
events = {"hits": 0, "misses": 0}
NAMES = {"/jax/compilation_cache/cache_hits": "hits", "/jax/compilation_cache/cache_misses": "misses"}


def listen(name, **kwargs):
    if name in NAMES:
        events[NAMES[name]] += 1


monitoring.register_event_listener(listen)

import diffsoup as ds

case = sys.argv[1]
times = np.array([1.0, 10.0, 100.0])
if case in ("dense", "klu"):
    problem = ds.examples.rober().build(linear_solver=ds.linear.KLU() if case == "klu" else ds.linear.Dense())
    p = problem.parameter_vector(None)
    run = jax.jit(lambda p: ds.simulate(problem, None, times, p, throw=False).ys)
    result = np.asarray(run(p))
else:
    from diffsoup.inference import Gaussian, Parameter

    spec = ds.examples.rober()
    exps = [ds.Experiment(f"e{i}", times, np.full((3, 3), 0.5), noise=Gaussian(0.1), y0=[1.0, 0.0, 0.1 * i])
            for i in range(2)]
    params = [Parameter(k, v, v / 10, v * 10) for k, v in zip(spec.parameter_names, spec.parameter_defaults)]
    lowered = ds.lower(ds.Study(spec, exps, params))
    value, grad = lowered.value_and_grad(lowered.nominal)
    result = np.concatenate([[value], grad])
print(json.dumps({**events, "result": result.ravel().tolist()}))
"""


def _twice(case: str, tmp_path: Path) -> list[dict]:
    """``case`` run in two fresh processes, one after the other, sharing one cache directory."""
    env = _clean_environment(tmp_path)
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", PROGRAMS, case], env=env, capture_output=True, text=True,
                              timeout=900, cwd=str(ROOT))  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return runs


class ProgramsCompiledAgain(AssertionError):
    """The second process compiled programs that the first one wrote to the cache."""


def _assert_second_process_loads_everything(runs):
    first, second = runs
    assert first["misses"] > 0 and first["hits"] == 0  # a fresh directory: everything compiled and written
    assert second["result"] == first["result"]  # the loaded programs compute the same numbers
    assert second["hits"] > 0
    if second["misses"]:
        raise ProgramsCompiledAgain(f"{second['misses']} programs compiled again in the second process")
    assert second["hits"] == first["misses"]


def test_a_second_process_loads_a_dense_simulation(tmp_path):
    _assert_second_process_loads_everything(_twice("dense", tmp_path))


def test_a_second_process_loads_a_klu_simulation(tmp_path):
    # KLU analyzes the pattern inside the program: no handle address is baked in, so the key is stable.
    _assert_second_process_loads_everything(_twice("klu", tmp_path))


def test_a_second_process_loads_a_lowered_study_gradient(tmp_path):
    _assert_second_process_loads_everything(_twice("study", tmp_path))
