"""Model replicas that die or hang mid-node, in a real ``hitl up`` (Ray Serve, embedded Redis):

- SIGKILL the Detector replica while it runs a node: the call fails at once, the attempt is
  recorded (NODE_FAILED, NODE_RETRY_SCHEDULED) and a new node instance completes on the replica
  Serve starts in its place;
- SIGSTOP it while it runs a node (a hang): its heartbeat lapses, the replica does not answer the
  inspector's confirmation, the node is re-dispatched; SIGCONT then lets the old call finish, and
  its late answer is REPORT_IGNORED (NODE_SUPERSEDED), never applied, while the new attempt completes;
- SIGKILL the Segmenter replica while a job's two subjects are cut side by side: each subject's
  attempt fails and is retried alone, each is cut once by a new instance;
- SIGKILL the whole ``hitl up`` tree while a node runs, stay down longer than the node's deadline,
  start again on the same data directory and port: the interrupted node runs again (it is not TIMED_OUT
  for the downtime) and the job goes on.

Invariants afterwards: every job went on to the review (nothing stuck), exactly one node
completion applied per job, every attempt visible, the replaced instance never reported OK.
One ``hitl up`` with short heartbeats and a slow detector, shared by both faults."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import psutil
import pytest
import redis

from harness.ci import require_binary
from harness.hitl_up import HitlUp
from hitl_review.serve_app.ops.samples import product_composite
from hitl_review.statecore import keys

pytestmark = [pytest.mark.faults, pytest.mark.ray, pytest.mark.slow]


def detector_replicas(up: HitlUp, deployment: str = "Detector") -> list[psutil.Process]:
    """The processes of a model deployment's replicas (Ray titles them ServeReplica:…:<deployment>)
    in ``up``'s process tree: never another ``hitl up``'s on this machine (make test runs two Ray
    test runs at once)."""
    found = []
    for p in up.child.tree():
        try:
            line = " ".join(p.cmdline())
            if "ServeReplica" in line and deployment in line and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:  # a worker that exited meanwhile
            continue
    return found


def submit(c: httpx.Client, seed: int) -> str:
    data, _ = product_composite(seed=seed, n=1)
    r = c.post("/api/v1/jobs", files={"image": (f"{seed}.png", data, "image/png")})
    assert r.status_code == 202, r.text
    return str(r.json()["job_id"])


def wait_running(c: httpx.Client, job_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        snap = c.get(f"/api/v1/jobs/{job_id}").json()
        node = snap.get("current_node") or {}
        if node.get("status") == "RUNNING":
            return snap
        assert time.monotonic() < deadline, f"node never started: {snap}"
        time.sleep(0.1)


def wait_status(c: httpx.Client, job_id: str, status: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        r = c.get(f"/api/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        snap = r.json()
        if snap["status"] == status:
            return snap
        assert snap["status"] == "DETECTING", f"job ended {snap['status']} ({snap['reason_code']})"
        assert time.monotonic() < deadline, f"still {snap['status']} after {timeout}s: {snap['current_node']}"
        time.sleep(0.2)


def events(c: httpx.Client, job_id: str) -> list[dict]:
    out = []
    with c.stream("GET", f"/api/v1/jobs/{job_id}/events", timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("event: "):
                out.append({"type": line[7:]})
            elif line.startswith("data: ") and out:
                out[-1]["data"] = json.loads(line[6:])["data"]
            if out and out[-1].get("type") == "PAUSE_OPENED" and "data" in out[-1]:
                break
    return out


ARGS = [
    "--node-timeout-s",
    "9",
    "--detector-delay-ms",
    "5000",
    "--heartbeat-s",
    "0.5",
    "--heartbeat-lapse-s",
    "3",
    "--inspector-period-s",
    "1",
    "--max-attempts",
    "4",
    "--segmenter-delay-ms",
    "3000",
]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory):
    require_binary("redis-server")
    tmp = tmp_path_factory.mktemp("replicas")
    hitl = HitlUp(tmp / "data", *ARGS, log_path=tmp / "hitl-up.log").start(timeout=300)
    yield hitl
    hitl.stop()


def test_sigkill_of_a_model_replica_mid_node_costs_one_visible_attempt(up: HitlUp):
    with httpx.Client(base_url=up.api_url, headers={"Authorization": f"Bearer {up.token}"}, timeout=30) as c:
        job = submit(c, seed=11)
        first = wait_running(c, job)["current_node"]
        time.sleep(0.5)  # inside the model call
        replicas = detector_replicas(up)
        assert replicas, "no Detector replica process found"
        for p in replicas:
            os.kill(p.pid, signal.SIGKILL)
        t0 = time.monotonic()
        snap = wait_status(c, job, "WAITING_USER_SELECTION", timeout=120)
        print(f"\n[faults] replica SIGKILLed mid-node: review open {time.monotonic() - t0:.1f}s later")
        node = snap["current_node"]
        assert node["node_instance_id"] != first["node_instance_id"] and node["attempt"] >= 2
        evs = events(c, job)
        types = [e["type"] for e in evs]
        assert types.count("NODE_COMPLETED") == 1 and types.count("PAUSE_OPENED") == 1
        assert types.count("NODE_FAILED") >= 1 and types.count("NODE_RETRY_SCHEDULED") >= 1
        assert types.count("NODE_STARTED") == node["attempt"]


def events_until(
    c: httpx.Client, job_id: str, wanted: set[str], timeout: float = 60, patience_s: float = 60
) -> list[dict]:
    """The job's events, history then live, until every type in ``wanted`` has been seen, or what
    came within ``patience_s`` (the stream's 15 s keep-alive comments would keep a read going for ever)."""
    out: list[dict] = []
    seen: set[str] = set()
    give_up = time.monotonic() + patience_s
    with c.stream("GET", f"/api/v1/jobs/{job_id}/events", timeout=timeout) as r:
        for line in r.iter_lines():
            if line.startswith("event: "):
                out.append({"type": line[7:]})
            elif line.startswith("data: ") and out:
                out[-1]["data"] = json.loads(line[6:])["data"]
                seen.add(out[-1]["type"])
                if wanted <= seen:
                    return out
            if time.monotonic() > give_up:
                return out
    raise AssertionError(f"stream ended without {wanted - seen}: {[e['type'] for e in out]}")


def test_sigstop_of_a_model_replica_mid_node_is_redispatched_when_its_heartbeat_lapses(up: HitlUp):
    with httpx.Client(base_url=up.api_url, headers={"Authorization": f"Bearer {up.token}"}, timeout=30) as c:
        job = submit(c, seed=12)
        first = wait_running(c, job)["current_node"]
        time.sleep(0.5)
        # The replica running the node recorded itself: the inspector asks it before a re-dispatch.
        assert up.redis_url
        executor_key = keys.job(job).executor_of(first["node_instance_id"])
        executor = redis.Redis.from_url(up.redis_url, decode_responses=True).get(executor_key)
        assert executor and executor.startswith("SERVE_REPLICA::") and "Detector" in executor, executor
        replicas = detector_replicas(up)
        assert replicas, "no Detector replica process found"
        for p in replicas:
            os.kill(p.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            # Heartbeat lapse (3 s) + the unanswered confirmation (3 s) + an inspector period: a new
            # node instance well before Serve's own health checks (3 misses x 5 s) give up on the replica.
            while True:
                node = c.get(f"/api/v1/jobs/{job}").json()["current_node"]
                if node["node_instance_id"] != first["node_instance_id"]:
                    break
                assert time.monotonic() - t0 < 60, f"never re-dispatched: {node}"
                time.sleep(0.1)
            redispatched = time.monotonic() - t0
        finally:
            for p in replicas:  # the hang ends: the replica finishes the old call and answers late
                try:
                    os.kill(p.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass  # Serve replaced (killed) it
        snap = wait_status(c, job, "WAITING_USER_SELECTION", timeout=150)
        settled = time.monotonic() - t0
        print(
            f"\n[faults] replica SIGSTOPped mid-node: re-dispatched {redispatched:.1f}s, "
            f"review open {settled:.1f}s later"
        )
        node = snap["current_node"]
        assert node["node_instance_id"] != first["node_instance_id"] and node["attempt"] >= 1
        evs = events_until(c, job, {"PAUSE_OPENED", "REPORT_IGNORED"}, patience_s=30)
        types = [e["type"] for e in evs]
        lost = [e["data"] for e in evs if e["type"] == "NODE_FAILED"]
        assert lost and lost[0]["node_instance_id"] == first["node_instance_id"]
        assert lost[0]["reason"] == "EXECUTOR_LOST", lost
        # The continued replica's answer for the old instance, when it comes, is recorded, never applied.
        # It may not come: the old call's 9 s deadline can pass before the continued replica finishes
        # (then its work is stopped and dropped), or Serve may have replaced the stopped replica.
        ignored = [
            (i["node_instance_id"], i["reason"]) for i in (e["data"] for e in evs if e["type"] == "REPORT_IGNORED")
        ]
        assert ignored in ([], [(first["node_instance_id"], "NODE_SUPERSEDED")]), ignored
        print(f"[faults] the continued replica's late answer: {'recorded as ignored' if ignored else 'never came'}")
        assert types.count("NODE_COMPLETED") == 1 and types.count("PAUSE_OPENED") == 1
        after = c.get(f"/api/v1/jobs/{job}").json()
        assert after["status"] == "WAITING_USER_SELECTION" and after["version"] == snap["version"]


def test_sigkill_of_the_segmenter_mid_cut_retries_each_subject_alone(up: HitlUp):
    """A job's two subjects are cut side by side (one SEGMENT_SUBJECT node each) when the Segmenter
    replica running both is killed: each subject's attempt fails on its own (NODE_FAILED and
    NODE_RETRY_SCHEDULED naming its box), each is cut by a new instance on the replica Serve starts in
    its place, once, and the job goes on past the cut."""
    with httpx.Client(base_url=up.api_url, headers={"Authorization": f"Bearer {up.token}"}, timeout=30) as c:
        data, _ = product_composite(seed=19, n=2)
        r = c.post("/api/v1/jobs", files={"image": ("19.png", data, "image/png")})
        assert r.status_code == 202, r.text
        job = r.json()["job_id"]
        snap = wait_status(c, job, "WAITING_USER_SELECTION", timeout=60)
        assert len(snap["box_list"]) == 2, snap["box_list"]
        body = {
            "intervention_id": f"iv_fault_{job}",
            "pause_token": snap["active_pause"]["pause_token"],
            "base_version": snap["version"],
            "subjects": [{"box_id": b["box_id"], "bbox": b["bbox"]} for b in snap["box_list"]],
        }
        assert c.post(f"/api/v1/jobs/{job}/interventions", json=body).status_code == 200
        deadline = time.monotonic() + 60
        while True:  # both subjects' nodes running at once (each takes 3 s: --segmenter-delay-ms)
            cutting = c.get(f"/api/v1/jobs/{job}").json()
            nodes = cutting["subject_nodes"]
            if len(nodes) == 2 and all(n["status"] == "RUNNING" for n in nodes):
                break
            assert time.monotonic() < deadline, f"the subjects' nodes never ran together: {nodes}"
            time.sleep(0.1)
        first = {n["box_id"]: n["node_instance_id"] for n in nodes}
        time.sleep(0.5)  # inside the model calls
        replicas = detector_replicas(up, "Segmenter")
        assert replicas, "no Segmenter replica process found"
        for p in replicas:
            os.kill(p.pid, signal.SIGKILL)
        t0 = time.monotonic()
        deadline = t0 + 120
        settled = {"SUCCEEDED", "PARTIAL_SUCCEEDED", "FAILED", "WAITING_MASK_REVIEW"}
        while True:
            done = c.get(f"/api/v1/jobs/{job}").json()
            if done["status"] in settled:
                break
            assert time.monotonic() < deadline, f"{done['status']} after the kill: {done['subject_nodes']}"
            time.sleep(0.2)
        print(f"\n[faults] Segmenter SIGKILLed mid-cut: both subjects cut {time.monotonic() - t0:.1f}s later")
        assert done["status"] in ("SUCCEEDED", "WAITING_MASK_REVIEW"), done  # the gate may ask a person
        by_box = {s["box_id"]: s for s in done["subjects"]}
        assert set(by_box) == set(first)
        for s in by_box.values():  # cut, by a second attempt of its own
            assert s["status"] in ("SUCCEEDED", "WAITING_REVIEW") and s["attempts"] >= 2, s
        if done["status"] == "WAITING_MASK_REVIEW":  # its events end with the job
            assert c.post(f"/api/v1/jobs/{job}/cancel").json()["status"] == "CANCELLED"
        evs = events_until(c, job, {"JOB_FINISHED"})
        failed = [e["data"] for e in evs if e["type"] == "NODE_FAILED"]
        assert {(f["box_id"], f["node_instance_id"]) for f in failed} >= set(first.items()), failed
        retried = [e["data"] for e in evs if e["type"] == "NODE_RETRY_SCHEDULED"]
        assert {r["box_id"] for r in retried} == set(first), retried
        completed = [
            e["data"] for e in evs if e["type"] == "NODE_COMPLETED" and e["data"]["node_type"] == "SEGMENT_SUBJECT"
        ]
        assert sorted(d["box_id"] for d in completed) == sorted(first)  # each subject's cut applied once
        assert not {d["node_instance_id"] for d in completed} & set(first.values())  # never the killed ones'


def test_whole_tree_killed_mid_node_and_down_past_the_deadline_resumes_the_node(up: HitlUp, tmp_path: Path):
    """Last in this module: it kills the shared ``hitl up`` and starts another on its data directory."""
    headers = {"Authorization": f"Bearer {up.token}"}
    with httpx.Client(base_url=up.api_url, headers=headers, timeout=30) as c:
        job = submit(c, seed=13)
        first = wait_running(c, job)["current_node"]
    up.kill()  # SIGKILL of every process of the tree, Redis and Ray included, mid-node
    time.sleep(10)  # down longer than the node's 9 s deadline
    again = HitlUp(up.data_dir, *ARGS, api_port=up.api_port, log_path=tmp_path / "hitl-up-again.log").start(timeout=300)
    try:
        with httpx.Client(base_url=again.api_url, headers=headers, timeout=30) as c:
            t0 = time.monotonic()
            snap = wait_status(c, job, "WAITING_USER_SELECTION", timeout=120)
            took = time.monotonic() - t0
            print(f"\n[faults] whole tree SIGKILLed mid-node, 10 s down: review open {took:.1f}s after READY")
            node = snap["current_node"]
            assert node["node_instance_id"] != first["node_instance_id"] and node["attempt"] >= 2
            evs = events(c, job)
            types = [e["type"] for e in evs]
            assert "NODE_TIMED_OUT" not in types and types.count("NODE_COMPLETED") == 1
            lost = [e["data"] for e in evs if e["type"] == "NODE_FAILED"]
            assert lost and lost[0]["node_instance_id"] == first["node_instance_id"]
            assert lost[0]["reason"] == "EXECUTOR_LOST"
    finally:
        again.stop()
