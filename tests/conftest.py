"""Test configuration: float64 on (diffsoup's default policy needs it), CPU unless a test asks."""

import os

os.environ.setdefault("JAX_ENABLE_X64", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)


def has_gpu() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


@pytest.fixture(scope="session")
def rober_problem():
    from diffsoup.examples import rober

    return rober().build()
