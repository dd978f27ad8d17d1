"""Idempotent batch submission: what ``hitl submit`` does with many files.

Rerunning the same command never creates a second job: each file's
Idempotency-Key is ``<batch>:<sha256 of its bytes>``, and a JSONL manifest
(appended as the run goes, flushed per line, so a killed run leaves a usable
one) lets a rerun skip finished files and only wait for the ones already
submitted. Submission and waiting run on separate worker pools, so files keep
going in while earlier ones sit in review.

The pieces live beside this module: ``client.batch_outcome`` (batch names, keys,
progress buckets, per-file outcomes, the summary), ``client.batch_files``
(finding the images, writing the outputs) and ``client.batch_manifest`` (the
JSONL manifest and what a rerun does with each file); the run itself is here.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from .api import HitlClient, WaitCancelled
from .batch_files import Skipped, WalkResult, download_outputs, output_dir_names, walk_inputs
from .batch_manifest import Action, Manifest, resume_action
from .batch_outcome import (
    CATEGORIES,
    DEFAULT_BATCH,
    DONE,
    ENDED_WELL,
    FAILED,
    PROCESSING,
    QUEUED,
    SUBMITTED,
    WAITING_REVIEW,
    BatchSummary,
    FileOutcome,
    category,
    check_batch_name,
    idempotency_key,
)
from .errors import ApiError, AuthError, ConnectionFailed, NotFoundError, WaitTimeout
from .prelabels import BoxSource, LabelError
from .waiting import TERMINAL_STATUSES

__all__ = [
    "CATEGORIES",
    "DEFAULT_BATCH",
    "DONE",
    "ENDED_WELL",
    "FAILED",
    "PROCESSING",
    "QUEUED",
    "SUBMITTED",
    "WAITING_REVIEW",
    "Action",
    "BatchSummary",
    "FileOutcome",
    "Manifest",
    "Skipped",
    "WalkResult",
    "category",
    "check_batch_name",
    "download_outputs",
    "idempotency_key",
    "output_dir_names",
    "resume_action",
    "run_batch",
    "walk_inputs",
]

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------- the run


class _Tracker:
    """Counts by bucket behind the progress bar; every outcome change goes through here."""

    def __init__(self, outcomes: list[FileOutcome], progress: Progress) -> None:
        self.outcomes = outcomes
        self.progress = progress
        self.lock = threading.Lock()
        self.finished = 0
        self.all_done = threading.Event()
        # Kept up to date by ``update`` (O(1) per change: recounting every outcome on every change
        # made a batch quadratic in its number of files).
        self.counts = Counter(o.category for o in outcomes)
        self.task = progress.add_task(self._describe(), total=len(outcomes))
        if not outcomes:
            self.all_done.set()

    def _describe(self) -> str:
        c = self.counts
        return " · ".join(f"{k} {c[k]}" for k in CATEGORIES if c[k]) or "nothing to do"

    def update(self, outcome: FileOutcome, **changes: Any) -> None:
        with self.lock:
            self.counts[outcome.category] -= 1
            for k, v in changes.items():
                setattr(outcome, k, v)
            self.counts[outcome.category] += 1
            self.progress.update(self.task, description=self._describe())

    def finish(self, outcome: FileOutcome) -> None:
        with self.lock:
            self.finished += 1
            self.progress.update(self.task, completed=self.finished, description=self._describe())
            if self.finished >= len(self.outcomes):
                self.all_done.set()


def _error_text(exc: Exception) -> str:
    if isinstance(exc, ApiError):
        return f"{exc.code}: {exc.message}"
    return str(exc)


def run_batch(
    client: HitlClient,
    inputs: Iterable[str | os.PathLike[str]],
    *,
    batch: str = DEFAULT_BATCH,
    concurrency: int = 4,
    wait: bool = False,
    out: str | os.PathLike[str] | None = None,
    manifest: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    wait_concurrency: int | None = None,
    progress: bool = True,
    console: Console | None = None,
    review_quorum: int = 1,
    quorum_policy: str = "all",
    boxes: BoxSource | None = None,
) -> BatchSummary:
    """Submit every image under ``inputs`` once; with ``wait`` follow each job to its end and, with
    ``out``, download its masks and cut-outs to ``<out>/<file-stem>/`` (``out`` is never walked).

    ``timeout`` bounds the whole wait (None: no bound); files still running then
    are left in the manifest for the next run. Ctrl-C returns a summary with
    ``interrupted`` set; the manifest is already on disk. ``boxes``: each image's pre-labelled
    boxes (``hitl submit --boxes``): its job waits for review with them, no detector called.
    """
    check_batch_name(batch)
    out_path = Path(out) if out else None
    book = Manifest(manifest)
    walk = walk_inputs(inputs, exclude=[p for p in (out_path, book.path) if p is not None])
    names = output_dir_names(walk.images)
    outcomes = [FileOutcome(path=p) for p in walk.images]
    summary = BatchSummary(batch=batch, waited=wait, files=outcomes, skipped=walk.skipped, manifest=book.path)
    prior = book.load()
    deadline = time.monotonic() + timeout if timeout is not None else float("inf")
    cancel = threading.Event()
    submit_q: queue.Queue[FileOutcome] = queue.Queue()
    wait_q: queue.Queue[FileOutcome] = queue.Queue()

    def abort(reason: str) -> None:
        if summary.aborted is None:
            summary.aborted = reason
        cancel.set()
        tracker.all_done.set()

    def submit_one(o: FileOutcome) -> None:
        data = o.path.read_bytes()
        key = idempotency_key(data, batch)
        tracker.update(o, sha256=hashlib.sha256(data).hexdigest(), idempotency_key=key)
        if out_path is not None and wait:
            o.out_dir = out_path / names[o.path]
        rec = Manifest.lookup(prior, o.path, key)
        action = resume_action(rec, wait=wait, out_dir=o.out_dir)
        if action is Action.SUBMIT:
            more = {} if boxes is None else {"boxes": boxes.for_image(o.path.name, data)}
            res = client.submit(
                data,
                idempotency_key=key,
                filename=o.path.name,
                review_quorum=review_quorum,
                quorum_policy=quorum_policy,
                **more,
            )
            tracker.update(o, job_id=res.job_id, status=str(res.status), replayed=res.replayed, error=None)
            book.append(o.record(batch))
        else:
            assert rec is not None
            final = rec.get("final_status") if rec.get("final_status") in TERMINAL_STATUSES else None
            tracker.update(o, job_id=rec["job_id"], status=final or rec.get("status"), final_status=final, resumed=True)
        if action is Action.DONE or not wait:
            tracker.finish(o)
        else:
            wait_q.put(o)

    def wait_one(o: FileOutcome) -> None:
        assert o.job_id is not None
        snap = client.wait_for(
            o.job_id,
            timeout=max(0.0, deadline - time.monotonic()),
            on_status=lambda s: tracker.update(o, status=s),
            cancel=cancel,
        )
        status = str(snap.status)
        if status in TERMINAL_STATUSES:
            if o.out_dir is not None:
                download_outputs(client, client.results(o.job_id), o.out_dir)
            tracker.update(o, status=status, final_status=status, error=None)
            book.append(o.record(batch))
        tracker.finish(o)

    def worker(q: queue.Queue[FileOutcome], step: Any) -> None:
        while not cancel.is_set():
            try:
                o = q.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                step(o)
            except WaitCancelled:
                return
            except WaitTimeout as exc:
                last = exc.snapshot.status if exc.snapshot else o.status
                tracker.update(o, status=str(last) if last else None, error="still running when --timeout ran out")
                book.append(o.record(batch))
                tracker.finish(o)
            except NotFoundError as exc:
                hint = " (manifest from another server? delete it to resubmit)" if o.resumed else ""
                tracker.update(o, error=_error_text(exc) + hint)
                tracker.finish(o)
            except (AuthError, ConnectionFailed) as exc:
                tracker.update(o, error=_error_text(exc))
                tracker.finish(o)
                abort(_error_text(exc))
            except (ApiError, OSError, LabelError) as exc:
                tracker.update(o, error=_error_text(exc))
                if o.idempotency_key:
                    book.append(o.record(batch))
                tracker.finish(o)
            except Exception as exc:  # a bug must not hang the run: report it on the file
                log.exception("batch worker failed on %s", o.path)
                tracker.update(o, error=f"{type(exc).__name__}: {exc}")
                tracker.finish(o)

    console = console or Console(stderr=True)
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, disable=not progress) as bar:
        tracker = _Tracker(outcomes, bar)
        threads = [
            threading.Thread(target=worker, args=(submit_q, submit_one), daemon=True, name=f"hitl-submit-{i}")
            for i in range(max(1, min(concurrency, len(outcomes))))
        ]
        if wait:
            n_wait = wait_concurrency or max(concurrency, 32)
            threads += [
                threading.Thread(target=worker, args=(wait_q, wait_one), daemon=True, name=f"hitl-wait-{i}")
                for i in range(max(1, min(n_wait, len(outcomes))))
            ]
        for o in outcomes:
            submit_q.put(o)
        for t in threads:
            t.start()
        try:
            while not tracker.all_done.wait(0.2):
                pass
        except KeyboardInterrupt:
            summary.interrupted = True
        finally:
            cancel.set()
            book.close()
    # Daemon workers still blocked in a read end with the process; nothing they hold is unsaved.
    return summary
