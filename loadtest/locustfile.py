"""Locust scenarios for the review protocol under load (docs/protocol.md § Intervention).

Six user classes play the people and accidents the pause protocol must survive:

- ``Submitter``      creates jobs (small product composites) with ``Idempotency-Key``s; some keys are
                     deliberately repeated (same job id, byte-identical body, ``Idempotent-Replayed``),
                     a few reused with another image (409 ``IDEMPOTENCY_CONFLICT``).
- ``Reviewer``       follows a job's SSE stream; at every ``PAUSE_OPENED`` submits a plausible subset
                     (keeps some boxes, deletes some, draws a manual box now and then, fixes or drops
                     the boxes a round-2 pause asks to revise) until ``JOB_FINISHED``.
- ``DoubleClicker``  sends one intervention twice a few milliseconds apart (two concurrent requests).
- ``RivalReviewers`` two or more reviewers (separate sessions) race on one pause with different ids.
- ``StaleTab``       submits with an old ``base_version`` or an old ``pause_token``, then redraws from
                     the 409's snapshot and submits again.
- ``Canceller``      cancels jobs while they detect, wait or segment, then checks nothing moves them.

Configuration (command line or environment; ``locust -f loadtest/locustfile.py --help``):
``--hitl-weights``/``HITL_LT_WEIGHTS`` ("Reviewer=4,Canceller=1"), ``--hitl-counts``/``HITL_LT_COUNTS``
(fixed user counts), ``--hitl-record``/``HITL_LT_RECORD`` (JSONL of every intervention and creation
answer, for ``loadtest.check_invariants``), ``--hitl-summary``/``HITL_LT_SUMMARY`` (status counts,
written at the end), token from ``HITL_TOKEN`` or ``<HITL_DATA_DIR>/api-token``. Classes can also be
chosen by name on the command line (``locust ... Reviewer StaleTab``) and by ``--tags``.

Every request is named ``<route> <outcome>`` ("interventions 200", "interventions replay",
"interventions 409 VERSION_CONFLICT", "jobs 202", "cancel 409 JOB_TERMINAL"), so locust's table shows
each answer separately, and carries an ``X-Request-ID``. Protocol checks that span several requests
(one winner per race, a stale tab never wins) are reported as request type ``CHECK``; time from
opening a stream to an event as type ``SSE``.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Generator, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent
from gevent.event import Event as GreenEvent
from locust import HttpUser, between, events, tag, task
from locust.clients import HttpSession
from requests import RequestException

from harness.sse import parse_sse
from harness.tokens import resolve_token
from loadtest.common import Recorder, body_hash, is_replayed, outcome, request_id

API = "/api/v1"
SCENARIOS = ("Submitter", "Reviewer", "DoubleClicker", "RivalReviewers", "StaleTab", "Canceller")
DEFAULT_WEIGHTS = {
    "Submitter": 2,
    "Reviewer": 3,
    "DoubleClicker": 1,
    "RivalReviewers": 1,
    "StaleTab": 1,
    "Canceller": 1,
}
LOSING_409 = {"409 VERSION_CONFLICT", "409 PAUSE_NOT_ACTIVE", "409 PAUSE_TOKEN_MISMATCH"}


# --------------------------------------------------------------------------- shared state


@dataclass
class Image:
    png: bytes
    boxes: list[list[int]]  # true object boxes, for plausible manual boxes
    size: tuple[int, int]


@dataclass
class JobRef:
    job_id: str
    image: int


@dataclass
class Shared:
    """What the users of one locust process share: the job pool, images, tallies."""

    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    token: str = ""
    images: list[Image] = field(default_factory=list)
    pool: deque[JobRef] = field(default_factory=lambda: deque(maxlen=500))
    keys: deque[tuple[str, int, str, bytes]] = field(default_factory=lambda: deque(maxlen=300))
    recorder: Recorder = field(default_factory=lambda: Recorder(None))
    names: Counter[str] = field(default_factory=Counter)
    status_codes: Counter[str] = field(default_factory=Counter)
    server_errors: Counter[str] = field(default_factory=Counter)
    transport_errors: Counter[str] = field(default_factory=Counter)
    checks: dict[str, Counter[str]] = field(default_factory=dict)
    summary_path: str = ""
    repeat: float = 0.15
    key_conflict: float = 0.03
    stream_timeout: float = 30.0
    rivals: int = 3
    started: float = 0.0


SH = Shared()


def _pairs(spec: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in (spec or "").split(","))):
        name, _, value = item.partition("=")
        if name not in SCENARIOS or not value.strip().isdigit():
            raise SystemExit(f"bad entry {item!r}: want Class=integer with Class one of {', '.join(SCENARIOS)}")
        out[name] = int(value)
    return out


def _options(parser: Any) -> None:
    g = parser.add_argument_group("hitl-review")
    g.add_argument(
        "--hitl-weights",
        env_var="HITL_LT_WEIGHTS",
        default="",
        help="Class=weight,... (default " + ",".join(f"{k}={v}" for k, v in DEFAULT_WEIGHTS.items()) + ")",
    )
    g.add_argument(
        "--hitl-counts",
        env_var="HITL_LT_COUNTS",
        default="",
        help="Class=count,...: a fixed number of users of those classes, spawned first",
    )
    g.add_argument(
        "--hitl-record",
        env_var="HITL_LT_RECORD",
        default="",
        help="JSONL file: one line per intervention and job-creation answer",
    )
    g.add_argument(
        "--hitl-summary",
        env_var="HITL_LT_SUMMARY",
        default="",
        help="JSON file written at the end: counts by name, status code, 5xx, checks",
    )
    g.add_argument(
        "--hitl-image-size",
        env_var="HITL_LT_IMAGE_SIZE",
        default="320x240",
        help="WxH of the generated product images (default 320x240)",
    )
    g.add_argument(
        "--hitl-images",
        env_var="HITL_LT_IMAGES",
        type=int,
        default=24,
        help="how many distinct images to generate (default 24)",
    )
    g.add_argument(
        "--hitl-repeat",
        env_var="HITL_LT_REPEAT",
        type=float,
        default=0.15,
        help="share of submissions that repeat an earlier Idempotency-Key and image",
    )
    g.add_argument(
        "--hitl-key-conflict",
        env_var="HITL_LT_KEY_CONFLICT",
        type=float,
        default=0.03,
        help="share of submissions that reuse a key with another image (expect 409)",
    )
    g.add_argument(
        "--hitl-stream-timeout",
        env_var="HITL_LT_STREAM_TIMEOUT",
        type=float,
        default=30.0,
        help="seconds a user follows one job's event stream at most (default 30); a job that takes "
        "longer is left to the invariant checker",
    )
    g.add_argument(
        "--hitl-rivals",
        env_var="HITL_LT_RIVALS",
        type=int,
        default=3,
        help="reviewers racing on one pause in RivalReviewers (>= 2)",
    )
    g.add_argument(
        "--hitl-wait", env_var="HITL_LT_WAIT", default="0.2,1.0", help="min,max seconds between a user's tasks"
    )


def _init(environment: Any, **_kw: Any) -> None:
    from serve_app.samples import product_composite

    opts = environment.parsed_options
    SH.token = resolve_token()
    weights = {**DEFAULT_WEIGHTS, **_pairs(opts.hitl_weights if opts else "")}
    counts = _pairs(opts.hitl_counts if opts else "")
    lo, hi = (float(x) for x in ((opts.hitl_wait if opts else "") or "0.2,1.0").split(","))
    for cls in (Submitter, Reviewer, DoubleClicker, RivalReviewers, StaleTab, Canceller):
        cls.weight = weights[cls.__name__]
        cls.fixed_count = counts.get(cls.__name__, 0)
        cls.wait_time = between(lo, hi)
    w, h = (int(v) for v in (opts.hitl_image_size if opts else "320x240").lower().split("x"))
    n = opts.hitl_images if opts else 24
    for i in range(n):
        png, boxes = product_composite(seed=1000 + i, width=w, height=h, n=1 + i % 3)
        SH.images.append(Image(png, boxes, (w, h)))
    if opts:
        SH.recorder = Recorder(opts.hitl_record or None)
        SH.summary_path = opts.hitl_summary
        SH.repeat, SH.key_conflict = opts.hitl_repeat, opts.hitl_key_conflict
        SH.stream_timeout, SH.rivals = opts.hitl_stream_timeout, max(2, opts.hitl_rivals)


def _start(**_kw: Any) -> None:
    SH.started = time.time()
    for cls in (Submitter, Reviewer, DoubleClicker, RivalReviewers, StaleTab, Canceller):
        if not cls.tasks:  # --tags / --exclude-tags filtered every task away: spawn none of it
            cls.weight, cls.fixed_count = 0, 0


def _tally(request_type: str, name: str, response: Any = None, exception: Any = None, **_kw: Any) -> None:
    SH.names[name] += 1
    if request_type == "CHECK":
        SH.checks.setdefault(name, Counter())["failed" if exception else "ok"] += 1
        return
    status = getattr(response, "status_code", None)
    if status is None:
        return
    SH.status_codes[str(status)] += 1
    if status == 0:
        SH.transport_errors[name] += 1
    elif status >= 500:
        SH.server_errors[name] += 1


def _stop(**_kw: Any) -> None:
    SH.recorder.close()
    if not SH.summary_path:
        return
    summary = {
        "run_id": SH.run_id,
        "seconds": round(time.time() - SH.started, 2),
        "requests_by_name": dict(sorted(SH.names.items())),
        "status_codes": dict(SH.status_codes),
        "server_errors": sum(SH.server_errors.values()),
        "server_errors_by_name": dict(SH.server_errors),
        "transport_errors": sum(SH.transport_errors.values()),
        "transport_errors_by_name": dict(SH.transport_errors),
        "checks": {k: dict(v) for k, v in sorted(SH.checks.items())},
        "checks_failed": sum(v["failed"] for v in SH.checks.values()),
    }
    Path(SH.summary_path).parent.mkdir(parents=True, exist_ok=True)
    Path(SH.summary_path).write_text(json.dumps(summary, indent=2))


def _listen(hook: Any, listener: Callable[..., None]) -> None:
    """Register with a locust event hook (its ``add_listener`` decorator is untyped)."""
    hook.add_listener(listener)


_listen(events.init_command_line_parser, _options)
_listen(events.init, _init)
_listen(events.test_start, _start)
_listen(events.request, _tally)
_listen(events.test_stop, _stop)


def _json(resp: Any) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


# --------------------------------------------------------------------------- base user


class HitlUser(HttpUser):
    """The protocol moves every scenario shares, each request named by route and outcome."""

    abstract = True
    wait_time = between(0.2, 1.0)

    def on_start(self) -> None:
        self.client.headers["Authorization"] = f"Bearer {SH.token}"
        self.rng = random.Random()

    def session(self) -> HttpSession:
        """Another browser: its own connections, the same reviewer token."""
        s = HttpSession(base_url=self.host, request_event=self.environment.events.request, user=self)
        s.headers["Authorization"] = f"Bearer {SH.token}"
        return s

    # ------------------------------------------------------------------ reporting

    def check(self, name: str, ok: bool, message: str = "") -> None:
        self.environment.events.request.fire(
            request_type="CHECK",
            name=name,
            response_time=0,
            response_length=0,
            response=None,
            context={},
            exception=None if ok else AssertionError(message or name),
        )

    def since(self, name: str, t0: float, error: str | None = None) -> None:
        self.environment.events.request.fire(
            request_type="SSE",
            name=name,
            response_time=(time.time() - t0) * 1000,
            response_length=0,
            response=None,
            context={},
            exception=AssertionError(error) if error else None,
        )

    @staticmethod
    def judge(resp: Any, route: str, label: str, expect: set[str], scenario: str) -> None:
        resp.request_meta["name"] = f"{route} {label}"
        if label == "error" or resp.status_code >= 500:
            resp.failure(f"{route}: {label} {resp.text[:200] if resp.status_code else resp.error}")
        elif label in expect:
            resp.success()
        else:
            resp.failure(f"{scenario}: unexpected {route} {label} (expected {' | '.join(sorted(expect))})")

    # ------------------------------------------------------------------ jobs

    def submit_job(self, scenario: str, *, repeats: bool = True) -> tuple[JobRef | None, bool]:
        """A new job (``(ref, True)``), or, for a share of calls, a repeated key: ``(ref, False)`` for
        the original job, ``(None, False)`` for a deliberate key conflict."""
        r = self.rng.random()
        if repeats and SH.keys and r < SH.repeat + SH.key_conflict:
            key, idx, job_id, first = self.rng.choice(SH.keys)
            if r < SH.repeat:
                return self._post_job(scenario, key, idx, expect_job=job_id, expect_body=first), False
            other = (idx + 1 + self.rng.randrange(len(SH.images) - 1)) % len(SH.images)
            self._post_job(scenario, key, other, expect_conflict=job_id)
            return None, False
        key = f"lt-{SH.run_id}-{uuid.uuid4().hex[:12]}"
        return self._post_job(scenario, key, self.rng.randrange(len(SH.images))), True

    def _post_job(
        self,
        scenario: str,
        key: str,
        idx: int,
        *,
        expect_job: str | None = None,
        expect_body: bytes | None = None,
        expect_conflict: str | None = None,
    ) -> JobRef | None:
        rid = request_id()
        files = {"image": (f"product_{idx:02d}.png", SH.images[idx].png, "image/png")}
        with self.client.post(
            f"{API}/jobs",
            files=files,
            headers={"Idempotency-Key": key, "X-Request-ID": rid},
            name="jobs",
            catch_response=True,
        ) as resp:
            body = _json(resp)
            replayed = is_replayed(resp.headers)
            label = outcome(resp.status_code, replayed, body)
            job_id = body.get("job_id") or (body.get("snapshot") or {}).get("job_id")
            SH.recorder.write(
                kind="create",
                scenario=scenario,
                request_id=rid,
                idempotency_key=key,
                image=idx,
                status=resp.status_code,
                code=body.get("code"),
                replayed=replayed,
                job_id=job_id,
                body_sha256=body_hash(resp.content or b""),
            )
            if expect_conflict:
                self.judge(resp, "jobs", label, {"409 IDEMPOTENCY_CONFLICT"}, scenario)
                if label == "409 IDEMPOTENCY_CONFLICT" and job_id != expect_conflict:
                    resp.failure(f"key conflict names job {job_id}, the key belongs to {expect_conflict}")
                return None
            if expect_job:
                self.judge(resp, "jobs", label, {"replay"}, scenario)
                if label == "replay" and (job_id != expect_job or resp.content != expect_body):
                    resp.failure(f"replayed key gave job {job_id} (want {expect_job}) or different bytes")
                return JobRef(expect_job, idx)
            self.judge(resp, "jobs", label, {"202"}, scenario)
            if label != "202" or not job_id:
                return None
            SH.keys.append((key, idx, job_id, resp.content))
            return JobRef(job_id, idx)

    def claim_job(self, scenario: str) -> JobRef | None:
        """A job nobody else works on: from the submitters' pool, else a fresh one of our own."""
        try:
            return SH.pool.popleft()
        except IndexError:
            return self.submit_job(scenario, repeats=False)[0]

    def cancel(self, job_id: str, scenario: str, expect: set[str], name: str = "cancel") -> tuple[str, dict[str, Any]]:
        rid = request_id()
        with self.client.post(
            f"{API}/jobs/{job_id}/cancel", headers={"X-Request-ID": rid}, name=name, catch_response=True
        ) as resp:
            body = _json(resp)
            label = outcome(resp.status_code, False, body)
            SH.recorder.write(
                kind="cancel",
                scenario=scenario,
                request_id=rid,
                job_id=job_id,
                status=resp.status_code,
                code=body.get("code"),
                job_status=body.get("status"),
            )
            self.judge(resp, name, label, expect, scenario)
            if label == "200" and body.get("status") != "CANCELLED":
                resp.failure(f"cancel answered 200 with status {body.get('status')}")
        return label, body

    # ------------------------------------------------------------------ events

    def stream(self, job_id: str, deadline: float, after: int = 0) -> Generator[dict[str, Any], None, None]:
        """The job's events (history, then live) until the stream ends or ``deadline`` passes."""
        t0 = time.time()
        headers = {"X-Request-ID": request_id(), "Accept": "text/event-stream"}
        if after:
            headers["Last-Event-ID"] = str(after)
        resp = self.client.get(
            f"{API}/jobs/{job_id}/events",
            headers=headers,
            stream=True,
            catch_response=True,
            name="events",
            timeout=(10, 20),
        )
        try:
            with resp:
                label = outcome(resp.status_code, False, {} if resp.status_code == 200 else _json(resp))
                self.judge(resp, "events", label, {"200"}, "stream")
            if label != "200":
                return
            # chunk_size=None hands lines on as they arrive (types-requests only allows an int)
            lines = resp.iter_lines(chunk_size=None, decode_unicode=True)  # type: ignore[call-overload]
            for ev in parse_sse(lines):
                if ev.get("type") != ":":
                    yield ev
                if time.time() > deadline:
                    return
        except RequestException as e:
            self.since("events read", t0, error=f"stream of {job_id} broke: {type(e).__name__}: {e}")
        finally:
            resp.close()

    def wait_pause(self, job_id: str) -> dict[str, Any] | None:
        """The first PAUSE_OPENED event of the job (None when it ended or the deadline passed)."""
        t0 = time.time()
        with closing(self.stream(job_id, t0 + SH.stream_timeout)) as evs:
            for ev in evs:
                if ev["type"] == "PAUSE_OPENED":
                    self.since("events → PAUSE_OPENED", t0)
                    return ev
                if ev["type"] == "JOB_FINISHED":
                    return None
        self.since("events → PAUSE_OPENED", t0, error=f"no pause for job {job_id} within the deadline")
        return None

    # ------------------------------------------------------------------ interventions

    def claim_pause(self, scenario: str) -> tuple[JobRef, dict[str, Any], list[dict[str, Any]]] | None:
        """A job of the pool and the pause it opened, with the boxes shown in it (None: no pause came)."""
        ref = self.claim_job(scenario)
        ev = self.wait_pause(ref.job_id) if ref is not None else None
        if ref is None or ev is None:
            return None
        return ref, ev["data"]["active_pause"], ev["data"]["box_list"]

    def intervene(
        self, job_id: str, body: dict[str, Any], scenario: str, expect: set[str], client: HttpSession | None = None
    ) -> tuple[str, dict[str, Any], bytes]:
        rid = request_id()
        with (client or self.client).post(
            f"{API}/jobs/{job_id}/interventions",
            json=body,
            name="interventions",
            headers={"X-Request-ID": rid},
            catch_response=True,
        ) as resp:
            js = _json(resp)
            replayed = is_replayed(resp.headers)
            label = outcome(resp.status_code, replayed, js)
            SH.recorder.write(
                kind="intervention",
                scenario=scenario,
                request_id=rid,
                job_id=job_id,
                intervention_id=body["intervention_id"],
                pause_token=body["pause_token"],
                base_version=body["base_version"],
                subjects=len(body["subjects"]),
                status=resp.status_code,
                code=js.get("code"),
                replayed=replayed,
                body_sha256=body_hash(resp.content or b""),
                response_version=js.get("version"),
                response_status=js.get("status"),
            )
            self.judge(resp, "interventions", label, expect, scenario)
            content = resp.content or b""
        return label, js, content

    def body(
        self,
        pause: dict[str, Any],
        subjects: list[dict[str, Any]],
        *,
        token: str | None = None,
        version: int | None = None,
    ) -> dict[str, Any]:
        return {
            "intervention_id": f"iv_lt_{uuid.uuid4().hex[:16]}",
            "pause_token": token if token is not None else pause["pause_token"],
            "base_version": version if version is not None else pause["base_version"],
            "subjects": subjects,
        }

    def choose(
        self,
        ref: JobRef,
        pause: dict[str, Any],
        boxes: list[dict[str, Any]],
        *,
        manual: float = 0.3,
        empty: float = 0.04,
        models_only: bool = False,
    ) -> list[dict[str, Any]]:
        """What a reviewer plausibly keeps: most model boxes, boxes that passed naming, a fix or a
        deletion for each box a revision round names, and now and then a box drawn by hand."""
        rng = self.rng
        img = SH.images[ref.image]
        if pause.get("round", 1) == 1 and rng.random() < empty:
            return []
        revise = set(pause.get("box_ids_to_revise") or [])
        out: list[dict[str, Any]] = []
        for b in boxes:
            if models_only and b.get("source") != "model":
                continue
            if b["box_id"] in revise:
                if rng.random() < 0.5:  # redraw it on the object it was meant to be
                    out.append(
                        {
                            "box_id": b["box_id"],
                            "bbox": self.near_truth(img, b["bbox"]),
                            "label": b.get("label") or "product",
                        }
                    )
                continue
            passed = (b.get("validation") or {}).get("status") == "PASSED"
            if passed or rng.random() < 0.75:
                out.append({"box_id": b["box_id"], "bbox": b["bbox"]})
        if not models_only and pause.get("round", 1) == 1 and rng.random() < manual:
            out.append(self.manual_box(img))
        return out

    def manual_box(self, img: Image) -> dict[str, Any]:
        """Half the time around a real object (the detector missed it), half a careless box."""
        w, h = img.size
        if img.boxes and self.rng.random() < 0.5:
            bbox = self.near_truth(img, self.rng.choice(img.boxes))
        else:
            x1, y1 = self.rng.uniform(0, w - 40), self.rng.uniform(0, h - 40)
            bbox = [
                round(x1, 1),
                round(y1, 1),
                round(min(w, x1 + self.rng.uniform(20, w / 2)), 1),
                round(min(h, y1 + self.rng.uniform(20, h / 2)), 1),
            ]
        return {"bbox": bbox, "label": self.rng.choice(["shoe", "bag", "box", "product"])}

    def near_truth(self, img: Image, bbox: Sequence[float]) -> list[float]:
        """The true box closest to ``bbox``, jittered by a few pixels and kept inside the image."""
        w, h = img.size
        if img.boxes:
            cx, cy = (bbox[0] + bbox[2]) / 2, (bbox[1] + bbox[3]) / 2
            bbox = min(img.boxes, key=lambda t: ((t[0] + t[2]) / 2 - cx) ** 2 + ((t[1] + t[3]) / 2 - cy) ** 2)
        j = [self.rng.uniform(-3, 3) for _ in range(4)]
        x1, y1 = max(0.0, bbox[0] + j[0]), max(0.0, bbox[1] + j[1])
        x2, y2 = min(float(w), bbox[2] + j[2]), min(float(h), bbox[3] + j[3])
        if x2 - x1 < 2 or y2 - y1 < 2:
            x1, y1, x2, y2 = 0.0, 0.0, float(w), float(h)
        return [round(x1, 1), round(y1, 1), round(x2, 1), round(y2, 1)]


# --------------------------------------------------------------------------- scenarios


class Submitter(HitlUser):
    weight = DEFAULT_WEIGHTS["Submitter"]

    @tag("submit")
    @task
    def submit(self) -> None:
        ref, fresh = self.submit_job("Submitter")
        if ref and fresh:
            SH.pool.append(ref)


class Reviewer(HitlUser):
    weight = DEFAULT_WEIGHTS["Reviewer"]

    @tag("review")
    @task
    def review(self) -> None:
        ref = self.claim_job("Reviewer")
        if ref is None:
            return
        t0 = time.time()
        opened = False
        with closing(self.stream(ref.job_id, t0 + SH.stream_timeout)) as evs:
            for ev in evs:
                if ev["type"] == "PAUSE_OPENED":
                    if not opened:
                        self.since("events → PAUSE_OPENED", t0)
                        opened = True
                    pause, boxes = ev["data"]["active_pause"], ev["data"]["box_list"]
                    gevent.sleep(self.rng.uniform(0.05, 0.4))  # looking at the picture
                    label, _, _ = self.intervene(
                        ref.job_id, self.body(pause, self.choose(ref, pause, boxes)), "Reviewer", {"200"}
                    )
                    if label != "200":
                        return
                elif ev["type"] == "JOB_FINISHED":
                    self.since("events → JOB_FINISHED", t0)
                    return
        self.since("events → JOB_FINISHED", t0, error=f"job {ref.job_id} did not finish within the deadline")


class DoubleClicker(HitlUser):
    weight = DEFAULT_WEIGHTS["DoubleClicker"]

    @tag("double-click")
    @task
    def double_click(self) -> None:
        opened = self.claim_pause("DoubleClicker")
        if opened is None:
            return
        ref, pause, boxes = opened
        body = self.body(pause, self.choose(ref, pause, boxes))
        first = gevent.spawn(self.intervene, ref.job_id, body, "DoubleClicker", {"200", "replay"})
        gevent.sleep(self.rng.uniform(0, 0.005))
        second = gevent.spawn(self.intervene, ref.job_id, body, "DoubleClicker", {"200", "replay"})
        gevent.joinall([first, second])
        if first.value is None or second.value is None:
            return
        labels = sorted([first.value[0], second.value[0]])
        self.check(
            "double-click: one 200, one byte-identical replay",
            labels == ["200", "replay"] and first.value[2] == second.value[2],
            f"job {ref.job_id}: {labels}, identical={first.value[2] == second.value[2]}",
        )


class RivalReviewers(HitlUser):
    weight = DEFAULT_WEIGHTS["RivalReviewers"]

    @tag("rivals")
    @task
    def race(self) -> None:
        opened = self.claim_pause("RivalReviewers")
        if opened is None:
            return
        ref, pause, boxes = opened
        go = GreenEvent()
        sessions = [self.session() for _ in range(SH.rivals)]

        def rival(s: HttpSession) -> tuple[str, dict[str, Any], bytes]:
            body = self.body(pause, self.choose(ref, pause, boxes))
            go.wait()
            return self.intervene(ref.job_id, body, "RivalReviewers", {"200"} | LOSING_409, client=s)

        racers = [gevent.spawn(rival, s) for s in sessions]
        gevent.sleep(0)
        go.set()
        gevent.joinall(racers)
        for s in sessions:
            s.close()
        results = [g.value for g in racers if g.value is not None]
        winners = [r for r in results if r[0] == "200"]
        self.check(
            "rivals: exactly one winner", len(winners) == 1, f"job {ref.job_id}: {sorted(r[0] for r in results)}"
        )
        stale = [r for r in results if r[0] in LOSING_409]
        self.check(
            "rivals: 409 carries the moved-on snapshot",
            all((r[1].get("snapshot") or {}).get("version", 0) > pause["base_version"] for r in stale),
            f"job {ref.job_id}: a 409 snapshot still shows the raced version",
        )


class StaleTab(HitlUser):
    weight = DEFAULT_WEIGHTS["StaleTab"]

    @tag("stale")
    @task
    def stale(self) -> None:
        opened = self.claim_pause("StaleTab")
        if opened is None:
            return
        ref, pause, boxes = opened
        kind = self.rng.choice(["old-version", "old-token", "after-submit"])
        if kind == "after-submit":
            # Tab A submits; tab B, still showing the same pause, submits its own choice.
            label, done, _ = self.intervene(
                ref.job_id, self.body(pause, self.choose(ref, pause, boxes)), "StaleTab", {"200"}
            )
            if label != "200":
                return
            for stale in (
                self.body(pause, self.choose(ref, pause, boxes)),
                self.body(pause, self.choose(ref, pause, boxes), version=done["version"]),
            ):
                got, _, _ = self.intervene(ref.job_id, stale, "StaleTab", LOSING_409)
                self.check("stale tab never wins", got != "200", f"job {ref.job_id}: stale {kind} got 200")
            return
        if kind == "old-version":
            stale = self.body(pause, self.choose(ref, pause, boxes), version=pause["base_version"] - 1)
            expect = {"409 VERSION_CONFLICT"}
        else:
            stale = self.body(pause, self.choose(ref, pause, boxes), token=f"pause_{uuid.uuid4().hex[:20]}")
            expect = {"409 PAUSE_TOKEN_MISMATCH"}
        got, conflict, _ = self.intervene(ref.job_id, stale, "StaleTab", expect)
        self.check("stale tab never wins", got != "200", f"job {ref.job_id}: stale {kind} got 200")
        snap = conflict.get("snapshot") or {}
        fresh = snap.get("active_pause")
        if not fresh or fresh.get("status") != "WAITING":
            self.check("409 snapshot lets the tab redraw", False, f"job {ref.job_id}: no active pause in {got}")
            return
        # Redraw from the 409's snapshot, without another GET, and submit again.
        redraw = self.body(fresh, self.choose(ref, fresh, snap.get("box_list") or []), version=snap["version"])
        got, _, _ = self.intervene(ref.job_id, redraw, "StaleTab", {"200"})
        self.check("409 snapshot lets the tab redraw", got == "200", f"job {ref.job_id}: redraw got {got}")


class Canceller(HitlUser):
    weight = DEFAULT_WEIGHTS["Canceller"]

    @tag("cancel")
    @task
    def cancel_somewhere(self) -> None:
        phase = self.rng.choice(["detecting", "waiting", "segmenting"])
        if phase == "detecting":
            ref, _ = self.submit_job("Canceller", repeats=False)
            if ref is None:
                return
            # With a GPU-like detector delay the job is still DETECTING; if not, it waits.
            self.cancel(ref.job_id, "Canceller", {"200"}, name="cancel")
            self.after_cancel(ref, None)
            return
        opened = self.claim_pause("Canceller")
        if opened is None:
            return
        ref, pause, boxes = opened
        if phase == "segmenting":
            subjects = self.choose(ref, pause, boxes, models_only=True, empty=0.0) or []
            label, _, _ = self.intervene(ref.job_id, self.body(pause, subjects), "Canceller", {"200"})
            if label != "200":
                return
            # Racing the segmenter: it may already have finished the job.
            self.cancel(ref.job_id, "Canceller", {"200", "409 JOB_TERMINAL"})
            return
        self.cancel(ref.job_id, "Canceller", {"200"})
        self.after_cancel(ref, pause)

    def after_cancel(self, ref: JobRef, pause: dict[str, Any] | None) -> None:
        """A cancel is idempotent, and a cancelled job takes no intervention."""
        self.cancel(ref.job_id, "Canceller", {"200"}, name="cancel again")
        if pause is not None:
            late = self.body(pause, self.choose(ref, pause, []))
            got, _, _ = self.intervene(ref.job_id, late, "Canceller", {"409 JOB_CANCELLED"})
            self.check("cancelled job takes no intervention", got != "200", f"job {ref.job_id}: {got}")
