"""A job's audit log: reading it and verifying its hash chain (docs/protocol.md § Audit).

The entries are written only by the Lua script that commits each action (``audit()`` in
``lua/_lib.lua``), in the same atomic step; this module is the other half of that contract: the
same canonical text, the same digest, so a verifier outside Redis recomputes every hash. It is pure
(no I/O) apart from :func:`read`, and serves Redis's copy and the archive's alike.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import keys
from .ids import canonical_json, now_iso

# The fields that link an action to its intent (docs/protocol.md § Audit, SPEC §11): the token's role,
# the user an authenticating proxy named (statecore.trusted_proxy), an intervention's id and the
# canonical hash of its body (ids.payload_hash, the one its idempotency record keeps), the node a
# model step ran ("<node_type>:<node_instance_id>"), and a reason given with the action (a cancel's).
# Hashed after the eight fields below, in this order, only when one of them is set: an entry written
# before they existed hashes (and verifies) as it always did.
INTENT = ("role", "proxy_user", "intervention_id", "payload_hash", "node", "reason")
# The order of an entry's fields as the audit route shows them (and of an entry stored whole).
FIELDS = (
    "seq",
    "at",
    "actor",
    "role",
    "proxy_user",
    "action",
    "node",
    "base_version",
    "snapshot_id",
    "intervention_id",
    "payload_hash",
    "reason",
    "outcome",
    "prev_hash",
    "hash",
)
# The fields every entry's hash covers, in the hashed text's order (then INTENT's, when set).
HASHED = ("seq", "at", "actor", "action", "base_version", "snapshot_id", "outcome", "prev_hash")
LEGACY = (*HASHED, "hash")  # an entry stored whole before INTENT existed (nine fields)
# How Redis stores an entry (a JSON array; every byte of a waiting job counts): without prev_hash,
# which is the hash of the entry before it (``parse_all`` fills it in), then base_version and
# snapshot_id, left out when none, then an object of the INTENT fields set (left out when none; the
# two before it are null then if none). An array of all FIELDS (or all nine LEGACY fields: an entry
# stored before this form, or written whole by hand) reads as it is.
STORED = ("seq", "at", "actor", "action", "outcome", "hash", "base_version", "snapshot_id")


@dataclass(frozen=True)
class Intent:
    """What an action's entry says about its intent besides who and what (INTENT): given by the
    caller of a script, carried to ``audit()`` in ``lua/_lib.lua`` with the actor (:func:`actor_arg`)."""

    role: str = ""
    proxy_user: str = ""
    intervention_id: str = ""
    payload_hash: str = ""
    node: str = ""
    reason: str = ""

    def fields(self) -> dict[str, str]:
        return {f: v for f in INTENT if (v := getattr(self, f))}


def actor_arg(actor: str, intent: Intent | None = None) -> str:
    """ARGV[4] of every state-changing script: the actor's name, and when ``intent`` sets a field,
    a NUL then the fields as JSON (a name never ends in a NUL and ``{…}``; the script splits at the
    last NUL before a JSON object, so the name may be anything)."""
    fields = intent.fields() if intent is not None else {}
    return f"{actor}\0{canonical_json(fields)}" if fields else actor


def _canon(v: Any) -> str:
    """One field as ``audit()`` hashes it: ``<length>:<text>``, ``-`` for none (or empty). The length
    counts UTF-8 bytes, as Lua's ``#`` does (``张伟`` is ``6:张伟``, not ``2:张伟``); a number is its
    digits, as the script writes its own (``seq``, an integer; ``base_version`` reaches it as the
    digits the client sent, and is stored so that it reads back as the same integer: ``parse``).
    So the text hashed here is the script's, byte for byte."""
    if v is None or v == "":
        return "-"
    s = str(v)
    return f"{len(s.encode())}:{s}"


def entry_hash(entry: Mapping[str, Any]) -> str:
    """The hash ``audit()`` gives ``entry``: SHA-1 (Redis's Lua offers no other digest) over its
    fields but ``hash``, ``prev_hash`` included, so each entry covers the whole chain before it; then
    the INTENT fields when one is set (an entry without them hashes as before they existed)."""
    text = "".join(_canon(entry.get(f)) for f in HASHED)
    if any(entry.get(f) not in (None, "") for f in INTENT):
        text += "".join(_canon(entry.get(f)) for f in INTENT)
    return hashlib.sha1(text.encode()).hexdigest()  # the digest Redis's Lua computes; a chain, not a password


def intent_of(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """The INTENT fields ``entry`` sets, None when none (the archive keeps them in one JSON column)."""
    found = {f: entry[f] for f in INTENT if entry.get(f) not in (None, "")}
    return found or None


def shown(base: Mapping[str, Any], intent: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An entry as the audit route shows it: every field of FIELDS, in that order (None when unset),
    from ``base`` and the ``intent`` fields kept apart from it."""
    merged = {**base, **(intent or {})}
    return {f: merged.get(f) for f in FIELDS}


def parse(raw: str, prev_hash: str | None = None) -> dict[str, Any]:
    """One stored entry as the audit route shows it (FIELDS, in that order). ``prev_hash``: the hash
    of the entry before it, for an entry stored without its own (None when not known)."""
    values = json.loads(raw)
    if len(values) == len(FIELDS):
        stored = dict(zip(FIELDS, values, strict=True))
    elif len(values) == len(LEGACY) and not isinstance(values[-1], dict):
        stored = dict(zip(LEGACY, values, strict=True))
    else:
        stored = dict(zip(STORED, values, strict=False))
        if len(values) > len(STORED) and isinstance(values[len(STORED)], dict):
            stored.update({f: v for f, v in values[len(STORED)].items() if f in INTENT})
        stored["prev_hash"] = prev_hash
    entry = shown(stored)
    bv = entry["base_version"]
    if isinstance(bv, str) and bv.isascii() and bv.isdigit():  # past a double's exact range: kept as digits
        entry["base_version"] = int(bv)
    return entry


def parse_all(raws: Sequence[str]) -> list[dict[str, Any]]:
    """A job's stored entries, oldest first, each with the ``prev_hash`` it was hashed with: the hash
    of the entry before it (the first: ""), unless the entry states its own. An entry whose content
    was changed still fails its own hash, or the next entry's: the hash covers ``prev_hash``."""
    out: list[dict[str, Any]] = []
    prev = ""
    for raw in raws:
        entry = parse(raw, prev)
        if entry["prev_hash"] is None:
            entry["prev_hash"] = prev
        out.append(entry)
        prev = str(entry["hash"])
    return out


@dataclass(frozen=True)
class Broken:
    """The first entry of a chain that does not verify: its position (1-based) and why."""

    position: int
    seq: Any
    reason: str

    def __str__(self) -> str:
        return f"entry {self.position} (seq {self.seq}): {self.reason}"


def verify(entries: Sequence[Mapping[str, Any]], head: str | None = None, head_seq: int | None = None) -> Broken | None:
    """None when ``entries`` (oldest first) form an unbroken chain ending at ``head``; else the
    first entry that breaks it. An edited entry fails its own hash; a removed or moved one breaks
    the next entry's ``prev_hash`` or its ``seq`` (entries are numbered 1, 2, … from the chain's
    start); removed last entries leave the chain short of ``head`` / ``head_seq``."""
    prev = ""
    for i, e in enumerate(entries, start=1):
        seq = e.get("seq")
        if e.get("prev_hash", "") != prev:
            return Broken(i, seq, f"prev_hash {str(e.get('prev_hash'))[:12]}… does not match the entry before it")
        if seq != i:
            return Broken(i, seq, f"seq {seq} out of order (expected {i})")
        if entry_hash(e) != e.get("hash"):
            return Broken(i, seq, "its hash does not match its content and the entry before it (edited)")
        prev = str(e["hash"])
    n = len(entries)
    if head is not None and head != prev:
        return Broken(n + 1, None, f"the chain ends at {prev[:12] or 'nothing'}, its recorded head is {head[:12]}…")
    if head_seq is not None and head_seq != n:
        return Broken(n + 1, None, f"{n} entries, the recorded head is entry {head_seq} (entries removed)")
    return None


async def read(r: Any, job_id: str) -> dict[str, Any] | None:
    """``GET /jobs/{id}/audit``'s body from Redis (``{"job_id", "entries", "head", "head_seq"}``),
    None when Redis does not hold the job. One MULTI: the entries and the head agree."""
    jk = keys.job(job_id)
    async with r.pipeline(transaction=True) as pipe:
        pipe.exists(jk.meta)
        pipe.lrange(jk.audit, 0, -1)
        pipe.hmget(jk.meta, "audit_head", "audit_seq")
        exists, raw, (head, head_seq) = await pipe.execute()
    if not exists:
        return None
    return {
        "job_id": job_id,
        "entries": parse_all(raw),
        "head": head,
        "head_seq": int(head_seq) if head_seq is not None else 0,
    }


class AuditMixin:
    """The store's audit calls (a mixin of :class:`statecore.store.Store`)."""

    r: Any
    _scripts: dict[str, Any]
    _args: Any  # Store._args

    async def audit(self, job_id: str) -> dict[str, Any] | None:
        """The job's audit log as Redis holds it (``GET /jobs/{id}/audit``), None without the job."""
        return await read(self.r, job_id)

    async def audit_only(
        self,
        job_id: str,
        actor: str,
        action: str,
        outcome: str,
        base_version: int | None = None,
        snapshot_id: str = "",
        intent: Intent | None = None,
    ) -> bool:
        """Append an entry for an action decided before any other script ran (an intervention
        refused as a 400 from its boxes and the job alone, a dead-letter command re-queued):
        False when Redis does not hold the job."""
        bv = "" if base_version is None else str(base_version)
        args = self._args(job_id, now_iso(), actor, intent) + [action, outcome, bv, snapshot_id or ""]
        return bool(await self._scripts["audit_append"](keys=keys.job(job_id).for_script(), args=args))
