"""The quorum's words on the reviewer's page (ui.quorum), from snapshots and answers a real store
gave: the progress line, the banner after one's own submission, the lists side by side."""

from __future__ import annotations

import json
from typing import Any

from hitl_review.statecore.store import Store
from hitl_review.ui.quorum import quorum_line, reconciliation_md, vote_banner

from .helpers import iv, keep, manual
from .test_quorum import quorum_job


async def test_progress_banner_and_lists_side_by_side(store: Store, image: Any) -> None:
    job_id = await quorum_job(store, image, 2)
    st = await store.get(job_id)
    assert quorum_line(await store.snapshot(job_id)) == "Needs **2 reviewers** whose boxes agree — 0 of 2 submitted."
    first = json.loads((await store.intervene(job_id, iv(st, keep(st, 0, 1), iid="iv_1"), "rev1")).body)
    assert vote_banner(first) is not None and vote_banner(first).startswith("Your boxes are recorded — 1 of 2")  # type: ignore[union-attr]  # checked
    assert "1 of 2 submitted (rev1)" in quorum_line(await store.snapshot(job_id))
    b0 = st.box_list[0]
    moved = {"box_id": b0.box_id, "bbox": [b0.bbox[0] + 40, b0.bbox[1], b0.bbox[2] + 40, b0.bbox[3]]}
    second = json.loads(
        (await store.intervene(job_id, iv(st, [moved, manual([500, 300, 600, 400], "bag")], iid="iv_2"), "rev2")).body
    )
    assert "disagree (rev1, rev2)" in (vote_banner(second) or "")
    snap = await store.snapshot(job_id)
    assert quorum_line(snap).startswith("**The reviewers disagreed** (rev1, rev2)")
    table = reconciliation_md(snap).splitlines()
    assert table[0] == "| box | rev1 | rev2 |"
    x1, y1, x2, y2 = (round(v) for v in (b0.bbox[0] + 40, b0.bbox[1], b0.bbox[2] + 40, b0.bbox[3]))
    assert table[2].startswith("| #1 ") and table[2].endswith(f"| kept | moved to [{x1}, {y1}, {x2}, {y2}] |")
    assert table[3].endswith("| kept | deleted |") and table[4].endswith("| deleted | deleted |")
    assert table[5] == "| drawn by hand |  | drew [500, 300, 600, 400] “bag” |"
    reached = {"quorum": {"needed": 2, "received": 2, "reviewers": ["rev1", "rev2"], "outcome": "QUORUM_REACHED"}}
    assert vote_banner(reached) == "2 reviewers agreed (rev1, rev2): the job moves on."
    assert vote_banner({"job_id": job_id}) is None and reconciliation_md(None) == "" and quorum_line(None) == ""
