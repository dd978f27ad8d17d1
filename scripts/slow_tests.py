"""Keep `make test-fast` quick by measurement, not by guess: read the per-test times of a full run's
JUnit XML (``HITL_JUNIT_DIR=DIR make test`` writes DIR/rest.xml) and write ``tests/slow_tests.txt``,
the node ids that `make test-fast` leaves out (tests/conftest.py marks them ``slow``). Tests are
taken slowest first until what is left of the fast loop fits ``--budget`` seconds of test time
(setup and teardown included), or no test left takes more than ``--floor``.

    python scripts/slow_tests.py /tmp/junit/rest.xml --budget 60
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "slow_tests.txt"


def node_id(case: ET.Element) -> str:
    """pytest's node id from a JUnit testcase (classname ``tests.test_x`` or ``tests.test_x.Class``)."""
    parts = case.get("classname", "").split(".")
    path = "/".join(parts[:2]) + ".py"
    return "::".join([path, *parts[2:], case.get("name", "")])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("junit", nargs="+", type=Path, help="JUnit XML files of a full run (the non-Ray half)")
    ap.add_argument("--budget", type=float, default=60.0, help="seconds of test time the fast loop may keep")
    ap.add_argument("--floor", type=float, default=0.5, help="never list a test faster than this (seconds)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    times: dict[str, float] = {}
    for f in args.junit:
        for case in ET.parse(f).iter("testcase"):
            if case.find("skipped") is None:
                times[node_id(case)] = float(case.get("time", "0"))
    kept = dict(times)
    slow: list[str] = []
    for nid, t in sorted(times.items(), key=lambda kv: -kv[1]):
        if sum(kept.values()) <= args.budget or t < args.floor:
            break
        slow.append(nid)
        del kept[nid]
    head = (
        "# Left out of `make test-fast` (marked slow by tests/conftest.py): written by scripts/slow_tests.py\n"
        f"# from a full run's per-test times; {len(slow)} of {len(times)} tests, {sum(times[n] for n in slow):.0f} s;\n"
        f"# the {len(kept)} kept took {sum(kept.values()):.0f} s there.\n"
    )
    args.out.write_text(head + "".join(f"{n}\n" for n in sorted(slow)))
    left_out = sum(times[n] for n in slow)
    print(f"{len(slow)} slow tests ({left_out:.0f} s) -> {args.out}; kept {len(kept)}: {sum(kept.values()):.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
