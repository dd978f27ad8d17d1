"""Every Redis key of hitl-review is spelled here, and only here.

Cluster safety: a job's keys, the outbox stream its commands go to, and the
partition indexes all carry the hash tag ``{pN}`` of the job's partition, so
one Lua script can write state + outbox + event atomically on a Redis Cluster.
``N = crc32(job_id) % PARTITIONS``; PARTITIONS is fixed for the life of a
deployment (changing it would orphan existing jobs).
"""

from __future__ import annotations

import hashlib
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from .ids import new_id

PREFIX = "hitl"
PARTITIONS = 64
OUTBOX_GROUP = "dispatchers"
ARCHIVE_GROUP = "archivers"  # the archivers' consumer group on every partition's archive stream
# The store's identity: written once by the first process that finds it missing. A process that
# saw one identity and later finds none (or another) knows Redis came back empty (FLUSHALL, a
# failover to an empty replica, a restart without persistence) and reports what it last saw.
STORE_ID = f"{PREFIX}:store-id"
# Reviewer accounts (statecore.accounts, ``hitl admin reviewers``): one HASH, ``n:<name>`` -> the
# SHA-256 of the account's token and ``t:<that hash>`` -> the account's JSON (never a token), and a
# STREAM of account changes; one hash tag, so a script changes both in one slot of a cluster.
ACCOUNTS_TAG = f"{PREFIX}:{{accounts}}"
REVIEWERS = f"{ACCOUNTS_TAG}:reviewers"
REVIEWERS_LOG = f"{ACCOUNTS_TAG}:reviewers:log"
# Sign-in sessions of the reviewer page (statecore.sessions, docs/protocol.md § Sessions): per session a
# STRING under the SHA-256 of its id (the cookie; never the id itself), the session's JSON, with its TTL;
# per person a SET of their sessions' hashes, so removing an account ends them. One hash tag, one slot.
SESSIONS_TAG = f"{PREFIX}:{{sessions}}"


def session(hashed: str) -> str:
    return f"{SESSIONS_TAG}:s:{hashed}"


def sessions_of(name: str) -> str:
    return f"{SESSIONS_TAG}:by:{name}"


# The box auto-approve policy's live mode, seen by every replica (statecore.auto_store): one HASH
# (``ref``, ``mode``, ``configured``, ``reason``, ``at``, ``dropped_at``) and a STREAM of its changes
# (started, dropped to shadow by the live check, set by an operator); one hash tag, one slot.
POLICY_TAG = f"{PREFIX}:{{policy}}"
BOX_POLICY = f"{POLICY_TAG}:box"
BOX_POLICY_LOG = f"{POLICY_TAG}:box:log"
# Webhooks (statecore.webhooks, docs/protocol.md § Webhooks): the deliveries of the policy's events
# wait in a STREAM of its slot, as a job's wait in its partition's (``webhooks(p)``); the deliverers
# read both through one consumer group; a bounded STREAM logs each delivery's outcome.
WEBHOOK_GROUP = "webhooks"
POLICY_WEBHOOKS = f"{POLICY_TAG}:webhooks"
WEBHOOK_LOG = f"{PREFIX}:webhooks:log"


def partition_of(job_id: str) -> int:
    return zlib.crc32(job_id.encode()) % PARTITIONS


def tag(p: int) -> str:
    return f"{PREFIX}:{{p{p}}}"


_JOB_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def is_job_id(job_id: str) -> bool:
    """Whether ``job_id`` could name a job (what ``new_job_id`` makes, and ids the archive holds):
    anything else is not looked up further (a miss of such an id costs no archive read)."""
    return bool(_JOB_ID.match(job_id))


def new_job_id(partition: int | None = None) -> str:
    """A fresh job id; with ``partition``, one that falls in that partition
    (about PARTITIONS tries of a cheap crc32), so a creation idempotency
    record and the job it names share a hash slot."""
    while True:
        job_id = new_id("job")
        if partition is None or partition_of(job_id) == partition:
            return job_id


def create_idem_partition(submitter: str, idem_key: str) -> int:
    return zlib.crc32(f"{submitter}\0{idem_key}".encode()) % PARTITIONS


def create_idem(submitter: str, idem_key: str) -> str:
    digest = hashlib.sha256(f"{submitter}\0{idem_key}".encode()).hexdigest()[:32]
    return f"{tag(create_idem_partition(submitter, idem_key))}:create:{digest}"


# A job's live SEGMENT_SUBJECT nodes (statecore.subjects): one meta field each, ``node:<id>`` -> the
# node as ``current_node`` is stored, and in the queued, running and heartbeat indices each its own
# member ``<job_id>|<id>`` (the job's one other node is the member ``<job_id>``). Job ids hold no ``|``.
SUBJECT_NODE_FIELD = "node:"


def node_field(nid: str) -> str:
    """The meta field of a live subject node."""
    return SUBJECT_NODE_FIELD + nid


def node_member(job_id: str, nid: str | None) -> str:
    """A node's member in the queued, running and heartbeat indices (``nid`` None: the job's node)."""
    return job_id if nid is None else f"{job_id}|{nid}"


# While its subjects are cut, each subject's result also has a meta field of its own, ``result:<box_id>``
# -> the SubjectResult JSON, which wins over its entry in ``results`` (JobState.from_meta assembles the
# list), and ``subjects_live`` counts the live subject node fields: a subject node's start and report
# write only these (lua/subject_write.lua), never the whole list. A write of ``results`` folds them in.
SUBJECT_RESULT_FIELD = "result:"
SUBJECTS_LIVE_FIELD = "subjects_live"


def result_field(box_id: str) -> str:
    """The meta field of one subject's result while it is being cut."""
    return SUBJECT_RESULT_FIELD + box_id


def split_member(member: str) -> tuple[str, str | None]:
    """``(job_id, subject node id or None)`` of an index member."""
    job_id, _, nid = member.partition("|")
    return job_id, nid or None


def node_location(member: str) -> tuple[str, str]:
    """Where the node an index member names is stored: (the job's meta, its field)."""
    job_id, nid = split_member(member)
    return job(job_id).meta, node_field(nid) if nid else "current_node"


# Lanes (docs/protocol.md § Executors and the outbox): node commands wait in one stream per partition
# and lane, a lane per model deployment they call, so a backlog of one deployment's work (a catalogue's
# detections) never sits in front of another's (a reviewed job's segmentation): the dispatchers read each
# lane within its deployment's free slots. ``other``: the box validator and the control plane's own nodes
# (FINALIZE_RESULTS), short nodes a decision waits on; a node type not named here goes there too.
LANES = ("detect", "segment", "other")
_LANE_OF = {"DETECT_SUBJECTS": "detect", "PROCESS_APPROVED_BOX_LIST": "segment", "SEGMENT_SUBJECT": "segment"}


def lane_of(node_type: str) -> str:
    """The lane of a node type's commands."""
    return _LANE_OF.get(node_type, "other")


def lane_nodes(lane: str, node_types: Iterable[str]) -> list[str]:
    """Which of ``node_types`` go to ``lane``."""
    return [t for t in node_types if lane_of(t) == lane]


def outbox(p: int, lane: str = "detect") -> str:
    """STREAM of partition p's node commands of one lane, read by the dispatchers' group
    (``OUTBOX_GROUP``). The detect lane keeps the name of the one stream a partition had before lanes
    (``hitl:{pN}:outbox``): what an earlier version left there is still read and reclaimed as that
    lane's, but for the other lanes' commands no dispatcher took yet, which a dispatcher's start
    moves to their lanes (``Store.outbox_sort``); nothing is lost or run twice."""
    return f"{tag(p)}:outbox" if lane == "detect" else f"{tag(p)}:outbox:{lane}"


def command_outbox(job_id: str, node_type: str) -> str:
    """The stream a command of ``job_id`` for ``node_type`` is queued in (its partition's, its lane's)."""
    return outbox(partition_of(job_id), lane_of(node_type))


def partition_outboxes(p: int) -> list[str]:
    """Partition p's outbox streams, one per lane."""
    return [outbox(p, lane) for lane in LANES]


def lane_outboxes(lane: str) -> list[str]:
    """One lane's outbox streams, one per partition."""
    return [outbox(p, lane) for p in range(PARTITIONS)]


def archive_stream(p: int) -> str:
    """STREAM of partition p's archive commands (``job``, ``version``): finished jobs to copy into the
    archive, read by the archivers' own group (``ARCHIVE_GROUP``), apart from the node commands."""
    return f"{tag(p)}:archive"


def archive_waiting(p: int) -> str:
    """ZSET job_id -> when (ms) its copy was last queued or attempted: finished jobs waiting for their
    copy (cleared by ``archive_ack``); the archivers' sweep re-queues one whose command was lost."""
    return f"{tag(p)}:archive:waiting"


def archiver_lease(p: int) -> str:
    """STRING ``<owner>|<token>`` (with a TTL): the one archiver mirroring partition p's live jobs."""
    return f"{tag(p)}:archiver:lease"


def archiver_fence(p: int) -> str:
    """Counter of partition p's archiver leases (``lease.lua`` wants one; nothing is fenced by it)."""
    return f"{tag(p)}:archiver:fence"


def all_archive_streams() -> list[str]:
    return [archive_stream(p) for p in range(PARTITIONS)]


def webhooks(p: int) -> str:
    """STREAM of partition p's webhook deliveries to make (``job``, ``type``, ``event``, ...): written
    by the script that records the event, only while the stream exists (a deliverer created its
    group), read by the deliverers' group (``WEBHOOK_GROUP``)."""
    return f"{tag(p)}:webhooks"


def all_webhook_streams() -> list[str]:
    """Every stream of webhook deliveries: one per partition, then the policy's."""
    return [webhooks(p) for p in range(PARTITIONS)] + [POLICY_WEBHOOKS]


def watched(p: int) -> str:
    """ZSET job_id -> until when (ms) someone follows its events: every SSE server renews the jobs it
    streams (``statecore.watchers``), so a waiting pause nobody watches is seen whichever replica serves."""
    return f"{tag(p)}:watched"


STREAMS = f"{PREFIX}:metrics:streams"  # HASH: event server -> "<open streams>:<ms written>"


def waiting(p: int) -> str:
    """ZSET job_id -> pause created_at (ms): the review queue, oldest first."""
    return f"{tag(p)}:waiting"


def running(p: int) -> str:
    """ZSET job_id -> deadline (ms) of the job's running node: start + its type's maximum
    execution time. A queued node is not here: waiting in a queue never times out."""
    return f"{tag(p)}:running"


def queued(p: int) -> str:
    """ZSET job_id -> when (ms) the job's node command entered the outbox, until a dispatcher
    starts it: the backlog (admission control) and the oldest queued command's age."""
    return f"{tag(p)}:queued"


def heartbeats(p: int) -> str:
    """ZSET job_id -> the last heartbeat (ms) of the job's running node, renewed by the process
    doing the work; a lapsed one makes the inspector re-dispatch the node."""
    return f"{tag(p)}:heartbeats"


def inspector_lease(p: int) -> str:
    """STRING ``<owner>|<fencing token>`` (with a TTL): the one inspector acting on partition p."""
    return f"{tag(p)}:inspector:lease"


def inspector_fence(p: int) -> str:
    """Counter of partition p's inspector leases: each new holder gets the next fencing token."""
    return f"{tag(p)}:inspector:fence"


def jobs(p: int) -> str:
    """ZSET job_id -> created_at (ms): every job of the partition, for listing."""
    return f"{tag(p)}:jobs"


def expiring(p: int) -> str:
    """ZSET job_id -> when (ms) a finished job's records expire: drives pruning of ``jobs``."""
    return f"{tag(p)}:expiring"


def counts(p: int) -> str:
    """HASH of partition p's counters (statecore.counters; kept by ``apply_plan`` in _lib.lua):
    ``<STATUS>`` -> jobs stored in that status; cumulative totals (``submitted``, ``finished``,
    ``user_cancelled``, ``node_starts``, ``node_retries``, ``node_results``, ``writeback_failures``,
    ``dead_letters``); ``<kind>:<minute>`` -> coverage buckets of the jobs created in that minute."""
    return f"{tag(p)}:counts"


def finished(p: int) -> str:
    """HASH job_id -> final status of partition p's finished jobs, until pruning drops them from
    ``jobs`` (their meta is gone by then) and uncounts that status."""
    return f"{tag(p)}:finished"


def dead_letters(p: int) -> str:
    """HASH dead-letter id -> record JSON ``{id, job_id, kind, reason, at, payload}``: node reports
    and commands of partition p's jobs given up on after their retries (statecore.deadletters)."""
    return f"{tag(p)}:deadletters"


def events_channel_pattern(p: int) -> str:
    """PSUBSCRIBE pattern matching the wake-up channels of partition ``p``'s jobs."""
    return f"{tag(p)}:job:*:events"


def all_outboxes() -> list[str]:
    """Every outbox stream: each lane's, partition after partition."""
    return [s for lane in LANES for s in lane_outboxes(lane)]


@dataclass(frozen=True)
class JobKeys:
    job_id: str
    p: int
    meta: str  # HASH: status, version, box lists, active pause, current node, ...
    pauses: str  # HASH: pause_token -> pause JSON (history of consumed/cancelled pauses)
    events: str  # LIST of event JSON, id = position (1-based); also the PUBLISH channel of new ids
    idem: str  # HASH: intervention_id -> payload hash + "\n" + response bytes
    reports: str  # SET: node_instance_ids whose report was applied or ignored
    # ``<executor>:<node id>`` STRING (with a TTL): who runs that node now; asked before a re-dispatch
    executor: str
    # ``<writeback>:<node id>`` STRING (with a TTL, renewed): a result of that node waits in a write-back
    # spool for Redis to take it (serve_app/work/writeback.py); the inspector leaves the node alone meanwhile.
    writeback: str
    # HASH (with a TTL: --claim-ttl-s) reviewer, claimed_at, expires_at: the reviewer looking at the
    # waiting job (docs/protocol.md § Claims). Apart from ``meta``: a claim is not a change of the job.
    claim: str
    # LIST of the job's audit entries, oldest first: JSON arrays in statecore.audit.STORED order, a
    # hash chain (docs/protocol.md § Audit). Its head (hash, seq) is kept in ``meta``.
    audit: str
    # HASH (with a TTL, renewed by each note) ``flag`` -> {"by", "reason", "at"} and ``skip:<reviewer>``
    # -> until when (ms); LIST of comments {"by", "text", "at"}: notes.lua (docs/protocol.md § Flags,
    # skips and comments). Apart from ``meta``: a note is not a change of the job.
    notes: str
    comments: str

    @property
    def outbox(self) -> str:
        """The partition's detect lane (the scripts' KEYS[6]; a plan names each command's own lane)."""
        return outbox(self.p)

    @property
    def outboxes(self) -> list[str]:
        """Every lane's stream of the job's partition."""
        return partition_outboxes(self.p)

    def executor_of(self, nid: str) -> str:
        return f"{self.executor}:{nid}"

    def writeback_of(self, nid: str) -> str:
        return f"{self.writeback}:{nid}"

    @property
    def waiting(self) -> str:
        return waiting(self.p)

    @property
    def running(self) -> str:
        return running(self.p)

    @property
    def jobs(self) -> str:
        return jobs(self.p)

    @property
    def expiring(self) -> str:
        return expiring(self.p)

    @property
    def queued(self) -> str:
        return queued(self.p)

    @property
    def heartbeats(self) -> str:
        return heartbeats(self.p)

    @property
    def inspector_lease(self) -> str:
        return inspector_lease(self.p)

    @property
    def counts(self) -> str:
        return counts(self.p)

    @property
    def finished(self) -> str:
        return finished(self.p)

    @property
    def archive_stream(self) -> str:
        return archive_stream(self.p)

    @property
    def archive_waiting(self) -> str:
        return archive_waiting(self.p)

    @property
    def webhooks(self) -> str:
        return webhooks(self.p)

    def for_script(self) -> list[str]:
        """The KEYS every state-changing script receives, in this order."""
        return [
            self.meta,
            self.pauses,
            self.events,
            self.idem,
            self.reports,
            self.outbox,
            self.waiting,
            self.running,
            self.jobs,
            self.expiring,
            self.queued,
            self.heartbeats,
            self.inspector_lease,
            self.counts,
            self.finished,
            self.claim,
            self.audit,
            self.archive_stream,
            self.archive_waiting,
            self.webhooks,
        ]


def job(job_id: str) -> JobKeys:
    p = partition_of(job_id)
    base = f"{tag(p)}:job:{job_id}"
    return JobKeys(
        job_id=job_id,
        p=p,
        meta=f"{base}:meta",
        pauses=f"{base}:pauses",
        events=f"{base}:events",
        idem=f"{base}:idem",
        reports=f"{base}:reports",
        executor=f"{base}:executor",
        writeback=f"{base}:writeback",
        claim=f"{base}:claim",
        audit=f"{base}:audit",
        notes=f"{base}:notes",
        comments=f"{base}:comments",
    )
