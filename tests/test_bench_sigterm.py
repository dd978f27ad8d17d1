"""A benchmark killed with SIGTERM (``kill``, ``timeout``) still runs its ``finally`` blocks, which stop
the ``hitl up`` it started (``harness.bench.stop_on_sigterm``, called by every benchmark that starts
one): by default SIGTERM ends Python at once and left that stack, its Redis and its Ray running."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = """
import asyncio, sys
from harness.bench import stop_on_sigterm
if sys.argv[2] == "helper":
    stop_on_sigterm()
try:
    print("ready", flush=True)
    asyncio.run(asyncio.sleep(60))
finally:
    open(sys.argv[1], "w").write("stopped")
"""

BENCHMARKS_WITH_A_STACK = sorted(
    p for p in Path("benchmarks").glob("*.py") if "HitlUp(" in p.read_text() and "__main__" in p.read_text()
)


def run_and_terminate(tmp_path: Path, mode: str) -> tuple[int, bool]:
    done = tmp_path / f"done-{mode}"
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(done), mode], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=30), done.exists()


def test_sigterm_runs_the_finally_blocks_with_the_helper_and_not_without(tmp_path: Path) -> None:
    assert run_and_terminate(tmp_path, "plain") == (-signal.SIGTERM, False)  # what the benchmarks did
    code, cleaned = run_and_terminate(tmp_path, "helper")
    assert cleaned and code != -signal.SIGTERM


def test_every_benchmark_that_starts_a_stack_takes_sigterm_as_ctrl_c() -> None:
    assert BENCHMARKS_WITH_A_STACK, "no benchmark starts a hitl up?"
    missing = [p.name for p in BENCHMARKS_WITH_A_STACK if "stop_on_sigterm()" not in p.read_text()]
    assert not missing, missing
