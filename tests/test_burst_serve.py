"""A catalogue submitted at once to slow models, on a real ``hitl up`` on Ray Serve (issue: Step 12).

Each test runs what users run, changing only the knob it needs:

- defaults (Detector 1-2 replicas x ``max_ongoing_requests`` 8) with a slow detector and a short
  ``--heartbeat-lapse-s``: a burst waits in the queue far longer than the lapse. A node is RUNNING
  only once a replica starts it, so none is declared lost for waiting, none runs twice, and the
  dispatcher never has more calls outstanding than the Detector can start (plus one queued per
  replica for the autoscaler): the rest waits in the outbox, counted as backlog;
- one single-slot Detector (``--config``), ``--node-timeout-s`` shorter than the queue and a small
  ``--max-backlog``: the deadline counts from the start, never the queue, and admission control
  sees the queue (429 ``BACKLOG_FULL``) while every accepted job still gets its review.

Before the fix: 59 of 120 jobs ``FAILED`` (``EXECUTOR_LOST``) at 4 s per image, 6 of 8 ``TIMED_OUT``
on the single slot, and 15 of 15 quick submissions accepted under ``--max-backlog 3``.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from harness.ci import require_binary
from harness.hitl_up import HitlUp
from harness.tokens import TOKENS_SPEC, auth
from hitl_review.statecore import keys
from tests.api_util import blank_with_product, get, submit, wait_status

pytestmark = [pytest.mark.faults, pytest.mark.ray, pytest.mark.slow]

LOST = {"NODE_LOST", "NODE_ATTEMPT_FAILED", "NODE_DEAD_LETTERED", "NODE_TIMED_OUT"}


def _series(text: str, name: str) -> list[float]:
    return [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name)]


class OutboxWatch:
    """Samples, in a thread, the commands delivered to a dispatcher and not yet acknowledged and
    the backlog (the ``queued`` indexes) straight from the embedded Redis, and the dispatcher's
    outstanding Detector calls and their limit from the Api's ``/metrics``."""

    def __init__(self, redis_url: str, api_url: str) -> None:
        self.r = redis.Redis.from_url(redis_url, decode_responses=True)
        self.api_url = api_url
        self.calls: list[float] = []  # the dispatcher's outstanding Detector calls (its /metrics)
        self.limits: list[float] = []
        self.samples: list[tuple[int, int]] = []  # (delivered not acked, queued)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> OutboxWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                text = httpx.get(f"{self.api_url}/metrics", timeout=5).text
                self.calls.append(max([0.0, *_series(text, 'hitl_dispatcher_calls{deployment="Detector"}')]))
                self.limits.append(max([0.0, *_series(text, 'hitl_dispatcher_call_limit{deployment="Detector"}')]))
            except httpx.HTTPError:
                pass
            pipe = self.r.pipeline(transaction=False)
            for s in keys.all_outboxes():
                pipe.xpending(s, keys.OUTBOX_GROUP)
            for p in range(keys.PARTITIONS):
                pipe.zcard(keys.queued(p))
            res = pipe.execute(raise_on_error=False)
            n = len(keys.all_outboxes())  # every lane's stream of every partition
            pending = sum(int(x["pending"]) for x in res[:n] if isinstance(x, dict))
            queued = sum(int(x) for x in res[n:] if isinstance(x, int))
            self.samples.append((pending, queued))


def _submit_all(c: httpx.Client, n: int, seed: int) -> tuple[list[str], int]:
    """``n`` jobs at once (16 submitters): (accepted job ids in submission order, 429 answers)."""
    images = [blank_with_product(seed=seed + i) for i in range(n)]

    def one(i: int) -> httpx.Response:
        return submit(c, images[i], key=f"burst-{seed}-{i}")

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, range(n)))
    jobs, refused = [], 0
    for r in answers:
        if r.status_code == 429:
            assert r.json()["code"] == "BACKLOG_FULL" and r.headers.get("Retry-After"), r.text
            refused += 1
            continue
        assert r.status_code == 202, r.text
        jobs.append(r.json()["job_id"])
    return jobs, refused


def _one_start_each(c: httpx.Client, jobs: list[str]) -> None:
    """Every job reached its review with its detection started once: attempt 1, and no lost,
    failed, timed-out or dead-lettered attempt anywhere in its audit log."""
    for j in jobs:
        snap = get(c, j)
        assert snap["status"] == "WAITING_USER_SELECTION", snap
        assert snap["current_node"]["attempt"] == 1, snap["current_node"]
        audit = c.get(f"/api/v1/jobs/{j}/audit", headers=auth("rev1")).json()["entries"]
        actions = [e["action"] for e in audit]
        assert not LOST & set(actions), actions
        assert actions.count("NODE_STARTED") == 1, actions


def _up(tmp_path: Path, *args: str) -> HitlUp:
    require_binary("redis-server")
    return HitlUp(tmp_path / "data", *args, env={"HITL_TOKENS": TOKENS_SPEC}, log_path=tmp_path / "hitl-up.log").start(
        timeout=400
    )


def test_a_burst_queued_longer_than_the_heartbeat_lapse_loses_nothing_with_default_settings(tmp_path: Path):
    jobs_n, delay_ms = 48, 1500
    up = _up(tmp_path, "--detector-delay-ms", str(delay_ms), "--heartbeat-lapse-s", "3")
    try:
        assert up.redis_url
        with httpx.Client(base_url=up.api_url, timeout=60) as c, OutboxWatch(up.redis_url, up.api_url) as watch:
            t0 = time.monotonic()
            jobs, refused = _submit_all(c, jobs_n, seed=300)
            assert refused == 0 and len(jobs) == jobs_n
            for j in jobs:
                wait_status(c, j, {"WAITING_USER_SELECTION", "FAILED", "TIMED_OUT"}, timeout=240)
            drained_s = time.monotonic() - t0
            _one_start_each(c, jobs)
        peak_pending = max(p for p, _ in watch.samples)
        peak_queued = max(q for _, q in watch.samples)
        print(
            f"\n[burst] {jobs_n} jobs x {delay_ms} ms, lapse 3 s: all reviewed-ready in {drained_s:.1f}s; Detector "
            f"calls peak {max(watch.calls):g} (limit {max(watch.limits):g}), read and not acked peak {peak_pending}, "
            f"backlog peak {peak_queued}"
        )
        # Calls: at most what the Detector can start, 2 replicas x (8 slots + 1 queued for the
        # autoscaler); read from the outbox: that and at most one deployment's worth waiting for a slot.
        assert 0 < max(watch.calls) <= max(watch.limits) <= 2 * (8 + 1), (watch.calls, watch.limits)
        assert peak_pending <= 2 * 2 * (8 + 1), watch.samples
        assert peak_queued >= jobs_n - 2 * 2 * (8 + 1), "the waiting work was not in the outbox's backlog"
    finally:
        up.stop()


def test_the_deadline_counts_from_the_start_and_admission_sees_the_queue(tmp_path: Path):
    config = tmp_path / "single-slot.yaml"
    config.write_text(yaml.safe_dump({"deployments": {"Detector": {"num_replicas": 1, "max_ongoing_requests": 1}}}))
    up = _up(
        tmp_path,
        "--config",
        str(config),
        "--detector-delay-ms",
        "1500",
        "--node-timeout-s",
        "4",
        "--max-backlog",
        "3",
    )
    try:
        assert up.redis_url
        with httpx.Client(base_url=up.api_url, timeout=60) as c, OutboxWatch(up.redis_url, up.api_url) as watch:
            jobs, refused = _submit_all(c, 15, seed=500)
            print(f"\n[burst] single slot, --max-backlog 3: {len(jobs)} accepted, {refused} x 429")
            assert refused > 0, "15 quick submissions behind a single slot were all accepted"
            assert len(jobs) >= 4
            statuses: dict[str, Any] = {}
            for j in jobs:  # each waits ~1.5 s per job ahead of it, well past the 4 s deadline
                statuses[j] = wait_status(c, j, {"WAITING_USER_SELECTION", "FAILED", "TIMED_OUT"}, timeout=120)[
                    "status"
                ]
            assert set(statuses.values()) == {"WAITING_USER_SELECTION"}, statuses
            _one_start_each(c, jobs)
        assert max(watch.calls) == max(watch.limits) == 1 + 1, (watch.calls, watch.limits)  # 1 slot + 1 queued
    finally:
        up.stop()
