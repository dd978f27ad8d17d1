"""The box auto-approve policy in the state machine (SPEC §2's policy edge, §14; docs/learning.md): the
edge only through a loaded policy in ``on``, refused policy files, the spot-check share, the audit of an
automatic decision, spot checks that look like any review, and the live drop to ``shadow``."""

from __future__ import annotations

import random

import orjson
import pytest
from scipy.stats import beta

from harness.executor import report
from hitl_review.statecore import auto_store, keys
from hitl_review.statecore import autoapprove as aa
from hitl_review.statecore.errors import IllegalTransition
from hitl_review.statecore.models import NodeReport
from hitl_review.statecore.reports import plan_report
from hitl_review.statecore.states import JobStatus as S
from hitl_review.statecore.states import transition
from hitl_review.statecore.store import Store, StoreConfig

from .auto_policy_util import SURE_BOXES, config, policy, policy_doc
from .helpers import iv, keep


def with_policy(store: Store, cfg: auto_store.AutoApproveConfig | None) -> Store:
    """Another store on the same Redis, built with ``cfg`` (as hitl up's replicas are)."""
    return Store(store.r, StoreConfig(retention_s=3600, node_timeout_s=60, auto_approve=cfg))


def test_the_policy_edge_is_taken_only_by_a_named_policy():
    with pytest.raises(IllegalTransition, match="only by a loaded auto-approve policy"):
        transition(S.DETECTING, S.PROCESSING_APPROVED_SUBJECTS)
    with pytest.raises(IllegalTransition):
        transition(S.DETECTING, S.PROCESSING_APPROVED_SUBJECTS, by_policy="someone")
    ref = policy().ref
    assert transition(S.DETECTING, S.PROCESSING_APPROVED_SUBJECTS, by_policy=ref) == S.PROCESSING_APPROVED_SUBJECTS
    # The reviewer's own edge needs no policy.
    assert transition(S.WAITING_USER_SELECTION, S.PROCESSING_APPROVED_SUBJECTS) == S.PROCESSING_APPROVED_SUBJECTS


async def test_a_detection_takes_the_edge_only_under_a_policy_in_on(store, image):
    job_id = (await store.create_job("alice", image)).job_id
    st = await store.get(job_id)
    node = st.current_node
    assert node is not None
    rep = NodeReport(
        node_instance_id=node.node_instance_id,
        node_type=node.node_type,
        job_id=job_id,
        outcome="SUCCEEDED",
        output={"boxes": SURE_BOXES},
    )
    pol = policy()
    without = plan_report(st, rep, "2026-01-01T00:00:00Z", 0)
    assert without.status == S.WAITING_USER_SELECTION
    shadow = plan_report(st, rep, "2026-01-01T00:00:00Z", 0, auto=aa.Ask(pol, "shadow", 0.05, 0.99))
    assert shadow.status == S.WAITING_USER_SELECTION
    assert [t for t, _ in shadow.events if t.startswith("POLICY_")] == ["POLICY_SHADOW_DECISION"]
    on = plan_report(st, rep, "2026-01-01T00:00:00Z", 0, auto=aa.Ask(pol, "on", 0.05, 0.99))
    assert on.status == S.PROCESSING_APPROVED_SUBJECTS and on.meta["decided_by"] == pol.ref
    assert [c.node_type for c in on.outbox] == ["SEGMENT_SUBJECT", "SEGMENT_SUBJECT"]
    spot = plan_report(st, rep, "2026-01-01T00:00:00Z", 0, auto=aa.Ask(pol, "on", 0.05, 0.01))
    assert spot.status == S.WAITING_USER_SELECTION and not [t for t, _ in spot.events if "POLICY" in t]


def test_an_unbounded_or_edited_policy_is_refused():
    assert aa.approvals_needed(0, 0.005, 0.95) == 598  # ln(0.05) / ln(0.995)
    weak = orjson.dumps(policy_doc(approved=100))
    with pytest.raises(aa.PolicyRefused, match=r"refused in on: .*bounds the false-accept rate at 0\.02.*498 more"):
        aa.load(weak, "on")
    assert aa.load(weak, "shadow").threshold == 0.9  # shadow only watches
    edited = policy_doc()
    edited["threshold"] = 0.5
    with pytest.raises(aa.PolicyRefused, match="hash does not match"):
        aa.load(orjson.dumps(edited), "on")
    lying = policy_doc(approved=700, false_accepts=9)  # the recorded bound is recomputed, never trusted
    lying["evidence"]["false_accept_upper"] = 0.001
    with pytest.raises(aa.PolicyRefused, match="9 false accepts in 700"):
        aa.load(orjson.dumps(aa.sealed(lying)), "on")


def test_the_spot_check_share_lies_in_its_exact_binomial_interval():
    pol, rng, n = policy(), random.Random(2026), 2000
    drawn = sum(
        aa.decide(aa.Ask(pol, "on", 0.05, rng.random()), SURE_BOXES, 640, 480).spot_check  # type: ignore[union-attr]
        for _ in range(n)
    )
    lo, hi = beta.ppf(0.005, drawn, n - drawn + 1), beta.ppf(0.995, drawn + 1, n - drawn)
    assert lo <= 0.05 <= hi, (drawn, lo, hi)
    assert 0 < drawn < n
    # a job the policy would not approve is never a spot check, nor is any job in shadow
    low = [{**b, "score": 0.4} for b in SURE_BOXES]
    assert not aa.decide(aa.Ask(pol, "on", 1.0, 0.0), low, 640, 480).spot_check  # type: ignore[union-attr]
    assert not aa.decide(aa.Ask(pol, "shadow", 1.0, 0.0), SURE_BOXES, 640, 480).spot_check  # type: ignore[union-attr]


async def test_an_automatic_decision_is_one_audited_write_naming_its_policy(store, image):
    s = with_policy(store, config("on", spot_check=0.0))
    job_id = (await s.create_job("alice", image)).job_id
    before = (await s.get(job_id)).version
    assert await report(s, job_id, {"boxes": SURE_BOXES}) == "OK"
    snap = await s.snapshot(job_id)
    ref = s.config.auto_approve.policy.ref  # type: ignore[union-attr]
    assert snap.status == S.PROCESSING_APPROVED_SUBJECTS and snap.decided_by == ref
    assert snap.active_pause is None and {r.decided_by for r in snap.subjects} == {ref}
    assert [c.node_type for c in await s.outbox_commands(job_id)][-2:] == ["SEGMENT_SUBJECT", "SEGMENT_SUBJECT"]
    audit = (await s.audit(job_id))["entries"]  # type: ignore[index]
    last = audit[-1]
    assert (last["actor"], last["action"], last["outcome"]) == (
        ref,
        "AUTO_APPROVE",
        "APPLIED:PROCESSING_APPROVED_SUBJECTS",
    )
    assert last["base_version"] == before and str(last["snapshot_id"]).startswith("snap_")
    assert audit[-2]["action"] == "NODE_REPORT" and audit[-2]["seq"] == last["seq"] - 1
    assert "AUTO_APPROVED" in await event_types(s, job_id)
    assert (await auto_store.counts(s.r, ref))["auto"] == 1


async def test_a_spot_check_looks_like_any_review_and_drift_drops_the_policy_to_shadow(store, image):
    s = with_policy(store, config("on", spot_check=1.0))  # every job it would approve goes to a person
    plain = with_policy(store, None)
    spot_id = (await s.create_job("alice", image)).job_id
    assert await report(s, spot_id, {"boxes": SURE_BOXES}) == "OK"
    other_id = (await plain.create_job("alice", image)).job_id
    assert await report(plain, other_id, {"boxes": SURE_BOXES}) == "OK"
    a, b = (await s.snapshot(spot_id)).model_dump(mode="json"), (await s.snapshot(other_id)).model_dump(mode="json")
    assert a["status"] == b["status"] == "WAITING_USER_SELECTION"
    assert set(a) == set(b) and set(a["active_pause"]) == set(b["active_pause"]) and a["decided_by"] is None
    assert await event_types(s, spot_id) == await event_types(s, other_id)  # nothing says "spot check"
    # The reviewer deletes a box: a false accept of the policy, seen by its spot check.
    st = await s.get(spot_id)
    assert (await s.intervene(spot_id, iv(st, keep(st, 0)), "rev1")).status_code == 200
    ev = [orjson.loads(e) for e in await store.r.lrange(keys.job(spot_id).events, 0, -1)]
    checked = [e["data"] for e in ev if e["type"] == "POLICY_SPOT_CHECKED"]
    ref = s.config.auto_approve.policy.ref  # type: ignore[union-attr]
    assert checked == [
        {"policy": ref, "would_approve": True, "unchanged": False, "change": "deleted", "false_accept": True}
    ]
    c = await auto_store.counts(store.r, ref)
    assert (c["spot"], c["spot_fa"]) == (1, 1)  # lower bound beta.ppf(0.05, 1, 1) = 0.05 > 0.005: drop
    assert (await auto_store.live(store.r))["mode"] == "shadow"
    audit = (await s.audit(spot_id))["entries"]  # type: ignore[index]
    assert (audit[-1]["actor"], audit[-1]["action"]) == (auto_store.MONITOR, "POLICY_DROPPED_TO_SHADOW")
    log = await store.r.xrange(keys.BOX_POLICY_LOG)
    assert [e[1]["action"] for e in log] == ["start", "drop"]
    # Every replica sees it, a restarted one too; the next job waits for a person, its would-be decision recorded.
    again = with_policy(store, config("on", spot_check=1.0))
    assert await auto_store.start(again) == "shadow"
    next_id = (await again.create_job("alice", image)).job_id
    assert await report(again, next_id, {"boxes": SURE_BOXES}) == "OK"
    assert (await again.get(next_id)).status == S.WAITING_USER_SELECTION
    ev = [orjson.loads(e) for e in await store.r.lrange(keys.job(next_id).events, 0, -1)]
    shadow = [e["data"] for e in ev if e["type"] == "POLICY_SHADOW_DECISION"]
    assert len(shadow) == 1 and shadow[0]["would_approve"] is True and shadow[0]["mode"] == "shadow"
    # The person approves it unchanged: the shadow comparison agrees.
    st = await again.get(next_id)
    assert (await again.intervene(next_id, iv(st, keep(st, 0, 1)), "rev1")).status_code == 200
    c = await auto_store.counts(store.r, ref)
    assert (c["shadow"], c["shadow_would"], c["shadow_reviewed"], c["shadow_reviewed_agree"]) == (1, 1, 1, 1)


async def event_types(s: Store, job_id: str) -> list[str]:
    return [orjson.loads(e)["type"] for e in await s.r.lrange(keys.job(job_id).events, 0, -1)]


async def test_the_audit_entries_of_automatic_decisions_chain_and_reach_the_archive(store, image, archive):
    """The policy's AUTO_APPROVE entry and the live check's POLICY_DROPPED_TO_SHADOW entry are links of
    the job's hash chain like any other (verify), and the archive's copy holds them as Redis did."""
    from hitl_review.archive import reads
    from hitl_review.archive.archiver import archive_job
    from hitl_review.statecore import audit as audit_log

    auto = with_policy(store, config("on", spot_check=0.0))
    approved = (await auto.create_job("alice", image)).job_id
    assert await report(auto, approved, {"boxes": SURE_BOXES}) == "OK"
    spot = with_policy(store, config("on", spot_check=1.0))
    checked = (await spot.create_job("alice", image)).job_id
    assert await report(spot, checked, {"boxes": SURE_BOXES}) == "OK"
    st = await spot.get(checked)
    assert (await spot.intervene(checked, iv(st, keep(st, 1)), "rev1")).status_code == 200  # a false accept
    ref = auto.config.auto_approve.policy.ref  # type: ignore[union-attr]
    expected = {
        approved: [("NODE_REPORT", "system"), ("AUTO_APPROVE", ref)],
        checked: [("INTERVENE", "rev1"), ("POLICY_DROPPED_TO_SHADOW", auto_store.MONITOR)],
    }
    for job_id, tail in expected.items():
        log = await store.audit(job_id)
        assert log is not None and audit_log.verify(log["entries"], log["head"], log["head_seq"]) is None
        got = [(e["action"], e["actor"]) for e in log["entries"]][-2:]
        assert [a for a, _ in got] == [a for a, _ in tail] and got[-1][1] == tail[-1][1], got
        await store.cancel(job_id, "admin")
        await archive_job(store, archive, job_id)
        kept = reads.audit(archive, job_id)
        assert kept is not None and audit_log.verify(kept["entries"]) is None
        actions = [(e["action"], e["actor"]) for e in kept["entries"]]
        assert tail[-1] in actions, actions
    drop = next(e for e in (await store.audit(checked))["entries"] if e["action"] == "POLICY_DROPPED_TO_SHADOW")  # type: ignore[index]
    assert drop["outcome"] == f"APPLIED:shadow {ref}"
