"""The documentation site: it builds with ``mkdocs build --strict`` (broken links, missing anchors and
unreadable docstrings fail), and its generated parts come from their sources: the layer table from
tests/test_layers.py's ``LAYERS``, the benchmark tables from benchmarks/results/*.json."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _hooks():
    spec = importlib.util.spec_from_file_location("diffsoup_docs_hooks", DOCS / "_gen" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _hooks()


def test_the_site_builds_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.fail("mkdocs is not installed: pip install -e .[docs] (./run installs it)")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    design = (tmp_path / "site" / "design" / "index.html").read_text(encoding="utf-8")
    assert "diffsoup/inference/fitting/" in design and "<!-- generate:" not in design
    reference = (tmp_path / "site" / "reference" / "inference" / "index.html").read_text(encoding="utf-8")
    assert 'id="diffsoup.inference.fit"' in reference and 'id="diffsoup.inference.Study"' in reference


def test_the_layer_table_is_generated_from_LAYERS():
    table = hooks.layer_table()
    layers = hooks.layers()
    rows = [line for line in table.splitlines()[2:]]
    assert len(rows) == len(layers)
    # every module once, in layer order, with its layer number as test_layers.py gives it
    numbers = [float(row.split("|")[1]) for row in rows]
    assert numbers == sorted(numbers)
    assert "| 5.3 | `diffsoup/inference/fitting/` | Fitting a lowered study |" in table
    design = (DOCS / "design.md").read_text(encoding="utf-8")
    assert design.count("<!-- generate: layers -->") == 1
    assert "| 0 | `diffsoup/_settings.py`" not in design  # the table is not also written by hand


def test_the_kinds_of_function_level_imports_are_generated_from_test_layers():
    table = hooks.deferred_imports_table()
    kinds = hooks._test_layers_constant("DEFERRED_IMPORT_KINDS")
    assert len(table.splitlines()) == 2 + len(kinds) + 1  # header, a row per kind, the cycle-breaking row
    assert "| optional or heavy third-party package | `dask`" in table and "`diffsoup.formats`" in table
    design = (DOCS / "design.md").read_text(encoding="utf-8")
    assert design.count("<!-- generate: imports -->") == 1 and "| optional or heavy" not in design


def test_benchmark_tables_come_from_the_json(tmp_path, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    (results / "bench_x.json").write_text(json.dumps({
        "machine": {"cpu": "Test CPU", "cpu_count": 2, "started": "2026-01-02T03:04:05"},
        "rows": [{"n": 10, "a": {"s": 2.0}, "b_s": 4.0}, {"n": 20000, "a": {"s": 3.0}, "b_s": 1.5}],
        "table": "## Heading\n\n| x |\n| --- |\n| 1 |",
    }))  # fmt: skip
    monkeypatch.setattr(hooks, "RESULTS", results)
    out = hooks.expand("<!-- generate: benchmark bench_x.json rows=rows cols=n,time a:a.s,a over b:a.s/b_s -->\n")
    assert "*`benchmarks/results/bench_x.json`; Test CPU, 2 cores; measured 2026-01-02*" in out
    assert "| n | time a | a over b |" in out and "| 10 | 2 | 0.5x |" in out and "| 20,000 | 3 | 2x |" in out
    stored = hooks.expand("<!-- generate: benchmark bench_x.json -->")
    assert "**Heading**" in stored and "| 1 |" in stored  # a stored table's headings do not break the page's
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['colums'\]; use table=, rows=, cols="):
        hooks.expand("<!-- generate: benchmark bench_x.json colums=n -->")
    with pytest.raises(FileNotFoundError, match="bench_y.json does not exist"):
        hooks.expand("<!-- generate: benchmark bench_y.json -->")
    with pytest.raises(ValueError, match="unknown generated part 'tables'"):
        hooks.expand("<!-- generate: tables -->")


def test_every_results_file_the_pages_name_exists_and_every_table_on_the_benchmarks_page_is_generated():
    page = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    named = re.findall(r"<!-- generate: benchmark (\S+)", page)
    assert named and all((ROOT / "benchmarks" / "results" / name).is_file() for name in named)
    hand_tables = [line for line in page.splitlines() if line.startswith("|")]
    assert not hand_tables, f"tables on the benchmarks page are generated from the JSON: {hand_tables[:2]}"


def test_the_api_pages_name_every_public_export():
    names = hooks.exported_names("diffsoup.inference")
    assert {"fit", "Study", "Parameter", "SolverOptions", "lower"} <= set(names)
    assert hooks.api_blocks("diffsoup.petab").startswith("::: diffsoup.petab.")
