"""Roles fail closed: every route of the app has an entry in the role table, and a path or method
the table does not name is refused for every token, admin's included."""

from __future__ import annotations

import re

import httpx
import pytest
from fastapi.routing import APIRoute

from harness.tokens import auth
from hitl_review.serve_app.routes.api import PUBLIC, ROUTE_ROLES, create_app


async def _no_runtime():  # the app is only inspected, never started
    raise AssertionError("not started")


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x_1", path)


def test_every_route_of_the_app_has_a_role():
    app = create_app(_no_runtime)
    checked = 0
    for route in app.routes:
        if not isinstance(route, APIRoute):
            continue
        path = _concrete(route.path)
        for method in route.methods:
            checked += 1
            if PUBLIC.match(path):
                continue
            roles = [r for m, p, r in ROUTE_ROLES if m == method and p.match(path)]
            assert roles and roles[0], f"{method} {route.path} has no entry in ROUTE_ROLES"
    assert checked >= 10


@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/api/v1/nope"),
        ("DELETE", "/api/v1/jobs/job_x"),
        ("PUT", "/api/v1/jobs"),
        ("GET", "/api/v1/jobs/job_x/secret"),
    ],
)
@pytest.mark.parametrize("who", ["admin", "rev1", "sub1"])
def test_a_route_outside_the_role_table_is_refused(api_server, method, path, who):
    with httpx.Client(base_url=api_server.url, timeout=10) as c:
        r = c.request(method, path, headers=auth(who))
    assert r.status_code == 403 and r.json()["code"] == "FORBIDDEN", r.text
