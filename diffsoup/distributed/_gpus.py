"""The GPUs this process may use, found without starting JAX."""

from __future__ import annotations

import os
import shutil
import subprocess


def visible_gpus() -> list[str]:
    """The ids of the GPUs JAX would see, without importing JAX (which may grab GPU memory).

    ``JAX_PLATFORMS`` without cuda/gpu hides them all; ``CUDA_VISIBLE_DEVICES`` lists them (CUDA
    stops at the first negative id); otherwise ``nvidia-smi -L`` counts them.
    """
    platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms and not any(p in platforms for p in ("cuda", "gpu")):
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids = []
        for entry in (e.strip() for e in listed.split(",")):
            if not entry or entry.startswith("-"):
                break
            ids.append(entry)
        return ids
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    count = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    return [str(i) for i in range(count)]
