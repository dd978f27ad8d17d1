"""The steps a client plan yields, and ``Driver``, which performs none of them but keeps the bookkeeping.

Every operation of ``client.core.ClientCore`` is a *plan*: a generator that
yields the I/O it needs as small values and receives each outcome, then
returns the operation's result:

* ``Send(request, stream=False)``: send an ``httpx.Request``; the reply is the
  ``httpx.Response`` (with ``stream=True`` only its head, plus the body when the
  status is an error), or an ``httpx.TransportError`` thrown into the plan;
* ``ReadLine()``: the next line of the open stream, or None at its end;
* ``Close()``: close the open stream;
* ``Sleep(seconds)``;
* ``Emit(value)``: hand a value to the caller (an event, a job of a listing).

The two clients only perform those steps, blocking or with ``await``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import httpx

T = TypeVar("T")


@dataclass(frozen=True)
class Send:
    request: httpx.Request
    stream: bool = False


@dataclass(frozen=True)
class ReadLine:
    pass


@dataclass(frozen=True)
class Close:
    pass


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Emit:
    value: Any


Step: TypeAlias = Send | ReadLine | Close | Sleep | Emit
Plan: TypeAlias = Generator[Step, Any, T]


def emit_result(plan: Plan[T]) -> Plan[None]:
    """``plan`` with its result handed out as its one ``Emit``, so one driver serves calls and iterators."""
    result = yield from plan
    yield Emit(result)


class Driver:
    """Steps one plan: iterating gives its steps; each I/O step's outcome goes back through ``settle``."""

    def __init__(self, plan: Plan[None]) -> None:
        self._plan = plan
        self._reply: Any = None
        self._error: httpx.TransportError | None = None

    def __iter__(self) -> Iterator[Step]:
        while True:
            reply, error = self._reply, self._error
            self._reply, self._error = None, None
            try:
                yield self._plan.throw(error) if error is not None else self._plan.send(reply)
            except StopIteration:
                return

    def settle(self, perform: Callable[[], Any]) -> None:
        """Run one blocking I/O step; its result, or its transport error, is what the plan receives next."""
        try:
            self._reply = perform()
        except httpx.TransportError as exc:
            self._error = exc

    async def asettle(self, performing: Awaitable[Any]) -> None:
        """``settle`` for an awaitable I/O step."""
        try:
            self._reply = await performing
        except httpx.TransportError as exc:
            self._error = exc

    def close(self) -> None:
        self._plan.close()
