"""Where client commands find the server and the token, and the ``hitl`` command line itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hitl_review.client.commands import format_event
from hitl_review.client.config import resolve_config
from hitl_review.serve_app.cli import build_parser, main
from hitl_review.statecore.models import Event


def test_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    cfg = resolve_config(env={})
    assert cfg.api_url == "http://127.0.0.1:8000"
    assert cfg.data_dir == Path(".hitl") and cfg.token is None and cfg.token_source is None


def test_flags_beat_environment_beat_token_file(tmp_path: Path):
    ddir = tmp_path / "data"
    ddir.mkdir()
    (ddir / "api-token").write_text("file-token\n")
    env = {"HITL_API_URL": "http://env:9000", "HITL_TOKEN": "env-token", "HITL_DATA_DIR": str(ddir)}
    cfg = resolve_config("http://flag:1", "flag-token", None, env=env)
    assert (cfg.api_url, cfg.token, cfg.token_source) == ("http://flag:1", "flag-token", "--token")
    cfg = resolve_config(env=env)
    assert (cfg.api_url, cfg.token, cfg.token_source, cfg.data_dir) == (
        "http://env:9000",
        "env-token",
        "HITL_TOKEN",
        ddir,
    )
    cfg = resolve_config(env={**env, "HITL_TOKEN": ""})  # empty counts as unset
    assert cfg.token == "file-token" and cfg.token_source == str(ddir / "api-token")


def test_data_dir_flag_picks_the_token_file(tmp_path: Path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d, tok in ((a, "tok-a"), (b, "tok-b")):
        d.mkdir()
        (d / "api-token").write_text(f"  {tok}  \n\n")
    assert resolve_config(env={"HITL_DATA_DIR": str(a)}).token == "tok-a"
    assert resolve_config(data_dir=b, env={"HITL_DATA_DIR": str(a)}).token == "tok-b"


def test_missing_or_empty_token_file_means_no_token(tmp_path: Path):
    assert resolve_config(data_dir=tmp_path, env={}).token is None
    (tmp_path / "api-token").write_text("\n")
    assert resolve_config(data_dir=tmp_path, env={}).token is None


def test_parser_has_every_client_command_with_common_options():
    parser = build_parser()
    args = parser.parse_args(
        [
            "submit",
            "a.png",
            "dir",
            "--batch",
            "b1",
            "--concurrency",
            "8",
            "--wait",
            "--out",
            "o",
            "--timeout",
            "60",
            "--api-url",
            "http://x:1",
            "--token",
            "t",
            "--json",
        ]
    )
    assert (args.inputs, args.batch, args.concurrency, args.wait, args.out, args.timeout) == (
        ["a.png", "dir"],
        "b1",
        8,
        True,
        Path("o"),
        60.0,
    )
    assert (args.api_url, args.token, args.json) == ("http://x:1", "t", True)
    for argv in (
        ["status", "J"],
        ["watch", "J", "--last-event-id", "4"],
        ["results", "J", "--out", "d"],
        ["jobs", "--status", "WAITING_USER_SELECTION", "--limit", "5", "--data-dir", "dd"],
    ):
        args = parser.parse_args(argv)
        assert callable(args.func)
    with pytest.raises(SystemExit):
        parser.parse_args(["submit", "a.png", "--batch", "bad name"])
    with pytest.raises(SystemExit):
        parser.parse_args(["submit", "a.png", "--concurrency", "0"])


@pytest.mark.parametrize("cmd", ["submit", "status", "watch", "results", "jobs"])
def test_help_texts(cmd: str, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as info:
        main([cmd, "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "--api-url" in text and "--token" in text and "--data-dir" in text and "--json" in text
    assert "HITL_API_URL" in text  # where the server and the token come from is explained on every command


def test_one_parser_has_the_server_and_the_client_commands(capsys: pytest.CaptureFixture[str]):
    parser = build_parser()
    args = parser.parse_args(["up", "--no-ui", "--api-port", "8123", "--detector", "sam-auto"])
    assert (args.command, args.no_ui, args.api_port, args.detector, args.segmenter) == (
        "up",
        True,
        8123,
        "sam-auto",
        "classical",
    )
    assert parser.parse_args(["demo"]).func is args.func
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for cmd in ("up", "demo", "submit", "status", "watch", "results", "jobs"):
        assert f"    {cmd} " in text
    assert "hitl-review[demo]" in text  # the split install is explained, and not cut at its hyphen
    assert main([]) == 2


def test_the_command_line_imports_nothing_of_the_server():
    heavy = ("ray", "torch", "torchvision", "gradio", "fastapi", "redis", "numpy", "cv2", "uvicorn", "PIL")
    code = (
        "import sys, serve_app.cli as cli; cli.build_parser().parse_args(['submit', 'x.png']); "
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_submit_with_nothing_to_submit_reports_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    (tmp_path / "notes.txt").write_text("hi")
    code = main(
        ["submit", str(tmp_path), "--json", "--manifest", str(tmp_path / "m.jsonl"), "--api-url", "http://127.0.0.1:9"]
    )
    assert code == 1
    out = json.loads(capsys.readouterr().out)
    assert out["files"] == [] and out["skipped"] == [
        {"path": str(tmp_path / "notes.txt"), "reason": "not a PNG, JPEG or WebP image"}
    ]


def test_format_event():
    ev = Event(
        id=4,
        type="PAUSE_OPENED",
        job_id="j",
        version=3,
        at="2025-01-01T00:00:00.000Z",
        data={
            "status": "WAITING_USER_SELECTION",
            "active_pause": {"pause_token": "pause_1", "stage": "WAITING_USER_SELECTION", "round": 1},
            "box_list": [{}, {}],
        },
    )
    line = format_event(ev)
    assert line.startswith("#4  2025-01-01T00:00:00.000Z  PAUSE_OPENED  WAITING_USER_SELECTION  v3")
    assert "pause_1" in line and "2 boxes" in line
