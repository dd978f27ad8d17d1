"""The outbox dispatcher: delivers node commands to the models, applies their reports.

At-least-once delivery (consumer group, ack after the report is applied,
reclaim of entries a dead dispatcher held) plus at-most-once application
(reports keyed by node_instance_id in the Lua script) gives exactly-once effect.
Executors never write job status; they only return a node's output.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from statecore import deadletters
from statecore.durable import reraise_if_cancelled
from statecore.errors import NodeExecutionError
from statecore.heartbeat import Heartbeat, HeartbeatSpec
from statecore.models import NodeCommand, NodeReport
from statecore.nodes import CONTROL_PLANE_NODES, parse_output
from statecore.outbox import OutboxEntry
from statecore.store import Store

from . import metrics
from .archiving import ARCHIVE_JOB, COPIES, ArchiveWorker, LocalArchiveWorker
from .inspector import Confirm, Inspector
from .store_reset import ResetWatch
from .writeback import WriteBack

log = logging.getLogger("hitl.dispatcher")

ARCHIVE_CALL_S = 60.0  # the longest one archive call may take (copy or mirror) before it counts as failed


@dataclass(frozen=True)
class _Retry:
    """A transient failure of one attempt: the store decides whether another attempt follows."""

    code: str
    message: str


class NodeRunner(Protocol):
    async def run(self, cmd: NodeCommand, heartbeat: HeartbeatSpec | None = None) -> dict[str, Any]: ...


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
        archiver: ArchiveWorker | None = None,
    ) -> None:
        self.store = store
        self.runner = runner
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{random.randrange(1 << 30):x}"
        self.sem = asyncio.Semaphore(concurrency)
        self.reclaim_idle_ms = reclaim_idle_ms
        self.reclaim_every_s = reclaim_every_s
        self.inspect_every_s = inspect_every_s
        self.concurrency = concurrency
        self.redis_url = redis_url  # where the process running a node sends its heartbeats
        self.heartbeat_s = heartbeat_s
        self.inspector = Inspector(
            store,
            owner=self.consumer,
            period_s=inspect_every_s,
            heartbeat_lapse_s=heartbeat_lapse_s,
            confirm=confirm,
            consumer=self.consumer,
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._held: set[tuple[str, str]] = set()  # (stream, entry id): ids repeat across partitions
        self.groups_recreated = 0  # NOGROUP recoveries (Redis came back empty)
        # Results Redis could not take wait in <data-dir>/spool (docs/protocol.md § Executors and the outbox).
        self.writeback = WriteBack(store, data_dir)
        # A Redis that came back empty is reported, with what it held (docs/protocol.md § Redis outages).
        self.resets = ResetWatch(store, data_dir, self.consumer)
        self.max_deliveries = max_deliveries  # a command delivered more often becomes a dead letter
        # Runs ARCHIVE_JOB and the live mirror (docs/protocol.md § Archive, § Reconcile); the default one
        # has no archive: a finished job's retention starts without a copy (--no-archive).
        self.archiver: ArchiveWorker = archiver or LocalArchiveWorker(store, None)
        # Archive work never takes the slots node commands need, nor the loop: at most a quarter of the
        # slots copy at once (more stay pending, reclaimed later), each call is bounded, and the live
        # mirror runs beside the loop, one at a time. A hung Archiver delays the archive, not the jobs.
        self.archive_slots = max(1, concurrency // 4)
        self._archiving = 0
        self._mirroring: asyncio.Task[None] | None = None
        self.archive_call_s = ARCHIVE_CALL_S

    async def run_forever(self) -> None:
        resume = asyncio.create_task(self.writeback.resume())  # a spool an earlier process left
        try:
            await self._loop()
        finally:
            resume.cancel()

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
        last_reclaim = last_inspect = 0.0
        while True:
            reraise_if_cancelled(None)  # a cancel a library swallowed on the way (statecore.durable)
            try:
                if time.monotonic() - last_inspect > self.inspect_every_s:
                    last_inspect = time.monotonic()
                    await self.inspector.sweep()
                    await self.inspector.housekeeping()
                    await self.resets.check()
                    if self._mirroring is None or self._mirroring.done():
                        self._mirroring = asyncio.create_task(self._mirror(self.inspector.held()))
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
                # Take from the outbox only what can run now: what is left waits for another
                # dispatcher (or for a free slot here), instead of being hoarded.
                free = self.concurrency - len(self._tasks)
                if free <= 0:
                    await asyncio.sleep(0.05)
                    continue
                for entry in await self.store.outbox_read(self.consumer, count=free, block_ms=1000):
                    self._spawn(entry)
            except asyncio.CancelledError:
                for t in list(self._tasks):
                    t.cancel()
                if self._mirroring is not None:
                    self._mirroring.cancel()
                raise
            except (RedisConnectionError, RedisTimeoutError) as e:  # Redis down or hung: wait for it
                reraise_if_cancelled(e)
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

    async def _mirror(self, partitions: list[int]) -> None:
        try:
            await asyncio.wait_for(self.archiver.mirror(partitions), self.archive_call_s)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the next period mirrors again
            log.warning("live mirror of partitions %s failed: %s: %s", partitions, type(e).__name__, e)

    def _spawn(self, entry: OutboxEntry) -> None:
        key = (entry.stream, entry.entry_id)
        if key in self._held:
            return  # already being worked on here (reclaimed our own entry)
        self._held.add(key)
        task = asyncio.create_task(self._guarded(entry))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(self, entry: OutboxEntry) -> None:
        try:
            not_before = entry.command.not_before_ms
            if not_before:  # a re-dispatch's backoff
                await asyncio.sleep(max(0.0, not_before / 1000 - time.time()))
            async with self.sem:
                await self.handle(entry)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Not acked: another dispatcher (or this one) reclaims it after reclaim_idle_ms.
            log.exception("command %s %s left pending after an error", entry.stream, entry.entry_id)
        finally:
            self._held.discard((entry.stream, entry.entry_id))

    async def handle(self, entry: OutboxEntry) -> None:
        cmd = entry.command
        if entry.deliveries > self.max_deliveries:
            # A command that keeps coming back (its dispatchers died on it) is not run again.
            await deadletters.add(
                self.store.r,
                job_id=cmd.job_id,
                kind="command",
                reason=f"MAX_DELIVERIES_EXCEEDED: delivered {entry.deliveries} times (--max-deliveries "
                f"{self.max_deliveries})",
                payload=cmd.model_dump(mode="json"),
            )
            await self.store.outbox_ack(entry)
            log.error("dead letter: %s node=%s job=%s", cmd.node_type, cmd.node_instance_id, cmd.job_id)
            return
        if cmd.node_type == ARCHIVE_JOB:
            if self._archiving >= self.archive_slots:
                return  # left pending, reclaimed later: the other slots stay for node commands
            self._archiving += 1
            try:
                result = await asyncio.wait_for(self.archiver.copy(cmd.job_id), self.archive_call_s)
            finally:
                self._archiving -= 1
            if result == "STALE":  # the job kept moving while copied: left pending, copied again later
                log.warning("archive of job=%s fell behind %d times; will retry", cmd.job_id, COPIES)
                return
            await self.store.outbox_ack(entry)
            return
        started = await self.store.node_started(cmd, actor=f"dispatcher:{self.consumer}")
        if started == "BUSY":
            # Reclaimed from a dispatcher that is still running it (its heartbeat is live): a long
            # node is never started twice. Its holder acks it; if the holder dies, the heartbeat
            # lapses and the inspector re-dispatches the node as a new instance.
            log.info("leave %s node=%s job=%s: already running", cmd.node_type, cmd.node_instance_id, cmd.job_id)
            return
        if started != "OK":
            log.info("skip %s node=%s job=%s: no longer current", cmd.node_type, cmd.node_instance_id, cmd.job_id)
            await self.store.outbox_ack(entry)
            return
        outcome = await self.execute(cmd)
        if isinstance(outcome, _Retry):
            result = await self.store.node_failed(
                cmd.job_id, cmd.node_instance_id, reason=outcome.code, actor=f"dispatcher:{self.consumer}"
            )
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

    async def execute(self, cmd: NodeCommand) -> NodeReport | _Retry:
        """Run one attempt of the node. A non-retryable error, or an output that does not parse as
        the node's contract (``INVALID_NODE_OUTPUT``: the same answer would not parse again),
        fails the node at once; a transient error (a crashed replica, a network error, a
        retryable model error) is handed back to the store as a failed attempt, which re-dispatches
        the node as a new instance (NODE_FAILED, NODE_RETRY_SCHEDULED) or ends the job after the
        last attempt, so every attempt is visible. A hang is for the heartbeat and the deadline."""

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

        if cmd.node_type in CONTROL_PLANE_NODES:
            return report("SUCCEEDED")
        t0 = time.perf_counter()
        try:
            raw = await self.runner.run(cmd, self._heartbeat(cmd))
            output = parse_output(cmd.node_type, raw).model_dump(mode="json")
            metrics.NODE_SECONDS.labels(cmd.node_type, "SUCCEEDED").observe(time.perf_counter() - t0)
            return report("SUCCEEDED", output=output)
        except NodeExecutionError as e:
            metrics.NODE_SECONDS.labels(cmd.node_type, "FAILED").observe(time.perf_counter() - t0)
            if not e.retryable:
                return report("FAILED", e.code, e.message)
            return _Retry(e.code, e.message)
        except Exception as e:  # model crash, replica gone, network: transient
            metrics.NODE_SECONDS.labels(cmd.node_type, "ERROR").observe(time.perf_counter() - t0)
            return _Retry("NODE_FAILED", f"{type(e).__name__}: {e}")

    def _heartbeat(self, cmd: NodeCommand) -> HeartbeatSpec | None:
        if self.redis_url is None:
            return None
        return HeartbeatSpec(
            redis_url=self.redis_url, job_id=cmd.job_id, node_instance_id=cmd.node_instance_id, every_s=self.heartbeat_s
        )


class LocalRunner:
    """Runs nodes in this process (threads) with the backends of ``deployments.executor``:
    the plain-uvicorn mode and the tests. Ray Serve uses ``application.ServeRunner``."""

    def __init__(self, models: Any, artifacts: Any) -> None:
        self.models = models
        self.artifacts = artifacts

    async def run(self, cmd: NodeCommand, heartbeat: HeartbeatSpec | None = None) -> dict[str, Any]:
        from deployments.executor import run_node

        with Heartbeat(heartbeat):  # this process does the work, so it beats
            return await asyncio.to_thread(run_node, cmd.node_type, cmd.input, self.models, self.artifacts)


def main(argv: list[str] | None = None) -> int:
    """A standalone dispatcher process (models in threads): `python -m serve_app.dispatcher`.

    `hitl up` runs dispatchers inside the API replicas; this entry point is for
    running extra ones next to an existing deployment and for the crash tests."""
    import argparse
    from pathlib import Path

    from deployments.executor import build_models
    from statecore.artifacts import ArtifactStore

    from .config import Settings

    p = argparse.ArgumentParser(prog="python -m serve_app.dispatcher", description=main.__doc__)
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL"), required=not os.environ.get("REDIS_URL"))
    p.add_argument("--data-dir", default=".hitl", help="its artifacts/ folder holds images, masks and cut-outs")
    p.add_argument("--detector-delay-ms", type=int, default=0)
    p.add_argument("--consumer", default=None, help="consumer name in the outbox group (default host-pid-rand)")
    p.add_argument("--reclaim-idle-ms", type=int, default=60_000)
    p.add_argument("--max-deliveries", type=int, default=10, help="a command delivered more often is a dead letter")
    p.add_argument(
        "--reclaim-every-s", type=float, default=5.0, help="look for silent dispatchers' commands this often"
    )
    p.add_argument("--heartbeat-s", type=float, default=2.0, help="renew a running node's heartbeat this often")
    p.add_argument("--heartbeat-lapse-s", type=float, default=15.0, help="a heartbeat older than this: executor lost")
    p.add_argument("--inspector-period-s", type=float, default=5.0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings(
        data_dir=Path(args.data_dir).resolve(),
        redis_url=args.redis_url,
        detector_delay_ms=args.detector_delay_ms,
        reclaim_idle_ms=args.reclaim_idle_ms,
        max_deliveries=args.max_deliveries,
        heartbeat_s=args.heartbeat_s,
        heartbeat_lapse_s=args.heartbeat_lapse_s,
        inspector_period_s=args.inspector_period_s,
    )
    store = Store.from_url(args.redis_url)
    artifacts = ArtifactStore(settings.artifacts)
    runner = LocalRunner(build_models(settings.backend_config()), artifacts)
    dispatcher = Dispatcher(
        store,
        runner,
        consumer=args.consumer,
        reclaim_idle_ms=args.reclaim_idle_ms,
        reclaim_every_s=args.reclaim_every_s,
        redis_url=args.redis_url,
        heartbeat_s=settings.heartbeat_s,
        heartbeat_lapse_s=settings.heartbeat_lapse_s,
        inspect_every_s=settings.inspector_period_s,
        data_dir=settings.data_dir,
        max_deliveries=settings.max_deliveries,
    )
    try:
        asyncio.run(dispatcher.run_forever())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
