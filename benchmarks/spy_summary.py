"""Read py-spy's raw stacks (``py-spy record --format raw``, as ``benchmarks/e2e.py --profile``
writes them) and print where a process spent its samples: by the function on top of the stack
(self), and by the first frame of our own code under which the sample fell (inclusive), so a
profile of a Serve replica names our call that paid for Ray's, Starlette's or redis-py's work.

    .venv/bin/python benchmarks/spy_summary.py /tmp/e2e/prof0/*.txt --top 25
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

OURS = re.compile(r"/(statecore|serve_app|deployments|archive|client)/")
IDLE = ("select (selectors.py", "_run_once (asyncio/base_events.py", "epoll", "poll (selectors.py")


def frames(line: str) -> tuple[list[str], int]:
    stack, _, count = line.rpartition(" ")
    return stack.split(";"), int(count)


def summarise(path: Path, top: int) -> str:
    selfs: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    total = idle = 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        stack, n = frames(line)
        total += n
        leaf = stack[-1]
        if any(s in leaf for s in IDLE):
            idle += n
            continue
        selfs[re.sub(r":\d+\)", ")", leaf)] += n
        # the deepest frame of our code: the call of ours that paid for this sample
        mine = [f for f in stack if OURS.search(f)]
        ours[re.sub(r":\d+\)", ")", mine[-1]) if mine else "(not under our code)"] += n
    busy = max(1, total - idle)
    out = [f"== {path.name}: {total} samples, {idle} idle (event loop waiting), {busy} busy"]
    out.append("  self (top of stack), % of busy:")
    out += [f"    {n / busy * 100:5.1f}  {f[:150]}" for f, n in selfs.most_common(top)]
    out.append("  under our deepest frame, % of busy:")
    out += [f"    {n / busy * 100:5.1f}  {f[:150]}" for f, n in ours.most_common(top)]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    for f in args.files:
        print(summarise(f, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
