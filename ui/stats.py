"""The queue's small stats panel: decisions per reviewer and their time to decision, and what the
automatic policies decided and how it is going (docs/learning.md).

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

import httpx

from hitl_review.client import HitlClient
from hitl_review.client.config import tls_context
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


@dataclass(frozen=True)
class PolicyFigures:
    """The automatic policies' figures of one ``/metrics`` scrape (None: no box policy ever started)."""

    policy: str | None
    mode: str | None
    dropped: bool
    decisions: dict[str, int]  # statecore.auto_store.COUNTERS
    spot_lower: float  # the live false-accept rate's lower 95 % bound
    gate: dict[str, int]  # spot, spot_fa (statecore.auto_store.GATE_COUNTERS)


def policy_figures(metrics_text: str) -> PolicyFigures:
    """The policies' figures from a ``/metrics`` text (``hitl_auto_approve_*``, ``hitl_gate_spot_checks``)."""
    from prometheus_client.parser import text_string_to_metric_families

    policy = mode = None
    dropped, spot_lower = False, 0.0
    decisions: dict[str, int] = {}
    gate: dict[str, int] = {}
    for fam in text_string_to_metric_families(metrics_text):
        for smp in fam.samples:
            ref = smp.labels.get("policy") or None
            if smp.name == "hitl_auto_approve_mode" and smp.value == 1:
                policy, mode = ref, smp.labels.get("mode")
            elif smp.name == "hitl_auto_approve_dropped" and ref:
                policy, dropped = ref, smp.value == 1
            elif smp.name == "hitl_auto_approve_decisions":
                decisions[smp.labels.get("kind", "")] = int(smp.value)
            elif smp.name == "hitl_auto_approve_spot_false_accept_lower":
                spot_lower = float(smp.value)
            elif smp.name == "hitl_gate_spot_checks":
                gate[smp.labels.get("kind", "")] = int(smp.value)
    return PolicyFigures(policy, mode, dropped, decisions, spot_lower, gate)


def _rate(k: int, n: int) -> str:
    return f"{k / n:.1%}" if n else "–"


def policy_markdown(f: PolicyFigures) -> str:
    """What the box policy and the gate's spot checks decided, and how it is going."""
    lines = ["**Automatic decisions** (the whole deployment, docs/learning.md)\n"]
    if f.policy is None:
        lines.append("- Box auto-approval: **off** (no policy loaded).")
    else:
        d = f.decisions.get
        state = f"**{f.mode}**" + (" — *dropped to shadow by its spot checks*" if f.dropped else "")
        spot, fa = d("spot", 0), d("spot_fa", 0)
        lines += [
            f"- Box policy `{f.policy}`: {state}.",
            f"- Approved automatically: **{d('auto', 0)}** jobs.",
            f"- Spot checks: **{spot}**, false accepts **{fa}** (rate {_rate(fa, spot)}, "
            f"live lower bound {f.spot_lower:.2%}).",
            f"- Shadow: {d('shadow', 0)} decisions ({d('shadow_would', 0)} would approve); "
            f"{d('shadow_reviewed', 0)} reviewed, {d('shadow_reviewed_agree', 0)} agreed, "
            f"{d('shadow_reviewed_fa', 0)} would-be false accepts.",
        ]
    n, k = f.gate.get("spot", 0), f.gate.get("spot_fa", 0)
    lines.append(f"- Masks the gate passed, spot-checked: **{n}**, not accepted **{k}** (rate {_rate(k, n)}).")
    return "\n".join(lines)


def read_policies(client: HitlClient) -> str:
    """The policies' section, or a line saying why it is missing."""
    try:
        r = httpx.get(f"{client.base_url}/metrics", headers=client.headers(), timeout=10, verify=tls_context())
        r.raise_for_status()
        return policy_markdown(policy_figures(r.text))
    except (httpx.HTTPError, ImportError, ValueError, AttributeError) as exc:  # an older server, a UI-only install
        return f"_Automatic decisions unavailable ({type(exc).__name__})._"


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
        return stats_markdown(decisions, len(known)) + "\n\n" + read_policies(client)
