"""Test configuration: float64 on (diffsoup's default policy needs it), CPU unless a test asks."""

import atexit
import contextlib
import os
import shutil
import tempfile

os.environ.setdefault("JAX_ENABLE_X64", "1")
# The suite's caches (generated model code, window starts) go to a folder of its own, removed at
# the end, never the user's ~/.cache/diffsoup.
if "DIFFSOUP_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="diffsoup-test-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["DIFFSOUP_CACHE_DIR"] = _cache

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)
# No persistent compilation cache in the test process itself (the command's in-process tests would
# turn it on): twice a full suite aborted inside XLA's executable serialization (the cache's write)
# at a PEtab program after ~400 tests, never in smaller runs. tests/test_compilation_cache.py checks
# the cache in fresh processes, where it is on.
jax.config.update("jax_enable_compilation_cache", False)
# Implicit rank promotion is an error in the tests: broadcasting is written out ([:, None], ...).
jax.config.update("jax_numpy_rank_promotion", "raise")


def has_gpu() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


@pytest.fixture(scope="session")
def rober_problem():
    from diffsoup.examples import rober

    return rober().build()


@pytest.fixture(autouse=True, scope="module")
def _compiled_programs_freed_after_each_file():
    """Each test file's compiled programs are freed when it ends: the suite compiles hundreds of
    integrators in one process, and full runs died inside XLA's compiler (SIGSEGV, SIGABRT) at the
    PEtab tests, 30 files in, while the same files in a shorter run pass."""
    yield
    import gc

    from diffsoup.inference.objective._lower import clear_program_cache

    clear_program_cache()
    jax.clear_caches()
    gc.collect()


@contextlib.contextmanager
def klu_device():
    """KLU (klujax) runs on the CPU only: on a GPU machine, what builds or runs a KLU problem inside
    this block goes to the CPU device (module-scoped fixtures use it; tests get it from
    ``_klu_on_the_cpu``)."""
    if jax.default_backend() != "cpu":
        with jax.default_device(jax.devices("cpu")[0]):
            yield
    else:
        yield


@pytest.fixture(autouse=True)
def _klu_on_the_cpu(request):
    """KLU (klujax) runs on the CPU only: on a GPU machine, tests parametrized with a KLU solver,
    named for it or marked ``klu`` run on the CPU device, as they do in CI."""
    import diffsoup as ds

    callspec = getattr(request.node, "callspec", None)
    solver = callspec.params.get("solver") if callspec is not None else None
    uses_klu = (isinstance(solver, ds.linear.KLU) or "klu" in request.node.name.lower()
                or request.node.get_closest_marker("klu") is not None)
    if uses_klu and request.node.get_closest_marker("gpu") is None:
        with klu_device():
            yield
    else:
        yield
