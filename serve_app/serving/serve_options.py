"""Deployment options the control plane's own deployments (Api, Events, Archiver) share.

Serve's own health-check defaults, spelled out so that the config file states them; a stop checks
every 0.5 s (Serve's default: 2 s) whether the replica's requests are done, and gives them 5 s.
The model deployments take theirs from ``--config`` (``deployments.serve``).
"""

from __future__ import annotations

from typing import Any

CONTROL_PLANE: dict[str, Any] = {
    "health_check_period_s": 10.0,
    "health_check_timeout_s": 30.0,
    "graceful_shutdown_wait_loop_s": 0.5,
    "graceful_shutdown_timeout_s": 5.0,
}
