"""Idempotent batch submission: what ``hitl submit`` does with many files.

Rerunning the same command never creates a second job: each file's
Idempotency-Key is ``<batch>:<sha256 of its bytes>``, and a JSONL manifest
(appended as the run goes, flushed per line, so a killed run leaves a usable
one) lets a rerun skip finished files and only wait for the ones already
submitted. Submission and waiting run on separate worker pools, so files keep
going in while earlier ones sit in review.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import os
import queue
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from statecore.media import SNIFF_BYTES, sniff
from statecore.models import JobResults
from statecore.states import WAITING

from .api import TERMINAL_STATUSES, HitlClient, WaitCancelled
from .errors import ApiError, AuthError, ConnectionFailed, NotFoundError, WaitTimeout

log = logging.getLogger(__name__)

DEFAULT_BATCH = "default"
ENDED_WELL: frozenset[str] = frozenset({"SUCCEEDED", "PARTIAL_SUCCEEDED", "EMPTY_SELECTION"})
_BATCH_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")

# Progress buckets, in display order.
QUEUED, SUBMITTED, WAITING_REVIEW, PROCESSING, DONE, FAILED = (
    "queued",
    "submitted",
    "waiting for review",
    "processing",
    "done",
    "failed",
)
CATEGORIES = (QUEUED, SUBMITTED, WAITING_REVIEW, PROCESSING, DONE, FAILED)
_PROCESSING = frozenset({"VALIDATING_MANUAL_BOXES", "PROCESSING_APPROVED_SUBJECTS", "FINALIZING_RESULTS"})


def check_batch_name(batch: str) -> str:
    if not _BATCH_NAME.match(batch):
        raise ValueError(f"batch name {batch!r}: use 1-64 letters, digits, '_', '.', '-' (starting alphanumeric)")
    return batch


def idempotency_key(file_bytes: bytes, batch: str = DEFAULT_BATCH) -> str:
    """``<batch>:<sha256 hex>``: the same bytes in the same batch always give the same key."""
    return f"{check_batch_name(batch)}:{hashlib.sha256(file_bytes).hexdigest()}"


def category(status: str | None, *, error: str | None = None, accepted: bool = False) -> str:
    """The progress bucket of a file from its last known job status."""
    if status in ENDED_WELL:
        return DONE
    if status in TERMINAL_STATUSES:
        return FAILED
    if status in WAITING:
        return WAITING_REVIEW
    if status in _PROCESSING:
        return PROCESSING
    if status is not None or accepted:
        return SUBMITTED
    return FAILED if error else QUEUED


# ---------------------------------------------------------------------- finding the files


@dataclass(frozen=True)
class Skipped:
    path: Path
    reason: str


@dataclass
class WalkResult:
    images: list[Path] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def walk_inputs(
    inputs: Iterable[str | os.PathLike[str]], *, exclude: Iterable[str | os.PathLike[str]] = ()
) -> WalkResult:
    """Expand files and directories (recursively, in sorted order) into image files.

    Files are recognised by their first bytes, not their names. Anything that is
    not PNG, JPEG or WebP is reported in ``skipped``. Inside directories, hidden
    entries (``.name``) are passed over silently, and so are the paths in
    ``exclude`` (the output directory and the manifest, so a rerun never submits
    its own cut-outs). A file named twice is taken once.
    """
    excluded = {Path(p).resolve() for p in exclude}
    result = WalkResult()
    seen: set[Path] = set()

    def consider(path: Path) -> None:
        real = path.resolve()
        if real in seen or real in excluded:
            return
        seen.add(real)
        try:
            with open(path, "rb") as fh:
                head = fh.read(SNIFF_BYTES)
        except OSError as exc:
            result.skipped.append(Skipped(path, f"unreadable: {exc.strerror or exc}"))
            return
        if sniff(head) is None:
            result.skipped.append(Skipped(path, "not a PNG, JPEG or WebP image"))
        else:
            result.images.append(path)

    for raw in inputs:
        path = Path(raw)
        if path.is_dir():
            for root, dirs, files in os.walk(path):
                rootp = Path(root)
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and (rootp / d).resolve() not in excluded)
                for name in sorted(files):
                    if not name.startswith("."):
                        consider(rootp / name)
        elif path.is_file():
            consider(path)
        elif path.exists():
            result.skipped.append(Skipped(path, "not a regular file"))
        else:
            result.skipped.append(Skipped(path, "no such file or directory"))
    return result


def output_dir_names(images: Iterable[Path]) -> dict[Path, str]:
    """``<file-stem>`` per image; stems shared by several files get a short hash of the path appended."""
    images = list(images)
    stems = Counter(p.stem for p in images)
    names: dict[Path, str] = {}
    for p in images:
        stem = _UNSAFE.sub("_", p.stem) or "image"
        if stems[p.stem] > 1:
            stem += "-" + hashlib.sha256(str(p.resolve()).encode()).hexdigest()[:8]
        names[p] = stem
    return names


# ---------------------------------------------------------------------- manifest


class Manifest:
    """Append-only JSONL, one line per file per step; on load the last line of a (path, key) wins.

    Lines are flushed as written, so a killed run loses at most the step it was
    in; a torn last line is ignored on load.
    """

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self._fh: Any = None

    @staticmethod
    def _key(path: str, idem_key: str) -> str:
        return f"{path}\0{idem_key}"

    def load(self) -> dict[str, dict[str, Any]]:
        records: dict[str, dict[str, Any]] = {}
        if self.path is None or not self.path.exists():
            return records
        with open(self.path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("path"), str) and rec.get("idempotency_key"):
                    records[self._key(rec["path"], rec["idempotency_key"])] = rec
        return records

    @classmethod
    def lookup(cls, records: dict[str, dict[str, Any]], path: Path, idem_key: str) -> dict[str, Any] | None:
        return records.get(cls._key(str(path.resolve()), idem_key))

    def append(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        line = json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n"
        with self._lock:
            if self._fh is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = open(self.path, "a", encoding="utf-8")
            self._fh.write(line)
            self._fh.flush()

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


class Action(enum.Enum):
    SUBMIT = "submit"  # not in the manifest (or never accepted): send it
    WAIT = "wait"  # accepted earlier and not known to be finished: follow the job, don't resend
    DOWNLOAD = "download"  # finished earlier but its output directory is incomplete: fetch results again
    DONE = "done"  # finished earlier (and its outputs are there): nothing to do


def resume_action(record: dict[str, Any] | None, *, wait: bool, out_dir: Path | None) -> Action:
    """What a rerun does with a file, given its last manifest record."""
    if not record or not record.get("job_id"):
        return Action.SUBMIT
    if record.get("final_status") in TERMINAL_STATUSES:
        if wait and out_dir is not None and not (out_dir / "results.json").exists():
            return Action.DOWNLOAD
        return Action.DONE
    return Action.WAIT


# ---------------------------------------------------------------------- outcome & summary


@dataclass
class FileOutcome:
    path: Path
    sha256: str | None = None
    idempotency_key: str | None = None
    job_id: str | None = None
    status: str | None = None
    final_status: str | None = None
    replayed: bool = False
    resumed: bool = False
    error: str | None = None
    out_dir: Path | None = None

    @property
    def accepted(self) -> bool:
        return self.job_id is not None

    @property
    def ended_well(self) -> bool:
        return self.final_status in ENDED_WELL

    @property
    def category(self) -> str:
        return category(self.final_status or self.status, error=self.error, accepted=self.accepted)

    def record(self, batch: str) -> dict[str, Any]:
        """The manifest line for this file as it stands now."""
        return {
            "path": str(self.path.resolve()),
            "sha256": self.sha256,
            "batch": batch,
            "idempotency_key": self.idempotency_key,
            "job_id": self.job_id,
            "status": self.status,
            "final_status": self.final_status,
            "error": self.error,
            "out_dir": str(self.out_dir) if self.out_dir else None,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"], d["out_dir"] = str(self.path), str(self.out_dir) if self.out_dir else None
        d["accepted"], d["ended_well"] = self.accepted, self.ended_well
        return d


@dataclass
class BatchSummary:
    batch: str
    waited: bool
    files: list[FileOutcome]
    skipped: list[Skipped]
    manifest: Path | None = None
    aborted: str | None = None
    interrupted: bool = False

    def counts(self) -> dict[str, int]:
        c = Counter(f.category for f in self.files)
        return {k: c[k] for k in CATEGORIES if c[k]}

    @property
    def ok(self) -> bool:
        """Every file accepted (no non-images among the inputs) and, when waiting, every job ended well."""
        if self.aborted or self.interrupted or self.skipped or not self.files:
            return False
        if not all(f.accepted for f in self.files):
            return False
        return all(f.ended_well for f in self.files) if self.waited else True

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 0 if self.ok else 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "waited": self.waited,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "counts": self.counts(),
            "aborted": self.aborted,
            "interrupted": self.interrupted,
            "manifest": str(self.manifest) if self.manifest else None,
            "files": [f.to_dict() for f in self.files],
            "skipped": [{"path": str(s.path), "reason": s.reason} for s in self.skipped],
        }


# ---------------------------------------------------------------------- downloading


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.part")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def download_outputs(client: HitlClient, results: JobResults, out_dir: Path) -> list[Path]:
    """``mask_<box_id>.png`` and ``cutout_<box_id>.png`` per subject, then ``results.json`` (written last,
    so its presence means the directory is complete)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for subject in results.subjects:
        box = _UNSAFE.sub("_", subject.box_id)
        for kind, url in (("mask", subject.mask_url), ("cutout", subject.cutout_url)):
            if url:
                target = out_dir / f"{kind}_{box}.png"
                _write_atomic(target, client.download(url))
                written.append(target)
    target = out_dir / "results.json"
    _write_atomic(target, results.model_dump_json(indent=2).encode())
    written.append(target)
    return written


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
) -> BatchSummary:
    """Submit every image under ``inputs`` once; with ``wait`` follow each job to its end and, with
    ``out``, download its masks and cut-outs to ``<out>/<file-stem>/`` (``out`` is never walked).

    ``timeout`` bounds the whole wait (None: no bound); files still running then
    are left in the manifest for the next run. Ctrl-C returns a summary with
    ``interrupted`` set; the manifest is already on disk.
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
            res = client.submit(data, idempotency_key=key, filename=o.path.name)
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
            except (ApiError, OSError) as exc:
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
