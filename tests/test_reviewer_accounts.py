"""Reviewer accounts without a restart (README § Reviewer accounts, docs/protocol.md § Reviewer accounts)
and an authenticating proxy's user (§ Identity), against a real redis-server (and a Redis Cluster):

* added through one API replica, an account signs in on another at once; removed, it is refused by the
  replica that removed it at once and by the other within ``ACCOUNT_CACHE_S``;
* Redis holds the SHA-256 of a token, never the token; every change is logged and recorded with its admin;
* ``HITL_TOKENS`` keep working, and their names cannot be taken or removed;
* a proxy's ``X-Forwarded-User`` (…) counts only on connections from ``--trusted-proxy`` addresses;
* ``hitl admin reviewers add|list|remove`` against a running server, and the UI's sign-in handlers.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gradio as gr
import httpx
import pytest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.testclient import TestClient

from harness.tokens import TOKENS, TOKENS_SPEC, auth
from hitl_review.serve_app.cli import build_parser
from hitl_review.serve_app.cli import main as hitl
from hitl_review.serve_app.ops.config import Settings
from hitl_review.serve_app.ops.launcher import settings_from_args
from hitl_review.serve_app.ops.preflight import UpError
from hitl_review.serve_app.routes.api import Runtime, create_app
from hitl_review.serve_app.routes.auth import ACCOUNT_CACHE_S, Authenticator
from hitl_review.statecore import accounts, keys
from hitl_review.statecore.artifacts import ArtifactStore
from hitl_review.statecore.store import Store, StoreConfig
from hitl_review.statecore.trusted_proxy import TrustedProxies
from hitl_review.ui import cookie_signin
from hitl_review.ui.callbacks import Callbacks
from hitl_review.ui.images import ImageStore
from hitl_review.ui.layout import layout
from hitl_review.ui.session import ReviewerState
from hitl_review.ui.shown import is_shown

API = "/api/v1"
ADMIN = auth("admin")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _no_events(_job_id: str, _after: int) -> AsyncIterator[str]:
    if False:
        yield ""


async def _ready() -> dict[str, Any]:
    return {"models_ready": True}


@asynccontextmanager
async def replica(
    url: str, data_dir: Path, archive: Any = None, **fields: Any
) -> AsyncIterator[Callable[..., httpx.AsyncClient]]:
    """One API replica (the app, its own store and Authenticator, and ``archive`` when given) on the
    test's Redis; yields a factory of clients, each connecting from the peer address ``peer`` (default
    127.0.0.1)."""
    settings = Settings(data_dir=data_dir, tokens=TOKENS_SPEC, redis_url=url, **fields)

    async def build() -> Runtime:
        return Runtime(
            settings=settings,
            store=Store.from_url(url, StoreConfig(retention_s=3600, node_timeout_s=60)),
            artifacts=ArtifactStore(settings.artifacts),
            auth=Authenticator.from_settings(settings.tokens, settings.data_dir, settings.loopback),
            events=_no_events,
            readiness=_ready,
            archive=archive,
        )

    app = create_app(build)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(app.router.lifespan_context(app))

        def client(peer: str = "127.0.0.1") -> httpx.AsyncClient:
            transport = httpx.ASGITransport(app=app, client=(peer, 40000))
            return httpx.AsyncClient(transport=transport, base_url="http://asgi", timeout=30)

        yield client


async def _add(c: httpx.AsyncClient, name: str, role: str = "reviewer") -> dict[str, Any]:
    r = await c.post(f"{API}/admin/reviewers", json={"name": name, "role": role}, headers=ADMIN)
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


async def _redis_text(store: Store) -> str:
    """Everything Redis holds, as one text (each key's value, whatever its type)."""
    parts = []
    async for key in store.r.scan_iter():
        kind = await store.r.type(key)
        if kind == "hash":
            parts.append(json.dumps(await store.r.hgetall(key)))
        elif kind == "stream":
            parts.append(json.dumps(await store.r.xrange(key)))
        elif kind == "string":
            parts.append(str(await store.r.get(key)))
        elif kind == "zset":
            parts.append(json.dumps(await store.r.zrange(key, 0, -1, withscores=True)))
        elif kind == "list":
            parts.append(json.dumps(await store.r.lrange(key, 0, -1)))
        elif kind == "set":
            parts.append(json.dumps(sorted(await store.r.smembers(key))))
        parts.append(key)
    return "\n".join(parts)


# ----------------------------------------------------------------------------- accounts over the API


async def test_an_account_added_on_one_replica_signs_in_on_another_and_is_refused_after_removal(
    store: Store, redis_server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hitl.api")
    async with replica(redis_server.url, tmp_path / "a") as on_a, replica(redis_server.url, tmp_path / "b") as on_b:
        async with on_a() as a, on_b() as b:
            added = await _add(a, "alice")
            token = added["token"]
            assert added["name"] == "alice" and added["role"] == "reviewer" and added["added_by"] == "admin"
            assert len(token) >= 40

            # At once, on the other replica too: the queue, and who it is.
            r = await b.get(f"{API}/jobs", params={"status": "WAITING"}, headers=bearer(token))
            assert r.status_code == 200, r.text
            assert (await b.get(f"{API}/whoami", headers=bearer(token))).json() == {"name": "alice", "role": "reviewer"}
            # A reviewer is not an admin; a submitter account is a submitter.
            r = await b.get(f"{API}/admin/reviewers", headers=bearer(token))
            assert r.status_code == 403 and r.json()["code"] == "FORBIDDEN"
            sub = await _add(a, "sam-the-submitter", role="submitter")
            r = await b.post(f"{API}/jobs/job_x/interventions", json={}, headers=bearer(sub["token"]))
            assert r.status_code == 403

            # Listed (without any token or hash), with HITL_TOKENS' identities apart.
            listed = (await b.get(f"{API}/admin/reviewers", headers=ADMIN)).json()
            assert [a_["name"] for a_ in listed["accounts"]] == ["alice", "sam-the-submitter"]
            assert {"name": "rev1", "role": "reviewer"} in listed["static"]
            assert token not in json.dumps(listed) and accounts.token_hash(token) not in json.dumps(listed)

            # Redis keeps the hash, never the token.
            assert await store.r.hget(keys.REVIEWERS, "n:alice") == hashlib.sha256(token.encode()).hexdigest()
            assert token not in await _redis_text(store)

            # Removed on A: A refuses at once; B within its cache's few seconds (primed just before).
            assert (await b.get(f"{API}/whoami", headers=bearer(token))).status_code == 200
            r = await a.delete(f"{API}/admin/reviewers/alice", headers=ADMIN)
            assert r.status_code == 200 and r.json()["removed"]["name"] == "alice", r.text
            removed_at = time.monotonic()
            r = await a.get(f"{API}/jobs", headers=bearer(token))
            assert r.status_code == 401 and r.json()["code"] == "UNAUTHORIZED"
            while (await b.get(f"{API}/jobs", headers=bearer(token))).status_code != 401:
                assert time.monotonic() - removed_at < ACCOUNT_CACHE_S + 1.0, "replica B still accepts the token"
                await asyncio.sleep(0.1)
            assert await store.r.hget(keys.REVIEWERS, "n:alice") is None
            assert await store.r.hget(keys.REVIEWERS, f"t:{accounts.token_hash(token)}") is None

            # The same name again: a new token, the old one still refused.
            again = await _add(a, "alice")
            assert again["token"] != token
            assert (await a.get(f"{API}/whoami", headers=bearer(again["token"]))).status_code == 200
            assert (await a.get(f"{API}/whoami", headers=bearer(token))).status_code == 401

    # Audited: a log line per change and the stream of changes, each with its admin.
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "hitl.api"]
    assert "reviewer account alice (reviewer) added by admin" in lines
    assert "reviewer account alice (reviewer) removed by admin" in lines
    changes = list(reversed(await accounts.changes(store.r)))  # oldest first
    assert [(c["action"], c["name"], c["role"], c["by"]) for c in changes] == [
        ("add", "alice", "reviewer", "admin"),
        ("add", "sam-the-submitter", "submitter", "admin"),
        ("remove", "alice", "reviewer", "admin"),
        ("add", "alice", "reviewer", "admin"),
    ]
    assert all(c["at"].endswith("Z") for c in changes)


async def test_refusals_and_static_tokens(store: Store, redis_server: Any, tmp_path: Path) -> None:
    async with replica(redis_server.url, tmp_path) as on:
        async with on() as c:
            await _add(c, "bob")
            path = f"{API}/admin/reviewers"
            cases = [
                ({"name": "bob"}, 409, "NAME_TAKEN"),
                ({"name": "rev1"}, 409, "NAME_TAKEN"),  # a HITL_TOKENS name
                ({"name": "bad name"}, 400, "INVALID_REQUEST"),
                ({"name": "a:b"}, 400, "INVALID_REQUEST"),
                ({"name": ""}, 400, "INVALID_REQUEST"),
                ({"name": "carol", "role": "executor"}, 400, "INVALID_REQUEST"),
                ({"role": "reviewer"}, 400, "INVALID_REQUEST"),
            ]
            for body, status, code in cases:
                r = await c.post(path, json=body, headers=ADMIN)
                assert (r.status_code, r.json()["code"]) == (status, code), (body, r.text)
            r = await c.delete(f"{path}/nobody", headers=ADMIN)
            assert (r.status_code, r.json()["code"]) == (404, "ACCOUNT_NOT_FOUND")
            r = await c.delete(f"{path}/rev1", headers=ADMIN)
            assert (r.status_code, r.json()["code"]) == (400, "INVALID_REQUEST")
            for who in ("rev1", "sub1", "exec"):
                for method, url in (("GET", path), ("POST", path), ("DELETE", f"{path}/bob")):
                    body = {"name": "x"} if method == "POST" else None
                    r = await c.request(method, url, json=body, headers=auth(who))
                    assert r.status_code == 403, (who, method, r.text)
            r = await c.get(path)
            assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
            assert (await c.get(f"{API}/whoami", headers=bearer("not-a-token"))).status_code == 401
            # HITL_TOKENS still work beside the accounts.
            assert (await c.get(f"{API}/whoami", headers=auth("rev1"))).json() == {"name": "rev1", "role": "reviewer"}
            assert (await c.get(f"{API}/jobs", headers=auth("sub1"))).status_code == 200
            assert [a["name"] for a in (await c.get(path, headers=ADMIN)).json()["accounts"]] == ["bob"]


async def test_accounts_on_a_redis_cluster(cluster_store: Store) -> None:
    """Both keys carry one hash tag: each change is one script in one slot of the cluster."""
    assert keys.REVIEWERS.split("}")[0] == keys.REVIEWERS_LOG.split("}")[0]
    account, token = await accounts.add(cluster_store, "dana", "admin", "ops")
    found = await accounts.lookup(cluster_store.r, accounts.token_hash(token))
    assert found == account and found.role == "admin"
    assert [a.name for a in await accounts.list_all(cluster_store.r)] == ["dana"]
    with pytest.raises(accounts.NameTaken):
        await accounts.add(cluster_store, "dana", "reviewer", "ops")
    assert (await accounts.remove(cluster_store, "dana", "ops")).name == "dana"
    assert await accounts.lookup(cluster_store.r, accounts.token_hash(token)) is None
    with pytest.raises(accounts.AccountNotFound):
        await accounts.remove(cluster_store, "dana", "ops")
    assert [c["action"] for c in await accounts.changes(cluster_store.r)] == ["remove", "add"]


# ----------------------------------------------------------------------------- a trusted proxy's user


async def test_a_proxys_user_counts_only_from_the_trusted_addresses(redis_server: Any, tmp_path: Path) -> None:
    user = {"X-Forwarded-User": "carol"}
    async with replica(redis_server.url, tmp_path, trusted_proxies=["10.9.0.0/16", "fd00::1"]) as on:
        async with on("10.9.1.2") as proxy, on("10.8.0.1") as other, on("127.0.0.1") as local:
            r = await proxy.get(f"{API}/whoami", headers=user)
            assert r.status_code == 200 and r.json() == {"name": "carol", "role": "reviewer"}, r.text
            assert (await proxy.get(f"{API}/jobs", params={"status": "WAITING"}, headers=user)).status_code == 200
            assert (await proxy.get(f"{API}/admin/reviewers", headers=user)).status_code == 403
            for header in ("X-Auth-Request-User", "X-Forwarded-Email"):
                r = await proxy.get(f"{API}/whoami", headers={header: "carol@example.com"})
                assert r.json()["name"] == "carol@example.com", r.text
            both = {"X-Forwarded-Email": "c@example.com", "X-Forwarded-User": "carol"}
            assert (await proxy.get(f"{API}/whoami", headers=both)).json()["name"] == "carol"
            # A token the proxy passes on wins over its header.
            assert (await proxy.get(f"{API}/whoami", headers={**user, **ADMIN})).json()["name"] == "admin"
            # From the proxy: an unusable name, a header sent twice, or none at all.
            assert (await proxy.get(f"{API}/whoami", headers={"X-Forwarded-User": "a b"})).status_code == 401
            twice = [("X-Forwarded-User", "carol"), ("X-Forwarded-User", "admin")]
            assert (await proxy.get(f"{API}/whoami", headers=twice)).status_code == 401
            assert (await proxy.get(f"{API}/whoami")).status_code == 401
            # From anyone else the header is nothing, also with X-Forwarded-For naming the proxy.
            for c in (other, local):
                r = await c.get(f"{API}/whoami", headers=user)
                assert r.status_code == 401 and r.json()["code"] == "UNAUTHORIZED", r.text
                r = await c.get(f"{API}/jobs", headers={**user, "X-Forwarded-For": "10.9.1.2"})
                assert r.status_code == 401
        async with on("::ffff:10.9.7.7") as mapped, on("fd00::1") as six, on("fd00::2") as six_other:
            assert (await mapped.get(f"{API}/whoami", headers=user)).status_code == 200
            assert (await six.get(f"{API}/whoami", headers=user)).status_code == 200
            assert (await six_other.get(f"{API}/whoami", headers=user)).status_code == 401


async def test_no_proxy_is_trusted_by_default_and_the_role_is_configurable(redis_server: Any, tmp_path: Path) -> None:
    user = {"X-Forwarded-User": "carol"}
    async with replica(redis_server.url, tmp_path / "none") as on:
        async with on("127.0.0.1") as c:
            assert (await c.get(f"{API}/whoami", headers=user)).status_code == 401
    async with replica(redis_server.url, tmp_path / "sub", trusted_proxies=["127.0.0.1"], proxy_role="submitter") as on:
        async with on("127.0.0.1") as c:
            assert (await c.get(f"{API}/whoami", headers=user)).json() == {"name": "carol", "role": "submitter"}
            r = await c.post(f"{API}/jobs/job_x/cancel", headers=user)
            assert r.status_code == 403 and r.json()["code"] == "FORBIDDEN"


def test_trusted_proxy_settings_and_flags() -> None:
    with pytest.raises(ValidationError, match="not an address or a CIDR block"):
        Settings(trusted_proxies=["10.0.0.0/33"])
    assert Settings().trusted_proxies == [] and Settings().proxy_role == "reviewer"
    args = build_parser().parse_args(
        ["up", "--trusted-proxy", "10.0.0.0/8", "--trusted-proxy", "127.0.0.1", "--proxy-role", "submitter"]
    )
    s = settings_from_args(args)
    assert s.trusted_proxies == ["10.0.0.0/8", "127.0.0.1"] and s.proxy_role == "submitter"
    with pytest.raises(UpError, match="trusted"):
        settings_from_args(build_parser().parse_args(["up", "--trusted-proxy", "proxy.example"]))
    assert settings_from_args(build_parser().parse_args(["up"])).trusted_proxies == []
    t = TrustedProxies(["10.0.0.0/8", "::1"])
    assert t.trusts("10.2.3.4") and t.trusts("::1") and t.trusts("::ffff:10.0.0.1")
    assert not t.trusts("11.0.0.1") and not t.trusts(None) and not t.trusts("not-an-ip")
    assert not TrustedProxies().trusts("127.0.0.1") and not TrustedProxies()


# ----------------------------------------------------------------------------- the CLI and the UI's sign-in


def test_a_new_token_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """One URL-safe token in 64 began with "-", and ``hitl … --token -Xy…`` was then refused by argparse
    as a missing argument (a full run's ``test_hitl_admin_reviewers_add_list_remove`` hit it)."""
    import secrets

    drawn = iter(["-dashed" + "a" * 36, "b" * 43])
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n: next(drawn))
    assert accounts.new_token() == "b" * 43
    parsed = build_parser().parse_args(["admin", "reviewers", "add", "x", "--token", "b" * 43])
    assert parsed.token == "b" * 43


def test_hitl_admin_reviewers_add_list_remove(api_server: Any, capsys: pytest.CaptureFixture[str]) -> None:
    name = f"rev-{uuid.uuid4().hex[:8]}"
    conn = ["--api-url", api_server.url, "--token", TOKENS["admin"]]
    assert hitl(["admin", "reviewers", "add", name, *conn]) == 0
    out = capsys.readouterr()
    token = out.out.strip()
    assert len(token) >= 40 and "\n" not in token and "shown this once" in out.err
    with httpx.Client(base_url=api_server.url, timeout=10) as c:
        assert c.get(f"{API}/whoami", headers=bearer(token)).json() == {"name": name, "role": "reviewer"}

        assert hitl(["admin", "reviewers", "list", "--json", *conn]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert name in [a["name"] for a in listed["accounts"]] and token not in json.dumps(listed)
        assert hitl(["admin", "reviewers", "list", *conn]) == 0
        assert name in capsys.readouterr().out

        assert hitl(["admin", "reviewers", "add", name, "--role", "admin", *conn]) == 1  # the name is taken
        assert "NAME_TAKEN" in capsys.readouterr().err
        assert hitl(["admin", "reviewers", "add", f"{name}-2", "--role", "submitter", "--json", *conn]) == 0
        assert json.loads(capsys.readouterr().out)["role"] == "submitter"
        assert hitl(["admin", "reviewers", "add", "x", "--api-url", api_server.url, "--token", token]) == 1
        assert "403" in capsys.readouterr().err

        assert hitl(["admin", "reviewers", "remove", name, *conn]) == 0
        assert "removed" in capsys.readouterr().out
        assert c.get(f"{API}/whoami", headers=bearer(token)).status_code == 401  # the serving replica: at once
        assert hitl(["admin", "reviewers", "remove", name, *conn]) == 1
        assert "no reviewer account" in capsys.readouterr().err


def _sign_in_page(api_url: str, root: Path) -> tuple[Any, Callbacks]:
    with gr.Blocks():
        comps = layout(token=None, require_login=True)
    return comps, Callbacks(comps, api_url, ImageStore(root))


def test_the_ui_signs_in_with_a_session_cookie_and_forgets_a_removed_account(api_server: Any, tmp_path: Path) -> None:
    """The page's server (ui.cookie_signin, ui.signin): the token goes to its sign-in route, which answers an
    ``HttpOnly`` ``SameSite=Strict`` session cookie (``Secure`` off loopback) and no token; the handlers sign
    in from that cookie, on a reload too, and act on the API with it; a removed account's cookie is refused."""
    name = f"ui-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=api_server.url, timeout=10, headers=ADMIN) as admin:
        token = admin.post(f"{API}/admin/reviewers", json={"name": name}).json()["token"]
        comps, cb = _sign_in_page(api_server.url, tmp_path)
        ui = Starlette(routes=cookie_signin.routes(api_server.url), middleware=[Middleware(cookie_signin.OriginCheck)])
        with TestClient(ui, base_url="http://127.0.0.1:7860") as form:
            said = form.post("/hitl-signin", json={"name": "someone-else", "token": token}).json()["message"]
            assert "not someone-else's" in said  # the name is checked
            assert "401" in form.post("/hitl-signin", json={"name": name, "token": "wrong"}).json()["message"]
            assert "submitter" in form.post("/hitl-signin", json={"token": TOKENS["sub1"]}).json()["message"]
            r = form.post("/hitl-signin", json={"token": token}, headers={"Origin": "https://evil.example"})
            assert r.status_code == 403 and r.json()["code"] == "CSRF_FAILED"
            r = form.post("/hitl-signin", json={"name": name, "token": token})
            assert r.status_code == 200 and r.json() == {"name": name, "role": "reviewer"}
            set_cookie = r.headers["set-cookie"]
            flags = {f.strip().lower() for f in set_cookie.split(";")[1:]}
            assert {"httponly", "samesite=strict", "path=/"} <= flags and "secure" not in flags  # loopback
            assert token not in r.text and token not in set_cookie
            sid = set_cookie.split(";")[0].partition("=")[2]
        with TestClient(ui, base_url="http://review.example") as form:
            r = form.post("/hitl-signin", json={"token": token})
            assert "secure" in r.headers["set-cookie"].lower().split("; ")  # off loopback
        page = SimpleNamespace(client=SimpleNamespace(host="127.0.0.1"), headers={"cookie": f"hitl_session={sid}"})
        bare = SimpleNamespace(client=SimpleNamespace(host="127.0.0.1"), headers={})

        nothing = {comps.login_msg: gr.skip()}  # no change (Gradio refuses an empty dict as an update)
        st = ReviewerState(signed_in=False)
        assert cb.on_login(st, "The form said why", page) == nothing and not st.signed_in
        out = cb.on_login(st, "", page)
        assert st.signed_in and st.reviewer == name and st.token is not None and token not in st.token
        assert is_shown(out[comps.main_row.style]) and not is_shown(out[comps.login_col.style])
        assert name in out[comps.who_md] and out[comps.signout_btn]["visible"]

        # A reload: a fresh session signs in from the cookie, without the form, and acts on the API with it
        # (a write: the session's CSRF token goes along, kept in this process).
        again = ReviewerState(signed_in=False)
        out = cb.on_restore(again, page)
        assert again.signed_in and again.reviewer == name and is_shown(out[comps.main_row.style])
        cb.clients.get(again.token).claim_next()
        assert cb.on_restore(ReviewerState(), bare) == nothing

        # The account removed: its session is refused, and the form says so.
        assert admin.delete(f"{API}/admin/reviewers/{name}").status_code == 200
        gone = ReviewerState(signed_in=False)
        out = cb.on_restore(gone, page)
        assert not gone.signed_in and "401" in out[comps.login_msg]

        # Sign-out ends the session on the API and drops the cookie.
        token2 = admin.post(f"{API}/admin/reviewers", json={"name": f"{name}-2"}).json()["token"]
        with TestClient(ui, base_url="http://127.0.0.1:7860") as form:
            set_cookie = form.post("/hitl-signin", json={"token": token2}).headers["set-cookie"]
            sid2 = set_cookie.split(";")[0].partition("=")[2]
            r = form.post("/hitl-signout", headers={"cookie": f"hitl_session={sid2}"})
            assert r.json() == {"ended": True} and "max-age=0" in r.headers["set-cookie"].lower()
        ended = httpx.get(f"{api_server.url}{API}/whoami", headers={"Cookie": f"hitl_session={sid2}"}, timeout=10)
        assert ended.status_code == 401

        # A proxy's user on a page from an address the UI does not trust: nothing; from one it trusts but
        # the API does not (api_server trusts no proxy): said, not signed in.
        proxied = SimpleNamespace(client=SimpleNamespace(host="127.0.0.1"), headers={"x-forwarded-user": "pat"})
        assert cb.on_restore(ReviewerState(), proxied) == nothing
        cb.proxies = TrustedProxies(["127.0.0.1"])
        st = ReviewerState()
        assert "--trusted-proxy" in cb.on_restore(st, proxied)[comps.login_msg] and not st.signed_in
