"""The Python client in one page: submit an image, watch its events, read and download the results.

    .venv/bin/hitl up                                  # in another terminal: the server
    .venv/bin/python examples/client_quickstart.py photo.png --out cutouts/

The job pauses for a person: review it in the UI (the READY line's ui= address) and the script goes
on by itself. ``--approve`` has the script answer the pause itself, keeping the model's boxes and, in
a mask review, the masks the quality gate failed (what a reviewer submitting without an edit does;
for a try-out, never for real work). The server and
token come from ``--api-url``/``--token``, else ``HITL_API_URL``/``HITL_TOKEN``, else the local
``hitl up``'s ``<data-dir>/api-token``, as for the ``hitl`` client commands.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hitl_review.client import HitlClient, idempotency_key, new_intervention_id, resolve_config

FINISHED_WELL = {"SUCCEEDED", "PARTIAL_SUCCEEDED", "EMPTY_SELECTION"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="examples/client_quickstart.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("image", type=Path, help="a PNG or JPEG to cut out")
    ap.add_argument("--out", type=Path, default=None, metavar="DIR", help="download the masks and cut-outs here")
    ap.add_argument(
        "--approve",
        action="store_true",
        help="answer each pause here, keeping the model's boxes (in a mask review, its masks)",
    )
    ap.add_argument("--api-url", default=None, metavar="URL", help="default $HITL_API_URL or http://127.0.0.1:8000")
    ap.add_argument("--token", default=None, help="default $HITL_TOKEN, else <data-dir>/api-token")
    args = ap.parse_args(argv)

    config = resolve_config(args.api_url, args.token)
    with HitlClient.from_config(config) as client:
        # 1. Submit. The idempotency key (from the bytes) makes a rerun return the same job.
        data = args.image.read_bytes()
        job = client.submit(data, filename=args.image.name, idempotency_key=idempotency_key(data, "quickstart"))
        print(f"submitted {args.image.name}: {job.job_id} ({'replayed' if job.replayed else job.status})")

        # 2. Watch. events() replays the history, then follows live ones (resuming by itself after
        #    a dropped connection) and ends after JOB_FINISHED.
        for event in client.events(job.job_id):
            print(f"  event {event.id:>3} {event.type:<22} version {event.version}")
            if event.type == "PAUSE_OPENED":
                if not args.approve:
                    print("  waiting for a reviewer (open the UI)")
                    continue
                snapshot = client.get_job(job.job_id)  # the pause as it is now, with its token
                if snapshot.active_pause is None:  # answered meanwhile (by someone in the UI)
                    continue
                # Keep what the pause shows: every box the model proposed or, in a mask review
                # (a cut-out the quality gate failed), every mask. The same id makes a retry safe.
                answer = client.approve(snapshot, intervention_id=new_intervention_id())
                print(f"  approved {snapshot.active_pause.stage}: now {answer.status}")

        # 3. Results: one entry per approved box, with its mask and cut-out.
        results = client.results(job.job_id)
        print(f"{job.job_id} ended {results.status}")
        for subject in results.subjects:
            print(f"  {subject.box_id} {subject.label or '-'} {subject.status} bbox={subject.bbox}")
            if args.out is not None and subject.cutout_url and subject.mask_url:
                args.out.mkdir(parents=True, exist_ok=True)
                for kind, url in (("cutout", subject.cutout_url), ("mask", subject.mask_url)):
                    path = args.out / f"{kind}_{subject.box_id}.png"
                    path.write_bytes(client.download(url))
                    print(f"    wrote {path}")
        return 0 if results.status in FINISHED_WELL else 1


if __name__ == "__main__":
    sys.exit(main())
