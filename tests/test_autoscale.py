"""Serve's autoscaling of the Segmenter seen from outside, through Serve's status API.

A real ``hitl up`` (its own local cluster, the dashboard on) with a slow segmenter
(``--segmenter-delay-ms``) and short autoscaling delays from the ``--config`` file. A burst of
reviews (every job of a batch approved at once) queues segmentation: the Segmenter grows from one
replica to its maximum, and once the burst is done shrinks back to one. The replica counts over
time go to ``benchmarks/out/autoscale.json`` (and an SVG plot beside it; ``docs/scaling.md``
shows one)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
import yaml

from harness.autoscale import ReplicaWatcher, svg
from harness.ci import require_binary
from harness.hitl_up import HitlUp, ray_token_header
from harness.tokens import TOKENS_SPEC
from tests.api_util import blank_with_product, intervene, keep_all, submit, wait_done, wait_status

pytestmark = [pytest.mark.ray_cluster, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
JOBS = 8
SEGMENT_MS = 4000
MAX_REPLICAS = 3
CONFIG = {
    "deployments": {
        "Detector": {"num_replicas": 1},
        "BoxValidator": {"num_replicas": 1},
        "Segmenter": {
            "min_replicas": 1,
            "initial_replicas": 1,
            "max_replicas": MAX_REPLICAS,
            "target_ongoing_requests": 1,
            "max_ongoing_requests": 2,
            "upscale_delay_s": 1,
            "downscale_delay_s": 4,
            "look_back_period_s": 2,
        },
    }
}


def test_segmenter_grows_to_its_maximum_under_a_review_burst_and_shrinks_back(tmp_path: Path):
    require_binary("redis-server")
    config = tmp_path / "autoscale.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    t0 = time.monotonic()
    up = HitlUp(
        tmp_path / "data",
        "--config",
        str(config),
        "--segmenter-delay-ms",
        str(SEGMENT_MS),
        dashboard=True,
        env={"HITL_TOKENS": TOKENS_SPEC},
        log_path=tmp_path / "hitl-up.log",
    ).start(timeout=400)
    started_s = time.monotonic() - t0
    assert up.dashboard_url
    watcher = ReplicaWatcher(up.dashboard_url, "hitl", "Segmenter", ray_token_header())
    try:
        with httpx.Client(base_url=up.api_url, timeout=60) as c:
            jobs = []
            for i in range(JOBS):
                r = submit(c, blank_with_product(seed=100 + i), key=f"burst-{i}")
                assert r.status_code == 202, r.text
                jobs.append(r.json()["job_id"])
            snaps = [wait_status(c, j, {"WAITING_USER_SELECTION"}, timeout=180) for j in jobs]
            watcher.start()
            time.sleep(3)  # the resting state first: one replica
            watcher.mark("burst")
            for j, snap in zip(jobs, snaps, strict=True):
                r = intervene(c, j, snap, keep_all(snap))
                assert r.status_code == 200, r.text
            deadline = time.monotonic() + 240
            for j in jobs:  # a cut-out the gate fails waits for a person (accepted here)
                assert wait_done(c, j, timeout=deadline - time.monotonic())["status"] == "SUCCEEDED"
            watcher.mark("done")
            burst_s = watcher.marks[-1]["t"] - watcher.marks[0]["t"]
            peak_before_done = max(s["running"] for s in watcher.samples)
            deadline = time.monotonic() + 120
            while not (watcher.last and watcher.last["running"] == 1 and watcher.last["target"] == 1):
                assert time.monotonic() < deadline, watcher.samples[-5:]
                time.sleep(0.5)
            time.sleep(2)
    finally:
        samples = watcher.stop()
        record = watcher.record()
        record.update(
            title=f"Segmenter replicas: {JOBS} reviews approved at once, {SEGMENT_MS} ms per segmentation",
            jobs=JOBS,
            segment_ms=SEGMENT_MS,
            config=CONFIG["deployments"]["Segmenter"],
        )
        out = ROOT / "benchmarks" / "out"
        out.mkdir(parents=True, exist_ok=True)
        (out / "autoscale.json").write_text(json.dumps(record, indent=1))
        (out / "autoscale.svg").write_text(svg(record, record["title"]))
        up.stop()
    counts = [s["running"] for s in samples]
    peak_t = next(s["t"] for s in samples if s["running"] == max(counts))
    print(
        f"\n[autoscale] start-up {started_s:.0f}s; Segmenter replicas {counts[0]} -> {max(counts)} "
        f"(at {peak_t - watcher.marks[0]['t']:.1f}s after the burst) -> {counts[-1]}; "
        f"burst of {JOBS} segmentations done in {burst_s:.1f}s; {len(samples)} samples"
    )
    assert counts[0] == 1, samples[:3]
    assert peak_before_done == MAX_REPLICAS, f"never reached {MAX_REPLICAS} replicas during the burst: {counts}"
    assert counts[-1] == 1
