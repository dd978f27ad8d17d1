"""`hitl up`'s review-and-record flags reach the settings (and the label set from the config file)."""

from __future__ import annotations

from pathlib import Path

from hitl_review.serve_app import cli
from hitl_review.serve_app.ops.launcher import settings_from_args


def parse(*argv: str):
    return settings_from_args(cli.build_parser().parse_args(["up", *argv]))


def test_flags_reach_the_settings():
    s = parse(
        "--labels", " shoe, bag ,,shirt", "--claim-ttl-s", "30", "--retention-days", "2", "--archive-url", "sqlite:///x"
    )
    assert s.labels == ["shoe", "bag", "shirt"] and s.claim_ttl_s == 30 and s.retention_s == 2 * 86400
    assert s.archive and s.archive_url == "sqlite:///x"
    assert not parse("--no-archive").archive
    d = parse()
    assert d.labels == [] and d.claim_ttl_s == 60 and d.retention_s == 7 * 86400 and d.archive


def test_labels_from_the_config_file_and_the_flag_wins(tmp_path: Path):
    cfg = tmp_path / "hitl.yaml"
    cfg.write_text("labels: [hat, scarf]\n")
    assert parse("--config", str(cfg)).labels == ["hat", "scarf"]
    assert parse("--config", str(cfg), "--labels", "cup").labels == ["cup"]


def test_export_and_archive_upgrade_are_commands():
    p = cli.build_parser()
    assert p.parse_args(["export", "--format", "coco", "--out", "d"]).func.__name__ == "run_export"
    assert p.parse_args(["admin", "archive-upgrade"]).func.__name__ == "run_upgrade"
