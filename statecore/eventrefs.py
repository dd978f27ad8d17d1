"""Events whose data the job's meta already holds, stored by reference (docs/protocol.md § Redis
layout): every byte of a waiting job counts, and two of its events repeat the meta byte for byte.

- ``JOB_CREATED``'s data (``height``, ``submitter``, ``width``) is the meta's ``image`` size and
  ``submitter``, which never change.
- ``PAUSE_OPENED``'s data (``active_pause``, ``box_list``) is, while the pause waits, exactly the
  meta's fields of those names.

Writing (``stored``, from ``Plan.to_json``): such an event whose data is exactly what the meta
holds after the plan (checked there, byte for byte) is stored with ``"data":"@meta"``; for a
``PAUSE_OPENED`` the script records the event's id in the meta (``pause_event``).

Keeping it true: before any plan changes ``active_pause`` or ``box_list`` (the pause consumed,
cancelled or superseded, the boxes validated), ``apply_plan`` in ``lua/_lib.lua`` writes that event
out in full from the meta as it still is, in the same atomic step, and drops ``pause_event``. So a
reference always means what the pause opened with.

Reading (``read``, ``read_after``): a range of events that holds a reference is read again together
with the meta fields in one MULTI and each reference replaced by the data it stands for, byte for
byte: every reader (SSE, history, the archive's copy, rebase) gets the event exactly as if it were
stored whole.

Ids and positions: an event's id is 1-based position + the meta's ``event_base`` (absent: 0). Only a
job restored from the mirror has one (``statecore.restore``): its new list starts after the ids the
lost one held. ``read_after`` reads by id; ``read`` by position (negative: from the end), which is
what a reader that walks back from the newest event (rebase) wants whatever the base.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from . import keys
from .ids import canonical_json

REF = "@meta"  # an event's data in the stored event: rebuilt from the job's meta
_STORED_REF = f'"data":"{REF}"}}'  # how a stored event ends when its data is a reference
PAUSE_FIELDS = ("active_pause", "box_list")  # PAUSE_OPENED's data, in canonical (sorted) order
META_FIELDS = ("image", "submitter", *PAUSE_FIELDS)  # what the references are rebuilt from
BASE = "event_base"  # the meta field: the id just before the first event the list holds (absent: 0)


def _created(image: Mapping[str, Any], submitter: str) -> dict[str, Any]:
    """JOB_CREATED's data (statecore.decide.plan_create) from the meta's image and submitter."""
    return {"submitter": submitter, "width": image["width"], "height": image["height"]}


def stored(events: list[tuple[str, dict[str, Any]]], meta: Mapping[str, str | None]) -> list[Any]:
    """The data of a plan's ``events`` as stored, ``meta`` being what the plan writes to the meta:
    ``REF`` for a JOB_CREATED or the last PAUSE_OPENED whose data that meta holds byte for byte."""
    out: list[Any] = [d for _, d in events]
    pause_seen = False
    for i in range(len(events) - 1, -1, -1):
        kind, d = events[i]
        if kind == "PAUSE_OPENED" and not pause_seen:
            pause_seen = True
            if set(d) == set(PAUSE_FIELDS) and all(meta.get(f) == canonical_json(d[f]) for f in PAUSE_FIELDS):
                out[i] = REF
        elif kind == "JOB_CREATED":
            image, submitter = meta.get("image"), meta.get("submitter")
            if image and submitter is not None and d == _created(json.loads(image), submitter):
                out[i] = REF
    return out


def has_refs(raw: str) -> bool:
    return raw.endswith(_STORED_REF)


def expand(raw: str, values: list[str | None]) -> str:
    """``raw`` (one stored event) with a reference replaced by the data it stands for; ``values``:
    the meta's ``META_FIELDS``, read in the same atomic step as ``raw``."""
    if not has_refs(raw):
        return raw
    meta = dict(zip(META_FIELDS, values, strict=True))
    if '"type":"PAUSE_OPENED"' in raw:
        data = "{" + ",".join(f'"{f}":{meta[f]}' for f in PAUSE_FIELDS if meta[f]) + "}"  # as _lib.lua
    elif '"type":"JOB_CREATED"' in raw and meta["image"]:
        data = canonical_json(_created(json.loads(meta["image"]), meta["submitter"] or ""))
    else:
        return raw  # nothing to rebuild it from (the job's records expired meanwhile)
    return raw[: -len(_STORED_REF)] + f'"data":{data}}}'


async def read(r: Any, job_id: str, start: int, stop: int) -> list[str]:
    """``LRANGE`` of the job's events, with any reference expanded (see the module's docstring)."""
    jk = keys.job(job_id)
    raws: list[str] = await r.lrange(jk.events, start, stop)
    if not any(has_refs(raw) for raw in raws):
        return raws
    async with r.pipeline(transaction=True) as pipe:  # the events and the meta they refer to, together
        pipe.lrange(jk.events, start, stop)
        pipe.hmget(jk.meta, *META_FIELDS)
        raws, values = await pipe.execute()
    return [expand(raw, values) for raw in raws]


async def read_after(r: Any, job_id: str, after: int, count: int) -> list[str]:
    """The job's events with id > ``after``, ``count`` at most, oldest first, references expanded.
    One round trip as a rule: the list's range is read with the meta's ``event_base`` and read again
    only when the base is not 0 (a restored job) or the range holds a reference. An ``after`` at or
    below the base (an id lost with Redis) reads the whole list."""
    jk = keys.job(job_id)
    after = max(after, 0)
    async with r.pipeline(transaction=True) as pipe:
        pipe.lrange(jk.events, after, after + count - 1)
        pipe.hget(jk.meta, BASE)
        raws, found = await pipe.execute()
    base = int(found or 0)
    if base == 0 and not any(has_refs(raw) for raw in raws):
        return list(raws)
    for _ in range(3):  # the base moves only when the job is restored: between two reads, hardly ever
        start = max(after - base, 0)
        async with r.pipeline(transaction=True) as pipe:
            pipe.lrange(jk.events, start, start + count - 1)
            pipe.hmget(jk.meta, BASE, *META_FIELDS)
            raws, (found, *values) = await pipe.execute()
        if int(found or 0) == base:
            return [expand(raw, values) for raw in raws]
        base = int(found or 0)
    raise RuntimeError(f"the events of {job_id} kept being restored while read")
