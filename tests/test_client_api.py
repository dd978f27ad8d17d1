"""Client unit tests that need no server: each call over a scripted network, its requests, answers and retries.

``httpx.MockTransport`` stands in for the network here and in the other client
unit tests (``test_client_streams.py``, ``test_client_units.py``), to script
transport-level behaviour (a 503, a dropped connection, a stream cut mid-way)
that a real server cannot be made to produce on cue. Every test that talks
through a client runs twice, on ``HitlClient`` and on ``AsyncHitlClient`` (driven
from the test through ``Blocking``), so the two cannot drift apart. The fakes are
in ``tests/client_fakes.py``; the real control plane is exercised in
``test_client_integration.py``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from hitl_review.client import (
    ApiError,
    AsyncHitlClient,
    AuthError,
    ConflictError,
    ConnectionFailed,
    InvalidRequestError,
    NotFoundError,
    RateLimitedError,
    ServerError,
    is_conflict,
)
from tests.client_fakes import (
    BASE,
    JOB,
    ClientFactory,
    Script,
    error_body,
    intervention_response,
    json_response,
    png_bytes,
    snapshot,
)

# ---------------------------------------------------------------------- retry policy over the wire


def test_503_then_200_is_retried_with_the_same_request_id(client_for: ClientFactory):
    script = Script(json_response(503, error_body("UNAVAILABLE")), json_response(200, snapshot()))
    c, sleeps = client_for(script)
    snap = c.get_job(JOB)
    assert snap.job_id == JOB and snap.active_pause is not None
    assert len(script.requests) == 2 and len(sleeps) == 1
    r1, r2 = script.requests
    assert r1.headers["Authorization"] == "Bearer tok-123"
    assert r1.headers["X-Request-ID"] and r1.headers["X-Request-ID"] == r2.headers["X-Request-ID"]
    assert r1.url.path == f"/api/v1/jobs/{JOB}"


def test_each_call_gets_its_own_request_id(client_for: ClientFactory):
    script = Script(json_response(200, snapshot()), json_response(200, snapshot()))
    c, _ = client_for(script)
    c.get_job(JOB)
    c.get_job(JOB)
    assert script.requests[0].headers["X-Request-ID"] != script.requests[1].headers["X-Request-ID"]


@pytest.mark.parametrize("status", [502, 504])
def test_gateway_errors_are_retried(status: int, client_for: ClientFactory):
    script = Script(httpx.Response(status, text="<html>bad gateway</html>"), json_response(200, snapshot()))
    c, sleeps = client_for(script)
    assert c.get_job(JOB).version == 3
    assert len(sleeps) == 1


def test_409_is_never_retried_and_carries_the_snapshot(client_for: ClientFactory):
    body = error_body("VERSION_CONFLICT", "base_version 2 is not the job's version 3", snapshot=snapshot())
    script = Script(json_response(409, body))
    c, sleeps = client_for(script)
    with pytest.raises(ConflictError) as info:
        c.intervene(
            JOB,
            intervention_id="iv_1",
            pause_token="pause_x",
            base_version=2,
            subjects=[{"box_id": "box_1", "bbox": [10, 10, 100, 120]}],
        )
    err = info.value
    assert len(script.requests) == 1 and sleeps == []
    assert err.status_code == 409 and err.code == "VERSION_CONFLICT"
    assert err.message.startswith("base_version 2")
    assert err.snapshot == snapshot() and err.body["snapshot"] == snapshot()
    assert err.job_snapshot is not None and err.job_snapshot.version == 3
    assert err.is_conflict and is_conflict(err) and is_conflict(err, "VERSION_CONFLICT")
    assert not is_conflict(err, "PAUSE_TOKEN_MISMATCH") and not is_conflict(ValueError())


@pytest.mark.parametrize(
    "status,cls",
    [
        (400, InvalidRequestError),
        (401, AuthError),
        (403, AuthError),
        (404, NotFoundError),
        (413, InvalidRequestError),
        (415, InvalidRequestError),
        (500, ServerError),
    ],
)
def test_other_errors_are_not_retried(status: int, cls: type[ApiError], client_for: ClientFactory):
    script = Script(json_response(status, error_body("SOME_CODE")))
    c, sleeps = client_for(script)
    with pytest.raises(cls) as info:
        c.get_job(JOB)
    assert info.value.status_code == status and info.value.code == "SOME_CODE"
    assert len(script.requests) == 1 and sleeps == []


def test_429_honours_retry_after_seconds(client_for: ClientFactory):
    script = Script(
        json_response(429, error_body("RATE_LIMITED"), {"Retry-After": "7"}), json_response(200, snapshot())
    )
    c, sleeps = client_for(script)
    c.get_job(JOB)
    assert sleeps == [7.0]


def test_429_without_retry_after_backs_off_and_gives_up_as_rate_limited(client_for: ClientFactory):
    script = Script(*[json_response(429, error_body("RATE_LIMITED")) for _ in range(3)])
    c, sleeps = client_for(script, retries=2, backoff=0.1)
    with pytest.raises(RateLimitedError):
        c.get_job(JOB)
    assert len(script.requests) == 3 and len(sleeps) == 2


def test_connection_errors_are_retried(client_for: ClientFactory):
    script = Script(httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), json_response(200, snapshot()))
    c, sleeps = client_for(script)
    assert c.get_job(JOB).status == "WAITING_USER_SELECTION"
    assert len(script.requests) == 3 and len(sleeps) == 2


def test_retries_are_bounded_and_backoff_is_capped(client_for: ClientFactory):
    script = Script(*[json_response(503, error_body("UNAVAILABLE")) for _ in range(7)])
    c, sleeps = client_for(script, retries=6, backoff=0.5, backoff_max=2.0)
    with pytest.raises(ServerError) as info:
        c.get_job(JOB)
    assert info.value.status_code == 503
    assert len(script.requests) == 7 and len(sleeps) == 6
    assert all(0 < d <= 2.0 for d in sleeps)
    assert sleeps[0] <= 0.5 and min(sleeps[3:]) >= 1.0  # grows, then sits at the cap (jitter in [d/2, d])


def test_connection_failure_after_retries_raises_connection_failed(client_for: ClientFactory):
    script = Script(*[httpx.ConnectError("refused") for _ in range(3)])
    c, _ = client_for(script, retries=2)
    with pytest.raises(ConnectionFailed) as info:
        c.get_job(JOB)
    assert info.value.attempts == 3 and isinstance(info.value.__cause__, httpx.ConnectError)


def test_submit_without_key_is_not_resent_once_it_may_have_arrived(client_for: ClientFactory):
    script = Script(httpx.ReadError("connection reset after upload"))
    c, sleeps = client_for(script)
    with pytest.raises(ConnectionFailed):
        c.submit(png_bytes())
    assert len(script.requests) == 1 and sleeps == []

    script = Script(json_response(503, error_body("UNAVAILABLE")))
    c, sleeps = client_for(script)
    with pytest.raises(ServerError):
        c.submit(png_bytes())
    assert len(script.requests) == 1 and sleeps == []


def test_submit_without_key_retries_a_connect_error(client_for: ClientFactory):
    script = Script(
        httpx.ConnectError("refused"),
        json_response(202, {"accepted": True, "job_id": JOB, "status": "CREATED", "version": 1}),
    )
    c, sleeps = client_for(script)
    res = c.submit(png_bytes())
    assert res.job_id == JOB and res.status_code == 202 and not res.replayed
    assert len(script.requests) == 2 and "Idempotency-Key" not in script.requests[1].headers


def test_submit_with_key_is_retried_and_reports_the_replay(client_for: ClientFactory):
    accepted = {"accepted": True, "job_id": JOB, "status": "CREATED", "version": 1}
    script = Script(
        httpx.ReadError("reset"),
        json_response(503, error_body("UNAVAILABLE")),
        json_response(200, accepted, {"Idempotent-Replayed": "true"}),
    )
    c, sleeps = client_for(script)
    data = png_bytes()
    res = c.submit(data, idempotency_key="default:abc")
    assert (res.job_id, res.status, res.version, res.replayed, res.status_code) == (JOB, "CREATED", 1, True, 200)
    assert len(script.requests) == 3
    assert {r.headers["Idempotency-Key"] for r in script.requests} == {"default:abc"}
    assert all(data in r.content for r in script.requests)  # the whole image re-sent every time


def test_submit_sends_the_image_as_multipart_field_image(tmp_path, client_for: ClientFactory):
    data = png_bytes()
    path = tmp_path / "shoe.png"
    path.write_bytes(data)
    accepted = {"accepted": True, "job_id": JOB, "status": "CREATED", "version": 1}
    script = Script(json_response(202, accepted), json_response(202, accepted))
    c, _ = client_for(script)
    c.submit(path)
    c.submit(data)
    for req, name in zip(script.requests, ("shoe.png", "image.png"), strict=True):
        assert req.method == "POST" and req.url.path == "/api/v1/jobs"
        assert req.headers["Content-Type"].startswith("multipart/form-data")
        assert f'name="image"; filename="{name}"'.encode() in req.content
        assert b"Content-Type: image/png" in req.content and data in req.content


def test_intervention_is_retried_with_the_same_body_and_keeps_raw_bytes(client_for: ClientFactory):
    raw = json.dumps(intervention_response(), separators=(",", ":")).encode()
    script = Script(
        httpx.ReadError("reset"),
        httpx.Response(200, content=raw, headers={"Idempotent-Replayed": "true", "Content-Type": "application/json"}),
    )
    c, _ = client_for(script)
    res = c.intervene(
        JOB,
        intervention_id="iv_1",
        pause_token="pause_x",
        base_version=3,
        subjects=[{"box_id": "box_1", "bbox": [10, 10, 100, 120]}],
    )
    assert res.replayed and res.raw == raw and res.next_node_type == "PROCESS_APPROVED_BOX_LIST"
    assert res.diff.kept == ["box_1"]
    bodies = [json.loads(r.content) for r in script.requests]
    assert (
        bodies[0]
        == bodies[1]
        == {
            "intervention_id": "iv_1",
            "pause_token": "pause_x",
            "base_version": 3,
            "subjects": [{"box_id": "box_1", "bbox": [10, 10, 100, 120]}],
        }
    )
    assert script.requests[0].url.path == f"/api/v1/jobs/{JOB}/interventions"


def test_cancel_results_download_paths(client_for: ClientFactory):
    results = {"job_id": JOB, "status": "SUCCEEDED", "reason_code": None, "subjects": []}
    script = Script(
        json_response(200, snapshot("CANCELLED")),
        json_response(200, results),
        httpx.Response(200, content=b"PNG1"),
        httpx.Response(200, content=b"PNG2"),
    )
    c, _ = client_for(script)
    assert c.cancel(JOB).status == "CANCELLED"
    assert c.results(JOB).status == "SUCCEEDED"
    assert c.download("/api/v1/artifacts/mask_1.png") == b"PNG1"
    assert c.download("cut out#1.png") == b"PNG2"
    paths = [r.url.raw_path.decode() for r in script.requests]
    assert paths == [
        f"/api/v1/jobs/{JOB}/cancel",
        f"/api/v1/jobs/{JOB}/results",
        "/api/v1/artifacts/mask_1.png",
        "/api/v1/artifacts/cut%20out%231.png",
    ]
    assert script.requests[0].method == "POST"


def test_download_refuses_to_send_the_token_elsewhere(client_for: ClientFactory):
    c, _ = client_for(Script())
    with pytest.raises(ValueError):
        c.download("http://evil.example/api/v1/artifacts/x.png")


def test_list_and_iter_jobs_follow_the_cursor(client_for: ClientFactory):
    def summary(i: int) -> dict[str, Any]:
        return {
            "job_id": f"job_{i}",
            "status": "CREATED",
            "version": 1,
            "created_at": "t",
            "updated_at": "t",
            "submitter": "alice",
        }

    script = Script(
        json_response(200, {"jobs": [summary(1), summary(2)], "next_cursor": "1.5:job_2"}),
        json_response(200, {"jobs": [summary(3)], "next_cursor": None}),
    )
    c, _ = client_for(script)
    assert [j.job_id for j in c.iter_jobs("WAITING_USER_SELECTION", page_size=2)] == ["job_1", "job_2", "job_3"]
    q1, q2 = (dict(r.url.params) for r in script.requests)
    assert q1 == {"status": "WAITING_USER_SELECTION", "limit": "2"}
    assert q2 == {"status": "WAITING_USER_SELECTION", "limit": "2", "cursor": "1.5:job_2"}


def test_readyz_is_not_retried(client_for: ClientFactory):
    script = Script(json_response(503, {"ready": False, "redis": True}))
    c, sleeps = client_for(script)
    with pytest.raises(ServerError) as info:
        c.readyz()
    assert info.value.body == {"ready": False, "redis": True} and sleeps == []


def test_async_submit_reads_a_file(tmp_path):
    path = tmp_path / "shoe.png"
    path.write_bytes(png_bytes())
    accepted = {"accepted": True, "job_id": JOB, "status": "CREATED", "version": 1}
    script = Script(json_response(202, accepted))

    async def run() -> str:
        async with AsyncHitlClient(BASE, "t", transport=httpx.MockTransport(script)) as c:
            return (await c.submit(path, idempotency_key="k:1")).job_id

    assert asyncio.run(run()) == JOB
    assert b'filename="shoe.png"' in script.requests[0].content
