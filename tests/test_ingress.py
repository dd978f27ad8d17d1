"""`hitl up --ingress`: which HTTP path runs where, and what Serve is told (no Ray here; the real
thing, both ways, is in tests/test_e2e_serve.py)."""

from __future__ import annotations

import pytest

from hitl_review.serve_app.cli import build_parser
from hitl_review.serve_app.ops.config import Settings
from hitl_review.serve_app.serving.ray_runtime import RayInfo, choose_ingress, direct_ingress_env, serve_http_options


def settings(**kw) -> Settings:
    return Settings(**{"api_port": 8123, **kw})


def test_auto_is_direct_on_our_own_ray_with_one_api_replica_and_proxy_elsewhere():
    assert choose_ingress("auto", settings()) == "direct"
    assert choose_ingress("auto", settings(api_replicas=2)) == "proxy"
    assert choose_ingress("auto", settings(ray_address="10.0.0.1:6379")) == "proxy"
    assert choose_ingress("proxy", settings()) == "proxy"


@pytest.mark.parametrize("kw, why", [({"api_replicas": 3}, "--api-replicas 3"), ({"ray_address": "h:1"}, "joins")])
def test_direct_where_it_cannot_work_is_refused_with_the_reason(kw, why):
    with pytest.raises(SystemExit, match=why):
        choose_ingress("direct", settings(**kw))


def test_the_api_replica_gets_exactly_the_api_port_and_the_proxy_another():
    env = direct_ingress_env(8123)
    assert env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1"
    # Serve allocates from [MIN, MAX): one port, the API's.
    assert (env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"], env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"]) == (
        "8123",
        "8124",
    )
    assert env["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] == "0"  # a stop stays fast
    s = settings()
    assert serve_http_options(s, RayInfo(False, None, "direct", proxy_port=9555)) == {"host": "127.0.0.1", "port": 9555}
    assert serve_http_options(s, RayInfo(False, None, "proxy")) == {"host": "127.0.0.1", "port": 8123}


def test_help_names_the_flag_and_its_default():
    up = build_parser()._subparsers._group_actions[0].choices["up"]  # argparse keeps subparsers here
    text = up.format_help()
    assert "--ingress {auto,direct,proxy}" in text and "auto (default): direct" in " ".join(text.split())
    assert up.parse_args([]).ingress == "auto"


def test_our_own_cluster_runs_serves_control_loop_every_half_second_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
):
    """Serve's controller loops every 0.1 s by default (75 ms/s of an idle ``hitl up``'s CPU); on a
    cluster ``hitl up`` starts it is told 0.5 s through the environment Ray's processes inherit.
    A value the caller's environment already has is kept. (A started controller's environment is
    checked in tests/test_faults_hitl_up.py.)"""
    from hitl_review.serve_app.serving.ray_runtime import CONTROL_LOOP_ENV, own_cluster_env

    monkeypatch.delenv("RAY_SERVE_CONTROL_LOOP_INTERVAL_S", raising=False)
    own_cluster_env()
    assert CONTROL_LOOP_ENV == {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5"}
    import os

    assert os.environ["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] == "0.5"
    monkeypatch.setenv("RAY_SERVE_CONTROL_LOOP_INTERVAL_S", "0.2")
    own_cluster_env()
    assert os.environ["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] == "0.2"
