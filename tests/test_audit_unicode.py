"""The audit chain verifies whatever the names in it (docs/protocol.md § Audit): the Lua scripts
hash ``<length>:<text>`` with the length in bytes, and ``statecore.audit`` recomputes the same bytes,
for any Unicode actor (submitter and reviewer names, also inside an outcome such as
``TAKEN_OVER:<holder>``), labels and reasons, and any ``base_version`` a client may send. Checked
in Redis's copy and in the archive's (SQLite), through the verifier the admin route uses. Real
redis-server and Store; hypothesis draws the strings."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from hitl_review.archive import migrate
from hitl_review.archive.archiver import copy_job
from hitl_review.archive.db import Archive
from hitl_review.serve_app.routes.audit_routes import verify_job
from hitl_review.statecore import audit, errors
from hitl_review.statecore.models import ImageRef, NodeReport
from hitl_review.statecore.store import Store, StoreConfig

from .helpers import iv, keep, manual

IMAGE = ImageRef(sha256="b" * 64, width=640, height=480, url="/api/v1/artifacts/img_" + "b" * 16 + ".png")
NAME_MAX = 200  # the archive's actor column (archive/schema.py)
LABEL_MAX = 200  # Subject.label

# What a token's name can be (serve_app.routes.auth.parse_tokens: ``name:role:token,…``, the entry stripped):
# no ':' or ',', no leading whitespace; a str Redis can store (no lone surrogates), no NUL (PostgreSQL).
_NAME_CHARS = st.characters(codec="utf-8", exclude_characters=":,\x00")
_TRICKY = ["张伟", "e\u0301", "\U0001f600", "\U00010348", "\u200b", "ש\u05b8ל", "a\u0300\u0301\u0302", '\\"/']
NAMES = st.one_of(
    st.text(_NAME_CHARS, min_size=1, max_size=24),
    st.text(_NAME_CHARS, min_size=NAME_MAX - 4, max_size=NAME_MAX),  # near the limit, up to 800 bytes
    st.lists(st.sampled_from(_TRICKY), min_size=1, max_size=NAME_MAX // 2).map("".join).map(lambda s: s[:NAME_MAX]),
).filter(lambda s: not s[0].isspace())
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=LABEL_MAX)
# A client's base_version: any Redis integer. 15 digits and more are past what cjson writes digit for digit.
VERSIONS = st.one_of(st.integers(10, 10**6), st.integers(10**13, 10**16), st.integers(10, 2**63 - 1))


async def _drive(store: Store, submitter: str, first: str, second: str, labels: list[str], reason: str, bv: int) -> str:
    """One job through every kind of entry that names a person: created by ``submitter``; claimed by
    ``first``, taken over by ``second`` (outcome ``TAKEN_OVER:<first>``); a refused intervention at
    ``bv``; ``first``'s refused release; the detector's report applied under ``second``'s name (labels
    in the boxes); an accepted intervention with a manual box; the validator's verdict (``reason``);
    cancelled by ``first``."""
    job_id = (await store.create_job(submitter, IMAGE)).job_id
    st0 = await store.get(job_id)
    assert st0.current_node is not None
    boxes = [{"bbox": [10 + 60 * i, 10, 60 + 60 * i, 120], "label": lab, "score": 0.9} for i, lab in enumerate(labels)]
    nr = NodeReport(
        node_instance_id=st0.current_node.node_instance_id,
        node_type=st0.current_node.node_type,
        job_id=job_id,
        outcome="SUCCEEDED",
        output={"boxes": boxes},
    )
    assert await store.apply_report(nr, actor=second) == "OK"
    await store.claim(job_id, first)
    await store.claim(job_id, second, force=True)
    with pytest.raises(errors.HitlError):
        await store.release_claim(job_id, first)
    st1 = await store.get(job_id)
    assert bv != st1.version  # drawn from 10 up: a few steps in, the job is far below
    with pytest.raises(errors.Conflict):
        await store.intervene(job_id, iv(st1, keep(st1, 0), base_version=bv), second)
    subjects = [*keep(st1, *range(len(st1.box_list))), manual([500, 300, 600, 400], labels[0] if labels else None)]
    assert (await store.intervene(job_id, iv(st1, subjects), second)).status_code == 200
    st2 = await store.get(job_id)
    if st2.current_node is not None and st2.current_node.node_type == "VALIDATE_MANUAL_BOX_LIST":
        added = [b.box_id for b in st2.box_list if b.source == "manual"]
        verdicts = [{"box_id": b, "passed": False, "score": 0.1, "reason": reason} for b in added]
        nr = NodeReport(
            node_instance_id=st2.current_node.node_instance_id,
            node_type=st2.current_node.node_type,
            job_id=job_id,
            outcome="SUCCEEDED",
            output={"results": verdicts},
        )
        assert await store.apply_report(nr, actor=first) == "OK"
    await store.cancel(job_id, first)
    return job_id


def _archive(tmp_path: Path, cache: dict[str, Archive]) -> Archive:
    if "a" not in cache:
        url = f"sqlite:///{tmp_path / 'archive.sqlite3'}"
        migrate.upgrade(url)
        cache["a"] = Archive(url)
    return cache["a"]


async def _verified(redis_url: str, archive: Archive, **drawn: Any) -> None:
    store = Store.from_url(redis_url, StoreConfig(retention_s=3600))
    try:
        job_id = await _drive(store, **drawn)
        log = await store.audit(job_id)
        assert log is not None
        actors = {e["actor"] for e in log["entries"]}
        assert {drawn["submitter"], drawn["first"], drawn["second"]} <= actors
        assert f"TAKEN_OVER:{drawn['first']}" in {e["outcome"] for e in log["entries"]}
        assert drawn["bv"] in {e["base_version"] for e in log["entries"]}
        assert audit.verify(log["entries"], log["head"], log["head_seq"]) is None
        await copy_job(store, archive, job_id)
        copies, findings = await verify_job(store, archive, job_id)  # GET /admin/audit/verify's check
        assert (copies, findings) == (2, [])
    finally:
        await store.close()


def test_a_chinese_submitter_verifies_in_redis_and_the_archive(redis_server, tmp_path):
    archive = _archive(tmp_path, {})
    try:
        asyncio.run(
            _verified(
                redis_server.url,
                archive,
                submitter="张伟",
                first="Zoë",
                second="李娜",
                labels=["鞋"],
                reason="不是物体",
                bv=123456789012345,
            )
        )
    finally:
        archive.close()


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    submitter=NAMES,
    first=NAMES,
    second=NAMES,
    labels=st.lists(TEXT, min_size=1, max_size=3),
    reason=TEXT,
    bv=VERSIONS,
)
@example(
    submitter="\U0001f600" * NAME_MAX,
    first="e\u0301" * (NAME_MAX // 2),
    second="张" * NAME_MAX,
    labels=["\U00010348" * LABEL_MAX],
    reason="\u0001\u001f\u007f\u2028",
    bv=2**63 - 1,
)
def test_the_chain_verifies_for_any_unicode_actor_label_and_reason(
    redis_server, tmp_path, submitter, first, second, labels, reason, bv
):
    assume(first != second)
    cache = _CACHE.setdefault(str(tmp_path), {})
    asyncio.run(
        _verified(
            redis_server.url,
            _archive(tmp_path, cache),
            submitter=submitter,
            first=first,
            second=second,
            labels=labels,
            reason=reason,
            bv=bv,
        )
    )


_CACHE: dict[str, dict[str, Archive]] = {}


@pytest.fixture(autouse=True, scope="module")
def _close_archives():
    yield
    for cache in _CACHE.values():
        for a in cache.values():
            a.close()
