"""The dispatcher's side of the Archiver deployment (``ServeArchiveWorker``) groups copies into
``copy_many`` calls and hands each dispatcher task its own job's answer. The deployment itself runs
in ``tests/test_e2e_serve.py`` (a finished job reaches the archive through it); here a recording
stand-in for the DeploymentHandle checks the batching alone: how many calls, which jobs in each,
one job's failure failing only that job, a failed call failing its whole batch."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from serve_app.archiver_deployment import FAILED, ServeArchiveWorker


class Method:
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[list[str]] = []

    def remote(self, job_ids: list[str]) -> Any:
        self.calls.append(list(job_ids))

        async def reply() -> list[str]:
            await asyncio.sleep(0.01)
            return self.answer(job_ids)

        return reply()


class Handle:
    def __init__(self, answer: Any) -> None:
        self.copy_many = Method(answer)


async def test_copies_within_the_window_are_one_call_and_each_gets_its_answer() -> None:
    handle = Handle(lambda ids: [f"{FAILED}OperationalError: locked" if i == "job_3" else "OK" for i in ids])
    worker = ServeArchiveWorker(handle, batch=4, wait_s=0.05)
    results = await asyncio.gather(*(worker.copy(f"job_{i}") for i in range(10)), return_exceptions=True)
    # 10 at once with batches of 4: two full batches sent at once, the last 2 after the window.
    assert handle.copy_many.calls == [
        ["job_0", "job_1", "job_2", "job_3"],
        ["job_4", "job_5", "job_6", "job_7"],
        ["job_8", "job_9"],
    ]
    assert [r for i, r in enumerate(results) if i != 3] == ["OK"] * 9
    assert isinstance(results[3], RuntimeError) and "job_3" in str(results[3]) and "locked" in str(results[3])

    alone = await asyncio.wait_for(worker.copy("job_late"), timeout=5)  # a lone copy waits out the window only
    assert alone == "OK" and handle.copy_many.calls[-1] == ["job_late"]


async def test_a_failed_call_fails_its_whole_batch_and_the_next_one_is_sent() -> None:
    calls = 0

    def answer(ids: list[str]) -> list[str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("Archiver replica died")
        return ["STALE" for _ in ids]

    worker = ServeArchiveWorker(Handle(answer), batch=8, wait_s=0.02)
    first = await asyncio.gather(worker.copy("a"), worker.copy("b"), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in first)  # both commands stay pending
    assert await worker.copy("c") == "STALE"


async def test_a_cancelled_copy_does_not_break_its_batch() -> None:
    worker = ServeArchiveWorker(Handle(lambda ids: ["OK" for _ in ids]), batch=8, wait_s=0.05)
    doomed = asyncio.ensure_future(worker.copy("x"))
    kept = asyncio.ensure_future(worker.copy("y"))
    await asyncio.sleep(0)
    doomed.cancel()
    assert await kept == "OK"
    with pytest.raises(asyncio.CancelledError):
        await doomed
