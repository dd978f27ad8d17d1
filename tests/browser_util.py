"""Helpers for the Playwright tests of the reviewer UI (tests/test_ui_browser.py).

Debian's Chromium, headless; the element ids are the ones ``ui/layout.py`` sets. The
annotator draws the image centred on its canvas at scale min(cw/iw, ch/ih), so a
point in image pixels maps to a point on the page through the canvas' bounding box.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from harness.ci import missing
from harness.sse import read_events

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("HITL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SHOTS = os.environ.get("HITL_SCREENSHOTS", "") == "1"
SHOT_DIR = ROOT / "docs" / "screenshots"
VIEWPORT = {"width": 1400, "height": 1100}

WAIT_MS = 60_000  # one UI wait: generous for a loaded 2-core machine, short enough to fail fast


@contextmanager
def launched_chromium(executable: str | None = None) -> Iterator[Any]:
    """Playwright and one headless Debian Chromium for a module's tests, both stopped afterwards."""
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=executable or require_chromium(), headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()
    finally:
        pw.stop()


def print_past_capture(request: Any, line: str) -> None:
    """``line`` on the terminal even when the test passes (pytest's capture set aside for it)."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if capture is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        print("\n" + line)


def require_chromium() -> str:
    """The Chromium binary; missing → FAIL under CI (make setup provides it), skip locally."""
    try:
        import playwright.sync_api  # noqa: F401 - imported only to see that it is installed
    except ImportError:
        missing("the playwright package")
    if os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    missing(f"Chromium ({CHROMIUM})")


def contrast(a: str, b: str) -> float:
    """WCAG contrast ratio of two CSS ``rgb(...)``/``rgba(...)`` colours (alpha ignored)."""

    def lum(css: str) -> float:
        r, g, b = (float(v) / 255 for v in re.findall(r"[\d.]+", css)[:3])
        lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def screenshot(page: Any, name: str, *, full_page: bool = False) -> None:
    """docs/screenshots/<name>.png, only when HITL_SCREENSHOTS=1."""
    if not SHOTS:
        return
    SHOT_DIR.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOT_DIR / f"{name}.png"), full_page=full_page)


# ----------------------------------------------------------------------------- the HTTP API


class Api:
    """Raw HTTP to the control plane with the local admin token (not the project's client)."""

    def __init__(self, base_url: str, token: str) -> None:
        self.c = httpx.Client(base_url=base_url, timeout=60, headers={"Authorization": f"Bearer {token}"})

    def submit(self, data: bytes, review_quorum: int = 1) -> str:
        params = {"review_quorum": review_quorum} if review_quorum > 1 else None
        r = self.c.post("/api/v1/jobs", params=params, files={"image": ("product.png", data, "image/png")})
        assert r.status_code == 202, r.text
        return str(r.json()["job_id"])

    def get(self, job_id: str) -> dict[str, Any]:
        r = self.c.get(f"/api/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        snap: dict[str, Any] = r.json()
        return snap

    def wait(
        self, job_id: str, pred: Callable[[dict[str, Any]], bool], what: str, timeout: float = 60
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            snap = self.get(job_id)
            if pred(snap):
                return snap
            assert time.monotonic() < deadline, f"{job_id}: no {what} after {timeout:.0f} s (status {snap['status']})"
            time.sleep(0.2)

    def wait_round(self, job_id: str, rnd: int, timeout: float = 60) -> dict[str, Any]:
        return self.wait(
            job_id,
            lambda s: bool(s["active_pause"]) and s["active_pause"]["round"] == rnd,
            f"round-{rnd} pause",
            timeout,
        )

    def results(self, job_id: str) -> dict[str, Any]:
        r = self.c.get(f"/api/v1/jobs/{job_id}/results")
        assert r.status_code == 200, r.text
        res: dict[str, Any] = r.json()
        return res

    def cancel(self, job_id: str) -> None:
        self.c.post(f"/api/v1/jobs/{job_id}/cancel")

    def events(self, job_id: str, until: str = "JOB_FINISHED", timeout: float = 60) -> list[dict[str, Any]]:
        """The job's SSE history (then live events) up to and including the first ``until`` event."""
        return read_events(self.c, job_id, until=until, timeout=httpx.Timeout(10, read=timeout))

    def close(self) -> None:
        self.c.close()


# ----------------------------------------------------------------------------- the reviewer page


class Reviewer:
    """One reviewer's page, with the moves the tests make on it."""

    def __init__(self, page: Any, ui_url: str) -> None:
        self.page = page
        self.ui_url = ui_url

    # -- opening

    def open_queue(self) -> None:
        self.page.goto(self.ui_url)
        self.page.wait_for_selector("#queue-table", timeout=WAIT_MS)

    def queue_row(self, job_id: str) -> Any:
        # the first text match of the dataframe is a hidden measuring cell: take the visible one
        return (
            self.page.locator("#queue-table span", has_text=re.compile("^" + re.escape(job_id) + "$"))
            .locator("visible=true")
            .first
        )

    def open_from_queue(self, job_id: str) -> None:
        row = self.queue_row(job_id)
        row.wait_for(state="visible", timeout=WAIT_MS)  # the queue refreshes every 2 s
        row.click()
        self.expect_text("#job-id", job_id)

    def sign_in(self, token: str, job_id: str | None = None) -> None:
        """The sign-in form of a UI that requires login (``hitl up`` with HITL_TOKENS), at ``?job=``."""
        self.page.goto(f"{self.ui_url}/?job={job_id}" if job_id else self.ui_url)
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        field = self.page.locator("#login-token input, #login-token textarea").first
        for attempt in range(3):  # a click that reached a page whose Gradio app was not connected yet: again
            field.fill(token)
            self.page.locator("#login-btn").click()
            try:
                self.page.locator("#main-panel").wait_for(state="visible", timeout=WAIT_MS // 3)
                break
            except PlaywrightTimeout:
                if attempt == 2:
                    said = self.page.inner_text("#login-message").strip()
                    raise AssertionError(f"no review panel after 3 sign-ins; the form says {said!r}") from None
        if job_id:
            self.expect_text("#job-id", job_id)

    def open_url(self, job_id: str) -> None:
        self.page.goto(f"{self.ui_url}/?job={job_id}")
        self.expect_text("#job-id", job_id)

    # -- waiting

    def expect_no_text(self, selector: str, text: str, timeout: int = WAIT_MS) -> None:
        from playwright.sync_api import expect

        expect(self.page.locator(selector)).not_to_contain_text(text, timeout=timeout)

    def expect_text(self, selector: str, text: str | re.Pattern[str], timeout: int = WAIT_MS) -> None:
        from playwright.sync_api import expect

        expect(self.page.locator(selector)).to_contain_text(text, timeout=timeout)

    def wait_panel(self, stage_text: str, pause_token: str | None = None) -> None:
        """The review panel shows the stage (and pause), and its canvas has the image."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        try:
            self.page.locator("#review-panel").wait_for(state="visible", timeout=WAIT_MS)
        except PlaywrightTimeout:  # say what the page shows instead (a claim note, a banner)
            said = self.shown()
            raise AssertionError(f"the review panel never showed ({stage_text}); the page: {said}") from None
        self.expect_text("#stage-text", stage_text)
        if pause_token:
            self.expect_text("#stage-text", pause_token)
        try:
            self.page.locator("#annotator canvas").wait_for(state="visible", timeout=WAIT_MS)
        except PlaywrightTimeout:
            said = self.shown()
            raise AssertionError(f"the panel is laid out but its canvas never showed; the page: {said}") from None

    def shown(self) -> dict[str, Any]:
        """What the page says where a reviewer looks, and what the annotator holds (for a failure's message)."""
        return dict(
            self.page.evaluate(
                """() => Object.fromEntries(['#banner', '#job-id', '#stage-text', '#claim-note', '#review-error',
                     '#annotator'].map((sel) => { const el = document.querySelector(sel);
                     const n = el ? el.querySelectorAll('canvas, img').length : 0;
                     return [sel, el ? `${el.innerText.trim().slice(0, 200)} (${n} canvas/img, `
                       + `shown: ${el.offsetParent !== null})` : null]; }))"""
            )
        )

    # -- the canvas

    def point(self, x: float, y: float, image_size: tuple[int, int]) -> tuple[float, float]:
        """Page coordinates of the image pixel (x, y)."""
        bb = self.page.locator("#annotator canvas").bounding_box()
        assert bb and bb["width"] > 0, "the annotator canvas has no size"
        iw, ih = image_size
        scale = min(bb["width"] / iw, bb["height"] / ih)
        ox = bb["x"] + (bb["width"] - iw * scale) / 2
        oy = bb["y"] + (bb["height"] - ih * scale) / 2
        return ox + x * scale, oy + y * scale

    def select_box(self, bbox: list[float], image_size: tuple[int, int]) -> None:
        """Select the box by clicking its centre in drag mode (the annotator then offers Remove)."""
        self.page.locator('#annotator button[aria-label="Drag boxes"]').click()
        cx, cy = (bbox[0] + bbox[2]) / 2, (bbox[1] + bbox[3]) / 2
        remove = self.page.locator('#annotator button[aria-label="Remove box"]')
        for attempt in range(3):  # the canvas may still be laying out the image on the first click
            self.page.mouse.click(*self.point(cx, cy, image_size))
            try:
                remove.wait_for(state="visible", timeout=5_000)
                break
            except Exception:  # playwright's TimeoutError: click again
                if attempt == 2:
                    raise

    def remove_box(self, bbox: list[float], image_size: tuple[int, int]) -> None:
        """Select the box, then the annotator's Remove button."""
        self.select_box(bbox, image_size)
        self.page.locator('#annotator button[aria-label="Remove box"]').click()

    def draft(self, job_id: str, pause_token: str) -> dict[str, Any] | None:
        """The unsent edits this browser keeps for one review (localStorage), or None."""
        raw = self.page.evaluate("(k) => localStorage.getItem(k)", f"hitl-draft:{job_id}:{pause_token}")
        return json.loads(raw) if raw else None

    def wait_draft(
        self, job_id: str, pause_token: str, ok: Callable[[dict[str, Any]], bool], what: str, timeout: float = 30
    ) -> dict[str, Any]:
        """The kept draft once ``ok`` holds for its edits. The page's script writes localStorage after
        Gradio renders the round trip's outputs, so the notes may say an edit before the draft keeps it."""
        deadline = time.monotonic() + timeout
        while True:
            kept = self.draft(job_id, pause_token)
            if kept is not None and ok(kept["draft"]):
                return kept
            assert time.monotonic() < deadline, f"the draft never kept {what}: {kept}"
            time.sleep(0.1)

    def wait_no_draft(self, job_id: str, pause_token: str, why: str, timeout: float = 10) -> None:
        """Until the browser keeps no draft of this review (reset, or its submission confirmed)."""
        deadline = time.monotonic() + timeout
        while (kept := self.draft(job_id, pause_token)) is not None:
            assert time.monotonic() < deadline, f"the draft outlived {why}: {kept}"
            time.sleep(0.1)

    def focused(self) -> dict[str, Any]:
        """The focused element: its id (or its Gradio block's), accessible name and outline."""
        info: dict[str, Any] = self.page.evaluate(
            """() => {
              const el = document.activeElement;
              if (!el || el === document.body) { return { id: "", name: "", outline: "none", width: 0 }; }
              const block = el.closest("[id]");
              const cs = getComputedStyle(el);
              const name = el.getAttribute("aria-label") || (el.labels && el.labels[0] ? el.labels[0].innerText : "")
                || el.getAttribute("title") || el.innerText || "";
              let bg = "rgb(255, 255, 255)";
              for (let p = el.parentElement; p; p = p.parentElement) {
                const c = getComputedStyle(p).backgroundColor;
                if (c && c !== "transparent" && !c.startsWith("rgba(0, 0, 0, 0)")) { bg = c; break; }
              }
              return { id: el.id || (block ? block.id : ""), tag: el.tagName, name: name.trim(),
                       outline: cs.outlineStyle, width: parseFloat(cs.outlineWidth) || 0, color: cs.outlineColor, bg };
            }"""
        )
        return info

    def draw_box(self, bbox: list[float], image_size: tuple[int, int]) -> None:
        """Create-box mode, then a drag from one corner to the other."""
        self.page.locator('#annotator button[aria-label="Create box"]').click()
        x1, y1 = self.point(bbox[0], bbox[1], image_size)
        x2, y2 = self.point(bbox[2], bbox[3], image_size)
        m = self.page.mouse
        m.move(x1, y1)
        m.down()
        m.move((x1 + x2) / 2, (y1 + y2) / 2, steps=5)
        m.move(x2, y2, steps=5)
        m.up()

    def label_new_box(self, label: str) -> None:
        """Type the name of the newest unlabelled drawn box and press Enter; wait until it is applied."""
        field = self.page.locator("#new-box-label textarea, #new-box-label input").first
        field.fill(label)
        field.press("Enter")
        from playwright.sync_api import expect

        expect(field).to_have_value("", timeout=WAIT_MS)  # the app clears the field once the label is set
        # the notes follow the annotator's change event, a moment later
        expect(self.page.locator("#box-notes")).not_to_contain_text("needs a label", timeout=WAIT_MS)

    def click_submit_now(self) -> None:
        """Click Submit from inside the page (no actionability wait: two pages can click together)."""
        self.page.evaluate("document.querySelector('#submit-btn').click()")

    def ready_to_submit(self) -> None:
        self.page.locator("#submit-btn").wait_for(state="visible", timeout=WAIT_MS)

    def pause_token_shown(self) -> str | None:
        m = re.search(r"pause_[0-9a-zA-Z]+", self.page.inner_text("#stage-text"))
        return m.group(0) if m else None
