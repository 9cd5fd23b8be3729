"""Process-wide settings (diffsoup/_settings.py) and the diffsoup Dask config namespace: values read
from the environment, errors that name the variable, and a README table that lists every setting."""

from pathlib import Path

import pytest
import yaml

from diffsoup import _settings

ROOT = Path(__file__).resolve().parents[1]


def _leaf_keys(tree, prefix):
    for key, value in tree.items():
        name = f"{prefix}.{key}"
        if isinstance(value, dict) and key not in ("resources",):
            yield from _leaf_keys(value, name)
        else:
            yield name


def test_settings_read_the_environment_given():
    env = {
        "DIFFSOUP_CACHE_DIR": "/scratch/me/ds",
        "DIFFSOUP_COORDINATOR": "node1:1234",
        "DIFFSOUP_GPUS_PER_WORKER": "2",
        "DIFFSOUP_TRACEBACK": "yes",
        "DIFFSOUP_CUDSS_CHECK_INFO": "0",
        "DIFFSOUP_CUDSS_NVCC_FLAGS": "-O3  -lineinfo",
    }
    s = _settings.settings(env)
    assert s.cache_dir == Path("/scratch/me/ds")
    assert s.jax_cache_dir == Path("/scratch/me/ds/jax")
    assert s.coordinator == "node1:1234"
    assert s.gpus_per_worker == 2
    assert s.traceback is True
    assert s.cudss_check_info is False
    assert s.cudss_nvcc_flags == ("-O3", "-lineinfo")


def test_defaults_without_environment(tmp_path):
    s = _settings.settings({"XDG_CACHE_HOME": str(tmp_path)})
    assert s.cache_dir == tmp_path / "diffsoup"
    assert s.coordinator is None and s.launch_num_processes is None
    assert s.gpus_per_worker == 0 and s.traceback is False and s.cudss_check_info is True


def test_a_bad_integer_names_the_variable():
    with pytest.raises(ValueError, match="DIFFSOUP_GPUS_PER_WORKER='two' must be an integer"):
        _settings.settings({"DIFFSOUP_GPUS_PER_WORKER": "two"})


def test_configure_environment_keeps_what_the_user_set():
    env = {"XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=false", "XLA_CLIENT_MEM_FRACTION": "0.5"}
    _settings.configure_environment(env, gpu=True)
    assert env["XLA_FLAGS"] == "--xla_gpu_enable_latency_hiding_scheduler=false"
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in env  # setting both makes the CUDA plugin fail
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"


def test_the_settings_page_lists_every_setting():
    readme = (ROOT / "docs" / "guide" / "settings.md").read_text()  # the user guide's settings page
    missing = [name for name in _settings.ENVIRONMENT if f"`{name}`" not in readme]
    assert missing == [], f"environment variables missing from docs/guide/settings.md: {missing}"
    defaults = yaml.safe_load((ROOT / "diffsoup/distributed/diffsoup.yaml").read_text())
    keys = list(_leaf_keys(defaults["diffsoup"], "diffsoup"))
    undocumented = [k for k in keys if not k.startswith("diffsoup.slurm.") and f"`{k}`" not in readme]
    assert undocumented == [], f"config keys missing from docs/guide/settings.md: {undocumented}"
    slurm = [k.rsplit(".", 1)[1] for k in keys if k.startswith("diffsoup.slurm.")]
    assert "`diffsoup.slurm.*`" in readme and all(f"`{k}`" in readme for k in slurm)
