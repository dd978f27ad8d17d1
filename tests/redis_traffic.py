"""What a piece of code sends to the real redis-server and gets back: round trips (one per packed send:
a pipeline is one), commands by name and the size of the parsed replies. Counted on redis-py's
connection class while the ``with`` block runs, so a test can say a read's cost does not grow with
the data (issue 37), without a timing assertion. Only what the block itself sends is counted (and the
tasks it starts: a context variable they inherit), not what other loops of the process send meanwhile
(a dispatcher or archiver another test left running, a server fixture in this process)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio.connection import AbstractConnection


@dataclass
class Traffic:
    round_trips: int = 0
    commands: Counter[str] = field(default_factory=Counter)
    reply_chars: int = 0  # len(repr()) of every parsed reply

    @property
    def sent(self) -> int:
        return sum(self.commands.values())


_COUNTING: ContextVar[Traffic | None] = ContextVar("redis_traffic", default=None)


@contextmanager
def traffic() -> Iterator[Traffic]:
    seen = Traffic()
    token = _COUNTING.set(seen)
    pack, send, read = (
        AbstractConnection.pack_command,
        AbstractConnection.send_packed_command,
        AbstractConnection.read_response,
    )

    def pack_command(self: Any, *args: Any) -> Any:
        if _COUNTING.get() is seen:
            name = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
            seen.commands[name.upper()] += 1
        return pack(self, *args)

    async def send_packed_command(self: Any, *args: Any, **kw: Any) -> Any:
        if _COUNTING.get() is seen:
            seen.round_trips += 1
        return await send(self, *args, **kw)

    async def read_response(self: Any, *args: Any, **kw: Any) -> Any:
        reply = await read(self, *args, **kw)
        if _COUNTING.get() is seen:
            seen.reply_chars += len(repr(reply))
        return reply

    AbstractConnection.pack_command = pack_command  # type: ignore[method-assign]  # instrumentation, restored below
    AbstractConnection.send_packed_command = send_packed_command  # type: ignore[method-assign]  # the same
    AbstractConnection.read_response = read_response  # type: ignore[method-assign]  # the same
    try:
        yield seen
    finally:
        _COUNTING.reset(token)
        AbstractConnection.pack_command = pack  # type: ignore[method-assign]  # restored
        AbstractConnection.send_packed_command = send  # type: ignore[method-assign]  # restored
        AbstractConnection.read_response = read  # type: ignore[method-assign]  # restored
