"""``--durability fast|strict`` and the start-up check of an external Redis (README, Configuration).

- fast (default): AOF with ``appendfsync everysec``. Redis writes the AOF before it replies, so a
  killed redis-server loses nothing; only a crash of the machine can lose about the last second.
- strict: ``appendfsync always`` on the embedded Redis; with an archive, the journal (every change a
  client can observe is in the archive's live mirror before it is answered or read:
  archive/journal.py, docs/protocol.md § Redis outages); and after each state-changing script the
  store runs, on the same connection, ``WAITAOF 1 0 <ms>`` where the server has it (Redis >= 7.2),
  else ``WAIT <replicas> <ms>`` when replicas are attached: a 200 means the change is on disk
  (and on the replicas). Redis 7.0 without replicas relies on ``appendfsync always`` alone, which
  fsyncs before the reply is sent.

An external Redis (``--redis-url``) must keep what it is given: persistence on (AOF or RDB) and
nothing evictable (``maxmemory-policy noeviction`` or no ``maxmemory``). Otherwise ``hitl up``
refuses to start, or with ``--allow-volatile-redis`` warns loudly.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import redis

from hitl_review.statecore.store import Store

from ..observability import metrics

if TYPE_CHECKING:
    from hitl_review.archive.db import Archive

log = logging.getLogger("hitl.durability")

MODES = ("fast", "strict")


def appendfsync(durability: str) -> str:
    """The embedded redis-server's ``appendfsync`` for a mode."""
    return "always" if durability == "strict" else "everysec"


def _version(info: dict[str, Any]) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in str(info.get("redis_version", "0")).split(".")[:3])
    except ValueError:
        return (0,)


async def configure(store: Store, durability: str, timeout_s: float, archive: Archive | None = None) -> str:
    """Set the store's after-write sync for ``durability``, and under strict with an ``archive`` its
    journal (archive/journal.py: the live mirror's row of a changed job before the change is
    answered or read); returns what it chose, for the log."""
    store.sync_command, store.sync_acks = None, 0
    if archive is not None:
        from hitl_review.archive import journal

        journal.attach(
            store,
            archive,
            durability,
            on_error=lambda _e: metrics.MIRROR_FAILURES.labels("journal").inc(),
            on_write=metrics.JOURNAL_SECONDS.observe,
        )
    if durability != "strict":
        return "fast: appendfsync everysec"
    if store.cluster:
        return "strict on a cluster: relies on the nodes' appendfsync always (no WAITAOF across slots)"
    ms = max(1, int(timeout_s * 1000))
    server = await store.r.info("server")
    if _version(server) >= (7, 2):
        store.sync_command, store.sync_acks = ("WAITAOF", 1, 0, ms), 1
        return f"strict: WAITAOF 1 0 {ms} after each state change"
    replicas = int((await store.r.info("replication")).get("connected_slaves", 0) or 0)
    if replicas:
        store.sync_command, store.sync_acks = ("WAIT", replicas, ms), replicas
        return f"strict: WAIT {replicas} {ms} after each state change (Redis {server.get('redis_version')})"
    return f"strict: appendfsync always (Redis {server.get('redis_version')} has no WAITAOF; no replicas to WAIT for)"


def external_problems(url: str, durability: str = "fast", timeout_s: float = 5.0) -> list[str]:
    """What makes the Redis at ``url`` lose or evict acknowledged state; empty when it is fine."""
    plain = url.replace("redis+cluster://", "redis://").replace("?cluster=true", "")
    client = redis.Redis.from_url(
        plain, decode_responses=True, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
    )
    problems: list[str] = []
    try:
        persistence = client.info("persistence")
        memory = client.info("memory")
        aof = int(persistence.get("aof_enabled", 0) or 0) == 1
        try:
            save = str(client.config_get("save").get("save", "") or "").strip()
            appendfsync_now = str(client.config_get("appendfsync").get("appendfsync", ""))
        except redis.ResponseError:  # CONFIG disabled (a managed Redis): judge by INFO alone
            save, appendfsync_now = "", ""
        if not aof and not save:
            problems.append("persistence is off (appendonly no and no RDB save points): a restart loses every job")
        maxmemory = int(memory.get("maxmemory", 0) or 0)
        policy = str(memory.get("maxmemory_policy", "noeviction"))
        if maxmemory and policy != "noeviction":
            problems.append(f"maxmemory-policy is {policy} with maxmemory {maxmemory}: live jobs could be evicted")
        if durability == "strict" and appendfsync_now and appendfsync_now != "always":
            problems.append(f"--durability strict asks for appendfsync always; this Redis has {appendfsync_now}")
    finally:
        client.close()
    return problems


def check_external(url: str, *, allow_volatile: bool, durability: str = "fast", timeout_s: float = 5.0) -> None:
    """Refuse (SystemExit) an external Redis that could lose or evict state, or warn under ``allow_volatile``."""
    problems = external_problems(url, durability, timeout_s)
    if not problems:
        log.info("external Redis keeps state: persistence on, nothing evictable")
        return
    text = "; ".join(problems)
    if not allow_volatile:
        raise SystemExit(
            f"hitl up: refusing the Redis at {url}: {text}. Turn on AOF (appendonly yes) or RDB, set "
            "maxmemory-policy noeviction, or pass --allow-volatile-redis to run anyway and risk losing jobs."
        )
    banner = "!" * 78
    log.warning(
        "%s\nVOLATILE REDIS (--allow-volatile-redis): %s\nAcknowledged jobs may be lost.\n%s", banner, text, banner
    )
