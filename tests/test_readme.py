"""The README's and the guide pages' code runs as written: every ```python block (each in a fresh
process) and every ```bash block (in ``bash -euo pipefail``), and the study file of 'Study files'
loads.

Blocks run in a scratch directory laid out like a checkout after ``./run demo``: ``tests/`` and
``jobs/`` of this checkout linked in, the demo's study in ``diffsoup-demo/`` (what ``./run demo``
writes), and ``.venv/bin/activate`` putting a ``diffsoup`` command of this interpreter on ``PATH``.

Markers (an HTML comment on the line before a block, invisible on GitHub and on the site):
    <!-- test: continues -->          the python block runs after the previous one, in its process
    <!-- test: slow -->               the block is marked slow (it compiles fits; still run in CI)
    <!-- test: skip (REASON) -->      not run here (e.g. needs a GPU or a cluster); keep these few
    <!-- test: study-file -->         a study file (toml) that test_study_file_loads reads
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "docs" / "getting-started.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]
MARKER = re.compile(r"^<!--\s*test:\s*(continues|skip|slow|study-file)\s*(?:\((.+)\))?\s*-->$")
FENCE = re.compile(r"^```(\w*)\s*$")
RUNNABLE = {"python": "python", "bash": "bash", "sh": "bash"}
MAX_SKIPS = 4  # over all pages: skipped blocks stay few and visible


def code_blocks(text: str) -> list[dict]:
    """Every fenced block: language, code, first line number, and the marker before it (or None)."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence or not fence.group(1):
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        before = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        marker = MARKER.match(before)
        blocks.append({"language": fence.group(1), "code": "\n".join(lines[i + 1:j]), "line": i + 2,
                       "marker": marker.group(1) if marker else None,
                       "reason": marker.group(2) if marker else None})  # fmt: skip
        i = j + 1
    return blocks


def programs(text: str, page: str = "README.md") -> list[dict]:
    """Each program to run: a python block with the blocks that continue it, or a bash block."""
    out: list[dict] = []
    for block in code_blocks(text):
        kind = RUNNABLE.get(block["language"])
        where = f"{page}:{block['line']}"
        if kind is None:
            continue
        if block["marker"] == "skip":
            assert block["reason"], f"{where}: a skipped block says why: <!-- test: skip (reason) -->"
            continue
        if block["marker"] == "continues":
            assert kind == "python" and out and out[-1]["kind"] == "python", (
                f"{where}: 'continues' follows a python block")  # fmt: skip
            out[-1]["name"] += f"+{block['line']}"
            out[-1]["source"] += f"\n\n# {where}\n" + block["code"]
            continue
        out.append({"name": where, "kind": kind, "slow": block["marker"] == "slow",
                    "source": f"# {where}\n" + block["code"]})  # fmt: skip
    return out


def test_the_block_parser_sees_markers():
    text = ("x\n```python\na = 1\n```\n<!-- test: continues -->\n```python\nb = a\n```\n"
            "<!-- test: skip (needs a GPU) -->\n\n```python\nimport nothing\n```\n<!-- test: slow -->\n"
            "```bash\nls\n```\n```toml\nx = 1\n```\n")  # fmt: skip
    assert programs(text) == [
        {"name": "README.md:3+7", "kind": "python", "slow": False, "source": "# README.md:3\na = 1\n\n# README.md:7\nb = a"},
        {"name": "README.md:16", "kind": "bash", "slow": True, "source": "# README.md:16\nls"},
    ]  # fmt: skip
    assert [b["language"] for b in code_blocks(text)] == ["python", "python", "python", "bash", "toml"]
    with pytest.raises(AssertionError, match="says why"):
        programs("<!-- test: skip -->\n```python\nx\n```\n")


def _code_lines(program: dict) -> list[str]:
    """A program's lines without the ``# page:line`` comments that name its blocks."""
    return [line for line in program["source"].splitlines() if not re.fullmatch(r"# \S+:\d+", line)]


def distinct_programs(found: list[dict]) -> list[dict]:
    """The programs to run: a program of the same kind whose lines are the first lines of an earlier
    one (the getting-started page repeats the README's first study commands) runs as part of that one."""
    run: list[dict] = []
    for program in found:
        lines = _code_lines(program)
        if not any(p["kind"] == program["kind"] and _code_lines(p)[:len(lines)] == lines for p in run):
            run.append(program)
    return run


def test_a_block_repeating_the_start_of_another_runs_once():
    first = programs("```bash\ndiffsoup check s.toml\ndiffsoup fit s.toml\ncat x\n```\n", "README.md")
    again = programs("t\n```bash\ndiffsoup check s.toml\ndiffsoup fit s.toml\n```\n```bash\ndiffsoup fit s.toml\n```\n"
                     "```python\ndiffsoup check s.toml\n```\n", "docs/x.md")  # fmt: skip
    assert [p["name"] for p in distinct_programs(first + again)] == ["README.md:2", "docs/x.md:7", "docs/x.md:10"]


def _all_programs() -> list:
    found = [program for page in PAGES
             for program in programs(page.read_text(encoding="utf-8"), page.relative_to(ROOT).as_posix())]  # fmt: skip
    return [pytest.param(program, id=program["name"], marks=[pytest.mark.slow] if program["slow"] else [])
            for program in distinct_programs(found)]  # fmt: skip


PROGRAMS = _all_programs()


def test_the_pages_have_code_to_run_and_few_skips():
    readme = code_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    assert sum(b["language"] == "python" for b in readme) >= 2
    assert sum(b["language"] == "bash" and b["marker"] != "skip" for b in readme) >= 1
    skips = [(page.name, b["line"]) for page in PAGES for b in code_blocks(page.read_text(encoding="utf-8"))
             if b["marker"] == "skip"]  # fmt: skip
    assert len(skips) <= MAX_SKIPS, f"skipped blocks stay few: {skips}"
    # the PEtab fit of the README runs (it is not skipped)
    assert any("ds.petab.load" in p.values[0]["source"] and p.values[0]["name"].startswith("README.md") for p in PROGRAMS)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One DIFFSOUP_CACHE_DIR for the module's blocks: a later block loads what an earlier compiled."""
    return tmp_path_factory.mktemp("diffsoup-cache")


def _workspace(path: Path, cache: Path) -> dict:
    """A checkout after ``./run demo``, in ``path``; returns the environment blocks run with."""
    from diffsoup._demo_study import write_demo_study

    for name in ("tests", "jobs"):
        (path / name).symlink_to(ROOT / name, target_is_directory=True)
    write_demo_study(path / "diffsoup-demo")  # its simulation compiles once per process
    bin_dir = path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    command = bin_dir / "diffsoup"
    command.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m diffsoup "$@"\n')
    command.chmod(0o755)
    (bin_dir / "activate").write_text(f'PATH="{bin_dir}:$PATH"; export PATH\n')
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"), "DIFFSOUP_CACHE_DIR": str(cache),
            "MPLBACKEND": "Agg"}  # fmt: skip


@pytest.mark.parametrize("program", PROGRAMS)
def test_block_runs(program, tmp_path, cache_dir):
    env = _workspace(tmp_path, cache_dir)
    if program["kind"] == "python":
        script = tmp_path / "block.py"
        script.write_text(program["source"])
        command = [sys.executable, str(script)]
    else:
        script = tmp_path / "block.sh"
        script.write_text(program["source"])
        command = ["bash", "-euo", "pipefail", str(script)]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, f"{program['name']} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


def test_study_file_loads(tmp_path):
    """The study file of 'Study files', with data files made up for its experiment."""
    from diffsoup.formats import load_study

    page = ROOT / "docs" / "guide" / "study-files.md"
    studies = [b for b in code_blocks(page.read_text(encoding="utf-8")) if b["marker"] == "study-file"]
    assert len(studies) == 1 and studies[0]["language"] == "toml"
    (tmp_path / "data").mkdir()
    times = np.linspace(0.5, 6.0, 12)
    rows = [f"{t:g},{np.exp(-0.04 * t):.6g},{1.0:.6g}" for t in times]
    (tmp_path / "data" / "e1.csv").write_text("time,A,total\n" + "\n".join(rows) + "\n")
    path = tmp_path / "study.toml"
    path.write_text(studies[0]["code"])
    sf = load_study(path)
    assert sf.name == "rober-rates" and sf.study.levels == ("site",)
    assert sf.study.entry_names == ("k1[s1]",) and sf.observables == {"e1": ["A", "total"]}
    assert sf.study.experiments[0].trajectory.n_windows == 3
    y, p = np.array([0.5, 0.2, 0.3]), {"k1": 0.04, "k2": 3e7, "k3": 1e4}
    np.testing.assert_allclose(sf.study.experiments[0].observables(y, p), [0.5, 1.0], rtol=1e-15)
