"""Reviewer accounts in a real browser: headless Debian Chromium driven by Playwright against ONE real
`hitl up` (embedded Redis, local Ray, Ray Serve, the Gradio UI) started with the test identities
(HITL_TOKENS) and ``--trusted-proxy 127.0.0.1`` (README § Reviewer accounts), the "signed-in" one the
notes' and the review coordination's modules share (tests/browser_stack.py).

1. a reviewer added while it runs (the admin route) signs in on the page with a name and the token, sees
   the queue, is still signed in after a reload (an ``HttpOnly`` ``SameSite=Strict`` session cookie: no
   token, nor the session's id, in ``localStorage``, ``sessionStorage`` or ``document.cookie``), signs out
   (the form is back, also after a reload); removed with ``hitl admin reviewers remove``, the session is
   refused on the next load, and so is the token in the form;
2. a page whose requests name a user in ``X-Forwarded-User`` (an authenticating proxy on 127.0.0.1)
   is signed in as that user, no form, and sees the queue: the UI passes the user on to the API.

Under CI=true a missing Chromium fails the module; locally it skips.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from harness.hitl_up import HitlUp
from harness.tokens import TOKENS
from hitl_review.serve_app.cli import main as hitl
from hitl_review.serve_app.ops.samples import product_composite

from .browser_stack import page_maker, shared_ui_up
from .browser_util import WAIT_MS, Api, Reviewer

pytestmark = [pytest.mark.browser, pytest.mark.ray, pytest.mark.slow]

SHARED_UI = "signed-in"  # one `hitl up` with the notes' and the review coordination's modules


class Stack:
    def __init__(self, up: HitlUp) -> None:
        self.up = up
        self.ui_url = up.ui_url or ""
        self.api = Api(up.api_url, TOKENS["admin"])
        self.job = ""


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with shared_ui_up(request, tmp_path_factory, SHARED_UI) as up:
        s = Stack(up)
        try:
            s.job = s.api.submit(product_composite(21, 640, 480, n=2)[0])
            s.api.wait_round(s.job, 1)
            yield s
        finally:
            if s.job:
                s.api.cancel(s.job)
            s.api.close()


@pytest.fixture
def page_of(browser: Any, stack: Stack) -> Iterator[Callable[..., Reviewer]]:
    """``page_of(**context_options)``: a page in a browser context of its own (its own localStorage)."""
    with page_maker(browser, stack.ui_url) as make:
        yield make


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as pw_expect  # imported late: a missing Playwright skips the module

    return pw_expect(locator)


def sign_in(rv: Reviewer, name: str, token: str) -> None:
    rv.page.goto(rv.ui_url)
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(3):  # a click that reached a page whose Gradio app was not connected yet: again
        rv.page.locator("#login-name input, #login-name textarea").first.fill(name)
        rv.page.locator("#login-token input, #login-token textarea").first.fill(token)
        rv.page.locator("#login-btn").click()
        try:
            rv.page.locator("#main-panel").wait_for(state="visible", timeout=WAIT_MS // 3)
            return
        except PlaywrightTimeout:
            if attempt == 2:
                said = rv.page.inner_text("#login-message").strip()
                raise AssertionError(f"no review panel after 3 sign-ins; the form says {said!r}") from None


def nothing_a_script_can_read(rv: Reviewer, *secrets: str) -> str:
    """What the page's scripts can read of the browser's storage and cookies, checked to hold none of
    ``secrets``; the session cookie is there all the same, ``HttpOnly``, ``SameSite=Strict`` and (on
    loopback, over plain HTTP) not ``Secure``. Its value."""
    readable = rv.page.evaluate(
        "() => JSON.stringify([Object.entries(localStorage), Object.entries(sessionStorage), document.cookie])"
    )
    kept = [c for c in rv.page.context.cookies() if c["name"] == "hitl_session"]
    assert len(kept) == 1 and kept[0]["httpOnly"] and kept[0]["sameSite"] == "Strict" and not kept[0]["secure"]
    for secret in (*secrets, kept[0]["value"]):
        assert secret not in readable, readable
    return str(kept[0]["value"])


def sees_the_queue(rv: Reviewer, name: str, job: str) -> None:
    rv.expect_text("#signed-in-as", f"Signed in as {name}")
    rv.queue_row(job).wait_for(state="visible", timeout=WAIT_MS)
    expect(rv.page.locator("#login-panel")).to_be_hidden()


@pytest.mark.timeout(300)
def test_a_reviewer_added_at_run_time_signs_in_keeps_it_and_signs_out(
    stack: Stack, page_of: Callable[..., Reviewer]
) -> None:
    r = stack.api.c.post("/api/v1/admin/reviewers", json={"name": "erin"})
    assert r.status_code == 201, r.text
    token = r.json()["token"]

    rv = page_of()
    sign_in(rv, "erin", token)
    sees_the_queue(rv, "erin", stack.job)

    nothing_a_script_can_read(rv, token)
    rv.page.reload()  # the session cookie signs in again: no form
    sees_the_queue(rv, "erin", stack.job)
    nothing_a_script_can_read(rv, token)

    rv.page.locator("#signout-btn").click()
    expect(rv.page.locator("#login-panel")).to_be_visible(timeout=WAIT_MS)
    expect(rv.page.locator("#main-panel")).to_be_hidden()
    rv.page.reload()
    expect(rv.page.locator("#login-panel")).to_be_visible(timeout=WAIT_MS)
    expect(rv.page.locator("#main-panel")).to_be_hidden()

    # Signed in again, then removed by the CLI: the session ends with the account (on every replica at
    # once), so the next load shows the form, and the token in the form is refused.
    sign_in(rv, "erin", token)
    sees_the_queue(rv, "erin", stack.job)
    conn = ["--api-url", stack.up.api_url, "--token", TOKENS["admin"]]
    assert hitl(["admin", "reviewers", "remove", "erin", *conn]) == 0
    rv.page.reload()
    rv.expect_text("#login-message", "401")
    expect(rv.page.locator("#main-panel")).to_be_hidden()
    rv.page.locator("#login-token input, #login-token textarea").first.fill(token)
    rv.page.locator("#login-btn").click()
    rv.expect_text("#login-message", "401")
    expect(rv.page.locator("#main-panel")).to_be_hidden()


@pytest.mark.timeout(300)
def test_an_authenticating_proxys_user_is_signed_in_without_a_form(
    stack: Stack, page_of: Callable[..., Reviewer]
) -> None:
    rv = page_of(extra_http_headers={"X-Forwarded-User": "frank"})
    rv.page.goto(rv.ui_url)
    sees_the_queue(rv, "frank", stack.job)
    rv.expect_text("#signed-in-as", "(reviewer)")
    expect(rv.page.locator("#signout-btn")).to_be_hidden()  # signing out is the proxy's business
    rv.open_from_queue(stack.job)  # the API answers the UI for frank

    plain = page_of()  # the same UI without the proxy's header: the form
    plain.page.goto(plain.ui_url)
    expect(plain.page.locator("#login-panel")).to_be_visible(timeout=WAIT_MS)
