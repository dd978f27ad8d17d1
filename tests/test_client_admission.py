"""The client under admission control and a Redis outage (docs/protocol.md § Error codes:
``BACKLOG_FULL`` 429 and ``STORE_UNAVAILABLE`` 503, both with ``Retry-After``), over a scripted
network as in ``test_client_api.py``: each test runs on HitlClient and AsyncHitlClient."""

from __future__ import annotations

import pytest

from hitl_review.client import RateLimitedError, RetryMode, RetryPolicy, ServerError
from tests.client_fakes import JOB, ClientFactory, Script, error_body, json_response, png_bytes, snapshot

CREATED = {"job_id": JOB, "status": "DETECTING", "version": 1}


def test_policy_retries_429_even_without_an_idempotency_key_but_never_503():
    p = RetryPolicy(retries=3)
    assert p.after_status(0, 429, RetryMode.CONNECT_ONLY, retry_after=2.0) == 2.0
    assert p.after_status(0, 429, RetryMode.CONNECT_ONLY) is not None
    assert p.after_status(0, 503, RetryMode.CONNECT_ONLY, retry_after=1.0) is None
    assert p.after_status(0, 429, RetryMode.NEVER, retry_after=1.0) is None


def test_submit_without_a_key_waits_out_backlog_full(client_for: ClientFactory):
    script = Script(
        json_response(429, error_body("BACKLOG_FULL", backlog=12, max_backlog=10), {"Retry-After": "2"}),
        json_response(429, error_body("BACKLOG_FULL"), {"Retry-After": "3"}),
        json_response(202, CREATED),
    )
    c, sleeps = client_for(script)
    assert c.submit(png_bytes()).job_id == JOB
    assert sleeps == [2.0, 3.0] and len(script.requests) == 3


def test_submit_with_a_key_waits_out_store_unavailable(client_for: ClientFactory):
    script = Script(
        json_response(503, error_body("STORE_UNAVAILABLE"), {"Retry-After": "1"}), json_response(202, CREATED)
    )
    c, sleeps = client_for(script)
    assert c.submit(png_bytes(), idempotency_key="k1").job_id == JOB
    assert sleeps == [1.0]
    assert len({r.headers["x-request-id"] for r in script.requests}) == 1


def test_submit_without_a_key_is_not_resent_after_store_unavailable(client_for: ClientFactory):
    script = Script(json_response(503, error_body("STORE_UNAVAILABLE"), {"Retry-After": "1"}))
    c, sleeps = client_for(script)
    with pytest.raises(ServerError) as info:
        c.submit(png_bytes())
    assert info.value.code == "STORE_UNAVAILABLE" and len(script.requests) == 1 and sleeps == []


def test_reads_and_interventions_ride_out_a_redis_outage(client_for: ClientFactory):
    outage = json_response(503, error_body("STORE_UNAVAILABLE"), {"Retry-After": "1"})
    script = Script(outage, outage, json_response(200, snapshot()))
    c, sleeps = client_for(script)
    assert c.get_job(JOB).job_id == JOB
    assert sleeps == [1.0, 1.0]


def test_backlog_full_that_lasts_gives_up_as_rate_limited(client_for: ClientFactory):
    full = json_response(429, error_body("BACKLOG_FULL"), {"Retry-After": "1"})
    script = Script(full, full, full)
    c, sleeps = client_for(script, retries=2)
    with pytest.raises(RateLimitedError) as info:
        c.submit(png_bytes(), idempotency_key="k2")
    assert info.value.code == "BACKLOG_FULL" and info.value.retry_after == 1.0 and sleeps == [1.0, 1.0]
