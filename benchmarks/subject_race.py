"""One job's subjects written by racing executors, on the store alone (no Serve, no models): the cost
of the ``SEGMENT_SUBJECT`` starts and reports themselves (SPEC §13, docs/protocol.md § Cut-out quality).

A job with ``subjects`` approved boxes; ``writers`` asyncio tasks take its subject nodes from one queue
and each starts its node and reports it cut, as a Segmenter replica would. Counted: every ``STALE``
answer of a script (a write that found the job changed under it and planned again), every script call,
and the job's moves to ``FINALIZING_RESULTS``. ``benchmarks/subject_fanout.py --store`` runs it on its
own redis-server; tests/test_subject_writes.py on the test's.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from hitl_review.statecore import keys
from hitl_review.statecore.models import ImageRef, InterventionRequest, NodeReport
from hitl_review.statecore.store import Store

IMAGE = ImageRef(sha256="b" * 64, width=4000, height=4000, url="/api/v1/artifacts/img_" + "b" * 16 + ".png")


def boxes(n: int) -> list[dict[str, Any]]:
    """``n`` distinct boxes on a grid of the image."""
    side = 40
    per_row = IMAGE.width // (side + 10)
    return [
        {
            "bbox": [10 + (i % per_row) * (side + 10), 10 + (i // per_row) * (side + 10)]
            + [10 + (i % per_row) * (side + 10) + side, 10 + (i // per_row) * (side + 10) + side],
            "label": "item",
            "score": 0.9,
        }
        for i in range(n)
    ]


def count_answers(store: Store) -> Counter[str]:
    """Wrap the store's scripts: the returned Counter counts every call (``calls``) and every answer
    by its code (``STALE`` among them)."""
    seen: Counter[str] = Counter()
    for name, script in list(store._scripts.items()):

        async def counted(*, keys: list[str], args: list[Any], _s: Any = script, _n: str = name) -> Any:
            res = await _s(keys=keys, args=args)
            seen["calls"] += 1
            seen[f"{_n}:calls"] += 1
            if isinstance(res, list) and res:
                seen[str(res[0])] += 1
            return res

        store._scripts[name] = counted
    return seen


async def approved_job(store: Store, subjects: int) -> str:
    """A job whose ``subjects`` boxes were all approved: one live subject node each."""
    job_id = (await store.create_job("bench", IMAGE, None)).job_id
    st = await store.get(job_id)
    assert st.current_node is not None
    rep = NodeReport(
        node_instance_id=st.current_node.node_instance_id,
        node_type=st.current_node.node_type,
        job_id=job_id,
        outcome="SUCCEEDED",
        output={"boxes": boxes(subjects)},
    )
    assert await store.apply_report(rep) == "OK"
    st = await store.get(job_id)
    assert st.active_pause is not None
    body = InterventionRequest(
        intervention_id=f"iv_{job_id[-12:]}",
        pause_token=st.active_pause.pause_token,
        base_version=st.version,
        subjects=[{"box_id": b.box_id, "bbox": list(b.bbox)} for b in st.box_list],
    )
    await store.intervene(job_id, body, "bench")
    return job_id


async def race(store: Store, subjects: int, writers: int) -> dict[str, Any]:
    """Start and report every subject node of one job with ``writers`` racing tasks; the figures."""
    job_id = await approved_job(store, subjects)
    cmds = [c for c in await store.outbox_commands(job_id) if c.node_type == "SEGMENT_SUBJECT"]
    assert len(cmds) == subjects, (len(cmds), subjects)
    seen = count_answers(store)
    todo: asyncio.Queue[Any] = asyncio.Queue()
    for c in cmds:
        todo.put_nowait(c)
    answers: Counter[str] = Counter()

    async def writer() -> None:
        while not todo.empty():
            c = todo.get_nowait()
            answers["started:" + await store.node_started(c)] += 1
            box_id = c.input["approved_box_list"][0]["box_id"]
            out = {"subjects": [{"box_id": box_id, "status": "SUCCEEDED", "mask": f"m_{box_id}.png"}]}
            rep = NodeReport(
                node_instance_id=c.node_instance_id,
                node_type=c.node_type,
                job_id=job_id,
                outcome="SUCCEEDED",
                output=out,
            )
            answers["report:" + await store.apply_report(rep)] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(writers)))
    took = time.perf_counter() - t0
    events = await store.events_after(job_id)
    moves = [e for e in events if e.type == "STATUS_CHANGED" and e.data.get("to") == "FINALIZING_RESULTS"]
    st = await store.get(job_id)
    meta_bytes = await store.r.memory_usage(keys.job(job_id).meta)
    return {
        "job_id": job_id,
        "subjects": subjects,
        "writers": writers,
        "seconds": round(took, 3),
        "stale": seen["STALE"],
        "script_calls": seen["calls"],
        "answers": dict(answers),
        "moves_to_finalizing": len(moves),
        "status": st.status.value,
        "meta_bytes": meta_bytes,
    }
