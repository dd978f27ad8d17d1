"""The build's one check before setuptools (the configuration is pyproject.toml): the subpackages of
``hitl_review`` are the repository's top-level folders, linked under ``hitl_review/`` (SPEC.md §1).
A checkout without symbolic links (Windows' default ``core.symlinks=false``, a ZIP download) has
plain files there holding the links' targets, and would build a wheel with only
``hitl_review/__init__.py``: refuse it in one line that names the cause and the fix."""

from pathlib import Path

from setuptools import setup

SUBPACKAGES = ("archive", "client", "deployments", "serve_app", "statecore", "ui")
HERE = Path(__file__).resolve().parent

missing = [name for name in SUBPACKAGES if not (HERE / "hitl_review" / name / "__init__.py").is_file()]
if missing:
    raise SystemExit(
        f"hitl-review: hitl_review/{missing[0]} is not a package (is it a plain file instead of the symbolic link "
        f"to ../{missing[0]}?): this checkout has no symbolic links; clone with them (git clone -c core.symlinks=true; "
        "on Windows enable Developer Mode first) or install the published wheel"
    )

setup()
