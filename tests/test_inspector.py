"""The inspector times out model work past its deadline, never a waiting job."""

from __future__ import annotations

import asyncio

from serve_app.inspector import Inspector
from statecore.store import Store, StoreConfig

from .helpers import THREE_BOXES, report


async def test_overdue_node_is_timed_out_once_and_late_report_ignored(redis_server, store, image):
    fast = Store.from_url(redis_server.url, StoreConfig(retention_s=3600, node_timeout_s=0.2))
    try:
        job_id = (await fast.create_job("alice", image)).job_id
        waiting_id = (await fast.create_job("alice", image)).job_id
        assert await report(fast, waiting_id, {"boxes": THREE_BOXES}) == "OK"  # now waiting for a reviewer
        stale_node = (await fast.get(job_id)).current_node
        await asyncio.sleep(0.4)
        inspector = Inspector(fast, grace_s=0)
        counts = await inspector.sweep()
        assert counts["timed_out"] == 1
        state = await fast.get(job_id)
        assert state.status == "TIMED_OUT" and state.reason_code == "NODE_DEADLINE_EXCEEDED"
        assert (await fast.get(waiting_id)).status == "WAITING_USER_SELECTION"  # waits have no deadline
        assert (await inspector.sweep())["timed_out"] == 0  # a second inspector pass changes nothing
        from statecore.models import NodeReport

        late = NodeReport(
            node_instance_id=stale_node.node_instance_id,
            node_type=stale_node.node_type,
            job_id=job_id,
            outcome="SUCCEEDED",
            output={"boxes": THREE_BOXES},
        )
        # The model's own report, arriving after the timeout, is ignored with an event (not a silent
        # DUPLICATE: it is the first time this report is seen); its replay is the duplicate.
        assert await fast.apply_report(late) == "IGNORED"
        events = await fast.events_after(job_id)
        types = [e.type for e in events]
        assert types[-2:] == ["JOB_FINISHED", "REPORT_IGNORED"] and "PAUSE_OPENED" not in types
        assert events[-1].data["reason"] == "NODE_TIMED_OUT"
        assert events[-1].data["node_instance_id"] == stale_node.node_instance_id
        assert await fast.apply_report(late) == "DUPLICATE"
        assert len(await fast.events_after(job_id)) == len(events)
        assert (await fast.get(job_id)).status == "TIMED_OUT"
    finally:
        await fast.close()
