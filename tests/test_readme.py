"""The README's code runs as written: every ```python block (each in a fresh process, in a
temporary directory), and the study file of 'Study files' loads.

Markers (an HTML comment on the line before a block, invisible on GitHub):
    <!-- readme-test: continues -->          the block runs after the previous one, in its process
    <!-- readme-test: skip (REASON) -->      not run here (e.g. needs a GPU); keep these few
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
README = ROOT / "README.md"
MARKER = re.compile(r"^<!--\s*readme-test:\s*(continues|skip)\s*(?:\((.+)\))?\s*-->$")
FENCE = re.compile(r"^```(\w*)\s*$")


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


def python_programs(text: str) -> list[tuple[str, str]]:
    """(name, source) of each program: a python block and the blocks that continue it."""
    programs: list[list] = []
    for block in code_blocks(text):
        if block["language"] != "python":
            continue
        if block["marker"] == "skip":
            assert block["reason"], f"README.md:{block['line']}: a skipped block says why: skip (reason)"
            continue
        if block["marker"] == "continues":
            assert programs, f"README.md:{block['line']}: 'continues' needs a block before it"
            programs[-1][0] += f"+{block['line']}"
            programs[-1][1] += f"\n\n# README.md:{block['line']}\n" + block["code"]
        else:
            programs.append([f"README.md:{block['line']}", f"# README.md:{block['line']}\n" + block["code"]])
    return [tuple(p) for p in programs]


def test_the_block_parser_sees_markers():
    text = ("x\n```python\na = 1\n```\n<!-- readme-test: continues -->\n```python\nb = a\n```\n"
            "<!-- readme-test: skip (needs a GPU) -->\n\n```python\nimport nothing\n```\n```bash\nls\n```\n")  # fmt: skip
    assert python_programs(text) == [("README.md:3+7", "# README.md:3\na = 1\n\n# README.md:7\nb = a")]
    assert [b["language"] for b in code_blocks(text)] == ["python", "python", "python", "bash"]


PROGRAMS = python_programs(README.read_text(encoding="utf-8"))


def test_the_readme_has_python_to_run():
    blocks = [b for b in code_blocks(README.read_text(encoding="utf-8")) if b["language"] == "python"]
    assert len(blocks) >= 2 and PROGRAMS
    assert sum(b["marker"] == "skip" for b in blocks) <= 2  # skips stay few


@pytest.mark.parametrize("name, source", PROGRAMS, ids=[name for name, _ in PROGRAMS])
def test_readme_python_block_runs(name, source, tmp_path):
    script = tmp_path / "readme_block.py"
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}  # fmt: skip
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


def test_readme_study_file_loads(tmp_path):
    """The study file of 'Study files', with data files made up for its experiment."""
    from diffsoup.formats import load_study

    studies = [b for b in code_blocks(README.read_text(encoding="utf-8"))
               if b["language"] == "toml" and b["code"].lstrip().startswith("format = \"diffsoup-study/")]  # fmt: skip
    assert len(studies) == 1
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
