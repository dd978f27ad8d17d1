"""Batch submission without a server: keys, sniffing, the directory walk, the manifest and resuming.

The ``run_batch`` tests drive the orchestration with a small in-process stand-in
for ``HitlClient`` (no HTTP): they check which calls a rerun makes, not the
protocol. The protocol is covered by ``test_client_api.py`` and, against the
real control plane, by the integration tests listed there.
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from hitl_review.client.api import SubmitResult
from hitl_review.client.batch import (
    DONE,
    FAILED,
    PROCESSING,
    QUEUED,
    SUBMITTED,
    WAITING_REVIEW,
    Action,
    BatchSummary,
    FileOutcome,
    Manifest,
    Skipped,
    category,
    check_batch_name,
    idempotency_key,
    output_dir_names,
    resume_action,
    run_batch,
    walk_inputs,
)
from hitl_review.client.errors import AuthError, InvalidRequestError
from hitl_review.statecore.media import sniff
from hitl_review.statecore.models import JobResults, JobSnapshot, SubjectResult


def image_bytes(fmt: str, colour: tuple[int, int, int] = (200, 30, 30), size: tuple[int, int] = (16, 12)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format=fmt)
    return buf.getvalue()


# ---------------------------------------------------------------------- keys and sniffing


def test_idempotency_key_is_batch_and_content_hash():
    data = image_bytes("PNG")
    key = idempotency_key(data)
    assert key == f"default:{hashlib.sha256(data).hexdigest()}"
    assert idempotency_key(data) == key == idempotency_key(bytes(data), "default")  # stable, no clock in it
    assert idempotency_key(data, "spring-sale") == f"spring-sale:{hashlib.sha256(data).hexdigest()}"
    assert idempotency_key(image_bytes("PNG", (1, 2, 3))) != key


@pytest.mark.parametrize("name", ["", "has space", "a:b", "-lead", "x" * 65, "new\nline"])
def test_bad_batch_names_are_refused(name: str):
    with pytest.raises(ValueError):
        check_batch_name(name)


def test_sniff_by_content():
    assert sniff(image_bytes("PNG")) == "png"
    assert sniff(image_bytes("JPEG")) == "jpeg"
    assert sniff(image_bytes("WEBP")) == "webp"
    assert sniff(b"") is None
    assert sniff(b"hello world, not an image") is None
    assert sniff(b"GIF89a" + b"\0" * 10) is None
    assert sniff(b"RIFF\0\0\0\0WAVEfmt ") is None
    assert sniff(image_bytes("PNG")[:8]) == "png"  # only the signature is judged; the server decodes


def test_walk_finds_images_recursively_and_reports_the_rest(tmp_path: Path):
    (tmp_path / "b" / "deep").mkdir(parents=True)
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "out").mkdir()
    files = {
        "a.png": image_bytes("PNG"),
        "b/c.jpg": image_bytes("JPEG"),
        "b/deep/d.webp": image_bytes("WEBP"),
        "b/deep/no_extension": image_bytes("PNG", (0, 0, 255)),
        "b/notes.txt": b"not an image",
        "b/fake.png": b"<html>this is no png</html>",
        "b/empty.jpg": b"",
        ".DS_Store": b"\0\0\0\1Bud1",
        ".hidden/x.png": image_bytes("PNG"),
        "out/cutout_box_1.png": image_bytes("PNG"),
    }
    for rel, data in files.items():
        (tmp_path / rel).write_bytes(data)
    res = walk_inputs([tmp_path, tmp_path / "a.png", tmp_path / "missing.png"], exclude=[tmp_path / "out"])

    def rel(p: Path) -> str:
        return str(Path(p).relative_to(tmp_path))

    assert [rel(p) for p in res.images] == ["a.png", "b/c.jpg", "b/deep/d.webp", "b/deep/no_extension"]
    assert sorted((rel(s.path), s.reason) for s in res.skipped) == [
        ("b/empty.jpg", "not a PNG, JPEG or WebP image"),
        ("b/fake.png", "not a PNG, JPEG or WebP image"),
        ("b/notes.txt", "not a PNG, JPEG or WebP image"),
        ("missing.png", "no such file or directory"),
    ]


def test_walk_names_an_explicit_non_image(tmp_path: Path):
    p = tmp_path / "readme.md"
    p.write_text("# hi")
    assert walk_inputs([p]).skipped == [Skipped(p, "not a PNG, JPEG or WebP image")]


def test_output_dir_names_are_stems_made_unique(tmp_path: Path):
    a, b, c = tmp_path / "x" / "shoe.png", tmp_path / "y" / "shoe.jpg", tmp_path / "bag 1.png"
    names = output_dir_names([a, b, c])
    assert names[c] == "bag_1"
    assert names[a].startswith("shoe-") and names[b].startswith("shoe-") and names[a] != names[b]
    assert output_dir_names([a, b, c]) == names  # deterministic across runs


# ---------------------------------------------------------------------- manifest and resuming


def test_manifest_last_line_wins_and_torn_lines_are_ignored(tmp_path: Path):
    m = Manifest(tmp_path / "sub" / "manifest.jsonl")
    img = tmp_path / "a.png"
    m.append(
        {
            "path": str(img.resolve()),
            "idempotency_key": "default:1",
            "job_id": "job_a",
            "status": "CREATED",
            "final_status": None,
        }
    )
    m.append(
        {
            "path": str(img.resolve()),
            "idempotency_key": "default:1",
            "job_id": "job_a",
            "status": "SUCCEEDED",
            "final_status": "SUCCEEDED",
        }
    )
    m.append(
        {
            "path": str(img.resolve()),
            "idempotency_key": "other:1",
            "job_id": "job_b",
            "status": "CREATED",
            "final_status": None,
        }
    )
    m.close()
    with open(m.path, "a") as fh:
        fh.write('{"path": "/x.png", "idempotency_key": "default:2", "job_')  # killed mid-write
    records = Manifest(m.path).load()
    assert Manifest.lookup(records, img, "default:1")["final_status"] == "SUCCEEDED"
    assert Manifest.lookup(records, img, "other:1")["job_id"] == "job_b"
    assert Manifest.lookup(records, img, "default:2") is None
    assert len(records) == 2


def test_resume_action(tmp_path: Path):
    out = tmp_path / "out"
    finished = {"job_id": "j", "final_status": "SUCCEEDED"}
    assert resume_action(None, wait=True, out_dir=out) is Action.SUBMIT
    assert resume_action({"job_id": None, "error": "INVALID_REQUEST: bad"}, wait=False, out_dir=None) is Action.SUBMIT
    assert resume_action({"job_id": "j", "status": "CREATED"}, wait=True, out_dir=out) is Action.WAIT
    assert resume_action({"job_id": "j", "status": "WAITING_USER_SELECTION"}, wait=False, out_dir=None) is Action.WAIT
    assert resume_action(finished, wait=False, out_dir=None) is Action.DONE
    assert resume_action(finished, wait=True, out_dir=None) is Action.DONE
    assert resume_action(finished, wait=True, out_dir=out) is Action.DOWNLOAD
    out.mkdir()
    (out / "results.json").write_text("{}")
    assert resume_action(finished, wait=True, out_dir=out) is Action.DONE
    assert resume_action({"job_id": "j", "final_status": "FAILED"}, wait=True, out_dir=out) is Action.DONE


def test_categories():
    assert category(None) == QUEUED
    assert category(None, error="boom") == FAILED
    assert category("CREATED") == category("DETECTING") == SUBMITTED
    assert category("WAITING_USER_SELECTION") == category("WAITING_BOX_BATCH_REVISION") == WAITING_REVIEW
    assert category("VALIDATING_MANUAL_BOXES") == category("FINALIZING_RESULTS") == PROCESSING
    assert category("SUCCEEDED") == category("PARTIAL_SUCCEEDED") == category("EMPTY_SELECTION") == DONE
    assert category("FAILED") == category("TIMED_OUT") == category("CANCELLED") == FAILED


def test_exit_code_rules(tmp_path: Path):
    ok = FileOutcome(tmp_path / "a.png", job_id="j1", status="SUCCEEDED", final_status="SUCCEEDED")
    empty = FileOutcome(tmp_path / "b.png", job_id="j2", status="EMPTY_SELECTION", final_status="EMPTY_SELECTION")
    failed = FileOutcome(tmp_path / "c.png", job_id="j3", status="FAILED", final_status="FAILED")
    pending = FileOutcome(tmp_path / "d.png", job_id="j4", status="WAITING_USER_SELECTION")
    rejected = FileOutcome(tmp_path / "e.png", error="INVALID_REQUEST: not an image")

    def S(files, wait=True, **kw):
        return BatchSummary("default", wait, files, [], **kw)

    assert S([ok, empty]).exit_code == 0
    assert S([ok, failed]).exit_code == 1
    assert S([ok, pending]).exit_code == 1
    assert S([ok, pending], wait=False).exit_code == 0
    assert S([ok, rejected], wait=False).exit_code == 1
    assert S([]).exit_code == 1
    assert S([ok], aborted="401").exit_code == 1
    assert S([ok], interrupted=True).exit_code == 130
    assert BatchSummary("default", True, [ok], [Skipped(tmp_path / "x.txt", "not an image")]).exit_code == 1
    assert S([ok, failed]).counts() == {DONE: 1, FAILED: 1}


# ---------------------------------------------------------------------- run_batch orchestration


class FakeClient:
    """Stands in for HitlClient's submit/wait_for/results/download; records every call."""

    def __init__(self, final: str = "SUCCEEDED", reject: set[str] | None = None, auth_fail: bool = False) -> None:
        self.final = final
        self.reject = reject or set()
        self.auth_fail = auth_fail
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str]] = []
        self.jobs: dict[str, str] = {}  # idempotency key -> job id, like the server's record
        self.quorums: list[int] = []  # review_quorum of each submit
        self.policies: list[str] = []  # quorum_policy of each submit

    def _log(self, *call: str) -> None:
        with self.lock:
            self.calls.append(call)

    def submit(
        self,
        data: bytes,
        *,
        idempotency_key: str | None = None,
        filename: str | None = None,
        review_quorum: int = 1,
        quorum_policy: str = "all",
    ):
        self._log("submit", filename or "")
        self.quorums.append(review_quorum)
        self.policies.append(quorum_policy)
        if self.auth_fail:
            raise AuthError(401, "UNAUTHORIZED", "unknown token")
        if filename in self.reject:
            raise InvalidRequestError(400, "INVALID_REQUEST", "cannot decode image")
        with self.lock:
            replayed = idempotency_key in self.jobs
            job_id = self.jobs.setdefault(idempotency_key, f"job_{len(self.jobs):04d}")
        return SubmitResult(
            job_id=job_id, status="CREATED", version=1, replayed=replayed, status_code=200 if replayed else 202
        )

    def wait_for(self, job_id: str, statuses: Any = None, timeout: float = 300, *, on_status=None, cancel=None):
        self._log("wait_for", job_id)
        for s in ("WAITING_USER_SELECTION", "PROCESSING_APPROVED_SUBJECTS", self.final):
            on_status(s)
        return JobSnapshot.model_validate(
            {
                "job_id": job_id,
                "status": self.final,
                "version": 9,
                "round": 1,
                "created_at": "t",
                "updated_at": "t",
                "image": {"sha256": "a" * 64, "width": 16, "height": 12, "url": "/api/v1/artifacts/i.png"},
                "box_list": [],
                "approved_box_list": [],
                "active_pause": None,
                "pending_actions": [],
                "current_node": None,
            }
        )

    def results(self, job_id: str) -> JobResults:
        self._log("results", job_id)
        subjects = [
            SubjectResult(
                box_id="box_1",
                bbox=(1, 1, 5, 5),
                status="SUCCEEDED",
                mask_url=f"/api/v1/artifacts/mask_{job_id}.png",
                cutout_url=f"/api/v1/artifacts/cut_{job_id}.png",
            ),
            SubjectResult(box_id="box_2", bbox=(2, 2, 6, 6), status="REJECTED", reason="low score"),
        ]
        return JobResults(job_id=job_id, status=self.final, subjects=subjects)

    def download(self, url: str) -> bytes:
        self._log("download", url)
        return image_bytes("PNG")

    def count(self, name: str) -> int:
        return sum(1 for c in self.calls if c[0] == name)


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    d = tmp_path / "photos"
    (d / "more").mkdir(parents=True)
    for i in range(4):
        (d / f"p{i}.png").write_bytes(image_bytes("PNG", (i * 40, 10, 10)))
    (d / "more" / "p4.jpg").write_bytes(image_bytes("JPEG", (9, 200, 9)))
    (d / "more" / "dup.png").write_bytes((d / "p0.png").read_bytes())  # same bytes as p0: same key, same job
    return d


def test_run_batch_submits_each_file_once_and_a_rerun_submits_nothing(tmp_path: Path, photos: Path):
    manifest = tmp_path / "m.jsonl"
    fake = FakeClient()
    s1 = run_batch(fake, [photos], concurrency=3, manifest=manifest, progress=False)
    assert s1.exit_code == 0 and len(s1.files) == 6 and fake.count("submit") == 6
    assert fake.quorums == [1] * 6
    assert len({f.job_id for f in s1.files}) == 5  # dup.png replays p0's job
    assert {f.idempotency_key for f in s1.files} == {idempotency_key(p.read_bytes()) for p in photos.rglob("*.*")}
    lines = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert len(lines) == 6 and all(rec["job_id"] and rec["batch"] == "default" for rec in lines)

    s2 = run_batch(fake, [photos], manifest=manifest, progress=False)
    assert fake.count("submit") == 6  # nothing sent again
    assert s2.exit_code == 0 and all(f.resumed for f in s2.files)
    assert [f.job_id for f in s2.files] == [f.job_id for f in s1.files]


def test_run_batch_waits_downloads_and_a_rerun_does_nothing(tmp_path: Path, photos: Path):
    out = tmp_path / "out"
    fake = FakeClient(final="PARTIAL_SUCCEEDED")
    run_batch(fake, [photos], manifest=out / "manifest.jsonl", progress=False)  # submitted earlier, not waited
    s = run_batch(fake, [photos], wait=True, out=out, manifest=out / "manifest.jsonl", progress=False)
    assert s.exit_code == 0, s.to_dict()
    assert fake.count("submit") == 6 and fake.count("wait_for") == 6
    assert all(f.final_status == "PARTIAL_SUCCEEDED" and f.resumed for f in s.files)
    p0 = out / "p0"
    assert sorted(x.name for x in p0.iterdir()) == ["cutout_box_1.png", "mask_box_1.png", "results.json"]
    assert JobResults.model_validate_json((p0 / "results.json").read_text()).subjects[1].status == "REJECTED"
    assert not list(out.rglob(".*.part"))
    counts = {name: fake.count(name) for name in ("submit", "wait_for", "results", "download")}

    # Everything is finished and on disk: a third run makes no call at all and still exits 0.
    s3 = run_batch(fake, [photos], wait=True, out=out, manifest=out / "manifest.jsonl", progress=False)
    assert s3.exit_code == 0
    assert {name: fake.count(name) for name in counts} == counts

    # A lost output directory is fetched again, without resubmitting or waiting on a stream.
    (p0 / "results.json").unlink()
    s4 = run_batch(fake, [photos], wait=True, out=out, manifest=out / "manifest.jsonl", progress=False)
    assert s4.exit_code == 0 and fake.count("submit") == counts["submit"]
    assert fake.count("results") == counts["results"] + 1 and (p0 / "results.json").exists()


def test_run_batch_exit_code_when_jobs_end_badly(tmp_path: Path, photos: Path):
    s = run_batch(FakeClient(final="FAILED"), [photos], wait=True, manifest=tmp_path / "m.jsonl", progress=False)
    assert s.exit_code == 1 and s.counts() == {FAILED: 6}


def test_run_batch_reports_rejections_and_non_images(tmp_path: Path, photos: Path):
    (photos / "notes.txt").write_text("hello")
    fake = FakeClient(reject={"p1.png"})
    s = run_batch(fake, [photos], manifest=tmp_path / "m.jsonl", progress=False)
    assert s.exit_code == 1
    assert [x.path.name for x in s.skipped] == ["notes.txt"]
    bad = [f for f in s.files if f.error]
    assert [f.path.name for f in bad] == ["p1.png"] and bad[0].error.startswith("INVALID_REQUEST")
    # The rejected file is tried again on a rerun; the accepted ones are not.
    fake.reject = set()
    before = fake.count("submit")
    s2 = run_batch(fake, [photos / f"p{i}.png" for i in range(4)], manifest=tmp_path / "m.jsonl", progress=False)
    assert s2.exit_code == 0 and fake.count("submit") == before + 1


def test_run_batch_stops_on_an_auth_error(tmp_path: Path, photos: Path):
    fake = FakeClient(auth_fail=True)
    s = run_batch(fake, [photos], concurrency=1, manifest=tmp_path / "m.jsonl", progress=False)
    assert s.exit_code == 1 and s.aborted and "UNAUTHORIZED" in s.aborted
    assert fake.count("submit") < 6


def test_run_batch_progress_shows_counts_by_state(tmp_path: Path, photos: Path):
    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    s = run_batch(FakeClient(), [photos], wait=True, manifest=tmp_path / "m.jsonl", progress=True, console=console)
    assert s.exit_code == 0
    assert "done 6" in buf.getvalue() and "6/6" in buf.getvalue()


def test_run_batch_passes_the_review_quorum_with_every_file(tmp_path: Path, photos: Path):
    fake = FakeClient()
    s = run_batch(fake, [photos], manifest=tmp_path / "m.jsonl", progress=False, review_quorum=3)
    assert s.exit_code == 0 and fake.quorums == [3] * 6  # hitl submit --quorum 3
    assert fake.policies == ["all"] * 6
    again = FakeClient()
    s = run_batch(again, [photos], manifest=tmp_path / "m2.jsonl", progress=False, review_quorum=3, quorum_policy="any")
    assert s.exit_code == 0 and again.policies == ["any"] * 6  # hitl submit --quorum 3 --quorum-policy any
