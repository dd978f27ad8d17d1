"""Operating stale waits (seed 000: "撤销、提醒和运营清理"): ``hitl admin stale --waiting-older-than AGE``
lists the waiting jobs whose pause is older than AGE with a count per stage and who last looked,
``--cancel --reason`` cancels them (the reason in each job's audit), ``--dry-run`` changes nothing;
``hitl cancel JOB… [--from FILE]`` prints one line per job and exits 1 when any failed. Against the
API under uvicorn (no dispatcher: the model's reports are applied through the store) on a real
redis-server; the pauses are made 18-20 days old by moving their opening time back in Redis. The
unwatched-pause alert points at the command."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.tokens import TOKENS, TOKENS_SPEC
from harness.uvicorn import LocalServer
from hitl_review.statecore import keys
from hitl_review.statecore.ids import now_iso
from hitl_review.statecore.store import Store

from .client_integration_util import run_cli
from .helpers import iv, waiting_job
from .revision_flow import to_revision

ROOT = Path(__file__).resolve().parents[1]
DAY_MS = 86_400_000


async def _age(store: Store, job_id: str, days: float) -> None:
    """Move the job's pause opening ``days`` back: its created_at and its place in the waiting index."""
    jk = keys.job(job_id)
    at_ms = int(time.time() * 1000 - days * DAY_MS)
    pause = json.loads(await store.r.hget(jk.meta, "active_pause"))
    pause["created_at"] = now_iso(at_ms / 1000)
    await store.r.hset(jk.meta, "active_pause", json.dumps(pause, separators=(",", ":")))
    await store.r.zadd(jk.waiting, {job_id: at_ms})


async def test_stale_waits_are_listed_per_stage_and_cancelled_with_a_reason(
    store: Store, redis_server: Any, image: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claimed = await waiting_job(store, image, submitter="sub1")
    await store.claim(claimed, "rev1")  # rev1 has it open now
    released = await waiting_job(store, image, submitter="sub1")
    await store.claim(released, "rev2")
    await store.release_claim(released, "rev2")  # rev2 looked and put it back
    revising, *_ = await to_revision(store, image, keep_model=True)  # "rev" answered round 1
    young = await waiting_job(store, image, submitter="sub2")
    ended = await waiting_job(store, image, submitter="sub2")
    st = await store.get(ended)
    await store.intervene(ended, iv(st, []), "rev1")  # EMPTY_SELECTION: ended, cannot be cancelled
    for job_id, days in ((claimed, 20), (released, 19), (revising, 18)):
        await _age(store, job_id, days)
    server = LocalServer(tmp_path, redis_server.url, tokens=TOKENS_SPEC, dispatchers=0).start()
    conn = ["--api-url", server.url, "--token", TOKENS["admin"]]
    try:
        code, out, err = run_cli(["admin", "stale", "--waiting-older-than", "14d", "--json", *conn], capsys)
        assert code == 0, err
        found = json.loads(out)
        assert found["count"] == 3 and found["by_stage"] == {
            "WAITING_BOX_BATCH_REVISION": 1,
            "WAITING_USER_SELECTION": 2,
        }
        rows = {r["job_id"]: r for r in found["jobs"]}
        assert [r["job_id"] for r in found["jobs"]] == [claimed, released, revising]  # oldest first
        assert young not in rows and rows[claimed]["waiting_s"] >= 20 * 86_400 - 60
        looked = {j: (r["last_looked"]["reviewer"], r["last_looked"]["how"]) for j, r in rows.items()}
        assert looked == {
            claimed: ("rev1", "claims it now"),
            released: ("rev2", "RELEASE RELEASED"),
            revising: ("rev", "INTERVENE ACCEPTED"),
        }
        code, out, _ = run_cli(["admin", "stale", "--waiting-older-than", "444h", *conn], capsys)  # 18.5 days
        assert code == 0 and "2 waiting job(s) whose pause is older than 444h" in out
        assert "WAITING_USER_SELECTION: 2" in out and "WAITING_BOX_BATCH_REVISION" not in out
        assert claimed in out and released in out and "rev1: claims it" in out  # whole ids, to copy them

        with pytest.raises(SystemExit, match="--reason"):
            run_cli(["admin", "stale", "--waiting-older-than", "14d", "--cancel", *conn], capsys)
        why = "unreviewed for 14 days: 运营清理"
        act = ["admin", "stale", "--waiting-older-than", "14d", "--cancel", "--reason", why, *conn]
        code, out, _ = run_cli([*act, "--dry-run"], capsys)
        assert code == 0 and "would cancel 3 job(s)" in out
        for j in rows:  # nothing cancelled, nothing recorded
            assert str((await store.get(j)).status) != "CANCELLED"
            assert "CANCEL" not in {e["action"] for e in (await store.audit(j) or {})["entries"]}

        code, out, err = run_cli(act, capsys)
        assert code == 0, err
        assert "cancelled 3, failed 0" in out
        for j in (claimed, released, revising):
            assert str((await store.get(j)).status) == "CANCELLED"
            last = (await store.audit(j) or {})["entries"][-1]
            assert (last["actor"], last["role"], last["action"], last["reason"]) == ("admin", "admin", "CANCEL", why)
        assert str((await store.get(young)).status) == "WAITING_USER_SELECTION"  # younger than the age: untouched

        listed = tmp_path / "jobs.txt"
        listed.write_text(f"# stale ones\n{claimed}\n\n{ended}  # ended already\n")
        code, out, _ = run_cli(["cancel", young, "job_00000000000000000000", "--from", str(listed), *conn], capsys)
        lines = out.strip().splitlines()
        assert code == 1 and len(lines) == 4, out
        assert lines[0].startswith(f"{young} CANCELLED") and lines[2].startswith(f"{claimed} CANCELLED")
        assert lines[1].startswith("job_00000000000000000000 FAILED 404 JOB_NOT_FOUND")
        assert lines[3].startswith(f"{ended} FAILED 409 JOB_TERMINAL")
        code, out, _ = run_cli(["cancel", young, *conn], capsys)  # idempotent: exit 0
        assert code == 0 and out.startswith(f"{young} CANCELLED")
        assert (await store.audit(young) or {})["entries"][-1]["reason"] is None  # no --reason, none recorded
    finally:
        server.stop()


def test_the_unwatched_pause_alert_points_at_hitl_admin_stale() -> None:
    rules = yaml.safe_load((ROOT / "deploy/prometheus/rules.yml").read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
    text = " ".join(alerts["HitlReviewUnwatched"]["annotations"].values())
    assert "hitl admin stale --waiting-older-than" in text and "--cancel --reason" in text
