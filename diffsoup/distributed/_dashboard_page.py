"""diffsoup's page in the Dask dashboard (``/diffsoup``): a Bokeh application on the scheduler.

:func:`add_page` registers it on the scheduler's HTTP server beside Dask's own pages (a second
``BokehTornado`` application, as Dask's ``distributed.dashboard.scheduler.connect`` adds its own)
and links it from the navigation bar. Each open page reads the scheduler's metadata (what runs
publish, see :mod:`._dashboard_publish`) once a second and redraws only what changed:

- a headline per run (:func:`~._dashboard_views.summary_text`);
- studies: one row per study, one per shard (worker, counts by state and ``ds.Status``), the
  failing experiments with their ids, and a bar chart of experiments by status;
- campaigns (multistart fits, profiles): starts done/running/pending/failed, the best objective
  and how many starts reached it, the ledger's path, the failed tasks, and a live waterfall (each
  finished start's objective, sorted);
- ensembles: chunks written, simulations per second, failures by status.

The page runs in the scheduler's event loop: its work per second is a pass over the published
records, skipped while they have not changed.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import Any

from ._dashboard_views import (
    CAMPAIGN_COLUMNS,
    ENSEMBLE_COLUMNS,
    FAILED_TASK_COLUMNS,
    FAILING_COLUMNS,
    SHARD_COLUMNS,
    STUDY_COLUMNS,
    WATERFALL_COLUMNS,
    campaign_tables,
    ensemble_table,
    published,
    study_tables,
    summary_text,
)

logger = logging.getLogger("diffsoup.dashboard")

PAGE_NAME = "diffsoup"
REFRESH_MS = 1000
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def _status_color(status: str) -> str:
    """A bar's colour: green for solved experiments, grey for those not yet evaluated, red for failures."""
    return {"SUCCESS": "#2ca02c", "PENDING": "#7f7f7f"}.get(status, "#d62728")


def _table(columns: tuple[str, ...], title: str, height: int = 180, widths: dict | None = None):
    from bokeh.models import ColumnDataSource, DataTable, NumberFormatter, TableColumn

    source = ColumnDataSource({c: [] for c in columns})
    number = {"last_seconds": "0.000", "best": "0.00000000", "simulations_per_second": "0.0"}
    cols = [TableColumn(field=c, title=c.replace("_", " "), width=(widths or {}).get(c, 90),
                        **({"formatter": NumberFormatter(format=number[c])} if c in number else {}))
            for c in columns]  # fmt: skip
    table = DataTable(source=source, columns=cols, height=height, sizing_mode="stretch_width", index_position=None,
                      name=title)  # fmt: skip
    return source, table


def page_doc(scheduler: Any, extra: dict, doc: Any) -> None:
    """Build the page's Bokeh document (Dask's application signature: scheduler, template
    variables, document)."""
    from bokeh.layouts import column, row
    from bokeh.models import ColumnDataSource, Div
    from bokeh.plotting import figure

    doc.title = "Dask: diffsoup"
    headline = Div(text="", sizing_mode="stretch_width", name="diffsoup-summary")
    wide = {"study": 130, "campaign": 130, "ensemble": 130, "ledger": 320, "store": 320, "error": 500,
            "statuses": 320, "worker": 170, "updated": 210, "experiment": 160}  # fmt: skip
    studies_src, studies_tab = _table(STUDY_COLUMNS, "diffsoup-studies", 120, wide)
    shards_src, shards_tab = _table(SHARD_COLUMNS, "diffsoup-shards", 200, wide)
    failing_src, failing_tab = _table(FAILING_COLUMNS, "diffsoup-failing", 200, wide)
    campaigns_src, campaigns_tab = _table(CAMPAIGN_COLUMNS, "diffsoup-campaigns", 120, wide)
    failed_src, failed_tab = _table(FAILED_TASK_COLUMNS, "diffsoup-failed-tasks", 140, wide)
    ensembles_src, ensembles_tab = _table(ENSEMBLE_COLUMNS, "diffsoup-ensembles", 120, wide)

    status_src = ColumnDataSource({"status": [], "count": [], "color": []})
    status_fig = figure(x_range=[], height=260, width=420, title="Experiments by status (all studies)",
                        toolbar_location=None, name="diffsoup-status-plot")  # fmt: skip
    status_fig.vbar(x="status", top="count", width=0.8, source=status_src, color="color")
    status_fig.y_range.start = 0

    fall_src = ColumnDataSource({c: [] for c in (*WATERFALL_COLUMNS, "color")})
    fall_fig = figure(height=260, sizing_mode="stretch_width", title="Waterfall: objective of each finished start",
                      x_axis_label="start (sorted)", y_axis_label="objective", name="diffsoup-waterfall",
                      tools="pan,wheel_zoom,box_zoom,reset,hover",
                      tooltips=[("start", "@task"), ("objective", "@objective"),
                                ("campaign", "@campaign")])  # fmt: skip
    fall_fig.scatter(x="rank", y="objective", source=fall_src, size=7, color="color")

    def heading(text: str) -> Div:
        return Div(text=f"<h3 style='margin:8px 0 2px 0'>{text}</h3>", sizing_mode="stretch_width")

    doc.add_root(column(
        Div(text="<h2 style='margin:4px 0'>diffsoup</h2>"), headline,
        heading("Studies (ds.distributed.run)"), studies_tab,
        row(column(heading("Shards: placement and counts by status"), shards_tab, sizing_mode="stretch_width"),
            status_fig, sizing_mode="stretch_width"),
        heading("Failing experiments"), failing_tab,
        heading("Fits and campaigns"), campaigns_tab, fall_fig,
        heading("Failed tasks"), failed_tab,
        heading("Ensembles (to Zarr)"), ensembles_tab,
        sizing_mode="stretch_width",
    ))  # fmt: skip
    last: dict[str, str] = {}

    def changed(name: str, value: Any) -> bool:
        key = json.dumps(value, sort_keys=True, default=str)
        if last.get(name) == key:
            return False
        last[name] = key
        return True

    def update() -> None:
        try:
            studies = published(scheduler, "studies")
            campaigns = published(scheduler, "campaigns")
            ensembles = published(scheduler, "ensembles")
            stamp = {k: {i: r.get("updated") for i, r in v.items()} for k, v in
                     (("s", studies), ("c", campaigns), ("e", ensembles))}  # fmt: skip
            if not changed("stamp", stamp):
                return
            st = study_tables(studies)
            ct = campaign_tables(campaigns)
            colors = {cid: _PALETTE[i % len(_PALETTE)] for i, cid in enumerate(ct["campaigns"]["campaign"])}
            counts: Counter = Counter()
            for s in studies.values():
                counts.update(e.get("status") or "PENDING" for e in (s.get("experiments") or {}).values())
            names = sorted(counts)
            # Only what changed goes to the browser (each change is a message and a redraw there).
            text = summary_text(st, campaigns, ensembles)
            if changed("headline", text):
                headline.text = text
            for name, source, data in (
                ("studies", studies_src, st["studies"]), ("shards", shards_src, st["shards"]),
                ("failing", failing_src, st["failing"]), ("campaigns", campaigns_src, ct["campaigns"]),
                ("failed", failed_src, ct["failed"]), ("ensembles", ensembles_src, ensemble_table(ensembles)),
                ("waterfall", fall_src, dict(ct["waterfall"], color=[colors[c] for c in ct["waterfall"]["campaign"]])),
                ("status", status_src, {"status": names, "count": [counts[n] for n in names],
                                        "color": [_status_color(n) for n in names]}),
            ):  # fmt: skip
                if changed(name, data):
                    if name == "status":
                        status_fig.x_range.factors = names
                    source.data = data
        except Exception as exc:  # noqa: BLE001 (a page must not break the scheduler's loop)
            logger.warning("diffsoup page update failed: %s", exc)

    update()
    doc.add_periodic_callback(update, REFRESH_MS)
    try:
        from distributed.dashboard.components.scheduler import BOKEH_THEME, env

        doc.template = env.get_template("simple.html")
        doc.template_variables.update(extra)
        doc.theme = BOKEH_THEME
    except Exception as exc:  # noqa: BLE001 (Dask's template moved: the page without the navigation bar)
        logger.info("diffsoup page without Dask's template: %s", exc)


def _prefix(scheduler: Any) -> str:
    """The prefix of Dask's Bokeh pages on this scheduler ("/" unless ``--dashboard-prefix``)."""
    for app in getattr(scheduler.http_application, "applications", []):
        prefix = getattr(app, "_prefix", None)
        if prefix is not None and type(app).__name__.endswith("BokehTornado"):
            return prefix or "/"
    return "/"


def add_page(scheduler: Any) -> None:
    """Serve the page at ``<prefix>diffsoup`` on the scheduler's HTTP server and link it from the
    navigation bar of Dask's pages (run on the scheduler, in its event loop)."""
    from distributed.dashboard.core import BokehApplication
    from tornado.ioloop import IOLoop

    try:
        from distributed.dashboard.scheduler import template_variables

        extra = template_variables(scheduler)  # memoized: Dask's pages render this same dict
        if PAGE_NAME not in extra["pages"]:
            extra["pages"].append(PAGE_NAME)
    except Exception as exc:  # noqa: BLE001 (Dask's template variables changed: no link, the page still works)
        logger.info("diffsoup page not linked from the navigation: %s", exc)
        extra = {}
    app = BokehApplication({f"/{PAGE_NAME}": page_doc}, scheduler, prefix=_prefix(scheduler), template_variables=extra)
    scheduler.http_application.add_application(app)
    app.initialize(IOLoop.current())
    app.start()
