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

        late = NodeReport(node_instance_id=stale_node.node_instance_id, node_type=stale_node.node_type,
                          job_id=job_id, outcome="SUCCEEDED", output={"boxes": THREE_BOXES})
        assert await fast.apply_report(late) == "DUPLICATE"
        types = [e.type for e in await fast.events_after(job_id)]
        assert types[-1] == "JOB_FINISHED" and "PAUSE_OPENED" not in types
    finally:
        await fast.close()
