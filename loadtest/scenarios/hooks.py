"""The locust event hooks of the hitl-review scenarios: the ``--hitl-*`` options, setting the
users up from them, counting every answer, and writing the summary at the end."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from locust import between, events

from harness.tokens import resolve_token
from loadtest.common import Recorder
from loadtest.scenarios.shared import DEFAULT_WEIGHTS, SH, Image, pairs
from loadtest.scenarios.users import Canceller, DoubleClicker, Reviewer, RivalReviewers, StaleTab, Submitter


def _options(parser: Any) -> None:
    g = parser.add_argument_group("hitl-review")
    g.add_argument(
        "--hitl-weights",
        env_var="HITL_LT_WEIGHTS",
        default="",
        help="Class=weight,... (default " + ",".join(f"{k}={v}" for k, v in DEFAULT_WEIGHTS.items()) + ")",
    )
    g.add_argument(
        "--hitl-counts",
        env_var="HITL_LT_COUNTS",
        default="",
        help="Class=count,...: a fixed number of users of those classes, spawned first",
    )
    g.add_argument(
        "--hitl-record",
        env_var="HITL_LT_RECORD",
        default="",
        help="JSONL file: one line per intervention and job-creation answer",
    )
    g.add_argument(
        "--hitl-summary",
        env_var="HITL_LT_SUMMARY",
        default="",
        help="JSON file written at the end: counts by name, status code, 5xx, checks",
    )
    g.add_argument(
        "--hitl-image-size",
        env_var="HITL_LT_IMAGE_SIZE",
        default="320x240",
        help="WxH of the generated product images (default 320x240)",
    )
    g.add_argument(
        "--hitl-images",
        env_var="HITL_LT_IMAGES",
        type=int,
        default=24,
        help="how many distinct images to generate (default 24)",
    )
    g.add_argument(
        "--hitl-repeat",
        env_var="HITL_LT_REPEAT",
        type=float,
        default=0.15,
        help="share of submissions that repeat an earlier Idempotency-Key and image",
    )
    g.add_argument(
        "--hitl-key-conflict",
        env_var="HITL_LT_KEY_CONFLICT",
        type=float,
        default=0.03,
        help="share of submissions that reuse a key with another image (expect 409)",
    )
    g.add_argument(
        "--hitl-stream-timeout",
        env_var="HITL_LT_STREAM_TIMEOUT",
        type=float,
        default=30.0,
        help="seconds a user follows one job's event stream at most (default 30); a job that takes "
        "longer is left to the invariant checker",
    )
    g.add_argument(
        "--hitl-rivals",
        env_var="HITL_LT_RIVALS",
        type=int,
        default=3,
        help="reviewers racing on one pause in RivalReviewers (>= 2)",
    )
    g.add_argument(
        "--hitl-wait", env_var="HITL_LT_WAIT", default="0.2,1.0", help="min,max seconds between a user's tasks"
    )


def _init(environment: Any, **_kw: Any) -> None:
    from hitl_review.serve_app.ops.samples import product_composite

    opts = environment.parsed_options
    SH.token = resolve_token()
    weights = {**DEFAULT_WEIGHTS, **pairs(opts.hitl_weights if opts else "")}
    counts = pairs(opts.hitl_counts if opts else "")
    lo, hi = (float(x) for x in ((opts.hitl_wait if opts else "") or "0.2,1.0").split(","))
    for cls in (Submitter, Reviewer, DoubleClicker, RivalReviewers, StaleTab, Canceller):
        cls.weight = weights[cls.__name__]
        cls.fixed_count = counts.get(cls.__name__, 0)
        cls.wait_time = between(lo, hi)
    w, h = (int(v) for v in (opts.hitl_image_size if opts else "320x240").lower().split("x"))
    n = opts.hitl_images if opts else 24
    for i in range(n):
        png, boxes = product_composite(seed=1000 + i, width=w, height=h, n=1 + i % 3)
        SH.images.append(Image(png, boxes, (w, h)))
    if opts:
        SH.recorder = Recorder(opts.hitl_record or None)
        SH.summary_path = opts.hitl_summary
        SH.repeat, SH.key_conflict = opts.hitl_repeat, opts.hitl_key_conflict
        SH.stream_timeout, SH.rivals = opts.hitl_stream_timeout, max(2, opts.hitl_rivals)


def _start(**_kw: Any) -> None:
    SH.started = time.time()
    for cls in (Submitter, Reviewer, DoubleClicker, RivalReviewers, StaleTab, Canceller):
        if not cls.tasks:  # --tags / --exclude-tags filtered every task away: spawn none of it
            cls.weight, cls.fixed_count = 0, 0


def _tally(request_type: str, name: str, response: Any = None, exception: Any = None, **_kw: Any) -> None:
    SH.names[name] += 1
    if request_type == "CHECK":
        SH.checks.setdefault(name, Counter())["failed" if exception else "ok"] += 1
        return
    status = getattr(response, "status_code", None)
    if status is None:
        return
    SH.status_codes[str(status)] += 1
    if status == 0:
        SH.transport_errors[name] += 1
    elif status >= 500:
        SH.server_errors[name] += 1


def _stop(**_kw: Any) -> None:
    SH.recorder.close()
    if not SH.summary_path:
        return
    summary = {
        "run_id": SH.run_id,
        "seconds": round(time.time() - SH.started, 2),
        "requests_by_name": dict(sorted(SH.names.items())),
        "status_codes": dict(SH.status_codes),
        "server_errors": sum(SH.server_errors.values()),
        "server_errors_by_name": dict(SH.server_errors),
        "transport_errors": sum(SH.transport_errors.values()),
        "transport_errors_by_name": dict(SH.transport_errors),
        "checks": {k: dict(v) for k, v in sorted(SH.checks.items())},
        "checks_failed": sum(v["failed"] for v in SH.checks.values()),
    }
    Path(SH.summary_path).parent.mkdir(parents=True, exist_ok=True)
    Path(SH.summary_path).write_text(json.dumps(summary, indent=2))


def _listen(hook: Any, listener: Callable[..., None]) -> None:
    """Register with a locust event hook (its ``add_listener`` decorator is untyped)."""
    hook.add_listener(listener)


def listen_to_locust_events() -> None:
    """Register the hooks; the locustfile calls this once, when locust loads it."""
    _listen(events.init_command_line_parser, _options)
    _listen(events.init, _init)
    _listen(events.test_start, _start)
    _listen(events.request, _tally)
    _listen(events.test_stop, _stop)
