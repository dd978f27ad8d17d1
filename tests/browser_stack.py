"""What every browser module starts: one ``hitl up`` with the UI for the module (``ui_up``) and
reviewer pages, each in a browser context of its own (``page_maker``). The module-scoped
``browser`` fixture (tests/conftest.py) launches Chromium once the module's ``stack`` is up."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from harness.hitl_up import HitlUp
from harness.tokens import TOKENS

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
