"""The queue's small stats panel: decisions per reviewer and their time to decision.

Computed from what the API already returns, cheaply: the job listing names the finished jobs, and
a finished job's event history (``PAUSE_OPENED`` … ``INTERVENTION_ACCEPTED``, docs/protocol.md
§ Events) never changes, so each job's history is read once and kept. Live jobs are left out:
their stream does not end, and their decisions are counted once they finish. The policies' figures
are the deployment's own, read from ``/metrics`` (serve_app's policy_metrics: the same counters the
live check drops a policy by), so they never say which job was a spot check: only how many there were.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from hitl_review.client import HitlClient
from hitl_review.client.times import parse_time
from hitl_review.statecore.models import Event
from hitl_review.statecore.states import TERMINAL

from .queue import format_age

RECENT_JOBS = 200  # finished jobs looked at (the first pages of the listing)
NEW_PER_REFRESH = 25  # event histories read per refresh at most; the rest on the next one


@dataclass(frozen=True)
class Decision:
    job_id: str
    reviewer: str
    round: int
    seconds: float  # from the pause opening to the accepted intervention


def decisions_of(events: Iterable[Event]) -> list[Decision]:
    """Each accepted intervention of one job with the time its pause had been open."""
    opened: dict[str, str] = {}
    out: list[Decision] = []
    for ev in events:
        if ev.type == "PAUSE_OPENED":
            pause = ev.data.get("active_pause") or {}
            token = pause.get("pause_token")
            if token:
                opened[str(token)] = str(pause.get("created_at") or ev.at)
        elif ev.type == "INTERVENTION_ACCEPTED":
            start = parse_time(opened.get(str(ev.data.get("pause_token")), ""))
            end = parse_time(ev.at)
            if start is None or end is None:
                continue
            out.append(
                Decision(
                    job_id=ev.job_id,
                    reviewer=str(ev.data.get("reviewer") or "?"),
                    round=int(ev.data.get("round") or 1),
                    seconds=max(0.0, (end - start).total_seconds()),
                )
            )
    return out


def stats_markdown(decisions: Iterable[Decision], jobs_seen: int) -> str:
    """A small table: reviewer, decisions, median and slowest time to decision."""
    by: dict[str, list[float]] = {}
    for d in decisions:
        by.setdefault(d.reviewer, []).append(d.seconds)
    if not by:
        return f"_No decisions yet in the last {jobs_seen} finished jobs._"
    lines = [
        f"Over the last {jobs_seen} finished jobs:\n",
        "| Reviewer | Decisions | Median time to decision | Slowest |",
        "| --- | ---: | ---: | ---: |",
    ]
    for reviewer, secs in sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"| {reviewer} | {len(secs)} | {format_age(statistics.median(secs))} | {format_age(max(secs))} |")
    return "\n".join(lines)


class ReviewStats:
    """Decisions of finished jobs, read once per job and shared by every session of the app."""

    def __init__(self) -> None:
        self._by_job: dict[str, list[Decision]] = {}
        self._lock = threading.Lock()

    def refresh(self, client: HitlClient) -> str:
        terminal = {s.value for s in TERMINAL}
        finished: list[str] = []
        cursor = None
        while len(finished) < RECENT_JOBS:
            page = client.list_jobs(limit=100, cursor=cursor)
            finished.extend(j.job_id for j in page.jobs if j.status.value in terminal)
            cursor = page.next_cursor
            if not cursor:
                break
        finished = finished[:RECENT_JOBS]
        with self._lock:
            todo = [j for j in finished if j not in self._by_job][:NEW_PER_REFRESH]
        for job_id in todo:
            found = decisions_of(client.events(job_id))
            with self._lock:
                self._by_job[job_id] = found
        with self._lock:
            known = [j for j in finished if j in self._by_job]
            decisions = [d for j in known for d in self._by_job[j]]
        return stats_markdown(decisions, len(known))
