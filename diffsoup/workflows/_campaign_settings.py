"""The settings a campaign ran with, beside its ledger: a rerun with other ones is refused before any work.

The ledger's items fingerprint each start (its point, the optimizer with its options, the study's
digest, the ``hierarchical`` choice), so ``checkpointed_map`` refuses a rerun whose starts differ;
but it finds that out only when it runs, after a cluster has started, and it cannot say what
changed. ``diffsoup campaign`` therefore writes the settings that decide the starts into
``<out>/campaign-settings.json`` and :func:`check_campaign_settings` compares them with the new
ones before the study is lowered or a cluster starts: one line naming each change (``method trf,
now fides``) and what to type (``--restart``, or the earlier settings).

The number of starts is not among them: the start points are a stream (point ``i`` depends on the
seed alone), so a campaign of 40 starts rerun with ``--starts 44`` keeps its 40 and runs 4 more,
and one rerun with fewer starts uses the first ones. A ledger without the file (an earlier
diffsoup's) is checked by its fingerprints only, when the campaign runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

SETTINGS_FILE = "campaign-settings.json"
# What decides a campaign's starts (besides their number), in the order a conflict names them.
COMPARED = ("study_digest", "method", "hessian", "max_nfev", "seed", "hierarchical")


def campaign_settings(settings: Mapping[str, Any], digest: str) -> dict:
    """The settings of a campaign as the file holds them (``settings``: the resolved ``[fit]``
    settings; the Hessian is fides' only, None for the other methods)."""
    return {"study_digest": digest, "method": settings["method"],
            "hessian": settings["hessian"] if settings["method"] == "fides" else None,
            "max_nfev": settings["max_nfev"], "seed": settings["seed"], "hierarchical": settings["hierarchical"],
            "starts": settings["starts"]}  # fmt: skip


def _value(key: str, value: Any) -> str:
    if key == "hierarchical":
        return {None: "the default (noise levels)", True: "every parameter that qualifies", False: "none"}.get(
            value, ", ".join(value) if isinstance(value, list) else str(value))  # fmt: skip
    if key == "max_nfev" and value is None:
        return "the optimizer's default"
    return str(value)


def _flag(key: str, value: Any) -> str:
    """What to type to give ``value`` again."""
    if key == "study_digest":
        return "the study file as it was"
    if key == "hierarchical":
        if isinstance(value, list):
            return f"hierarchical = {json.dumps(value)} in the file's [fit]"
        return {True: "--hierarchical", False: "--no-hierarchical"}.get(value, "neither --hierarchical nor --no-hierarchical")  # fmt: skip
    if value is None:
        return f"no --{key.replace('_', '-')}"
    return f"--{key.replace('_', '-')} {value}"


def settings_changes(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The keys of :data:`COMPARED` whose values differ (the Hessian only where the method is the same)."""
    changed = [key for key in COMPARED if before.get(key) != now.get(key)]
    return [key for key in changed if key != "hessian" or "method" not in changed]


def check_campaign_settings(out: Path, now: Mapping[str, Any], ledger_name: str = "campaign.json") -> None:
    """Refuse a rerun of the campaign in ``out`` whose settings (:func:`campaign_settings`) differ
    from those its ledger was written with.

    Raises:
        diffsoup.store.LedgerConflictError: naming each change and what to type: ``--restart``, or
            the earlier settings.
    """
    from ..store import LedgerConflictError

    path, ledger = Path(out) / SETTINGS_FILE, Path(out) / ledger_name
    if not ledger.is_file() or not path.is_file():
        return
    try:
        before = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # unreadable: the ledger's fingerprints decide
    changed = settings_changes(before, now)
    if not changed:
        return
    what = "; ".join("the study file changed" if k == "study_digest" else
                     f"{k.replace('_', ' ')} {_value(k, before.get(k))}, now {_value(k, now.get(k))}" for k in changed)  # fmt: skip
    earlier = ", ".join(_flag(k, before.get(k)) for k in changed)
    raise LedgerConflictError(f"the campaign in {out} ran with other settings ({what}): its ledger {ledger} holds other "
                              f"starts. Run it with --restart to start anew (the ledger is kept as a .bak), with the "
                              f"earlier settings ({earlier}), or with another --out.")  # fmt: skip


def write_campaign_settings(out: Path, now: Mapping[str, Any]) -> Path:
    """Write ``<out>/campaign-settings.json``."""
    from ..store import write_summary

    return write_summary(Path(out) / SETTINGS_FILE, dict(now))
