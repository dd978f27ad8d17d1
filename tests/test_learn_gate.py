"""``hitl learn gate`` (SPEC §14, docs/learning.md § The mask gate): the mask gate trained on a team's own
mask reviews, refused on too little evidence, written as a versioned file with its content hash that
``--quality-gate-policy FILE`` loads, and refused once edited."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from hitl_review.archive import learn_gate
from hitl_review.deployments.quality.gate import judge, policy
from hitl_review.deployments.quality.subject import QualityGate
from hitl_review.serve_app.cli import main

BASE = ("fill", "box_gap", "box_agreement", "edge_touch", "cut_off", "components", "largest_share", "holes")


def decided(n: int, seed: int = 0) -> list[dict]:
    """Masks a reviewer accepts exactly when the colours change across the outline and it follows the
    picture's edges (a learnable rule, with a margin), three jobs' masks per job id."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        good = rng.random() < 0.7
        scores = {k: rng.uniform(0, 1) for k in BASE}
        scores["contrast"] = rng.uniform(2.2, 6) if good else rng.uniform(0, 1.6)
        scores["edge_alignment"] = rng.uniform(2, 4) if good else rng.uniform(0.5, 2.2)
        scores["bg_closer"] = rng.uniform(0, 0.3)
        decision = "ACCEPT" if good else rng.choice(["REFINE", "REJECT"])
        out.append(
            {"job_id": f"j{i // 3}", "box_id": f"b{i % 3}", "scores": scores, "decision": decision, "good": good}
        )
    return out


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_learn_gate_refuses_too_few_bad_masks_and_writes_a_loadable_versioned_file(tmp_path: Path, capsys):
    out = tmp_path / "gate.json"
    args = ["learn", "gate", "--out", str(out), "--dataset"]
    assert main([*args, str(write(tmp_path / "few.jsonl", decided(120)))]) == 1
    err = capsys.readouterr().err
    assert "refused" in err and "needs at least 29 bad masks" in err and "more bad masks" in err
    assert not out.exists()
    assert main([*args, str(write(tmp_path / "many.jsonl", decided(600, seed=1)))]) == 0
    doc = json.loads(out.read_text())
    ev = doc["evidence"]
    assert ev["heldout_subjects"] + ev["chosen_on_subjects"] == 600 and ev["recall_lower"] >= 0.9
    assert doc["hash"] and doc["model"]["kind"] == "logistic+isotonic" and "contrast" in doc["model"]["features"]
    gate = policy(str(out))
    assert gate.version == f"policy:gate@{doc['hash'][:16]}" and gate.version in capsys.readouterr().out
    QualityGate(str(out))  # what the segmentation node builds from --quality-gate-policy FILE
    sharp = {**dict.fromkeys(BASE, 0.5), "contrast": 5.0, "edge_alignment": 3.5, "bg_closer": 0.1}
    flat = {**sharp, "contrast": 0.2, "edge_alignment": 0.8}  # the picture gone: the same mask fails
    assert judge(sharp, gate).passed and judge(sharp, gate).policy == gate.version
    assert not judge(flat, gate).passed and judge(flat, gate).reasons


def test_an_edited_gate_file_is_refused(tmp_path: Path):
    out = tmp_path / "gate.json"
    assert (
        main(["learn", "gate", "--out", str(out), "--dataset", str(write(tmp_path / "d.jsonl", decided(600, 1)))]) == 0
    )
    doc = json.loads(out.read_text())
    doc["threshold"] = 0.01  # pass nearly every mask
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="hash does not match"):
        policy(str(edited))
    with pytest.raises(ValueError, match="hash does not match"):
        QualityGate(str(edited))


def test_the_data_set_labels_each_decided_mask_and_weights_spot_checks():
    scores = {"contrast": 3.0}
    events = [
        ("JOB_CREATED", {"policy": {"mask_spot_check": 0.1}}),
        ("SUBJECT_GATED", {"box_id": "a", "verdict": "FAIL", "scores": scores, "policy": "gate-v1"}),
        ("SUBJECT_GATED", {"box_id": "b", "verdict": "PASS", "scores": scores, "policy": "gate-v1"}),
        ("SUBJECT_GATED", {"box_id": "c", "verdict": "PASS", "scores": scores, "policy": "gate-v1"}),
        ("SUBJECT_DECIDED", {"box_id": "a", "decision": "REFINE"}),
        ("SUBJECT_DECIDED", {"box_id": "b", "decision": "ACCEPT"}),
        ("GATE_SPOT_CHECKED", {"box_id": "b", "false_accept": False}),
    ]
    rows = {r["box_id"]: r for r in learn_gate.rows_of("j1", events)}
    assert set(rows) == {"a", "b"}  # c passed and nobody looked at it: no label
    assert (rows["a"]["good"], rows["a"]["weight"]) == (False, 1.0)
    assert (rows["b"]["good"], rows["b"]["spot_check"], rows["b"]["weight"]) == (True, True, pytest.approx(10.0))
