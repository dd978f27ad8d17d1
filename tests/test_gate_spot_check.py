"""Spot checks of masks the quality gate passed (statecore.gate_spot, SPEC §14, docs/protocol.md § Cut-out
quality) against a real redis-server: the share drawn, a blind mask review in which a spot check looks like
a failure, the person's decision recorded against the gate, and ``hitl learn report``'s recall with its
exact bound from the archived events."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools

import pytest
import pytest_asyncio
from scipy.stats import beta

from harness.executor import report
from hitl_review.archive.archiver import archive_job
from hitl_review.archive.gate_report import gate_report
from hitl_review.serve_app.routes.events import EventHub
from hitl_review.statecore import auto_store, gate_spot
from hitl_review.statecore.models import Event
from hitl_review.statecore.states import JobStatus as S
from hitl_review.statecore.store import Store, StoreConfig
from hitl_review.ui.mask_review import MaskReview, mask_panel_from_snapshot, subject_md

from .helpers import iv, keep, waiting_job
from .test_mask_review_state import FAIL, PASS, _outcome, decide


def _salts(seed: str):
    n = itertools.count()
    return lambda: f"{seed}-{next(n)}"


async def _store(url: str, share: float, seed: str = "s") -> Store:
    cfg = StoreConfig(
        retention_s=3600,
        node_timeout_s=60,
        quality_gate="review-failing",
        mask_spot_check=share,
        mask_spot_salt=_salts(seed),
    )
    s = Store.from_url(url, cfg)
    await s.ensure_groups()
    return s


@pytest_asyncio.fixture
async def stores(redis_server):
    made: list[Store] = []

    async def make(share: float, seed: str = "s") -> Store:
        s = await _store(redis_server.url, share, seed)
        made.append(s)
        return s

    first = await make(0.0)
    await first.r.flushdb()
    await first.ensure_groups()
    yield make
    for s in made:
        await s.close()


async def _segmented(store: Store, image, qualities: list[dict | None]) -> tuple[str, list[str]]:
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    await store.intervene(job_id, iv(st, keep(st, *range(len(qualities)))), "rev")
    st = await store.get(job_id)
    ids = [b.box_id for b in st.approved_box_list]
    subjects = [_outcome(b, q, n) for n, (b, q) in enumerate(zip(ids, qualities, strict=True))]
    assert await report(store, job_id, {"subjects": subjects, "backend": "classical"}) == "OK"
    return job_id, ids


async def test_the_share_of_passed_masks_sent_to_a_person_lies_in_its_exact_interval(stores, image) -> None:
    s = await stores(0.3)
    drawn = total = 0
    for _ in range(25):  # 50 masks through Redis; the pure draw below takes 20,000
        job_id, ids = await _segmented(s, image, [PASS, PASS])
        st = await s.get(job_id)
        listed = {x.box_id for x in (st.active_pause.subjects_to_review or [])} if st.active_pause else set()
        assert st.status == (S.WAITING_MASK_REVIEW if listed else S.FINALIZING_RESULTS)
        drawn += len(listed)
        total += len(ids)
    lo, hi = beta.ppf(0.005, drawn, total - drawn + 1), beta.ppf(0.995, drawn + 1, total - drawn)
    assert 0 < drawn < total and lo <= 0.3 <= hi, (drawn, total, lo, hi)
    # The same draw on the pure side, over many more subjects: 20,000 at 5 %.
    n = 20_000
    k = sum(gate_spot.draw("salt", "job", f"b{i}") < 0.05 for i in range(n))
    assert beta.ppf(0.005, k, n - k + 1) <= 0.05 <= beta.ppf(0.995, k + 1, n - k), k
    # Off (share 0) or in review-all, no job records a share or a salt.
    assert gate_spot.policy_fields(0.0, "review-failing") == gate_spot.policy_fields(0.5, "review-all") == {}


async def test_a_spot_check_looks_like_a_failure_and_the_decision_is_recorded_against_the_gate(stores, image) -> None:
    s = await stores(1.0)  # every passed mask is checked
    job_id, (good, bad) = await _segmented(s, image, [PASS, FAIL])
    st = await s.get(job_id)
    assert st.status == S.WAITING_MASK_REVIEW
    listed = st.active_pause.subjects_to_review or []  # type: ignore[union-attr]
    assert [x.box_id for x in listed] == [good, bad]
    a, b = (x.model_dump(mode="json") for x in listed)
    # Nothing tells them apart: no verdict, the same words.
    assert a["quality"] is None and b["quality"] is None and a["reason"] == b["reason"] == gate_spot.BLIND
    assert {k for k, v in a.items() if v is not None} == {k for k, v in b.items() if v is not None}
    snap = st.snapshot().model_dump(mode="json")
    shown = {x["box_id"]: x for x in snap["subjects"]}
    assert shown[good]["quality"] is None and shown[bad]["quality"] is None
    assert shown[good]["refinements"] == shown[bad]["refinements"] == [] and shown[good]["decided_by"] is None
    assert "spot" not in str(snap) and "spot" not in st.active_pause.model_dump_json()  # type: ignore[union-attr]
    # What the reviewer page says of each: the same words, no verdict (ui.mask_review).
    review = MaskReview(mask_panel_from_snapshot(st.snapshot()))  # type: ignore[arg-type]
    said = []
    for x in listed:
        review.show(x.box_id)
        said.append(subject_md(review).replace(x.box_id, "<id>").split("\n\n", 1)[1])
    assert said[0] == said[1] == f"**The quality gate:** {gate_spot.BLIND}"
    # The person rejects the mask the gate passed and accepts the one it failed.
    decisions = [{"box_id": good, "decision": "REJECT", "reason": "cut off"}, {"box_id": bad, "decision": "ACCEPT"}]
    assert (await s.intervene(job_id, decide(st, decisions), "rev")).status_code == 200
    events = [e for e in await s.events_after(job_id) if e.type == gate_spot.EVENT]
    assert [{k: v for k, v in e.data.items() if k != "status"} for e in events] == [
        {"policy": "gate-v1", "box_id": good, "decision": "REJECT", "false_accept": True}
    ]
    assert await auto_store.gate_counts(s.r) == {"gate_spot": 1, "gate_spot_fa": 1}
    # The hidden verdict is still the job's: after the review, the results say what the gate said.
    assert {r.box_id: r.quality.verdict for r in (await s.get(job_id)).results if r.quality} == {
        good: "PASS",
        bad: "FAIL",
    }


async def _live_stream(s: Store, job_id: str) -> list[Event]:
    """The job's event stream as an API client reads it (GET /jobs/{id}/events), up to its last event."""
    last = (await s.events_after(job_id))[-1].id
    hub = EventHub(s)
    got: list[Event] = []
    async with contextlib.aclosing(hub.stream(job_id)) as stream:
        async for ev in stream:
            got.append(ev)
            if ev.id >= last:
                break
    for t in hub._tasks:
        t.cancel()
    return got


def _verdict_events(events: list[Event], box_id: str) -> list[tuple[str, dict]]:
    """A subject's verdict-carrying events with what names the subject taken out (and the job's status
    the event was written in, but for SUBJECT_SEGMENTED whose status is the subject's: the last subject's
    verdict is written as the job moves on)."""
    out = []
    for e in events:
        if e.type in gate_spot.VERDICT_EVENTS and e.data.get("box_id") == box_id:
            names = (
                "box_id",
                "mask_url",
                "cutout_url",
                "name",
                "bbox",
                *(() if e.type == "SUBJECT_SEGMENTED" else ("status",)),
            )
            data = {k: v for k, v in e.data.items() if k not in names}
            out.append((e.type, data))
    return out


async def test_a_blind_job_s_event_stream_does_not_tell_a_spot_check_from_a_failure(stores, image) -> None:
    s = await stores(1.0)
    job_id, (good, bad) = await _segmented(s, image, [PASS, FAIL])
    assert (await s.get(job_id)).status == S.WAITING_MASK_REVIEW
    stored = await s.events_after(job_id)
    # What Redis keeps still says which mask passed (the archive and `hitl learn` read it) ...
    assert [e.data["verdict"] for e in stored if e.type == "SUBJECT_GATED"] == ["PASS", "FAIL"]
    live = await _live_stream(s, job_id)
    assert [e.id for e in live] == [e.id for e in stored]
    # ... and the stream a client reads does not: the two subjects' events read alike.
    a, b = _verdict_events(live, good), _verdict_events(live, bad)
    assert a and a == b, (a, b)
    assert "PASS" not in str(a) and "FAIL" not in str(b) and "gate" not in str([x for _t, x in a if "decided_by" in x])
    # Nor does the snapshot of a blind job before its mask review (a page opened while the masks were
    # made): a mask the gate passed shows no verdict and no "gate" as who let it through.
    st = await s.get(job_id)
    making = [r.model_copy(update={"status": "SUCCEEDED", "decided_by": "gate"}) for r in st.results]
    before = dataclasses.replace(st, status=S.PROCESSING_APPROVED_SUBJECTS, results=making)
    for x in before.snapshot().model_dump(mode="json")["subjects"]:
        assert x["quality"] is None and x["refinements"] == [] and x["decided_by"] is None, x
    # Once the job has ended, its results are whole (see the test above).
    # Without spot checks the stream carries the verdicts.
    plain = await stores(0.0)
    job_id, (_, bad) = await _segmented(plain, image, [PASS, FAIL])
    gated = [e.data for e in await _live_stream(plain, job_id) if e.type == "SUBJECT_GATED"]
    assert [g["verdict"] for g in gated] == ["PASS", "FAIL"]


async def test_without_spot_checks_the_review_shows_the_gate_s_verdict(stores, image) -> None:
    s = await stores(0.0)
    job_id, (_, bad) = await _segmented(s, image, [PASS, FAIL])
    st = await s.get(job_id)
    listed = st.active_pause.subjects_to_review or []  # type: ignore[union-attr]
    assert [x.box_id for x in listed] == [bad] and listed[0].quality and listed[0].quality.verdict == "FAIL"
    assert gate_spot.SALT not in st.policy


async def test_learn_report_gives_the_gate_s_recall_with_its_exact_bound(stores, image, archive) -> None:
    checked = await stores(1.0, "a")
    rarely = await stores(1e-12, "b")  # spot checks on, none drawn: passed masks of the population
    plan = [  # (the spot check's decision, the failed mask's decision)
        ("REJECT", "REJECT"),
        ("ACCEPT", "REJECT"),
        ("ACCEPT", "ACCEPT"),
    ]
    jobs = []
    for spot, failed in plan:
        job_id, (good, bad) = await _segmented(checked, image, [PASS, FAIL])
        st = await checked.get(job_id)
        ds = [
            {"box_id": good, "decision": spot, **({"reason": "bad"} if spot == "REJECT" else {})},
            {"box_id": bad, "decision": failed, **({"reason": "bad"} if failed == "REJECT" else {})},
        ]
        assert (await checked.intervene(job_id, decide(st, ds), "rev")).status_code == 200
        jobs.append(job_id)
    quiet, _ = await _segmented(rarely, image, [PASS, PASS])
    assert (await rarely.get(quiet)).status == S.FINALIZING_RESULTS
    unchecked = await stores(0.0)  # a job without spot checks is not in the population
    outside, _ = await _segmented(unchecked, image, [PASS, FAIL])
    for job_id in [*jobs, quiet, outside]:
        await checked.cancel(job_id, "admin")
        await archive_job(checked, archive, job_id)
    got = gate_report(archive)["gates"]["gate-v1"]
    # 5 passed masks, 3 checked, 1 of them bad; 3 failed, 2 of them bad (one false alarm).
    assert (got["passed"], got["spot_checks"], got["spot_false_accepts"]) == (5, 3, 1)
    assert (got["failed"], got["failed_reviewed"], got["failed_bad"]) == (3, 3, 2)
    lo_q, hi_q = beta.ppf(0.025, 1, 3), beta.ppf(0.975, 2, 2)
    assert got["recall"] == pytest.approx(2 / (2 + 5 * 1 / 3))
    assert got["recall_lower"] == pytest.approx(2 / (2 + 5 * hi_q))
    assert got["recall_upper"] == pytest.approx(2 / (2 + 5 * lo_q))
    assert got["precision"] == pytest.approx(2 / 3)
