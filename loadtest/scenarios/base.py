"""``HitlUser``: the protocol moves every scenario shares (submit, claim, stream, intervene, cancel),
each request named by route and outcome, and the protocol checks reported as ``CHECK``."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Generator, Sequence
from contextlib import closing
from typing import Any

from locust import HttpUser, between
from locust.clients import HttpSession
from requests import RequestException

from harness.sse import parse_sse
from loadtest.common import body_hash, is_replayed, outcome, request_id
from loadtest.scenarios.shared import API, SH, Image, JobRef, json_body


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
            body = json_body(resp)
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
            body = json_body(resp)
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
                label = outcome(resp.status_code, False, {} if resp.status_code == 200 else json_body(resp))
                self.judge(resp, "events", label, {"200"}, "stream")
            if label != "200":
                return
            # chunk_size=None hands lines on as they arrive
            lines = resp.iter_lines(chunk_size=None, decode_unicode=True)  # type: ignore[call-overload]  # stubs: int only
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
            js = json_body(resp)
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
                subjects=len(body.get("subjects") or body.get("decisions") or []),
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

    def mask_body(self, pause: dict[str, Any]) -> dict[str, Any]:
        """A mask review's submission: most masks accepted, some rejected with a reason, some refined
        with a click in the middle of the box (docs/protocol.md § Cut-out quality)."""
        decisions: list[dict[str, Any]] = []
        for s in pause.get("subjects_to_review") or []:
            roll = self.rng.random()
            if roll < 0.6:
                decisions.append({"box_id": s["box_id"], "decision": "ACCEPT"})
            elif roll < 0.8:
                decisions.append({"box_id": s["box_id"], "decision": "REJECT", "reason": "load test: not publishable"})
            else:
                x1, y1, x2, y2 = s["bbox"]
                click = {"x": (x1 + x2) / 2, "y": (y1 + y2) / 2, "positive": True}
                decisions.append({"box_id": s["box_id"], "decision": "REFINE", "points": [click]})
        return {
            "intervention_id": f"iv_lt_{uuid.uuid4().hex[:16]}",
            "pause_token": pause["pause_token"],
            "base_version": pause["base_version"],
            "decisions": decisions,
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
