"""What a cluster needs of this project comes from one place, ``serve_app.serving.ray_runtime.REPLICA_PACKAGES``
(issue 20): the import graph of the Serve application (its builder, the Api and Archiver replicas, the
model deployments), the runtime environment ``hitl up --ray-address`` ships to a joined cluster, and
the KubeRay image (deploy/kuberay/Dockerfile) must all agree with it. The reviewer UI's image
(deploy/kuberay/ui.Dockerfile) must hold what ``python -m hitl_review.ui`` imports.

The graph is grimp's (tests/test_architecture.py builds the same one): it follows imports inside
functions too, which is how the replicas reach ``archive`` (``serve_app.work.archiving`` opens the archive
when a replica starts); a subprocess that imports the entry modules checks that the graph misses
nothing a plain import pulls in."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

from hitl_review.serve_app.serving import ray_runtime
from hitl_review.serve_app.serving.ray_runtime import REPLICA_PACKAGES
from tests.test_architecture import PACKAGES, PRODUCT

ROOT = Path(__file__).resolve().parent.parent
KUBERAY = ROOT / "deploy" / "kuberay"
# Where a Serve application of this project starts: the builder's module (import_path
# serve_app.application:build_app), the Archiver's, and the model deployments'.
SERVE_ENTRIES = (
    "hitl_review.serve_app.application",
    "hitl_review.serve_app.work.archiver_deployment",
    "hitl_review.deployments.serve",
)
UI_ENTRIES = ("hitl_review.ui.__main__",)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def packages_reached(graph: grimp.ImportGraph, entries: tuple[str, ...]) -> set[str]:
    """The project's top-level packages the entry modules import, directly or not, at any depth."""
    modules = set(entries)
    for entry in entries:
        modules |= graph.find_upstream_modules(entry)
    return {m.split(".")[1] if m.startswith("hitl_review.") else m.split(".")[0] for m in modules}


def copied_directories(dockerfile: Path) -> set[str]:
    """The sources of the Dockerfile's COPY instructions (flags left out), continuation lines joined."""
    text = dockerfile.read_text().replace("\\\n", " ")
    out: set[str] = set()
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0].upper() == "COPY":
            sources = [w for w in words[1:] if not w.startswith("--")][:-1]
            out |= {s.rstrip("/") for s in sources}
    return out


def installed_extras(dockerfile: Path) -> set[str]:
    """The extras of the project the Dockerfile's pip installs: ``'.[a,b]'`` from a checkout, or the
    wheel its first stage built, ``"$1[a,b]"`` (the wheel's path in ``$1``) or ``x.whl[a,b]``."""
    text = dockerfile.read_text().replace("\\\n", " ")
    out: set[str] = set()
    for word in shlex.split(text, comments=True):
        m = re.fullmatch(r"(?:\.|\$\w+|\S+\.whl)\[([\w,-]+)\]", word)
        if m:
            out |= set(m[1].split(","))
    return out


def test_replica_packages_are_what_the_serve_application_imports(graph):
    reached = packages_reached(graph, SERVE_ENTRIES)
    assert reached == set(REPLICA_PACKAGES), (
        f"the Serve application imports {sorted(reached)}; REPLICA_PACKAGES says {sorted(REPLICA_PACKAGES)}"
    )
    assert len(REPLICA_PACKAGES) == len(set(REPLICA_PACKAGES))


def test_a_plain_import_pulls_in_nothing_the_graph_missed():
    """In a fresh interpreter: what importing the entry modules loads (before any replica starts) is
    inside REPLICA_PACKAGES, all of it under the hitl_review name (no second copy under a bare one)."""
    code = (
        "import importlib, json, sys\n"
        f"for m in {list(SERVE_ENTRIES)!r}: importlib.import_module(m)\n"
        "print(json.dumps([sorted({n.split('.')[1] for n in sys.modules if n.startswith('hitl_review.')}),\n"
        f"  sorted({{n.split('.')[0] for n in sys.modules}} & set({list(PRODUCT)!r}))]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    loaded, bare = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded and set(loaded) <= set(REPLICA_PACKAGES), sorted(set(loaded) - set(REPLICA_PACKAGES))
    assert bare == [], bare


def test_a_joined_cluster_gets_every_replica_package():
    env = ray_runtime.runtime_env()
    [package] = env["py_modules"]
    assert Path(package).name == "hitl_review" and (Path(package) / "__init__.py").exists()
    assert all((Path(package) / name / "__init__.py").exists() for name in REPLICA_PACKAGES)


def test_the_kuberay_image_copies_every_replica_package():
    dockerfile = KUBERAY / "Dockerfile"
    copied = copied_directories(dockerfile)
    missing = sorted({"hitl_review", *REPLICA_PACKAGES} - copied)
    assert not missing, f"deploy/kuberay/Dockerfile copies no {', '.join(missing)}: the replicas import it"
    assert {"server", "models", "s3"} <= installed_extras(dockerfile)


def test_the_ui_image_copies_what_the_ui_imports(graph):
    dockerfile = KUBERAY / "ui.Dockerfile"
    reached = packages_reached(graph, UI_ENTRIES)
    assert {"ui", "client"} <= reached
    missing = sorted({"hitl_review", *reached} - copied_directories(dockerfile))
    assert not missing, f"deploy/kuberay/ui.Dockerfile copies no {', '.join(missing)}: the UI imports it"
    assert "ui" in installed_extras(dockerfile)


def test_every_replica_package_is_in_the_distribution():
    """``pip install .`` in the image installs these packages (setuptools' find include)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    assert include == ["hitl_review", "hitl_review.*"]
    for name in REPLICA_PACKAGES:
        assert (ROOT / "hitl_review" / name).resolve() == (ROOT / name).resolve()
    assert any(d.startswith("s3fs") for d in pyproject["project"]["optional-dependencies"]["s3"])


def test_the_dockerfile_parser_sees_a_missing_package(tmp_path: Path):
    """The check above can fail: the Dockerfile as it was (no archive/) is caught."""
    old = tmp_path / "Dockerfile"
    old.write_text(
        "FROM rayproject/ray:2.60.0-py311-gpu\n"
        "COPY --chown=ray:users statecore statecore\n"
        "COPY --chown=ray:users serve_app serve_app\n"
        "COPY --chown=ray:users deployments deployments\n"
        "RUN pip install --no-cache-dir torch==2.14.1 \\\n && pip install '.[server,models]'\n"
    )
    assert set(REPLICA_PACKAGES) - copied_directories(old) == {"archive"}
    assert installed_extras(old) == {"server", "models"}
