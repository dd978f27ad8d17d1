"""The ``hitl`` command, built by one parser here.

``up`` and ``demo`` run the system on this machine; ``submit``, ``status``,
``watch``, ``results`` and ``jobs`` (``client.commands``) talk to a running one.
This module imports only the client's light dependencies at import time, so
``hitl submit`` works from the base install (``pip install hitl-review``); the
server (Redis, Ray Serve, the models, the UI) is imported when ``up`` or
``demo`` actually runs and needs ``pip install 'hitl-review[demo]'``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from hitl_review.archive.cli import add_export_command, add_upgrade_command
from hitl_review.archive.learn_cli import add_auto_approve_arguments, add_learn_command
from hitl_review.client.commands import HelpFormatter, add_client_commands

from .ops.public_flags import add_public_options
from .ops.webhook_flags import add_webhook_options
from .work.standalone import add_arguments as add_dispatcher_arguments

DESCRIPTION = """\
hitl-review: human-in-the-loop review for image cut-out. A detector proposes boxes, a person approves, \
moves, relabels or draws them in the reviewer UI, and the approved subjects are segmented into masks and \
cut-outs.

Server side: `hitl up` starts everything on this machine (`hitl demo` also submits sample images). Client \
side: `hitl submit` sends images and `status`, `watch`, `results` and `jobs` follow them; they only need \
the server's URL and a token. Run `hitl COMMAND --help` for a command's options."""

EPILOG = """\
examples:
  hitl up                          # embedded Redis + local Ray + API on :8000 + UI on :7860
  hitl demo                        # the same, with sample images waiting for review
  hitl up --no-ui --detector-delay-ms 80
  hitl submit photos/ --wait --out cutouts/
  hitl status JOB_ID ; hitl watch JOB_ID ; hitl results JOB_ID --out DIR

environment:
  HITL_REDIS_URL an external Redis (redis://… or redis+cluster://…) instead of the embedded one (also
                 REDIS_URL; HITL_REDIS_URL wins, as in the Serve builder)
  HITL_TOKENS    name:role:token,… (roles: submitter, reviewer, admin, executor); needed off loopback
  HITL_API_URL   the server client commands talk to (default http://127.0.0.1:8000)
  HITL_TOKEN     the token client commands send
  HITL_DATA_DIR  the data directory (default .hitl); also where `hitl export` reads
  HITL_ARTIFACTS the artifact store (default file://<data-dir>/artifacts; s3://…), also for `hitl export`
  RAY_ADDRESS    an existing Ray cluster to join
  HITL_ARCHIVE_URL  the archive of finished jobs (default <data-dir>/archive.sqlite3; postgresql://…)

installing: the client commands need only `pip install hitl-review`; `up` and `demo` need the server, \
the models and the UI: `pip install 'hitl-review[demo]'`."""

SERVER_EXTRA_HINT = "`hitl {command}` needs the server's packages: pip install 'hitl-review[demo]' (missing: {name})"


def _version() -> str:
    """This build's version: the package's own (an editable install's metadata lags behind it)."""
    from hitl_review import __version__

    return __version__


def _add_up_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("serving")
    g.add_argument(
        "--host",
        default="127.0.0.1",
        help="address the API and the UI listen on (default 127.0.0.1; any other address requires "
        "HITL_TOKENS, since the local admin token is only created for loopback)",
    )
    g.add_argument("--api-port", type=int, default=8000, metavar="PORT", help="HTTP API port (default 8000)")
    g.add_argument("--ui-port", type=int, default=7860, metavar="PORT", help="reviewer UI port (default 7860)")
    g.add_argument("--no-ui", action="store_true", help="do not start the Gradio reviewer UI (API only)")
    g.add_argument(
        "--trusted-proxy",
        action="append",
        default=None,
        metavar="CIDR",
        help="an authenticating proxy in front of the API and the UI (oauth2-proxy): the user it names in "
        "X-Forwarded-User, X-Auth-Request-User or X-Forwarded-Email is signed in, but only on connections from "
        "this address or block (the peer address, never X-Forwarded-For); repeat for several; the UI forwards "
        "its user to the API, so list the UI's own address too (127.0.0.1 on one machine). Default: none",
    )
    g.add_argument(
        "--proxy-role",
        choices=("reviewer", "submitter", "admin"),
        default=None,
        help="the role of a user a trusted proxy names (default reviewer)",
    )
    add_public_options(g)  # --public-metrics, --public-docs
    g.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR",
        help="where the embedded Redis, artifacts, logs and the local api-token live; a second `hitl "
        "up` on the same directory finds every job where it was (default $HITL_DATA_DIR or .hitl)",
    )
    g.add_argument(
        "--redis-url",
        default=None,
        metavar="URL",
        help="use this Redis (or Valkey, or redis+cluster://…) instead of starting the embedded one "
        "(default $HITL_REDIS_URL, else $REDIS_URL); it must answer and keep what it is given, else hitl up "
        "refuses in one line",
    )
    g.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="join an existing Ray cluster instead of starting a local one (default $RAY_ADDRESS): the "
        "project's packages reach the workers in the job's runtime environment, GPUs are counted from the "
        "cluster's resources, the API is where the cluster's Serve proxy listens, and stopping deletes only "
        "the `hitl` application. Unless every node is this machine, a loopback Redis, a file:// artifact "
        "store (set HITL_ARTIFACTS) and the local token file (set HITL_TOKENS) are refused",
    )
    g.add_argument(
        "--dashboard-port",
        type=int,
        default=None,
        metavar="PORT",
        help="the Ray dashboard's port on --host (default 8265, or when 8265 is taken, e.g. by another Ray "
        "on this machine, the next free one; the READY line names it; a port given here must be free; 0: "
        "any free port). With --ray-address the cluster's own dashboard is named instead",
    )
    g.add_argument("--no-dashboard", action="store_true", help="do not start the Ray dashboard")
    g.add_argument(
        "--api-replicas",
        type=int,
        default=None,
        metavar="N",
        help="replicas of the API/dispatcher deployment (default 1)",
    )
    g.add_argument(
        "--ingress",
        choices=("auto", "direct", "proxy"),
        default="auto",
        help="the HTTP path to the API. direct: the API replica itself listens on --api-port (Ray Serve's "
        "direct ingress; about uvicorn's latency); proxy: Serve's HTTP proxy listens there and forwards to "
        "the API replicas (a hop of a few ms). auto (default): direct on a Ray of our own with one API "
        "replica, proxy with --api-replicas above 1 or --ray-address. The startup log says which runs",
    )
    g.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="YAML or TOML file with per-deployment replica and autoscaling settings (see docs/config)",
    )
    g.add_argument("--verbose", "-v", action="store_true", help="debug logging (also a line per read request)")
    g.add_argument(
        "--log-format",
        choices=("json", "text"),
        default=None,
        help="how log lines are written to stderr, <data-dir>/logs/hitl.log and the replicas' logs: json (one "
        "object per line: ts, level, logger, msg, request_id, job_id, …) or text (default: text on a terminal, "
        "json otherwise)",
    )
    r = p.add_argument_group("reliability")
    r.add_argument(
        "--store-timeout-s",
        type=float,
        default=None,
        metavar="S",
        help="Redis operation timeout: a Redis that is down or hung makes every route that needs it answer "
        "503 STORE_UNAVAILABLE (with Retry-After) within this time (default 5)",
    )
    r.add_argument(
        "--durability",
        choices=["fast", "strict"],
        default=None,
        help="fast: AOF appendfsync everysec (an acknowledged change can be lost only if the machine "
        "crashes within ~1 s); strict: appendfsync always plus WAITAOF (Redis >= 7.2) or WAIT for "
        "replicas after each change, so a 200 means it is on disk (default fast)",
    )
    r.add_argument(
        "--allow-volatile-redis",
        action="store_true",
        help="start even when the external Redis (--redis-url) has persistence off or an evicting "
        "maxmemory-policy (warns loudly; without it, hitl up refuses)",
    )
    r.add_argument(
        "--max-backlog",
        type=int,
        default=None,
        metavar="N",
        help="admission control: above N node commands not yet started, POST /jobs answers 429 "
        "BACKLOG_FULL with Retry-After; interventions and cancels are never refused (default 10000; "
        "0 turns it off)",
    )
    r.add_argument(
        "--coverage-window-s",
        type=float,
        default=None,
        metavar="S",
        help="/metrics: hitl_terminal_coverage_ratio is computed over the jobs submitted in the last S "
        "seconds, 60..21600 (default 3600); the shipped alert fires below 98%% for 10 minutes",
    )
    v = p.add_argument_group("review and record")
    v.add_argument(
        "--labels",
        default=None,
        metavar="L1,L2,…",
        help="the reviewer UI's label set, comma-separated (e.g. shoe,bag,shirt); keys 1-9 pick the first nine; "
        "also `labels:` in the --config file",
    )
    v.add_argument(
        "--claim-ttl-s",
        type=float,
        default=None,
        metavar="S",
        help="a reviewer's claim on a waiting job (who is looking at it) expires unless renewed within S "
        "seconds; it never touches the pause (default 60)",
    )
    v.add_argument(
        "--retention-days",
        type=float,
        default=None,
        metavar="D",
        help="a finished job's records stay in Redis D days after the archive holds them (default 7); the "
        "archive keeps them for good",
    )
    v.add_argument(
        "--archive-url",
        default=None,
        metavar="URL",
        help="where finished jobs are archived: postgresql://… (also HITL_ARCHIVE_URL); default "
        "<data-dir>/archive.sqlite3",
    )
    v.add_argument(
        "--no-archive",
        action="store_true",
        help="do not archive finished jobs: their records expire after the retention and are gone",
    )
    add_webhook_options(p)
    n = p.add_argument_group("node lifecycle (model work; waiting for a reviewer never times out)")
    n.add_argument(
        "--node-timeout-s",
        type=float,
        default=None,
        metavar="S",
        help="maximum execution time of a node, counted from its start (never from queueing): past it "
        "the job ends TIMED_OUT (default 600)",
    )
    n.add_argument(
        "--node-timeout",
        action="append",
        default=None,
        metavar="TYPE=S",
        help="the same for one node type, e.g. --node-timeout SEGMENT_SUBJECT=900 (repeatable)",
    )
    n.add_argument(
        "--heartbeat-s",
        type=float,
        default=None,
        metavar="S",
        help="how often the model replica running a node renews its heartbeat (default 2)",
    )
    n.add_argument(
        "--heartbeat-lapse-s",
        type=float,
        default=None,
        metavar="S",
        help="a running node whose heartbeat is older than this is re-dispatched as a new attempt: "
        "its replica stopped or died (default 15)",
    )
    n.add_argument(
        "--max-attempts",
        type=int,
        default=None,
        metavar="N",
        help="starts of one node before a lost executor ends the job FAILED with EXECUTOR_LOST (default 3)",
    )
    n.add_argument(
        "--max-deliveries",
        type=int,
        default=None,
        metavar="N",
        help="a node command delivered more than N times (its dispatchers died on it) is not run again: "
        "it becomes a dead letter (hitl admin dead-letters; hitl admin replay ID) (default 10)",
    )
    n.add_argument(
        "--inspector-period-s",
        type=float,
        default=None,
        metavar="S",
        help="how often the inspector (one at a time, by lease) looks for lapsed heartbeats and "
        "passed deadlines (default 5)",
    )
    m = p.add_argument_group("models")
    m.add_argument(
        "--detector",
        default="classical",
        choices=["classical", "sam-auto", "torchvision", "null"],
        help="what proposes boxes: classical (OpenCV, no weights), sam-auto (Segment Anything's "
        "automatic masks, needs --sam-checkpoint), torchvision (needs --detector-weights) or null "
        "(two fixed boxes, no compute: measures the control plane); default classical",
    )
    m.add_argument(
        "--segmenter",
        default="classical",
        choices=["classical", "sam", "null"],
        help="what cuts out approved boxes: classical (GrabCut), sam (needs --sam-checkpoint) or null "
        "(the box is the mask, no compute); default classical",
    )
    m.add_argument(
        "--validator",
        default=None,
        choices=["classical", "sam", "null", "torchvision"],
        help="what scores hand-drawn boxes and names those sent without a label (default: the segmenter's "
        "with --segmenter sam or null, else classical; null passes every box on the image; torchvision: "
        "classical scores, names from the --detector-weights model's classifier)",
    )
    m.add_argument(
        "--sam-checkpoint",
        default=None,
        metavar="FILE",
        help="Segment Anything checkpoint (.pth); nothing is downloaded",
    )
    m.add_argument(
        "--sam-model-type",
        default="vit_b",
        metavar="TYPE",
        help="the checkpoint's architecture: vit_b, vit_l or vit_h (default vit_b)",
    )
    m.add_argument(
        "--detector-weights",
        default=None,
        metavar="FILE",
        help="torchvision detector weights (.pth) for --detector torchvision",
    )
    m.add_argument(
        "--detector-arch",
        default="fasterrcnn_resnet50_fpn",
        metavar="NAME",
        help="torchvision.models.detection architecture of those weights (default fasterrcnn_resnet50_fpn)",
    )
    m.add_argument(
        "--detector-delay-ms",
        type=int,
        default=0,
        metavar="MS",
        help="simulated model latency added to each detection, for demos and load tests (default 0)",
    )
    m.add_argument(
        "--segmenter-delay-ms",
        type=int,
        default=0,
        metavar="MS",
        help="simulated model latency added to each segmentation (one subject per SEGMENT_SUBJECT node), for "
        "demos and autoscaling tests: review bursts queue on the Segmenter deployment (default 0)",
    )
    m.add_argument(
        "--quality-gate-policy",
        default=None,
        metavar="VERSION",
        help="the quality gate's policy, recorded with every verdict on a mask: gate-v1 (default, thresholds "
        "on measured features), gate-v5 (a small network trained on the labelled benchmark; needs torch), or "
        "a file hitl learn gate wrote; docs/protocol.md § Cut-out quality",
    )
    m.add_argument(
        "--max-refinements",
        type=int,
        default=None,
        metavar="N",
        help="refinements a mask that fails the gate gets, each with another prompt strategy, 0-4 (default 2)",
    )
    m.add_argument(
        "--quality-gate",
        choices=("review-failing", "review-all", "off"),
        default=None,
        help="which cut-outs wait for a person in WAITING_MASK_REVIEW: review-failing (those the gate still "
        "fails after their refinements, or gave no verdict on; the default), review-all (every mask), off (the "
        "gate only records its verdict). Recorded in each job when it is created",
    )
    add_auto_approve_arguments(m)  # --auto-approve, --auto-approve-policy, --spot-check (docs/learning.md)


def build_parser() -> argparse.ArgumentParser:
    """The whole ``hitl`` command line: server commands here, client commands from ``client.commands``."""
    parser = argparse.ArgumentParser(prog="hitl", description=DESCRIPTION, epilog=EPILOG, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"hitl {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    up = sub.add_parser(
        "up",
        formatter_class=HelpFormatter,
        help="start Redis, Ray Serve, the API and the reviewer UI on this machine",
        description="Start everything on one machine: the embedded Redis (unless --redis-url), Ray (local, or "
        "--ray-address), the API, the Ray dashboard (unless --no-dashboard) and the reviewer UI (unless "
        "--no-ui). When it is serving it prints one line `READY api=<url> ui=<url> dashboard=<url>` "
        "(ui= and dashboard= only when they run). SIGTERM or Ctrl-C stops it in a few seconds, leaving no "
        "process behind (a second one kills what is left at once); jobs, pauses and "
        "results survive a restart on the same --data-dir.",
        epilog="Without HITL_TOKENS on a loopback address, a local admin token is written to "
        "<data-dir>/api-token (mode 0600); the UI and the client commands pick it up from there.",
    )
    _add_up_options(up)
    up.set_defaults(func=_run_up)
    demo = sub.add_parser(
        "demo",
        formatter_class=HelpFormatter,
        help="`hitl up` plus sample images submitted for review",
        description="Start everything as `hitl up` does, then submit sample images (product composites and "
        "scikit-image photographs, nothing downloaded) so that reviews are waiting in the UI. "
        "Rerunning it submits nothing twice. As with `hitl up`, the cut-outs the quality gate still "
        "fails go to a person (--quality-gate review-failing), so the whole loop shows.",
    )
    _add_up_options(demo)
    demo.set_defaults(func=_run_up)
    dispatcher = sub.add_parser(
        "dispatcher",
        formatter_class=HelpFormatter,
        help="one more outbox dispatcher next to a running deployment (models in threads)",
        description="Run an outbox dispatcher in this process, built from the deployment's settings "
        "(<data-dir>/deployment.json, written by `hitl up`): its retention, archive, node timeouts and "
        "attempts. Flags override single settings. For more dispatch capacity than the API replicas give.",
    )
    add_dispatcher_arguments(dispatcher)
    dispatcher.set_defaults(func=_run_dispatcher)
    admin_sub = add_client_commands(sub)
    add_upgrade_command(admin_sub, formatter_class=HelpFormatter)
    add_export_command(sub, formatter_class=HelpFormatter)
    add_learn_command(sub, formatter_class=HelpFormatter)
    return parser


def _run_up(args: argparse.Namespace) -> int:
    """``hitl up`` / ``hitl demo``: the server is imported only now. What cannot start is said in one
    line (``serve_app.ops.preflight``): exit status 2 for a usage error, 1 for a start that failed."""
    try:
        from .ops.launcher import settings_from_args, up
        from .ops.preflight import UpError, check, exit_code_of
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] == "hitl_review":  # our own: a broken install, not an extra
            raise
        print(SERVER_EXTRA_HINT.format(command=args.command, name=exc.name), file=sys.stderr)
        return 2
    try:  # before anything starts: a refusal leaves nothing behind
        settings = settings_from_args(args)
        check(settings)
    except UpError as e:
        print(f"hitl {args.command}: {e}", file=sys.stderr)
        return e.code
    on_ready = _demo_submitter(settings.data_dir.resolve()) if args.command == "demo" else None
    try:
        code = up(
            settings,
            ui=not args.no_ui,
            dashboard=not args.no_dashboard,
            dashboard_port=args.dashboard_port,
            on_ready=on_ready,
            verbose=args.verbose,
            ingress=args.ingress,
        )
    except UpError as e:  # everything it started is stopped by now
        print(f"hitl {args.command}: {e}", file=sys.stderr)
        code = e.code
    except SystemExit as e:
        code = exit_code_of(e)
    # Everything `up` started is stopped or killed by now. What is left is this interpreter's own
    # teardown: Ray's core worker and its threads (and a stop step abandoned past its limit) take
    # seconds on a busy machine (2.6 s measured at a load of 10), so leave at once.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run_dispatcher(args: argparse.Namespace) -> int:
    """``hitl dispatcher``: the server's packages are imported only now; a missing extra is named."""
    from .work.standalone import run

    try:
        return run(args)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] == "hitl_review":  # our own: a broken install, not an extra
            raise
        print(
            f"hitl dispatcher: needs the server's packages: pip install '.[server]' from the checkout "
            f"(missing: {exc.name})",
            file=sys.stderr,
        )
        return 2


def _demo_submitter(data_dir: Path) -> Callable[[str, str | None], None]:
    def submit(api_url: str, token: str | None) -> None:
        from hitl_review.client import HitlClient

        from .ops.samples import write_samples

        paths = write_samples(data_dir / "samples")
        with HitlClient(api_url, token) as c:
            for p in paths:
                r = c.submit(p, idempotency_key=f"demo:{p.name}")
                print(
                    f"demo: submitted {p.name} as {r.job_id}" + (" (already there)" if r.replayed else ""), flush=True
                )
        print("demo: open the UI address above and review the waiting jobs", flush=True)

    return submit


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
