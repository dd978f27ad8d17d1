"""The checks of what clients saw (the locust run's JSONL record) against what Redis holds."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from typing import Any

from .reading import Job
from .report import Report


def check_records(
    records: list[dict[str, Any]], jobs: dict[str, Job], rep: Report, submitter: str | None, create_idem: dict[str, str]
) -> None:
    ivs: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    creates: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("kind") == "intervention":
            ivs[(r["job_id"], r["intervention_id"])].append(r)
        elif r.get("kind") == "create":
            creates[r["idempotency_key"]].append(r)

    fresh_by_pause: dict[tuple[str, str], set[str]] = defaultdict(set)
    for (job_id, iid), rs in sorted(ivs.items()):
        ok = [r for r in rs if r.get("status") == 200]
        if not ok:
            continue
        rep.checked("replay_identical")
        hashes = {r["body_sha256"] for r in ok}
        job = jobs.get(job_id)
        stored = job.idem.get(iid) if job else None
        if len(hashes) > 1:
            rep.breach(
                "replay_identical",
                job_id,
                f"intervention {iid}: {len(hashes)} different 200 bodies "
                f"({len(ok)} answers, {sum(bool(r.get('replayed')) for r in ok)} replays)",
            )
        elif stored is not None:
            body = stored.split("\n", 1)[1] if "\n" in stored else stored
            if hashlib.sha256(body.encode()).hexdigest() not in hashes:
                rep.breach(
                    "replay_identical",
                    job_id,
                    f"intervention {iid}: the stored response differs from what the client got",
                )
        fresh = [r for r in ok if not r.get("replayed")]
        rep.checked("client_success_committed")
        if len(fresh) > 1:
            rep.breach("client_success_committed", job_id, f"intervention {iid}: {len(fresh)} fresh 200s")
        if fresh and job is not None:
            accepted = {e["data"].get("intervention_id") for e in job.events if e["type"] == "INTERVENTION_ACCEPTED"}
            if iid not in accepted:
                rep.breach(
                    "client_success_committed",
                    job_id,
                    f"intervention {iid} answered 200, but the log has no INTERVENTION_ACCEPTED for it",
                )
        if fresh and job is None:
            rep.breach(
                "client_success_committed", job_id, f"intervention {iid} answered 200 for a job Redis does not hold"
            )
        for r in fresh:
            fresh_by_pause[(job_id, r.get("pause_token", ""))].add(iid)
    for (job_id, token), iids in fresh_by_pause.items():
        if len(iids) > 1:
            rep.breach(
                "pause_consumed_once",
                job_id,
                f"clients got fresh 200s for {len(iids)} interventions on pause {token}: {', '.join(sorted(iids))}",
            )

    for key, rs in sorted(creates.items()):
        rep.checked("create_idempotent")
        ok = [r for r in rs if 200 <= r.get("status", 0) < 300]
        ids = {r.get("job_id") for r in ok}
        anchor = ok[0].get("job_id") if ok else None
        if len(ids) > 1:
            rep.breach("create_idempotent", anchor or key, f"key {key} gave jobs {sorted(map(str, ids))}")
        if len({r["body_sha256"] for r in ok}) > 1:
            rep.breach("create_idempotent", anchor or key, f"key {key}: replays differ from the first answer")
        if sum(not r.get("replayed") for r in ok) > 1:
            rep.breach(
                "create_idempotent", anchor or key, f"key {key}: {sum(not r.get('replayed') for r in ok)} fresh 202s"
            )
        for r in rs:
            if r.get("code") == "IDEMPOTENCY_CONFLICT" and anchor and r.get("job_id") != anchor:
                rep.breach("create_idempotent", anchor, f"key {key}: conflict names job {r.get('job_id')}")
        if anchor and anchor not in jobs:
            rep.breach("create_idempotent", anchor, f"key {key}: accepted job is not in Redis")
        stored = create_idem.get(key)
        if (
            stored
            and ok
            and len({r["body_sha256"] for r in ok}) == 1
            and hashlib.sha256(stored.encode()).hexdigest() != ok[0]["body_sha256"]
        ):
            rep.breach(
                "create_idempotent", anchor or key, f"key {key}: stored creation answer differs from the client's"
            )
    if submitter is None and creates:
        rep.info["create_records_unverified_against_redis"] = "no submitter name (pass --api-url and --token)"
