"""``./run``: the Python it sets up with (any supported version >= 3.12, 3.12 preferred)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parent.parent / "run"


def fake_python(directory: Path, name: str, version: str) -> Path:
    """An interpreter named ``name`` that reports ``version`` (this Python, with sys.version_info patched)."""
    major, minor = map(int, version.split("."))
    path = directory / name
    path.write_text(f"#!/bin/sh\nexec {sys.executable} -c \"import sys; sys.version_info = ({major}, {minor}, 0, "
                    f"'final', 0); exec(sys.argv[1])\" \"$2\"\n")  # fmt: skip
    path.chmod(0o755)
    return path


def find_python(tmp_path: Path, names: dict[str, str], **env) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, version in names.items():
        fake_python(bin_dir, name, version)
    # Only the fakes, the shell's tools and no pyenv/uv: HOME and PATH point away from this machine's Pythons.
    clean = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), **env}
    return subprocess.run(["bash", str(RUN), "find-python"], capture_output=True, text=True, env=clean, timeout=60)


@pytest.fixture
def no_system_python312():
    if any(Path(p).exists() for p in ("/usr/bin/python3.12", "/usr/local/bin/python3.12", "/usr/bin/python3.13",
                                      "/usr/local/bin/python3.13")):  # fmt: skip
        pytest.skip("this machine has a system Python 3.12/3.13, which ./run would find first")


def test_run_accepts_python_313_when_there_is_no_312(tmp_path, no_system_python312):
    proc = find_python(tmp_path, {"python3.13": "3.13", "python3": "3.11"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "bin" / "python3.13")


def test_run_prefers_python_312(tmp_path, no_system_python312):
    proc = find_python(tmp_path, {"python3.14": "3.14", "python3.13": "3.13", "python3.12": "3.12"})
    assert proc.stdout.strip() == str(tmp_path / "bin" / "python3.12"), proc.stderr
    generic = tmp_path / "generic"  # a plain python3 that is 3.12 wins over python3.13
    generic.mkdir()
    proc = find_python(generic, {"python3": "3.12", "python3.13": "3.13"})
    assert proc.stdout.strip() == str(generic / "bin" / "python3"), proc.stderr


def test_run_takes_diffsoup_python_of_a_supported_version_only(tmp_path, no_system_python312):
    fake = fake_python(tmp_path, "py313", "3.13")
    proc = find_python(tmp_path, {}, DIFFSOUP_PYTHON=str(fake))
    assert proc.returncode == 0 and proc.stdout.strip() == str(fake), proc.stderr
    old = fake_python(tmp_path, "py311", "3.11")
    proc = find_python(tmp_path, {}, DIFFSOUP_PYTHON=str(old))
    assert proc.returncode == 1 and f"DIFFSOUP_PYTHON={old} is not a Python of versions 3.12 3.13 3.14" in proc.stderr
    proc = find_python(tmp_path, {"python3": "3.11"})
    assert proc.returncode == 1 and "no Python of versions 3.12 3.13 3.14 found" in proc.stderr
