"""The `hitl` command: `up` and `demo` run the system; the client commands
(`submit`, `status`, `watch`, `results`, `jobs`) talk to a running one."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

EPILOG = """\
examples:
  hitl up                          # embedded Redis + local Ray + API on :8000 + UI on :7860
  hitl demo                        # the same, with sample images waiting for review
  hitl up --no-ui --detector-delay-ms 80
  hitl submit photos/ --wait --out cutouts/
  hitl status JOB_ID ; hitl watch JOB_ID ; hitl results JOB_ID --out DIR

environment: REDIS_URL (external Redis or redis+cluster://...), HITL_TOKENS (name:role:token,...),
             HITL_API_URL, HITL_TOKEN, HITL_DATA_DIR, RAY_ADDRESS
"""


def _add_up_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("serving")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; anything "
                   "else requires HITL_TOKENS)")
    g.add_argument("--api-port", type=int, default=8000, help="HTTP API port (default 8000)")
    g.add_argument("--ui-port", type=int, default=7860, help="reviewer UI port (default 7860)")
    g.add_argument("--no-ui", action="store_true", help="do not start the Gradio reviewer UI")
    g.add_argument("--data-dir", default=None, help="state, artifacts and logs (default .hitl or HITL_DATA_DIR)")
    g.add_argument("--redis-url", default=None, help="use this Redis instead of the embedded one (REDIS_URL)")
    g.add_argument("--ray-address", default=None, help="join an existing Ray cluster (RAY_ADDRESS)")
    g.add_argument("--dashboard", action="store_true", help="start the Ray dashboard (http://127.0.0.1:8265)")
    g.add_argument("--api-replicas", type=int, default=None, help="API/dispatcher replicas (default 1)")
    g.add_argument("--config", default=None, help="YAML/TOML file with per-deployment autoscaling settings")
    g.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    m = p.add_argument_group("models")
    m.add_argument("--detector", default="classical", choices=["classical", "sam-auto", "torchvision"],
                   help="detector backend (default classical: OpenCV, no weights)")
    m.add_argument("--segmenter", default="classical", choices=["classical", "sam"],
                   help="segmenter backend (default classical: GrabCut)")
    m.add_argument("--validator", default=None, choices=["classical", "sam"],
                   help="box validator backend (default: sam with --segmenter sam, else classical)")
    m.add_argument("--sam-checkpoint", default=None, help="Segment Anything checkpoint file (.pth)")
    m.add_argument("--sam-model-type", default="vit_b", help="vit_b | vit_l | vit_h (default vit_b)")
    m.add_argument("--detector-weights", default=None, help="torchvision detector weights file (.pth)")
    m.add_argument("--detector-arch", default="fasterrcnn_resnet50_fpn",
                   help="torchvision.models.detection architecture for --detector torchvision")
    m.add_argument("--detector-delay-ms", type=int, default=0,
                   help="simulated model latency added to detection (demos, load tests)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hitl", description="hitl-review: human-in-the-loop review for image cut-out.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    up = sub.add_parser("up", help="start Redis, Ray Serve, the API and the reviewer UI on this machine",
                        description="Start everything on one machine; prints `READY api=<url> ui=<url>` when "
                        "serving. SIGTERM or Ctrl-C stops it cleanly.")
    _add_up_options(up)
    demo = sub.add_parser("demo", help="`hitl up` plus sample images submitted for review",
                          description="Start everything and submit sample images (product composites and "
                          "scikit-image photographs) so reviews are waiting in the UI.")
    _add_up_options(demo)
    try:
        from client.commands import add_client_commands
    except ImportError:  # the client package is optional for serving
        add_client_commands = None
    if add_client_commands is not None:
        add_client_commands(sub)
    return parser


def _demo_submitter(data_dir: Path) -> Any:
    def submit(api_url: str, token: str | None) -> None:
        from client import HitlClient

        from .samples import write_samples

        paths = write_samples(data_dir / "samples")
        c = HitlClient(api_url, token)
        for p in paths:
            r = c.submit(p, idempotency_key=f"demo:{p.name}")
            print(f"demo: submitted {p.name} as {r.job_id}" + (" (already there)" if r.replayed else ""),
                  flush=True)
        print("demo: open the UI address above and review the waiting jobs", flush=True)

    return submit


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in ("up", "demo"):
        from .launcher import settings_from_args, up

        settings = settings_from_args(args)
        on_ready = _demo_submitter(settings.data_dir.resolve()) if args.command == "demo" else None
        return up(settings, ui=not args.no_ui, dashboard=args.dashboard, on_ready=on_ready, verbose=args.verbose)
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
