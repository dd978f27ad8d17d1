"""``hitl learn`` (docs/learning.md): the data set the archive holds of what reviewers did with the
detector's lists, the box policy fitted on it (written only when held-out evidence bounds its promise),
and ``hitl up`` refusing ``--auto-approve on`` with a policy that does not."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import orjson
import pytest

from harness.executor import report
from hitl_review.archive import learn
from hitl_review.archive.archiver import archive_job
from hitl_review.serve_app.cli import main
from hitl_review.statecore import autoapprove as aa
from hitl_review.statecore import keys
from hitl_review.statecore.auto_store import AutoApproveConfig
from hitl_review.statecore.models import DetectorEvidence
from hitl_review.statecore.store import Store, StoreConfig

from .auto_policy_util import SURE_BOXES, config, policy_doc
from .helpers import THREE_BOXES, iv, keep


def rows(n: int, seed: int = 0) -> list[dict]:
    """Jobs a reviewer approves unchanged exactly when the detector was sure of every box and proposed no
    hand (a learnable rule, as a team's would be, with a margin between the two kinds)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ok = rng.random() < 0.5
        boxes = []
        for _ in range(rng.randint(1, 3)):
            x, y = rng.uniform(0, 400), rng.uniform(0, 300)
            bbox = [x, y, x + rng.uniform(30, 200), y + rng.uniform(30, 150)]
            score = rng.uniform(0.92, 1.0) if ok else rng.uniform(0.3, 1.0)
            boxes.append({"bbox": bbox, "score": score, "label": rng.choice(["shoe", "bag"])})
        if not ok:  # a doubtful box, or a hand
            boxes[0]["score"], boxes[0]["label"] = rng.uniform(0.3, 0.8), rng.choice(["shoe", "hand"])
        stamp = f"2026-01-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"
        change = "" if ok else "deleted"
        out.append(
            {
                "job_id": f"j{i}",
                "finished_at": stamp,
                "width": 640,
                "height": 480,
                "boxes": boxes,
                "unchanged": ok,
                "change": change,
            }
        )
    return out


def test_the_model_file_predicts_as_scikit_learn_fitted_it():
    from sklearn.isotonic import IsotonicRegression

    data = rows(400)
    labels = learn.vocabulary(data)
    x, y = learn.matrix(data, labels)
    model = learn.fit_model(x, y, labels)
    raw = 1 / (1 + np.exp(-(((x - model["mean"]) / model["scale"]) @ model["coef"] + model["intercept"])))
    iso = IsotonicRegression(out_of_bounds="clip").fit(model["isotonic"]["x"], model["isotonic"]["y"])
    assert np.allclose([aa.predict(model, row) for row in x], iso.predict(raw), atol=1e-9)


def test_box_policy_is_refused_without_enough_evidence_and_written_with_it(tmp_path: Path, capsys):
    few, many = tmp_path / "few.jsonl", tmp_path / "many.jsonl"
    few.write_text("".join(json.dumps(r) + "\n" for r in rows(300)))
    many.write_text("".join(json.dumps(r) + "\n" for r in rows(2500, seed=1)))
    out = tmp_path / "box.json"
    args = ["learn", "box-policy", "--max-false-accept", "0.005", "--out", str(out), "--dataset"]
    assert main([*args, str(few)]) == 1
    err = capsys.readouterr().err
    assert "598 approved held-out jobs without a false accept" in err and "more reviewed jobs" in err
    assert not out.exists()  # nothing written
    assert main([*args, str(many)]) == 0
    doc = json.loads(out.read_text())
    pol = aa.load(out.read_text(), "on")
    ev = doc["evidence"]
    assert ev["heldout_jobs"] + ev["chosen_on_jobs"] == 2500 and ev["heldout_approved"] >= 598
    assert ev["false_accept_upper"] == pytest.approx(
        aa.upper_bound(ev["heldout_false_accepts"], ev["heldout_approved"], 0.95)
    )
    assert ev["false_accept_upper"] <= 0.005 and pol.ref in capsys.readouterr().out
    assert doc["training"]["jobs"] == 2500 and "cross-fitted" in ev["method"]


def test_the_threshold_is_bounded_on_jobs_disjoint_from_those_it_was_chosen_on():
    """1,500 jobs: choosing the threshold and bounding it on the same cross-fitted jobs finds about 760
    approved without a false accept and claims the 0.5 % bound (the code before this fix wrote the
    policy); chosen on one half by job id and judged on the other, each half approves about 380, short
    of the 598 the bound needs: refused. With 2,500 the evidence is the judging half's alone."""
    data = rows(1500, seed=1)
    with pytest.raises(aa.PolicyRefused, match="the disjoint part that bounds it") as refused:
        learn.box_policy(data, 0.005)
    assert "598 approved held-out jobs" in str(refused.value)
    pick, judge = learn.disjoint_parts([r["job_id"] for r in data])
    assert not (pick & judge).any() and (pick | judge).all() and 0.4 < pick.mean() < 0.6
    more = rows(2500, seed=1)
    doc = learn.box_policy(more, 0.005)
    ev = doc["evidence"]
    labels = learn.vocabulary(more)
    x, y = learn.matrix(more, labels)
    p = learn.heldout_probabilities(more, labels)
    pick, judge = learn.disjoint_parts([r["job_id"] for r in more])
    nonempty = np.ones(len(more), bool)
    assert learn.choose_threshold(p[pick], y[pick], nonempty[pick], 0.005, 0.95)["threshold"] == doc["threshold"]
    judged = learn.evidence_at(doc["threshold"], p[judge], y[judge], nonempty[judge], 0.95)
    assert ev["heldout_jobs"] == int(judge.sum()) < 2500
    assert (ev["heldout_approved"], ev["heldout_false_accepts"]) == (
        judged["heldout_approved"],
        judged["heldout_false_accepts"],
    )


def test_hitl_up_refuses_on_with_a_policy_its_evidence_does_not_bound(tmp_path: Path, capsys):
    weak = tmp_path / "weak.json"
    weak.write_text(orjson.dumps(policy_doc(approved=100)).decode())
    code = main(["up", "--data-dir", str(tmp_path), "--auto-approve", "on", "--auto-approve-policy", str(weak)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "--auto-approve-policy" in err and "498 more" in err
    assert main(["up", "--data-dir", str(tmp_path), "--auto-approve", "on"]) == 2
    assert "needs --auto-approve-policy" in capsys.readouterr().err


async def test_the_data_set_holds_reviewed_jobs_and_not_those_a_policy_decided(store, image, archive):
    async def reviewed(keep_idx: tuple[int, ...]) -> str:
        job_id = (await store.create_job("alice", image)).job_id
        assert await report(store, job_id, {"boxes": THREE_BOXES}) == "OK"
        st = await store.get(job_id)
        assert (await store.intervene(job_id, iv(st, keep(st, *keep_idx)), "rev1")).status_code == 200
        return job_id

    kept, deleted = await reviewed((0, 1, 2)), await reviewed((0, 1))
    auto = Store(store.r, StoreConfig(retention_s=3600, auto_approve=config("on")))
    decided = (await auto.create_job("alice", image)).job_id
    assert await report(auto, decided, {"boxes": SURE_BOXES}) == "OK"
    waiting = (await store.create_job("alice", image)).job_id
    assert await report(store, waiting, {"boxes": THREE_BOXES}) == "OK"
    for job_id in (kept, deleted, decided, waiting):
        await store.cancel(job_id, "admin")
        await archive_job(store, archive, job_id)
    got = {r["job_id"]: r for r in learn.dataset(archive)}
    assert set(got) == {kept, deleted}
    assert (got[kept]["unchanged"], got[deleted]["unchanged"], got[deleted]["change"]) == (True, False, "deleted")
    assert [b["score"] for b in got[kept]["boxes"]] == [b["score"] for b in THREE_BOXES]
    assert got[kept]["width"] == image.width


def evidence_rows(n: int, seed: int = 0, readable: bool = True) -> list[dict]:
    """Jobs whose scores say nothing (all sure) and whose detector evidence says everything: a reviewer
    changes the list exactly when a box took in its shadow (``shrink``) or merged two subjects (``parts``)."""
    rng = random.Random(seed)
    out = []
    for r in rows(n, seed):
        ok = rng.random() < 0.7
        for b in r["boxes"]:
            b["score"], b["label"] = rng.uniform(0.92, 1.0), "shoe"
            b["evidence"] = {"shrink": rng.uniform(0.0, 0.1), "parts": 1.0}
        if not ok:
            r["boxes"][0]["evidence"] = rng.choice([{"shrink": 0.3, "parts": 1.0}, {"shrink": 0.05, "parts": 2.0}])
        r["unchanged"], r["change"] = ok, "" if ok else "moved"
        if not readable:
            for b in r["boxes"]:
                b.pop("evidence")
        out.append(r)
    return out


def test_a_policy_reads_the_detectors_evidence_only_when_every_job_carried_it():
    data = evidence_rows(2500)
    doc = learn.box_policy(data, 0.02)
    assert [f for f in doc["model"]["features"] if f in aa.EVIDENCE_FEATURES] == list(aa.EVIDENCE_FEATURES)
    policy = aa.load(orjson.dumps(doc))
    assert policy.reads_evidence
    fresh = evidence_rows(600, seed=9)  # jobs the fit never saw
    approved = [policy.probability(r["boxes"], 640, 480) >= policy.threshold for r in fresh]
    assert not any(a for a, r in zip(approved, fresh, strict=True) if not r["unchanged"])
    assert sum(approved) >= 0.8 * sum(r["unchanged"] for r in fresh)
    # a box without evidence counts as the worst: never approved on its absence
    kept = next(r for a, r in zip(approved, fresh, strict=True) if a)
    blind = [{k: v for k, v in b.items() if k != "evidence"} for b in kept["boxes"]]
    assert policy.probability(blind, 640, 480) == 0.0 < policy.threshold
    # the same jobs without the evidence: nothing tells the lists apart, and the fit says so
    with pytest.raises(aa.PolicyRefused, match="refused"):
        learn.box_policy(evidence_rows(2500, readable=False), 0.02)
    # one job without it: the window spans a detector that did not report it, so none is read
    mixed = evidence_rows(2500)
    mixed[0]["boxes"][0].pop("evidence")
    assert not learn.with_evidence(mixed)


async def test_the_detectors_evidence_goes_from_its_report_to_the_data_set_and_a_live_policy(store, image, archive):
    """What the Detector reports with each box (``ClassicalDetector.detect``) is kept with the box in the
    job (a box without it writes no key), dropped from a box a reviewer moves, read back from the
    archive by ``hitl learn`` as it was proposed; a policy fitted on it approves, in the store, a
    detection whose evidence is clean and neither one that merged two subjects nor one without evidence."""
    clean = [{**b, "evidence": {"shrink": 0.04, "parts": 1}} for b in SURE_BOXES]
    job = (await store.create_job("alice", image)).job_id
    assert await report(store, job, {"boxes": [clean[0], SURE_BOXES[1]]}) == "OK"
    st = await store.get(job)
    assert st.box_list[0].evidence == DetectorEvidence(shrink=0.04, parts=1) and st.box_list[1].evidence is None
    stored = orjson.loads(await store.r.hget(keys.job(job).meta, "box_list"))
    assert stored[0]["evidence"] == {"parts": 1, "shrink": 0.04} and "evidence" not in stored[1]

    async def reviewed(moved: bool) -> str:
        job_id = (await store.create_job("alice", image)).job_id
        assert await report(store, job_id, {"boxes": clean}) == "OK"
        st = await store.get(job_id)
        subjects = keep(st, 0, 1)
        if moved:
            subjects[0]["bbox"] = [40, 40, 100, 120]
        assert (await store.intervene(job_id, iv(st, subjects), "rev1")).status_code == 200
        after = await store.get(job_id)
        assert [b.evidence is None for b in after.box_list] == [moved, False]
        await store.cancel(job_id, "admin")
        await archive_job(store, archive, job_id)
        return job_id

    unchanged, moved = await reviewed(False), await reviewed(True)
    rows = {r["job_id"]: r for r in learn.dataset(archive)}
    assert [b["evidence"] for b in rows[moved]["boxes"]] == [{"shrink": 0.04, "parts": 1}] * 2  # as proposed
    assert (rows[unchanged]["unchanged"], rows[moved]["unchanged"]) == (True, False)
    assert learn.with_evidence(list(rows.values()))

    pol = aa.load(orjson.dumps(learn.box_policy(evidence_rows(2500), 0.02)), "on")
    live = Store(store.r, StoreConfig(retention_s=3600, auto_approve=AutoApproveConfig(pol, "on", 0.0)))
    merged = [clean[0], {**SURE_BOXES[1], "evidence": {"shrink": 0.05, "parts": 2}}]
    decided = {}
    for name, boxes in (("clean", clean), ("merged", merged), ("without", SURE_BOXES)):
        job_id = (await live.create_job("alice", image)).job_id
        assert await report(live, job_id, {"boxes": boxes}) == "OK"
        st = await live.get(job_id)
        decided[name] = (st.status.value, st.decided_by)
    assert decided == {
        "clean": ("PROCESSING_APPROVED_SUBJECTS", pol.ref),
        "merged": ("WAITING_USER_SELECTION", None),
        "without": ("WAITING_USER_SELECTION", None),
    }


def test_a_policy_file_naming_features_this_version_does_not_compute_is_refused():
    doc = learn.box_policy(evidence_rows(2500), 0.02)
    body = {k: v for k, v in doc.items() if k != "hash"}
    body["model"] = {**body["model"], "features": [*body["model"]["features"][:-1], "label:else"]}
    with pytest.raises(aa.PolicyRefused, match="names features"):
        aa.load(orjson.dumps(aa.sealed(body)))
