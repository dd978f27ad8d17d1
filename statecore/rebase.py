"""Rebase help for a refused intervention (docs/protocol.md § Rebase help): the box-level change
between the box list a reviewer was shown at its ``base_version`` and the job's box list now.

Computed only when a submission is refused (a 409), never on the way to a 200. The base is the
``box_list`` of the last ``PAUSE_OPENED`` event at or before ``base_version`` (a reviewer is only
ever shown boxes by a pause), read from the end of the job's event list, a few events at a time.
"""

from __future__ import annotations

import json
from typing import Any

from . import eventrefs
from .models import Box

_CHUNK = 32
_PAUSE_OPENED = '"type":"PAUSE_OPENED"'  # as _lib.lua's append_event spells every event


def box_changes(base: list[Box], now: list[Box]) -> dict[str, list[Any]]:
    """Matched by ``box_id``: boxes only in ``now`` are added, only in ``base`` removed; a box in
    both whose bbox differs is moved, whose label differs relabelled (it can be both)."""
    before = {b.box_id: b for b in base}
    after = {b.box_id: b for b in now}
    moved, relabelled = [], []
    for box_id, b in after.items():
        old = before.get(box_id)
        if old is None:
            continue
        if tuple(old.bbox) != tuple(b.bbox):
            moved.append({"box_id": box_id, "from": list(old.bbox), "to": list(b.bbox)})
        if old.label != b.label:
            relabelled.append({"box_id": box_id, "from": old.label, "to": b.label})
    return {
        "added": [b.model_dump(mode="json") for k, b in after.items() if k not in before],
        "removed": [b.model_dump(mode="json") for k, b in before.items() if k not in after],
        "moved": moved,
        "relabelled": relabelled,
    }


async def base_pause(r: Any, job_id: str, base_version: int) -> dict[str, Any] | None:
    """The data of the last PAUSE_OPENED event at or before ``base_version`` (None: there is none).
    Read by position from the end of the list, which a restored job's ``event_base`` (ids that do not
    start at 1: ``statecore.eventrefs``) leaves as it is."""
    stop = -1
    while True:
        raws = await eventrefs.read(r, job_id, stop - _CHUNK + 1, stop)  # a pause's boxes may be the meta's
        for raw in reversed(raws):
            if _PAUSE_OPENED not in raw:
                continue
            event = json.loads(raw)
            if event["version"] <= base_version:
                data: dict[str, Any] = event["data"]
                return data
        if len(raws) < _CHUNK:
            return None
        stop -= _CHUNK


async def rebase_for(r: Any, job_id: str, base_version: int, snapshot: dict[str, Any] | None) -> dict[str, Any]:
    """The ``rebase`` member of a refused intervention's 409 body, against ``snapshot`` (the job as
    the same 409 shows it). ``base_found`` is false when no pause had opened by ``base_version`` or
    it lies beyond the job's version: then there is nothing to compare and the lists are empty."""
    version = int(snapshot["version"]) if snapshot else 0
    base = await base_pause(r, job_id, base_version) if snapshot and base_version <= version else None
    return answer(base, base_version, snapshot)


def answer(base: dict[str, Any] | None, base_version: int, snapshot: dict[str, Any] | None) -> dict[str, Any]:
    """The ``rebase`` member from the data of the pause opened at ``base_version`` (``base``: its
    PAUSE_OPENED data, None when there is none) and the job as the 409 shows it; the one place the
    answer is shaped, for Redis's history and the archive's alike."""
    version = int(snapshot["version"]) if snapshot else 0
    out: dict[str, Any] = {
        "base_version": base_version,
        "version": version,
        "base_found": base is not None,
        "base_pause_token": base["active_pause"]["pause_token"] if base else None,
    }
    if base is None:
        out.update({"added": [], "removed": [], "moved": [], "relabelled": []})
    else:
        now = [Box(**b) for b in (snapshot or {}).get("box_list", [])]
        out.update(box_changes([Box(**b) for b in base["box_list"]], now))
    return out
