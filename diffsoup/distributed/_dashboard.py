"""diffsoup's route on the Dask scheduler's HTTP server: per-experiment states of running studies.

``ds.distributed.run`` installs the route on the scheduler (on any cluster, embedded or not) and
publishes its study's state in the scheduler's metadata (``client.set_metadata(["diffsoup",
"studies", <fingerprint>], ...)``) after every evaluation. The route reads that metadata; bokeh is
not needed (the route is plain JSON next to the Dask dashboard, on the same host and port).

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
"""

from __future__ import annotations

import json
from typing import Any

SCHEMA = "diffsoup.studies/1"
ROUTE = "/diffsoup/studies.json"
METADATA_KEY = ("diffsoup", "studies")


def _studies(scheduler: Any) -> dict:
    try:
        return dict(scheduler.get_metadata(keys=list(METADATA_KEY), default={}) or {})
    except Exception:  # noqa: BLE001 (metadata missing or malformed: show nothing)
        return {}


def install(dask_scheduler: Any = None) -> str:
    """Run on the scheduler (``client.run_on_scheduler(install)``): add the routes once.

    Returns:
        The route's path.
    """
    from tornado import web

    if getattr(dask_scheduler, "_diffsoup_route", False):
        return ROUTE
    scheduler = dask_scheduler

    class Studies(web.RequestHandler):
        def get(self, fp: str | None = None) -> None:
            studies = _studies(scheduler)
            self.set_header("Content-Type", "application/json")
            if fp is None:
                self.write(json.dumps({"schema": SCHEMA, "studies": studies}))
                return
            if fp not in studies:
                self.set_status(404)
                self.write(json.dumps({"schema": SCHEMA, "error": f"no study {fp!r}"}))
                return
            self.write(json.dumps(studies[fp]))

    app = getattr(scheduler, "http_application", None)
    if app is None:
        raise RuntimeError("the scheduler serves no HTTP (start it with a dashboard address)")
    app.add_handlers(r".*", [(r"/diffsoup/studies\.json", Studies), (r"/diffsoup/studies/([0-9a-f]+)\.json", Studies)])
    # add_handlers appends a host rule; Tornado tries host rules in order, so move ours (the last)
    # first, where no catch-all route of Dask's can hide it.
    rules = app.default_router.rules
    rules.insert(0, rules.pop())
    scheduler._diffsoup_route = True
    return ROUTE


def dashboard_url(client: Any) -> str | None:
    """``http://host:port`` of the scheduler's HTTP server (the Dask dashboard, which also serves
    diffsoup's route), or None when the scheduler serves none."""
    info = client.scheduler_info()
    port = (info.get("services") or {}).get("dashboard")
    if port is None:
        return None
    host = info["address"].split("://", 1)[-1].rsplit(":", 1)[0]
    return f"http://{host}:{port}"
