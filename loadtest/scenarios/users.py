"""The six user classes locust spawns, one per person or accident the pause protocol must survive
(see ``loadtest/locustfile.py``)."""

from __future__ import annotations

import time
import uuid
from contextlib import closing
from typing import Any

import gevent
from gevent.event import Event as GreenEvent
from locust import tag, task
from locust.clients import HttpSession

from loadtest.scenarios.base import HitlUser
from loadtest.scenarios.shared import DEFAULT_WEIGHTS, LOSING_409, SH, JobRef


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
                    if pause.get("stage") == "WAITING_MASK_REVIEW":  # the cut-outs the gate still fails
                        body = self.mask_body(pause)
                        self.check("mask review lists subjects", bool(body["decisions"]), f"job {ref.job_id}")
                    else:
                        body = self.body(pause, self.choose(ref, pause, boxes))
                    label, _, _ = self.intervene(ref.job_id, body, "Reviewer", {"200"})
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
