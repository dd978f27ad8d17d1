"""The quality gate's verdicts reach the job (docs/protocol.md § Cut-out quality), against a real
redis-server: a segmentation report carrying each mask's verdict and refinements is kept in the
results (with who let the mask through), announced as SUBJECT_REFINED and SUBJECT_GATED events, and
survives the round trip through the results API model; a report without verdicts (the gate off, an
older executor) reads as before."""

from __future__ import annotations

from hitl_review.statecore.models import JobResults
from hitl_review.statecore.states import JobStatus as S

from .helpers import iv, keep, report, waiting_job

PASS = {"verdict": "PASS", "reasons": [], "scores": {"fill": 0.62, "contrast": 3.1}, "policy": "gate-v1"}
FAIL = {
    "verdict": "FAIL",
    "reasons": ["the mask touches the box edge on 38% of its border where the picture goes on"],
    "scores": {"fill": 0.91, "cut_off": 0.38},
    "policy": "gate-v1",
}


async def _processing(store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    await store.intervene(job_id, iv(st, keep(st, 0, 1)), "rev")
    return job_id, await store.get(job_id)


async def test_verdicts_and_refinements_are_kept_per_subject_and_announced(store, image):
    job_id, st = await _processing(store, image)
    assert st.status == S.PROCESSING_APPROVED_SUBJECTS
    first, second = (b.box_id for b in st.approved_box_list)
    refinements = [{"strategy": "enlarged_box", "quality": FAIL}, {"strategy": "alt_multimask", "quality": FAIL}]
    subjects = [
        {"box_id": first, "status": "SUCCEEDED", "mask": "m1.png", "cutout": "c1.png", "quality": PASS},
        {
            "box_id": second,
            "status": "SUCCEEDED",
            "mask": "m2.png",
            "cutout": "c2.png",
            "quality": FAIL,
            "refinements": refinements,
        },
    ]
    n = len(await store.events_after(job_id))
    await report(store, job_id, {"subjects": subjects, "backend": "classical"})
    state = await store.get(job_id)
    assert state.status == S.FINALIZING_RESULTS
    by_id = {r.box_id: r for r in state.results}
    assert by_id[first].quality is not None and by_id[first].quality.verdict == "PASS"
    assert by_id[first].decided_by == "gate" and by_id[first].refinements == []
    kept = by_id[second]
    assert kept.quality is not None and kept.quality.verdict == "FAIL" and kept.quality.policy == "gate-v1"
    assert kept.quality.reasons == FAIL["reasons"] and kept.quality.scores == FAIL["scores"]
    assert kept.decided_by is None  # nobody vouched for this mask
    assert [r.strategy for r in kept.refinements] == ["enlarged_box", "alt_multimask"]
    events = await store.events_after(job_id, n)
    per_subject = [(e.type, e.data.get("box_id")) for e in events if e.type.startswith("SUBJECT_")]
    assert per_subject == [
        ("SUBJECT_SEGMENTED", first),
        ("SUBJECT_GATED", first),
        ("SUBJECT_SEGMENTED", second),
        ("SUBJECT_REFINED", second),
        ("SUBJECT_REFINED", second),
        ("SUBJECT_GATED", second),
    ]
    gated = [e.data for e in events if e.type == "SUBJECT_GATED"]
    assert [(g["verdict"], g["policy"]) for g in gated] == [("PASS", "gate-v1"), ("FAIL", "gate-v1")]
    refined = [e.data for e in events if e.type == "SUBJECT_REFINED"]
    assert [(r["refinement"], r["strategy"], r["quality"]["verdict"]) for r in refined] == [
        (1, "enlarged_box", "FAIL"),
        (2, "alt_multimask", "FAIL"),
    ]
    # What GET /results answers parses back with every field.
    await report(store, job_id, {})
    done = await store.get(job_id)
    assert done.status == S.SUCCEEDED
    res = JobResults(job_id=job_id, status=done.status, subjects=done.results)
    again = JobResults.model_validate_json(res.model_dump_json())
    assert again.subjects[1].refinements[0].quality.reasons == FAIL["reasons"]


async def test_a_report_without_verdicts_reads_as_before(store, image):
    job_id, st = await _processing(store, image)
    subjects = [
        {"box_id": b.box_id, "status": "SUCCEEDED", "mask": "m.png", "cutout": "c.png"} for b in st.approved_box_list
    ]
    n = len(await store.events_after(job_id))
    await report(store, job_id, {"subjects": subjects})
    state = await store.get(job_id)
    assert all(r.quality is None and r.decided_by is None and r.refinements == [] for r in state.results)
    types = [e.type for e in await store.events_after(job_id, n)]
    assert "SUBJECT_GATED" not in types and "SUBJECT_REFINED" not in types
    assert types.count("SUBJECT_SEGMENTED") == 2


async def test_a_verdict_outside_the_contract_fails_the_node_not_the_store(store, image):
    job_id, st = await _processing(store, image)
    bad = {**PASS, "verdict": "MAYBE"}
    subjects = [{"box_id": st.approved_box_list[0].box_id, "status": "SUCCEEDED", "mask": "m", "quality": bad}]
    await report(store, job_id, {"subjects": subjects})
    state = await store.get(job_id)
    # That subject's node fails (one node per subject): the subject FAILED, the job goes on without it.
    assert state.status != S.FAILED and state.results[0].status == "FAILED"
    assert state.results[0].reason == "INVALID_NODE_OUTPUT"


def test_hitl_results_shows_each_subjects_verdict_reasons_and_refinements():
    import io

    from rich.console import Console

    from hitl_review.client.cli_jobs import print_results

    res = JobResults.model_validate(
        {
            "job_id": "job_q",
            "status": "SUCCEEDED",
            "subjects": [
                {
                    "box_id": "box_a",
                    "bbox": [1, 2, 30, 40],
                    "status": "SUCCEEDED",
                    "quality": PASS,
                    "decided_by": "gate",
                },
                {
                    "box_id": "box_b",
                    "bbox": [5, 5, 50, 60],
                    "status": "SUCCEEDED",
                    "quality": FAIL,
                    "refinements": [{"strategy": "enlarged_box", "quality": FAIL}],
                    "attempts": 2,
                },
                {"box_id": "box_c", "bbox": [0, 0, 9, 9], "status": "REJECTED", "reason": "not a product"},
            ],
        }
    )
    buf = io.StringIO()
    print_results(res, Console(file=buf, width=250, highlight=False))
    rows = {line.split("│")[1].strip(): line for line in buf.getvalue().splitlines() if "box_" in line}
    assert "PASS (gate-v1, decided by gate)" in rows["box_a"]
    assert "FAIL after 1 refinement(s): enlarged_box (gate-v1)" in rows["box_b"]
    assert "touches the box edge on 38%" in buf.getvalue()
    assert "cut_off 0.38" in buf.getvalue()  # the gate's scores, as recorded
    assert rows["box_c"].split("│")[7].strip() == "-"  # no gate judged a rejected box
    assert rows["box_b"].split("│")[4].strip() == "2"  # its subject node's starts: one retry
    assert rows["box_c"].split("│")[4].strip() == "-"  # never segmented


def test_hitl_job_lists_the_nodes_cutting_the_subjects_side_by_side():
    import io

    from rich.console import Console

    from hitl_review.client.cli_jobs import print_snapshot
    from hitl_review.statecore.models import JobSnapshot

    node = {"node_type": "SEGMENT_SUBJECT", "status": "RUNNING", "attempt": 1}
    snap = JobSnapshot.model_validate(
        {
            "job_id": "job_s",
            "status": "PROCESSING_APPROVED_SUBJECTS",
            "version": 4,
            "round": 1,
            "created_at": "2026-12-04T08:00:00Z",
            "updated_at": "2026-12-04T08:00:01Z",
            "image": {"sha256": "a" * 64, "width": 64, "height": 48, "url": "/api/v1/artifacts/x.png"},
            "box_list": [],
            "approved_box_list": [],
            "active_pause": None,
            "pending_actions": [],
            "current_node": None,
            "subject_nodes": [
                {**node, "node_instance_id": "node_a", "box_id": "box_a"},
                {**node, "node_instance_id": "node_b", "box_id": "box_b", "status": "RETRY_WAIT", "attempt": 1},
            ],
        }
    )
    buf = io.StringIO()
    print_snapshot(snap, Console(file=buf, width=200, highlight=False))
    out = buf.getvalue()
    assert "box_a: RUNNING (attempt 1, node_a)" in out
    assert "box_b: RETRY_WAIT (attempt 1, node_b)" in out
