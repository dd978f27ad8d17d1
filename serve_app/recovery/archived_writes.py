"""Writes to a job Redis no longer holds, answered as Redis answered them before the job expired
(docs/protocol.md § Archive): a finished job's records leave Redis after the retention, but its
client may come back later (a rerun ``hitl submit``, a retried intervention, a stale tab's cancel).

- ``POST /jobs`` under an ``Idempotency-Key``: a replay of a creation is answered before admission
  control, from Redis's record while it lasts (its script answers, atomically), else from the
  archive: the original job's response (202, ``Idempotent-Replayed: true``), or 409
  ``IDEMPOTENCY_CONFLICT`` with the archived snapshot for another image or quorum. Only a real new
  creation is refused for backlog: a replay creates no work.
- ``POST /jobs/{id}/interventions`` and ``/cancel``: the answers the scripts give a finished job, in
  their order (``statecore/lua/consume_pause.lua``, ``cancel.lua``), with the archived snapshot and
  ``rebase`` computed from the archived history; a recorded ``intervention_id`` replays its
  response. The archive's audit chain is closed: these answers are not appended to it.

An archive that cannot be read answers like one without the job (docs/archive.md § Reads): a 404
for a job's write, a new creation for a key (the archive's outage does not stop submissions).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError

from hitl_review.statecore import decide, errors, keys, rebase, scripts
from hitl_review.statecore.ids import payload_hash
from hitl_review.statecore.models import InterventionRequest, JobSnapshot
from hitl_review.statecore.states import JobStatus
from hitl_review.statecore.store import Reply, Store

from ..routes.admission import Admission

if TYPE_CHECKING:
    from hitl_review.archive.db import Archive
    from hitl_review.archive.reads import ArchivedCreation, ArchivedView, MirroredCreation
    from hitl_review.statecore.nodes import Detection

log = logging.getLogger("hitl.archive")

CONFLICT = "this Idempotency-Key was already used for a different image, review_quorum, quorum_policy or boxes"


async def _read(archive: Archive | None, fn: Any, *args: Any) -> Any:
    """``archive.reads.<fn>(archive, *args)`` off the event loop; None without an archive or when it
    cannot be read."""
    if archive is None:
        return None
    try:
        return await asyncio.to_thread(fn, archive, *args)
    except SQLAlchemyError as e:
        log.warning("archive read failed (%s): %s: %s", fn.__name__, type(e).__name__, e)
        return None


async def keyed_creation(
    store: Store,
    archive: Archive | None,
    admission: Admission | None,
    submitter: str,
    idem_key: str,
    image_sha256: str,
    review_quorum: int,
    quorum_policy: str = "all",
    boxes: list[Detection] | None = None,
) -> Reply | None:
    """A creation under ``idem_key``, before anything is stored: the archive's replay (a Reply), its
    409, or None to go on and create. Redis's record, while it lasts, is left to the creation's own
    script (which answers the replay atomically) and skips admission control; without either record
    this is a new job, and only then may the backlog refuse it (429)."""
    if not await store.r.exists(keys.create_idem(submitter, idem_key)):
        from hitl_review.archive import reads

        fingerprint = decide.create_fingerprint(image_sha256, review_quorum, quorum_policy, boxes)
        found: ArchivedCreation | None = await _read(archive, reads.creation, submitter, idem_key)
        if found is not None:
            if found.fingerprint != fingerprint:
                raise errors.IdempotencyConflict(CONFLICT, job_id=found.job_id, snapshot=found.snapshot)
            return Reply(202, decide.create_response(found.job_id, fingerprint), True, found.job_id)
        if (replay := await _mirrored_creation(store, archive, submitter, idem_key, fingerprint)) is not None:
            return replay
        if await store.r.exists(keys.create_idem(submitter, idem_key)):
            return None  # the job is back (restored from the mirror): its script answers the replay
        if admission is not None:
            await admission.admit_job()
    return None


async def _mirrored_creation(
    store: Store, archive: Archive | None, submitter: str, idem_key: str, fingerprint: str
) -> Reply | None:
    """A creation Redis lost and the live mirror holds (docs/protocol.md § Redis outages): a live job
    is restored first (its creation record comes back with it, and the creation script answers the
    replay: None); a finished one is answered from its row's creation record, as the script would."""
    from hitl_review.archive import reads

    found: MirroredCreation | None = await _read(archive, reads.mirrored_creation, submitter, idem_key)
    if found is None:
        return None
    if not found.ended and store.on_missing is not None:
        await store.on_missing(found.job_id)
        return None
    if found.record is None:
        return None
    if found.record.get("image_sha") != fingerprint:
        snapshot = found.view.snapshot.model_dump(mode="json") if found.view is not None else None
        raise errors.IdempotencyConflict(CONFLICT, job_id=found.job_id, snapshot=snapshot)
    return Reply(202, found.record["response"], True, found.job_id)


async def _view(archive: Archive | None, job_id: str, missing: errors.JobNotFound) -> ArchivedView:
    from hitl_review.archive import reads

    view: ArchivedView | None = await _read(archive, reads.job, job_id)
    if view is None:
        raise missing
    return view


def _refuse(code: str, job_id: str, snapshot: dict[str, Any]) -> errors.HitlError:
    """The typed 409 the scripts' ``code`` stands for, with their message and ``snapshot``."""
    try:
        scripts.raise_for([code, []], job_id, lambda _meta: snapshot)
    except errors.HitlError as e:
        return e
    raise AssertionError(f"{code} is not a refusal")


def rebase_from_history(history: list[Any], base_version: int, snapshot: dict[str, Any]) -> dict[str, Any]:
    """``statecore.rebase.rebase_for`` over the archived events: the boxes of the last pause opened
    at or before ``base_version`` against the job's box list now."""
    base = None
    if base_version <= int(snapshot["version"]):
        base = next((e.data for e in reversed(history) if e.type == "PAUSE_OPENED" and e.version <= base_version), None)
    return rebase.answer(base, base_version, snapshot)


async def intervene(
    store: Store,
    archive: Archive | None,
    job_id: str,
    req: InterventionRequest,
    who: str,
    *,
    role: str = "",
    proxy_user: str = "",
) -> Reply:
    """``Store.intervene`` (``role``, ``proxy_user``: what its audit entry records), or for a job only
    the archive holds, the answer its script gave a
    finished job: 400 for a box outside the image, the recorded response for a replayed
    ``intervention_id`` (409 ``IDEMPOTENCY_CONFLICT`` for another body or reviewer), then 409
    ``JOB_CANCELLED``, ``VERSION_CONFLICT`` or ``PAUSE_NOT_ACTIVE``, each with ``rebase``."""
    try:
        return await store.intervene(job_id, req, who, role=role, proxy_user=proxy_user)
    except errors.JobNotFound as missing:
        view = await _view(archive, job_id, missing)
    from hitl_review.archive import reads

    snap: JobSnapshot = view.snapshot
    decide.check_bboxes_in_image(req.subjects or [], snap.image.width, snap.image.height)
    rec = await _read(archive, reads.intervention_record, job_id, req.intervention_id)
    if rec is not None:
        phash, _, response = rec.partition("\n")
        if phash == payload_hash(req.hashed_body(), who):
            return Reply(200, response, True, job_id)
        code = "IDEMPOTENCY_CONFLICT"
    elif snap.status == JobStatus.CANCELLED:
        code = "JOB_CANCELLED"
    elif req.base_version != snap.version:
        code = "VERSION_CONFLICT"
    else:
        code = "PAUSE_NOT_ACTIVE"  # a finished job waits for nobody
    body = snap.model_dump(mode="json")
    e = _refuse(code, job_id, body)
    history = await _read(archive, reads.events, job_id, 0) or []
    e.details["rebase"] = rebase_from_history(history, req.base_version, body)
    raise e


async def cancel(
    store: Store,
    archive: Archive | None,
    job_id: str,
    who: str,
    *,
    role: str = "",
    reason: str = "",
    proxy_user: str = "",
) -> JobSnapshot:
    """``Store.cancel`` (``role``, ``reason``, ``proxy_user``: what its audit entry records), or for a
    job only the archive holds, its script's answer to a finished
    job: the snapshot again for a cancelled one (a cancel is idempotent), 409 ``JOB_TERMINAL``
    for one that ended otherwise."""
    try:
        return await store.cancel(job_id, who, role=role, reason=reason, proxy_user=proxy_user)
    except errors.JobNotFound as missing:
        view = await _view(archive, job_id, missing)
    if view.snapshot.status == JobStatus.CANCELLED:
        return view.snapshot
    raise _refuse("JOB_TERMINAL", job_id, view.snapshot.model_dump(mode="json"))
