"""Reviewer-facing latency of the Gradio UI, in a real browser against a real ``hitl up``.

Starts ``hitl up`` (embedded Redis, local Ray, Ray Serve, the Gradio UI) with one sign-in token per
reviewer, and headless Chromium (Playwright) with one browser context per reviewer, each signed in.
For each reviewer count in ``--reviewers`` (default ``1,4``), ``--jobs`` jobs go through the queue:

- a feeder submits a job whenever fewer jobs than reviewers are in flight (submitted, not yet
  answered), so reviewers mostly wait for a pause to open rather than work down a backlog;
- every reviewer presses N (open the oldest waiting job nobody else claimed) as soon as the API lists
  an unclaimed waiting job (one shared poll every 50 ms, counted only when it started after the
  reviewer's last move, stands in for a reviewer watching the queue);
  with several reviewers they race for the same jobs, and a press that finds nothing is a "miss";
- once the panel is interactive the reviewer presses Enter (submit, every box kept) and waits for
  the answer in the banner.

Figures, p50/p95 over the jobs opened:

- ``pause → interactive``: from the job's PAUSE_OPENED event (its ``at``, stamped by the server) to
  the panel being interactive in the browser: the stage line names the job's pause, Submit is
  enabled and the canvas shows the image (a pixel at its centre is drawn);
- ``N → interactive``: from the key press to the same moment (the UI's own part of the above);
- ``submit → banner``: from pressing Enter to the confirmation banner ("Submitted — …"), or to the
  banner of a refusal;
- the share of submissions that ended in a 409, 0 when claims are honoured: counted from the jobs'
  audit trails (the server's word), since the banner a page shows can be replaced before it is read
  (by the job's end right after the deciding answer, or a late answer to an earlier key press); the
  answers whose banner was not a confirmation are counted apart, and each of them, like each N press
  that opened a job which had ended, comes with its job's audit trail in the JSON (``odd``).

With ``--quorum Q`` every job is submitted with ``review_quorum=Q`` (docs/protocol.md § Quorum): Q
distinct reviewers must submit agreeing lists, so each job is opened and answered Q times (the first
Q-1 answers are votes, the Qth decides). N leaves out the jobs a reviewer already voted on, so each
reviewer watches the queue through their own token. Added figure: ``pause → decided``, from the
PAUSE_OPENED event to the answer of the reviewer whose submission decided the job.

One machine's clocks (the server's ``at``, the browser's ``Date.now()``, Python's ``time.time()``).

    .venv/bin/python benchmarks/reviewer.py --jobs 30 --reviewers 1,4 --json benchmarks/out/reviewer.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.reviewer_figures import ADMIN, figures, table
from harness.bench import log, stop_on_sigterm
from harness.hitl_up import HitlUp
from harness.reviewer_page import (
    ANSWERED_JS,
    BLUR_JS,
    MISS_TEXT,
    OPENED_JS,
    SHOWN_JS,
    SUBMIT_STATE_JS,
    WATCH_JS,
    laid_out,
    shown_job,
)
from hitl_review.serve_app.ops.samples import product_composite

CHROMIUM = os.environ.get("HITL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
POLL_S = 0.05  # the shared "is anything waiting?" poll
MISS_WAIT_MS = 5_000  # an N press answered by the banner it already showed ("nothing waiting") changes nothing
WAIT_MS = 60_000
RETRIES = 20  # a job submission answered 429/503 is sent again this often


def reviewer_names(n: int) -> list[str]:
    return [f"bench{i + 1}" for i in range(n)]


def tokens_spec(n: int) -> str:
    """HITL_TOKENS: an admin (the feeder) and ``n`` reviewers, each signing in with their own token."""
    return ",".join([f"admin:admin:{ADMIN}", *(f"{name}:reviewer:tok-{name}" for name in reviewer_names(n))])


@dataclass
class Run:
    """One scenario: ``reviewers`` pages racing on ``jobs`` jobs, each needing ``quorum`` answers."""

    reviewers: int
    jobs: int
    deadline: float
    slots: asyncio.Semaphore
    quorum: int = 1
    api: Any = None  # the admin's API client (httpx.AsyncClient)
    polled: asyncio.Condition = field(default_factory=asyncio.Condition)
    polls_started: int = 0
    # per reviewer, the latest poll answered: its number, and whether a job waits for that reviewer
    fresh: dict[str, tuple[int, bool]] = field(default_factory=dict)
    submitted: list[str] = field(default_factory=list)
    opened: list[dict[str, Any]] = field(default_factory=list)
    answers: list[dict[str, Any]] = field(default_factory=list)
    decided: dict[str, dict[str, Any]] = field(default_factory=dict)  # job → the answer that decided it
    misses: int = 0
    odd: list[dict[str, Any]] = field(default_factory=list)  # answers not confirmed, N presses onto ended jobs
    ended_on_open: int = 0  # N presses that opened another job which had ended ("The job ended"; in misses too)
    late_opens: int = 0  # jobs a page opened after its N press had been judged a miss (reviewed, not stranded)
    retried: int = 0  # submissions answered 429/503 and sent again
    retry_answers: Counter[str] = field(default_factory=Counter)  # "503 STORE_UNAVAILABLE" → how often

    @property
    def done(self) -> bool:
        return len(self.decided) >= self.jobs or time.monotonic() > self.deadline

    async def something_waits(self, who: str, after: int) -> bool:
        """Until a poll started after poll ``after`` lists a job waiting for ``who`` (False: the run is over)."""

        def ready() -> bool:
            n, waits = self.fresh.get(who, (0, False))
            return self.done or (n > after and waits)

        async with self.polled:
            await self.polled.wait_for(ready)
        return not self.done

    def answered(self, answer: dict[str, Any]) -> None:
        """One answer; the job's ``quorum``-th confirmed one decides it and frees its feeder slot."""
        self.answers.append(answer)
        if answer["kind"] != "ok":
            self.odd.append({"what": f"answer: {answer['kind']}", **answer})
        job = answer["job"]
        confirmed = sum(a["job"] == job and a["kind"] == "ok" for a in self.answers)
        if job not in self.decided and (answer["kind"] != "ok" or confirmed >= self.quorum):
            self.decided[job] = answer  # a refusal or conflict ends the job's turn too: it is not re-fed
            self.slots.release()


async def feed(run: Run, api: httpx.AsyncClient, images: list[bytes]) -> None:
    """Submit a job whenever a slot is free (fewer than ``reviewers`` jobs in flight)."""
    for i in range(run.jobs):
        await run.slots.acquire()
        if run.done:
            return
        params = {"review_quorum": run.quorum} if run.quorum > 1 else {}
        for _ in range(RETRIES):  # 429/503 say "later" (docs/protocol.md § Error codes): a client waits and retries
            r = await api.post(
                "/api/v1/jobs", params=params, files={"image": (f"{i}.png", images[i % len(images)], "image/png")}
            )
            if r.status_code not in (429, 503):
                break
            run.retried += 1
            code = r.json().get("code", "?") if "json" in r.headers.get("content-type", "") else r.text[:80]
            run.retry_answers[f"{r.status_code} {code}"] += 1
            await asyncio.sleep(float(r.headers.get("Retry-After") or 0.5))
        r.raise_for_status()
        run.submitted.append(r.json()["job_id"])


async def wake(run: Run) -> None:
    """Let every reviewer waiting for a job look at ``run.done`` again."""
    async with run.polled:
        run.polled.notify_all()


async def poll(run: Run, api: httpx.AsyncClient, who: list[str]) -> None:
    """Tell each reviewer, every ``POLL_S``, whether the API lists a waiting job for them: unclaimed by
    others and, on a quorum, without their vote (asked with each reviewer's own token)."""

    async def waits_for(name: str) -> bool:
        try:
            r = await api.get(
                "/api/v1/jobs",
                params={"status": "WAITING", "unclaimed": "true", "limit": 1},
                headers={"Authorization": f"Bearer tok-{name}"},
            )
            return r.status_code == 200 and bool(r.json().get("jobs"))
        except httpx.HTTPError:
            return False

    try:
        while not run.done:
            run.polls_started += 1
            n = run.polls_started
            found = await asyncio.gather(*(waits_for(name) for name in who))
            async with run.polled:
                run.fresh = {name: (n, waits) for name, waits in zip(who, found, strict=True)}
                run.polled.notify_all()
            await asyncio.sleep(POLL_S)  # the polling period, not a synchronisation
    finally:
        async with run.polled:
            run.polled.notify_all()  # reviewers waiting for a job see that the run is over


async def review(run: Run, page: Any, who: str) -> None:
    """One reviewer: N as soon as something waits, then Enter once the panel is interactive."""
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    prev, stuck = "", dict[str, float]()  # stuck: a review laid out on screen, never interactive, since when
    after = run.polls_started  # a job counts as waiting once a poll started after this reviewer's last move says so
    while await run.something_waits(who, after):
        mark = await page.evaluate("window.__hitlBannerN")
        laid = laid_out(await page.evaluate(SHOWN_JS))  # N passes it over while it is on screen
        if laid and time.monotonic() - stuck.setdefault(laid, time.monotonic()) > WAIT_MS / 1000:
            state = await page.evaluate(SUBMIT_STATE_JS)
            raise RuntimeError(f"{who}: {laid} laid out for {WAIT_MS // 1000} s, never interactive; {state}")
        # A job opened after its N press was judged a miss is on screen and claimed by this page alone;
        # N would pass it over as the job on screen (the 4-reviewer run stalled on one: issue 22).
        got = await page.evaluate(OPENED_JS, [prev, mark])
        if got and got.get("kind") == "open":
            run.late_opens, prev = run.late_opens + 1, got["job"]
            run.opened.append({**got, "reviewer": who, "pressed": None})  # no N → interactive figure
            after = await answer(run, page, who, got)
            continue
        shown_before = shown_job(await page.evaluate(SHOWN_JS))
        await page.evaluate(BLUR_JS)
        pressed = time.time()
        await page.keyboard.press("n")
        try:
            handle = await page.wait_for_function(OPENED_JS, arg=[prev, mark], timeout=MISS_WAIT_MS)
            got = await handle.json_value()
        except PlaywrightTimeout:
            banner = await page.inner_text('#banner [data-testid="markdown"]')
            ended = banner.startswith("The job ended")
            shown_now = shown_job(await page.evaluate(SHOWN_JS))
            moved = shown_now not in (shown_before, prev)  # not the job this reviewer last answered
            if MISS_TEXT.search(banner) or ended or not moved:
                # The same "nothing" banner as before, one the end of the job still on screen (e.g. one this
                # reviewer voted on) replaced at once, or a job that ended as it was opened (its quorum
                # decided by others; only this last case is counted apart): nothing to review.
                got = {"kind": "miss"}
                if ended and moved:
                    run.ended_on_open += 1
                    run.odd.append({"what": "N opened an ended job", "reviewer": who, "job": shown_now})
            else:  # a slow opening
                try:
                    handle = await page.wait_for_function(OPENED_JS, arg=[prev, mark], timeout=WAIT_MS)
                except PlaywrightTimeout:
                    shown = await page.evaluate(SHOWN_JS)
                    raise RuntimeError(f"{who}: N opened nothing in {WAIT_MS // 1000} s; the page: {shown}") from None
                got = await handle.json_value()
        if got["kind"] == "miss":
            run.misses += 1
            after = run.polls_started
            await held_unseen(run, page, who)
            continue
        prev = got["job"]
        run.opened.append({"reviewer": who, "pressed": pressed, **got})
        after = await answer(run, page, who, got)


async def held_unseen(run: Run, page: Any, who: str) -> None:
    """After a miss: a waiting job this reviewer's session holds a claim on while the page does not lay it
    out is a stranded job (its claim renewed by the page's timer, N passing over it as the job on screen).
    Recorded once per job in ``odd`` with what the page shows and every job its job line showed."""
    r = await run.api.get("/api/v1/jobs", params={"status": "WAITING", "limit": 100})
    held = [j["job_id"] for j in r.json().get("jobs", []) if (j.get("claim") or {}).get("reviewer") == who]
    shown = await page.evaluate(SHOWN_JS)
    for job in held:
        if job == laid_out(shown) or any(o.get("job") == job and o["what"] == "held, not shown" for o in run.odd):
            continue
        seen = await page.evaluate("(j) => (window.__hitlJobShown || {})[j] || null", job)
        banners = await page.evaluate("(window.__hitlBanners || []).slice(-6)")
        log(f"{who}: holds {job} but its page lays out {laid_out(shown) or 'nothing'}: {shown}")
        run.odd.append(
            {
                "what": "held, not shown",
                "reviewer": who,
                "job": job,
                "page": shown,
                "job_line_at": seen,
                "banners": banners,
            }
        )


async def answer(run: Run, page: Any, who: str, got: dict[str, Any]) -> int:
    """Enter on the open panel (submit, every box kept) and the answer from the banner; returns the
    poll count a next job must come after."""
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    mark = await page.evaluate("window.__hitlBannerN")
    await page.evaluate(BLUR_JS)
    sent = time.time()
    await page.keyboard.press("Enter")
    try:
        handle = await page.wait_for_function(ANSWERED_JS, arg=[mark], timeout=WAIT_MS)
    except PlaywrightTimeout:
        state = await page.evaluate(SUBMIT_STATE_JS)
        raise RuntimeError(f"{who}: Enter on {got['job']} answered nothing in {WAIT_MS // 1000} s; {state}") from None
    ans = await handle.json_value()
    run.answered({"reviewer": who, "job": got["job"], "pause": got["pause"], "sent": sent, **ans})
    return run.polls_started


async def cancel_waiting(api: httpx.AsyncClient) -> None:
    """Leave no job waiting for the next scenario."""
    r = await api.get("/api/v1/jobs", params={"status": "WAITING", "limit": 500})
    for job in r.json().get("jobs", []) if r.status_code == 200 else []:
        await api.post(f"/api/v1/jobs/{job['job_id']}/cancel")


async def scenario(
    pages: list[Any],
    api: httpx.AsyncClient,
    api_url: str,
    jobs: int,
    images: list[bytes],
    timeout_s: float,
    quorum: int = 1,
) -> dict[str, Any]:
    n = len(pages)
    names = reviewer_names(n)
    # Jobs in flight: enough for every reviewer to have one to look at (a quorum job takes `quorum` of them).
    slots = asyncio.Semaphore(max(1, n // quorum))
    run = Run(reviewers=n, jobs=jobs, deadline=time.monotonic() + timeout_s, slots=slots, quorum=quorum, api=api)
    t0 = time.perf_counter()
    tasks = [asyncio.create_task(feed(run, api, images)), asyncio.create_task(poll(run, api, names))]

    def ended(task: asyncio.Task[None]) -> None:  # a feeder or poller that fails ends the run at once
        if not task.cancelled() and task.exception() is not None:
            log(f"{task.get_coro().__name__} failed: {task.exception()!r}")  # type: ignore[union-attr]  # a coroutine
            run.deadline = 0.0
            asyncio.get_running_loop().create_task(wake(run))

    for t in tasks:
        t.add_done_callback(ended)
    await asyncio.gather(*(review(run, page, f"bench{i + 1}") for i, page in enumerate(pages)))
    wall = time.perf_counter() - t0
    for t in tasks:
        t.cancel()
    failures = [r for r in await asyncio.gather(*tasks, return_exceptions=True) if isinstance(r, Exception)]
    if failures:
        raise RuntimeError(f"the scenario's feeder or poller failed: {failures[0]!r}") from failures[0]
    await cancel_waiting(api)
    return await figures(run, api, api_url, wall)


async def sign_in(browser: Any, ui_url: str, name: str, tries: int = 3) -> Any:
    """A signed-in page for reviewer ``name``. On a loaded machine the first click can reach a page whose
    Gradio app is not connected yet: without the panel after a while, sign in again (it is idempotent)
    and say what the sign-in form showed."""
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    ctx = await browser.new_context(viewport={"width": 1400, "height": 1100})
    ctx.set_default_timeout(WAIT_MS)
    page = await ctx.new_page()
    await page.goto(ui_url)
    for attempt in range(1, tries + 1):
        await page.locator("#login-token input, #login-token textarea").first.fill(f"tok-{name}")
        await page.locator("#login-btn").click()
        try:
            await page.locator("#main-panel").wait_for(state="visible", timeout=WAIT_MS // tries)
            break
        except PlaywrightTimeout:
            said = (await page.inner_text("#login-message")).strip()
            log(f"sign-in of {name}: no panel after {WAIT_MS // tries // 1000} s (form says {said!r}), try {attempt}")
            if attempt == tries:
                raise
    await page.evaluate(WATCH_JS)
    return page


async def measure(up: HitlUp, args: argparse.Namespace, counts: list[int]) -> dict[str, Any]:
    from playwright.async_api import async_playwright

    images = [product_composite(seed=700 + i, width=640, height=480, n=2)[0] for i in range(8)]
    results: dict[str, Any] = {}
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with (
        async_playwright() as pw,
        httpx.AsyncClient(base_url=up.api_url, headers=headers, timeout=60) as api,
    ):
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            pages = [await sign_in(browser, up.ui_url or "", name) for name in reviewer_names(max(counts))]
            if args.warmup:  # every page opens its first jobs uncounted (a page's first opening is cold)
                log(f"warm-up: {args.warmup} job(s) on each of {len(pages)} page(s), one page at a time")
                for page in pages:
                    await scenario([page], api, up.api_url, args.warmup, images, args.timeout_s)
            for n in counts:
                log(f"{n} reviewer(s): {args.jobs} jobs, quorum {args.quorum}")
                res = await scenario(pages[:n], api, up.api_url, args.jobs, images, args.timeout_s, args.quorum)
                log(
                    f"{n} reviewer(s): N→interactive p50 {res['n_to_interactive_p50_ms']} ms, "
                    f"pause→interactive p50 {res['pause_to_interactive_p50_ms']} ms, "
                    f"submit→banner p50 {res['submit_to_banner_p50_ms']} ms, 409s {res['conflicts_409']}"
                )
                if res["retry_answers"]:
                    log(f"{n} reviewer(s): job submissions sent again after {res['retry_answers']}")
                key, again = str(n), 2
                while key in results:  # a count named twice (``--reviewers 4,4``): each scenario kept
                    key, again = f"{n}#{again}", again + 1
                results[key] = res
        finally:
            await browser.close()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=30, help="jobs per reviewer count (default 30)")
    ap.add_argument(
        "--reviewers", default="1,4", help="comma-separated reviewer counts, one scenario each (default 1,4)"
    )
    ap.add_argument(
        "--warmup", type=int, default=1, help="uncounted jobs each page opens before the first scenario (default 1)"
    )
    ap.add_argument(
        "--quorum",
        type=int,
        default=1,
        help="review_quorum of every job: distinct reviewers whose agreeing answers decide it (default 1; "
        "every --reviewers count must be at least this)",
    )
    ap.add_argument("--timeout-s", type=float, default=600, help="give up on a scenario after this long")
    ap.add_argument("--json", default="benchmarks/out/reviewer.json", help="where the figures go")
    args = ap.parse_args()
    counts = [int(v) for v in args.reviewers.split(",") if v.strip()]
    if not counts or min(counts) < 1 or args.jobs < 1:
        ap.error("--jobs and every --reviewers count must be at least 1")
    if not 1 <= args.quorum <= min(counts):
        ap.error(f"--quorum {args.quorum} needs every --reviewers count to be at least that (and it must be ≥ 1)")
    if not os.access(CHROMIUM, os.X_OK):
        print(f"Chromium not found at {CHROMIUM} (set HITL_CHROMIUM)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="hitl-reviewer-bench-"))
    log(f"starting hitl up (UI, {max(counts)} reviewer tokens) in {tmp}")
    started = time.perf_counter()
    env = {"HITL_TOKENS": tokens_spec(max(counts))}  # box review's speed: no mask review after it
    up = HitlUp(tmp / "data", "--quality-gate", "off", ui=True, env=env, log_path=tmp / "hitl-up.log").start()
    log(f"hitl up ready in {time.perf_counter() - started:.1f} s")
    try:
        results = asyncio.run(measure(up, args, counts))
    finally:
        try:
            up.stop(timeout=60)
        except Exception:  # a stuck shutdown must not hide the figures
            up.kill()
    out = {
        "config": vars(args),
        "machine": {"cpus": psutil.cpu_count(), "python": platform.python_version()},
        "results": results,
    }
    print()
    print(table(results))
    print(
        f"\n{args.jobs} jobs per scenario (review_quorum {args.quorum}), classical backends, 640x480 images "
        "with 2 objects; N pressed as soon as a job waits for the reviewer (50 ms poll); every box kept on submit"
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")
    failed = [k for k, r in results.items() if r["timed_out"] or r["jobs_opened"] == 0]
    if failed:
        print(f"scenario(s) {', '.join(failed)} did not finish their jobs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    stop_on_sigterm()
    sys.exit(main())
