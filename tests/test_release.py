"""Project hygiene (issue 38, item 12): one version that moves with releases (``hitl --version``,
the wheel, CHANGELOG.md, the images' tags), images that install the tested versions
(constraints.txt), the documents a contributor looks for, and a set-up that refuses in one line a
``python3`` it cannot use."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import hitl_review
from hitl_review.serve_app import cli

ROOT = Path(__file__).resolve().parents[1]
KUBERAY = ROOT / "deploy" / "kuberay"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# The extras the images install (deploy/kuberay/*Dockerfile) and the demo's.
IMAGE_EXTRAS = ("server", "s3", "ui", "models")


def test_one_version_hitl_version_the_package_the_changelog_and_the_images(capsys: pytest.CaptureFixture[str]):
    version = hitl_review.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    assert PROJECT["project"]["dynamic"] == ["version"] and "version" not in PROJECT["project"]
    assert PROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "hitl_review.__version__"}
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert capsys.readouterr().out.strip() == f"hitl {version}"
    assert f"## [{version}] - " in (ROOT / "CHANGELOG.md").read_text()
    tags = re.findall(r"image: (hitl-review[\w-]*):(\S+)", "".join(p.read_text() for p in KUBERAY.glob("*.yaml")))
    tags += re.findall(r"-t (hitl-review[\w-]*):(\S+)", "".join(p.read_text() for p in KUBERAY.glob("*Dockerfile")))
    assert len(tags) >= 6 and {t.removesuffix("-gpu") for _, t in tags} == {version}, tags


def test_the_package_metadata_has_a_readme_and_classifiers_and_no_placeholder():
    project = PROJECT["project"]
    assert project["readme"] == "README.md"
    assert "Programming Language :: Python :: 3.11" in project["classifiers"]
    assert "Typing :: Typed" in project["classifiers"]
    for url in project.get("urls", {}).values():  # none until the project has a real home
        assert "example" not in url and "TODO" not in url, url


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version and re.fullmatch(r"[\w.]+", version), f"constraints.txt: {line!r} is not name==version"
            out[canonicalize_name(name)] = version
    return out


def installed(name: str) -> bool:
    try:
        md.version(name)
    except md.PackageNotFoundError:
        return False
    return True


def test_constraints_pin_every_runtime_requirement_and_no_dev_tool():
    pinned = pins()
    extras = PROJECT["project"]["optional-dependencies"]
    wanted = [*PROJECT["project"]["dependencies"], *(r for e in IMAGE_EXTRAS for r in extras[e])]
    names = {canonicalize_name(Requirement(r).name) for r in wanted} - {"hitl-review"}
    missing = sorted(n for n in names - set(pinned) if installed(n))  # one this .venv lacks cannot be frozen
    assert not missing, f"constraints.txt pins no {missing}: run .venv/bin/python scripts/freeze_constraints.py"
    for r in wanted:
        req = Requirement(r)
        if canonicalize_name(req.name) in pinned:
            assert req.specifier.contains(pinned[canonicalize_name(req.name)], prereleases=True), (r, pinned)
    assert not {"pytest", "ruff", "mypy", "hypothesis", "playwright", "locust"} & set(pinned)


@pytest.mark.parametrize("name", ["Dockerfile", "ui.Dockerfile", "migrate.Dockerfile"])
def test_the_images_install_from_the_constraints(name: str):
    text = (KUBERAY / name).read_text().replace("\\\n", " ")
    installs = [line for line in text.splitlines() if "pip install" in line and not line.lstrip().startswith("#")]
    assert installs
    for line in installs:
        assert "--mount=type=bind,source=constraints.txt,target=/tmp/constraints.txt" in line, line
        assert "pip install --no-cache-dir -c /tmp/constraints.txt " in line, line


def test_the_documents_a_contributor_looks_for():
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    for words in ("make test-fast", "make lint", "## Layout", "## Style", "freeze_constraints.py"):
        assert words in contributing, words
    assert "vulnerability" in (ROOT / "SECURITY.md").read_text().lower()
    readme = (ROOT / "README.md").read_text()
    assert "Python ≥ 3.11" in readme and "python3-venv" in readme


def fake_python(tmp_path: Path, script: str) -> dict[str, str]:
    """PATH with a ``python3`` of ours first: the set-up script sees only it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.parametrize(
    "script,words",
    [
        ("echo 3.9", ["Python 3.9", "needs Python >= 3.11", "python3-venv"]),
        ('case "$*" in *ensurepip*) exit 1;; *) echo 3.11;; esac', ["no venv module", "python3-venv"]),
    ],
)
def test_the_set_up_refuses_a_python3_it_cannot_use_in_one_line(tmp_path: Path, script: str, words: list[str]):
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ensure_system_deps.sh"), "demo"],
        env=fake_python(tmp_path, script),
        capture_output=True,
        text=True,
        timeout=30,
    )
    err = proc.stderr.strip()
    assert proc.returncode == 1 and len(err.splitlines()) == 1, proc.stderr
    assert err.startswith("setup: ") and all(w in err for w in words), err
