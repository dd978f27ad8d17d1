from hitl_review.statecore.states import JobStatus as S

from .helpers import THREE_BOXES, create, iv, keep, report, waiting_job


async def test_create_detect_pause(store, image):
    job_id = await create(store, image)
    st = await store.get(job_id)
    assert st.status == S.DETECTING and st.version == 1
    assert st.current_node.node_type == "DETECT_SUBJECTS"
    assert await report(store, job_id, {"boxes": THREE_BOXES}) == "OK"
    st = await store.get(job_id)
    assert st.status == S.WAITING_USER_SELECTION
    assert st.version == 2 and st.active_pause.base_version == 2
    assert len(st.box_list) == 3
    pause = st.active_pause.model_dump()
    for f in ("timeout_at", "timeout_seconds", "auto_submit_on_timeout"):
        assert f not in pause


async def test_subset_goes_to_processing_and_finishes(store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    reply = await store.intervene(job_id, iv(st, keep(st, 0, 1)), "rev")
    assert reply.status_code == 200 and not reply.replayed
    st2 = await store.get(job_id)
    assert st2.status == S.PROCESSING_APPROVED_SUBJECTS
    assert [b.box_id for b in st2.approved_box_list] == [st.box_list[0].box_id, st.box_list[1].box_id]
    subjects = [
        {"box_id": b.box_id, "status": "SUCCEEDED", "mask": f"m_{b.box_id}.png", "cutout": f"c_{b.box_id}.png"}
        for b in st2.approved_box_list
    ]
    assert await report(store, job_id, {"subjects": subjects}) == "OK"
    assert (await store.get(job_id)).status == S.FINALIZING_RESULTS
    assert await report(store, job_id, {}) == "OK"
    st3 = await store.get(job_id)
    assert st3.status == S.SUCCEEDED
    events = await store.events_after(job_id)
    assert events[-1].type == "JOB_FINISHED"
    assert [e.id for e in events] == list(range(1, len(events) + 1))
