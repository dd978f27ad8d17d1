"""What keeps the store honest when Redis misbehaves: the pool's timeouts and retry, and the
after-write sync of ``--durability strict`` (serve_app.recovery.durability chooses the command).

- ``pool_options``: socket connect and read timeouts, so a Redis that is down or hung (SIGSTOP)
  raises redis' ConnectionError/TimeoutError within ``timeout_s`` (the API answers 503
  STORE_UNAVAILABLE); a broken connection is retried once at once on a fresh one, a timeout never
  (a retry would double the wait).
- ``synced``: a state-changing script followed, on the same connection (WAITAOF and WAIT count
  the calling connection's writes), by the store's ``sync_command``, e.g. ``("WAITAOF", 1, 0, ms)``
  or ``("WAIT", n, ms)``; a reply with fewer than ``sync_acks`` acknowledgements is a
  ``StoreUnavailable``: the change is not acknowledged until it is on disk / on the replicas.
- ``store_unavailable``: which errors mean "the store cannot serve this now, try again later" (the
  API's 503 STORE_UNAVAILABLE, the write-back's spool and retry), decided here and nowhere else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from . import errors

# Redis down, hung past the operation timeout, loading its data set (BusyLoadingError is a
# ConnectionError), a cluster without a master for a slot, a replica after a failover
# (ReadOnlyError), out of memory under ``maxmemory-policy noeviction`` (OutOfMemoryError), or our
# own StoreUnavailable (a strict sync short of its acknowledgements).
UNAVAILABLE_TYPES: tuple[type[Exception], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ClusterDownError,
    redis_errors.TryAgainError,
    redis_errors.MasterDownError,
    redis_errors.ReadOnlyError,
    redis_errors.OutOfMemoryError,
    errors.StoreUnavailable,
)
# Error replies that redis-py raises as a plain ResponseError (message starting with the code), or
# whose class it may map differently across versions: the server refuses for now, not the request.
# MISCONF: an RDB snapshot failed under stop-writes-on-bgsave-error; BUSY: a script or module
# command runs past busy-reply-threshold; NOREPLICAS: fewer replicas than min-replicas-to-write.
UNAVAILABLE_REPLIES = frozenset(
    {"OOM", "READONLY", "MISCONF", "LOADING", "BUSY", "MASTERDOWN", "NOREPLICAS", "TRYAGAIN", "CLUSTERDOWN"}
)


# uvloop's answer to a write on a connection Redis closed a moment ago (redis-py reconnecting while the
# server is killed): a RuntimeError, not a ConnectionError. Seen in CI as a 500 during a Redis restart.
CLOSED_TRANSPORT = "the handler is closed"


def closed_transport(exc: BaseException) -> bool:
    """``exc`` is uvloop's RuntimeError for a write on a closed socket (Redis went away mid-connect)."""
    return type(exc) is RuntimeError and CLOSED_TRANSPORT in str(exc) and "Transport closed=True" in str(exc)


def store_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` means the store cannot serve this request now but may soon: answered 503
    STORE_UNAVAILABLE with ``Retry-After`` by the API, spooled and retried by the write-back.
    Nothing was written: Redis refuses such a command (or a script's first write) as a whole, and a
    closed socket (``closed_transport``) sent nothing."""
    if isinstance(exc, UNAVAILABLE_TYPES) or closed_transport(exc):
        return True
    if isinstance(exc, redis_errors.ResponseError):
        code = getattr(exc, "status_code", None) or str(exc).split(" ", 1)[0]
        return code in UNAVAILABLE_REPLIES
    return False


def pool_options(timeout_s: float | None, *, cluster: bool) -> dict[str, Any]:
    opts: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    if not cluster:
        opts["retry"] = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
    return opts


# The scripts whose answer a client can observe as a change of a job (or a replay of one): under
# ``--durability strict`` with an archive, each answer waits for the job's journal (the live mirror
# row, archive/journal.py) before it returns, so nothing is told, or readable as told, that a Redis
# coming back empty would not give back. Their answers: 'OK' (a change), or a replay of an earlier
# change whose journal may have failed ('REPLAY', 'DUPLICATE', 'ALREADY').
JOURNALED = frozenset({"create_job", "consume_pause", "apply_report", "cancel", "restore_job", "subject_write"})
JOURNAL_ANSWERS = frozenset({"OK", "REPLAY", "DUPLICATE", "ALREADY"})


def synced(store: Any, script: Any, name: str = "") -> Callable[..., Awaitable[Any]]:
    """``script`` followed by ``store.sync_command`` when one is set (not on a cluster), then, for a
    script of :data:`JOURNALED`, by ``store.journal`` when one is set (``--durability strict`` with
    an archive: serve_app.recovery.durability.configure)."""

    async def run(*, keys: list[str], args: list[Any]) -> Any:
        if store.sync_command is None or store.cluster:
            res = await script(keys=keys, args=args)
        else:
            async with store.r.pipeline(transaction=False) as pipe:
                await script(keys=keys, args=args, client=pipe)
                pipe.execute_command(*store.sync_command)
                res, acks = await pipe.execute()
            acked = int(acks[0] if isinstance(acks, list) else acks)
            if acked < store.sync_acks:
                raise errors.StoreUnavailable(f"{store.sync_command[0]} confirmed {acked} of {store.sync_acks}")
        journal = store.journal
        if journal is not None and name in JOURNALED and res and res[0] in JOURNAL_ANSWERS:
            await journal(store, str(args[0]), changed=res[0] == "OK")
        return res

    return run


def reraise_if_cancelled(exc: BaseException | None) -> None:
    """Re-raise a cancellation that a store error hides. A task cancelled while redis-py waits on a
    timeout (a Redis that is down: connect attempts time out) can get the TimeoutError or
    ConnectionError instead of its CancelledError (the timeout fires as the cancel arrives), and a
    loop that retries on store errors would then never stop: the task is still marked as being
    cancelled (``Task.cancelling()``), so every such handler calls this first, and a loop calls it
    once a round for a cancel swallowed without an error at all (seen under CPU load: a dispatcher
    cancelled during ``XREADGROUP BLOCK`` kept reading the outbox)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc
