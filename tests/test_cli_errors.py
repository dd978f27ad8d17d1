"""Errors a person can act on (issue 20, step 14): ``hitl up`` given something it cannot run says in
one line on stderr what is wrong and what to do, exits 2 for a usage error, and prints no traceback;
it stops before Redis or Ray start, so each case takes about a second. A Serve deployment that
fails to start shows the failing replica's own error (the one case that starts Ray, marked slow).
READY is said only for this ``hitl up``'s own server: /readyz names the instance it answers for."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.ci import require_binary
from hitl_review.serve_app import cli
from hitl_review.serve_app.ops import config
from hitl_review.serve_app.ops.config import Settings
from hitl_review.serve_app.ops.ports import free_port, quiet_port
from hitl_review.serve_app.ops.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent
# From the caller's shell they would point `hitl up` elsewhere.
FOREIGN_ENV = (
    "REDIS_URL",
    "HITL_REDIS_URL",
    "HITL_TOKENS",
    "HITL_DATA_DIR",
    "HITL_ARTIFACTS",
    "HITL_ARCHIVE_URL",
    "RAY_ADDRESS",
)


def hitl(*args: str, env: Mapping[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV}
    full.update(PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "hitl_review.serve_app.cli", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def up(tmp_path: Path, *args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``hitl up`` on free ports, no UI, no dashboard: what a refusal must stop before starting."""
    base = ["up", "--data-dir", str(tmp_path / "data"), "--api-port", str(quiet_port()), "--no-ui", "--no-dashboard"]
    return hitl(*base, *args, env=env)


def one_line(proc: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    """The refusal: exit ``code``, one line on stderr naming each of ``words``, no traceback."""
    err = proc.stderr.strip()
    assert proc.returncode == code, f"exit {proc.returncode}\n{proc.stderr}"
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("hitl up: "), err
    for word in words:
        assert word in err, err
    return err


def test_a_missing_config_file_is_one_line(tmp_path: Path):
    one_line(up(tmp_path, "--config", str(tmp_path / "missing.yaml")), 2, "--config", "missing.yaml", "not exist")
    assert not (tmp_path / "data").exists()  # refused before anything was made


def test_a_misspelled_config_key_is_refused_not_ignored(tmp_path: Path):
    cfg = tmp_path / "scale.yaml"
    cfg.write_text(yaml.safe_dump({"deployments": {"Segmenter": {"max_replica": 3}}}))
    one_line(up(tmp_path, "--config", str(cfg)), 2, "deployments.Segmenter.max_replica", "max_replicas")
    cfg.write_text(yaml.safe_dump({"deployments": {"Segmentr": {"max_replicas": 3}}}))
    one_line(up(tmp_path, "--config", str(cfg)), 2, "Segmentr", "BoxValidator")
    toml = tmp_path / "scale.toml"
    toml.write_text("[deployment.Detector]\nnum_replicas = 1\n")
    one_line(up(tmp_path, "--config", str(toml)), 2, "deployment", "deployments")
    cfg.write_text("deployments: [unclosed\n")
    one_line(up(tmp_path, "--config", str(cfg)), 2, str(cfg))


def test_config_file_model_knows_every_key_the_deployments_read():
    from hitl_review.deployments.serve import AUTOSCALING_KEYS, DEFAULT_BATCH, HEALTH_DEFAULTS

    known = set(config.DeploymentSection.model_fields)
    assert set(AUTOSCALING_KEYS) | set(DEFAULT_BATCH) | set(HEALTH_DEFAULTS) <= known
    for name in ("one-gpu.yaml", "eight-gpus.yaml"):  # the documented examples pass
        config.load_config_file(ROOT / "docs" / "config" / name)


def test_an_out_of_range_flag_names_the_flag_and_the_range(tmp_path: Path):
    one_line(up(tmp_path, "--coverage-window-s", "10"), 2, "--coverage-window-s", "60")
    one_line(up(tmp_path, "--claim-ttl-s", "0"), 2, "--claim-ttl-s", "greater than 0")
    one_line(up(tmp_path, "--node-timeout", "NOPE=3"), 2, "--node-timeout", "unknown node type")


@pytest.mark.parametrize(
    "args,words",
    [
        (["--detector", "sam-auto"], ["--detector sam-auto", "--sam-checkpoint"]),
        (["--segmenter", "sam", "--sam-checkpoint", "/nonexistent/sam.pth"], ["/nonexistent/sam.pth", "not exist"]),
        (["--detector", "torchvision"], ["--detector torchvision", "--detector-weights"]),
        (["--detector", "torchvision", "--detector-weights", "/no/w.pth"], ["/no/w.pth", "not exist"]),
    ],
)
def test_a_model_without_its_file_is_refused_before_ray_starts(tmp_path: Path, args: list[str], words: list[str]):
    one_line(up(tmp_path, *args), 2, *words)


def test_an_unreachable_or_wrong_password_redis_url_is_one_line(tmp_path: Path):
    require_binary("redis-server")
    url = f"redis://127.0.0.1:{free_port()}/0"
    one_line(up(tmp_path, "--redis-url", url), 2, url, "cannot reach", "--redis-url")
    server = RedisServer(tmp_path / "redis").start()
    try:
        url = f"redis://someone:s3cret@127.0.0.1:{server.port}/0"
        err = one_line(up(tmp_path, "--redis-url", url), 2, "cannot reach", "password")
        assert "s3cret" not in err
    finally:
        server.stop()


def test_hitl_redis_url_is_read_by_hitl_up_as_by_the_serve_builder(monkeypatch: pytest.MonkeyPatch):
    """docs/scaling.md says HITL_REDIS_URL (or REDIS_URL): ``hitl up`` reads it too, first."""
    from hitl_review.serve_app.application import ENV_FALLBACK
    from hitl_review.serve_app.ops.launcher import settings_from_args

    for name in FOREIGN_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HITL_REDIS_URL", "redis://10.0.0.5:6379/0")
    assert settings_from_args(cli.build_parser().parse_args(["up"])).redis_url == "redis://10.0.0.5:6379/0"
    monkeypatch.setenv("REDIS_URL", "redis://10.0.0.6:6379/0")
    assert settings_from_args(cli.build_parser().parse_args(["up"])).redis_url == "redis://10.0.0.5:6379/0"
    args = cli.build_parser().parse_args(["up", "--redis-url", "redis://flag:6379/0"])
    assert settings_from_args(args).redis_url == "redis://flag:6379/0"
    assert ENV_FALLBACK["redis_url"] == config.ENV_FALLBACK["redis_url"] == ("HITL_REDIS_URL", "REDIS_URL")


def test_a_missing_redis_server_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    from hitl_review.serve_app.ops import redis_server

    for name in FOREIGN_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(redis_server, "find_binary", lambda name: None)
    argv = ["up", "--data-dir", str(tmp_path / "data"), "--api-port", str(quiet_port()), "--no-ui", "--no-dashboard"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("hitl up: redis-server not found"), err
    assert "apt-get install redis-server" in err and "--redis-url" in err


def test_hitl_version():
    proc = hitl("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith("hitl ") and proc.stdout.strip().split()[1][0].isdigit()


class _Readyz(BaseHTTPRequestHandler):
    body: dict[str, Any] = {}

    def do_GET(self) -> None:
        data = json.dumps(self.body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def readyz() -> Iterator[tuple[str, type[_Readyz]]]:
    """An HTTP server whose /readyz answers 200 with ``handler.body``: another server on the port."""
    handler = type("Handler", (_Readyz,), {"body": {}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def test_ready_is_said_only_for_this_hitl_ups_own_instance(readyz):
    from hitl_review.serve_app.ops.launcher import _wait_ready

    url, handler = readyz
    handler.body = {"ready": True, "instance": "ours"}
    assert _wait_ready(url, None, 5, instance="ours")["instance"] == "ours"
    for other in ({"ready": True, "instance": "theirs"}, {"ready": True}):  # another server, or an older build
        handler.body = other
        with pytest.raises(SystemExit, match="another server answers on .* not this hitl up's"):
            _wait_ready(url, None, 5, instance="ours", foreign_s=1)


def test_the_instance_id_reaches_the_replicas_settings():
    settings = Settings(instance_id="abc")
    assert Settings.model_validate_json(settings.model_dump_json()).instance_id == "abc"


RAY_CORE_LOG = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+ [DIWEF] \d+ \d+\] \S+\.cc:\d+: ")


@pytest.mark.ray
@pytest.mark.slow
def test_a_serve_deployment_that_fails_to_start_shows_the_replicas_own_error(tmp_path: Path):
    """A torchvision detector whose weights file is not a weights file passes the checks before start
    (the file exists) and fails in the Detector replica: the replica's error is shown, with where
    Ray's logs are, in one line at the end; no traceback."""
    require_binary("redis-server")
    weights = tmp_path / "weights.pth"
    weights.write_bytes(b"not a torch file")
    proc = hitl(
        *("up", "--data-dir", str(tmp_path / "data"), "--api-port", str(quiet_port()), "--no-ui", "--no-dashboard"),
        *("--detector", "torchvision", "--detector-weights", str(weights)),
        # Ray Serve tries the failing replica 3 times, each importing torch and torchvision: 59 s
        # alone here, 174 s and over 300 s beside the other lane of `make test` on 2 cores.
        timeout=500,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    # Ray's core worker may log one line of its own as the process exits, after ours (seen under
    # load: "[<time> E <pid> <tid>] core_worker_process.cc:…: The core worker has already been shutdown…").
    ours = [line for line in proc.stderr.strip().splitlines() if not RAY_CORE_LOG.match(line)]
    last = ours[-1]
    assert last.startswith("hitl up: the Serve application did not start: Detector"), last
    assert str(weights) in last and "logs" in last, last
