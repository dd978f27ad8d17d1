"""The store's side of the box auto-approve policy (docs/learning.md, docs/protocol.md § Auto-approval):
its live mode in Redis, the draw for a spot check, its counters, and the live check that drops it to
``shadow`` by itself.

The mode lives in one Redis hash (``keys.BOX_POLICY``), so a drop reached by one replica holds on every
replica at its next detection; a replica that restarts keeps it (``policy_mode.lua``'s ``start``). A
missing or foreign record reads as ``shadow``: nothing is approved automatically unless Redis says the
loaded policy is ``on``. The counters are kept in each partition's counters hash by the same script that
commits the decision or the review (``count_policy`` in ``_lib.lua``), so they are exact; the drop
itself follows the review that tipped it (a second write: a crash between the two only delays the drop
to the next spot check).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from . import durable, keys
from .autoapprove import MODES, Ask, BoxPolicy, should_drop
from .ids import now_iso

LOG_CAP = 10_000
MONITOR = "policy-check"  # the actor of the drop's audit entry
# Per policy: automatic approvals; shadow decisions (and those that would approve); spot checks (and
# their false accepts); shadow jobs reviewed (false accepts, agreements); jobs the policy sent to a
# person in ``on`` and the reviewer changed (``reviewed_agree``).
COUNTERS = (
    "auto",
    "shadow",
    "shadow_would",
    "spot",
    "spot_fa",
    "shadow_reviewed",
    "shadow_reviewed_fa",
    "shadow_reviewed_agree",
    "reviewed",
    "reviewed_agree",
)


@dataclass
class AutoApproveConfig:
    """What ``hitl up --auto-approve MODE --auto-approve-policy FILE --spot-check SHARE`` gives the store."""

    policy: BoxPolicy
    mode: str = "shadow"
    spot_check: float = 0.05
    rng: random.Random = field(default_factory=random.SystemRandom)  # seeded in tests

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"auto-approve mode {self.mode!r} must be one of {list(MODES)}")
        if not 0 <= self.spot_check <= 1:
            raise ValueError(f"spot-check share {self.spot_check} must lie in [0, 1]")


def _script(store: Any) -> Any:
    src = (resources.files("hitl_review.statecore") / "lua" / "policy_mode.lua").read_text()
    return durable.synced(store, store.r.register_script(src))


async def set_mode(store: Any, op: str, ref: str, mode: str, reason: str, by: str) -> tuple[str, str]:
    """``policy_mode.lua``: ``start`` / ``drop`` / ``set``; returns (its answer, the live mode)."""
    res = await _script(store)(
        keys=[keys.BOX_POLICY, keys.BOX_POLICY_LOG, keys.POLICY_WEBHOOKS],
        args=[op, ref, mode, reason, now_iso(), by, LOG_CAP],
    )
    return str(res[0]), str(res[1])


async def start(store: Any) -> str | None:
    """A process built with a policy makes its configured mode the live one, unless it is the same
    policy and mode as before (a drop to shadow then stands). The live mode, or None without a policy."""
    cfg: AutoApproveConfig | None = store.config.auto_approve
    if cfg is None:
        return None
    _, mode = await set_mode(store, "start", cfg.policy.ref, cfg.mode, "started", "hitl up")
    return mode


async def live(r: Any) -> dict[str, str]:
    """The live record (``ref``, ``mode``, ``configured``, ``reason``, ``at``, ``dropped_at``); {} when none."""
    out: dict[str, str] = await r.hgetall(keys.BOX_POLICY)
    return out


async def live_mode(r: Any, ref: str) -> str:
    ref_now, mode = await r.hmget(keys.BOX_POLICY, "ref", "mode")
    return str(mode) if ref_now == ref and mode in MODES else "shadow"


async def ask(store: Any) -> Ask | None:
    """The policy's say on the next detection: None when it has none (no policy, or ``off``)."""
    cfg: AutoApproveConfig | None = store.config.auto_approve
    if cfg is None or cfg.mode == "off":
        return None
    if not getattr(store, "auto_started", False):  # this process's first detection: its configured mode
        await start(store)
        store.auto_started = True
    mode = await live_mode(store.r, cfg.policy.ref)
    if mode == "off":
        return None
    return Ask(policy=cfg.policy, mode=mode, spot_check=cfg.spot_check, draw=cfg.rng.random())


async def counts(r: Any, ref: str) -> dict[str, int]:
    """The policy's counters over every partition (one HMGET each, pipelined)."""
    fields = [f"{ref}:{c}" for c in COUNTERS]
    async with r.pipeline(transaction=False) as pipe:
        for p in range(keys.PARTITIONS):
            pipe.hmget(keys.counts(p), fields)
        rows = await pipe.execute()
    return {c: sum(int(row[i] or 0) for row in rows) for i, c in enumerate(COUNTERS)}


GATE_COUNTERS = ("gate_spot", "gate_spot_fa")  # masks the gate passed that a person checked, and did not accept


async def gate_counts(r: Any) -> dict[str, int]:
    """The mask spot checks' counters (statecore.gate_spot) over every partition."""
    async with r.pipeline(transaction=False) as pipe:
        for p in range(keys.PARTITIONS):
            pipe.hmget(keys.counts(p), list(GATE_COUNTERS))
        rows = await pipe.execute()
    return {c: sum(int(row[i] or 0) for row in rows) for i, c in enumerate(GATE_COUNTERS)}


async def after_review(store: Any, job_id: str, event: dict[str, Any] | None) -> bool:
    """After a committed review of a spot check: the live check. True when it dropped the policy to
    ``shadow`` (with its entry in the policy's change stream and in the job's audit log)."""
    cfg: AutoApproveConfig | None = store.config.auto_approve
    if cfg is None or event is None or event.get("type") != "POLICY_SPOT_CHECKED":
        return False
    if event.get("policy") != cfg.policy.ref:
        return False
    c = await counts(store.r, cfg.policy.ref)
    drop, low = should_drop(c["spot"], c["spot_fa"], cfg.policy)
    if not drop:
        return False
    reason = (
        f"live spot checks: {c['spot_fa']} false accepts in {c['spot']}, lower bound {low:.4f} > "
        f"{cfg.policy.max_false_accept} at {cfg.policy.confidence:.0%}"
    )
    answer, _ = await set_mode(store, "drop", cfg.policy.ref, "shadow", reason, MONITOR)
    if answer != "DROPPED":
        return False  # another replica dropped it first, or an operator changed it
    await store.audit_only(job_id, MONITOR, "POLICY_DROPPED_TO_SHADOW", f"APPLIED:shadow {cfg.policy.ref}")
    return True
