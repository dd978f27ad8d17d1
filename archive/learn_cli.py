"""``hitl learn``: the data set of reviewers' decisions, the box auto-approve policy fitted on it, what
the policies decided and how it is going, and turning a policy on again (docs/learning.md). Only the
standard library at import (``hitl`` builds its parser from the client's base install); scikit-learn,
SQLAlchemy and Redis are imported when a command runs."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from .cli import _needs_extra
from .options import _add_location

DESCRIPTION = (
    "Learn from what reviewers decided (docs/learning.md): `dataset` writes it as JSON lines; `box-policy` fits "
    "the box auto-approve policy and writes its versioned file, or refuses (exit 1) when the held-out evidence "
    "cannot bound the promised false-accept rate, saying how many more reviewed jobs it needs; `gate` trains the "
    "mask gate on the mask reviews and writes its versioned file (hitl up --quality-gate-policy FILE), or refuses; "
    "`report` shows "
    "per policy its automatic approvals, spot checks with the live false-accept rate and its bound, and shadow "
    "agreement; `mode` sets the live mode (turn a policy on again after it dropped itself to shadow)."
)


def add_learn_command(sub: Any, **kw: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("learn", help="auto-approval learned from reviewers' decisions (docs/learning.md)", **kw)
    p.description = DESCRIPTION
    learn = p.add_subparsers(dest="learn_command", metavar="STEP", required=True)
    d = learn.add_parser("dataset", help="the reviewed jobs as JSON lines", **kw)
    _add_location(d)
    d.add_argument("--out", type=Path, required=True, metavar="FILE", help="JSON lines to write")
    d.add_argument("--since", default=None, metavar="ISO", help="only jobs finished at or after this time")
    d.set_defaults(func=run_dataset)
    b = learn.add_parser("box-policy", help="fit and write the box auto-approve policy", **kw)
    _add_location(b)
    b.add_argument("--max-false-accept", type=float, required=True, metavar="R", help="the promise, e.g. 0.005")
    b.add_argument("--confidence", type=float, default=0.95, help="of the one-sided bound (default 0.95)")
    b.add_argument("--out", type=Path, required=True, metavar="FILE", help="the policy file to write")
    b.add_argument("--name", default="box", help="the policy's name (default box)")
    b.add_argument("--dataset", type=Path, default=None, metavar="FILE", help="JSON lines instead of the archive")
    b.add_argument("--since", default=None, metavar="ISO", help="only jobs finished at or after this time")
    b.add_argument("--seed", type=int, default=0, help="of the folds (default 0)")
    b.set_defaults(func=run_box_policy)
    g = learn.add_parser("gate", help="train the mask gate on the team's mask reviews and write its file", **kw)
    _add_location(g)
    g.add_argument("--out", type=Path, required=True, metavar="FILE", help="the gate policy file to write")
    g.add_argument("--min-recall", type=float, default=0.9, help="the promise: recall's lower bound (default 0.9)")
    g.add_argument(
        "--target-recall", type=float, default=0.97, help="recall the threshold is chosen for (default 0.97)"
    )
    g.add_argument("--confidence", type=float, default=0.95, help="of the one-sided bounds (default 0.95)")
    g.add_argument("--name", default="gate", help="the policy's name (default gate)")
    g.add_argument("--dataset", type=Path, default=None, metavar="FILE", help="JSON lines instead of the archive")
    g.add_argument("--since", default=None, metavar="ISO", help="only decisions at or after this time")
    g.add_argument("--seed", type=int, default=0, help="of the folds (default 0)")
    g.set_defaults(func=run_gate)
    r = learn.add_parser("report", help="what the policies decided and how it is going", **kw)
    _add_location(r)
    r.add_argument("--policy", type=Path, default=None, metavar="FILE", help="also show this file's evidence")
    r.add_argument("--json", action="store_true", help="one JSON object on stdout")
    r.set_defaults(func=run_report)
    m = learn.add_parser("mode", help="set the box policy's live mode in Redis", **kw)
    m.add_argument("mode", choices=("off", "shadow", "on"))
    m.add_argument("--policy", type=Path, required=True, metavar="FILE", help="the policy hitl up runs with")
    m.add_argument("--redis-url", default=None, help="default: the deployment's (<data-dir>/deployment.json)")
    m.add_argument("--data-dir", type=Path, default=None, metavar="DIR", help="data directory (default .hitl)")
    m.set_defaults(func=run_mode)
    return p


def add_auto_approve_arguments(m: Any) -> None:
    """``hitl up``'s box auto-approve flags (serve_app.ops.preflight checks them before Ray starts)."""
    m.add_argument(
        "--auto-approve",
        choices=("off", "shadow", "on"),
        default=None,
        help="the box auto-approve policy (docs/learning.md): off (default); shadow (every job waits for a person, "
        "the policy's would-be decision is recorded and compared); on (a job it approves skips the review, a "
        "--spot-check share still goes to a person; it drops itself to shadow when they show it breaks its promise)",
    )
    m.add_argument(
        "--auto-approve-policy",
        default=None,
        metavar="FILE",
        help="the policy file `hitl learn box-policy` wrote; refused in on unless its held-out evidence bounds "
        "its promise and its hash matches its content",
    )
    m.add_argument(
        "--spot-check",
        type=float,
        default=None,
        metavar="SHARE",
        help="share of the jobs the policy would approve that still go to a person, unmarked (default 0.05)",
    )
    m.add_argument(
        "--mask-spot-check",
        type=float,
        default=None,
        metavar="SHARE",
        help="share of the masks the quality gate passed that still go to the mask review, unmarked (the review "
        "then shows no gate verdict): the gate's recall on your work, in hitl learn report (default 0: off; "
        "--quality-gate review-failing only)",
    )


def _archive(args: argparse.Namespace) -> Any:
    from .db import Archive, archive_url
    from .migrate import not_ready

    data_dir = Path(args.data_dir or os.environ.get("HITL_DATA_DIR") or ".hitl").resolve()
    url = archive_url(data_dir, args.archive_url)
    problem = not_ready(url)
    if problem is not None:
        raise SystemExit(f"hitl learn: {problem}")
    return Archive(url)


def _rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    from .learn import dataset

    if getattr(args, "dataset", None):
        return [json.loads(line) for line in args.dataset.read_text().splitlines() if line.strip()]
    archive = _archive(args)
    try:
        return dataset(archive, args.since)
    finally:
        archive.close()


def run_dataset(args: argparse.Namespace) -> int:
    def run() -> int:
        rows = _rows(args)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
        kept = sum(1 for r in rows if r["unchanged"])
        print(f"learn dataset: {len(rows)} reviewed jobs ({kept} approved unchanged) in {args.out}")
        return 0

    return _needs_extra("learn dataset", "server", run)


def run_box_policy(args: argparse.Namespace) -> int:
    def run() -> int:
        from hitl_review.statecore.autoapprove import PolicyRefused, load

        from .learn import box_policy

        rows = _rows(args)
        try:
            doc = box_policy(rows, args.max_false_accept, args.confidence, args.name, seed=args.seed)
        except PolicyRefused as e:
            print(f"hitl learn box-policy: {e}", file=sys.stderr)
            return 1
        text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
        ev = doc["evidence"]
        policy = load(text, "on")  # what hitl up will load: refuse to write what it would refuse
        args.out.write_text(text)
        print(
            f"learn box-policy: {policy.ref} in {args.out}: threshold {doc['threshold']:.4f}; held out: "
            f"{ev['heldout_approved']} of {ev['heldout_jobs']} approved ({ev['approve_share']:.1%}), "
            f"{ev['heldout_false_accepts']} false accepts, upper bound {ev['false_accept_upper']:.4f} "
            f"<= {args.max_false_accept} at {args.confidence:.0%}"
        )
        return 0

    return _needs_extra("learn box-policy", "server", run)


def run_gate(args: argparse.Namespace) -> int:
    def run() -> int:
        from hitl_review.deployments.quality.gate_file import parse, ref
        from hitl_review.statecore.autoapprove import PolicyRefused

        from .learn_gate import dataset, gate_policy

        if args.dataset:
            rows = [json.loads(line) for line in args.dataset.read_text().splitlines() if line.strip()]
        else:
            archive = _archive(args)
            try:
                rows = dataset(archive, args.since)
            finally:
                archive.close()
        try:
            doc = gate_policy(rows, args.min_recall, args.target_recall, args.confidence, args.name, args.seed)
        except PolicyRefused as e:
            print(f"hitl learn gate: {e}", file=sys.stderr)
            return 1
        text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
        parse(text)  # what hitl up will load: refuse to write what it would refuse
        args.out.write_text(text)
        ev = doc["evidence"]
        print(
            f"learn gate: {ref(doc)} in {args.out}: threshold {doc['threshold']:.4f} on the probability a reviewer "
            f"accepts the mask; held out: caught {ev['heldout_caught']} of {ev['heldout_bad']} bad masks (recall "
            f"{ev['recall']:.3f}, lower bound {ev['recall_lower']:.3f}), precision {ev['precision']:.3f} (lower "
            f"bound {ev['precision_lower']:.3f}), {ev['fail_share']:.1%} of masks failed; "
            f"use it with hitl up --quality-gate-policy {args.out}"
        )
        return 0

    return _needs_extra("learn gate", "server", run)


def run_report(args: argparse.Namespace) -> int:
    def run() -> int:
        from .gate_report import gate_report, lines
        from .learn import policy_report

        archive = _archive(args)
        try:
            report = policy_report(archive, args.policy.read_text() if args.policy else None)
            report.update(gate_report(archive))  # the gate's recall from its spot checks (statecore.gate_spot)
        finally:
            archive.close()
        if args.json:
            print(json.dumps(report))
            return 0
        for line in lines(report):
            print(line)
        for ref, r in report["policies"].items():
            print(
                f"{ref}: {r['auto_approved']} jobs approved automatically; spot checks {r['spot_checks']}, "
                f"false accepts {r['spot_false_accepts']} (rate {r['spot_rate']:.4f}, 95% bound "
                f"[{r['spot_lower']:.4f}, {r['spot_upper']:.4f}]); shadow: {r['shadow_reviewed']} reviewed, "
                f"agreement {r['shadow_agreement']:.1%}, would-be false accepts {r['shadow_false_accepts']}; "
                f"reviews saved {r['auto_approved']}"
            )
        if not report["policies"]:
            print("learn report: no policy has decided anything in the archive yet")
        if report.get("file"):
            f = report["file"]
            print(f"policy file {f['ref']}: promise {f['promise']}, evidence {f['evidence']}")
        return 0

    return _needs_extra("learn report", "server", run)


def run_mode(args: argparse.Namespace) -> int:
    def run() -> int:
        import asyncio

        from hitl_review.statecore import auto_store
        from hitl_review.statecore.autoapprove import PolicyRefused, load
        from hitl_review.statecore.store import Store

        try:
            policy = load(args.policy.read_text(), args.mode)
        except (OSError, PolicyRefused) as e:
            print(f"hitl learn mode: {args.policy}: {e}", file=sys.stderr)
            return 2
        url = args.redis_url
        if not url:
            from hitl_review.serve_app.ops.config import load_deployment

            settings = load_deployment(args.data_dir or os.environ.get("HITL_DATA_DIR") or ".hitl")
            url = settings.redis_url if settings else None
        if not url:
            print("hitl learn mode: give --redis-url, or the --data-dir hitl up ran on", file=sys.stderr)
            return 2

        async def go() -> str:
            store = Store.from_url(url)
            try:
                _, mode = await auto_store.set_mode(store, "set", policy.ref, args.mode, "set by an operator", "cli")
                return mode
            finally:
                await store.close()

        print(f"learn mode: {policy.ref} is {asyncio.run(go())}")
        return 0

    return _needs_extra("learn mode", "server", run)
