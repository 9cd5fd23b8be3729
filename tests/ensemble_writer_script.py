"""A client that writes an ensemble into a Zarr store, slowly, so that a test can kill it mid-write.

    python tests/ensemble_writer_script.py STORE [--delay SECONDS]

It prints one line per chunk marked in the store. tests/test_ensemble.py builds the same ensemble
(``build_ensemble``) to resume the store and to compare values.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_ENABLE_X64", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

ROWS, CHUNK = 40, 4
TIMES = np.linspace(0.0, 4.0, 5)


def build_ensemble():
    """The ensemble both processes build: the same inputs, so the same fingerprint."""
    import diffsoup as ds

    net = ds.examples.mass_action_network(6, 8, seed=2)
    problem = net.to_spec(y0=np.linspace(1.0, 2.0, 6)).build()
    base = np.array(list(net.parameters.values()))
    params = base * 10 ** np.random.default_rng(7).uniform(-0.5, 0.5, (ROWS, base.size))
    return ds.distributed.ensemble(problem, params=params, t_eval=TIMES, draws_per_chunk=CHUNK, rtol=1e-8, atol=1e-10)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to sleep after each chunk is written")
    args = parser.parse_args()
    from dask.callbacks import Callback

    ens = build_ensemble()

    def slow(key, result, dsk, state, worker_id):
        name = key[0] if isinstance(key, tuple) else key
        if str(name).startswith("store-map"):  # one per chunk: Dask's write of it
            time.sleep(args.delay)

    with Callback(posttask=slow):
        ens.to_zarr(args.store, progress=lambda done, total: print(f"chunks {done}/{total}", flush=True))
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
