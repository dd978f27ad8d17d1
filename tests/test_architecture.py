"""The shape of the house, checked: no import cycles among the project's modules, no module much
over 500 lines without a reason at its top, the state core free of the serving stack, and no
``sys.path`` edits (everything imports through the installed project)."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
# The product under its one import name (the repository's top-level folders, linked under
# hitl_review/), and the test code that imports it.
PRODUCT = ("statecore", "serve_app", "deployments", "ui", "client", "archive")
PACKAGES = ("hitl_review", "loadtest", "harness")
MAX_LINES = 520  # "about 500"
LONG_REASON = "Why this module is long:"


def _tracked_python() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / line for line in out.split() if line and (ROOT / line).exists()]


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles_among_the_projects_modules():
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert len(graph.modules) > 50
    cycles = _cycles(graph)
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_state_core_imports_no_serving_stack():
    graph = grimp.build_graph(*PACKAGES, "ray", "fastapi", "gradio", "torch", cache_dir=None)
    for heavy in (
        "ray",
        "fastapi",
        "gradio",
        "torch",
        "hitl_review.serve_app",
        "hitl_review.deployments",
        "hitl_review.ui",
    ):
        chain = graph.find_shortest_chain(importer="hitl_review.statecore", imported=heavy, as_packages=True)
        assert chain is None, f"statecore reaches {heavy}: {' -> '.join(chain)}"


def test_the_product_is_imported_through_its_namespace_only():
    """``from statecore import …`` would load a second copy of a module beside ``hitl_review.statecore``
    (two registries, two metric sets) and fails in an installed wheel, which has no ``statecore``."""
    bare = []
    for path in _tracked_python():
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            bare += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] in PRODUCT]
    assert bare == [], bare[:20]


def test_every_top_level_folder_of_the_product_is_linked_in_the_namespace():
    for name in PRODUCT:
        link = ROOT / "hitl_review" / name
        assert link.is_symlink() and link.resolve() == (ROOT / name).resolve(), link


def test_no_module_is_over_about_500_lines_without_a_reason_at_its_top():
    long = []
    for path in _tracked_python():
        text = path.read_text()
        n = text.count("\n")
        if n > MAX_LINES:
            doc = ast.get_docstring(ast.parse(text)) or ""
            if LONG_REASON not in doc:
                long.append(f"{path.relative_to(ROOT)} ({n} lines)")
    assert long == [], f"over {MAX_LINES} lines with no '{LONG_REASON}' in the module docstring: {long}"


def test_nothing_edits_sys_path():
    offenders = [
        str(p.relative_to(ROOT))
        for p in _tracked_python()
        if p.name != "test_architecture.py" and "sys.path.insert" in p.read_text()
    ]
    assert offenders == []
