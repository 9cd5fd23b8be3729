"""diffsoup's routes and page on the Dask scheduler's HTTP server: the state of running studies,
campaigns and ensembles.

Runs publish their state in the scheduler's metadata (``client.set_metadata(["diffsoup", kind,
<id>], ...)``, throttled and asynchronous: :mod:`diffsoup.distributed._dashboard_publish`):
``ds.distributed.run``'s studies, ``checkpointed_map``'s campaigns (multistart fits, profiles) and
``Ensemble.to_zarr``'s writes. :func:`install` (run on the scheduler) adds

- JSON routes reading that metadata (bokeh is not needed: plain JSON next to the Dask dashboard,
  on the same host and port): ``/diffsoup/studies.json``, ``/diffsoup/campaigns.json``,
  ``/diffsoup/ensembles.json``, and ``/diffsoup/studies/<fingerprint>.json``;
- where bokeh is installed, the page ``/diffsoup`` (:mod:`._dashboard_page`), linked from the
  dashboard's navigation bar.

``GET /diffsoup/studies.json`` answers::

    {
      "schema": "diffsoup.studies/1",
      "studies": {
        "<fingerprint>": {                 # SHA-256 (hex, 16 digits) of the study and lower options
          "name": str,                     # run(..., name=) or "study"
          "state": "starting" | "running" | "closed",
          "evaluations": int,              # evaluations sent to the workers so far
          "last_mode": str | null,         # "value", "value_and_grad", "residuals", "jacobian",
                                           # "gauss_newton", "hessian"
          "last_seconds": float | null,    # wall time of the last evaluation
          "rebuilds": int,                 # shards compiled again after a worker was lost
          "updated": str,                  # ISO 8601 UTC
          "shards": [{"shard": int, "worker": str | null, "experiments": int}],
          "experiments": {
            "<experiment id>": {
              "shard": int,                # the shard (Dask task) evaluating it
              "worker": str | null,        # worker address holding the shard
              "state": "pending" | "ok" | "failed",
              "status": str | null,        # ds.Status name of the last solve ("SUCCESS", ...)
              "steps": int                 # accepted steps at the last evaluation (-1 before any)
            }
          }
        }
      }
    }

``GET /diffsoup/studies/<fingerprint>.json`` answers one study's object (404 if unknown).

``GET /diffsoup/campaigns.json`` answers ``{"schema": "diffsoup.campaigns/1", "campaigns": {<id>:
record}}`` and ``GET /diffsoup/ensembles.json`` ``{"schema": "diffsoup.ensembles/1", "ensembles":
{<id>: record}}``, the records as :class:`~._dashboard_publish.CampaignPublisher` and
:class:`~._dashboard_publish.EnsemblePublisher` document them (ids: 16 hex digits of SHA-256 of
the ledger's or store's path).
"""

from __future__ import annotations

import json
from typing import Any

from ._dashboard_page import add_page
from ._dashboard_views import published

SCHEMA = "diffsoup.studies/1"
SCHEMAS = {"studies": SCHEMA, "campaigns": "diffsoup.campaigns/1", "ensembles": "diffsoup.ensembles/1"}
ROUTE = "/diffsoup/studies.json"
PAGE = "/diffsoup"
METADATA_KEY = ("diffsoup", "studies")
BOKEH_HINT = "pip install 'diffsoup[dashboard]' (bokeh>=3.1)"


def bokeh_available() -> bool:
    """Whether Dask's Bokeh dashboard (and so diffsoup's page) can be served here."""
    try:
        import distributed.dashboard.core  # noqa: F401 (checks bokeh's version too)
    except Exception:  # noqa: BLE001 (ImportError, or Dask's warning turned error)
        return False
    return True


def install(dask_scheduler: Any = None) -> str:
    """Run on the scheduler (``client.run_on_scheduler(install)``): add the routes and, where
    bokeh is installed, the page, once.

    Returns:
        The page's path (``/diffsoup``), or the studies route's where the page needs bokeh.
    """
    from tornado import web

    scheduler = dask_scheduler
    if getattr(scheduler, "_diffsoup_route", None):
        return scheduler._diffsoup_route

    class Published(web.RequestHandler):
        def get(self, kind: str, fp: str | None = None) -> None:
            records = published(scheduler, kind)
            self.set_header("Content-Type", "application/json")
            if fp is None:
                self.write(json.dumps({"schema": SCHEMAS[kind], kind: records}))
                return
            if fp not in records:
                self.set_status(404)
                self.write(json.dumps({"schema": SCHEMAS[kind], "error": f"no {kind[:-1]} {fp!r}"}))
                return
            self.write(json.dumps(records[fp]))

    app = getattr(scheduler, "http_application", None)
    if app is None:
        raise RuntimeError("the scheduler serves no HTTP (start it with a dashboard address)")
    app.add_handlers(r".*", [(r"/diffsoup/(studies|campaigns|ensembles)\.json", Published),
                             (r"/diffsoup/(studies|campaigns|ensembles)/([0-9a-f]+)\.json", Published)])  # fmt: skip
    # add_handlers appends a host rule; Tornado tries host rules in order, so move ours (the last)
    # first, where no catch-all route of Dask's can hide it.
    rules = app.default_router.rules
    rules.insert(0, rules.pop())
    route = ROUTE
    if bokeh_available():
        add_page(scheduler)
        route = PAGE
    scheduler._diffsoup_route = route
    return route


def page_line(client: Any) -> str | None:
    """One line saying where diffsoup's page is (or, without bokeh, how to get it and where the
    JSON is), after installing it on ``client``'s scheduler; None where the scheduler serves no HTTP."""
    url = dashboard_url(client)
    if url is None:
        return None
    try:
        route = client.run_on_scheduler(install)
    except Exception:  # noqa: BLE001
        return None
    if route == PAGE:
        return f"diffsoup page: {url}{PAGE}"
    return f"diffsoup page: {BOKEH_HINT} on the scheduler; meanwhile JSON at {url}{ROUTE}"


def dashboard_line(client: Any) -> str | None:
    """``Dask dashboard: <url>/status; diffsoup page: <url>/diffsoup`` (without bokeh on the
    scheduler, how to get the page and where its JSON is), for the ``diffsoup`` command's output;
    None where the scheduler serves no HTTP."""
    url = dashboard_url(client)
    if url is None:
        return None
    page = page_line(client)
    return f"Dask dashboard: {url}/status" + (f"; {page}" if page else "")


def dashboard_url(client: Any) -> str | None:
    """``http://host:port`` of the scheduler's HTTP server (the Dask dashboard, which also serves
    diffsoup's routes and page), or None when the scheduler serves none."""
    info = client.scheduler_info()
    port = (info.get("services") or {}).get("dashboard")
    if port is None:
        return None
    scheme, _, rest = info["address"].partition("://")
    host = "127.0.0.1" if scheme == "inproc" else rest.rsplit(":", 1)[0]  # in-process: the local host
    return f"http://{host}:{port}"
