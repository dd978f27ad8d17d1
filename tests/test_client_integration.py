"""The Python client and the ``hitl`` client commands against a real control plane.

Everything here runs on the ``api_server`` fixture (the FastAPI control plane under
uvicorn, a real redis-server, the classical OpenCV models in threads). Nothing is
mocked: where a test needs the network to misbehave (a connection cut mid-stream, a
503 from a gateway) a small TCP proxy on loopback (``LoopbackProxy``) sits between
the client and the server and does it to real bytes.

* ``hitl submit DIR --wait --out OUT`` on 50 product images plus three broken files,
  with an automatic reviewer approving every pause: cut-outs on disk, the broken
  files named, exit status 1 because of them; a rerun creates nothing.
* ``hitl submit`` SIGKILLed half-way, then run again: exactly one job per file on
  the server, the rerun finishes the rest and exits 0.
* ``events()`` through a proxy that keeps cutting the stream: ids 1..n exactly once,
  ending at JOB_FINISHED.
* A 503 (with Retry-After: 0) is retried, a 409 is not and carries GET's snapshot.
* ``hitl status / jobs / results / watch`` print what the API says.

The proxy, the automatic reviewer and the other helpers are in ``tests/client_integration_util.py``.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from harness.tokens import TOKENS
from hitl_review.client import (
    AsyncHitlClient,
    ConflictError,
    HitlClient,
    ServerError,
    new_intervention_id,
)
from hitl_review.serve_app.ops.samples import product_composite
from hitl_review.statecore.models import JobSnapshot
from tests.client_integration_util import (
    HEIGHT,
    HITL,
    WIDTH,
    AutoReviewer,
    LoopbackProxy,
    collect,
    job_ids_of,
    raw_get,
    run_cli,
    wait_until,
    write_images,
)


@pytest.fixture
def cli_env(api_server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[str], None]:
    """Point the in-process CLI at the api_server through HITL_API_URL / HITL_TOKEN (as a user would)."""
    monkeypatch.setenv("HITL_API_URL", api_server.url)
    monkeypatch.setenv("HITL_DATA_DIR", str(tmp_path / "hitl-data"))
    monkeypatch.setenv("COLUMNS", "400")  # rich tables: one row per line, nothing folded

    def use(who: str) -> None:
        monkeypatch.setenv("HITL_TOKEN", TOKENS[who])

    use("admin")
    return use


@pytest.fixture(scope="module")
def finished_job(api_server) -> dict[str, Any]:
    """A job of submitter sub1, approved by an admin and SUCCEEDED; with the pause it was approved from."""
    data, _ = product_composite(seed=4000, width=WIDTH, height=HEIGHT, n=2)
    with HitlClient(api_server.url, TOKENS["sub1"]) as sub, HitlClient(api_server.url, TOKENS["admin"]) as adm:
        job_id = sub.submit(data, idempotency_key="it-finished:4000", filename="finished.png").job_id
        waiting = adm.wait_for(job_id, ["WAITING_USER_SELECTION"], timeout=30)
        assert waiting.active_pause is not None and waiting.box_list
        adm.intervene(
            job_id,
            intervention_id=new_intervention_id(),
            pause_token=waiting.active_pause.pause_token,
            base_version=waiting.version,
            subjects=waiting.box_list,
        )
        final = adm.wait_for(job_id, timeout=60)
    assert final.status == "SUCCEEDED", final
    return {"job_id": job_id, "waiting": waiting, "final": final}


# ---------------------------------------------------------------------------- batch submit


@pytest.mark.timeout(150)
def test_submit_dir_wait_out_with_reviewer_and_broken_files(api_server, cli_env, capsys, tmp_path: Path):
    inbox, out = tmp_path / "in", tmp_path / "out"
    good = write_images(inbox, range(1000, 1050))
    (inbox / "empty.png").write_bytes(b"")
    truncated_src, _ = product_composite(seed=1999, width=WIDTH, height=HEIGHT)
    (inbox / "truncated.png").write_bytes(truncated_src[: len(truncated_src) // 2])
    (inbox / "notes.jpg").write_text("this is not a JPEG\n")
    shas = set(good.values())

    argv = ["submit", str(inbox), "--wait", "--out", str(out), "--batch", "it-b1", "--concurrency", "8"]
    with AutoReviewer(api_server.url, lambda s: s.image.sha256 in shas) as reviewer:
        code, stdout, stderr = run_cli(argv, capsys)
    assert not reviewer.errors, reviewer.errors
    assert code == 1, (stdout, stderr)  # every good file ended well; the broken ones make it non-zero

    # The broken files are named: two skipped before any upload, the truncated one refused by the server.
    skipped = {line.split()[1] for line in stderr.splitlines() if line.startswith("skipped ")}
    assert {Path(p.rstrip(":")).name for p in skipped} == {"empty.png", "notes.jpg"}, stderr
    row = next(line for line in stdout.splitlines() if "truncated.png" in line)
    assert "INVALID_REQUEST" in row, stdout
    assert "50 done" in stdout and "1 failed" in stdout and "2 skipped" in stdout, stdout

    # One job per good file, each answered once by the reviewer, each SUCCEEDED with its cut-outs on disk.
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    final = {Path(r["path"]).name: r for r in manifest if r.get("final_status")}
    assert set(final) == {p.name for p in good}
    assert len({r["job_id"] for r in final.values()}) == 50
    assert sorted(reviewer.approved) == sorted(r["job_id"] for r in final.values())
    assert all(len(tokens) == 1 for tokens in reviewer.approved.values())
    for path, sha in good.items():
        rec = final[path.name]
        assert rec["final_status"] == "SUCCEEDED" and rec["sha256"] == sha
        results = json.loads((out / path.stem / "results.json").read_text())
        assert results["job_id"] == rec["job_id"] and results["status"] == "SUCCEEDED"
        assert results["subjects"] and all(s["status"] == "SUCCEEDED" for s in results["subjects"])
        files = {f.name for f in (out / path.stem).iterdir()}
        assert files == {"results.json"} | {
            f"{kind}_{s['box_id']}.png" for s in results["subjects"] for kind in ("mask", "cutout")
        }, files
        subject = results["subjects"][0]
        with Image.open(out / path.stem / f"mask_{subject['box_id']}.png") as mask:
            assert mask.format == "PNG" and mask.size == (WIDTH, HEIGHT)
        with Image.open(out / path.stem / f"cutout_{subject['box_id']}.png") as cut:
            assert cut.format == "PNG" and cut.mode == "RGBA"
    for name in ("empty", "truncated", "notes"):
        assert not (out / name).exists()
    # The server agrees: each job holds exactly that file's image.
    snap = raw_get(api_server.url, f"/api/v1/jobs/{final[next(iter(good)).name]['job_id']}").json()
    assert snap["image"]["sha256"] == good[next(iter(good))] and snap["status"] == "SUCCEEDED"

    # The same command again: nothing new on the server, nothing to wait for, same verdict.
    before = job_ids_of(api_server.url, "admin")
    code2, stdout2, _ = run_cli(argv + ["--json"], capsys)
    summary = json.loads(stdout2)
    assert code2 == 1 and summary["exit_code"] == 1
    assert sorted(Path(s["path"]).name for s in summary["skipped"]) == ["empty.png", "notes.jpg"]
    by_name = {Path(f["path"]).name: f for f in summary["files"]}
    assert by_name["truncated.png"]["error"].startswith("INVALID_REQUEST") and not by_name["truncated.png"]["job_id"]
    assert all(by_name[p.name]["resumed"] and by_name[p.name]["final_status"] == "SUCCEEDED" for p in good)
    assert job_ids_of(api_server.url, "admin") == before


# ---------------------------------------------------------------------------- SIGKILL and rerun


@pytest.mark.timeout(120)
def test_submit_killed_half_way_then_rerun_makes_one_job_per_file(api_server, tmp_path: Path):
    inbox, data_dir = tmp_path / "in", tmp_path / "hitl-data"
    files = write_images(inbox, range(2000, 2030))
    manifest_path = data_dir / "batches" / "it-b2.jsonl"  # the default manifest of --batch it-b2
    before = job_ids_of(api_server.url, "sub2")
    argv = [str(HITL), "submit", str(inbox), "--batch", "it-b2", "--concurrency", "2"]

    def env(url: str) -> dict[str, str]:
        return {**os.environ, "HITL_API_URL": url, "HITL_TOKEN": TOKENS["sub2"], "HITL_DATA_DIR": str(data_dir)}

    def manifest_jobs() -> dict[str, str]:
        """path -> job_id of every complete manifest line that has one (what a rerun will load)."""
        jobs: dict[str, str] = {}
        if manifest_path.exists():
            for line in manifest_path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("job_id"):
                    jobs[rec["path"]] = rec["job_id"]
        return jobs

    # A slow link (each response held 0.15 s), so the run is still going when it is killed.
    with LoopbackProxy(api_server.url, response_delay_s=0.15) as proxy:
        with open(tmp_path / "run1.log", "wb") as log:
            proc = subprocess.Popen(argv, env=env(proxy.url), stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: len(manifest_jobs()) >= 4 or proc.poll() is not None, 30, "4 jobs in the manifest")
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=10) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
        # Requests already on the wire still reach the server; let them land before counting.
        wait_until(lambda: proxy.active == 0, 10, "the proxy's connections to close")
    time.sleep(0.3)
    recorded = manifest_jobs()
    at_kill = job_ids_of(api_server.url, "sub2") - before
    assert 4 <= len(recorded) < len(files), "the kill did not land half-way"
    assert set(recorded.values()) <= at_kill and len(at_kill) < len(files)

    # The same command again (straight to the server): it finishes the rest and exits 0.
    done = subprocess.run(argv + ["--json"], env=env(api_server.url), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    summary = json.loads(done.stdout)
    assert summary["ok"] and len(summary["files"]) == len(files) and not summary["skipped"]
    outcome = {f["path"]: f for f in summary["files"]}
    # Files in the manifest are not sent again; files whose job was created but not yet recorded
    # when the CLI died come back as idempotent replays; the rest are new.
    assert sum(f["resumed"] for f in outcome.values()) == len(recorded)
    assert sum(f["replayed"] for f in outcome.values()) == len(at_kill) - len(recorded)
    assert all(outcome[p]["job_id"] == j for p, j in recorded.items())

    # The server holds exactly one job per file.
    created = job_ids_of(api_server.url, "sub2") - before
    assert len(created) == len(files)
    sha_of_job = {j: raw_get(api_server.url, f"/api/v1/jobs/{j}", "sub2").json()["image"]["sha256"] for j in created}
    assert sorted(sha_of_job.values()) == sorted(files.values())
    assert {outcome[str(p.resolve())]["job_id"]: sha for p, sha in files.items()} == sha_of_job

    # And a third run changes nothing.
    again = subprocess.run(argv + ["--json"], env=env(api_server.url), capture_output=True, timeout=60)
    assert again.returncode == 0 and all(f["resumed"] for f in json.loads(again.stdout)["files"])
    assert job_ids_of(api_server.url, "sub2") - before == created


# ---------------------------------------------------------------------------- SSE through a cutting proxy


def _cut_after(n: int) -> int:
    """Connection n is cut after 900..3400 response bytes: through headers, mid-frame, between frames."""
    return 900 + (n * 617) % 2500


@pytest.mark.timeout(60)
def test_events_resume_after_dropped_connections_without_gap_or_duplicate(api_server):
    data, _ = product_composite(seed=3000, width=WIDTH, height=HEIGHT, n=2)
    sha = hashlib.sha256(data).hexdigest()
    with HitlClient(api_server.url, TOKENS["sub1"]) as sub:
        job_id = sub.submit(data, idempotency_key="it-sse:3000").job_id

    with (
        LoopbackProxy(api_server.url, cut_bytes=_cut_after, cut_after_s=0.5) as proxy,
        HitlClient(proxy.url, TOKENS["rev1"], backoff=0.05) as through_proxy,
        AutoReviewer(api_server.url, lambda s: s.image.sha256 == sha, delay_s=1.2) as reviewer,
    ):
        events = collect(through_proxy.events(job_id), timeout=30)
        event_requests = [r for r in proxy.requests if r["path"].endswith("/events")]
    assert not reviewer.errors and job_id in reviewer.approved

    ids = [e.id for e in events]
    assert ids == list(range(1, len(ids) + 1)), ids
    assert events[-1].type == "JOB_FINISHED" and events[-1].data["status"] == "SUCCEEDED"
    assert {"PAUSE_OPENED", "INTERVENTION_ACCEPTED", "SUBJECT_SEGMENTED"} <= {e.type for e in events}
    # The stream really was cut, repeatedly, and each reconnect asked for what came after the last event.
    assert proxy.cuts >= 3 and len(event_requests) >= 3, (proxy.cuts, len(event_requests))
    resumed = [int(r["headers"]["last-event-id"]) for r in event_requests if "last-event-id" in r["headers"]]
    assert resumed and all(0 < i < ids[-1] for i in resumed) and resumed == sorted(resumed)

    # Identical to one uninterrupted read of the history.
    with HitlClient(api_server.url, TOKENS["rev1"]) as direct:
        history = list(direct.events(job_id))
    assert [(e.id, e.type, e.data) for e in history] == [(e.id, e.type, e.data) for e in events]

    # The async client, resuming from id 2, through a proxy that cuts every connection after a few frames.
    async def read_async() -> list[int]:
        async with AsyncHitlClient(proxy2.url, TOKENS["rev1"], backoff=0.05) as aclient:
            return [e.id async for e in aclient.events(job_id, last_event_id=2)]

    with LoopbackProxy(api_server.url, cut_bytes=_cut_after) as proxy2:
        assert asyncio.run(read_async()) == ids[2:]
        assert proxy2.cuts >= 2


# ---------------------------------------------------------------------------- retries


@pytest.mark.timeout(60)
def test_503_is_retried_409_is_not(api_server, finished_job):
    job_id = finished_job["job_id"]
    direct = raw_get(api_server.url, f"/api/v1/jobs/{job_id}").json()

    # GET: the gateway's 503 (Retry-After: 0) is retried at once, under the same X-Request-ID.
    with (
        LoopbackProxy(api_server.url, reject_first=1) as proxy,
        HitlClient(proxy.url, TOKENS["admin"], backoff=0.01) as client,
    ):
        snap = client.get_job(job_id)
        assert snap.model_dump(mode="json") == JobSnapshot.model_validate(direct).model_dump(mode="json")
    assert [r["path"] for r in proxy.requests] == [f"/api/v1/jobs/{job_id}"] * 2
    assert len({r["headers"]["x-request-id"] for r in proxy.requests}) == 1

    # POST /jobs with an Idempotency-Key: retried, one job.
    data, _ = product_composite(seed=4001, width=WIDTH, height=HEIGHT, n=1)
    with (
        LoopbackProxy(api_server.url, reject_first=1) as proxy,
        HitlClient(proxy.url, TOKENS["sub1"], backoff=0.01) as client,
    ):
        res = client.submit(data, idempotency_key="it-503:4001")
        assert res.status_code == 202 and not res.replayed
        assert client.submit(data, idempotency_key="it-503:4001").job_id == res.job_id
    assert [r["method"] for r in proxy.requests] == ["POST"] * 3

    # POST /jobs without a key: a 503 might have come after the job was made, so it is not sent twice.
    with (
        LoopbackProxy(api_server.url, reject_first=1) as proxy,
        HitlClient(proxy.url, TOKENS["sub1"], backoff=0.01) as client,
    ):
        with pytest.raises(ServerError) as err:
            client.submit(data)
    assert err.value.status_code == 503 and len(proxy.requests) == 1

    # A stale intervention: 409 VERSION_CONFLICT, sent exactly once, carrying the snapshot GET returns.
    waiting = finished_job["waiting"]
    with LoopbackProxy(api_server.url) as proxy, HitlClient(proxy.url, TOKENS["rev2"], backoff=0.01) as client:
        with pytest.raises(ConflictError) as conflict:
            client.intervene(
                job_id,
                intervention_id=new_intervention_id(),
                pause_token=waiting.active_pause.pause_token,
                base_version=waiting.version,
                subjects=waiting.box_list,
            )
    assert [r["path"] for r in proxy.requests] == [f"/api/v1/jobs/{job_id}/interventions"]
    assert conflict.value.code == "VERSION_CONFLICT" and conflict.value.status_code == 409
    assert conflict.value.snapshot == raw_get(api_server.url, f"/api/v1/jobs/{job_id}").json() == direct


# ---------------------------------------------------------------------------- status / jobs / results / watch


@pytest.mark.timeout(60)
def test_read_commands_against_the_server(api_server, finished_job, cli_env, capsys, tmp_path: Path):
    job_id = finished_job["job_id"]
    cli_env("sub1")
    data, _ = product_composite(seed=4002, width=WIDTH, height=HEIGHT, n=1)
    with HitlClient(api_server.url, TOKENS["sub1"]) as sub:  # a second job of sub1's, left in review
        pending = sub.submit(data, idempotency_key="it-pending:4002").job_id
        sub.wait_for(pending, ["WAITING_USER_SELECTION"], timeout=30)

    code, out, _ = run_cli(["status", job_id, "--json"], capsys)
    assert code == 0 and json.loads(out) == raw_get(api_server.url, f"/api/v1/jobs/{job_id}", "sub1").json()
    code, out, _ = run_cli(["status", job_id], capsys)
    assert code == 0 and job_id in out and "SUCCEEDED" in out

    code, out, _ = run_cli(["jobs", "--json", "--limit", "500"], capsys)
    listed = json.loads(out)
    raw = httpx.get(
        f"{api_server.url}/api/v1/jobs", params={"limit": 500}, headers={"Authorization": "Bearer " + TOKENS["sub1"]}
    ).json()
    assert code == 0
    assert [j["job_id"] for j in listed["jobs"]] == [j["job_id"] for j in raw["jobs"]]
    assert {j["submitter"] for j in listed["jobs"]} == {"sub1"}  # a submitter lists only its own jobs
    assert next(j for j in listed["jobs"] if j["job_id"] == pending)["status"] == "WAITING_USER_SELECTION"
    mine = next(j for j in listed["jobs"] if j["job_id"] == job_id)
    assert mine["status"] == "SUCCEEDED" and mine["version"] == finished_job["final"].version
    assert mine["submitter"] == "sub1"
    # Paging through the CLI: --limit 1, then --cursor.
    code, out, _ = run_cli(["jobs", "--json", "--limit", "1"], capsys)
    page1 = json.loads(out)
    assert code == 0 and len(page1["jobs"]) == 1 and page1["next_cursor"]
    code, out, _ = run_cli(["jobs", "--json", "--limit", "1", "--cursor", page1["next_cursor"]], capsys)
    page2 = json.loads(out)
    assert code == 0 and len(page2["jobs"]) == 1 and page2["jobs"][0]["job_id"] != page1["jobs"][0]["job_id"]

    dest = tmp_path / "results"
    code, out, _ = run_cli(["results", job_id, "--out", str(dest)], capsys)
    assert code == 0 and job_id in out
    results = raw_get(api_server.url, f"/api/v1/jobs/{job_id}/results", "sub1").json()
    assert json.loads((dest / "results.json").read_text()) == results
    for s in results["subjects"]:
        mask = raw_get(api_server.url, s["mask_url"], "sub1").content
        assert (dest / f"mask_{s['box_id']}.png").read_bytes() == mask
        with Image.open(io.BytesIO((dest / f"cutout_{s['box_id']}.png").read_bytes())) as cut:
            assert cut.mode == "RGBA" and cut.size == (WIDTH, HEIGHT)
    code, out, _ = run_cli(["results", job_id, "--json"], capsys)
    assert code == 0 and {k: v for k, v in json.loads(out).items() if k != "files"} == results

    code, out, _ = run_cli(["watch", job_id, "--json"], capsys)
    watched = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [e["id"] for e in watched] == list(range(1, len(watched) + 1))
    assert watched[-1]["type"] == "JOB_FINISHED"

    # A job that does not exist: non-zero, and the message says what happened.
    code, out, err = run_cli(["status", "job_missing"], capsys)
    assert code == 1 and out == ""
    assert "404" in err and "JOB_NOT_FOUND" in err and "job_missing" in err, err
    code, out, _ = run_cli(["status", "job_missing", "--json"], capsys)
    assert code == 1 and json.loads(out)["error"]["code"] == "JOB_NOT_FOUND"
    # Results of a job still in review: non-zero, with the job's state.
    code, _, err = run_cli(["results", pending], capsys)
    assert code == 1 and "WAITING_USER_SELECTION" in err
    # Another submitter's job is as invisible as a missing one.
    cli_env("sub2")
    code, _, err = run_cli(["status", job_id], capsys)
    assert code == 1 and "JOB_NOT_FOUND" in err
    with HitlClient(api_server.url, TOKENS["admin"]) as adm:
        adm.cancel(pending)
