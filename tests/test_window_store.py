"""The window-start store under DIFFSOUP_CACHE_DIR: the same key in processes with different hash
seeds; 8 processes preparing one experiment at once leave one entry and read identical values; a
later process loads it without solving (window_solves() == 0); truncated, corrupted or partial
entries are recomputed with a warning; a script using only zarr reads the starts back."""

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import diffsoup as ds
from diffsoup.inference import (
    InferenceProblem,
    MemoryWindowCache,
    WindowCache,
    WindowEntry,
    prepare_windows,
    reset_window_solves,
    window_solves,
)
from diffsoup.store import WindowStore, WindowStoreWarning

ROOT = Path(__file__).resolve().parents[1]

# One script for every process: the model's source (hence Problem.fingerprint) is the same in each.
SCRIPT = textwrap.dedent(
    '''
    import json, os, sys, time
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    import diffsoup as ds
    from diffsoup.inference import Multishoot, Parameter, prepare_windows, window_solves
    from diffsoup.store import WindowStore


    def rhs(t, y, p):
        return jnp.stack([p["a"] * y[0] - p["b"] * y[0] * y[1], p["c"] * y[0] * y[1] - p["d"] * y[1]])


    def setup():
        problem = ds.ProblemSpec(rhs, states=["x", "z"], parameters={"a": 1.0, "b": 0.5, "c": 0.25, "d": 0.75},
                                 y0=[2.0, 1.0], name="LV").build()
        times = np.linspace(0.5, 12.0, 12)
        exp = ds.Experiment("e", times, np.ones((12, 2)), trajectory=Multishoot(windows=4, init="simulate"))
        study = ds.Study(problem, [exp], [Parameter(k, v, v / 10, v * 10) for k, v in {"a": 1.0, "b": 0.5}.items()])
        return exp, study


    if __name__ == "__main__":
        exp, study = setup()
        go = sys.argv[1] if len(sys.argv) > 1 else None
        while go and not os.path.exists(go):
            time.sleep(0.01)
        key = prepare_windows(exp, study=study, values={"a": 1.1})
        entry = WindowStore().load(key)
        print(json.dumps({"key": key, "solves": window_solves(), "starts": entry.starts.tolist(),
                          "hashseed": os.environ.get("PYTHONHASHSEED")}))
    '''
)


def _env(cache, seed):
    env = dict(os.environ, DIFFSOUP_CACHE_DIR=str(cache), PYTHONHASHSEED=str(seed), JAX_ENABLE_X64="1",
               JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))  # fmt: skip
    env.pop("XLA_FLAGS", None)
    return env


def _run(script, cache, seed, *args):
    return _result(_start(script, cache, seed, *args))


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("script") / "prepare_script.py"
    path.write_text(SCRIPT)
    return path


@pytest.fixture(scope="module")
def model(script):
    """The script's experiment and study, built once in this process."""
    sys.path.insert(0, str(script.parent))
    try:
        import prepare_script

        yield prepare_script.setup()
    finally:
        sys.path.remove(str(script.parent))
        sys.modules.pop("prepare_script", None)


@pytest.fixture
def local(model, tmp_path, monkeypatch):
    """The model with a fresh cache dir."""
    monkeypatch.setenv("DIFFSOUP_CACHE_DIR", str(tmp_path / "cache"))
    return model


def _start(script, cache, seed, *args):
    return subprocess.Popen([sys.executable, str(script), *map(str, args)], env=_env(cache, seed),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def _result(proc):
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


def test_two_processes_with_different_hash_seeds_compute_the_same_key(script, tmp_path):
    procs = [_start(script, tmp_path / "c1", 1), _start(script, tmp_path / "c2", 12345)]
    a, b = map(_result, procs)
    assert a["key"] == b["key"] and len(a["key"]) == 32
    assert a["solves"] == b["solves"] == 1
    assert a["starts"] == b["starts"]


@pytest.mark.slow
def test_eight_processes_at_once_leave_one_entry_and_a_later_process_does_not_solve(script, tmp_path):
    cache, go = tmp_path / "cache", tmp_path / "go"
    procs = [_start(script, cache, i, go) for i in range(8)]
    time.sleep(1.0)
    go.write_text("go")  # released together once each has imported and built its model
    outs = [_result(p) for p in procs]
    keys = {o["key"] for o in outs}
    assert len(keys) == 1
    key = keys.pop()
    assert all(o["starts"] == outs[0]["starts"] for o in outs)
    assert all(o["solves"] <= 1 for o in outs)
    windows = cache / "windows"
    assert sorted(p.name for p in windows.iterdir() if p.is_dir()) == [key]  # one entry, no leftover temporaries
    later = _run(script, cache, 99)
    assert later["key"] == key and later["solves"] == 0 and later["starts"] == outs[0]["starts"]


def test_in_process_fit_setup_loads_prepared_starts_without_solving(local):
    exp, study = local
    reset_window_solves()
    key = prepare_windows(exp, study=study, values={"a": 1.1})
    assert window_solves() == 1
    ip = ds.inference.InferenceProblem(study, values={"a": 1.1})
    assert window_solves() == 1 and ip.window_keys["e"] == key
    exact = np.asarray(ds.simulate(study.problem, None, [3.0, 6.0, 9.0], {"a": 1.1}, rtol=1e-10, atol=1e-12).ys)
    np.testing.assert_allclose(ip.window_values(ip.nominal)["e"], exact, rtol=1e-4)
    assert prepare_windows(exp, problem=study.problem, parameters=study.parameters, values={"a": 1.1}) == key
    assert window_solves() == 1
    assert prepare_windows(exp.with_trajectory(None), study=study) is None
    with pytest.raises(TypeError, match="unknown keyword"):
        prepare_windows(exp, study=study, valeus={"a": 1.1})
    other = prepare_windows(exp, study=study, values={"a": 1.2})
    assert other != key and window_solves() == 2


def test_a_given_window_cache_is_used_and_the_default_store_left_alone(local, tmp_path):
    exp, study = local
    reset_window_solves()
    cache = MemoryWindowCache()
    key = prepare_windows(exp, study=study, values={"a": 1.1}, window_store=cache)
    assert window_solves() == 1 and cache.keys() == [key]
    ip = InferenceProblem(study, values={"a": 1.1}, window_store=cache)
    assert window_solves() == 1 and ip.window_keys["e"] == key
    np.testing.assert_array_equal(ip.window_values(ip.nominal)["e"], cache.load(key).starts)
    assert not (tmp_path / "cache").exists()  # the default store was never opened
    # The default (the Zarr store) computes the same key and the same starts.
    assert prepare_windows(exp, study=study, values={"a": 1.1}) == key and window_solves() == 2
    np.testing.assert_array_equal(WindowStore().load(key).starts, cache.load(key).starts)
    with pytest.warns(DeprecationWarning, match="window_store"):
        assert prepare_windows(exp, study=study, values={"a": 1.1}, store=cache) == key
    assert window_solves() == 2
    with pytest.raises(TypeError, match="window_store= must be a ds.inference.WindowCache"):
        prepare_windows(exp, study=study, window_store={})
    with pytest.raises(TypeError, match="window_store= must be a ds.inference.WindowCache"):
        InferenceProblem(study, window_store=object())


class _ReadOnlyCache(WindowCache):
    """Holds one stale entry under every key and cannot be written."""

    def __init__(self, stale: WindowEntry):
        self.stale, self.saves = stale, 0

    def load(self, key):
        return self.stale

    def save(self, key, entry):
        self.saves += 1
        raise OSError("read-only file system")


def test_a_stale_entry_is_recomputed_and_an_unwritable_cache_only_warns(local):
    exp, study = local
    good = MemoryWindowCache()
    key = prepare_windows(exp, study=study, window_store=good)
    right = good.load(key)
    stale = WindowEntry(np.zeros((3, 2)), np.linspace(0.0, 10.0, 5))  # the right shape for other windows
    cache = _ReadOnlyCache(stale)
    reset_window_solves()
    with pytest.warns(UserWarning, match="could not store the window starts of 'e'.*read-only"):
        ip = InferenceProblem(study, window_store=cache)
    assert window_solves() == 1 and cache.saves == 1
    np.testing.assert_array_equal(ip.window_values(ip.nominal)["e"], right.starts)
    with pytest.raises(ValueError, match="edges must be"):
        WindowEntry(np.zeros((2, 2)), np.zeros(3))


def _damage_chunk(entry: Path):
    chunk = next(p for p in (entry / "starts").rglob("*") if p.is_file() and p.name != "zarr.json")
    data = chunk.read_bytes()
    chunk.write_bytes(data[: len(data) // 2])


def _corrupt_chunk(entry: Path):
    chunk = next(p for p in (entry / "starts").rglob("*") if p.is_file() and p.name != "zarr.json")
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))


def _partial(entry: Path):
    meta = json.loads((entry / "zarr.json").read_text())
    meta["attributes"].pop("complete")
    (entry / "zarr.json").write_text(json.dumps(meta))


def _garbage_metadata(entry: Path):
    (entry / "zarr.json").write_text('{"zarr_format": 3, "node_')


@pytest.mark.parametrize("damage", [_damage_chunk, _corrupt_chunk, _partial, _garbage_metadata])
def test_damaged_entry_is_recomputed_with_a_warning(local, damage):
    exp, study = local
    reset_window_solves()
    key = prepare_windows(exp, study=study)
    store = WindowStore()
    good = store.load(key).starts
    damage(store.entry_path(key))
    with pytest.warns(WindowStoreWarning, match="incomplete or corrupted"):
        assert prepare_windows(exp, study=study) == key
    assert window_solves() == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(store.load(key).starts, good)


def test_losing_a_race_discards_the_copy(tmp_path):
    store = WindowStore(tmp_path)
    assert store.save("k1", WindowEntry(np.ones((2, 3)), np.arange(4.0))) is True
    assert store.save("k1", WindowEntry(np.zeros((2, 3)), np.arange(4.0))) is False
    assert store.keys() == ["k1"]
    assert [p.name for p in store.path.iterdir() if p.name.startswith(".")] == []
    np.testing.assert_array_equal(store.load("k1").starts, np.ones((2, 3)))
    with pytest.raises(ValueError, match="key="):
        store.entry_path("../x")


def test_plain_zarr_script_reads_the_window_starts(local, tmp_path):
    exp, study = local
    key = prepare_windows(exp, study=study)
    expected = WindowStore().load(key).starts
    reader = tmp_path / "read.py"
    reader.write_text(
        "import json, sys, zarr\n"
        "root = zarr.open_group(sys.argv[1], mode='r')\n"
        "entry = root[sys.argv[2]]\n"
        "print(json.dumps({'starts': entry['starts'][:].tolist(), 'edges': entry['edges'][:].tolist(),"
        " 'complete': entry.attrs['complete'],"
        " 'modules': sorted(m for m in sys.modules if m.startswith('diffsoup'))}))\n"
    )
    out = subprocess.run([sys.executable, str(reader), os.environ["DIFFSOUP_CACHE_DIR"] + "/windows", key],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["modules"] == [] and got["complete"] is True
    np.testing.assert_array_equal(np.array(got["starts"]), expected)
    np.testing.assert_allclose(got["edges"], np.linspace(0.0, 12.0, 5))
