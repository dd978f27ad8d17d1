"""Manual boxes are named before segmentation, whoever sends them (docs/protocol.md § Second round,
seed 000: "有手工框 → 先命名校验"). A manual box without a label reaches the validator, which names it
when its backend can (the label and who named it recorded on the box), or sends it back in round 2
with the reason "name this box"; a box still unlabelled in round 2 is rejected with that reason.
Real redis-server; the API through the project's client (ASGI, no Ray); the validator node run by the
executor with the real classical backend on the job's stored image."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from PIL import Image

from harness.tokens import TOKENS
from hitl_review.client import AsyncHitlClient, new_intervention_id
from hitl_review.deployments.backends.classical import ClassicalValidator
from hitl_review.deployments.executor import Models, run_node
from hitl_review.serve_app.ops.config import Settings
from hitl_review.statecore.artifacts import ArtifactStore
from hitl_review.statecore.models import JobSnapshot
from hitl_review.statecore.nodes import NAME_THIS_BOX
from hitl_review.statecore.states import JobStatus as S

from .asgi_util import BASE_URL, asgi_transport
from .helpers import iv, keep, report, validate, waiting_job

OBJECT = [30, 90, 210, 230]  # around the red ellipse
BLANK = [10, 260, 200, 295]  # plain background: nothing to name


def _photo() -> bytes:
    """A product photo: two objects on a plain, slightly noisy studio background (420 x 300)."""
    rng = np.random.default_rng(3)
    img = np.clip(rng.normal(238, 3, (300, 420, 3)), 0, 255).astype(np.uint8)
    cv2.ellipse(img, (120, 160), (80, 50), 15, 0, 360, (180, 30, 40), -1)
    cv2.rectangle(img, (260, 60), (380, 250), (30, 80, 160), -1)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "PNG")
    return buf.getvalue()


async def _run_validator(store: Any, job_id: str, artifacts: ArtifactStore) -> dict[str, Any]:
    """Run the job's VALIDATE_MANUAL_BOX_LIST node with the classical validator and report its output."""
    st = await store.get(job_id)
    assert st.status == S.VALIDATING_MANUAL_BOXES and st.node_input is not None
    out = run_node("VALIDATE_MANUAL_BOX_LIST", st.node_input, Models(validator=ClassicalValidator()), artifacts)
    assert await report(store, job_id, out) == "OK"
    return out


async def _submit(rev: AsyncHitlClient, snap: JobSnapshot, subjects: list[dict[str, Any]]) -> Any:
    assert snap.active_pause is not None
    return await rev.intervene(
        snap.job_id,
        intervention_id=new_intervention_id(),
        pause_token=snap.active_pause.pause_token,
        base_version=snap.version,
        subjects=subjects,
    )


async def test_an_unlabelled_manual_box_sent_through_the_client_is_named_or_sent_back(
    store: Any, redis_server: Any, tmp_path: Path
) -> None:
    artifacts = ArtifactStore(Settings(data_dir=tmp_path).artifacts)
    async with asgi_transport(redis_server.url, tmp_path) as transport:
        sub = AsyncHitlClient(BASE_URL, TOKENS["sub1"], transport=transport)
        rev = AsyncHitlClient(BASE_URL, TOKENS["rev1"], transport=transport)
        try:
            named, unnamed = [(await sub.submit(_photo())).job_id for _ in range(2)]
            for job_id in (named, unnamed):  # the detector found nothing: the reviewer draws the subject
                assert await report(store, job_id, {"boxes": []}) == "OK"

            # (a) a box the classical backend names with confidence: labelled, approved, segmented next
            answer = await _submit(rev, await rev.get_job(named), [{"bbox": OBJECT}])
            assert answer.next_node_type == "VALIDATE_MANUAL_BOX_LIST"
            out = await _run_validator(store, named, artifacts)
            (verdict,) = out["results"]
            assert verdict["passed"] is True and verdict["label"] == "object", verdict
            snap = await rev.get_job(named)
            assert snap.status == S.PROCESSING_APPROVED_SUBJECTS
            (box,) = snap.approved_box_list
            assert box.source == "manual" and box.label == "object" and box.target_policy == "SEGMENT"
            assert box.validation is not None and box.validation.status == "PASSED"
            assert box.validation.label_source == "classical"
            assert box.validation.label_score is not None and box.validation.label_score >= 0.5

            # (b) a box nobody can name goes back to the reviewer in round 2: "name this box"
            answer = await _submit(rev, await rev.get_job(unnamed), [{"bbox": BLANK}])
            (box_id,) = answer.diff.added
            await _run_validator(store, unnamed, artifacts)
            snap = await rev.get_job(unnamed)
            assert snap.status == S.WAITING_BOX_BATCH_REVISION and snap.active_pause is not None
            assert snap.active_pause.round == 2 and snap.active_pause.box_ids_to_revise == [box_id]
            (box,) = snap.box_list
            assert box.label is None and box.validation is not None
            assert box.validation.status == "NEEDS_REVISION"
            assert box.validation.reason is not None and box.validation.reason.startswith(NAME_THIS_BOX)
            assert snap.approved_box_list == []

            # Round 2's rules are unchanged: the reviewer supplies the label; still none -> REJECTED, same reason.
            await _submit(rev, snap, [{"box_id": box_id, "bbox": BLANK}])
            await _run_validator(store, unnamed, artifacts)
            done = await rev.get_job(unnamed)
            assert (done.status, done.reason_code) == (S.FAILED, "ALL_REJECTED")
            (box,) = done.box_list
            assert box.validation is not None and box.validation.status == "REJECTED"
            assert box.validation.reason is not None and box.validation.reason.startswith(NAME_THIS_BOX)
        finally:
            await sub.aclose()
            await rev.aclose()


async def test_the_control_plane_never_approves_an_unlabelled_manual_box(store: Any, image: Any) -> None:
    """A validator that passes an unlabelled box without naming it (an executor of an earlier build, a
    backend that cannot name) does not get it segmented: round 1 sends it back, round 2 rejects it."""
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    subjects = keep(st, 0) + [{"bbox": [300, 300, 400, 400]}, {"bbox": [500, 300, 600, 400], "label": "bag"}]
    body = json.loads((await store.intervene(job_id, iv(st, subjects), "rev")).body)
    assert body["next_node_type"] == "VALIDATE_MANUAL_BOX_LIST"
    unlabelled, labelled = body["diff"]["added"]
    assert await validate(store, job_id, {unlabelled: True, labelled: True}) == "OK"
    st2 = await store.get(job_id)
    assert st2.status == S.WAITING_BOX_BATCH_REVISION
    assert st2.active_pause is not None and st2.active_pause.box_ids_to_revise == [unlabelled]
    by_id = {b.box_id: b for b in st2.box_list}
    assert by_id[unlabelled].validation is not None and by_id[unlabelled].validation.status == "NEEDS_REVISION"
    assert (by_id[unlabelled].validation.reason or "").startswith(NAME_THIS_BOX)
    assert by_id[labelled].validation is not None and by_id[labelled].validation.status == "PASSED"
    assert [b.box_id for b in st2.approved_box_list] == [st.box_list[0].box_id, labelled]

    # Round 2 with the box still unlabelled (and the validator passing it again): rejected, the rest goes on.
    keep_all = [{"box_id": b.box_id, "bbox": list(b.bbox)} for b in st2.box_list]
    await store.intervene(job_id, iv(st2, keep_all), "rev")
    assert await validate(store, job_id, {unlabelled: True}) == "OK"
    st3 = await store.get(job_id)
    assert st3.status == S.PROCESSING_APPROVED_SUBJECTS
    box = {b.box_id: b for b in st3.box_list}[unlabelled]
    assert box.validation is not None and box.validation.status == "REJECTED"
    assert (box.validation.reason or "").startswith(NAME_THIS_BOX)
    assert unlabelled not in {b.box_id for b in st3.approved_box_list}


def test_validator_torchvision_is_built_from_the_detector_weights() -> None:
    """``hitl up --validator torchvision --detector-weights W``: the BoxValidator gets the weights and the
    architecture to name boxes with; the other validators never see them."""
    from hitl_review.deployments.executor import backend_kwargs

    tv = Settings(validator="torchvision", detector_weights="/w/frcnn.pth", detector_arch="fasterrcnn_resnet50_fpn")
    assert backend_kwargs(tv.backend_config()["validator"]) == (
        "torchvision",
        {"weights": "/w/frcnn.pth", "arch": "fasterrcnn_resnet50_fpn"},
    )
    classical = Settings(detector="torchvision", detector_weights="/w/frcnn.pth")
    assert backend_kwargs(classical.backend_config()["validator"]) == ("classical", {})
