"""Webhooks (docs/protocol.md § Webhooks) against a real HTTP receiver on a loopback port that first
fails (500), then hangs past the deliverer's timeout, then recovers: every event is delivered, each
id taken once by the deliverer (the receiver may see a hung attempt's id again: at least once, it
dedupes), every signature verifies, and no job waited for the receiver. Real redis-server, the
dispatcher's own code with a stand-in model (no Ray)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiohttp import web

from hitl_review.serve_app.observability import metrics
from hitl_review.serve_app.work.dispatcher import Dispatcher
from hitl_review.serve_app.work.webhook_delivery import WebhookDeliverer
from hitl_review.statecore import auto_store, keys, webhooks
from hitl_review.statecore.execution import RunSpec, run_started
from hitl_review.statecore.models import NodeCommand
from hitl_review.statecore.store import Store, StoreConfig
from hitl_review.statecore.webhooks import Webhook

from .helpers import THREE_BOXES

SECRET = "s3cr3t-for-tests"
POLICY = "policy:box@abc"


class Model:
    async def run(self, cmd: NodeCommand, spec: RunSpec) -> dict[str, Any]:
        async def work() -> dict[str, Any]:
            return {"boxes": THREE_BOXES}

        return await run_started(spec, work)


class Receiver:
    """``/flaky``: 500, then a hang past the timeout, then 500 until ``recover`` is set, then 200.
    ``/finished``: always 200. ``/moved``: a 302 to ``/finished``. Records every request."""

    def __init__(self) -> None:
        self.seen: dict[str, list[dict[str, Any]]] = {"flaky": [], "finished": [], "moved": []}
        self.recover = asyncio.Event()
        self.taken: dict[str, set[str]] = {"flaky": set(), "finished": set()}  # deduped by id
        self.answered: list[str] = []  # every id answered 200 on /flaky, duplicates included

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.match_info["path"]
        body = await request.read()
        rec = {"headers": dict(request.headers), "body": body, "t": time.monotonic()}
        self.seen.setdefault(path, []).append(rec)
        if path == "moved":
            raise web.HTTPFound(f"http://{request.host}/finished")
        if path == "flaky" and not self.recover.is_set():
            if len(self.seen["flaky"]) == 2:
                await asyncio.sleep(1.0)  # past the deliverer's 0.3 s: it gives up on this attempt
            else:
                return web.Response(status=500)
        self.taken[path].add(request.headers[webhooks.ID_HEADER])
        if path == "flaky":
            self.answered.append(request.headers[webhooks.ID_HEADER])
        return web.Response(status=200)


@pytest.fixture
async def receiver():
    rcv = Receiver()
    app = web.Application()
    app.router.add_post("/{path}", rcv.handle)
    runner = web.AppRunner(app, shutdown_timeout=1)  # a hung request does not hold the teardown up
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    rcv.base = f"http://{host}:{port}"  # type: ignore[attr-defined]  # set once bound
    yield rcv
    await runner.cleanup()


async def _store(redis_server) -> Store:
    store = Store.from_url(redis_server.url, StoreConfig(retention_s=3600))
    await store.r.flushdb()
    await store.ensure_groups()
    return store


def _deliverer(store: Store, hooks: list[str], **kw: Any) -> WebhookDeliverer:
    opts: dict[str, Any] = dict(timeout_s=0.3, backoff_s=0.05, max_backoff_s=0.2, reclaim_idle_ms=2000)
    return WebhookDeliverer(store.r, [Webhook.parse(h) for h in hooks], SECRET, consumer="w", **(opts | kw))


async def _until(cond, timeout_s: float, what: str) -> None:
    """Wait for ``cond``. (The streams appear in keys.all_webhook_streams' order: the policy's last.)"""
    deadline = time.monotonic() + timeout_s
    while not await cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


async def test_every_event_is_delivered_signed_through_a_failing_receiver_and_no_job_waits(redis_server, receiver):
    store = await _store(redis_server)
    deliverer = _deliverer(store, [f"{receiver.base}/flaky", f"job.finished={receiver.base}/finished"])
    delivered_before = metrics.WEBHOOK_DELIVERIES.labels("delivered")._value.get()
    hooks = asyncio.create_task(deliverer.run_forever())
    dispatcher = Dispatcher(store, Model(), consumer="d", reclaim_every_s=0.2, inspect_every_s=0.2)
    dispatching = asyncio.create_task(dispatcher.run_forever())
    try:
        await _until(lambda: store.r.exists(keys.POLICY_WEBHOOKS), 5, "the deliverer never made its streams")
        # Everything happens while the receiver fails: the jobs move on all the same.
        job_ids = [(await store.create_job("alice", _image(i))).job_id for i in range(3)]

        async def all_waiting() -> bool:
            return [(await store.get(j)).status for j in job_ids] == ["WAITING_USER_SELECTION"] * 3

        await _until(all_waiting, 30, "the jobs never reached their pause")
        cancels = []
        for j in job_ids:
            c0 = time.monotonic()
            await store.cancel(j, "alice")
            cancels.append(time.monotonic() - c0)
        await auto_store.set_mode(store, "set", POLICY, "on", "test", "ops")
        assert (await auto_store.set_mode(store, "drop", POLICY, "shadow", "false accepts", "monitor"))[0] == "DROPPED"
        # No delivery has gone through yet (below): had a transition waited for one, it would not
        # have happened at all. Each cancel took what a cancel takes on this machine, not a timeout.
        assert max(cancels) < 2, cancels

        async def both_failures_logged() -> bool:
            errors = {r["error"] for r in await webhooks.read_log(store.r, 1000) if r["outcome"] == "failed"}
            return errors >= {"HTTP 500", "timed out after 0.3s"}

        await _until(both_failures_logged, 10, "the failing and the hung attempts were never logged")
        log = await webhooks.read_log(store.r, 1000)
        assert not [r for r in log if r["outcome"] == "delivered" and "flaky" in r["url"]]  # none through yet

        receiver.recover.set()
        want_all = {f"{j}:{seq}" for j in job_ids for seq in await _event_ids(store, j)} | {"policy"}

        async def all_taken() -> bool:
            got = {i if not i.startswith("policy:") else "policy" for i in receiver.taken["flaky"]}
            return got == want_all and await webhooks.pending(store.r) == 0

        await _until(all_taken, 15, f"not every event was delivered: {receiver.taken}")
    finally:
        for t in (hooks, dispatching):
            t.cancel()
        await asyncio.gather(hooks, dispatching, return_exceptions=True)

    # The finished-only webhook got the three JOB_FINISHED, nothing else, on its first attempt.
    finished = receiver.seen["finished"]
    assert len(finished) == 3 and {r["headers"][webhooks.TYPE_HEADER] for r in finished} == {"job.finished"}
    # Every request, failed or not, is signed over its body and timestamp; a tampered body is not.
    for rec in receiver.seen["flaky"] + finished:
        sig = rec["headers"][webhooks.SIGNATURE_HEADER]
        assert webhooks.verify(SECRET, rec["body"], sig)
        assert not webhooks.verify(SECRET, rec["body"] + b" ", sig)
        assert not webhooks.verify("another secret", rec["body"], sig)
    # The deliverer took each event once per webhook; the receiver saw one id twice at most (the hung
    # attempt it answered after the deliverer had given up on it).
    log = await webhooks.read_log(store.r, 1000)
    ok = [(r["event_id"], r["url"]) for r in log if r["outcome"] == "delivered"]
    assert len(ok) == len(set(ok)) == len(want_all) + 3
    assert len(receiver.answered) - len(set(receiver.answered)) <= 1, receiver.answered
    bodies = {r["headers"][webhooks.ID_HEADER]: r["body"] for r in receiver.seen["flaky"]}
    assert b'"type":"review.waiting"' in bodies[f"{job_ids[0]}:{(await _event_ids(store, job_ids[0]))[0]}"]
    assert metrics.WEBHOOK_DELIVERIES.labels("delivered")._value.get() - delivered_before == len(ok)
    # Nothing of the secret in the log.
    assert SECRET not in str(log)
    await store.close()


async def test_a_redirect_is_never_followed_and_a_webhook_is_given_up_after_its_time(redis_server, receiver):
    store = await _store(redis_server)
    deliverer = _deliverer(store, [f"policy.shadow={receiver.base}/moved"], give_up_after_s=0.0)
    task = asyncio.create_task(deliverer.run_forever())
    try:
        await _until(lambda: store.r.exists(keys.POLICY_WEBHOOKS), 5, "no streams")
        await auto_store.set_mode(store, "set", POLICY, "on", "test", "ops")
        await auto_store.set_mode(store, "drop", POLICY, "shadow", "false accepts", "monitor")

        async def settled() -> bool:
            return bool(await webhooks.read_log(store.r)) and await webhooks.pending(store.r) == 0

        await _until(settled, 5, "the delivery never settled")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    (line,) = await webhooks.read_log(store.r)
    assert line["outcome"] == "gave_up" and line["status"] == "302" and line["error"] == "HTTP 302"
    assert len(receiver.seen["moved"]) == 1 and receiver.seen["finished"] == []  # not followed
    await store.close()


async def test_without_a_deliverer_nothing_is_queued(redis_server):
    store = await _store(redis_server)
    job_id = (await store.create_job("alice", _image(9))).job_id
    await store.cancel(job_id, "alice")
    assert await store.r.exists(keys.job(job_id).webhooks) == 0 and await webhooks.pending(store.r) == 0
    await store.close()


def test_webhook_specs_and_signatures():
    assert Webhook.parse("https://h.example/x?a=b").events == set(webhooks.EVENT_TYPES)
    hook = Webhook.parse("review.waiting,job.finished=https://h.example/x?a=b")
    assert hook.url == "https://h.example/x?a=b" and hook.wants("job.finished") and not hook.wants("policy.shadow")
    assert Webhook.parse("*=http://127.0.0.1:9/").events == set(webhooks.EVENT_TYPES)
    for bad, why in (("job.done=https://h/", "unknown event"), ("ftp://h/", "http:// or https://"), ("", "http")):
        with pytest.raises(ValueError, match=why):
            Webhook.parse(bad)
    body = b'{"id":"j:1"}'
    sig = webhooks.sign("k", body, 1_000_000)
    assert webhooks.verify("k", body, sig, now=1_000_100)
    assert not webhooks.verify("k", body, sig, now=1_000_000 + webhooks.TOLERANCE_S + 1)  # a replay
    assert not webhooks.verify("k", body, "v1=" + sig.partition("v1=")[2], now=1_000_000)  # no timestamp


def _image(i: int):
    from hitl_review.statecore.models import ImageRef

    return ImageRef(sha256=f"{i:x}" * 64, width=640, height=480, url=f"/api/v1/artifacts/img_{i:016x}.png")


async def _event_ids(store: Store, job_id: str) -> list[int]:
    return [e.id for e in await store.events_after(job_id) if e.type in ("PAUSE_OPENED", "JOB_FINISHED")]


async def test_the_settings_start_a_deliverer_and_the_admin_route_and_metrics_show_it(redis_server, receiver, tmp_path):
    from hitl_review.serve_app.ops.config import Settings
    from hitl_review.serve_app.work.webhook_delivery import start_webhooks

    from .asgi_util import asgi_client

    store = await _store(redis_server)
    settings = Settings(webhooks=[f"job.finished={receiver.base}/finished"], webhook_secret=SECRET)
    assert SECRET not in repr(settings)
    task = start_webhooks(settings, store)
    assert task is not None and start_webhooks(Settings(), store) is None
    try:
        await _until(lambda: store.r.exists(keys.POLICY_WEBHOOKS), 5, "no streams")
        job_id = (await store.create_job("alice", _image(5))).job_id
        await store.cancel(job_id, "alice")
        await _until(lambda: _taken(receiver, "finished", 1), 5, "the job's end was never delivered")
        await _until(lambda: webhooks.read_log(store.r), 5, "the delivery was never logged")
        await _until(lambda: _pending_zero(store), 5, "the delivery was never acknowledged")  # after its log line
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    async with asgi_client(redis_server.url, tmp_path) as client:
        admin = {"Authorization": "Bearer tok-admin"}
        res = await client.get("/api/v1/admin/webhooks/log", headers=admin)
        assert res.status_code == 200, res.text
        assert len(res.json()["attempts"]) == 1, res.json()
        (line,) = res.json()["attempts"]
        assert res.json()["pending"] == 0 and line["outcome"] == "delivered" and line["status"] == "200"
        assert line["event_id"].startswith(job_id) and line["type"] == "job.finished"
        refused = await client.get("/api/v1/admin/webhooks/log", headers={"Authorization": "Bearer tok-rev1"})
        assert refused.status_code == 403
        text = (await client.get("/metrics", headers=admin)).text
        assert "hitl_webhook_pending 0.0" in text and 'hitl_webhook_deliveries_total{outcome="delivered"}' in text
    await store.close()


def test_hitl_up_refuses_webhooks_it_cannot_sign_or_parse(tmp_path, monkeypatch):
    from hitl_review.serve_app.cli import build_parser
    from hitl_review.serve_app.ops import preflight
    from hitl_review.serve_app.ops.config import load_deployment, save_deployment
    from hitl_review.serve_app.ops.launcher import settings_from_args

    monkeypatch.delenv("HITL_WEBHOOK_SECRET", raising=False)
    up = ["up", "--data-dir", str(tmp_path)]
    with pytest.raises(preflight.UpError, match="--webhook: give the signing secret"):
        preflight.check_webhooks(settings_from_args(build_parser().parse_args([*up, "--webhook", "http://h/x"])))
    with pytest.raises(preflight.UpError, match="--webhook: .*unknown event 'job.done'"):
        settings_from_args(build_parser().parse_args([*up, "--webhook", "job.done=http://h/x"]))
    (tmp_path / "secret").write_text("")
    with pytest.raises(preflight.UpError, match="--webhook-secret-file .*empty"):
        settings_from_args(build_parser().parse_args([*up, "--webhook-secret-file", str(tmp_path / "secret")]))
    (tmp_path / "secret").write_text(SECRET + "\n")
    args = [*up, "--webhook", "http://h/a", "--webhook", "policy.shadow=http://h/b", "--webhook-secret-file"]
    settings = settings_from_args(build_parser().parse_args([*args, str(tmp_path / "secret")]))
    assert settings.webhook_secret == SECRET and settings.webhooks == ["http://h/a", "policy.shadow=http://h/b"]
    preflight.check_webhooks(settings)
    monkeypatch.setenv("HITL_WEBHOOK_SECRET", "from-env")
    assert settings_from_args(build_parser().parse_args([*up, "--webhook", "http://h/a"])).webhook_secret == "from-env"
    save_deployment(settings)  # what the admin tools read: the webhooks, never their secret
    assert SECRET not in (tmp_path / "deployment.json").read_text()
    assert load_deployment(tmp_path).webhooks == settings.webhooks


async def _taken(rcv: Receiver, path: str, n: int) -> bool:
    return len(rcv.taken[path]) >= n


async def test_on_a_redis_cluster_the_deliveries_are_queued_in_the_job_s_slot_and_delivered(cluster_store, receiver):
    deliverer = _deliverer(cluster_store, [f"{receiver.base}/finished"], cluster=True)
    task = asyncio.create_task(deliverer.run_forever())
    try:
        await _until(lambda: cluster_store.r.exists(keys.POLICY_WEBHOOKS), 10, "no streams")
        job_ids = [(await cluster_store.create_job("alice", _image(i))).job_id for i in (6, 7)]
        for j in job_ids:
            await cluster_store.cancel(j, "alice")
        await auto_store.set_mode(cluster_store, "set", POLICY, "on", "test", "ops")
        await auto_store.set_mode(cluster_store, "drop", POLICY, "shadow", "false accepts", "monitor")
        await _until(lambda: _taken(receiver, "finished", 3), 10, f"not delivered: {receiver.taken}")
        await _until(lambda: _pending_zero(cluster_store), 5, "deliveries left pending")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    got = receiver.taken["finished"]
    assert {i.rpartition(":")[0] for i in got if not i.startswith("policy:")} == set(job_ids) and len(got) == 3


async def _pending_zero(store: Store) -> bool:
    return await webhooks.pending(store.r) == 0


def test_hitl_admin_webhooks_prints_the_delivery_log(api_server, capsys):
    import json

    import redis

    from hitl_review.serve_app import cli

    line = {"event_id": "job_cli:4", "type": "job.finished", "url": "http://h/x", "attempt": 2, "outcome": "failed"}
    with redis.Redis.from_url(api_server.redis_url, decode_responses=True) as r:
        r.xadd(keys.WEBHOOK_LOG, {**line, "status": "500", "error": "HTTP 500", "at": "2026-12-07T03:00:00Z"})
    conn = ["--api-url", api_server.url, "--token", "tok-admin"]
    capsys.readouterr()
    assert cli.main(["admin", "webhooks", "--limit", "1", "--json", *conn]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pending"] == 0 and [{k: a[k] for k in line} for a in out["attempts"]] == [{**line, "attempt": "2"}]
    assert cli.main(["admin", "webhooks", *conn]) == 0
    text = capsys.readouterr().out
    assert "0 deliveries pending" in text and "job_cli:4" in text and "HTTP 500" in text
