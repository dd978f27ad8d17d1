"""The base distribution is the client: it installs and runs without the server's packages.

Builds the wheel from a copy of the sources, installs it with its base
dependencies from the package index into a fresh virtual environment (no
system site packages), and runs what a batch submitter runs there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("statecore", "serve_app", "deployments", "ui", "client", "archive")
PACKAGES = ("hitl_review", *PRODUCT, "loadtest", "harness")
SERVER_SIDE = ("torch", "torchvision", "ray", "gradio", "fastapi", "redis", "uvicorn", "numpy", "cv2", "PIL")


def run(*cmd: str | Path, timeout: float = 300, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding only the wheel and its base dependencies; returns its bin directory."""
    tmp = tmp_path_factory.mktemp("packaging")
    src = tmp / "src"
    src.mkdir()
    # A copy, so building writes nothing (build/, *.egg-info) into the working tree others share.
    shutil.copy2(ROOT / "pyproject.toml", src / "pyproject.toml")
    for pkg in PACKAGES:
        if (ROOT / pkg).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "out", "*.pyc")
            shutil.copytree(ROOT / pkg, src / pkg, ignore=ignore, symlinks=True)  # hitl_review/: links
    t0 = time.monotonic()
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp / "dist", src)
    (wheel,) = (tmp / "dist").glob("hitl_review-*.whl")
    venv = tmp / "venv"
    run(sys.executable, "-m", "venv", venv)  # without --system-site-packages
    bin_dir = venv / "bin"
    run(bin_dir / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel, timeout=600)
    print(f"built and installed the base package in {time.monotonic() - t0:.1f}s")
    return bin_dir


def env_without_the_repo() -> dict[str, str]:
    """Nothing may leak in from the checkout or the project's own venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def test_hitl_submit_help_runs_from_the_base_install(base_venv: Path, tmp_path: Path):
    proc = run(base_venv / "hitl", "submit", "--help", cwd=tmp_path, env=env_without_the_repo())
    assert proc.stdout.startswith("usage: hitl submit")
    assert "--api-url" in proc.stdout and "Idempotency-Key" in proc.stdout
    proc = run(base_venv / "hitl", "--help", cwd=tmp_path, env=env_without_the_repo())
    assert "hitl-review[demo]" in proc.stdout


def test_the_install_holds_one_import_name_and_nothing_under_a_generic_one(base_venv: Path, tmp_path: Path):
    """What the wheel put in site-packages, from pip's own record: ``hitl_review`` and its metadata
    only; ``import client`` (or any of the repository's folder names) finds nothing."""
    code = (
        "import importlib.metadata as md, importlib.util, json\n"
        "files = md.distribution('hitl-review').files\n"
        "tops = sorted({f.parts[0] for f in files if len(f.parts) > 1 and f.parts[0] != '..'})\n"
        "tops = [t for t in tops if not t.endswith('.dist-info')]\n"
        f"bare = [m for m in {PRODUCT!r} if importlib.util.find_spec(m) is not None]\n"
        "print(json.dumps([tops, bare]))"
    )
    proc = run(base_venv / "python", "-c", code, cwd=tmp_path, env=env_without_the_repo())
    tops, bare = json.loads(proc.stdout)
    assert tops == ["hitl_review"], tops  # ("..": the console script, in bin/)
    assert bare == [], f"importable under a generic name: {bare}"


def test_the_client_imports_and_the_server_packages_are_absent(base_venv: Path, tmp_path: Path):
    code = (
        "import importlib.util\n"
        "from hitl_review import client\n"
        "import hitl_review.serve_app.cli\n"
        "assert client.__file__.find('site-packages') > 0, client.__file__\n"
        f"print(','.join(m for m in {SERVER_SIDE!r} if importlib.util.find_spec(m) is not None))"
    )
    proc = run(base_venv / "python", "-c", code, cwd=tmp_path, env=env_without_the_repo())
    assert proc.stdout.strip() == "", f"server-side packages installed by the base package: {proc.stdout}"


def test_hitl_submit_runs_and_hitl_up_explains_the_extra(base_venv: Path, tmp_path: Path):
    image = tmp_path / "a.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    env = {**env_without_the_repo(), "HITL_TOKEN": "t"}
    # Port 9 is closed: the client gets as far as connecting, reports it, and fails.
    proc = run(
        base_venv / "hitl",
        "submit",
        image,
        "--json",
        "--api-url",
        "http://127.0.0.1:9",
        "--manifest",
        tmp_path / "m.jsonl",
        cwd=tmp_path,
        env=env,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["counts"] == {"failed": 1} and "ConnectError" in summary["files"][0]["error"]
    proc = run(base_venv / "hitl", "up", "--no-ui", cwd=tmp_path, env=env, check=False)
    assert proc.returncode == 2
    assert "pip install 'hitl-review[demo]'" in proc.stderr
