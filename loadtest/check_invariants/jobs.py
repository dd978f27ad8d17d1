"""The checks of one job against itself: its log, its meta, its pause history, its outbox commands
(docs/protocol.md § Transitions, § Pause, § Executors and the outbox)."""

from __future__ import annotations

from collections import Counter, defaultdict

from hitl_review.statecore.states import TERMINAL, TRANSITIONS, WAITING, JobStatus

from .reading import Command, Job, Write, stream_id
from .report import Report

WORK_COMMAND = {
    "DETECTING": "DETECT_SUBJECTS",
    "VALIDATING_MANUAL_BOXES": "VALIDATE_MANUAL_BOX_LIST",
    "PROCESSING_APPROVED_SUBJECTS": "SEGMENT_SUBJECT",  # one node per subject (statecore.subjects)
    "FINALIZING_RESULTS": "FINALIZE_RESULTS",
}
# An answer's next_node_type names the stage (SPEC §4); the command queued for it.
STAGE_COMMAND = {"PROCESS_APPROVED_BOX_LIST": "SEGMENT_SUBJECT"}
TERMINAL_NAMES = {s.value for s in TERMINAL}
WAITING_NAMES = {s.value for s in WAITING}
AFTER_CANCEL_OK = {"JOB_FINISHED", "REPORT_IGNORED"}
# Events that record something at the job's current version without a new write: a late report,
# a claim taken over (docs/protocol.md § Claims).
VERSIONLESS = {"REPORT_IGNORED", "CLAIM_TAKEN_OVER", "QUORUM_VOTE"}
SLOW_COMMAND_S = 30.0


def writes_of(job: Job, rep: Report) -> list[Write]:
    """Group the log into atomic writes, checking ``version_monotonic`` on the way."""
    name = "version_monotonic"
    rep.checked(name)
    writes: list[Write] = []
    top = 0
    for ev in job.events:
        v = ev["version"]
        if v < top:
            rep.breach(name, job.job_id, f"event {ev['id']} {ev['type']} has version {v} after version {top}")
        top = max(top, v)
        if ev["type"] in VERSIONLESS:  # recorded at the job's version without changing it
            if writes and v != writes[-1].version:
                rep.breach(
                    name,
                    job.job_id,
                    f"{ev['type']} (event {ev['id']}) at v{v}, but the job was at v{writes[-1].version}",
                )
            continue
        if writes and v == writes[-1].version:
            if ev["at"] != writes[-1].at:
                rep.breach(name, job.job_id, f"two writes share version {v} ({writes[-1].at} and {ev['at']})")
            writes[-1].events.append(ev)
            continue
        want = writes[-1].version + 1 if writes else 1
        if not writes and ev["type"] == "JOB_RESTORED":
            want = v  # restored from the live mirror: the log before it is gone (docs/protocol.md § Reconcile)
        if v != want:
            rep.breach(name, job.job_id, f"event {ev['id']} {ev['type']} starts a write at v{v}, expected v{want}")
        writes.append(Write(v, ev["at"], [ev]))
    for w in writes:
        if w.types().count("STATUS_CHANGED") > 1:
            rep.breach(
                name, job.job_id, f"write v{w.version} holds {w.types().count('STATUS_CHANGED')} STATUS_CHANGED events"
            )
    return writes


def check_log_vs_meta(job: Job, writes: list[Write], cancelled: bool, rep: Report) -> None:
    """The meta's version and status are the last write's (cancelled jobs: ``cancel_final`` owns that)."""
    if cancelled or not writes:
        return
    meta_v = int(job.meta.get("version", -1))
    if meta_v != writes[-1].version:
        rep.breach(
            "version_monotonic", job.job_id, f"meta version {meta_v}, but the log's last write is v{writes[-1].version}"
        )


def check_status_chain(job: Job, writes: list[Write], cancelled: bool, rep: Report) -> None:
    name = "status_chain"
    rep.checked(name)
    cur: str | None = None
    if writes and writes[0].events[0]["type"] == "JOB_RESTORED":
        cur = writes[0].events[0]["data"].get("status")  # the status the job was restored in
    for w in writes:
        for ev in w.events:
            if ev["type"] != "STATUS_CHANGED":
                continue
            frm, to = ev["data"].get("from"), ev["data"].get("to")
            if frm != (cur or "CREATED"):
                rep.breach(
                    name, job.job_id, f"v{w.version}: STATUS_CHANGED from {frm}, but the job was in {cur or 'CREATED'}"
                )
            try:
                legal = JobStatus(to) in TRANSITIONS[JobStatus(frm)]
            except ValueError:
                legal = False
            if not legal:
                rep.breach(name, job.job_id, f"v{w.version}: illegal transition {frm} -> {to}")
            cur = to
    finished = [e for e in job.events if e["type"] == "JOB_FINISHED"]
    if len(finished) > 1:
        rep.breach(name, job.job_id, f"{len(finished)} JOB_FINISHED events")
    if cur in TERMINAL_NAMES and not finished:
        rep.breach(name, job.job_id, f"ended in {cur} without JOB_FINISHED")
    if finished and cur not in TERMINAL_NAMES:
        rep.breach(name, job.job_id, f"JOB_FINISHED, but the log's last status is {cur}")
    if not cancelled and cur is not None and job.meta.get("status") != cur:
        rep.breach(name, job.job_id, f"meta status {job.meta.get('status')}, but the log ends in {cur}")


def check_pauses(job: Job, rep: Report) -> set[str]:
    """``pause_consumed_once`` from the log and the pause history; returns the consumed tokens."""
    name = "pause_consumed_once"
    opened = Counter(
        e["data"].get("active_pause", {}).get("pause_token") for e in job.events if e["type"] == "PAUSE_OPENED"
    )
    accepted: dict[str, list[str]] = defaultdict(list)
    for e in job.events:
        if e["type"] == "INTERVENTION_ACCEPTED":
            accepted[e["data"].get("pause_token")].append(e["data"].get("intervention_id"))
    tokens = set(opened) | set(accepted) | set(job.pauses)
    rep.checked(name, len(tokens))
    # A job restored from the live mirror: its log starts at JOB_RESTORED, the pauses consumed before
    # are in its pause history without their INTERVENTION_ACCEPTED (gone with the rest of the log).
    restored_at = job.events[0]["at"] if job.events and job.events[0]["type"] == "JOB_RESTORED" else None
    for token in sorted(tokens, key=str):
        if opened[token] > 1:
            rep.breach(name, job.job_id, f"pause {token} opened {opened[token]} times")
        ivs = accepted.get(token, [])
        if len(ivs) > 1:
            rep.breach(name, job.job_id, f"pause {token} consumed {len(ivs)} times (by {', '.join(ivs)})")
        if ivs and not opened[token]:
            rep.breach(name, job.job_id, f"pause {token} consumed but never opened")
        hist = job.pauses.get(token)
        if ivs and (hist is None or hist.get("status") != "CONSUMED"):
            rep.breach(
                name,
                job.job_id,
                f"pause {token} accepted {ivs[0]}, but its history says {hist.get('status') if hist else 'nothing'}",
            )
        if hist and hist.get("status") == "CONSUMED":
            by = (hist.get("consumed_by") or {}).get("intervention_id")
            before_restore = restored_at is not None and (hist.get("consumed_at") or "") < restored_at
            if not ivs:
                if not before_restore:
                    rep.breach(name, job.job_id, f"pause {token} CONSUMED (by {by}) without INTERVENTION_ACCEPTED")
            elif by not in ivs:
                rep.breach(name, job.job_id, f"pause {token} consumed_by {by}, but the log accepted {ivs[0]}")
    active = job.j("active_pause")
    if active and active.get("pause_token") in accepted:
        rep.breach(name, job.job_id, f"consumed pause {active.get('pause_token')} is active again")
    return set(accepted)


def _started_after(job: Job, w: Write, node_type: str, nids: frozenset[str] | None) -> bool | None:
    """Did a node announced by write ``w`` run? True: the first node event after it is one of them;
    False: another node ran first; None: no node event followed."""
    for e in job.events:
        if e["version"] <= w.version or e["type"] not in ("NODE_STARTED", "NODE_COMPLETED"):
            continue
        d = e["data"]
        return d.get("node_type") == node_type and (nids is None or d.get("node_instance_id") in nids)
    return None


def _queued_without_move(w: Write) -> list[tuple[str, str]]:
    """The nodes a write queued without moving the job: retries (each NODE_RETRY_SCHEDULED names its
    node: a failed attempt's, or every subject node of a restored job); (node type, node id)."""
    return [
        (str(e["data"].get("node_type")), str(e["data"].get("node_instance_id")))
        for e in w.events
        if e["type"] == "NODE_RETRY_SCHEDULED"
    ]


def _announced_ids(ia: dict) -> frozenset[str] | None:
    """The node(s) an INTERVENTION_ACCEPTED names: one, or one per subject (statecore.subjects)."""
    d = ia["data"]
    ids = d.get("node_instance_ids") or ([d["node_instance_id"]] if d.get("node_instance_id") else [])
    return frozenset(ids) or None


def check_commands(job: Job, writes: list[Write], rep: Report) -> None:
    """``consumption_next_step`` and ``outbox_accounting``.

    A plan's events and its outbox command carry the same timestamp, so commands still in the
    outbox are matched to the write that made them. A command that is gone (dispatchers may delete
    what they acknowledged) must have left its trace: the next node to start after the write is the
    one it announced, or the job was cancelled before any node ran."""
    by_at: dict[str, list[Write]] = defaultdict(list)
    for w in writes:
        by_at[w.at].append(w)
    cmds_at: dict[str, list[Command]] = defaultdict(list)
    for c in job.commands:
        cmds_at[c.enqueued_at].append(c)
    for c in job.commands:
        rep.checked("outbox_accounting")
        if c.enqueued_at not in by_at:
            rep.breach(
                "outbox_accounting",
                job.job_id,
                f"command {c.node_type} {c.node_instance_id} (entry "
                f"{c.entry_id}) belongs to no state change of the job",
            )
    cancel_v = next((e["version"] for e in job.events if e["type"] == "JOB_CANCELLED"), None)
    for at, ws in by_at.items():
        expected: Counter[str] = Counter()
        # Types whose count the write's events do not tell (a validation's verdict fanning out one node
        # per approved subject): at least one.
        some: set[str] = set()
        announced: list[tuple[Write, str, frozenset[str] | None, str]] = []  # (write, node type, node ids, invariant)
        consumption = None
        for w in ws:
            ia = next((e for e in w.events if e["type"] == "INTERVENTION_ACCEPTED"), None)
            target = w.status_target()
            if ia is not None:
                consumption = (w, ia)
                nxt = ia["data"].get("next_node_type")
                if not any(c.node_type == nxt for c in cmds_at.get(at, [])):  # else nothing approved: the stage's own
                    nxt = STAGE_COMMAND.get(nxt, nxt)
                if nxt:
                    ids = _announced_ids(ia)
                    expected[nxt] += len(ids) if ids else 1
                    announced.append((w, nxt, ids, "consumption_next_step"))
                    if target and WORK_COMMAND.get(target) != nxt:
                        rep.breach(
                            "consumption_next_step",
                            job.job_id,
                            f"v{w.version}: next node {nxt}, but the status moved to {target}",
                        )
                elif target != "EMPTY_SELECTION" or "EMPTY_SELECTION_SUBMITTED" not in w.types():
                    rep.breach(
                        "consumption_next_step",
                        job.job_id,
                        f"v{w.version}: pause "
                        f"{ia['data'].get('pause_token')} consumed with no next node and no EMPTY_SELECTION",
                    )
            elif target in WORK_COMMAND:
                if WORK_COMMAND[target] == "SEGMENT_SUBJECT":
                    some.add("SEGMENT_SUBJECT")
                else:
                    expected[WORK_COMMAND[target]] += 1
                announced.append((w, WORK_COMMAND[target], None, "outbox_accounting"))
            elif target is None:
                for node_type, nid in _queued_without_move(w):  # retries
                    expected[node_type] += 1
                    announced.append((w, node_type, frozenset({nid}), "outbox_accounting"))
        if consumption is not None:
            rep.checked("consumption_next_step")
        elif expected or some:
            rep.checked("outbox_accounting")
        present = cmds_at.get(at, [])
        name = "consumption_next_step" if consumption is not None else "outbox_accounting"
        what = (
            f"pause {consumption[1]['data'].get('pause_token')} consumed at v{consumption[0].version}"
            if consumption
            else f"v{ws[0].version} entering {ws[0].status_target()}"
        )
        actual = Counter(c.node_type for c in present)
        if present:
            wrong_id = [
                c.node_instance_id
                for c in present
                for (_w, t, nids, _n) in announced
                if nids and c.node_type == t and c.node_instance_id not in nids
            ]
            counted = Counter({t: n for t, n in actual.items() if t not in some})
            if counted != expected or any(actual[t] < 1 for t in some) or wrong_id:
                rep.breach(
                    name,
                    job.job_id,
                    f"{what}: outbox holds {dict(actual)}, expected "
                    f"{dict(expected) or ('' if some else 'nothing')}"
                    + (f" and at least one {', '.join(sorted(some))}" if some else "")
                    + (f" (node {wrong_id[0]} is not the announced one)" if wrong_id else ""),
                )
            continue
        for w, node_type, nids, inv in announced:
            ran = _started_after(job, w, node_type, nids)
            if ran is True or (ran is None and cancel_v is not None and cancel_v > w.version):
                continue
            rep.breach(
                inv,
                job.job_id,
                f"{what}: its {node_type} command is not in the outbox and "
                + ("another node ran next" if ran is False else "never ran"),
            )


def check_cancel(job: Job, rep: Report) -> bool:
    """``cancel_final``; returns whether the job was cancelled (by its log or its meta)."""
    name = "cancel_final"
    cancels = [i for i, e in enumerate(job.events) if e["type"] == "JOB_CANCELLED"]
    meta_status = job.meta.get("status")
    if not cancels:
        if meta_status == "CANCELLED":
            rep.checked(name)
            rep.breach(name, job.job_id, "meta says CANCELLED, but the log has no JOB_CANCELLED")
            return True
        return False
    rep.checked(name)
    first = job.events[cancels[0]]
    cv = first["version"]
    if len(cancels) > 1:
        rep.breach(name, job.job_id, f"{len(cancels)} JOB_CANCELLED events")
    for e in job.events[cancels[0] + 1 :]:
        if e["type"] not in AFTER_CANCEL_OK or e["version"] != cv:
            rep.breach(name, job.job_id, f"{e['type']} at v{e['version']} after JOB_CANCELLED at v{cv}")
    if meta_status != "CANCELLED":
        rep.breach(name, job.job_id, f"meta status {meta_status} after JOB_CANCELLED")
    if int(job.meta.get("version", -1)) != cv:
        rep.breach(name, job.job_id, f"meta version {job.meta.get('version')} after JOB_CANCELLED at v{cv}")
    if job.meta.get("pause_token") or job.j("active_pause"):
        rep.breach(name, job.job_id, "a pause is active after JOB_CANCELLED")
    for c in job.commands:
        if c.enqueued_at > first["at"]:
            rep.breach(name, job.job_id, f"command {c.node_type} enqueued at {c.enqueued_at}, after the cancel")
    return True


def check_stuck(job: Job, rep: Report, quiet: bool, grace_s: float, now: float) -> None:
    """A live job must be waiting for a person (an active pause, in the review queue) or for a node:
    its current node's command (cutting subjects: a subject node's) still pending in the outbox. Once
    the system is quiet (nothing pending anywhere), a QUEUED or RUNNING node without its command will
    never run: stuck. Before that (the quiet wait timed out) such a node is only a warning. A command
    still pending after the grace period (the quiet wait) is stuck too: dispatchers have had it and
    did nothing with it."""
    name = "not_stuck"
    status = job.meta.get("status", "")
    if status in TERMINAL_NAMES or any(e["type"] == "JOB_FINISHED" for e in job.events):
        return  # ended (a meta/log disagreement is status_chain's or cancel_final's to report)
    rep.checked(name)
    pause = job.j("active_pause")
    if pause and pause.get("status") == "WAITING" and job.meta.get("pause_token") == pause.get("pause_token"):
        if status not in WAITING_NAMES:
            rep.breach(name, job.job_id, f"active pause while {status}")
        elif not job.in_waiting:
            rep.breach(name, job.job_id, f"waiting in {status}, but not in the review queue")
        return
    nodes = job.live_nodes()
    ids = {nid for nid, _ in nodes}
    mine = [c for c in job.commands if c.pending and c.node_instance_id in ids]
    if mine:
        age = now - stream_id(mine[0].entry_id)[0] / 1000
        if not quiet and age > grace_s:
            rep.breach(
                name,
                job.job_id,
                f"{status}: its {mine[0].node_type} command (entry {mine[0].entry_id}) is "
                f"still pending after {age:.0f}s, beyond the {grace_s:.0f}s grace period",
            )
        elif not quiet and age > SLOW_COMMAND_S:
            rep.warn(
                name,
                job.job_id,
                f"{status}: its {mine[0].node_type} command (entry {mine[0].entry_id}) has been pending for {age:.0f}s",
            )
        return
    node = nodes[0][1] if nodes else {}
    where = f"current node: {node.get('node_type')} {node.get('status')}" if node else "no current node"
    if any(n.get("status") in ("QUEUED", "RUNNING") for _, n in nodes):
        if quiet:
            rep.breach(
                name,
                job.job_id,
                f"live in {status}, {where}, but its command is no longer pending: nothing will run it",
            )
        else:
            rep.warn(name, job.job_id, f"{status}: {where} with no pending command (the system was not quiet)")
        return
    rep.breach(
        name, job.job_id, f"live in {status} with no active pause, no pending command and no running node ({where})"
    )


def check_job(job: Job, rep: Report, *, quiet: bool, grace_s: float, now: float) -> None:
    """Every per-job invariant; ``quiet``: nothing was pending anywhere when the jobs were read."""
    writes = writes_of(job, rep)
    cancelled = check_cancel(job, rep)
    check_log_vs_meta(job, writes, cancelled, rep)
    check_status_chain(job, writes, cancelled, rep)
    check_pauses(job, rep)
    check_commands(job, writes, rep)
    check_stuck(job, rep, quiet, grace_s, now)
