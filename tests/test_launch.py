"""``python -m diffsoup.distributed.launch -n 2`` on CPU: the multi-process API behaves as
documented (tests/distributed_launch_script.py checks it in each process), process 0 runs the
``ds.distributed.run`` block with the same value and residuals as an in-process lowering while
process 1 leaves it with status 0, and checkpointed_map(execution="processes") completes a
campaign whose ledger process 0 writes. Also the launcher's own exit statuses."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).with_name("distributed_launch_script.py")


def _launch(*args, timeout=400):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIFFSOUP_LAUNCH", "SLURM_"))}
    env.update(JAX_PLATFORMS="cpu", JAX_ENABLE_X64="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "diffsoup.distributed.launch", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))  # fmt: skip


def _lines(stdout, tag):
    return [json.loads(line[len(tag) + 1 :]) for line in stdout.splitlines() if line.startswith(tag + " ")]


def test_launcher_exit_statuses(tmp_path):
    failing = tmp_path / "fail.py"
    failing.write_text("import os, sys\nsys.exit(3 if os.environ['DIFFSOUP_LAUNCH_PROCESS_ID'] == '1' else 0)\n")
    assert _launch("-n", 2, failing, timeout=60).returncode == 3
    assert _launch("-n", 2, tmp_path / "missing.py", timeout=60).returncode == 2


@pytest.mark.slow
def test_two_processes_on_cpu(tmp_path):
    out = _launch("-n", 2, SCRIPT, tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]  # process 1 left run() with SystemExit(0)
    results = {r["rank"]: r for r in _lines(out.stdout, "RESULT")}
    assert sorted(results) == [0, 1]
    for rank, r in results.items():
        assert r["count"] == 2 and r["primary"] is (rank == 0) and r["primary_before"] is (rank == 0)
        assert "given without ['process_id']" in r["initialize_partial"]
        assert r["owns_all"] is True and r["owns_groups"] == [rank == 0, rank == 1]
        assert r["any_false"] is False and r["any_one"] is True and r["any_array"] is True
        assert r["global_shape"] == [4, 3]
        assert r["local_shard"] == [[10.0 * rank + 3 * i + j for j in range(3)] for i in range(2)]
        assert "partitioned across processes" in r["local_value_partitioned"]
        assert r["local_value_replicated"] == sum(range(6)) * 2 + 60  # sum of both pieces
        assert r["key_equal"] == results[0]["key_equal"]
        assert r["campaign"] == {f"t{i}": {"y": float(i * i), "process": i % 2} for i in range(5)}
        assert r["campaign_failures"] == []
        assert "Layout(processes=3) but this run has 2 processes" in r["layout_processes"]
    # Only process 0 ran the block, and only it went past it.
    blocks = _lines(out.stdout, "BLOCK")
    assert [b["rank"] for b in blocks] == [0]
    assert blocks[0]["shards"] == [["e0", "e1"], ["e2", "e3"]]
    assert blocks[0]["dv"] < 1e-10 and blocks[0]["dr"] < 1e-12
    assert [a["rank"] for a in _lines(out.stdout, "AFTER")] == [0]
    ledger = json.loads((tmp_path / "ledger.json").read_text())
    text = json.dumps(ledger)
    assert text.count('"accepted"') == 5 and "process 1" in text and "process 0" in text
