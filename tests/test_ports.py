"""``hitl up`` says in one line, before Redis or Ray start, when a port it must listen on is taken;
the connections a crashed predecessor left on its port (TIME_WAIT) do not count as taken
(``serve_app.ops.ports``; the restart itself: tests/test_restart_same_port.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hitl_review.serve_app.ops import ports


def listening(reuse: bool = True) -> socket.socket:
    """A listening socket; ``reuse``: with ``SO_REUSEADDR``, as the servers set it."""
    s = socket.socket()
    if reuse:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_a_port_someone_listens_on_is_taken_and_named():
    with listening() as s:
        port = s.getsockname()[1]
        why = ports.taken("127.0.0.1", port)
        assert why is not None and why.startswith("in use by")
        with pytest.raises(SystemExit, match=rf"cannot listen on 127.0.0.1:{port} \(--api-port\): in use"):
            ports.check("127.0.0.1", {"--api-port": port})


def test_connections_left_behind_by_a_closed_server_do_not_make_its_port_taken():
    server = listening()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()  # the server side closes first: its end of the connection lingers in TIME_WAIT
    client.recv(1)
    client.close()
    server.close()
    assert ports.taken("127.0.0.1", port, linger_s=0) is None
    with socket.socket() as plain:  # a bind without SO_REUSEADDR (Serve's own) is refused meanwhile
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))


def test_connections_of_a_server_without_reuse_address_are_waited_for_not_called_a_holder():
    server = listening(reuse=False)
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()
    client.recv(1)
    client.close()
    server.close()
    assert ports.holder(port) is None  # nobody listens: only a connection lingers
    assert ports.taken("127.0.0.1", port, linger_s=0.6) == "held by connections that outlived their server"


def test_hitl_up_on_a_taken_port_exits_with_one_line_before_starting_anything(tmp_path: Path):
    with listening() as s:
        port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "hitl_review.serve_app.cli", "up", "--data-dir", str(tmp_path / "d"), "--no-ui"]
        done = subprocess.run([*cmd, "--api-port", str(port)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert f"hitl up: cannot listen on 127.0.0.1:{port} (--api-port): in use by pid" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert "starting Ray" not in done.stderr + done.stdout and "embedded redis-server" not in done.stderr + done.stdout


def test_quiet_port_never_hands_out_a_port_twice_nor_one_spoken_for(monkeypatch: pytest.MonkeyPatch):
    """The API port is chosen before Ray starts and bound by the Api replica seconds later: free all
    that time, so a later pick (the proxy's, the metrics', the UI's) must not land on it (CI saw
    Serve's ``NoAvailablePortError`` once). A range of four ports makes a repeat certain without
    the reservation."""
    monkeypatch.setattr(ports, "_SPOKEN_FOR", set())
    low = ports.free_port(60000)
    while not all(ports.port_free("127.0.0.1", p) for p in range(low, low + 4)):
        low = ports.free_port(60000)
    ports.reserve(low, None)
    picked = [ports.quiet_port(low, low + 3) for _ in range(3)]
    assert sorted(picked) == [low + 1, low + 2, low + 3]
    assert low not in picked


def test_a_deploy_failing_for_the_api_port_names_its_holder(monkeypatch: pytest.MonkeyPatch):
    """``hitl up``'s one line when the Api replica could not bind the API port under direct ingress.
    (Serve's status is not asked here: with no cluster it would start a Ray of its own.)"""
    from ray import serve

    from hitl_review.serve_app.ops import preflight

    def no_cluster() -> None:
        raise ConnectionError("no Ray cluster in this test")

    monkeypatch.setattr(serve, "status", no_cluster)

    with listening() as s:
        port = s.getsockname()[1]
        err = RuntimeError(
            "Deploying application hitl failed: ray.serve._private.node_port_manager.NoAvailablePortError: "
            "No available ports on node abc for RequestProtocol.HTTP protocol."
        )
        said = str(preflight.deploy_failure("no-such-app", err, api_port=port))
    assert "NoAvailablePortError" in said
    assert f"the API port {port} could not be bound by the Api replica (pid " in said
