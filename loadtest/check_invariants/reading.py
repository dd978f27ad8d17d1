"""Reading Redis, read-only and through ``statecore.keys``: the jobs, their logs and pause
histories, what is left in the outbox streams, and whether the system is quiet."""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from hitl_review.statecore import keys
from hitl_review.statecore.store import Store


def stream_id(entry_id: str) -> tuple[int, int]:
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
                to: str | None = e["data"].get("to")
                return to
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

    def live_nodes(self) -> list[tuple[str, dict[str, Any]]]:
        """(node id, node) of what the job waits on: its subject nodes while it cuts them side by side
        (statecore.subject_nodes), else its current node."""
        subjects = [
            (k[len(keys.SUBJECT_NODE_FIELD) :], json.loads(v))
            for k, v in self.meta.items()
            if k.startswith(keys.SUBJECT_NODE_FIELD)
        ]
        live = [(nid, n) for nid, n in subjects if n.get("status") in ("QUEUED", "RETRY_WAIT", "RUNNING")]
        if live:
            return live
        node_id = self.meta.get("node_id")
        return [(node_id, self.j("current_node") or {})] if node_id else []


async def read_outbox(r: Any, p: int) -> dict[str, list[Command]]:
    """The commands still in partition ``p``'s outbox streams (one per lane), by job, oldest first,
    each marked pending when not yet delivered to a dispatcher or delivered and not acknowledged."""
    by_job: dict[str, list[Command]] = defaultdict(list)
    for stream in keys.partition_outboxes(p):
        for job_id, commands in (await _read_stream(r, stream)).items():
            by_job[job_id] += commands
    return {job_id: sorted(cs, key=lambda c: stream_id(c.entry_id)) for job_id, cs in by_job.items()}


async def _read_stream(r: Any, stream: str) -> dict[str, list[Command]]:
    by_job: dict[str, list[Command]] = defaultdict(list)
    last_delivered = (0, 0)
    pel: set[str] = set()
    try:
        for g in await r.xinfo_groups(stream):
            if g["name"] == keys.OUTBOX_GROUP:
                last_delivered = stream_id(g["last-delivered-id"])
        if last_delivered != (0, 0):
            pel = {
                x["message_id"]
                for x in await r.xpending_range(stream, keys.OUTBOX_GROUP, min="-", max="+", count=1_000_000)
            }
    except Exception:  # no stream or no group yet: nothing delivered
        pass
    start = "-"
    while True:
        entries = await r.xrange(stream, min=start, max="+", count=1000)
        for eid, f in entries:
            if not f or "cmd" not in f:
                continue
            cmd = json.loads(f["cmd"])
            if cmd["node_type"] == "ARCHIVE_JOB":
                continue  # not model work: a finished job's copy to the archive (docs/protocol.md § Archive)
            by_job[f.get("job") or cmd.get("job_id", "")].append(
                Command(
                    entry_id=eid,
                    node_instance_id=cmd["node_instance_id"],
                    node_type=cmd["node_type"],
                    enqueued_at=cmd.get("enqueued_at", ""),
                    pending=stream_id(eid) > last_delivered or eid in pel,
                )
            )
        if len(entries) < 1000:
            break
        ms, seq = stream_id(entries[-1][0])
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
            events.append(
                {"id": e.id, "type": e.type, "status": status, "version": e.version, "at": e.at, "data": data}
            )
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
    for stream in keys.all_outboxes():  # every lane's stream of every partition
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
