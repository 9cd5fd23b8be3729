"""Run by tests/test_launch.py under ``python -m diffsoup.distributed.launch -n 2``: checks the
multi-process API on CPU and prints one JSON line per process (``RESULT {...}``)."""

import json
import os
import sys

import numpy as np

import diffsoup as ds
from diffsoup import distributed as dd


def _mark(what):
    import time

    print(f"TIME {time.time():.1f} {what}", file=sys.stderr, flush=True)


def main(out_dir: str) -> None:
    with_raises = {}
    try:
        dd.initialize(coordinator_address="127.0.0.1:1", num_processes=2)
    except ValueError as exc:
        with_raises["initialize_partial"] = str(exc)
    primary_before = dd.is_primary()  # read from the launcher's variables
    dd.initialize(debug=True)  # debug: every evaluation of run() checks that theta agrees
    _mark("initialized")
    import jax
    from jax.sharding import PartitionSpec as P

    jax.config.update("jax_enable_x64", True)
    me, n = jax.process_index(), jax.process_count()
    report = {"rank": me, "count": n, "primary": dd.is_primary(), "primary_before": primary_before, **with_raises}
    mesh = ds.global_mesh(("data",))
    groups = ds.mesh_groups(mesh, [1] * mesh.shape["data"])
    report["owns_all"] = dd.owns(mesh)
    report["owns_groups"] = [dd.owns(g) for g in groups]
    report["any_false"] = dd.any_process(False)
    report["any_one"] = dd.any_process(me == 1)
    report["any_array"] = dd.any_process(jax.numpy.asarray(me == 0))
    # Each process holds rows [2 me, 2 me + 2) of a (4, 3) array sharded over the data axis.
    local = np.arange(6, dtype=np.float64).reshape(2, 3) + 10 * me
    x = dd.from_local_data(local, mesh, P("data"))
    report["global_shape"] = list(x.shape)
    report["local_shard"] = np.asarray(x.addressable_shards[0].data).tolist()
    try:
        dd.local_value(x)
    except ValueError as exc:
        report["local_value_partitioned"] = str(exc)
    total = jax.jit(lambda a: a.sum(), out_shardings=jax.sharding.NamedSharding(mesh, P()))(x)
    report["local_value_replicated"] = float(dd.local_value(total))
    report["key_equal"] = np.asarray(jax.random.key_data(dd.key(3))).tolist()

    # checkpointed_map on device groups: each task squares its number on its group's device.
    def task(item):
        group = dd.device_group()
        dev = list(group.devices.flat)[0]
        y = jax.device_put(np.float64(item["x"]), dev) ** 2
        return {"y": float(y), "process": jax.process_index()}

    items = [{"task_id": f"t{i}", "x": i} for i in range(5)]
    res = dd.checkpointed_map(task, items, ledger_path=os.path.join(out_dir, "ledger.json"),
                              execution="processes", progress=False)  # fmt: skip
    report["campaign"] = {k: v for k, v in res.results.items()}
    report["campaign_failures"] = list(res.failures)

    _mark("campaign done")
    # ds.distributed.run: process 0 runs the block; process 1 leaves with SystemExit(0).
    sys.path.insert(0, os.path.dirname(__file__))
    from test_study import THETA, tiny_study

    study = tiny_study(4)
    try:
        ds.distributed.run(study, layout=ds.Layout(processes=3)).__enter__()
    except ValueError as exc:
        report["layout_processes"] = str(exc)
    print("RESULT " + json.dumps(report), flush=True)
    with ds.distributed.run(study) as low:
        v = low.value(THETA)
        r = low.residuals(THETA)
        local_low = ds.lower(study)
        v0 = local_low.value(THETA)
        r0 = local_low.residuals(THETA)
        block = {"rank": me, "shards": [list(s) for s in low.shards], "dv": abs(v - v0),
                 "dr": float(np.max(np.abs(r - r0)))}  # fmt: skip
        _mark("block done")
        print("BLOCK " + json.dumps(block), flush=True)
    print("AFTER " + json.dumps({"rank": me}), flush=True)
    _mark("after")


if __name__ == "__main__":
    main(sys.argv[1])
