"""The images and the pods of ``deploy/kuberay/``: each Dockerfile builds the project's wheel and
installs only it (no sources beside the installed package), the build context leaves out venvs, git,
data and the API token, the migration Job runs a CPU image, every pod runs unprivileged with no
secret on a command line, and users are shown the installed package's import path
(``hitl_review.serve_app.application:…``), which is the only one a pip install has."""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml
from pydantic import ValidationError
from ray._common.utils import import_attr
from ray.serve._private.api import call_user_app_builder_with_args_if_necessary

from tests.test_deploy_manifests import (
    KUBERAY,
    ROOT,
    manifest_files,
    manifests,
    pods,
    rayservice,
    secret_env,
)


def test_the_ui_runs_the_installed_package_s_entrypoint():
    """`python -m ui` in the pod ran a second copy of the modules from sources left in the image's
    working directory: the pod gives arguments only, the image's entrypoint is the installed package."""
    [container] = manifests("ui.yaml")["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert "command" not in container
    assert entrypoint(KUBERAY / "ui.Dockerfile") == ["python", "-m", "hitl_review.ui"]


def test_the_image_is_the_one_the_dockerfile_builds():
    """deploy/kuberay/Dockerfile builds on the Ray this project pins, and the RayService runs the
    tag its build command names."""
    dockerfile = KUBERAY / "Dockerfile"
    for base in {stage[0].split()[1] for stage in stages(dockerfile)}:
        assert base.startswith(f"rayproject/ray:{ray.__version__}-") and base.endswith("-gpu")
    images = {c["image"] for pod in pods(rayservice()) for c in pod["containers"]}
    assert images == {built_tag(dockerfile)}


def built_tag(dockerfile: Path) -> str:
    """The tag the `docker build` command in the Dockerfile's header names."""
    text = dockerfile.read_text()
    [tag] = [w for line in text.splitlines() if "docker build" in line for w in line.split()[1:] if ":" in w]
    return tag


def stages(dockerfile: Path) -> list[list[str]]:
    """The Dockerfile's instructions (continuation lines joined, comments left out), by FROM stage."""
    out: list[list[str]] = []
    for line in dockerfile.read_text().replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            out.append([])
        out[-1].append(line)
    return out


def entrypoint(dockerfile: Path) -> list[str]:
    [line] = [i for i in stages(dockerfile)[-1] if i.upper().startswith("ENTRYPOINT ")]
    return json.loads(line.split(None, 1)[1])


IMAGES = {"Dockerfile": "server,models,s3", "ui.Dockerfile": "ui", "migrate.Dockerfile": ""}


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_the_images_install_the_wheel_and_keep_no_sources(name):
    """Each image builds the project's wheel in a stage of its own and installs only that wheel (its
    extras from the index): no checkout beside the installed package, where the working directory
    would import a second copy of it. The final stage runs as a user, never as root."""
    dockerfile = KUBERAY / name
    *build, final = stages(dockerfile)
    assert build, f"{name}: no stage builds the wheel"
    assert any("pip wheel" in i and "--no-deps" in i for stage in build for i in stage)
    assert not [i for i in final if i.upper().startswith(("COPY ", "ADD "))], f"{name}: sources copied"
    [install] = [i for i in final if "--mount=type=bind,from=" in i and "pip install" in i]
    assert ".whl" in install and (not IMAGES[name] or f"[{IMAGES[name]}]" in install)
    users = [i.split()[1] for i in final if i.upper().startswith("USER ")]
    assert users and users[-1].isdigit() and users[-1] != "0"  # numeric: runAsNonRoot can verify it


def test_the_migration_job_runs_a_cpu_image_with_what_the_migrations_import():
    """The archive's migrations need SQLAlchemy, Alembic and psycopg, not Ray, torch or a GPU image:
    the Job pulls deploy/kuberay/migrate.Dockerfile's image, whose requirements are the server extra's
    own lines and hold every distribution `hitl_review.archive.migrate` imports."""
    job = manifests("archive-migrate.yaml")["Job"]
    [migrate] = job["spec"]["template"]["spec"]["containers"]
    dockerfile = KUBERAY / "migrate.Dockerfile"
    assert migrate["image"] == built_tag(dockerfile)
    assert "gpu" not in migrate["image"] and "nvidia.com/gpu" not in str(migrate["resources"])
    final = stages(dockerfile)[-1]
    assert final[0].split()[1].startswith("python:3.11-slim")
    [install] = [i for i in final if "pip install" in i]
    wanted = set(re.findall(r"'([^']+)'", install))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert wanted and wanted <= set(project["optional-dependencies"]["server"])
    code = (
        "import importlib.metadata as md, json, sys\n"
        "before = set(sys.modules)\n"  # what the interpreter loaded at start (site's .pth hooks)
        "import hitl_review.archive.migrate\n"
        "dists = md.packages_distributions()\n"
        "new = set(sys.modules) - before\n"
        "print(json.dumps(sorted({d for m in new for d in dists.get(m.split('.')[0], [])})))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    imported = {d.lower().replace("_", "-") for d in json.loads(proc.stdout)}
    provided = {re.split(r"[\[<>=]", r)[0].lower() for r in [*wanted, *project["dependencies"]]}
    assert imported - {"hitl-review"} <= provided | dependencies_of(provided), sorted(imported - provided)


def dependencies_of(names: set[str]) -> set[str]:
    """What the named distributions install in turn (their requirements, transitively, extras left out)."""
    import importlib.metadata as md

    seen: set[str] = set()
    todo = list(names)
    while todo:
        try:
            requires = md.requires(todo.pop()) or []
        except md.PackageNotFoundError:
            continue
        for r in requires:
            if "extra ==" in r:
                continue
            name = re.split(r"[\[<>=!~; ]", r)[0].lower().replace("_", "-")
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


def test_the_build_context_leaves_out_what_no_image_needs():
    """`docker build … .` sends the repository: never the venvs, git, data, the API token, caches."""
    patterns = [
        line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip() and line[0] != "#"
    ]

    def ignored(path: str) -> bool:
        hit = False
        for pattern in patterns:
            negated = pattern.startswith("!")
            pat = pattern.lstrip("!").rstrip("/")
            parts = path.split("/")
            prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
            if any(fnmatch.fnmatch(p, pat) or fnmatch.fnmatch(p, pat.removeprefix("**/")) for p in prefixes) or any(
                fnmatch.fnmatch("/".join(parts[i:]), pat.removeprefix("**/")) for i in range(len(parts))
            ):
                hit = not negated
        return hit

    for path in (
        ".venv/bin/python",
        ".venv-demo/lib",
        ".git/config",
        ".hitl/api-token",
        ".hitl/redis/appendonly.aof",
        "data/api-token",
        "benchmarks/out/chaos.json",
        "loadtest/out/run.json",
        "serve_app/__pycache__/api.cpython-311.pyc",
        ".pytest_cache/v",
        ".mypy_cache/3.11",
        ".ruff_cache/x",
        ".hypothesis/examples",
        "hitl_review.egg-info/PKG-INFO",
    ):
        assert ignored(path), path
    for path in ("pyproject.toml", "README.md", "serve_app/routes/api.py", "hitl_review/__init__.py", "ui/app.py"):
        assert not ignored(path), path


def pod_templates() -> list[tuple[str, dict[str, Any]]]:
    """Every pod the manifests of deploy/kuberay/ make: (where, pod spec)."""
    out = [(f"rayservice.yaml {n}", pod) for n, pod in zip(("head", "gpu"), pods(rayservice()), strict=False)]
    for path in manifest_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] in ("Deployment", "StatefulSet", "Job", "DaemonSet"):
                out.append((f"{path.name} {doc['kind']}", doc["spec"]["template"]["spec"]))
    return out


# Ray writes its session directory, logs and runtime environments under /tmp and the home directory
# at run time, where it chooses: its pods keep a writable root filesystem (the rest of the hardening
# holds). Every other container runs with a read-only one and emptyDir volumes where it writes.
WRITABLE_ROOT = {"ray-head", "ray-worker"}


def test_every_pod_runs_unprivileged():
    """No root, no privilege escalation, no capabilities, a read-only root filesystem where the
    process allows: what the `restricted` Pod Security Standard asks."""
    found = pod_templates()
    assert len(found) >= 6
    for where, pod in found:
        context = pod.get("securityContext", {})
        assert context.get("runAsNonRoot") is True, where
        assert context.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            sc = c.get("securityContext", {})
            assert sc.get("allowPrivilegeEscalation") is False, f"{where} {c['name']}"
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], f"{where} {c['name']}"
            assert sc.get("readOnlyRootFilesystem") is (c["name"] not in WRITABLE_ROOT), f"{where} {c['name']}"
            assert sc.get("runAsNonRoot", True) and sc.get("runAsUser", 1) != 0, f"{where} {c['name']}"


def test_no_secret_is_in_a_container_command_line():
    """A Secret's value expanded into command or args ($(VAR)) shows in `ps` on the node and in the
    process's /proc/*/cmdline: secrets reach processes through the environment or files only."""
    for where, pod in pod_templates():
        for c in pod["containers"]:
            secrets = set(secret_env(c))
            line = " ".join(map(str, [*c.get("command", []), *c.get("args", [])]))
            assert not {v for v in re.findall(r"\$\((\w+)\)", line) if v in secrets}, f"{where} {c['name']}"


def test_the_import_path_users_see_is_the_installed_package():
    """With a pip install only `hitl_review.serve_app.application:…` imports (the bare `serve_app` is a
    checkout's folder): README, the docs, deploy/ and the builder's own error name that one."""
    bare = re.compile(r"(?<![\w.])serve_app\.application:")
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "deploy").rglob("*.y*ml"))]
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in texts
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if bare.search(line)
    ]
    assert found == []
    build = import_attr("hitl_review.serve_app.application:build_app")
    with pytest.raises(ValidationError) as e:
        call_user_app_builder_with_args_if_necessary(build, {})
    assert "serve run hitl_review.serve_app.application:build_app" in str(e.value)
    assert not bare.search(str(e.value))
