"""A study split into shards for ``ds.distributed.run``: the experiments of each shard (owners kept
together, balanced by measured values), the study's fingerprint that keys the shards' state on a
worker, a shard's lowered study (one device: the shard's process owns its devices), and one
request served by a shard (an evaluation's part, or a compilation)."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import cloudpickle

from ..inference.objective._balance import balance_owners
from ..inference.objective._lower import LoweredStudy, lower
from ..inference.objective._parts import AbstractPart
from ..inference.study._study import Study


def study_fingerprint(study: Study, options: Mapping[str, Any]) -> str:
    """A 16-hex-digit SHA-256 of the study (pickled) and the lowering options."""
    h = hashlib.sha256()
    h.update(cloudpickle.dumps((study, sorted(options.items(), key=lambda kv: kv[0]))))
    return h.hexdigest()[:16]


def shard_members(study: Study, lanes: int) -> list[list[int]]:
    """Experiment indices (study order) of each shard, by ``balance_owners`` over ``lanes``; empty
    shards are dropped."""
    exps = study.experiments
    index = {e.id: i for i, e in enumerate(exps)}
    ordered = balance_owners(study, lanes).experiments
    owners: list[list[int]] = []
    seen: dict[Any, int] = {}
    for e in ordered:
        k = e.groups[study.levels[0]] if study.levels else e.id
        if k not in seen:
            seen[k] = len(owners)
            owners.append([])
        owners[seen[k]].append(index[e.id])
    c = math.ceil(len(owners) / lanes)
    shards = [sorted(i for o in owners[b * c : (b + 1) * c] for i in o) for b in range(lanes)]
    return [s for s in shards if s]


def shard_lowering_options(options: Mapping[str, Any]) -> dict:
    """Lowering options for a shard: one device (the shard's process owns its devices)."""
    out = dict(options)
    layout = out.get("layout")
    if layout is not None:
        out["layout"] = dataclasses.replace(layout, mesh=None, processes=None)
    return out


def build_shard(study: Study, options: Mapping[str, Any], members: Sequence[int]) -> LoweredStudy:
    """A ``LoweredStudy`` of the whole problem (the same theta) evaluating only ``members``."""
    return lower(study, **shard_lowering_options(options)).restrict(members)


def serve_request(shard: LoweredStudy, mode: str, argument: Any) -> AbstractPart | None:
    """One request to a shard: ``("compile", modes)`` compiles (None back); an evaluation mode
    with theta gives the shard's part."""
    if mode == "compile":
        shard.compile(argument)
        return None
    return shard.evaluate(mode, argument)


def shard_key(members: Sequence[int]) -> tuple:
    """The options part of a shard's key in the worker's cache of lowered studies (the study's
    fingerprint is the other part): the experiments it evaluates."""
    return ("restrict", tuple(int(m) for m in members))
