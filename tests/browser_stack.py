"""What every browser module starts: one ``hitl up`` with the UI for the module (``ui_up``), or one
shared by the consecutive modules of a group that need the same options (``shared_ui_up``), and
reviewer pages, each in a browser context of its own (``page_maker``). The module-scoped
``browser`` fixture (tests/conftest.py) launches Chromium once the module's ``stack`` is up."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.hitl_up import HitlUp
from harness.tokens import TOKENS, TOKENS_SPEC

from .auto_policy_util import big_image_policy_text
from .browser_util import VIEWPORT, WAIT_MS, Reviewer, print_past_capture, require_chromium


@contextmanager
def ui_up(
    request: pytest.FixtureRequest, folder: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[HitlUp]:
    """``hitl up`` with the UI and ``args`` (more options) for one module's tests: started, then
    stopped (killed when a shutdown sticks, so it never hides a result), its wall time printed."""
    require_chromium()
    began = time.monotonic()
    up = HitlUp(folder, *args, ui=True, env=env or {})
    up.start()
    try:
        yield up
    finally:
        try:
            up.stop(timeout=60)
        except Exception:  # a stuck shutdown must not hide the test result
            up.kill()
        line = f"{request.node.nodeid}: wall time {time.monotonic() - began:.1f} s (hitl up included)"
        print_past_capture(request, line + tracebacks(up.child.lines))


# The `hitl up`s that several modules share (a module names one in SHARED_UI): its options and environment.
# The box stages only (the mask review has its own module), the label set the editor's buttons show;
# "signed-in" with the reviewers' identities of harness.tokens, so each page signs in, and an authenticating
# proxy trusted on 127.0.0.1 (a page sends its X-Forwarded-User only where a test gives it one).
# "box-stages" also runs a box auto-approve policy in on with --spot-check 1.0 (tests/auto_policy_util.py): it
# would approve every job on an image of 0.2 megapixels or more, so each of those still waits for a person
# as a spot check (test_spot_check_browser.py tells them from the others by nothing on the page).
SHARED_STACKS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "box-stages": (
        (
            "--quality-gate",
            "off",
            "--auto-approve",
            "on",
            "--auto-approve-policy",
            "{files}/box-policy.json",
            "--spot-check",
            "1.0",
        ),
        {"HITL_LABELS": "shoe,bag,shirt"},
    ),
    "signed-in": (
        ("--quality-gate", "off", "--trusted-proxy", "127.0.0.1"),
        {"HITL_TOKENS": TOKENS_SPEC, "HITL_LABELS": "shoe,bag,shirt"},
    ),
}
# Files a group's options name as {files}/NAME: written into a folder of their own before it starts.
SHARED_FILES: dict[str, dict[str, Callable[[], bytes]]] = {"box-stages": {"box-policy.json": big_image_policy_text}}
_running: dict[str, HitlUp] = {}  # started by a group's first module, stopped after its last (``stop_shared``)
TERMINAL = frozenset({"SUCCEEDED", "PARTIAL_SUCCEEDED", "FAILED", "EMPTY_SELECTION", "CANCELLED", "TIMED_OUT"})


@contextmanager
def shared_ui_up(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, group: str
) -> Iterator[HitlUp]:
    """``ui_up`` for a module of ``group`` (``SHARED_STACKS``): one ``hitl up`` for all the group's modules,
    which tests/conftest.py runs one after another, started by the first. When the module ends, every
    job still live on it is cancelled, so the next module's N and queue find only the jobs it makes."""
    args, env = SHARED_STACKS[group]
    up = _running.get(group)
    if up is None:
        require_chromium()
        began = time.monotonic()
        files = tmp_path_factory.mktemp(f"files-{group}")
        for name, make in SHARED_FILES.get(group, {}).items():
            (files / name).write_bytes(make())
        args = tuple(a.replace("{files}", str(files)) for a in args)
        up = _running[group] = HitlUp(tmp_path_factory.mktemp(f"hitl-{group}"), *args, ui=True, env=env).start()
        print_past_capture(request, f"shared hitl up {group!r} started in {time.monotonic() - began:.1f} s")
    began, first_line = time.monotonic(), len(up.child.lines)
    try:
        yield up
    finally:
        token = TOKENS["admin"] if "HITL_TOKENS" in env else up.token
        cancelled = cancel_live_jobs(up.api_url, token)
        line = f"{request.node.nodeid}: wall time {time.monotonic() - began:.1f} s; {cancelled} live job(s) cancelled"
        print_past_capture(request, line + tracebacks(up.child.lines[first_line:]))  # this module's own


def cancel_live_jobs(api_url: str, token: str) -> int:
    """Cancel every job not ended yet; how many were."""
    n = 0
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
        r = c.get("/api/v1/jobs", params={"limit": 500})
        r.raise_for_status()
        for job in r.json().get("jobs", []):
            if job.get("status") not in TERMINAL:
                n += c.post(f"/api/v1/jobs/{job['job_id']}/cancel").status_code == 200
    return n


def stop_shared(group: str) -> None:
    """Stop the group's ``hitl up`` (killed when a shutdown sticks); nothing when it was not started."""
    up = _running.pop(group, None)
    if up is None:
        return
    try:
        up.stop(timeout=60)
    except Exception:  # a stuck shutdown must not hide the test results
        up.kill()


def tracebacks(lines: list[str], most: int = 3, length: int = 40) -> str:
    """The first ``most`` tracebacks in ``hitl up``'s output (what the UI and the API raised while the
    module ran: a page that did not answer a click says why here), each at most ``length`` lines."""
    out: list[str] = []
    for i, line in enumerate(lines):
        if line.startswith("Traceback") and len(out) < most:
            block = [line]
            for nxt in lines[i + 1 : i + length]:
                block.append(nxt)
                if nxt and not nxt[0].isspace():  # the exception's own line ends the block
                    break
            out.append("\n".join(block))
    return "".join(f"\n--- a traceback in hitl up's output:\n{b}" for b in out)


@contextmanager
def page_maker(browser: Any, ui_url: str) -> Iterator[Callable[..., Reviewer]]:
    """``make(**context_options)``: a reviewer page at the UI in a browser context of its own (its
    own Gradio session and localStorage); every context is closed at the end."""
    contexts: list[Any] = []

    def make(**options: Any) -> Reviewer:
        ctx = browser.new_context(viewport=VIEWPORT, **options)
        ctx.set_default_timeout(WAIT_MS)
        contexts.append(ctx)
        return Reviewer(ctx.new_page(), ui_url)

    try:
        yield make
    finally:
        for ctx in contexts:
            ctx.close()


@contextmanager
def signed_in_maker(browser: Any, ui_url: str) -> Iterator[Callable[[str, str | None], Reviewer]]:
    """``make(name, job)``: a page of reviewer ``name`` (``harness.tokens``) signed in through the
    form, at ``job`` (``?job=``) when given; each in a browser context of its own."""
    with page_maker(browser, ui_url) as new_page:

        def make(name: str, job: str | None = None) -> Reviewer:
            rv = new_page()
            rv.sign_in(TOKENS[name], job)
            return rv

        yield make
