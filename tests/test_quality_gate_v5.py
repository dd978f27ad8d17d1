"""gate-v5 (SPEC.md §13): the mask checker network (``deployments/quality/gate_net.py``) — its input, its
committed weights, its verdicts on true and broken masks, the policy by name, its words, and the training
script that writes the weights (``benchmarks/gate_net_training.py``)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks import gate_net_training
from hitl_review.deployments.quality import gate_net
from hitl_review.deployments.quality.gate import POLICIES, judge, policy, score_mask
from hitl_review.deployments.quality.gate_v5 import GATE_V5_SCORE, NetScore
from hitl_review.deployments.quality.learned_features import explain
from hitl_review.deployments.quality.subject import QualityGate
from tests.test_quality_learned_features import half_of, studio_subjects


def test_the_input_is_the_box_and_its_margin_at_a_fixed_size() -> None:
    image = np.zeros((100, 200, 3), np.uint8)
    image[:, :100] = (255, 0, 0)
    mask = np.zeros((100, 200), bool)
    mask[20:80, 40:160] = True
    x = gate_net.net_input(image, [40.0, 20.0, 160.0, 80.0], mask)
    assert x.shape == (4, gate_net.CROP_PX, gate_net.CROP_PX) and x.dtype == np.float32
    assert -0.5 <= x.min() and x.max() <= 0.5
    # the left half is red, the right black; the mask fills the box and not the margin around it
    mid = gate_net.CROP_PX // 2
    assert x[0, mid, 2] == pytest.approx(0.5) and x[0, mid, -3] == pytest.approx(-0.5)
    assert x[3, mid, mid] == pytest.approx(0.5) and x[3, 0, 0] == pytest.approx(-0.5)
    # a box running off the picture: the picture's border is repeated, nothing raises
    edge = gate_net.net_input(image, [-10.0, -10.0, 30.0, 50.0], mask)
    assert edge.shape == x.shape and np.isfinite(edge).all()


def test_the_committed_weights_load_and_a_round_trip_predicts_the_same(tmp_path: Path) -> None:
    net = gate_net.load()
    image, bbox, mask = studio_subjects()[0]
    batch = gate_net.net_input(image, bbox, mask)[None]
    bad, iou = gate_net.predict(net, batch)
    assert 0 <= bad[0] <= 1 and 0 <= iou[0] <= 1
    gate_net.save(net, tmp_path / "w.npz")
    again = gate_net.predict(gate_net.load(tmp_path / "w.npz"), batch)
    assert np.allclose(again[0], bad) and np.allclose(again[1], iou)
    with pytest.raises(FileNotFoundError, match="gate_net_training"):
        gate_net.load(tmp_path / "missing.npz")
    np.savez(tmp_path / "other.npz", weight=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="another architecture"):
        gate_net.load(tmp_path / "other.npz")


def test_true_masks_pass_and_broken_ones_fail_in_words() -> None:
    subjects = studio_subjects()
    assert len(subjects) >= 3
    for image, bbox, mask in subjects:
        s = score_mask(image, bbox, mask, gate="gate-v5")
        assert s["net_iou"] > 0.9 and s["net_bad"] < 0.1, s
        ok = judge(s, "gate-v5")
        assert ok.verdict == "PASS" and ok.severity == 0.0, ok.reasons
        broken = score_mask(image, bbox, half_of(mask), gate="gate-v5")
        assert broken["net_iou"] < 0.8 and broken["net_bad"] > 0.5, broken
        bad = judge(broken, "gate-v5")
        assert bad.verdict == "FAIL" and bad.policy == "gate-v5" and bad.severity > 0
        [reason] = bad.reasons
        assert "mask checker trained on labelled cut-outs puts its overlap with the subject at" in reason


def test_gate_v5_is_a_policy_by_name_and_only_its_scores_carry_the_network() -> None:
    p = policy("gate-v5")
    assert p is POLICIES["gate-v5"] and p.version == "gate-v5" and p.learned is GATE_V5_SCORE
    assert QualityGate("gate-v5", 2).policy == "gate-v5"
    image, bbox, mask = studio_subjects()[0]
    assert set(gate_net.NET_FEATURES) <= set(score_mask(image, bbox, mask, gate="gate-v5"))
    assert not set(gate_net.NET_FEATURES) & set(score_mask(image, bbox, mask, gate="gate-v1"))
    with pytest.raises(ValueError, match="score_mask"):
        judge(score_mask(image, bbox, mask, gate="gate-v1"), "gate-v5")
    empty = score_mask(image, bbox, np.zeros_like(mask), gate="gate-v5")
    assert empty["net_bad"] == 1.0 and judge(empty, "gate-v5").verdict == "FAIL"
    first = judge(score_mask(image, bbox, half_of(mask), gate="gate-v5"), "gate-v5")
    assert first == judge(score_mask(image, bbox, half_of(mask), gate="gate-v5"), "gate-v5")


def test_net_score_is_the_networks_log_odds_and_its_reason_names_the_overlap() -> None:
    alone = NetScore(threshold=0.0)
    s = {"net_bad": 0.8, "net_iou": 0.7, "fill": 0.5}
    assert alone.features == ("net_bad", "net_iou")
    assert alone.score(s) == pytest.approx(math.log(0.8 / 0.2)) and alone.probability(s) == pytest.approx(0.8)
    assert alone.contributions(s) == pytest.approx({"net_iou": math.log(4)})
    # a mask just past the committed threshold (odds of 20 % against its ~8 %) is still told in words
    faint = {"net_bad": 0.2, "net_iou": 0.83}
    assert GATE_V5_SCORE.score(faint) >= GATE_V5_SCORE.threshold
    said = explain(GATE_V5_SCORE, faint)
    assert "puts its overlap with the subject at 83%" in said and "limit 8%" in said, said
    assert NetScore(threshold=0.0).score({"net_bad": 1.0, "net_iou": 0.0}) > 10  # clipped, finite


def test_the_training_script_writes_weights_that_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "w.npz"
    args = ["--train-seeds", "1", "--check-seeds", "11", "--n", "4", "--epochs", "1", "--out", str(out)]
    assert gate_net_training.main([*args, "--data", str(tmp_path / "data")]) == 0
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["seed-1-n4.npz", "seed-11-n4.npz"]
    table = capsys.readouterr().out
    assert "precision at recall 0.95" in table and "\n    11 " in table
    net = gate_net.load(out)
    image, bbox, mask = studio_subjects()[0]
    bad, iou = gate_net.predict(net, gate_net.net_input(image, bbox, mask)[None])
    assert 0 <= bad[0] <= 1 and 0 <= iou[0] <= 1
    with pytest.raises(SystemExit):
        gate_net_training.main(["--train-seeds", "0", "--out", str(out)])  # seed 0 is the report's
    with pytest.raises(SystemExit):
        gate_net_training.main(["--train-seeds", "11", "--check-seeds", "11", "--out", str(out)])


def test_hitl_up_refuses_gate_v5_where_its_network_cannot_load(monkeypatch: pytest.MonkeyPatch) -> None:
    from hitl_review.serve_app.ops.config import Settings
    from hitl_review.serve_app.ops.preflight import UpError, check_quality_gate

    check_quality_gate(Settings(quality_gate_policy="gate-v5"))  # torch and the weights are here: accepted

    def no_torch() -> None:
        raise ImportError("No module named 'torch'")

    monkeypatch.setattr(gate_net, "load", no_torch)  # what a demo install (no torch) meets
    with pytest.raises(UpError, match="gate-v5 runs a network and needs torch"):
        check_quality_gate(Settings(quality_gate_policy="gate-v5"))
    check_quality_gate(Settings(quality_gate_policy="gate-v1"))  # gate-v1 needs no network


@pytest.mark.ray
@pytest.mark.slow
def test_gate_v5_judges_the_cut_outs_in_the_segmenter_replica(tmp_path: Path) -> None:
    """``hitl up --quality-gate-policy gate-v5`` on Ray Serve (its defaults otherwise; the mask review off,
    so the job ends on the gate's verdicts): the Segmenter replica loads the network and every subject's
    verdict names gate-v5 and carries the network's figures."""
    import httpx

    from harness.hitl_up import HitlUp
    from hitl_review.serve_app.ops.samples import product_composite
    from tests.test_e2e_serve import Api, keep

    up = HitlUp(tmp_path / "data", "--quality-gate-policy", "gate-v5", "--quality-gate", "off").start()
    api = Api(up)
    try:
        job = api.submit(product_composite(seed=19, n=2)[0])
        snap = api.wait(job, {"WAITING_USER_SELECTION"})
        assert api.intervene(snap, keep(snap)).status_code == 200
        done = api.wait(job, {"SUCCEEDED", "PARTIAL_SUCCEEDED", "FAILED"})
        assert done["status"] == "SUCCEEDED", done
        subjects = api.c.get(f"/api/v1/jobs/{job}/results").json()["subjects"]
        assert len(subjects) == 2
        for s in subjects:
            q = s["quality"]
            assert q["policy"] == "gate-v5" and set(gate_net.NET_FEATURES) <= set(q["scores"]), q
            assert 0 <= q["scores"]["net_iou"] <= 1 and q["verdict"] in ("PASS", "FAIL")
        assert httpx.get(f"{up.api_url}/readyz", timeout=10).status_code == 200
    finally:
        api.close()
        up.stop()
