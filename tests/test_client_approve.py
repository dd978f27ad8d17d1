"""``HitlClient.approve`` keeps what a pause shows, whatever its stage, on a control plane that sends
cut-outs to a person (``quality_gate="review-all"``, so that every job has a mask review whatever
the gate says; ``hitl up``'s default, review-failing, sends only those it fails): the quickstart's
``--approve`` reaches the end through a mask review too. A real redis-server and the classical
models in threads (``harness.uvicorn.LocalServer``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.ci import require_binary
from harness.tokens import TOKENS, TOKENS_SPEC
from harness.uvicorn import LocalServer
from hitl_review.client import HitlClient, new_intervention_id
from hitl_review.client.approve_calls import NothingToApprove
from hitl_review.serve_app.ops.samples import product_composite

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SEED = 12


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    require_binary("redis-server")
    s = LocalServer(tmp_path_factory.mktemp("approve"), tokens=TOKENS_SPEC, quality_gate="review-all").start()
    yield s
    s.stop()


@pytest.mark.timeout(120)
def test_approve_answers_the_box_stage_then_the_mask_review(server: LocalServer) -> None:
    with HitlClient(server.url, TOKENS["rev1"]) as rev, HitlClient(server.url, TOKENS["sub1"]) as sub:
        job = sub.submit(product_composite(seed=SEED, n=2)[0]).job_id
        waiting = rev.wait_for(job, ["WAITING_USER_SELECTION"], timeout=60)
        first = rev.approve(waiting, intervention_id=new_intervention_id())
        assert first.next_node_type == "PROCESS_APPROVED_BOX_LIST"

        review = rev.wait_for(job, ["WAITING_MASK_REVIEW", "SUCCEEDED", "PARTIAL_SUCCEEDED", "FAILED"], timeout=60)
        assert review.status == "WAITING_MASK_REVIEW" and review.active_pause is not None
        listed = [s.box_id for s in review.active_pause.subjects_to_review or ()]
        assert listed, review.active_pause

        iid = new_intervention_id()
        answer = rev.approve(review, intervention_id=iid)
        again = rev.approve(review, intervention_id=iid)  # a retry is a replay, not a second answer
        assert again.replayed and again.raw == answer.raw

        done = rev.wait_for(job, timeout=60)
        assert done.status == "SUCCEEDED", done.status
        decided = {s.box_id: s.decided_by for s in rev.results(job).subjects}
        assert set(listed) == set(decided) and None not in decided.values() and "gate" not in decided.values(), decided
        with pytest.raises(NothingToApprove):
            rev.approve(done, intervention_id=new_intervention_id())


@pytest.mark.timeout(90)
def test_quickstart_approve_goes_through_a_mask_review(server: LocalServer, tmp_path: Path) -> None:
    image = tmp_path / "box.png"
    image.write_bytes(product_composite(seed=SEED, n=2)[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith("HITL_")}
    argv = [sys.executable, str(EXAMPLES / "client_quickstart.py"), str(image), "--approve"]
    argv += ["--api-url", server.url, "--token", TOKENS["admin"]]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=80, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "approved WAITING_USER_SELECTION" in run.stdout and "approved WAITING_MASK_REVIEW" in run.stdout
    assert "ended SUCCEEDED" in run.stdout, run.stdout
