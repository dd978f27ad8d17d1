"""Two dispatchers on one consumer group (as with two API replicas): every node runs and is
applied exactly once, whichever dispatcher takes it."""

from __future__ import annotations

import httpx

from harness.sse import read_events
from harness.tokens import TOKENS_SPEC, auth
from harness.uvicorn import LocalServer
from hitl_review.serve_app.ops.samples import product_composite

from .api_util import intervene, keep_all, submit, wait_status


def test_two_dispatchers_apply_each_node_once(tmp_path):
    server = LocalServer(tmp_path, tokens=TOKENS_SPEC, dispatchers=2).start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            ids = [
                submit(c, product_composite(seed=40 + i, width=240, height=180)[0]).json()["job_id"] for i in range(8)
            ]
            for job_id in ids:
                snap = wait_status(c, job_id, {"WAITING_USER_SELECTION"})
                assert intervene(c, job_id, snap, keep_all(snap)).status_code == 200
            for job_id in ids:
                assert wait_status(c, job_id)["status"] == "SUCCEEDED"
                types = [e["type"] for e in read_events(c, job_id, headers=auth("rev1"))]
                # detect, one node per approved subject (statecore.subjects), finalize
                nodes = 2 + len(snap["box_list"])
                assert types.count("NODE_COMPLETED") == nodes, types
                assert types.count("NODE_STARTED") == nodes and "REPORT_IGNORED" not in types
    finally:
        server.stop()
