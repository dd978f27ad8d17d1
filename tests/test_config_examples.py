"""The documented --config examples must stay valid: they parse and map onto deployment options."""

from __future__ import annotations

from pathlib import Path

import pytest

from hitl_review.deployments.executor import deployment_overrides
from hitl_review.deployments.serve import deployment_options
from hitl_review.serve_app.ops.config import Settings, load_config_file

DOCS = Path(__file__).resolve().parent.parent / "docs" / "config"


@pytest.mark.parametrize("name,gpus", [("one-gpu.yaml", 1.0), ("eight-gpus.yaml", 8.0)])
def test_documented_autoscaling_examples(name, gpus):
    settings = Settings(models=load_config_file(DOCS / name), segmenter="sam", detector="sam-auto")
    cfg = settings.backend_config()
    peak = 0.0
    for role, dep in (("detector", "Detector"), ("validator", "BoxValidator"), ("segmenter", "Segmenter")):
        over = deployment_overrides(cfg, role, dep)
        opts = deployment_options("sam", over, gpu=True)
        auto = opts["autoscaling_config"]
        assert 1 <= auto["min_replicas"] <= auto["max_replicas"]
        peak += opts["ray_actor_options"]["num_gpus"] * auto["max_replicas"]
        assert "num_gpus" not in deployment_options("sam", over, gpu=False)["ray_actor_options"]
    assert peak == pytest.approx(gpus)


def test_bad_config_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ValueError, match="mapping"):
        load_config_file(bad)
    with pytest.raises(FileNotFoundError):
        load_config_file(tmp_path / "missing.toml")
