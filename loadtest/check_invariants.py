"""After a load run: read Redis (read-only, through ``statecore.keys``) and the API, and fail on any
breach of the review protocol's invariants, naming the jobs.

    python -m loadtest.check_invariants --redis-url redis://127.0.0.1:6379/0 \\
        [--api-url http://127.0.0.1:8000 --token T] [--record loadtest/out/record.jsonl] [--json OUT]

It first waits until the system is quiet (no outbox command undelivered or unacked), so jobs that
are merely slow are not judged stuck, then checks every job of the jobs index:

- ``pause_consumed_once``: each pause token opened once, consumed at most once (pause history and
  INTERVENTION_ACCEPTED events agree; clients never saw two fresh 200s for one pause), a consumed
  pause never active again;
- ``consumption_next_step``: a consumed pause wrote exactly one next-node command, of the type its
  INTERVENTION_ACCEPTED names, or ended the job in EMPTY_SELECTION with none;
- ``outbox_accounting``: every other state change that enters model work wrote exactly one command,
  and no command belongs to no state change (commands still in the outbox are matched to writes by
  their shared timestamp: a plan's events and its command carry the same ``now``; a command already
  handled and deleted must have left its trace: the next node to start is the one it announced);
- ``replay_identical``: every 200 a client got for one (job, intervention_id) has the same bytes,
  and they are the bytes of the stored idempotency record;
- ``client_success_committed``: a fresh (not replayed) 200 is an INTERVENTION_ACCEPTED in the log;
- ``create_idempotent``: one Idempotency-Key, one job, byte-identical replays; every accepted job exists;
- ``cancel_final``: nothing but JOB_FINISHED / REPORT_IGNORED after JOB_CANCELLED, same version,
  no later command, the meta still CANCELLED at the cancel's version;
- ``not_stuck``: a live job has an active WAITING pause (and is in the review queue), or a pending
  outbox command for its current node; a queued/running current node without one is a breach once
  the system is quiet (nothing will ever run it), a warning while it is not; a command still pending
  after the grace period (the quiet wait, at least 30 s) is a breach too;
- ``version_monotonic``: event versions never decrease; one atomic write = one version = one
  timestamp, each write one more than the last, starting at 1; REPORT_IGNORED carries the current
  version without bumping it; the meta's version is the last write's;
- ``status_chain``: STATUS_CHANGED events chain ``from``→``to`` along the transition table, end at
  the meta's status, and a terminal job has exactly one JOB_FINISHED;
- ``api_consistent``: ``GET /jobs/{id}`` shows what Redis holds; a finished job's SSE history is its log.

Prints the counts behind each invariant as a table, writes JSON with ``--json``, exits 1 on a breach.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from statecore import keys
from statecore.states import TERMINAL, TRANSITIONS, WAITING, JobStatus
from statecore.store import Store

from .common import format_table, parse_sse, read_records, read_token, request_id

INVARIANTS: dict[str, str] = {
    "pause_consumed_once": "each pause opened once and consumed at most once",
    "consumption_next_step": "a consumed pause has exactly one next-node command or EMPTY_SELECTION",
    "outbox_accounting": "every command belongs to exactly one state change that enters model work",
    "replay_identical": "all 200s for one (job, intervention_id) are byte-identical to the stored one",
    "client_success_committed": "a fresh 200 is an INTERVENTION_ACCEPTED in the job's log",
    "create_idempotent": "one Idempotency-Key, one job, identical replays; accepted jobs exist",
    "cancel_final": "a cancelled job never moved afterwards",
    "not_stuck": "a live job has an active pause, a pending command or a running node",
    "version_monotonic": "versions never decrease; one version per atomic write, +1 each",
    "status_chain": "status changes chain along the transition table to the meta's status",
    "api_consistent": "the API shows what Redis holds",
}
WORK_COMMAND = {
    "DETECTING": "DETECT_SUBJECTS",
    "VALIDATING_MANUAL_BOXES": "VALIDATE_MANUAL_BOX_LIST",
    "PROCESSING_APPROVED_SUBJECTS": "PROCESS_APPROVED_BOX_LIST",
    "FINALIZING_RESULTS": "FINALIZE_RESULTS",
}
TERMINAL_NAMES = {s.value for s in TERMINAL}
WAITING_NAMES = {s.value for s in WAITING}
AFTER_CANCEL_OK = {"JOB_FINISHED", "REPORT_IGNORED"}
MAX_DETAILS = 5
SLOW_COMMAND_S = 30.0


# --------------------------------------------------------------------------- the report


@dataclass
class Tally:
    checked: int = 0
    breaches: dict[str, list[str]] = field(default_factory=dict)  # job id -> details
    warnings: dict[str, list[str]] = field(default_factory=dict)


class Report:
    def __init__(self) -> None:
        self.inv = {name: Tally() for name in INVARIANTS}
        self.info: dict[str, Any] = {}

    def checked(self, name: str, n: int = 1) -> None:
        self.inv[name].checked += n

    def breach(self, name: str, job_id: str, detail: str) -> None:
        details = self.inv[name].breaches.setdefault(job_id, [])
        if len(details) < MAX_DETAILS:
            details.append(detail)

    def warn(self, name: str, job_id: str, detail: str) -> None:
        details = self.inv[name].warnings.setdefault(job_id, [])
        if len(details) < MAX_DETAILS:
            details.append(detail)

    @property
    def breach_count(self) -> int:
        return sum(len(t.breaches) for t in self.inv.values())

    @property
    def ok(self) -> bool:
        return self.breach_count == 0

    def breached(self) -> dict[str, list[str]]:
        """Invariant -> offending job ids (only the breached invariants)."""
        return {k: sorted(t.breaches) for k, t in self.inv.items() if t.breaches}

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "breaches": self.breach_count, **self.info,
            "invariants": {k: {"description": INVARIANTS[k], "checked": t.checked, "breaches": len(t.breaches),
                               "warnings": len(t.warnings), "jobs": t.breaches, "warned_jobs": t.warnings}
                           for k, t in self.inv.items()},
        }

    def table(self, max_ids: int = 4) -> str:
        rows = []
        for k, t in self.inv.items():
            ids = sorted(t.breaches)
            shown = ", ".join(ids[:max_ids]) + (f" (+{len(ids) - max_ids})" if len(ids) > max_ids else "")
            rows.append([k, t.checked, len(t.breaches), len(t.warnings), shown])
        return format_table(["invariant", "checked", "breaches", "warnings", "offending jobs"], rows)

    def details(self) -> str:
        out = []
        for k, t in self.inv.items():
            for job_id, ds in sorted(t.breaches.items()):
                for d in ds:
                    out.append(f"BREACH {k} job={job_id}: {d}")
            for job_id, ds in sorted(t.warnings.items())[:10]:
                for d in ds[:1]:
                    out.append(f"warning {k} job={job_id}: {d}")
        return "\n".join(out)


# --------------------------------------------------------------------------- reading Redis


def _now() -> float:
    return time.time()


def _sid(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass
class Command:
    entry_id: str
    node_instance_id: str
    node_type: str
    enqueued_at: str
    pending: bool


@dataclass
class Write:
    """One atomic write as the event log shows it: its version, timestamp and events."""

    version: int
    at: str
    events: list[dict[str, Any]]

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    def status_target(self) -> str | None:
        for e in self.events:
            if e["type"] == "STATUS_CHANGED":
                return e["data"].get("to")
        return None


@dataclass
class Job:
    job_id: str
    meta: dict[str, str]
    events: list[dict[str, Any]]
    pauses: dict[str, dict[str, Any]]
    idem: dict[str, str]
    in_waiting: bool
    commands: list[Command] = field(default_factory=list)

    def j(self, name: str) -> Any:
        raw = self.meta.get(name)
        return json.loads(raw) if raw else None


async def read_outbox(r: Any, p: int) -> dict[str, list[Command]]:
    """The commands still in partition ``p``'s outbox stream, by job, each marked pending when not
    yet delivered to a dispatcher or delivered and not acknowledged."""
    by_job: dict[str, list[Command]] = defaultdict(list)
    stream = keys.outbox(p)
    last_delivered = (0, 0)
    pel: set[str] = set()
    try:
        for g in await r.xinfo_groups(stream):
            if g["name"] == keys.OUTBOX_GROUP:
                last_delivered = _sid(g["last-delivered-id"])
        if last_delivered != (0, 0):
            pel = {x["message_id"] for x in await r.xpending_range(stream, keys.OUTBOX_GROUP, min="-", max="+",
                                                                  count=1_000_000)}
    except Exception:  # no stream or no group yet: nothing delivered
        pass
    start = "-"
    while True:
        entries = await r.xrange(stream, min=start, max="+", count=1000)
        for eid, f in entries:
            if not f or "cmd" not in f:
                continue
            cmd = json.loads(f["cmd"])
            by_job[f.get("job") or cmd.get("job_id", "")].append(Command(
                entry_id=eid, node_instance_id=cmd["node_instance_id"], node_type=cmd["node_type"],
                enqueued_at=cmd.get("enqueued_at", ""), pending=_sid(eid) > last_delivered or eid in pel))
        if len(entries) < 1000:
            break
        ms, seq = _sid(entries[-1][0])
        start = f"{ms}-{seq + 1}"
    return dict(by_job)


async def read_outboxes(r: Any) -> dict[str, list[Command]]:
    out: dict[str, list[Command]] = {}
    for p in range(keys.PARTITIONS):
        out.update(await read_outbox(r, p))
    return out


async def read_job(store: Store, job_id: str, *, with_commands: bool = False, tries: int = 5) -> Job | None:
    """One job as Redis holds it, read consistently: the meta's version is the same before and after
    the log, the pause history (and, ``with_commands``, the job's outbox entries) were read, so a
    write landing in between does not look like a disagreement. The log and pause history come
    through the store's own readers."""
    r = store.r
    jk = keys.job(job_id)
    for _ in range(tries):
        meta = await r.hgetall(jk.meta)
        if not meta:
            return None
        events = []
        for e in await store.events_after(job_id, 0):
            data = dict(e.data)
            status = data.get("status") if e.type != "JOB_FINISHED" else None
            events.append({"id": e.id, "type": e.type, "status": status, "version": e.version, "at": e.at,
                           "data": data})
        pauses = {p.pause_token: p.model_dump(mode="json") for p in await store.pause_history(job_id)}
        idem = await r.hgetall(jk.idem)
        in_waiting = await r.zscore(jk.waiting, job_id) is not None
        commands = (await read_outbox(r, jk.p)).get(job_id, []) if with_commands else []
        if await r.hget(jk.meta, "version") == meta.get("version"):
            return Job(job_id, meta, events, pauses, idem, in_waiting, commands)
    return Job(job_id, meta, events, pauses, idem, in_waiting, commands)


async def job_ids(r: Any) -> list[str]:
    ids: list[str] = []
    for p in range(keys.PARTITIONS):
        ids += await r.zrange(keys.jobs(p), 0, -1)
    return ids


async def pending_commands(r: Any) -> int:
    """Outbox commands not yet delivered or not yet acknowledged, over every partition. Counted from
    the consumer group's last-delivered id and pending list, not from XINFO's ``lag`` (which Redis
    cannot compute once entries were deleted)."""
    total = 0
    for p in range(keys.PARTITIONS):
        stream = keys.outbox(p)
        try:
            group = next((g for g in await r.xinfo_groups(stream) if g["name"] == keys.OUTBOX_GROUP), None)
        except Exception:  # no stream yet
            continue
        if group is None:
            total += await r.xlen(stream)
            continue
        total += int(group.get("pending") or 0)
        total += len(await r.xrange(stream, min=f"({group['last-delivered-id']}", max="+", count=10_000))
    return total


async def wait_quiet(store: Store, timeout: float, interval: float = 0.5) -> tuple[bool, int, float]:
    """Until no outbox command is undelivered or unacked (seen twice in a row), or ``timeout``."""
    t0 = time.monotonic()
    zeros = 0
    pending = await pending_commands(store.r)
    while True:
        zeros = zeros + 1 if pending == 0 else 0
        if zeros >= 2:
            return True, 0, time.monotonic() - t0
        if time.monotonic() - t0 >= timeout:
            return pending == 0, pending, time.monotonic() - t0
        await asyncio.sleep(interval)
        pending = await pending_commands(store.r)


# --------------------------------------------------------------------------- per-job checks


def writes_of(job: Job, rep: Report) -> list[Write]:
    """Group the log into atomic writes, checking ``version_monotonic`` on the way."""
    name = "version_monotonic"
    rep.checked(name)
    writes: list[Write] = []
    top = 0
    for ev in job.events:
        v = ev["version"]
        if v < top:
            rep.breach(name, job.job_id, f"event {ev['id']} {ev['type']} has version {v} after version {top}")
        top = max(top, v)
        if ev["type"] == "REPORT_IGNORED":
            if writes and v != writes[-1].version:
                rep.breach(name, job.job_id, f"REPORT_IGNORED (event {ev['id']}) at v{v}, but the job was at "
                           f"v{writes[-1].version}")
            continue
        if writes and v == writes[-1].version:
            if ev["at"] != writes[-1].at:
                rep.breach(name, job.job_id, f"two writes share version {v} ({writes[-1].at} and {ev['at']})")
            writes[-1].events.append(ev)
            continue
        want = writes[-1].version + 1 if writes else 1
        if v != want:
            rep.breach(name, job.job_id, f"event {ev['id']} {ev['type']} starts a write at v{v}, expected v{want}")
        writes.append(Write(v, ev["at"], [ev]))
    for w in writes:
        if w.types().count("STATUS_CHANGED") > 1:
            rep.breach(name, job.job_id, f"write v{w.version} holds {w.types().count('STATUS_CHANGED')} "
                       "STATUS_CHANGED events")
    return writes


def check_log_vs_meta(job: Job, writes: list[Write], cancelled: bool, rep: Report) -> None:
    """The meta's version and status are the last write's (cancelled jobs: ``cancel_final`` owns that)."""
    if cancelled or not writes:
        return
    meta_v = int(job.meta.get("version", -1))
    if meta_v != writes[-1].version:
        rep.breach("version_monotonic", job.job_id, f"meta version {meta_v}, but the log's last write is "
                   f"v{writes[-1].version}")


def check_status_chain(job: Job, writes: list[Write], cancelled: bool, rep: Report) -> None:
    name = "status_chain"
    rep.checked(name)
    cur: str | None = None
    for w in writes:
        for ev in w.events:
            if ev["type"] != "STATUS_CHANGED":
                continue
            frm, to = ev["data"].get("from"), ev["data"].get("to")
            if frm != (cur or "CREATED"):
                rep.breach(name, job.job_id, f"v{w.version}: STATUS_CHANGED from {frm}, but the job was in "
                           f"{cur or 'CREATED'}")
            try:
                legal = JobStatus(to) in TRANSITIONS[JobStatus(frm)]
            except ValueError:
                legal = False
            if not legal:
                rep.breach(name, job.job_id, f"v{w.version}: illegal transition {frm} -> {to}")
            cur = to
    finished = [e for e in job.events if e["type"] == "JOB_FINISHED"]
    if len(finished) > 1:
        rep.breach(name, job.job_id, f"{len(finished)} JOB_FINISHED events")
    if cur in TERMINAL_NAMES and not finished:
        rep.breach(name, job.job_id, f"ended in {cur} without JOB_FINISHED")
    if finished and cur not in TERMINAL_NAMES:
        rep.breach(name, job.job_id, f"JOB_FINISHED, but the log's last status is {cur}")
    if not cancelled and cur is not None and job.meta.get("status") != cur:
        rep.breach(name, job.job_id, f"meta status {job.meta.get('status')}, but the log ends in {cur}")


def check_pauses(job: Job, rep: Report) -> set[str]:
    """``pause_consumed_once`` from the log and the pause history; returns the consumed tokens."""
    name = "pause_consumed_once"
    opened = Counter(e["data"].get("active_pause", {}).get("pause_token") for e in job.events
                     if e["type"] == "PAUSE_OPENED")
    accepted: dict[str, list[str]] = defaultdict(list)
    for e in job.events:
        if e["type"] == "INTERVENTION_ACCEPTED":
            accepted[e["data"].get("pause_token")].append(e["data"].get("intervention_id"))
    tokens = set(opened) | set(accepted) | set(job.pauses)
    rep.checked(name, len(tokens))
    for token in sorted(tokens, key=str):
        if opened[token] > 1:
            rep.breach(name, job.job_id, f"pause {token} opened {opened[token]} times")
        ivs = accepted.get(token, [])
        if len(ivs) > 1:
            rep.breach(name, job.job_id, f"pause {token} consumed {len(ivs)} times (by {', '.join(ivs)})")
        if ivs and not opened[token]:
            rep.breach(name, job.job_id, f"pause {token} consumed but never opened")
        hist = job.pauses.get(token)
        if ivs and (hist is None or hist.get("status") != "CONSUMED"):
            rep.breach(name, job.job_id, f"pause {token} accepted {ivs[0]}, but its history says "
                       f"{hist.get('status') if hist else 'nothing'}")
        if hist and hist.get("status") == "CONSUMED":
            by = (hist.get("consumed_by") or {}).get("intervention_id")
            if not ivs:
                rep.breach(name, job.job_id, f"pause {token} CONSUMED (by {by}) without INTERVENTION_ACCEPTED")
            elif by not in ivs:
                rep.breach(name, job.job_id, f"pause {token} consumed_by {by}, but the log accepted {ivs[0]}")
    active = job.j("active_pause")
    if active and active.get("pause_token") in accepted:
        rep.breach(name, job.job_id, f"consumed pause {active.get('pause_token')} is active again")
    return set(accepted)


def _started_after(job: Job, w: Write, node_type: str, nid: str | None) -> bool | None:
    """Did the node announced by write ``w`` run? True: the first node event after it is that node;
    False: another node ran first; None: no node event followed."""
    for e in job.events:
        if e["version"] <= w.version or e["type"] not in ("NODE_STARTED", "NODE_COMPLETED"):
            continue
        d = e["data"]
        return d.get("node_type") == node_type and (nid is None or d.get("node_instance_id") == nid)
    return None


def check_commands(job: Job, writes: list[Write], rep: Report) -> None:
    """``consumption_next_step`` and ``outbox_accounting``.

    A plan's events and its outbox command carry the same timestamp, so commands still in the
    outbox are matched to the write that made them. A command that is gone (dispatchers may delete
    what they acknowledged) must have left its trace: the next node to start after the write is the
    one it announced, or the job was cancelled before any node ran."""
    by_at: dict[str, list[Write]] = defaultdict(list)
    for w in writes:
        by_at[w.at].append(w)
    cmds_at: dict[str, list[Command]] = defaultdict(list)
    for c in job.commands:
        cmds_at[c.enqueued_at].append(c)
    for c in job.commands:
        rep.checked("outbox_accounting")
        if c.enqueued_at not in by_at:
            rep.breach("outbox_accounting", job.job_id, f"command {c.node_type} {c.node_instance_id} (entry "
                       f"{c.entry_id}) belongs to no state change of the job")
    cancel_v = next((e["version"] for e in job.events if e["type"] == "JOB_CANCELLED"), None)
    for at, ws in by_at.items():
        expected: Counter[str] = Counter()
        announced: list[tuple[Write, str, str | None, str]] = []  # (write, node type, node id, invariant)
        consumption = None
        for w in ws:
            ia = next((e for e in w.events if e["type"] == "INTERVENTION_ACCEPTED"), None)
            target = w.status_target()
            if ia is not None:
                consumption = (w, ia)
                nxt = ia["data"].get("next_node_type")
                if nxt:
                    expected[nxt] += 1
                    announced.append((w, nxt, ia["data"].get("node_instance_id"), "consumption_next_step"))
                    if target and WORK_COMMAND.get(target) != nxt:
                        rep.breach("consumption_next_step", job.job_id, f"v{w.version}: next node {nxt}, but "
                                   f"the status moved to {target}")
                elif target != "EMPTY_SELECTION" or "EMPTY_SELECTION_SUBMITTED" not in w.types():
                    rep.breach("consumption_next_step", job.job_id, f"v{w.version}: pause "
                               f"{ia['data'].get('pause_token')} consumed with no next node and no EMPTY_SELECTION")
            elif target in WORK_COMMAND:
                expected[WORK_COMMAND[target]] += 1
                announced.append((w, WORK_COMMAND[target], None, "outbox_accounting"))
        if consumption is not None:
            rep.checked("consumption_next_step")
        elif expected:
            rep.checked("outbox_accounting")
        present = cmds_at.get(at, [])
        name = "consumption_next_step" if consumption is not None else "outbox_accounting"
        what = (f"pause {consumption[1]['data'].get('pause_token')} consumed at v{consumption[0].version}"
                if consumption else f"v{ws[0].version} entering {ws[0].status_target()}")
        actual = Counter(c.node_type for c in present)
        if present:
            wrong_id = [c.node_instance_id for c in present for (_w, t, nid, _n) in announced
                        if nid and c.node_type == t and c.node_instance_id != nid]
            if actual != expected or wrong_id:
                rep.breach(name, job.job_id, f"{what}: outbox holds {dict(actual)}, expected "
                           f"{dict(expected) or 'nothing'}" + (f" (node {wrong_id[0]} is not the announced one)"
                                                               if wrong_id else ""))
            continue
        for w, node_type, nid, inv in announced:
            ran = _started_after(job, w, node_type, nid)
            if ran is True or (ran is None and cancel_v is not None and cancel_v > w.version):
                continue
            rep.breach(inv, job.job_id, f"{what}: its {node_type} command is not in the outbox and "
                       + ("another node ran next" if ran is False else "never ran"))


def check_cancel(job: Job, rep: Report) -> bool:
    """``cancel_final``; returns whether the job was cancelled (by its log or its meta)."""
    name = "cancel_final"
    cancels = [i for i, e in enumerate(job.events) if e["type"] == "JOB_CANCELLED"]
    meta_status = job.meta.get("status")
    if not cancels:
        if meta_status == "CANCELLED":
            rep.checked(name)
            rep.breach(name, job.job_id, "meta says CANCELLED, but the log has no JOB_CANCELLED")
            return True
        return False
    rep.checked(name)
    first = job.events[cancels[0]]
    cv = first["version"]
    if len(cancels) > 1:
        rep.breach(name, job.job_id, f"{len(cancels)} JOB_CANCELLED events")
    for e in job.events[cancels[0] + 1:]:
        if e["type"] not in AFTER_CANCEL_OK or e["version"] != cv:
            rep.breach(name, job.job_id, f"{e['type']} at v{e['version']} after JOB_CANCELLED at v{cv}")
    if meta_status != "CANCELLED":
        rep.breach(name, job.job_id, f"meta status {meta_status} after JOB_CANCELLED")
    if int(job.meta.get("version", -1)) != cv:
        rep.breach(name, job.job_id, f"meta version {job.meta.get('version')} after JOB_CANCELLED at v{cv}")
    if job.meta.get("pause_token") or job.j("active_pause"):
        rep.breach(name, job.job_id, "a pause is active after JOB_CANCELLED")
    for c in job.commands:
        if c.enqueued_at > first["at"]:
            rep.breach(name, job.job_id, f"command {c.node_type} enqueued at {c.enqueued_at}, after the cancel")
    return True


def check_stuck(job: Job, rep: Report, quiet: bool, grace_s: float) -> None:
    """A live job must be waiting for a person (an active pause, in the review queue) or for a node:
    its current node's command still pending in the outbox. Once the system is quiet (nothing pending
    anywhere), a QUEUED or RUNNING node without its command will never run: stuck. Before that (the
    quiet wait timed out) such a node is only a warning. A command still pending after the grace
    period (the quiet wait) is stuck too: dispatchers have had it and did nothing with it."""
    name = "not_stuck"
    status = job.meta.get("status", "")
    if status in TERMINAL_NAMES or any(e["type"] == "JOB_FINISHED" for e in job.events):
        return  # ended (a meta/log disagreement is status_chain's or cancel_final's to report)
    rep.checked(name)
    pause = job.j("active_pause")
    if pause and pause.get("status") == "WAITING" and job.meta.get("pause_token") == pause.get("pause_token"):
        if status not in WAITING_NAMES:
            rep.breach(name, job.job_id, f"active pause while {status}")
        elif not job.in_waiting:
            rep.breach(name, job.job_id, f"waiting in {status}, but not in the review queue")
        return
    node_id = job.meta.get("node_id")
    mine = [c for c in job.commands if c.pending and c.node_instance_id == node_id] if node_id else []
    if mine:
        age = _now() - _sid(mine[0].entry_id)[0] / 1000
        if not quiet and age > grace_s:
            rep.breach(name, job.job_id, f"{status}: its {mine[0].node_type} command (entry {mine[0].entry_id}) is "
                       f"still pending after {age:.0f}s, beyond the {grace_s:.0f}s grace period")
        elif not quiet and age > SLOW_COMMAND_S:
            rep.warn(name, job.job_id, f"{status}: its {mine[0].node_type} command (entry {mine[0].entry_id}) has "
                     f"been pending for {age:.0f}s")
        return
    node = job.j("current_node") or {}
    where = f"current node: {node.get('node_type')} {node.get('status')}" if node else "no current node"
    if node.get("status") in ("QUEUED", "RUNNING") and node.get("node_instance_id") == node_id:
        if quiet:
            rep.breach(name, job.job_id, f"live in {status}, {where}, but its command is no longer pending: "
                       "nothing will run it")
        else:
            rep.warn(name, job.job_id, f"{status}: {where} with no pending command (the system was not quiet)")
        return
    rep.breach(name, job.job_id, f"live in {status} with no active pause, no pending command and no running node "
               f"({where})")


# --------------------------------------------------------------------------- record checks


def check_records(records: list[dict[str, Any]], jobs: dict[str, Job], rep: Report,
                  submitter: str | None, create_idem: dict[str, str]) -> None:
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
            rep.breach("replay_identical", job_id, f"intervention {iid}: {len(hashes)} different 200 bodies "
                       f"({len(ok)} answers, {sum(bool(r.get('replayed')) for r in ok)} replays)")
        elif stored is not None:
            body = stored.split("\n", 1)[1] if "\n" in stored else stored
            if hashlib.sha256(body.encode()).hexdigest() not in hashes:
                rep.breach("replay_identical", job_id, f"intervention {iid}: the stored response differs "
                           "from what the client got")
        fresh = [r for r in ok if not r.get("replayed")]
        rep.checked("client_success_committed")
        if len(fresh) > 1:
            rep.breach("client_success_committed", job_id, f"intervention {iid}: {len(fresh)} fresh 200s")
        if fresh and job is not None:
            accepted = {e["data"].get("intervention_id") for e in job.events if e["type"] == "INTERVENTION_ACCEPTED"}
            if iid not in accepted:
                rep.breach("client_success_committed", job_id, f"intervention {iid} answered 200, but the log "
                           "has no INTERVENTION_ACCEPTED for it")
        if fresh and job is None:
            rep.breach("client_success_committed", job_id, f"intervention {iid} answered 200 for a job Redis "
                       "does not hold")
        for r in fresh:
            fresh_by_pause[(job_id, r.get("pause_token", ""))].add(iid)
    for (job_id, token), iids in fresh_by_pause.items():
        if len(iids) > 1:
            rep.breach("pause_consumed_once", job_id, f"clients got fresh 200s for {len(iids)} interventions on "
                       f"pause {token}: {', '.join(sorted(iids))}")

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
            rep.breach("create_idempotent", anchor or key, f"key {key}: {sum(not r.get('replayed') for r in ok)} "
                       "fresh 202s")
        for r in rs:
            if r.get("code") == "IDEMPOTENCY_CONFLICT" and anchor and r.get("job_id") != anchor:
                rep.breach("create_idempotent", anchor, f"key {key}: conflict names job {r.get('job_id')}")
        if anchor and anchor not in jobs:
            rep.breach("create_idempotent", anchor, f"key {key}: accepted job is not in Redis")
        stored = create_idem.get(key)
        if stored and ok and len({r["body_sha256"] for r in ok}) == 1 and \
                hashlib.sha256(stored.encode()).hexdigest() != ok[0]["body_sha256"]:
            rep.breach("create_idempotent", anchor or key, f"key {key}: stored creation answer differs from the "
                       "client's")
    if submitter is None and creates:
        rep.info["create_records_unverified_against_redis"] = "no submitter name (pass --api-url and --token)"


# --------------------------------------------------------------------------- API checks


async def check_api(api_url: str, token: str, store: Store, jobs: dict[str, Job], rep: Report, sample: int,
                    sse_sample: int) -> str | None:
    """Compare a sample of snapshots (and finished jobs' SSE history) with Redis; returns the caller's name."""
    name = "api_consistent"
    r = store.r
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=30) as c:
        who = None
        resp = await c.get("/api/v1/whoami", headers={"X-Request-ID": request_id("check")})
        if resp.status_code == 200:
            who = resp.json().get("name")
        ready = await c.get("/readyz", headers={"X-Request-ID": request_id("check")})
        rep.info["readyz"] = ready.status_code
        ids = sorted(jobs)[:sample] if sample >= 0 else sorted(jobs)
        sem = asyncio.Semaphore(16)

        async def one(job_id: str) -> None:
            async with sem:
                before = await r.hmget(keys.job(job_id).meta, "version", "status", "pause_token")
                resp = await c.get(f"/api/v1/jobs/{job_id}", headers={"X-Request-ID": request_id("check")})
                after = await r.hmget(keys.job(job_id).meta, "version", "status", "pause_token")
            if before != after:
                return  # moved while we looked; not comparable
            rep.checked(name)
            if resp.status_code != 200:
                rep.breach(name, job_id, f"GET /jobs/{job_id} answered {resp.status_code}")
                return
            snap = resp.json()
            token_api = (snap.get("active_pause") or {}).get("pause_token") or ""
            if (str(snap.get("version")), snap.get("status"), token_api) != (after[0], after[1], after[2] or ""):
                rep.breach(name, job_id, f"API shows v{snap.get('version')} {snap.get('status')} pause "
                           f"{token_api or '-'}, Redis v{after[0]} {after[1]} pause {after[2] or '-'}")

        await asyncio.gather(*(one(j) for j in ids))
        finished = [j for j in sorted(jobs) if any(e["type"] == "JOB_FINISHED" for e in jobs[j].events)]
        for job_id in finished[:sse_sample]:
            rep.checked(name)
            try:
                async with c.stream("GET", f"/api/v1/jobs/{job_id}/events",
                                    headers={"X-Request-ID": request_id("check")}) as s:
                    lines = [line async for line in s.aiter_lines()]
            except httpx.HTTPError as e:
                rep.breach(name, job_id, f"SSE history failed: {e}")
                continue
            got = [(e["id"], e["type"], e["version"]) for e in parse_sse(lines) if e.get("type") != ":"]
            log = await read_job(store, job_id)  # a late REPORT_IGNORED may have joined since loading
            want = [(e["id"], e["type"], e["version"]) for e in (log.events if log else [])]
            if got != want:
                rep.breach(name, job_id, f"SSE history has {len(got)} events, the log {len(want)}")
    return who


# --------------------------------------------------------------------------- driver


async def check(store: Store, *, record: str | Path | None = None, api_url: str | None = None,
                token: str | None = None, quiet_timeout: float = 60.0, api_sample: int = 200,
                sse_sample: int = 20) -> Report:
    rep = Report()
    quiet, pending, waited = await wait_quiet(store, quiet_timeout)
    rep.info.update(quiet=quiet, pending_after_wait=pending, waited_s=round(waited, 2))
    r = store.r
    # Quiet: one read of every outbox is a consistent picture. Still moving: each job is read
    # together with its own partition's outbox, so a command handled meanwhile is not "lost".
    outbox = await read_outboxes(r) if quiet else None
    sem = asyncio.Semaphore(32)

    async def load(job_id: str) -> Job | None:
        async with sem:
            return await read_job(store, job_id, with_commands=outbox is None)

    loaded = await asyncio.gather(*(load(j) for j in dict.fromkeys(await job_ids(r))))
    jobs = {j.job_id: j for j in loaded if j is not None}
    if outbox is not None:
        for job in jobs.values():
            job.commands = outbox.get(job.job_id, [])
    rep.info["jobs"] = len(jobs)
    rep.info["statuses"] = dict(Counter(j.meta.get("status") for j in jobs.values()).most_common())
    rep.info["commands"] = sum(len(j.commands) for j in jobs.values())
    for job in jobs.values():
        writes = writes_of(job, rep)
        cancelled = check_cancel(job, rep)
        check_log_vs_meta(job, writes, cancelled, rep)
        check_status_chain(job, writes, cancelled, rep)
        check_pauses(job, rep)
        check_commands(job, writes, rep)
        check_stuck(job, rep, quiet, max(quiet_timeout, SLOW_COMMAND_S))
    submitter = None
    if api_url and token:
        submitter = await check_api(api_url, token, store, jobs, rep, api_sample, sse_sample)
    records = read_records(record)
    rep.info["records"] = len(records)
    create_idem: dict[str, str] = {}
    if submitter:
        for key in {x["idempotency_key"] for x in records if x.get("kind") == "create"}:
            stored = await r.hget(keys.create_idem(submitter, key), "response")
            if stored:
                create_idem[key] = stored
    check_records(records, jobs, rep, submitter, create_idem)
    return rep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtest.check_invariants",
                                 description="Check the review protocol's invariants after a load run.")
    ap.add_argument("--redis-url", required=True, help="the Redis the server uses (redis+cluster://… for a cluster)")
    ap.add_argument("--api-url", default=None, help="the API, to compare snapshots and SSE history with Redis")
    ap.add_argument("--token", default=None, help="bearer token (default HITL_TOKEN or <data-dir>/api-token)")
    ap.add_argument("--data-dir", default=None, help="where the local api-token lives (default HITL_DATA_DIR)")
    ap.add_argument("--record", default=None, help="JSONL written by the locust run (HITL_LT_RECORD)")
    ap.add_argument("--json", default=None, help="write the result as JSON here")
    ap.add_argument("--quiet-timeout", type=float, default=60.0, help="seconds to wait for an empty outbox")
    ap.add_argument("--api-sample", type=int, default=200, help="jobs whose snapshot is compared (-1: all)")
    ap.add_argument("--sse-sample", type=int, default=20, help="finished jobs whose SSE history is compared")
    args = ap.parse_args(argv)
    token = None
    if args.api_url:
        token = read_token(args.token, args.data_dir)

    async def run() -> Report:
        store = Store.from_url(args.redis_url, max_connections=64)
        try:
            return await check(store, record=args.record, api_url=args.api_url, token=token,
                               quiet_timeout=args.quiet_timeout, api_sample=args.api_sample,
                               sse_sample=args.sse_sample)
        finally:
            await store.close()

    rep = asyncio.run(run())
    print_report(rep)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rep.to_json(), indent=2))
    return 0 if rep.ok else 1


def print_report(rep: Report) -> None:
    i = rep.info
    print(f"invariant check: {i.get('jobs', 0)} jobs, {i.get('commands', 0)} outbox commands, "
          f"{i.get('records', 0)} client records; quiet={i.get('quiet')} after {i.get('waited_s')}s "
          f"(pending {i.get('pending_after_wait')})")
    print("statuses: " + ", ".join(f"{k}={v}" for k, v in (i.get("statuses") or {}).items()))
    print(rep.table())
    details = rep.details()
    if details:
        print(details)
    if rep.ok:
        print("invariants: OK (0 breaches)")
    else:
        print(f"invariants: {rep.breach_count} BREACHES")
        for inv, ids in rep.breached().items():
            print(f"  {inv}: {' '.join(ids)}")


if __name__ == "__main__":
    sys.exit(main())
