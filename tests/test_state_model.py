"""A stateful model test (hypothesis) of the state core against a real redis-server.

Random interleavings of executor reports (current, duplicated, late, foreign),
interventions (fresh, replayed, by another reviewer, stale) and cancels over a
few jobs. After every operation the machine checks the outcome it predicted and
the version delta; after every step it checks the invariants on what Redis holds.

Why this module is long: it is one hypothesis state machine; its rules, the model's predictions
and the invariants read the same model state, and split across modules they would only be
harder to follow.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from hitl_review.statecore import counters, errors, keys
from hitl_review.statecore.ids import new_id
from hitl_review.statecore.models import ImageRef, InterventionRequest, NodeReport
from hitl_review.statecore.states import TERMINAL, WAITING, JobStatus
from hitl_review.statecore.store import Reply, Store, StoreConfig

from .helpers import THREE_BOXES

IMAGE = ImageRef(sha256="c" * 64, width=640, height=480, url="/api/v1/artifacts/img_model.png")
MAX_JOBS = 3
REDIS_URL: str | None = None
CONFLICTS = (
    errors.VersionConflict,
    errors.PauseNotActive,
    errors.PauseTokenMismatch,
    errors.JobCancelled,
    errors.IdempotencyConflict,
)


@dataclass
class JobModel:
    version: int = 1
    terminal: str | None = None  # once set, the status must never change again
    recorded: set[str] = field(default_factory=set)  # node ids in the job's reports set
    tokens: list[str] = field(default_factory=list)  # every pause token ever opened
    consumed: int = 0  # pauses consumed by an accepted intervention


@dataclass
class SentRequest:
    job_id: str
    req: InterventionRequest
    reviewer: str
    body: str | None  # the 200 body, or None when it was refused


class JobMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.store = Store.from_url(REDIS_URL, StoreConfig(retention_s=3600, node_timeout_s=60))
        self.run(self.store.r.flushdb())
        self.jobs: list[str] = []
        self.model: dict[str, JobModel] = {}
        self.reports: list[NodeReport] = []  # every final report ever sent
        self.requests: list[SentRequest] = []

    def teardown(self) -> None:
        self.run(self.store.close())
        self.loop.close()

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    # ------------------------------------------------------------------ helpers

    def pick(self, i: int, prefer=None) -> str:
        """Job number ``i``; with ``prefer``, among the jobs it accepts when there are any
        (so that steps are not spent mostly on jobs that cannot move)."""
        jobs = self.jobs
        if prefer is not None:
            jobs = [j for j in self.jobs if prefer(self.state(j))] or self.jobs
        return jobs[i % len(jobs)]

    async def _view(self, job_id: str) -> dict:
        jk = keys.job(job_id)
        return {
            "meta": await self.store.r.hgetall(jk.meta),
            "events": await self.store.r.llen(jk.events),
            "cmds": [c.node_instance_id for c in await self.store.outbox_commands(job_id)],
            "pauses": await self.store.r.hgetall(jk.pauses),
            "idem": await self.store.r.hgetall(jk.idem),
        }

    def view(self, job_id: str) -> dict:
        return self.run(self._view(job_id))

    def state(self, job_id: str):
        return self.run(self.store.get(job_id))

    @staticmethod
    def live_nodes(st_) -> list:
        """The nodes a job waits on: its live subject nodes while it cuts them side by side
        (statecore.subjects), else its current node."""
        subject = [n for n in st_.subject_nodes.values() if n.status in ("QUEUED", "RETRY_WAIT", "RUNNING")]
        if subject:
            return sorted(subject, key=lambda n: n.node_instance_id)
        return [st_.current_node] if st_.current_node is not None else []

    @staticmethod
    def fresh_nodes(before: dict, after: dict) -> list[str]:
        """The node ids a write created: a new current node, new subject nodes."""
        new = [k[len("node:") :] for k in after["meta"] if k.startswith("node:") and k not in before["meta"]]
        if after["meta"].get("node_id") != before["meta"].get("node_id"):
            new.append(after["meta"]["node_id"])
        return sorted(new)

    def expect_version(self, job_id: str, before: dict, changed: bool) -> dict:
        after = self.view(job_id)
        m = self.model[job_id]
        if changed:
            m.version += 1
        assert int(after["meta"]["version"]) == m.version == int(before["meta"]["version"]) + (1 if changed else 0)
        if not changed:
            assert after["meta"].get("status") == before["meta"].get("status")
            assert after["cmds"] == before["cmds"] and after["pauses"] == before["pauses"]
            assert after["idem"] == before["idem"]
        status = after["meta"]["status"]
        if m.terminal is not None:
            assert status == m.terminal, "terminal states are absorbing"
        elif JobStatus(status) in TERMINAL:
            m.terminal = status
        pause = after["meta"].get("pause_token")
        if pause and pause not in m.tokens:
            m.tokens.append(pause)
        return after

    # ------------------------------------------------------------------ rules: jobs and reports

    @initialize()
    def first_job(self) -> None:
        self.create_job()

    @precondition(lambda self: self.jobs)
    @rule(i=st.integers(0, MAX_JOBS - 1), flags=st.integers(1, 63))
    def advance(self, i: int, flags: int) -> None:
        """The common path, so that random runs get deep: a live job's next natural step
        (its running node succeeds, or the reviewer keeps some boxes and may draw one)."""
        job_id = self.pick(i, lambda s: s.status not in TERMINAL)
        if self.state(job_id).active_pause is not None:
            self._intervene_fresh(job_id, mask=flags, move=bool(flags & 8), add=(flags >> 4) % 3, reviewer="ann")
        else:
            self._report_current(job_id, flags=flags, outcome="SUCCEEDED")

    @precondition(lambda self: len(self.jobs) < MAX_JOBS)
    @rule()
    def create_job(self) -> None:
        reply = self.run(self.store.create_job("alice", IMAGE))
        assert reply.status_code == 202 and not reply.replayed
        self.jobs.append(reply.job_id)
        self.model[reply.job_id] = JobModel()
        st_ = self.state(reply.job_id)
        assert st_.status == JobStatus.DETECTING and st_.version == 1

    @precondition(lambda self: self.jobs)
    @rule(i=st.integers(0, MAX_JOBS - 1))
    def node_started(self, i: int) -> None:
        job_id = self.pick(i)
        before = self.view(job_id)
        st_ = self.state(job_id)
        nodes = self.live_nodes(st_)
        if not nodes:
            return
        node = nodes[i % len(nodes)]
        cmd = next(
            c for c in self.run(self.store.outbox_commands(job_id)) if c.node_instance_id == node.node_instance_id
        )
        result = self.run(self.store.node_started(cmd))
        ok = result == "OK"
        # Only a queued node starts; a running one is BUSY (never started twice), the rest moved on.
        should = (
            st_.status not in TERMINAL
            and node.node_instance_id not in self.model[job_id].recorded
            and node.status == "QUEUED"
        )
        assert ok == should, (result, node.status)
        if node.status == "RUNNING" and should is False and st_.status not in TERMINAL:
            assert result in ("BUSY", "DUPLICATE"), result
        after = self.expect_version(job_id, before, changed=ok)
        if ok:
            field = f"node:{node.node_instance_id}" if node.box_id else "current_node"
            assert json.loads(after["meta"][field])["attempt"] == node.attempt + 1
        else:
            assert after["events"] == before["events"], "a refused start records nothing"

    @precondition(lambda self: self.jobs)
    @rule(
        i=st.integers(0, MAX_JOBS - 1),
        flags=st.integers(0, 63),
        outcome=st.sampled_from(["SUCCEEDED"] * 10 + ["FAILED", "TIMED_OUT"]),
        any_job=st.booleans(),
    )
    def report_current_node(self, i: int, flags: int, outcome: str, any_job: bool) -> None:
        """The executor reports the job's current node (which may already be reported or dead)."""
        job_id = self.pick(
            i,
            None if any_job else (lambda s: any(n.status in ("QUEUED", "RUNNING") for n in self.live_nodes(s))),
        )
        self._report_current(job_id, flags, outcome)

    def _report_current(self, job_id: str, flags: int, outcome: str) -> None:
        st_ = self.state(job_id)
        nodes = self.live_nodes(st_)
        if not nodes:
            return
        node = nodes[(flags >> 1) % len(nodes)]
        output: dict = {}
        if node.node_type == "DETECT_SUBJECTS":
            output = {"boxes": [b for k, b in enumerate(THREE_BOXES) if (flags >> k) & 1]}
        elif node.node_type == "VALIDATE_MANUAL_BOX_LIST":
            cmd = next(
                c for c in self.run(self.store.outbox_commands(job_id)) if c.node_instance_id == node.node_instance_id
            )
            output = {
                "results": [
                    {"box_id": b["box_id"], "passed": bool((flags >> k) & 1), "score": 0.5, "reason": "model says so"}
                    for k, b in enumerate(cmd.input["items_to_validate"])
                ]
            }
        elif node.node_type == "SEGMENT_SUBJECT":  # one subject per node (statecore.subjects)
            cmd = next(
                c for c in self.run(self.store.outbox_commands(job_id)) if c.node_instance_id == node.node_instance_id
            )  # from its command: a cancelled job keeps no node input
            box_id = cmd.input["approved_box_list"][0]["box_id"]
            status = "SUCCEEDED" if flags & 1 else "FAILED"
            output = {"subjects": [{"box_id": box_id, "status": status, "mask": "m.png", "cutout": "c.png"}]}
        rep = NodeReport(
            node_instance_id=node.node_instance_id,
            node_type=node.node_type,
            job_id=job_id,
            outcome=outcome,
            output=output,
        )
        self._send_report(rep)

    @precondition(lambda self: self.jobs)
    @rule(
        kind=st.sampled_from(["replay", "replay", "superseded"]),
        k=st.integers(0, 10_000),
        i=st.integers(0, MAX_JOBS - 1),
        j=st.integers(0, MAX_JOBS - 1),
    )
    def stray_report(self, kind: str, k: int, i: int, j: int) -> None:
        if kind == "replay" and self.reports:
            self.replay_old_report(k)
        else:
            self.superseded_report(i, j)

    def replay_old_report(self, k: int) -> None:
        """A duplicated or late delivery of a report that was already sent once."""
        rep = self.reports[k % len(self.reports)]
        before = self.view(rep.job_id)
        assert self.run(self.store.apply_report(rep)) == "DUPLICATE"
        after = self.expect_version(rep.job_id, before, changed=False)
        assert after["events"] == before["events"]

    def superseded_report(self, i: int, j: int) -> None:
        """A report whose node instance is not (or no longer) this job's current node:
        another job's node, or an instance this job never ran."""
        job_id, other = self.pick(i), self.pick(j)
        node = self.state(other).current_node
        nid = node.node_instance_id if other != job_id and node else new_id("node")
        self._send_report(
            NodeReport(
                node_instance_id=nid,
                node_type="DETECT_SUBJECTS",
                job_id=job_id,
                outcome="SUCCEEDED",
                output={"boxes": THREE_BOXES},
            )
        )

    def _send_report(self, rep: NodeReport) -> None:
        job_id = rep.job_id
        m = self.model[job_id]
        before = self.view(job_id)
        meta = before["meta"]
        if rep.node_instance_id in m.recorded:
            expected = "DUPLICATE"
        elif meta["terminal"] == "1" or (
            meta.get("node_id") != rep.node_instance_id and f"node:{rep.node_instance_id}" not in meta
        ):
            expected = "IGNORED"
        else:
            expected = "OK"
        res = self.run(self.store.apply_report(rep))
        assert res == expected, (res, expected)
        after = self.expect_version(job_id, before, changed=res == "OK")
        if res == "IGNORED":
            assert after["events"] == before["events"] + 1
            last = self.run(self.store.events_after(job_id, before["events"]))
            assert [e.type for e in last] == ["REPORT_IGNORED"]
            assert last[0].data["node_instance_id"] == rep.node_instance_id
        if res == "DUPLICATE":
            assert after["events"] == before["events"]
        if res == "OK":
            new_cmds = after["cmds"][len(before["cmds"]) :]
            status = JobStatus(after["meta"]["status"])
            if status in TERMINAL or status in WAITING:
                assert new_cmds == []
            else:
                # a command for each node it queued: the next node, the next stage's subjects' nodes,
                # a retry; none while the job's other subjects' nodes still run
                assert sorted(new_cmds) == self.fresh_nodes(before, after), "one command per node queued"
        m.recorded.add(rep.node_instance_id)
        self.reports.append(rep)

    # ------------------------------------------------------------------ rules: interventions and cancel

    @precondition(lambda self: self.jobs)
    @rule(
        i=st.integers(0, MAX_JOBS - 1),
        mask=st.integers(0, 63),
        move=st.booleans(),
        add=st.integers(0, 2),
        reviewer=st.sampled_from(["ann", "bob"]),
        any_job=st.booleans(),
    )
    def intervene_fresh(self, i: int, mask: int, move: bool, add: int, reviewer: str, any_job: bool) -> None:
        job_id = self.pick(i, None if any_job else (lambda s: s.active_pause is not None))
        self._intervene_fresh(job_id, mask, move, add, reviewer)

    def _intervene_fresh(self, job_id: str, mask: int, move: bool, add: int, reviewer: str) -> None:
        st_ = self.state(job_id)
        subjects = []
        for k, b in enumerate(st_.box_list):
            if (mask >> k) & 1:
                bbox = list(b.bbox)
                if move and not subjects:
                    bbox = [bbox[0], bbox[1], bbox[2] - 0.5, bbox[3]]
                subjects.append({"box_id": b.box_id, "bbox": bbox})
        subjects += [{"bbox": [20 + 50 * n, 400, 60 + 50 * n, 470], "label": f"drawn{n}"} for n in range(add)]
        pause = st_.active_pause
        req = InterventionRequest(
            intervention_id=new_id("iv"),
            pause_token=pause.pause_token if pause else "pause_x",
            base_version=st_.version,
            subjects=subjects,
        )
        if st_.status == JobStatus.CANCELLED:
            expected: type | None = errors.JobCancelled
        elif pause is None:
            expected = errors.PauseNotActive
        else:
            expected = None
        self._send_intervention(job_id, req, reviewer, expected)

    @precondition(lambda self: self.jobs)
    @rule(
        kind=st.sampled_from(
            [
                "replay",
                "replay_other_reviewer",
                "old_version",
                "future_version",
                "old_token",
                "bogus_token",
                "unknown_box",
            ]
        ),
        k=st.integers(0, 10_000),
        i=st.integers(0, MAX_JOBS - 1),
    )
    def stale_intervention(self, kind: str, k: int, i: int) -> None:
        """A replayed submission (by its reviewer or another), or one made from an out-of-date view."""
        if kind.startswith("replay") and self.requests:
            self.intervene_replay(k, same_reviewer=kind == "replay")
        elif not kind.startswith("replay"):
            self.intervene_stale(i, kind)

    def intervene_replay(self, k: int, same_reviewer: bool) -> None:
        sent = self.requests[k % len(self.requests)]
        reviewer = sent.reviewer if same_reviewer else sent.reviewer + "-other"
        before = self.view(sent.job_id)
        try:
            reply = self.run(self.store.intervene(sent.job_id, sent.req, reviewer))
        except CONFLICTS as e:
            assert sent.body is None or (not same_reviewer and isinstance(e, errors.IdempotencyConflict))
            assert e.snapshot["version"] == self.model[sent.job_id].version
        except errors.InvalidRequest:
            assert sent.body is None, "a refused request stays refused; it never succeeds later"
        else:
            assert sent.body is not None and same_reviewer
            assert reply.replayed and reply.body == sent.body
        after = self.expect_version(sent.job_id, before, changed=False)
        assert after["events"] == before["events"]

    def intervene_stale(self, i: int, kind: str) -> None:
        job_id = self.pick(i)
        st_ = self.state(job_id)
        m = self.model[job_id]
        token = st_.active_pause.pause_token if st_.active_pause else (m.tokens[-1] if m.tokens else "pause_x")
        version = st_.version
        subjects: list = []
        if kind == "old_version":
            version -= 1
        elif kind == "future_version":
            version += 1
        elif kind == "old_token":
            token = m.tokens[0] if len(m.tokens) > 1 else "pause_gone"
        elif kind == "bogus_token":
            token = new_id("pause")
        else:
            subjects = [{"box_id": "box_not_in_list", "bbox": [1, 1, 2, 2]}]
        req = InterventionRequest(
            intervention_id=new_id("iv"), pause_token=token, base_version=version, subjects=subjects
        )
        # docs/protocol.md § Intervention order: cancelled, version, pause active, token, box ids (400).
        if st_.status == JobStatus.CANCELLED:
            expected: type | None = errors.JobCancelled
        elif version != st_.version:
            expected = errors.VersionConflict
        elif st_.active_pause is None:
            expected = errors.PauseNotActive
        elif token != st_.active_pause.pause_token:
            expected = errors.PauseTokenMismatch
        else:
            expected = errors.InvalidRequest
        assert expected is not None
        self._send_intervention(job_id, req, "ann", expected)

    def _send_intervention(self, job_id: str, req: InterventionRequest, reviewer: str, expected: type | None) -> None:
        before = self.view(job_id)
        try:
            reply: Reply | None = self.run(self.store.intervene(job_id, req, reviewer))
            err = None
        except errors.HitlError as e:
            reply, err = None, e
        if expected is None:
            assert reply is not None and not reply.replayed, err
            m = self.model[job_id]
            m.consumed += 1
            after = self.expect_version(job_id, before, changed=True)
            body = json.loads(reply.body)
            new_cmds = after["cmds"][len(before["cmds"]) :]
            if body["next_node_type"] is None:
                assert after["meta"]["status"] == "EMPTY_SELECTION" and new_cmds == []
            else:
                fresh = self.fresh_nodes(before, after)
                assert fresh and sorted(new_cmds) == fresh, "a consumed pause makes one command per node it queued"
            consumed = json.loads(after["pauses"][req.pause_token])
            assert consumed["status"] == "CONSUMED"
            assert consumed["consumed_by"] == {"intervention_id": req.intervention_id, "reviewer": reviewer}
            self.requests.append(SentRequest(job_id, req, reviewer, reply.body))
        else:
            assert isinstance(err, expected), (err, expected)
            if isinstance(err, errors.Conflict):
                assert err.snapshot["version"] == self.model[job_id].version
            after = self.expect_version(job_id, before, changed=False)
            assert after["events"] == before["events"]
            self.requests.append(SentRequest(job_id, req, reviewer, None))

    @precondition(lambda self: self.jobs)
    @rule(i=st.integers(0, MAX_JOBS - 1), coin=st.integers(0, 3))
    def cancel(self, i: int, coin: int) -> None:
        if coin:  # cancels are rarer than the other moves, or most jobs would end cancelled
            return
        job_id = self.pick(i)
        before = self.view(job_id)
        status = before["meta"]["status"]
        try:
            snap = self.run(self.store.cancel(job_id, "admin"))
        except errors.JobTerminal as e:
            assert status in TERMINAL and status != "CANCELLED"
            assert e.snapshot["status"] == status
            self.expect_version(job_id, before, changed=False)
            return
        assert snap.status == JobStatus.CANCELLED and snap.active_pause is None
        changed = status != "CANCELLED"
        after = self.expect_version(job_id, before, changed=changed)
        if before["meta"].get("pause_token"):
            assert json.loads(after["pauses"][before["meta"]["pause_token"]])["status"] == "CANCELLED"

    # ------------------------------------------------------------------ invariants

    @invariant()
    def redis_holds_a_consistent_world(self) -> None:
        for job_id in self.jobs:
            self.run(self._check_job(job_id))

    @invariant()
    def counters_equal_a_recount(self) -> None:
        """What /metrics reads (counters the scripts keep) equals a walk over every stored job."""
        now_ms = int(time.time() * 1000)
        snap = self.run(counters.read(self.store.r, now_ms=now_ms))
        assert (snap.by_status, snap.coverage) == self.run(counters.recount(self.store.r, now_ms=now_ms))
        assert snap.totals["submitted"] == len(self.jobs)
        assert snap.totals["finished"] == sum(1 for m in self.model.values() if m.terminal is not None)

    async def _check_job(self, job_id: str) -> None:
        store, m = self.store, self.model[job_id]
        jk = keys.job(job_id)
        st_ = await store.get(job_id)
        assert st_.version == m.version, "version moved without a committed change (or missed one)"
        if m.terminal is not None:
            assert st_.status == m.terminal
        hist = await store.pause_history(job_id)
        assert all(p.status in ("CONSUMED", "CANCELLED") for p in hist)
        assert len({p.pause_token for p in hist}) == len(hist)
        in_waiting_index = await store.r.zscore(jk.waiting, job_id) is not None
        in_running_index = await store.r.zscore(jk.running, job_id) is not None
        in_queued_index = await store.r.zscore(jk.queued, job_id) is not None
        beating = await store.r.zscore(jk.heartbeats, job_id) is not None
        meta = await store.r.hgetall(jk.meta)
        terminal = st_.status in TERMINAL
        assert (meta["terminal"] == "1") == terminal
        # At most one WAITING pause, and it is the active one.
        if st_.active_pause is not None:
            p = st_.active_pause
            assert p.status == "WAITING" and st_.status in WAITING and p.stage == st_.status.value
            assert meta["pause_token"] == p.pause_token and p.pause_token not in {h.pause_token for h in hist}
            # Nothing moves a waiting job's version: the pause's base_version stays submittable.
            assert p.base_version == st_.version and in_waiting_index
        else:
            assert st_.status not in WAITING and meta["pause_token"] == "" and not in_waiting_index
        assert len(hist) + (1 if st_.active_pause else 0) == len(m.tokens)
        cmds = await store.outbox_commands(job_id)
        reported = await store.r.smembers(jk.reports)
        assert reported == m.recorded
        if terminal:
            assert not in_running_index and not in_queued_index and not beating
            for key in (jk.meta, jk.pauses, jk.events, jk.idem, jk.reports):
                assert await store.r.ttl(key) in (-2, *range(1, store.config.retention_s + 1)), key
        elif st_.active_pause is None:
            # Not waiting for a person, so some node must be queued or running, with its command in the outbox.
            nodes = self.live_nodes(st_)
            assert nodes
            for node in nodes:
                # Queued: in the queued index, no deadline yet; running: a deadline and a heartbeat.
                assert node.status in ("QUEUED", "RUNNING")
                assert node.node_instance_id in {c.node_instance_id for c in cmds}
                assert node.node_instance_id not in reported
                member = keys.node_member(job_id, node.node_instance_id if node.box_id else None)
                queued_ = await store.r.zscore(jk.queued, member) is not None
                running_ = await store.r.zscore(jk.running, member) is not None
                beating_ = await store.r.zscore(jk.heartbeats, member) is not None
                if node.status == "QUEUED":
                    assert queued_ and not running_ and not beating_
                else:
                    assert running_ and beating_ and not queued_
            if nodes[0].box_id:  # cutting subjects: the job's own member is in no index
                assert not in_running_index and not in_queued_index and not beating
        else:
            assert not in_running_index and not in_queued_index and not beating
        subject_members = [
            m
            for key in (jk.queued, jk.running, jk.heartbeats)
            for m in await store.r.zrange(key, 0, -1)
            if m.startswith(job_id + "|")
        ]
        live_subject = {n.node_instance_id for n in st_.subject_nodes.values() if n.status in ("QUEUED", "RUNNING")}
        assert {keys.split_member(m)[1] for m in subject_members} <= live_subject
        if terminal:
            assert subject_members == []
        if not terminal:
            for key in (jk.meta, jk.pauses, jk.events, jk.idem, jk.reports):
                assert await store.r.ttl(key) in (-2, -1), key
        # Every consumed pause: one accepted intervention, one command or EMPTY_SELECTION.
        events = await store.events_after(job_id)
        assert [e.id for e in events] == list(range(1, len(events) + 1))
        assert [e.version for e in events] == sorted(e.version for e in events)
        assert events[-1].version == st_.version
        accepted = [e for e in events if e.type == "INTERVENTION_ACCEPTED"]
        consumed = [h for h in hist if h.status == "CONSUMED"]
        assert len(consumed) == len(accepted) == m.consumed == await store.r.hlen(jk.idem)
        assert sorted(e.data["pause_token"] for e in accepted) == sorted(h.pause_token for h in consumed)
        for e in accepted:
            same_commit = [x for x in events if x.version == e.version]
            if e.data["next_node_type"] is None:
                assert "EMPTY_SELECTION_SUBMITTED" in {x.type for x in same_commit}
        moved_to = [e.data["to"] for e in events if e.type == "STATUS_CHANGED"]
        by_type = {
            t: sum(1 for c in cmds if c.node_type == t)
            for t in ("DETECT_SUBJECTS", "VALIDATE_MANUAL_BOX_LIST", "SEGMENT_SUBJECT", "FINALIZE_RESULTS")
        }
        assert len(cmds) == sum(by_type.values())
        # One SEGMENT_SUBJECT per subject, side by side: each one queued has either ended (reported) or
        # is one of the job's subject nodes (cancelled with the job, or live); every entry into
        # PROCESSING queued at least one.
        segment_ended = sum(
            1 for e in events if e.type == "NODE_COMPLETED" and e.data["node_type"] == "SEGMENT_SUBJECT"
        )
        assert by_type["SEGMENT_SUBJECT"] == segment_ended + len(st_.subject_nodes)
        assert by_type["SEGMENT_SUBJECT"] >= moved_to.count("PROCESSING_APPROVED_SUBJECTS")
        segmented = {e.data["box_id"] for e in events if e.type == "SUBJECT_SEGMENTED"}
        assert segmented <= {b.box_id for b in st_.approved_box_list}
        assert by_type | {"SEGMENT_SUBJECT": 0} == {
            "DETECT_SUBJECTS": 1,
            "VALIDATE_MANUAL_BOX_LIST": moved_to.count("VALIDATING_MANUAL_BOXES"),
            "SEGMENT_SUBJECT": 0,
            "FINALIZE_RESULTS": moved_to.count("FINALIZING_RESULTS"),
        }
        assert sum(1 for e in events if e.type == "JOB_FINISHED") == (1 if terminal else 0)


def test_state_machine(redis_server):
    global REDIS_URL
    REDIS_URL = redis_server.url
    run_state_machine_as_test(
        JobMachine,
        settings=settings(
            max_examples=30,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
