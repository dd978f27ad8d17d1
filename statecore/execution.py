"""What the process doing a node's work does around it (docs/protocol.md § Lifecycle of a node).

A node becomes ``RUNNING`` when the process that computes it begins, not when a dispatcher hands
the call to Ray Serve: a call waiting in Serve's router or replica queue is still ``QUEUED``, has
no deadline and needs no heartbeat. So the executor (a model replica, or the in-process runner)
calls :func:`run_started` around the model work:

1. record the start in one script (attempt + 1, deadline = Redis ``TIME`` + the node type's
   maximum execution time, first heartbeat): ``Store.node_started``. Anything but ``OK`` (the
   node is already running elsewhere, superseded, or its job ended) means the work is not done:
   the answer is ``{NOT_STARTED: <why>}``;
2. renew the heartbeat while it computes (:class:`statecore.heartbeat.Heartbeat`);
3. stop at the deadline: the call then raises ``NODE_DEADLINE_EXCEEDED`` (not retryable), so a
   model stuck past its deadline holds no slot for ever.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from .errors import NodeExecutionError
from .heartbeat import Heartbeat, HeartbeatSpec

NOT_STARTED = "_hitl_not_started"  # the answer's only key when the executor did not start the node
NODE_DEADLINE_EXCEEDED = "NODE_DEADLINE_EXCEEDED"

_stores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]] = weakref.WeakKeyDictionary()


class RunSpec(HeartbeatSpec):
    """What an executor needs to start, beat for and bound one node (crosses Ray as a dict)."""

    node_type: str
    max_execution_s: float = 600.0


def _store(url: str) -> Any:
    """One store per Redis URL and event loop in this process (a replica runs one loop)."""
    from .store import Store

    per_loop = _stores.setdefault(asyncio.get_running_loop(), {})
    if url not in per_loop:
        per_loop[url] = Store.from_url(url, max_connections=32)
    return per_loop[url]


def not_started(answer: Any) -> str | None:
    """Why the executor did not start the node, or None when ``answer`` is the node's output."""
    if isinstance(answer, dict) and len(answer) == 1 and NOT_STARTED in answer:
        return str(answer[NOT_STARTED])
    return None


async def start(spec: RunSpec, actor: str = "") -> str:
    """Record the start of the node (``OK``), or say why it is not to be run: ``BUSY`` (running
    elsewhere), ``IGNORED``/``DUPLICATE`` (no longer the job's current node)."""
    result: str = await _store(spec.redis_url).node_started_by(
        spec.job_id,
        spec.node_instance_id,
        spec.node_type,
        max_execution_s=spec.max_execution_s,
        actor=actor or f"executor:{spec.executor or 'local'}",
    )
    return result


async def run_started(spec: RunSpec, work: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """Start the node, run ``work`` under its heartbeat and deadline, and return its output."""
    result = await start(spec)
    if result != "OK":
        return {NOT_STARTED: result}
    with Heartbeat(spec):
        try:
            return await asyncio.wait_for(work(), spec.max_execution_s)
        except TimeoutError:
            raise NodeExecutionError(
                f"{spec.node_type} ran past its maximum execution time of {spec.max_execution_s:g}s",
                code=NODE_DEADLINE_EXCEEDED,
                retryable=False,
            ) from None
