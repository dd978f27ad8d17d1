"""The webhook deliverer (docs/protocol.md § Webhooks): posts the queued events to the webhooks.

It runs beside the archiver's loop (the Archiver deployment's replica on Ray Serve, the server's own
process under plain uvicorn), apart from every transition: the script that changes a job only
queues the delivery (:mod:`statecore.webhooks`), so a slow or failing receiver delays no job.

Each entry read from the webhook streams is posted, signed, to every webhook that wants its type,
each with its own retries: a 2xx is delivered; anything else (a 3xx too: redirects are never
followed, to another host or any), a timeout or a refused connection is retried after a backoff
that doubles from ``backoff_s`` up to ``max_backoff_s``, until ``give_up_after_s`` has passed since
the first attempt. The entry is acknowledged (and deleted) once every webhook took it or was given
up; until then it stays pending in the group, its idle time renewed, and a deliverer that dies
leaves it to be reclaimed and posted again by another (hence at least once). At most ``concurrency``
posts are in flight and at most ``max_held`` entries held.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from urllib.parse import urlsplit

import httpx
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from hitl_review.statecore import webhooks
from hitl_review.statecore.durable import reraise_if_cancelled
from hitl_review.statecore.webhooks import Delivery, Webhook

from ..observability import metrics


def _version() -> str:
    """The installed distribution's version; the replicas of a Ray cluster get the packages REPLICA_PACKAGES
    names, not ``hitl_review``'s own ``__init__`` (tests/test_cluster_packages.py)."""
    try:
        return version("hitl-review")
    except PackageNotFoundError:
        return "unknown"


_VERSION = _version()

log = logging.getLogger("hitl.webhooks")


def _where(url: str) -> str:
    """The URL as logs show it: scheme, host and path, never a query (it may carry a key)."""
    u = urlsplit(url)
    return f"{u.scheme}://{u.netloc.rpartition('@')[2]}{u.path}"


class WebhookDeliverer:
    def __init__(
        self,
        r: Any,
        hooks: list[Webhook],
        secret: str,
        *,
        cluster: bool = False,
        consumer: str | None = None,
        concurrency: int = 8,
        timeout_s: float = 10.0,
        max_held: int = 256,
        backoff_s: float = 1.0,
        max_backoff_s: float = 300.0,
        give_up_after_s: float = 24 * 3600.0,
        reclaim_idle_ms: int = 60_000,
    ) -> None:
        self.r = r
        self.hooks = hooks
        self._secret = secret
        self.cluster = cluster
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{random.randrange(1 << 30):x}"
        self.sem = asyncio.Semaphore(concurrency)
        self.timeout_s = timeout_s
        self.max_held = max_held
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.give_up_after_s = give_up_after_s
        self.reclaim_idle_ms = reclaim_idle_ms
        self.held: dict[tuple[str, str], Delivery] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:  # never the secret
        return f"WebhookDeliverer({len(self.hooks)} webhooks, consumer={self.consumer})"

    async def run_forever(self) -> None:
        async with httpx.AsyncClient(follow_redirects=False, trust_env=False) as client:
            self.client = client
            try:
                await self._loop()
            finally:  # the deliveries stop before their client closes (they stay pending in Redis)
                for t in list(self._tasks):
                    t.cancel()
                await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _loop(self) -> None:
        groups_ok = False
        last_reclaim = last_renew = 0.0
        renew_every_s = self.reclaim_idle_ms / 3000
        while True:
            reraise_if_cancelled(None)
            try:
                if not groups_ok:
                    await webhooks.ensure_group(self.r)
                    groups_ok = True
                if time.monotonic() - last_renew > renew_every_s:
                    last_renew = time.monotonic()
                    await webhooks.renew(self.r, self.consumer, list(self.held.values()))
                if time.monotonic() - last_reclaim > 5.0:
                    last_reclaim = time.monotonic()
                    for d in await webhooks.reclaim(self.r, self.consumer, self.reclaim_idle_ms):
                        self._spawn(d)
                free = self.max_held - len(self.held)
                if free <= 0:
                    await asyncio.sleep(0.05)
                    continue
                for d in await webhooks.read(self.r, self.consumer, free, block_ms=1000, cluster=self.cluster):
                    self._spawn(d)
            except (RedisConnectionError, RedisTimeoutError) as e:
                reraise_if_cancelled(e)
                log.warning("webhooks: Redis unavailable (%s); retrying in 1s", e)
                await asyncio.sleep(1)
            except ResponseError as e:
                reraise_if_cancelled(e)
                if "NOGROUP" in str(e):  # Redis came back empty: the streams and group again
                    groups_ok = False
                else:
                    log.warning("webhooks loop error (retrying): %s", e)
                    await asyncio.sleep(1)
            except Exception as e:  # an entry that does not parse, a bug: logged, the loop goes on
                reraise_if_cancelled(e)
                log.exception("webhooks loop error (retrying): %s", e)
                await asyncio.sleep(1)

    def _spawn(self, d: Delivery) -> None:
        key = (d.stream, d.entry_id)
        if key in self.held:
            return
        self.held[key] = d
        task = asyncio.create_task(self._deliver(d))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, d: Delivery) -> None:
        """Every webhook that wants it, concurrently, each until taken or given up; then the ack."""
        try:
            await asyncio.gather(*(self._until_done(d, h) for h in self.hooks if h.wants(d.type)))
            while True:
                try:
                    await webhooks.ack(self.r, d)
                    break
                except (RedisConnectionError, RedisTimeoutError) as e:
                    reraise_if_cancelled(e)
                    await asyncio.sleep(1)
        except Exception as e:  # left pending: reclaimed and tried again after reclaim_idle_ms
            reraise_if_cancelled(e)
            log.exception("webhook delivery %s failed unexpectedly: %s", d.event_id, e)
        finally:
            self.held.pop((d.stream, d.entry_id), None)

    async def _until_done(self, d: Delivery, hook: Webhook) -> None:
        first = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            async with self.sem:
                status, error, ms = await self._post(d, hook, attempt)
            ok = status is not None and 200 <= status < 300
            gave_up = not ok and time.monotonic() - first >= self.give_up_after_s
            outcome = "delivered" if ok else "gave_up" if gave_up else "failed"
            metrics.WEBHOOK_DELIVERIES.labels(outcome).inc()
            await self._log(d, hook, attempt, outcome, status, error, ms)
            if ok or gave_up:
                if gave_up:
                    where = _where(hook.url)
                    log.error("webhook %s: gave up on %s %s after %d attempts", where, d.type, d.event_id, attempt)
                return
            delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)) * random.uniform(0.8, 1.0)
            await asyncio.sleep(delay)

    async def _post(self, d: Delivery, hook: Webhook, attempt: int) -> tuple[int | None, str | None, int]:
        headers = {
            "Content-Type": "application/json",
            "User-Agent": f"hitl-review-webhooks/{_VERSION}",
            webhooks.ID_HEADER: d.event_id,
            webhooks.TYPE_HEADER: d.type,
            webhooks.ATTEMPT_HEADER: str(attempt),
            webhooks.SIGNATURE_HEADER: webhooks.sign(self._secret, d.body, int(time.time())),
        }
        t0 = time.monotonic()
        try:
            res = await self.client.post(hook.url, content=d.body, headers=headers, timeout=self.timeout_s)
            status, error = res.status_code, None if res.is_success else f"HTTP {res.status_code}"
        except httpx.TimeoutException:
            status, error = None, f"timed out after {self.timeout_s:g}s"
        except Exception as e:  # refused, reset, a bad URL: this attempt failed, the next may not
            reraise_if_cancelled(e)
            status, error = None, f"{type(e).__name__}: {e}"[:200]
        return status, error, int((time.monotonic() - t0) * 1000)

    async def _log(
        self, d: Delivery, hook: Webhook, attempt: int, outcome: str, status: int | None, error: str | None, ms: int
    ) -> None:
        if outcome == "failed":
            log.warning("webhook %s: %s %s attempt %d failed: %s", _where(hook.url), d.type, d.event_id, attempt, error)
        record = {
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "event_id": d.event_id,
            "type": d.type,
            "url": _where(hook.url),
            "attempt": attempt,
            "outcome": outcome,
            "status": status,
            "error": error,
            "ms": ms,
        }
        try:
            await webhooks.log_attempt(self.r, record)
        except Exception as e:  # the log is for people: a failed line never holds a delivery up
            reraise_if_cancelled(e)
            log.debug("webhook log line lost: %s", e)


def start_webhooks(settings: Any, store: Any) -> asyncio.Task[None] | None:
    """The deliverer's task beside an archive loop (the caller cancels it with the loop); None without
    webhooks. ``store``: a store whose timeout allows the 1 s blocking read."""
    deliverer = webhook_deliverer(settings, store.r, cluster=bool(getattr(store, "cluster", False)))
    if deliverer is None:
        return None
    log.info("webhooks: %d configured (%s)", len(deliverer.hooks), ", ".join(_where(h.url) for h in deliverer.hooks))
    return asyncio.create_task(deliverer.run_forever(), name="webhooks")


def webhook_deliverer(settings: Any, r: Any, cluster: bool = False) -> WebhookDeliverer | None:
    """The deliverer the settings ask for, or None without webhooks."""
    if not settings.webhooks:
        return None
    return WebhookDeliverer(
        r,
        [Webhook.parse(s) for s in settings.webhooks],
        settings.webhook_secret or "",
        cluster=cluster,
        concurrency=settings.webhook_concurrency,
        timeout_s=settings.webhook_timeout_s,
        give_up_after_s=settings.webhook_give_up_after_s,
    )
