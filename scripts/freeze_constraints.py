"""Write constraints.txt: the exact versions of every distribution the images install (the runtime
dependencies of hitl-review with the extras the Dockerfiles in deploy/kuberay ask for, and what they
pull in), taken from ``pip freeze`` of this checkout's .venv, so an image built later resolves to what
the tests ran against. Dev tools (pytest, ruff, …) are left out. Run after changing a dependency:

    .venv/bin/python scripts/freeze_constraints.py
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
# What the images install (deploy/kuberay/*Dockerfile) and `make demo`'s: every extra but dev.
EXTRAS = ("server", "s3", "export", "ui", "models", "demo")


def requirements() -> list[Requirement]:
    """hitl-review's own runtime requirements under EXTRAS, from pyproject.toml (an editable install's
    metadata may be older)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    lines = [*project["dependencies"], *(line for extra in EXTRAS for line in extras[extra])]
    return [r for r in map(Requirement, lines) if canonicalize_name(r.name) != "hitl-review"]


def runtime_closure() -> tuple[set[str], set[str]]:
    """The canonical names of those requirements and of what they pull in as installed here
    (each requirement's own extras followed); and the requirements not installed here."""
    seen: set[str] = set()
    absent: set[str] = set()
    todo = [(canonicalize_name(r.name), frozenset(r.extras)) for r in requirements()]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in done:
            continue
        done.add((name, extras))
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            absent.add(name)
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in (*extras, "")):
                continue
            todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    return seen - absent, absent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Write constraints.txt: the runtime dependencies' versions as installed in this .venv "
        "(the images install with pip -c constraints.txt). Run it after changing a dependency in pyproject.toml."
    )
    ap.parse_args(argv)
    wanted, absent = runtime_closure()
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True, check=True
    ).stdout
    pins = []
    for line in frozen.splitlines():
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)", line.strip())
        if m and canonicalize_name(m[1]) in wanted:
            pins.append(f"{canonicalize_name(m[1])}=={m[2].split('+', 1)[0]}")  # no local label: +cpu/+cu12x both match
    header = (
        "# The versions the images install (deploy/kuberay/*Dockerfile: pip install -c constraints.txt), frozen\n"
        "# from the tested .venv by scripts/freeze_constraints.py; regenerate it after changing a dependency.\n"
    )
    (ROOT / "constraints.txt").write_text(header + "\n".join(sorted(pins)) + "\n")
    print(f"constraints.txt: {len(pins)} pins")
    if absent:  # an extra `make setup` does not install: those float until this .venv has them
        print(f"not installed here, not pinned: {', '.join(sorted(absent))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
