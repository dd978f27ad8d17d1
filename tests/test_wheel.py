"""What the wheel ships (issue 20, "a package that installs cleanly"): the product's packages, typed
(``py.typed`` in statecore and client, PEP 561), the licence in its ``.dist-info``, and no test code
(``harness/``, ``loadtest/``, ``tests/``, ``benchmarks/``: they run from the checkout).

The wheel is built from a copy of the sources that holds the test code too, so leaving it out is
the package configuration's doing and not the copy's; building writes nothing (build/, *.egg-info)
into the working tree others share."""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = (
    "statecore",
    "serve_app",
    "deployments",
    "ui",
    "client",
    "archive",
)
TEST_CODE = ("harness", "loadtest", "tests", "benchmarks")
TYPED = ("statecore", "client")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "LICENSE", "README.md"):  # setup.py: the link check
        shutil.copy2(ROOT / name, src / name)
    for pkg in ("hitl_review", *PRODUCT, *TEST_CODE):  # hitl_review/ as it is: links to the folders
        ignore = shutil.ignore_patterns("__pycache__", "out", "*.pyc")
        shutil.copytree(ROOT / pkg, src / pkg, ignore=ignore, symlinks=True)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist")]
    proc = subprocess.run([*cmd, str(src)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = (tmp / "dist").glob("hitl_review-*.whl")
    with zipfile.ZipFile(path) as zf:
        yield zf


def top_levels(names: list[str]) -> set[str]:
    return {n.split("/", 1)[0] for n in names if "/" in n and ".dist-info/" not in n}


def test_the_wheel_holds_the_product_and_no_test_code(wheel: zipfile.ZipFile):
    names = wheel.namelist()
    assert top_levels(names) == {"hitl_review"}, sorted(top_levels(names))  # one import name
    subpackages = {n.split("/")[1] for n in names if n.startswith("hitl_review/") and n.count("/") >= 2}
    assert subpackages == set(PRODUCT), sorted(subpackages)
    leaked = [n for n in names if n.split("/")[1] in TEST_CODE or "/tests/" in n or "conftest" in n]
    assert not leaked, leaked[:10]
    # Data the code reads at run time comes along.
    assert any(n.startswith("hitl_review/statecore/lua/") and n.endswith(".lua") for n in names)
    assert "hitl_review/archive/alembic/script.py.mako" in names


def test_the_typed_packages_carry_py_typed(wheel: zipfile.ZipFile):
    names = set(wheel.namelist())
    for pkg in TYPED:
        assert (ROOT / pkg / "py.typed").is_file(), f"{pkg}/py.typed is missing from the checkout"
        assert f"hitl_review/{pkg}/py.typed" in names, f"{pkg}/py.typed is not in the wheel (package-data)"


def test_the_licence_is_in_the_dist_info_and_the_metadata(wheel: zipfile.ZipFile):
    names = wheel.namelist()
    licences = [n for n in names if ".dist-info/" in n and n.rsplit("/", 1)[-1] == "LICENSE"]
    assert licences, [n for n in names if ".dist-info/" in n]
    assert wheel.read(licences[0]) == (ROOT / "LICENSE").read_bytes()
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    meta = email.message_from_bytes(wheel.read(metadata))
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["License-Expression"] == pyproject["license"] == "MIT"
    assert meta.get_all("License-File") == ["LICENSE"]


def test_the_console_script_is_declared(wheel: zipfile.ZipFile):
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    assert "hitl = hitl_review.serve_app.cli:main" in wheel.read(entry_points).decode()


def test_the_demo_extra_installs_no_torch():
    """`make demo` installs `.[demo]` (the classical models): torch and its CUDA libraries stay with
    `models`, which `make setup` adds."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def closure(name: str) -> list[str]:
        out: list[str] = []
        for req in extras[name]:
            if req.startswith("hitl-review["):
                for inner in req[len("hitl-review[") : -1].split(","):
                    out += closure(inner)
            else:
                out.append(req)
        return out

    demo = closure("demo")
    assert not [r for r in demo if r.startswith(("torch", "segment-anything", "pycocotools"))], demo
    assert any(r.startswith("scikit-image") for r in demo)  # the demo's photographs (serve_app/ops/samples.py)
    makefile = (ROOT / "Makefile").read_text()
    assert "install -q -e '.[demo]'" in makefile and "'.[demo,models,export,dev]'" in makefile


def test_the_metadata_carries_the_version_the_readme_and_the_classifiers(wheel: zipfile.ZipFile):
    """Issue 38, item 12: what an index shows (PyPI's page is the README) and the version `hitl
    --version` says."""
    import hitl_review

    (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    meta = email.message_from_bytes(wheel.read(metadata))
    assert meta["Version"] == hitl_review.__version__
    assert meta["Description-Content-Type"] == "text/markdown"
    assert "hitl-review" in meta.get_payload() and "make demo" in meta.get_payload()
    assert "Programming Language :: Python :: 3.11" in meta.get_all("Classifier")
