"""End to end through a real `hitl up`: embedded redis-server, local Ray, Ray Serve, classical models.

What needs the whole stack: durability across a SIGKILL of the whole process tree
(docs/protocol.md § Pause), cancel racing a (slow) detection, SSE through the Events
deployment (docs/protocol.md § Events), the two-round naming flow to cut-outs
(docs/protocol.md § Second round), a clean SIGTERM. The first `hitl up` runs with the default
HTTP path (direct ingress: the Api replica holds the API port), the second with `--ingress proxy`
(Serve's ProxyActor holds it), so the flow crosses both.
The HTTP contract in detail is in test_api_protocol.py (same app, under uvicorn).
"""

from __future__ import annotations

import contextlib
import io
import time
import uuid

import httpx
import psutil
import pytest
from PIL import Image

from harness.hitl_up import HitlUp
from harness.sse import read_events
from hitl_review.serve_app.ops.samples import product_composite

pytestmark = [pytest.mark.ray, pytest.mark.slow]


class Api:
    def __init__(self, up: HitlUp) -> None:
        self.c = httpx.Client(base_url=up.api_url, timeout=60, headers={"Authorization": f"Bearer {up.token}"})

    def submit(self, data: bytes) -> str:
        r = self.c.post("/api/v1/jobs", files={"image": ("x.png", data, "image/png")})
        assert r.status_code == 202, r.text
        return r.json()["job_id"]

    def get(self, job_id: str) -> dict:
        r = self.c.get(f"/api/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def wait(self, job_id: str, statuses: set[str], timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            snap = self.get(job_id)
            if snap["status"] in statuses:
                return snap
            assert time.monotonic() < deadline, f"{job_id} stuck in {snap['status']}"
            time.sleep(0.1)

    def intervene(self, snap: dict, subjects: list[dict], iid: str | None = None) -> httpx.Response:
        return self.c.post(
            f"/api/v1/jobs/{snap['job_id']}/interventions",
            json={
                "intervention_id": iid or f"iv_{uuid.uuid4().hex[:10]}",
                "pause_token": snap["active_pause"]["pause_token"] if snap["active_pause"] else "pause_x",
                "base_version": snap["version"],
                "subjects": subjects,
            },
        )

    def events(self, job_id: str, last_event_id: int | None = None, until: str = "JOB_FINISHED") -> list[dict]:
        return read_events(self.c, job_id, last_event_id=last_event_id, until=until)

    def close(self) -> None:
        self.c.close()


def port_holder(up: HitlUp) -> str:
    """The name of the process of ``up``'s tree listening on its API port (Ray sets the process
    title of an actor to ``ray::<class>``: ``ray::ServeReplica:hitl:Api``, ``ray::ProxyActor``)."""
    for p in up.child.tree():
        try:
            conns = p.net_connections(kind="inet")
            if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == up.api_port for c in conns):
                return p.name().split(".", 1)[0]  # busy with a call: "ray::ServeReplica:hitl:Api.handle_request…"
        except psutil.Error:
            continue
    raise AssertionError(f"no process of hitl up's tree listens on {up.api_port}")


def ingress_logged(up: HitlUp) -> str:
    return next(line for line in up.lines if "hitl.up: ingress: " in line)


def detections_counted(text: str) -> float:
    """DETECT_SUBJECTS calls that ended ``ok``, summed over the Detector replicas' series."""
    return sum(
        float(ln.rsplit(" ", 1)[1])
        for ln in text.splitlines()
        if ln.startswith("ray_hitl_model_node_seconds_count{")
        and "DETECT_SUBJECTS" in ln
        and 'deployment="Detector"' in ln
        and 'outcome="ok"' in ln
    )


def model_figures(up: HitlUp, detections: int, timeout: float = 60) -> str:
    """Ray's Prometheus endpoint of ``up``'s own cluster (named in its startup log), once the model
    replicas' node timings count ``detections`` finished detections. Ray's metrics reach the endpoint
    every few seconds, so the first scrape that has the series may not have the last call yet."""
    line = next(line for line in up.lines if "Ray's metrics for Prometheus" in line)
    url = line.rsplit(" ", 1)[1]
    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(url, timeout=10).text
        if detections_counted(text) >= detections:
            return text
        assert time.monotonic() < deadline, (
            f"{detections_counted(text):g} of {detections} detections in ray_hitl_model_* at {url}"
        )
        time.sleep(2)


def keep(snap: dict, n: int | None = None) -> list[dict]:
    return [{"box_id": b["box_id"], "bbox": b["bbox"]} for b in snap["box_list"][:n]]


def mask_review(api: Api) -> None:
    """A sample image whose first subject the classical gate fails after its refinements (seed 19:
    an outline where the colours barely change) reaches WAITING_MASK_REVIEW with that subject alone; the reviewer
    refines it with two clicks, and the job ends with the reviewer's mask next to the gate's."""
    job = api.submit(product_composite(seed=19, n=2)[0])
    snap = api.wait(job, {"WAITING_USER_SELECTION"})
    assert api.intervene(snap, keep(snap)).status_code == 200
    review = api.wait(job, {"WAITING_MASK_REVIEW", "SUCCEEDED", "PARTIAL_SUCCEEDED", "FAILED"})
    assert review["status"] == "WAITING_MASK_REVIEW", review["status"]
    # One SEGMENT_SUBJECT node per subject, side by side (SPEC §13): with each segmentation slowed down
    # (--segmenter-delay-ms), both subjects' nodes started before either answered.
    box_pause = api.events(job, until="PAUSE_OPENED")[-1]["id"]
    cut = [
        (e["type"], e["data"].get("box_id"))
        for e in api.events(job, last_event_id=box_pause, until="PAUSE_OPENED")  # up to the mask review's
        if e["data"].get("node_type") == "SEGMENT_SUBJECT" and e["type"] in ("NODE_STARTED", "NODE_COMPLETED")
    ]
    assert [t for t, _ in cut] == ["NODE_STARTED"] * 2 + ["NODE_COMPLETED"] * 2, cut
    assert len({b for _, b in cut}) == 2, cut
    pause = review["active_pause"]
    assert pause["stage"] == "WAITING_MASK_REVIEW" and review["pending_actions"] == ["DECIDE_SUBJECT_MASKS"]
    [subject] = pause["subjects_to_review"]
    assert subject["quality"]["verdict"] == "FAIL" and subject["quality"]["reasons"], subject
    assert api.c.get(subject["mask_url"]).status_code == 200
    x1, y1, x2, y2 = subject["bbox"]
    # The subject's middle is in, the box's corner (background beside the silhouette) out.
    clicks = [{"x": (x1 + x2) / 2, "y": (y1 + y2) / 2, "positive": True}, {"x": x1 + 3, "y": y1 + 3, "positive": False}]
    r = api.c.post(f"/api/v1/jobs/{job}/subjects/{subject['box_id']}/preview", json={"points": clicks})
    assert r.status_code == 200 and r.json()["area"] > 0, r.text
    body = {
        "intervention_id": f"iv_{uuid.uuid4().hex[:10]}",
        "pause_token": pause["pause_token"],
        "base_version": review["version"],
        "snapshot_id": pause["snapshot_id"],
        "decisions": [{"box_id": subject["box_id"], "decision": "REFINE", "points": clicks}],
    }
    r = api.c.post(f"/api/v1/jobs/{job}/interventions", json=body)
    assert r.status_code == 200 and r.json()["next_node_type"] == "PROCESS_APPROVED_BOX_LIST", r.text
    assert api.wait(job, {"SUCCEEDED", "PARTIAL_SUCCEEDED", "FAILED"})["status"] == "SUCCEEDED"
    by_id = {s["box_id"]: s for s in api.c.get(f"/api/v1/jobs/{job}/results").json()["subjects"]}
    refined = by_id.pop(subject["box_id"])
    assert refined["decided_by"] not in (None, "gate") and refined["mask_url"] != subject["mask_url"]
    assert [s["decided_by"] for s in by_id.values()] == ["gate"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("hitl-e2e")


def test_whole_flow_through_ray_serve(data_dir):
    up = HitlUp(data_dir, "--detector-delay-ms", "1500", "--segmenter-delay-ms", "600").start()
    api = Api(up)
    try:
        ready = api.c.get("/readyz").json()
        assert ready["mode"] == "ray-serve" and ready["backends"]["segmenter"] == "classical"
        # The default on one machine: no proxy hop, the Api replica itself listens on --api-port.
        assert port_holder(up) == "ray::ServeReplica:hitl:Api"
        assert "ingress: direct" in ingress_logged(up)

        # create -> DETECTING at once (the detector is slowed to 1.5 s)
        img = product_composite(seed=7, n=2)[0]
        job = api.submit(img)
        assert api.get(job)["status"] == "DETECTING"

        # cancel during detection (once a Detector replica started it: a node still queued when its job
        # is cancelled is never started): stays CANCELLED when the detection report lands later
        doomed = api.submit(product_composite(seed=8, n=2)[0])
        deadline = time.monotonic() + 30
        while (api.get(doomed)["current_node"] or {}).get("status") != "RUNNING":
            assert time.monotonic() < deadline, f"the detection never started: {api.get(doomed)['current_node']}"
            time.sleep(0.05)
        assert api.c.post(f"/api/v1/jobs/{doomed}/cancel").json()["status"] == "CANCELLED"

        # SSE (through the Events deployment) delivers PAUSE_OPENED; resume from Last-Event-ID
        evs = api.events(job, until="PAUSE_OPENED")
        assert evs[-1]["type"] == "PAUSE_OPENED"
        resumed = api.events(job, last_event_id=evs[1]["id"], until="PAUSE_OPENED")
        assert [e["id"] for e in resumed] == [e["id"] for e in evs[2:]]
        waiting = api.get(job)
        assert waiting["status"] == "WAITING_USER_SELECTION"
        assert not {"timeout_at", "timeout_seconds", "auto_submit_on_timeout"} & set(waiting["active_pause"])
        # A preview through a Segmenter replica (docs/protocol.md § Cut-out quality): a mask and the
        # gate's verdict for a box and a click in it; the job does not move.
        b = waiting["box_list"][0]
        centre = {"x": (b["bbox"][0] + b["bbox"][2]) / 2, "y": (b["bbox"][1] + b["bbox"][3]) / 2, "positive": True}
        r = api.c.post(f"/api/v1/jobs/{job}/subjects/{b['box_id']}/preview", json={"points": [centre]})
        assert r.status_code == 200, r.text
        assert r.json()["area"] > 0 and r.json()["quality"]["policy"] == "gate-v1", r.json()
        off = {**centre, "x": 1e6}  # the replica's ValueError comes back as a 400 in its own words
        r = api.c.post(f"/api/v1/jobs/{job}/subjects/{b['box_id']}/preview", json={"points": [off]})
        assert (r.status_code, r.json()["code"]) == (400, "INVALID_REQUEST") and "outside" in r.json()["message"]
        assert "Traceback" not in r.json()["message"], r.json()
        assert api.get(job)["version"] == waiting["version"]

        deadline = time.monotonic() + 30
        while not any(e["type"] == "REPORT_IGNORED" for e in api.events(doomed, until="REPORT_IGNORED")):
            assert time.monotonic() < deadline, "the late detection report was never recorded as ignored"
            time.sleep(0.2)
        late = api.events(doomed, until="REPORT_IGNORED")
        assert late[-1]["data"]["node_type"] == "DETECT_SUBJECTS"
        assert [e["type"] for e in late].index("JOB_FINISHED") < len(late) - 1  # history after the end
        assert api.get(doomed)["status"] == "CANCELLED"

        # The model replicas' own figures (deployments.metrics) next to Serve's, on Ray's endpoint.
        # Both detections ran (the cancelled job's too); model_figures waits until both are counted.
        text = model_figures(up, detections=2)
        assert "ray_serve_" in text
        detect = [ln for ln in text.splitlines() if ln.startswith("ray_hitl_model_node_seconds_count{")]
        assert any('deployment="Detector"' in ln and "DETECT_SUBJECTS" in ln for ln in detect), detect
        assert "ray_hitl_model_ongoing_requests{" in text

        # hitl up's default sends a cut-out its gate fails to a person (--quality-gate review-failing).
        mask_review(api)
        kept = api.submit(product_composite(seed=19, n=2)[0])  # decided after the restart below
        kept_waiting = api.wait(kept, {"WAITING_USER_SELECTION"})
    except BaseException:
        up.stop()  # a failure above must not leave its Ray cluster running under the next tests
        raise
    finally:
        api.close()

    # SIGKILL the whole process tree mid-wait, start again on the same data dir.
    up.kill()
    up.wait_port_free()
    # Restarted with the mask review off (docs/protocol.md § Cut-out quality): a job keeps the mode it
    # was created under (``kept``: review-failing), a new one gets the new one.
    up2 = HitlUp(data_dir, "--ingress", "proxy", "--quality-gate", "off").start()
    api = Api(up2)
    try:
        assert port_holder(up2) == "ray::ProxyActor"
        assert "ingress: proxy" in ingress_logged(up2)
        again = api.get(job)
        assert again["active_pause"]["pause_token"] == waiting["active_pause"]["pause_token"]
        assert again["version"] == waiting["version"] and again["status"] == "WAITING_USER_SELECTION"

        # a second client with a stale view, then the first submits a subset with a manual box over blank
        w = waiting["image"]["width"]
        subjects = keep(waiting, 1) + [{"bbox": [w - 70, 4, w - 6, 60], "label": "ghost"}]
        r = api.intervene(waiting, subjects, iid="iv_round1")
        assert r.status_code == 200 and r.json()["next_node_type"] == "VALIDATE_MANUAL_BOX_LIST"
        replay = api.intervene(waiting, subjects, iid="iv_round1")
        assert replay.content == r.content and replay.headers["Idempotent-Replayed"] == "true"
        stale = api.intervene(waiting, keep(waiting))
        assert stale.status_code == 409 and stale.json()["code"] == "VERSION_CONFLICT"
        assert stale.json()["snapshot"]["version"] > waiting["version"]

        round2 = api.wait(job, {"WAITING_BOX_BATCH_REVISION"})
        bad = round2["active_pause"]["box_ids_to_revise"]
        assert bad == r.json()["diff"]["added"]
        ok = [{"box_id": b["box_id"], "bbox": b["bbox"]} for b in round2["box_list"] if b["box_id"] not in bad]
        assert api.intervene(round2, ok).status_code == 200
        done = api.wait(job, {"SUCCEEDED", "PARTIAL_SUCCEEDED", "FAILED"})
        assert done["status"] == "SUCCEEDED"
        res = api.c.get(f"/api/v1/jobs/{job}/results").json()
        assert len(res["subjects"]) == 1
        s = res["subjects"][0]
        mask = Image.open(io.BytesIO(api.c.get(s["mask_url"]).content))
        cut = Image.open(io.BytesIO(api.c.get(s["cutout_url"]).content))
        assert mask.size == cut.size == (done["image"]["width"], done["image"]["height"]) and cut.mode == "RGBA"

        # The job created before the restart still goes to a person; one created now records the
        # gate's FAIL and ends without one.
        assert api.intervene(kept_waiting, keep(kept_waiting)).status_code == 200
        assert api.wait(kept, {"WAITING_MASK_REVIEW", "SUCCEEDED", "FAILED"})["status"] == "WAITING_MASK_REVIEW"
        assert api.c.post(f"/api/v1/jobs/{kept}/cancel").json()["status"] == "CANCELLED"
        now = api.submit(product_composite(seed=19, n=2)[0])
        snap = api.wait(now, {"WAITING_USER_SELECTION"})
        assert api.intervene(snap, keep(snap)).status_code == 200
        assert api.wait(now, {"WAITING_MASK_REVIEW", "SUCCEEDED", "FAILED"})["status"] == "SUCCEEDED"
        verdicts = [s["quality"]["verdict"] for s in api.c.get(f"/api/v1/jobs/{now}/results").json()["subjects"]]
        assert "FAIL" in verdicts, verdicts

        # empty selection on a fresh job
        other = api.submit(product_composite(seed=9, n=2)[0])
        snap = api.wait(other, {"WAITING_USER_SELECTION"})
        assert api.intervene(snap, []).json()["status"] == "EMPTY_SELECTION"
        assert "hitl_interventions_total" in api.c.get("/metrics").text

        # Finished jobs are copied into the archive by the Archiver deployment, a replica of its own
        # (serve_app.work.archiver_deployment), not by the Api replica that answers reviewers.
        names = set()
        for proc in up2.child.tree():
            with contextlib.suppress(psutil.Error):  # a worker that exited meanwhile
                names.add(proc.name())
        # (a worker busy with a call is named after it: "ray::ServeReplica:hitl:Archiver.handle_request…")
        archiver = [n for n in names if n.split(".", 1)[0] == "ray::ServeReplica:hitl:Archiver"]
        assert archiver, sorted(n for n in names if n.startswith("ray::"))
        deadline = time.monotonic() + 30
        while (verified := api.c.get("/api/v1/admin/audit/verify", params={"job_id": job}).json())["copies"] < 2:
            assert time.monotonic() < deadline, f"{job} was never archived: {verified}"
            time.sleep(0.3)
        assert verified["broken"] == [], verified  # Redis's chain and the archive's copy agree
    finally:
        api.close()
        assert up2.stop() == 0  # SIGTERM: a clean exit
    assert any("stopped" in line for line in up2.lines)
