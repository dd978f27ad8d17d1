"""The outbox dispatcher: delivers node commands to the models, applies their reports.

At-least-once delivery (consumer group, ack after the report is applied,
reclaim of entries a dead dispatcher held) plus at-most-once application
(reports keyed by node_instance_id in the Lua script) gives exactly-once effect.
Executors never write job status; they record a node's start, beat while it runs and return
its output (statecore.execution).

What bounds the work in flight (docs/protocol.md § Lifecycle of a node): a dispatcher has at most
as many calls outstanding per model deployment as that deployment can start now
(serve_app.work.capacity), reads from the outbox only that many commands, and keeps the idle time of
the entries it holds fresh (a long node is neither reclaimed nor dead-lettered for running). A
call is watched while it waits: once its node is no longer the job's current one (timed out,
re-dispatched, cancelled) the call is cancelled, so a hung model holds no slot for ever.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import socket
import time
from collections import Counter
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from hitl_review.statecore import deadletters, keys
from hitl_review.statecore.durable import reraise_if_cancelled
from hitl_review.statecore.errors import NodeExecutionError
from hitl_review.statecore.execution import NODE_DEADLINE_EXCEEDED, RunSpec, not_started, run_started
from hitl_review.statecore.models import ImageRef, NodeCommand, NodeReport
from hitl_review.statecore.nodes import CONTROL_PLANE_NODES, NODES, parse_output
from hitl_review.statecore.outbox import OutboxEntry
from hitl_review.statecore.store import Store

from ..observability import metrics
from ..recovery.store_reset import ResetWatch
from .capacity import Slots
from .inspector import Confirm, Inspector
from .writeback import WriteBack

log = logging.getLogger("hitl.dispatcher")


@dataclass(frozen=True)
class _Retry:
    """A transient failure of one attempt: the store decides whether another attempt follows."""

    code: str
    message: str


@dataclass(frozen=True)
class _NotRun:
    """The node was not run by this call: ``BUSY`` (running under another holder), ``MOVED_ON``
    (no longer the job's current node), ``IGNORED``/``DUPLICATE`` (the executor's start refused)."""

    why: str


# A node status after which nobody waits for the node's call: the inspector timed it out or gave
# it up as lost, or its command was dead-lettered (a re-dispatch makes the node superseded instead).
GIVEN_UP = frozenset({"TIMED_OUT", "LOST", "FAILED"})
# How long a stopping dispatcher waits for its cancelled calls to unwind (a model call cancelled
# mid-flight returns at once; nothing here waits for Redis).
STOP_WAIT_S = 5.0


class NodeRunner(Protocol):
    """Runs one node where its model lives. ``run`` starts the node through
    ``statecore.execution.run_started`` in the process doing the work. A runner may also say which
    deployment a node type runs on (``deployment_of``) and how many calls each can take now
    (``limits``); without them only the dispatcher's concurrency bounds the calls."""

    async def run(self, cmd: NodeCommand, spec: RunSpec) -> dict[str, Any]: ...


class Dispatcher:
    def __init__(
        self,
        store: Store,
        runner: NodeRunner,
        *,
        consumer: str | None = None,
        concurrency: int = 64,
        reclaim_idle_ms: int = 60_000,
        reclaim_every_s: float = 5.0,
        inspect_every_s: float = 5.0,
        redis_url: str | None = None,
        heartbeat_s: float = 2.0,
        heartbeat_lapse_s: float = 15.0,
        confirm: Confirm | None = None,
        data_dir: Path | None = None,
        max_deliveries: int = 10,
    ) -> None:
        self.store = store
        self.runner = runner
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{random.randrange(1 << 30):x}"
        self.sem = asyncio.Semaphore(concurrency)
        self.reclaim_idle_ms = reclaim_idle_ms
        self.reclaim_every_s = reclaim_every_s
        self.inspect_every_s = inspect_every_s
        self.concurrency = concurrency
        # Where the process running a node records its start and beats (the store's own by default).
        self.redis_url = redis_url or getattr(store, "url", None)
        self.heartbeat_s = heartbeat_s
        self.watch_s = max(0.5, heartbeat_s)  # how often an outstanding call's node is looked at
        self.slots = Slots(getattr(runner, "limits", dict))
        self._entries: dict[tuple[str, str], OutboxEntry] = {}  # held here: their idle time is renewed
        # Model nodes read and not yet at their deployment's slots (node instance -> deployment): their
        # lane's next read leaves room for them.
        self._starting: dict[str, str] = {}
        self.inspector = Inspector(
            store,
            owner=self.consumer,
            period_s=inspect_every_s,
            heartbeat_lapse_s=heartbeat_lapse_s,
            confirm=confirm,
            consumer=self.consumer,
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self.groups_recreated = 0  # NOGROUP recoveries (Redis came back empty)
        # Results Redis could not take wait in <data-dir>/spool (docs/protocol.md § Executors and the outbox).
        self.writeback = WriteBack(store, data_dir)
        # A Redis that came back empty is reported, with what it held (docs/protocol.md § Redis outages).
        self.resets = ResetWatch(store, data_dir, self.consumer)
        self.max_deliveries = max_deliveries  # a command delivered more often becomes a dead letter
        # Finished jobs' copies and the live mirror are not the dispatcher's: the archiver's own loop
        # (serve_app.work.archive_loop) reads them from the archive streams (docs/protocol.md § Archive).

    async def run_forever(self) -> None:
        resume = asyncio.create_task(self.writeback.resume())  # a spool an earlier process left
        try:
            await self._loop()
        finally:
            # A stopped dispatcher leaves nothing of its own running: its calls and their write-backs
            # (a result left in the spool is the next dispatcher's, and two would apply it twice). The
            # cancel may come wherever the loop waits, its Redis-outage pause included.
            work = [resume, *self._tasks]
            for t in work:
                t.cancel()
            await asyncio.wait(work, timeout=STOP_WAIT_S)

    async def _loop(self) -> None:
        while True:
            try:
                await self.store.ensure_groups()
                break
            except (RedisConnectionError, RedisTimeoutError) as e:  # started while Redis is away: wait
                reraise_if_cancelled(e)
                log.warning("dispatcher: Redis unavailable at start (%s); retrying in 1s", e)
                await asyncio.sleep(1)
        log.info("dispatcher %s started", self.consumer)
        last_reclaim = last_inspect = last_renew = 0.0
        renew_every_s = min(self.reclaim_every_s, self.reclaim_idle_ms / 3000)
        while True:
            reraise_if_cancelled(None)  # a cancel a library swallowed on the way (statecore.durable)
            try:
                if time.monotonic() - last_renew > renew_every_s:
                    last_renew = time.monotonic()
                    await self.store.outbox_renew(self.consumer, list(self._entries.values()))
                if time.monotonic() - last_inspect > self.inspect_every_s:
                    last_inspect = time.monotonic()
                    await self.inspector.sweep()
                    await self.inspector.housekeeping()
                    await self.resets.check()
                if time.monotonic() - last_reclaim > self.reclaim_every_s:
                    last_reclaim = time.monotonic()
                    for entry in await self.store.outbox_reclaim(self.consumer, self.reclaim_idle_ms):
                        log.warning(
                            "reclaimed %s node=%s job=%s from a silent dispatcher",
                            entry.command.node_type,
                            entry.command.node_instance_id,
                            entry.command.job_id,
                        )
                        self._spawn(entry)
                # Take from the outbox only what can start now, each lane within its deployment's
                # free slots: what is left waits there for another dispatcher (or for a free slot
                # here), where admission control counts it.
                free, lanes = self._budgets()
                if free <= 0 or not any(lanes.values()):
                    await asyncio.sleep(0.05)
                    continue
                for entry in await self.store.outbox_read(self.consumer, count=free, block_ms=1000, lanes=lanes):
                    self._spawn(entry)
            except (RedisConnectionError, RedisTimeoutError) as e:  # Redis down or hung: wait for it
                reraise_if_cancelled(e)
                self.inspector.store_unreachable()
                log.warning("dispatcher: Redis unavailable (%s); retrying in 1s", e)
                await asyncio.sleep(1)
            except ResponseError as e:
                reraise_if_cancelled(e)
                if "NOGROUP" not in str(e):
                    log.exception("dispatcher loop error (retrying): %s", e)
                    await asyncio.sleep(1)
                    continue
                # Redis came back empty (FLUSHALL, a restart without its AOF): re-create the groups.
                self.groups_recreated += 1
                log.warning("dispatcher: outbox consumer group missing (%s); re-creating it", e)
                try:
                    await self.store.ensure_groups()
                except Exception as again:
                    reraise_if_cancelled(again)
                    log.warning("dispatcher: re-creating the consumer groups failed (%s); retrying", again)
                    await asyncio.sleep(1)
            except Exception as e:
                reraise_if_cancelled(e)
                log.exception("dispatcher loop error (retrying): %s", e)
                await asyncio.sleep(1)

    def _deployment_of(self, node_type: str) -> str:
        deployment_of = getattr(self.runner, "deployment_of", None)
        return (deployment_of(node_type) if deployment_of else None) or node_type

    def _budgets(self) -> tuple[int, dict[str, int]]:
        """How many commands to read now, in all and per outbox lane (statecore.keys.LANES): a lane
        up to the free slots of its nodes' deployment (a lane with a control-plane node, which takes
        no slot, or with a deployment the limits do not name: up to the dispatcher's own free
        concurrency), in all no more than the deployments' free slots together (lanes that share a
        deployment, the in-process runner's one, share its slots)."""
        free = self.concurrency - len(self._tasks)
        starting = Counter(self._starting.values())
        lanes: dict[str, int] = {}
        deployments: set[str] = set()
        bounded = True
        for lane in keys.LANES:
            types = keys.lane_nodes(lane, [t.value for t in NODES])
            mine = {self._deployment_of(t) for t in types if t not in CONTROL_PLANE_NODES}
            n = None if any(t in CONTROL_PLANE_NODES for t in types) else self.slots.free(mine, starting)
            lanes[lane] = free if n is None else min(free, n)
            bounded = bounded and n is not None
            deployments |= mine
        if bounded:
            free = min(free, sum(self.slots.free([d], starting) or 0 for d in deployments))
        return free, lanes

    def _spawn(self, entry: OutboxEntry) -> None:
        key = (entry.stream, entry.entry_id)
        if key in self._entries:
            return  # already being worked on here (reclaimed our own entry)
        self._entries[key] = entry
        if entry.command.node_type not in CONTROL_PLANE_NODES:  # it will want a slot: count it from now
            self._starting[entry.command.node_instance_id] = self._deployment_of(entry.command.node_type)
        task = asyncio.create_task(self._guarded(entry))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(self, entry: OutboxEntry) -> None:
        try:
            not_before = entry.command.not_before_ms
            if not_before:  # a re-dispatch's backoff, on Redis's clock like every deadline
                now_ms = await self.store.server_ms(keys.job(entry.command.job_id).meta)
                await asyncio.sleep(max(0.0, (not_before - now_ms) / 1000))
            async with self.sem:
                await self.handle(entry)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Not acked: another dispatcher (or this one) reclaims it after reclaim_idle_ms.
            log.exception("command %s %s left pending after an error", entry.stream, entry.entry_id)
        finally:
            self._entries.pop((entry.stream, entry.entry_id), None)
            self._starting.pop(entry.command.node_instance_id, None)

    async def handle(self, entry: OutboxEntry) -> None:
        cmd = entry.command
        actor = f"dispatcher:{self.consumer}"
        if entry.deliveries > self.max_deliveries:
            # A command that keeps coming back (its dispatchers died on it) is not run again, and its
            # job does not stay live for ever: the node fails, visibly (NODE_FAILED, FAILED).
            reason = (
                f"MAX_DELIVERIES_EXCEEDED: delivered {entry.deliveries} times (--max-deliveries {self.max_deliveries})"
            )
            await deadletters.add(
                self.store.r, job_id=cmd.job_id, kind="command", reason=reason, payload=cmd.model_dump(mode="json")
            )
            result = await self.store.node_dead_lettered(
                cmd.job_id, cmd.node_instance_id, reason="MAX_DELIVERIES_EXCEEDED", actor=actor
            )
            await self.store.outbox_ack(entry)
            log.error("dead letter: %s node=%s job=%s: %s", cmd.node_type, cmd.node_instance_id, cmd.job_id, result)
            return
        outcome = await self.execute(cmd)
        if isinstance(outcome, _NotRun):
            if outcome.why == "BUSY":
                # Reclaimed from a dispatcher whose call still runs (its executor beats): a long node
                # is never started twice. Held until the node ends one way or another (its report,
                # or a re-dispatch once its heartbeat lapses), then acknowledged.
                await self._until_moved_on(cmd)
            else:
                log.info("skip %s node=%s job=%s: %s", cmd.node_type, cmd.node_instance_id, cmd.job_id, outcome.why)
            await self.store.outbox_ack(entry)
            return
        if isinstance(outcome, _Retry) and await self._node_status(cmd) in ("QUEUED", "RETRY_WAIT"):
            # The call failed before any executor started the node (a replica that died with the call
            # in its queue): not an attempt. Left pending: reclaimed and offered again, and after
            # --max-deliveries a dead letter that fails the node visibly.
            log.warning(
                "%s job=%s node=%s: call failed before the node started (%s)",
                cmd.node_type,
                cmd.job_id,
                cmd.node_instance_id,
                outcome.message,
            )
            return
        if isinstance(outcome, _Retry):
            result = await self.store.node_failed(cmd.job_id, cmd.node_instance_id, reason=outcome.code, actor=actor)
            metrics.REPORTS.labels(result).inc()
            await self.store.outbox_ack(entry)
            log.warning(
                "%s job=%s node=%s attempt failed (%s: %s): %s",
                cmd.node_type,
                cmd.job_id,
                cmd.node_instance_id,
                outcome.code,
                outcome.message,
                "handed back for another attempt" if result == "OK" else result,
            )
            return
        report = outcome
        result = await self.writeback.apply(report, entry)  # spooled and retried while Redis is away
        metrics.REPORTS.labels(result).inc()
        log.info(
            "node %s job=%s node=%s outcome=%s report=%s",
            cmd.node_type,
            cmd.job_id,
            cmd.node_instance_id,
            report.outcome,
            result,
        )

    async def _node_status(self, cmd: NodeCommand) -> str | None:
        """The command's node status while it is the job's current node, else None (superseded)."""
        return await self.store.node_status(cmd.job_id, cmd.node_instance_id)

    async def _until_moved_on(self, cmd: NodeCommand) -> None:
        while await self._node_status(cmd) == "RUNNING":
            await asyncio.sleep(self.watch_s)

    async def _call(self, cmd: NodeCommand, spec: RunSpec) -> dict[str, Any] | _NotRun:
        """The runner's call, watched: cancelled as soon as the inspector gave up on its node (timed
        it out, or re-dispatched it as a new instance), whether the call still waits in Serve's
        queue or its model hangs. A job cancelled meanwhile is not a reason: a call still queued is
        refused by its executor's start, and one already running ends by its deadline at the latest
        and its late report is recorded as ignored (docs/protocol.md § Executors and the outbox)."""
        call = asyncio.ensure_future(self.runner.run(cmd, spec))
        try:
            while True:
                done, _ = await asyncio.wait({call}, timeout=self.watch_s)
                if done:
                    return call.result()
                status = await self._node_status(cmd)
                if status is None or status in GIVEN_UP:
                    log.warning(
                        "%s job=%s node=%s: %s; its call is cancelled",
                        cmd.node_type,
                        cmd.job_id,
                        cmd.node_instance_id,
                        "superseded" if status is None else status,
                    )
                    return _NotRun("MOVED_ON")
        finally:
            if not call.done():
                call.cancel()

    async def execute(self, cmd: NodeCommand) -> NodeReport | _Retry | _NotRun:
        """Run one attempt of the node. A non-retryable error, or an output that does not parse as
        the node's contract (``INVALID_NODE_OUTPUT``: the same answer would not parse again),
        fails the node at once; a model past its node's deadline ends it ``TIMED_OUT``; a transient
        error (a crashed replica, a network error, a retryable model error) is handed back to the
        store as a failed attempt, which re-dispatches the node as a new instance (NODE_FAILED,
        NODE_RETRY_SCHEDULED) or ends the job after the last attempt, so every attempt is visible.
        A hang is for the heartbeat and the deadline."""

        def report(
            outcome: str, code: str | None = None, message: str | None = None, output: dict[str, Any] | None = None
        ) -> NodeReport:
            return NodeReport(
                node_instance_id=cmd.node_instance_id,
                node_type=cmd.node_type,
                job_id=cmd.job_id,
                outcome=outcome,
                error_code=code,
                error_message=message,
                output=output or {},
            )

        status = await self._node_status(cmd)
        if status == "RUNNING":
            return _NotRun("BUSY")
        if status not in ("QUEUED", "RETRY_WAIT"):  # superseded, ended, cancelled: nothing to run
            return _NotRun("MOVED_ON")
        if cmd.node_type in CONTROL_PLANE_NODES:  # this process does the work: it starts the node
            started = await self.store.node_started(cmd, actor=f"dispatcher:{self.consumer}")
            return report("SUCCEEDED") if started == "OK" else _NotRun(started)
        spec = RunSpec(
            redis_url=self.redis_url or "",
            job_id=cmd.job_id,
            node_instance_id=cmd.node_instance_id,
            node_type=cmd.node_type,
            max_execution_s=self.store.config.max_execution_s(cmd.node_type),
            every_s=self.heartbeat_s,
        )
        deployment = self._deployment_of(cmd.node_type)
        self._starting.pop(cmd.node_instance_id, None)  # waiting for its slot now: counted by the slots
        await self.slots.acquire(deployment)
        t0 = time.perf_counter()
        try:
            raw = await self._call(cmd, spec)
            if isinstance(raw, _NotRun):
                return raw
            why = not_started(raw)
            if why is not None:
                return _NotRun(why)
            output = parse_output(cmd.node_type, raw).model_dump(mode="json")
            metrics.NODE_SECONDS.labels(cmd.node_type, "SUCCEEDED").observe(time.perf_counter() - t0)
            return report("SUCCEEDED", output=output)
        except NodeExecutionError as e:
            metrics.NODE_SECONDS.labels(cmd.node_type, "FAILED").observe(time.perf_counter() - t0)
            if e.code == NODE_DEADLINE_EXCEEDED:
                return report("TIMED_OUT", e.code, e.message)
            if not e.retryable:
                return report("FAILED", e.code, e.message)
            return _Retry(e.code, e.message)
        except Exception as e:  # model crash, replica gone, network: transient
            metrics.NODE_SECONDS.labels(cmd.node_type, "ERROR").observe(time.perf_counter() - t0)
            return _Retry("NODE_FAILED", f"{type(e).__name__}: {e}")
        finally:
            self.slots.release(deployment)


class LocalRunner:
    """Runs nodes in this process, ``threads`` at a time, with the backends of
    ``deployments.executor``: the plain-uvicorn mode and the tests. Ray Serve uses
    ``application.ServeRunner``. Its one "deployment" has as many slots as threads, so a node is
    started only when a thread is free to compute it."""

    DEPLOYMENT = "local"

    def __init__(self, models: Any, artifacts: Any, threads: int = 8) -> None:
        self.models = models
        self.artifacts = artifacts
        self.threads = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="hitl-node")
        self._limits = {self.DEPLOYMENT: threads}

    def deployment_of(self, node_type: str) -> str:
        return self.DEPLOYMENT

    def limits(self) -> dict[str, int]:
        return self._limits

    async def run(self, cmd: NodeCommand, spec: RunSpec) -> dict[str, Any]:
        from hitl_review.deployments.executor import run_node

        def work() -> Awaitable[dict[str, Any]]:
            compute = functools.partial(run_node, cmd.node_type, cmd.input, self.models, self.artifacts)
            return asyncio.get_running_loop().run_in_executor(self.threads, compute)

        # This process does the work: it records the start, beats and keeps the deadline.
        return await run_started(spec, work)

    async def preview(self, image: ImageRef, bbox: list[float], points: list[dict[str, Any]]) -> dict[str, Any]:
        """A reviewer's preview mask (``deployments.preview``), on a node thread of this process."""
        from hitl_review.deployments.preview import preview_mask

        compute = functools.partial(preview_mask, self.models, self.artifacts, image, bbox, points)
        result: dict[str, Any] = await asyncio.get_running_loop().run_in_executor(self.threads, compute)
        return result
