"""The process-wide cache of lowered studies (``diffsoup.distributed._lowered_cache``): campaign
tasks of one study lower it once per process -- a multistart's starts and a profile's parameters
alike --, another study or other options lower again; the cache is a bounded LRU, safe under the
threads of a Dask worker; ``diffsoup campaign`` reads a ledger of an earlier diffsoup (start ids
``start-000``) as the same starts."""

import json
import pickle
import threading
import time

import numpy as np
import pytest
from fit_helpers import SOLVER, decay_study

import diffsoup as ds
from diffsoup.distributed import _analytic_memo, _lowered_cache, _start_runs
from diffsoup.distributed._lowered_cache import LoweredCache, fingerprint_of, lowered_from

LOWERINGS: list = []


class DecayLowering:
    """A picklable factory of the decay study of one data set, counting its calls."""

    def __init__(self, seed: int):
        self.seed = seed

    def __call__(self):
        LOWERINGS.append(self.seed)
        return ds.lower(decay_study(self.seed), solver=SOLVER)


@pytest.fixture
def fresh_cache(monkeypatch):
    """An empty cache and analytic memo, as in a worker process that has run nothing yet."""
    cache = LoweredCache()
    monkeypatch.setattr(_lowered_cache, "LOWERED", cache)
    monkeypatch.setattr(_analytic_memo, "_ANALYTIC", [None, None, None])
    LOWERINGS.clear()
    return cache


def test_tasks_of_one_study_lower_it_once_and_another_study_lowers_again(fresh_cache):
    from diffsoup.distributed._profile_runs import ProfileTask
    from diffsoup.inference import ProfileOptions, fit
    from diffsoup.inference.fitting._fit import optimizer_of

    optimizer = optimizer_of("trf", max_nfev=5)
    # Each task unpickled anew, as a worker gets it.
    start = pickle.dumps(_start_runs.StartTask(DecayLowering(1), optimizer, seed=0, resample_failed_starts=0))
    done = [pickle.loads(start)({"index": i, "x0": x0}) for i, x0 in enumerate([[0.1, -0.2], [0.4, 0.1]])]
    assert [d["built_here"] for d in done] == [True, False] and LOWERINGS == [1] and fresh_cache.lowerings == 1
    # A profile task of the same factory uses the same lowered study.
    low, built = lowered_from(DecayLowering(1))
    assert not built and fresh_cache.lowerings == 1
    best = fit(low, starts=1, seed=0)
    profile = pickle.loads(pickle.dumps(ProfileTask(DecayLowering(1), ProfileOptions(max_steps=1))))
    out = profile({"theta": list(best.theta), "objective": best.objective, "parameter": "k"})
    assert out["format"] == "diffsoup.profile/1" and LOWERINGS == [1] and fresh_cache.lowerings == 1
    # The same start point gives the same start as fit on its own lowered study (nothing shared leaks).
    direct = fit(ds.lower(decay_study(1), solver=SOLVER), starts=np.array([[0.1, -0.2]]), method="trf", max_nfev=5)
    assert done[0]["objective"] == direct.starts[0].objective
    np.testing.assert_array_equal(done[0]["x"], direct.starts[0].x)
    # Another study (another data set) lowers again; so does the same study under other options.
    pickle.loads(pickle.dumps(_start_runs.StartTask(DecayLowering(2), optimizer, 0, 0)))({"index": 0, "x0": [0.1, 0.0]})
    assert LOWERINGS == [1, 2] and fresh_cache.lowerings == 2
    fp = fingerprint_of(DecayLowering(1))
    _, built = fresh_cache.get(fp, ("restrict", (0,)), lambda: low.restrict([0]))
    assert built and fresh_cache.lowerings == 3 and len(fresh_cache) == 3


def test_fingerprints_name_the_factory():
    from diffsoup.workflows._study_runs import StudyLowering

    assert fingerprint_of(DecayLowering(1)) == fingerprint_of(DecayLowering(1)) != fingerprint_of(DecayLowering(2))
    a, b = StudyLowering("/x/study.toml", "0123"), StudyLowering("/x/study.toml", "4567")
    assert fingerprint_of(a) == a.fingerprint != b.fingerprint  # the attribute, not the pickle
    assert a.fingerprint != StudyLowering("/y/study.toml", "0123").fingerprint


def test_the_cache_is_a_bounded_lru():
    cache = LoweredCache(max_entries=2)
    for name in ("a", "b"):
        cache.get(name, (), lambda name=name: name.upper())
    assert cache.get("a", (), lambda: "never") == ("A", False)  # a is now the most recent
    cache.get("c", (), lambda: "C")  # b, the least recently used, goes
    assert cache.keys() == [("a", ()), ("c", ())] and cache.lowerings == 3
    assert cache.get("b", (), lambda: "B2") == ("B2", True)
    cache.get("a", ("restrict", (1,)), lambda: "A1")
    assert cache.discard("a") == 1 and ("a", ("restrict", (1,))) not in cache
    with pytest.raises(TypeError, match="options=.*must be hashable"):
        cache.get("a", ["restrict"], lambda: None)
    with pytest.raises(TypeError, match="fingerprint must be a string"):
        cache.get(1, (), lambda: None)
    with pytest.raises(ValueError, match="max_entries=0 must be a positive integer"):
        LoweredCache(max_entries=0)
    with pytest.raises(TypeError, match="returned a str, not a lowered study"):
        lowered_from(lambda: "not lowered")


def test_threads_asking_for_one_study_at_once_lower_it_once():
    cache = LoweredCache()
    calls, barrier = [], threading.Barrier(4)

    def build(name):
        calls.append(name)
        time.sleep(0.2)
        return object()

    got = {}

    def task(i, name):
        barrier.wait()
        got[i] = cache.get(name, (), lambda: build(name))

    threads = [threading.Thread(target=task, args=(i, "a" if i < 3 else "b")) for i in range(4)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(calls) == ["a", "b"] and cache.lowerings == 2
    assert got[0][0] is got[1][0] is got[2][0] and sum(got[i][1] for i in range(3)) == 1
    assert time.perf_counter() - t0 < 0.39  # a and b were built side by side
    # A build that raises keeps nothing; the next call builds.
    with pytest.raises(RuntimeError, match="boom"):
        cache.get("c", (), lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert cache.get("c", (), lambda: "C") == ("C", True)


@pytest.mark.slow
def test_a_dask_worker_lowers_a_study_file_once_for_a_campaign_and_its_profiles(tmp_path):
    """Two starts of ``diffsoup campaign``'s study on one Dask worker process, then profiles of
    the same study file there: one lowering in that process; another study file lowers again."""
    distributed = pytest.importorskip("distributed")
    from test_cli import write_decay_study

    from diffsoup.distributed._profile_runs import profile
    from diffsoup.workflows import study_digest
    from diffsoup.workflows._study_runs import StudyLowering

    studies = [write_decay_study(tmp_path / name) for name in ("one", "two")]
    factories = [StudyLowering(str(s.resolve()), study_digest(s)) for s in studies]
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0") as cluster:  # fmt: skip
        with distributed.Client(cluster, set_as_default=False) as client:
            dask = dict(execution="dask", client=client, resources={})
            fit = _start_runs.multistart(factories[0], starts=2, method="trf", max_nfev=5, hierarchical=False,
                                         ledger_path=tmp_path / "starts.json", **dask)  # fmt: skip
            ledger = json.loads((tmp_path / "starts.json").read_text())["tasks"]
            assert sorted(ledger) == ["start-0000", "start-0001"]
            assert sorted(r["result"]["built_here"] for r in ledger.values()) == [False, True]
            profile(factories[0], fit, ["k"], options=ds.inference.ProfileOptions(max_steps=1), **dask)
            assert list(client.run(lambda: _lowered_cache.LOWERED.lowerings).values()) == [1]
            _start_runs.multistart(factories[1], starts=1, method="trf", max_nfev=5, hierarchical=False, **dask)
            assert list(client.run(lambda: _lowered_cache.LOWERED.lowerings).values()) == [2]
