"""The event pump: live updates of the open job from its event stream (docs/protocol.md § Events).

``AsyncHitlClient.events`` resumes with ``Last-Event-ID`` by itself; the pump
reads it on a task of the follower's own event loop, so a panel that waits for
hours holds no thread of Gradio's pool. When the client gives up on the stream
the follower polls ``GET /jobs/{id}`` until the stream is back: SSE is never
the only copy of anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncGenerator, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from hitl_review.client import AsyncHitlClient
from hitl_review.statecore.models import Event, JobSnapshot

from .panel import is_terminal
from .session import ReviewerState

POLL_FALLBACK_S = 2.0  # GET polling period while the stream is down
IDLE_S = 1.0  # how often a follower looks up from the stream (stop flags, a newer banner)
RETRY_MAX_S = 30.0  # longest wait before the pump opens a stream the client gave up on again
# Notes on the job (docs/protocol.md § Flags, skips and comments): announced on its events, at the job's
# version (they change nothing of it), so they are told apart by type.
NOTE_EVENTS = frozenset({"JOB_FLAGGED", "JOB_UNFLAGGED", "COMMENT_ADDED"})
# Progress of work the reviewer does not act on (a node's and a subject's steps): they come in bursts
# (a job of three subjects sends a dozen within a second of its submission), each would cost a GET, a
# rendered view and a redraw in the browser just as the submission's own answer is shown, so they are
# gathered for ``SETTLE_S`` and shown once. Anything else (a pause opened, a job ended, a colleague's
# answer) is shown at once, with the progress gathered so far.
PROGRESS_EVENTS = frozenset(
    {
        "NODE_STARTED",
        "NODE_COMPLETED",
        "NODE_REPORT",
        "NODE_RETRY_SCHEDULED",
        "NODE_ATTEMPT_FAILED",
        "NODE_LOST",
        "SUBJECT_SEGMENTED",
        "SUBJECT_GATED",
        "SUBJECT_REFINED",
    }
)
SETTLE_S = 0.3


class EventPump:
    """A job's events, queued by a task that reads the client's SSE iterator.

    A task rather than awaiting the iterator in the follower: the follower has
    to wake up every ``IDLE_S`` without cancelling a read of the stream.
    After a failure the pump queues ``BROKEN`` and opens the stream again after
    the last event it saw; ``END`` follows ``JOB_FINISHED``.
    """

    END, BROKEN, IDLE = object(), object(), object()

    def __init__(self, client: AsyncHitlClient, job_id: str) -> None:
        self.client, self.job_id = client, job_id
        self.items: asyncio.Queue[Any] = asyncio.Queue()
        self.broken = False
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"hitl-ui-events-{job_id}")

    async def _run(self) -> None:
        last: int | None = None
        failures = 0
        while True:
            try:
                async for ev in self.client.events(self.job_id, last_event_id=last):
                    last, failures, self.broken = ev.id, 0, False
                    self.items.put_nowait(ev)
                # The iterator ends only after JOB_FINISHED.
                self.items.put_nowait(self.END)
                return
            except Exception:  # any failure of the stream falls back to polling
                failures += 1
                self.broken = True
                self.items.put_nowait(self.BROKEN)
            await asyncio.sleep(min(RETRY_MAX_S, 2.0 ** min(failures, 5)))

    async def next(self, timeout: float) -> Any:
        """The next event, ``END``/``BROKEN``, or ``IDLE`` when nothing came within ``timeout``."""
        try:
            return await asyncio.wait_for(self.items.get(), timeout)
        except TimeoutError:
            return self.IDLE

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class Renderer(Protocol):
    """What a follower needs from the callbacks: component updates for the reviewer's state."""

    def view(self, st: ReviewerState, *, banner: str | None = None) -> dict[Any, Any]: ...

    def refresh_view(
        self, st: ReviewerState, *, redraw: bool, banner: str | None = None, error: str | None = None
    ) -> dict[Any, Any]: ...

    def notes_arrived(self, st: ReviewerState) -> dict[Any, Any]: ...


def apply_and_render(
    st: ReviewerState, snap: JobSnapshot, render: Renderer
) -> tuple[dict[Any, Any] | None, tuple[str | None, int]]:
    """``snap`` applied and its view rendered under the session's lock, as one step: a submission's 409
    (``Callbacks.send``) is applied and rendered under it as well, so the two never interleave (the new
    round drawn twice, the second time without the edits the first laid over it). Also the banner and
    offer that the view tells. None when ``snap`` changed nothing."""
    with st.lock:
        change = st.apply_snapshot(snap)
        telling = (st.notice, id(st.offer))
        if not change.applied:
            return None, telling
        redraw = change.redraw
        return render.refresh_view(st, redraw=redraw, banner=change.banner, error="" if redraw else None), telling


async def follow_job(
    st: ReviewerState, job_id: str, gen: int, client: AsyncHitlClient, render: Renderer, stop: threading.Event
) -> AsyncGenerator[dict[Any, Any], None]:
    """Component updates for job ``job_id`` while the session still shows it (open generation ``gen``).

    Every event newer than the shown snapshot triggers one GET, and the view
    is redrawn only when the pause changed (``ReviewerState.apply_snapshot``).
    Ends when the job ends, another job is opened, or ``stop`` is set.
    """
    pump = EventPump(client, job_id)
    last_poll = time.monotonic()
    told = None  # (banner, re-apply offer) as this follower's last output showed them
    settle: float | None = None  # when the progress gathered so far is to be shown (PROGRESS_EVENTS)
    try:
        while st.job_id == job_id and st.follow_gen == gen and not stop.is_set():
            wait = IDLE_S if settle is None else max(0.0, settle - time.monotonic())
            item = await pump.next(timeout=wait)
            if item is EventPump.IDLE and settle is not None and time.monotonic() >= settle:
                item = None  # the gathered progress is due: fetched and shown below
            if isinstance(item, Event) and item.type in PROGRESS_EVENTS and item.version > st.version:
                if settle is None:
                    settle = time.monotonic() + SETTLE_S
                continue
            if isinstance(item, Event):
                if item.type in NOTE_EVENTS and item.version >= st.version and not shown_already(st.snapshot, item):
                    # A flag or comment (a colleague's too): the open snapshot's notes, fetched again; the
                    # panel is not redrawn (nothing of the job changed), only its notes shown again.
                    if await refresh_notes(st, job_id, gen, client):
                        with emission(st, job_id, gen, stop) as ok:
                            if not ok:
                                break
                            yield render.notes_arrived(st)
                    continue
                if item.version <= st.version:
                    continue  # history the snapshot already shows
            elif item is EventPump.END:
                pump.broken = True  # the stream is over: poll until GET shows the end too
            elif item is EventPump.IDLE:
                # The browser applies the outputs of concurrent events in no fixed order: a submit's
                # answer (a 409 and its re-apply offer) can land before this follower's older output
                # and be overwritten by it. Say the newest once more (no redraw of the canvas).
                if told is not None and (st.notice, id(st.offer)) != told:
                    told = (st.notice, id(st.offer))
                    with emission(st, job_id, gen, stop) as ok:
                        if not ok:
                            break
                        yield render.view(st, banner=st.notice)
                    continue
                if not pump.broken or time.monotonic() - last_poll < POLL_FALLBACK_S:
                    continue
            last_poll, settle = time.monotonic(), None
            try:
                snap = await client.get_job(job_id)
            except Exception:  # try again on the next event or tick
                continue
            if st.job_id != job_id or st.follow_gen != gen:
                break
            # refresh_view may download the image or the results: blocking I/O, off the loop.
            update, telling = await asyncio.to_thread(apply_and_render, st, snap, render)
            if update is None:
                continue
            told = telling
            with emission(st, job_id, gen, stop) as ok:
                if not ok:
                    # Another job was opened while this view was rendered (an ended job's results take a
                    # while): sent now it could land after that job's panel and put this one back.
                    break
                yield update
            if is_terminal(snap):
                break
    finally:
        await pump.stop()


@contextmanager
def emission(st: ReviewerState, job_id: str, gen: int, stop: threading.Event) -> Iterator[bool]:
    """Around a follower's ``yield``: True when the job is still the one open and the follower was not
    stopped (else nothing may be sent),
    and ``st.emitting`` counted from that check until Gradio resumes the follower, which it does once
    the update is sent. An opening waits for it (``ReviewerState.wait_emissions``), so a follower's last
    update of the job left is on its way before the next job's panel, never after it."""
    with st.lock:
        ok = st.job_id == job_id and st.follow_gen == gen and not stop.is_set()
        if ok:
            st.emitting += 1
    try:
        yield ok
    finally:
        if ok:
            with st.lock:
                st.emitting -= 1


def shown_already(snap: JobSnapshot | None, ev: Event) -> bool:
    """Whether the open snapshot already has the note ``ev`` announces (the stream replays the job's events
    from its start, so the notes it opened with come by once more)."""
    if snap is None:
        return False
    d = ev.data
    if ev.type == "COMMENT_ADDED":
        return any((c.by, c.at, c.text) == (d.get("by"), d.get("at"), d.get("text")) for c in snap.comments)
    if ev.type == "JOB_FLAGGED":
        return snap.flag is not None and (snap.flag.by, snap.flag.at) == (d.get("by"), d.get("at"))
    return snap.flag is None  # JOB_UNFLAGGED


async def refresh_notes(st: ReviewerState, job_id: str, gen: int, client: AsyncHitlClient) -> bool:
    """The open snapshot's flag and comments as the server has them now; False when the job is no longer
    the one shown (or the server did not answer: the notes shown stay as they were)."""
    try:
        snap = await client.get_job(job_id)
    except Exception:  # the next note, or the next opening, fetches them
        return False
    with st.lock:
        if st.job_id != job_id or st.follow_gen != gen or st.snapshot is None or st.snapshot.job_id != job_id:
            return False
        st.snapshot = st.snapshot.model_copy(update={"flag": snap.flag, "comments": snap.comments})
    return True


class Followers:
    """The stop flags of each browser session's followers: closing the tab stops them."""

    def __init__(self) -> None:
        self._by_session: dict[str, set[threading.Event]] = {}
        self._lock = threading.Lock()

    def add(self, session: str | None, flag: threading.Event) -> None:
        if session:
            with self._lock:
                self._by_session.setdefault(session, set()).add(flag)

    def discard(self, session: str | None, flag: threading.Event) -> None:
        if session:
            with self._lock:
                self._by_session.get(session, set()).discard(flag)

    def stop(self, session: str | None) -> None:
        with self._lock:
            flags = self._by_session.pop(session or "", set())
        for flag in flags:
            flag.set()
