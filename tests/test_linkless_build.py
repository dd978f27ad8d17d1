"""A checkout without symbolic links (issue 38, item 13): Windows' default ``core.symlinks=false`` or
a ZIP download leaves plain files holding the links' targets where ``hitl_review/statecore`` and its
siblings link to the top-level folders; the build must refuse it in one line (setup.py) instead of
building a wheel with only ``hitl_review/__init__.py``. The build runs on a copy: it writes nothing
into the working tree others share."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("statecore", "serve_app", "deployments", "ui", "client", "archive")


def test_a_checkout_without_symbolic_links_fails_to_build_in_one_line(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "LICENSE", "README.md"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for pkg in ("hitl_review", *PRODUCT):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=ignore, symlinks=True)
    links = [p for p in (src / "hitl_review").iterdir() if p.is_symlink()]
    assert sorted(p.name for p in links) == sorted(PRODUCT)
    for link in links:  # as git writes them with core.symlinks=false: a file holding the target
        target = os.readlink(link)
        link.unlink()
        link.write_text(target)
    dist = tmp_path / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist)]
    proc = subprocess.run([*cmd, str(src)], capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert not list(dist.glob("*.whl")), out
    (line,) = [line for line in out.splitlines() if "hitl-review: hitl_review/" in line]
    assert "is not a package" in line and "no symbolic links" in line and "core.symlinks=true" in line, line
