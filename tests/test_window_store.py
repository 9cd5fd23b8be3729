"""The window-start store under DIFFSOUP_CACHE_DIR: the same key in processes with different hash
seeds; 8 processes preparing one experiment at once leave one entry and read identical values; a
later process loads it without solving (window_solves() == 0); truncated, corrupted or partial
entries are recomputed with a warning; a script using only zarr reads the starts back."""

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
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
    assert sorted(o["solves"] for o in outs) == [0] * 7 + [1]  # one solved, seven waited for it
    windows = cache / "windows"
    assert sorted(p.name for p in windows.iterdir() if p.is_dir()) == [key]  # one entry, no leftover temporaries
    assert sorted(p.name for p in windows.iterdir() if p.name.startswith(".")) == []  # and no lock left
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


# --------------------------------------------------------------------------------------------
# One solve per entry (the lock of a key) and the debris of killed processes
# --------------------------------------------------------------------------------------------


def _dead_pid():
    """The pid of a process of this host that has ended."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)  # fmt: skip
    return int(proc.stdout)


def _write_lock(store, key, pid, host, age=0.0):
    store.path.mkdir(parents=True, exist_ok=True)
    lock = store.lock_path(key)
    lock.write_text(json.dumps({"host": host, "pid": pid, "token": uuid.uuid4().hex, "since": time.time() - age}))
    if age:
        os.utime(lock, (time.time() - age, time.time() - age))
    return lock


def test_a_process_waits_for_the_solve_of_another_and_reads_its_entry(local):
    exp, study = local
    reference = MemoryWindowCache()
    key = prepare_windows(exp, study=study, window_store=reference)
    store = WindowStore()
    reset_window_solves()
    out = {}
    with store.computing(key):  # held here as by a process solving the entry
        holder = json.loads(store.lock_path(key).read_text())
        assert (holder["pid"], holder["host"]) == (os.getpid(), socket.gethostname())
        waiter = threading.Thread(target=lambda: out.setdefault("key", prepare_windows(exp, study=study)))
        waiter.start()
        time.sleep(1.5)
        assert waiter.is_alive()  # waiting for the lock, not solving
        assert window_solves() == 0
        assert store.save(key, reference.load(key)) is True
        waiter.join(timeout=60)
    assert not waiter.is_alive() and out["key"] == key
    assert window_solves() == 0  # it read the entry the holder placed
    assert not store.lock_path(key).exists()  # released
    np.testing.assert_array_equal(store.load(key).starts, reference.load(key).starts)


@pytest.mark.parametrize("owner", ["dead-process-here", "old-lock-elsewhere"])
def test_an_abandoned_lock_is_broken_and_the_entry_solved(local, owner):
    exp, study = local
    store = WindowStore()
    key = prepare_windows(exp, study=study, window_store=MemoryWindowCache())
    if owner == "dead-process-here":
        lock = _write_lock(store, key, _dead_pid(), socket.gethostname())
    else:
        lock = _write_lock(store, key, 1, "another-node.example", age=store.stale_after + 60)
    reset_window_solves()
    started = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert prepare_windows(exp, study=study) == key
    assert time.monotonic() - started < 30 and window_solves() == 1
    assert not lock.exists() and store.keys() == [key]


@pytest.mark.parametrize("owner", ["live-process-here", "fresh-lock-elsewhere"])
def test_a_held_lock_is_waited_for_until_lock_timeout_then_solved_with_a_warning(local, owner):
    exp, study = local
    store = WindowStore(lock_timeout=1.0)
    key = prepare_windows(exp, study=study, window_store=MemoryWindowCache())
    pid, host = (os.getpid(), socket.gethostname()) if owner == "live-process-here" else (1, "another-node.example")
    lock = _write_lock(store, key, pid, host, age=60.0)  # older than lock_timeout, younger than stale_after
    held = lock.read_text()
    reset_window_solves()
    started = time.monotonic()
    with pytest.warns(WindowStoreWarning, match=r"waited 1 s \(lock_timeout\) for another process's solve"):
        assert prepare_windows(exp, study=study, window_store=store) == key
    assert 1.0 <= time.monotonic() - started < 30 and window_solves() == 1
    assert lock.read_text() == held  # not ours: left to its owner
    assert store.keys() == [key]


def test_store_settings_are_checked():
    with pytest.raises(ValueError, match=r"stale_after=-1 must be a number of seconds >= 0"):
        WindowStore(stale_after=-1)
    with pytest.raises(ValueError, match=r"lock_timeout='1h' must be a number of seconds"):
        WindowStore(lock_timeout="1h")


def test_temporaries_of_processes_that_are_gone_are_removed_after_stale_after(tmp_path):
    store = WindowStore(tmp_path, stale_after=60)
    store.path.mkdir(parents=True)
    here, dead, live = socket.gethostname(), _dead_pid(), os.getpid()
    cases = {  # name: (age in seconds, removed)
        f".tmp-k1-{uuid.uuid4().hex}.{dead}@{here}": (120, True),  # owner gone, old
        f".tmp-k2-{uuid.uuid4().hex}.{dead}@{here}": (10, False),  # owner gone, recent
        f".tmp-k3-{uuid.uuid4().hex}.{live}@{here}": (7200, False),  # a live process of this host
        f".tmp-k4-{uuid.uuid4().hex}.{live}@another-node.example": (120, True),  # elsewhere: by age
        f".tmp-k5-{uuid.uuid4().hex}.{live}@another-node.example": (10, False),
        f".tmp-k6-{uuid.uuid4().hex}": (120, True),  # the earlier naming, without its owner
        f".tmp-k7-{uuid.uuid4().hex}": (10, False),
        f".bad-k8-{uuid.uuid4().hex}.{dead}@{here}": (120, True),
    }
    for name, (age, _) in cases.items():
        (store.path / name).mkdir()
        (store.path / name / "zarr.json").write_text("{}")
        os.utime(store.path / name, (time.time() - age, time.time() - age))
    removed = store.remove_stale()
    assert sorted(p.name for p in removed) == sorted(name for name, (_, gone) in cases.items() if gone)
    assert store.save("k9", WindowEntry(np.ones((2, 3)), np.arange(4.0))) is True
    left = sorted(p.name for p in store.path.iterdir() if p.name.startswith("."))
    assert left == sorted(name for name, (_, gone) in cases.items() if not gone)


WRITER = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    from diffsoup.inference import WindowEntry
    from diffsoup.store import WindowStore

    def rename(src, dst):  # the entry is written whole: stop right before placing it
        if sys.argv[2] == "killed":
            os._exit(9)
        print("writing", flush=True)
        time.sleep(300)

    os.rename = rename
    WindowStore(sys.argv[1]).save("k", WindowEntry(np.ones((2, 3)), np.arange(4.0)))
    """
)


def test_a_killed_writer_s_temporary_entry_is_removed_and_a_live_one_kept(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    killed = subprocess.run([sys.executable, "-c", WRITER, str(tmp_path), "killed"], env=env, timeout=120)
    assert killed.returncode == 9
    live = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), "live"], env=env, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        assert live.stdout.readline().strip() == "writing"
        windows = tmp_path / "windows"
        temporaries = {p.name: p for p in windows.iterdir() if p.name.startswith(".tmp-k-")}
        assert len(temporaries) == 2
        # Each names its owner: <pid>@<host>.
        owners = {tuple(name.rsplit(".", 1)[1].split("@")) for name in temporaries}
        assert {host for _, host in owners} == {socket.gethostname()} and str(live.pid) in {p for p, _ in owners}
        store = WindowStore(tmp_path, stale_after=0)  # any age: only whether the owner runs decides
        assert store.save("k2", WindowEntry(np.zeros((2, 3)), np.arange(4.0))) is True
        left = sorted(p.name for p in windows.iterdir() if p.name.startswith("."))
        assert left == [name for name in temporaries if name.endswith(f".{live.pid}@{socket.gethostname()}")]
    finally:
        live.kill()
        live.wait()
    assert [p.name for p in store.remove_stale()] == left  # its owner is gone now
    assert store.keys() == ["k2"]
