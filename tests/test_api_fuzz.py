"""schemathesis against the control plane's own OpenAPI: no generated input may cause a 5xx.

Runs against the real app under uvicorn (real Redis, real models), authenticated as
an admin so the generated requests get past 401 into the handlers. Bounded examples.
"""

from __future__ import annotations

import httpx
import schemathesis
from hypothesis import HealthCheck, settings

from .api_util import auth


def test_no_server_errors(api_server):
    """Every operation of the schema, 25 generated cases each (schemathesis strategies driven by
    hypothesis directly: its pytest plugin does not support this pytest version)."""
    from hypothesis import given

    schema = schemathesis.openapi.from_url(f"{api_server.url}/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    assert len(operations) >= 9
    for op in operations:

        @given(case=op.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case):
            response = case.call(base_url=api_server.url, headers=auth("admin"), timeout=30)
            assert response.status_code < 500, (
                f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:300]}"
            )
            if response.status_code >= 400 and "json" in response.headers.get("content-type", ""):
                body = response.json()
                assert isinstance(body.get("code"), str) and body["code"].isupper(), body

        run()


def test_openapi_lists_every_route(api_server):
    paths = httpx.get(f"{api_server.url}/openapi.json").json()["paths"]
    for p in (
        "/api/v1/jobs",
        "/api/v1/jobs/{job_id}",
        "/api/v1/jobs/{job_id}/interventions",
        "/api/v1/jobs/{job_id}/cancel",
        "/api/v1/jobs/{job_id}/events",
        "/api/v1/jobs/{job_id}/results",
        "/api/v1/artifacts/{name}",
        "/healthz",
        "/readyz",
        "/metrics",
    ):
        assert p in paths, p
    assert httpx.get(f"{api_server.url}/docs").status_code == 200
