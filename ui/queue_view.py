"""The reviewer page's queue of waiting jobs: listing, rows with thumbnails, and what a poll sends.

A mixin of ``ui.callbacks.Callbacks`` (which provides ``c``, ``clients`` and ``store``); also
``error_text``, a failed call in words, shared by the page's handlers.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import gradio as gr
import pandas as pd

from hitl_review.client import ApiError, HitlClient
from hitl_review.statecore.models import JobSummary

from .images import ImageStore
from .layout import Components
from .queue import NOTHING_WAITING, TABLE_HEADERS, nothing_to_open_text, queue_rows, thumb_cell, waiting_jobs
from .session import ReviewerState

QUEUE_MAX_ROWS = 200
THUMBS_PER_TICK = 12  # thumbnails made per queue refresh at most (one GET and one download each)
QUEUE_AGES_S = 10.0  # a queue that changed only in its "Waiting for" ages is sent again this often
AGE_COL = TABLE_HEADERS.index("Waiting for")

Update = dict[Any, Any]


def error_text(exc: Exception) -> str:
    """A failed call in words a reviewer can act on."""
    if isinstance(exc, ApiError):
        if exc.status_code == 401:
            return "The control plane did not accept your token (401)."
        if exc.status_code == 403:
            return "Your token may not do this (403): a reviewer or admin token is needed."
        return f"{exc.message} ({exc.code})"
    return f"Could not reach the control plane: {exc}"


class _Clients(Protocol):
    def get(self, token: str | None) -> HitlClient: ...


class QueueHandlers:
    """The queue's part of the page's handlers."""

    c: Components
    clients: _Clients
    store: ImageStore

    def fetch_queue(self, st: ReviewerState) -> list[JobSummary]:
        client = self.clients.get(st.token)
        jobs: list[JobSummary] = []
        cursor = None
        while len(jobs) < QUEUE_MAX_ROWS:
            page = client.list_jobs(status="WAITING", limit=50, cursor=cursor)
            jobs.extend(page.jobs)
            cursor = page.next_cursor
            if not cursor:
                break
        return jobs

    def nothing_to_open(self, st: ReviewerState) -> str:
        """N's banner when no job was left to claim (``ui.queue.nothing_to_open_text``): one more read of the
        queue, on a miss only, says whether the others are all being reviewed by someone else."""
        try:
            page = self.clients.get(st.token).list_jobs(status="WAITING", limit=50)
        except Exception:  # the plain answer is still true
            return NOTHING_WAITING
        return nothing_to_open_text(page.jobs, st.reviewer, st.job_id, more=page.next_cursor is not None)

    def queue_update(self, st: ReviewerState, *, quiet: bool = False) -> Update:
        """The queue table and its note. ``quiet`` (the timer's poll): the table is left as the page shows
        it when only its ages moved, for up to ``QUEUE_AGES_S``: no re-render of every row each tick."""
        try:
            jobs = self.fetch_queue(st)
        except Exception as exc:  # shown under the queue; the next tick tries again
            return {self.c.queue_note: "Queue unavailable — " + error_text(exc)}
        flagged = st.queue_flagged  # "Flagged only" (ui.notes_view)
        rows = queue_rows(jobs, stage=st.queue_stage, me=st.reviewer, batch=st.queue_batch, flagged=flagged)
        budget = [THUMBS_PER_TICK]  # new thumbnails this tick; rows further down get theirs on later ticks
        rows = [[thumb_cell(self.thumb(st, str(r[0]), budget), str(r[0])), *r] for r in rows]
        n, total = len(rows), len(waiting_jobs(jobs))
        shown = f"{n} of {total} jobs" if n != total else f"{n} job{'s' if n != 1 else ''}"
        note = f"{shown} waiting · updated {time.strftime('%H:%M:%S')}"
        ageless = [[v for i, v in enumerate(r) if i != AGE_COL] for r in rows]
        with st.lock:
            same = quiet and ageless == st.queue_sent and time.monotonic() - st.queue_sent_at < QUEUE_AGES_S
            if not same:
                st.queue_sent, st.queue_sent_at = ageless, time.monotonic()
        table = gr.skip() if same else pd.DataFrame(rows, columns=TABLE_HEADERS)
        return {self.c.queue_table: table, self.c.queue_note: note}

    def thumb(self, st: ReviewerState, job_id: str, budget: list[int]) -> str | None:
        """The queue thumbnail of ``job_id``: the file if made, else made now while ``budget[0]`` lasts.

        The budget counts only thumbnails made, so one tick makes the first missing ones wherever they
        are in the queue and a job deep in a long queue gets its thumbnail a few ticks later."""
        path = self.store.thumb_dir / f"{job_id}.jpg"
        if path.exists() or budget[0] <= 0:
            return str(path) if path.exists() else None
        budget[0] -= 1
        try:
            return self.store.thumbnail(job_id, self.clients.get(st.token))
        except Exception:  # a missing thumbnail is not worth an error: the next tick tries again
            return None
