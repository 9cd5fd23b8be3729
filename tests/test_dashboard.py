"""diffsoup's dashboard without a browser: the page's tables from published records (100,000
experiments aggregated, counted independently here), the throttled asynchronous publisher (few
sends, the last state always arrives), the JSON routes of campaigns and ensembles during real runs
on an in-process cluster, the page served and linked from Dask's navigation, and the routes and
the hint without bokeh. The page in a real browser is tests/test_dashboard_browser.py."""

from __future__ import annotations

import json
import time
import urllib.request
from collections import Counter

import numpy as np
import pytest

import diffsoup as ds
from diffsoup.distributed import _dashboard, _dashboard_publish, _dashboard_views
from diffsoup.distributed._dashboard_publish import Publisher, objective_of
from diffsoup.distributed._dashboard_views import MAX_ROWS, campaign_tables, study_tables, summary_text

# -- the views -------------------------------------------------------------------------------------


def _big_study(n=100_000, shards=8, seed=0):
    rng = np.random.default_rng(seed)
    states = rng.choice(["ok", "failed", "pending"], size=n, p=[0.9, 0.07, 0.03])
    experiments = {}
    for i in range(n):
        state = str(states[i])
        status = {"ok": "SUCCESS", "failed": "MAX_STEPS" if i % 2 else "NONFINITE", "pending": None}[state]
        experiments[f"x{i}"] = {"shard": i % shards, "worker": f"tcp://w{i % shards}:1", "state": state,
                                "status": status, "steps": 10}  # fmt: skip
    record = {"name": "big", "state": "running", "evaluations": 3, "last_mode": "value", "last_seconds": 0.5,
              "rebuilds": 1, "updated": "t", "shards": [], "experiments": experiments}  # fmt: skip
    return record, states


def test_study_tables_aggregate_100000_experiments_by_state_shard_and_status():
    record, states = _big_study()
    t0 = time.perf_counter()
    tables = study_tables({"fp": record})
    seconds = time.perf_counter() - t0
    assert seconds < 5.0  # once per change, in the scheduler's loop: about 0.1 s here
    counts = Counter(states.tolist())
    row = tables["studies"]
    assert row["experiments"] == [100_000]
    assert (row["ok"][0], row["failed"][0], row["pending"][0]) == (counts["ok"], counts["failed"], counts["pending"])
    assert row["rebuilds"] == [1] and row["workers"] == [8]
    shards = tables["shards"]
    assert shards["shard"] == list(range(8)) and sum(shards["experiments"]) == 100_000
    for sid in range(8):
        mine = states[sid::8]
        assert shards["failed"][sid] == int(np.sum(mine == "failed"))
        failed_ids = np.flatnonzero(states == "failed")
        odd = sum(1 for i in failed_ids if i % 8 == sid and i % 2)
        assert f"MAX_STEPS: {odd}" in shards["statuses"][sid] or odd == 0
    failing = tables["failing"]["experiment"]
    assert len(failing) == MAX_ROWS  # the drill-down is capped; the count of all is in the study's row
    expected = [f"x{i}" for i in np.flatnonzero(states == "failed")[:MAX_ROWS]]
    assert failing == expected  # natural order: x9 before x10
    text = summary_text(tables, {}, {})
    assert f"100000 experiments, {counts['ok']} ok, {counts['failed']} failed" in text
    assert f"(+{counts['failed'] - 20} more)" in text


def test_campaign_tables_waterfall_best_and_failures():
    values = [3.0, 1.0, 2.0, 1.0 + 1e-9]
    record = {"name": "StartTask", "ledger": "/l.json", "state": "running", "started": "s", "updated": "u",
              "tasks": 6, "counts": {"accepted": 4, "failed": 1, "running": 1, "queued": 0},
              "objectives": [[f"s{i}", v] for i, v in enumerate(values)], "best": 1.0, "at_best": 2,
              "failed": [["s5", "ValueError: bad start"]]}  # fmt: skip
    t = campaign_tables({"c": record})
    assert t["waterfall"]["objective"] == sorted(values) and t["waterfall"]["rank"] == [1, 2, 3, 4]
    assert t["waterfall"]["task"][:2] == ["s1", "s3"]
    assert t["campaigns"]["best"] == [1.0] and t["campaigns"]["at_best"] == [2]
    assert t["failed"] == {"campaign": ["c"], "task": ["s5"], "error": ["ValueError: bad start"]}
    text = summary_text(study_tables({}), {"c": record}, {})
    assert "6 tasks, 4 done, 1 running, 0 pending, 1 failed; best objective 1 (reached by 2)" in text


def test_objective_of_a_task_result():
    assert objective_of({"objective": 2.5, "x": [1]}) == 2.5
    assert objective_of(1) == 1.0
    assert objective_of({"objective": None}) is None
    assert objective_of(True) is None and objective_of(float("nan")) is None and objective_of("3") is None


def test_ensemble_table_counts_failures_apart_from_successes():
    record = {"store": "/e.zarr", "state": "running", "started": "s", "updated": "u", "chunks": 6, "chunks_done": 2,
              "simulations": 8, "simulations_per_second": 40.0, "status": {"SUCCESS": 6, "MAX_STEPS": 2}}  # fmt: skip
    t = _dashboard_views.ensemble_table({"e": record})
    assert t["failures"] == ["MAX_STEPS: 2"] and t["chunks_done"] == [2] and t["simulations_per_second"] == [40.0]


# -- on an in-process cluster -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address="127.0.0.1:0")
    c = Client(cluster, set_as_default=False)
    yield c
    c.close()
    cluster.close()


def _get(client, route):
    return json.loads(urllib.request.urlopen(f"{_dashboard.dashboard_url(client)}{route}", timeout=10).read())


def test_publisher_throttles_and_the_last_state_arrives(client):
    keys = ["diffsoup", "test", "throttle"]
    publisher = Publisher([client], keys, interval=0.5)
    builds = []

    def build(i):
        builds.append(i)
        return {"i": i}

    t0 = time.monotonic()
    for i in range(200):
        publisher.update(lambda i=i: build(i))
    assert time.monotonic() - t0 < 1.0
    assert publisher.sent == 1 and builds == [0]  # the first at once, the rest waits for the interval
    assert client.get_metadata(keys) == {"i": 0}  # the first send is waited for
    deadline = time.monotonic() + 5
    while client.get_metadata(keys) != {"i": 199} and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.get_metadata(keys) == {"i": 199} and builds == [0, 199]  # one trailing send, built late
    publisher.update(lambda: {"i": "final"}, final=True)
    assert client.get_metadata(keys) == {"i": "final"}  # the last state is sent at once and waited for


def _task(item):
    if item["x"] == 3:
        raise ValueError("bad start")
    return {"objective": (item["x"] - 1.5) ** 2}


def test_campaign_on_dask_is_published_with_its_best_and_failures(client, tmp_path):
    items = [{"task_id": f"t{i}", "x": i} for i in range(5)]
    ledger = tmp_path / "c.json"
    result = ds.inference.checkpointed_map(_task, items, ledger_path=ledger, execution="dask", client=client,
                                           resources={}, progress=False)  # fmt: skip
    assert list(result.failures) == ["t3"]
    answer = _get(client, "/diffsoup/campaigns.json")
    assert answer["schema"] == "diffsoup.campaigns/1"
    record = answer["campaigns"][_dashboard_publish.campaign_id(ledger)]
    assert record["schema"] == "diffsoup.campaign/1" and record["state"] == "finished"
    assert record["ledger"] == str(ledger) and record["name"] == "_task"
    assert record["counts"] == {"accepted": 4, "failed": 1, "running": 0, "queued": 0}
    expected = sorted((i - 1.5) ** 2 for i in (0, 1, 2, 4))
    assert sorted(v for _, v in record["objectives"]) == expected
    assert record["best"] == 0.25 and record["at_best"] == 2  # t1 and t2
    assert record["failed"] == [["t3", "ValueError: bad start"]]


def test_ensemble_write_is_published(client, tmp_path):
    net = ds.examples.mass_action_network(6, 8, seed=2)
    problem = net.to_spec(y0=np.linspace(1.0, 2.0, 6)).build()
    base = np.array(list(net.parameters.values()))
    params = base * 10 ** np.random.default_rng(7).uniform(-0.5, 0.5, (10, base.size))
    ens = ds.distributed.ensemble(problem, params=params, t_eval=np.linspace(0.0, 4.0, 5), draws_per_chunk=4,
                                  client=client, resources={})  # fmt: skip
    written = ens.to_zarr(tmp_path / "e.zarr", client=client)
    answer = _get(client, "/diffsoup/ensembles.json")
    assert answer["schema"] == "diffsoup.ensembles/1"
    record = answer["ensembles"][_dashboard_publish.campaign_id(written.path)]
    assert record["schema"] == "diffsoup.ensemble/1" and record["state"] == "finished"
    assert (record["chunks"], record["chunks_done"], record["chunks_this_run"]) == (3, 3, 3)
    assert record["status"] == written.status and record["simulations"] == 10
    assert record["simulations_per_second"] > 0


def test_page_is_served_and_linked_from_the_navigation(client):
    pytest.importorskip("bokeh")
    url = _dashboard.dashboard_url(client)
    assert _dashboard.page_line(client) == f"diffsoup page: {url}/diffsoup"
    page = urllib.request.urlopen(f"{url}/diffsoup", timeout=10).read().decode()
    assert "bokeh" in page.lower()
    status = urllib.request.urlopen(f"{url}/status", timeout=10).read().decode()
    assert 'href="diffsoup"' in status


def test_without_bokeh_the_routes_answer_and_the_line_says_how_to_get_the_page(monkeypatch):
    from distributed import Client, LocalCluster

    monkeypatch.setattr(_dashboard, "bokeh_available", lambda: False)
    with LocalCluster(n_workers=0, processes=False, dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster, set_as_default=False) as c:  # fmt: skip
        line = _dashboard.page_line(c)
        url = _dashboard.dashboard_url(c)
        hint = f"diffsoup page: {_dashboard.BOKEH_HINT} on the scheduler; meanwhile JSON at {url}/diffsoup/studies.json"
        assert line == hint
        assert _get(c, "/diffsoup/studies.json") == {"schema": "diffsoup.studies/1", "studies": {}}
        with pytest.raises(urllib.error.HTTPError, match="404"):
            _get(c, "/diffsoup/campaigns/0123abcd.json")
