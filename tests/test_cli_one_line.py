"""Errors a person can act on, round two (issue 38, item 7): the archive's commands against a
PostgreSQL that does not answer, ``archive-upgrade --check`` that must change nothing, ``hitl
dispatcher`` from the base install and its environment, values ``hitl up`` must refuse before it
starts, argparse type names that leaked into messages, errors wrapped at 80 columns off a terminal,
and a manifest ``hitl submit`` named but never wrote. Each is one line, the right exit status, no
traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hitl_review.archive import cli as archive_cli
from hitl_review.serve_app import cli
from hitl_review.serve_app.ops.ports import free_port, quiet_port

ROOT = Path(__file__).resolve().parent.parent
FOREIGN_ENV = ("REDIS_URL", "HITL_REDIS_URL", "HITL_TOKENS", "HITL_DATA_DIR", "HITL_ARTIFACTS", "HITL_ARCHIVE_URL")
# The server extra's top-level modules: blocked, the interpreter is a base install (`pip install hitl-review`).
SERVER_MODULES = ("redis", "ray", "fastapi", "numpy", "cv2", "sqlalchemy", "orjson", "prometheus_client")


def hitl(*args: str, cwd: Path = ROOT, block: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV}
    code = (
        "import sys\n"
        f"for name in {block!r}: sys.modules[name] = None\n"
        "from hitl_review.serve_app.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=60, cwd=cwd
    )


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """``hitl ARGS`` in this process (fast): its exit status, stdout and stderr."""
    for name in FOREIGN_ENV:
        monkeypatch.delenv(name, raising=False)

    def call(*args: str) -> subprocess.CompletedProcess[str]:
        code = cli.main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out, err)

    return call


def one_line(proc: subprocess.CompletedProcess[str], code: int, prefix: str, *words: str) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == code, f"exit {proc.returncode}\n{proc.stderr}"
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(prefix), err
    for word in words:
        assert word in err, err
    return err


def dead_postgres() -> str:
    return f"postgresql://someone:s3cret@127.0.0.1:{free_port()}/hitl"


def test_export_against_an_unreachable_postgresql_is_one_line_and_json_under_json(tmp_path: Path, run):
    url = dead_postgres()
    proc = run("export", "--format", "coco", "--out", str(tmp_path / "out"), "--archive-url", url, "--json")
    err = one_line(proc, 1, "hitl export: ", "cannot reach the archive", "127.0.0.1")
    assert "s3cret" not in err and "s3cret" not in proc.stdout
    body = json.loads(proc.stdout)
    assert body["error"]["code"] == "ARCHIVE_UNREACHABLE" and "127.0.0.1" in body["error"]["message"]
    proc = run("export", "--format", "yolo", "--out", str(tmp_path / "out"), "--archive-url", url)
    one_line(proc, 1, "hitl export: ", "cannot reach the archive")
    assert proc.stdout == ""


def test_archive_upgrade_against_an_unreachable_postgresql_is_one_line(run):
    for check in ((), ("--check",)):
        proc = run("admin", "archive-upgrade", "--archive-url", dead_postgres(), *check)
        err = one_line(proc, 1, "hitl admin archive-upgrade: ", "cannot reach the archive")
        assert "s3cret" not in err


def test_archive_upgrade_check_creates_nothing(tmp_path: Path, run, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    proc = run("admin", "archive-upgrade", "--check")
    assert proc.returncode == 1, proc.stderr  # behind: there is no archive at all
    assert "no archive" in proc.stdout + proc.stderr
    assert list(tmp_path.iterdir()) == []  # neither .hitl/ nor archive.sqlite3


def test_a_missing_module_of_our_own_is_a_broken_install_not_a_missing_extra():
    def broken() -> int:
        raise ModuleNotFoundError("No module named 'hitl_review.archive.gone'", name="hitl_review.archive.gone")

    with pytest.raises(ModuleNotFoundError):
        archive_cli._needs_extra("export", "export", broken)


def test_dispatcher_from_the_base_install_names_the_extra(tmp_path: Path):
    proc = hitl("dispatcher", "--data-dir", str(tmp_path), "--redis-url", "redis://127.0.0.1:1/0", block=SERVER_MODULES)
    one_line(proc, 2, "hitl dispatcher: ", "pip install '.[server]'", "missing:")


def test_dispatcher_reads_hitl_redis_url_and_hitl_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from hitl_review.serve_app.work.standalone import settings_for

    for name in FOREIGN_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HITL_REDIS_URL", "redis://10.0.0.5:6379/0")
    monkeypatch.setenv("REDIS_URL", "redis://10.0.0.6:6379/0")
    monkeypatch.setenv("HITL_DATA_DIR", str(tmp_path))
    settings = settings_for(cli.build_parser().parse_args(["dispatcher"]))
    assert settings.redis_url == "redis://10.0.0.5:6379/0"
    assert settings.data_dir == tmp_path.resolve()
    args = cli.build_parser().parse_args(["dispatcher", "--redis-url", "redis://flag:6379/0", "--data-dir", "x"])
    assert settings_for(args).redis_url == "redis://flag:6379/0"


@pytest.mark.parametrize(
    "flag,value,words",
    [
        ("--retention-days", "-1", ["--retention-days -1", "0 or more"]),
        ("--api-port", "99999", ["--api-port 99999", "1..65535"]),
        ("--archive-url", "mysql://u:s3cret@db/hitl", ["--archive-url", "postgresql://", "sqlite:///"]),
    ],
)
def test_out_of_range_values_are_refused_before_the_start(tmp_path: Path, run, flag: str, value: str, words: list[str]):
    base = ["up", "--data-dir", str(tmp_path / "data"), "--no-ui", "--no-dashboard"]
    port = [] if flag == "--api-port" else ["--api-port", str(quiet_port())]
    proc = run(*base, *port, flag, value)
    err = one_line(proc, 2, "hitl up: ", *words)
    assert "s3cret" not in err
    assert not (tmp_path / "data").exists()


def test_argparse_type_messages_name_the_value_not_a_function(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as stop:
        cli.main(["jobs", "--limit", "many"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "_positive_int" not in err and "invalid" not in err, err
    assert "--limit: 'many' is not a whole number" in err, err
    with pytest.raises(SystemExit):
        cli.main(["results", "job_x", "--timeout", "soon"])
    err = capsys.readouterr().err
    assert "_positive_float" not in err and "'soon' is not a number of seconds" in err, err


def test_errors_are_not_wrapped_off_a_terminal_and_no_unwritten_manifest_is_named(tmp_path: Path, run):
    images = tmp_path / "images"
    images.mkdir()
    (images / "a.txt").write_text("not an image")
    (images / "b.png").write_bytes(
        bytes.fromhex(
            "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c4944415408d763f8cfc000000301"
            "0100c9fe92ef0000000049454e44ae426082"
        )
    )
    data = tmp_path / "data"
    long_name = "x" * 90  # an error longer than 80 columns: one line all the same
    url = f"http://127.0.0.1:{free_port()}/{long_name}"
    proc = run("submit", str(images), "--api-url", url, "--token", "t", "--data-dir", str(data), "--no-progress")
    assert proc.returncode == 1, proc.stderr
    stopped = [line for line in proc.stderr.splitlines() if line.startswith("stopped early:")]
    assert len(stopped) == 1 and long_name in stopped[0] and "Connection refused" in stopped[0], proc.stderr
    assert not data.exists()  # nothing was submitted: no manifest was written ...
    assert "manifest:" not in proc.stdout, proc.stdout  # ... and none is named
