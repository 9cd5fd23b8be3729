"""diffsoup's dashboard page in a real browser: headless Chromium (Debian's ``chromium``, driven by
Playwright for Python through ``executable_path``) opens ``/diffsoup`` on a LocalCluster while a
study with failing experiments and a multistart fit run, and reads the run's numbers off the page
(the study's experiment count and failed ids, the campaign's starts and best objective, all
computed here independently of the page); it saves a screenshot (``docs/images/dashboard.png``
when ``DIFFSOUP_DASHBOARD_SCREENSHOT`` names that path, else under tmp).

Without Chromium or Playwright the test skips, except in CI (``CI=true``) or with
``DIFFSOUP_REQUIRE_BROWSER=1``, where it fails: ``.ci/run`` installs Chromium.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import diffsoup as ds
from diffsoup import distributed as dd
from diffsoup.inference import SolverOptions

sys.path.insert(0, os.path.dirname(__file__))
from test_study import oscillator_study, tiny_study  # noqa: E402

ROOT = str(Path(__file__).resolve().parents[1])
CHROMIUM = os.environ.get("DIFFSOUP_CHROMIUM", "/usr/bin/chromium")


def _browser_missing() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "Playwright for Python is not installed (pip install playwright; no `playwright install` needed)"
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium, or set DIFFSOUP_CHROMIUM)"
    if importlib.util.find_spec("bokeh") is None:
        return "bokeh is not installed (pip install 'diffsoup[dashboard]')"
    return None


@pytest.fixture(scope="module")
def browser():
    problem = _browser_missing()
    if problem:
        if os.environ.get("CI") == "true" or os.environ.get("DIFFSOUP_REQUIRE_BROWSER") == "1":
            pytest.fail(f"the browser test must run here (CI or DIFFSOUP_REQUIRE_BROWSER=1), but {problem}")
        pytest.skip(problem)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    local = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, resources={"GPU": 1},
                         host="127.0.0.1", dashboard_address="127.0.0.1:0",
                         env={"JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT},
                         preload=["diffsoup.distributed._worker"])  # fmt: skip
    c = Client(local, set_as_default=False)
    yield c
    c.close()
    local.close()


# Bokeh 3 draws its models in shadow roots, which innerText does not enter: collect the text nodes.
_TEXT = """() => { const out = []; const walk = (n) => { if (n.shadowRoot) walk(n.shadowRoot);
  for (const c of n.childNodes) { if (c.nodeType === 3) out.push(c.textContent);
  else if (c.nodeName !== "STYLE" && c.nodeName !== "SCRIPT") walk(c); } };
  walk(document.body); return out.join(""); }"""


def _wait_for(page, text: str, timeout: float = 30.0) -> str:
    """The page's text once it holds ``text`` (the page redraws once a second)."""
    deadline = time.monotonic() + timeout
    body = ""
    while time.monotonic() < deadline:
        body = page.evaluate(_TEXT)
        if text in body:
            return body
        time.sleep(0.25)
    raise AssertionError(f"{text!r} not on the page after {timeout} s; it shows:\n{body[:3000]}")


@pytest.mark.slow
def test_page_shows_studies_failures_and_the_best_start(browser, client, tmp_path):
    osc = oscillator_study()  # o0..o3 take ten times the steps: they fail at max_steps=60
    solver = SolverOptions(max_steps=60)
    reference = ds.lower(osc, solver=solver)
    reference.value(np.array([-1.0]))
    failed = sorted(reference.last_failures)
    assert failed == ["o0", "o1", "o2", "o3"]

    page = browser.new_page(viewport={"width": 1500, "height": 1700})
    with dd.run(osc, cluster=client, name="oscillators", solver=solver) as low:
        url = f"{low.dashboard}/diffsoup"
        page.goto(url)
        assert page.locator("a[href='diffsoup']").count() >= 1  # linked from Dask's navigation bar
        low.value(np.array([-1.0]))
        assert sorted(low.last_failures) == failed
        body = _wait_for(page, "16 experiments, 12 ok, 4 failed")
        assert "study oscillators (running)" in body
        assert "failed: o0, o1, o2, o3" in body
        for eid in failed:  # the failing-experiments table holds their ids and status
            assert page.locator(".slick-cell", has_text=eid).count() >= 1
        assert page.locator(".slick-cell", has_text="MAX_STEPS").count() >= 4

        with dd.run(tiny_study(3), cluster=client, name="tiny") as fit_low:
            ledger = tmp_path / "starts.json"
            result = ds.inference.multistart(fit_low, starts=3, seed=0, ledger_path=ledger)
        body = _wait_for(page, "3 tasks, 3 done, 0 running, 0 pending, 0 failed")
        best = f"{result.objective:.8g}"
        assert f"best objective {best}" in body, " ".join(body.split())[-2500:]
        assert str(ledger) in body
        # the waterfall: one point per finished start, the lowest at the best objective
        assert page.locator("[data-root-id] canvas, canvas").count() >= 1
    body = _wait_for(page, "study oscillators (closed)")
    for target in (tmp_path / "dashboard.png", os.environ.get("DIFFSOUP_DASHBOARD_SCREENSHOT")):
        if target:
            page.screenshot(path=str(target), full_page=True)
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000
    page.close()
