"""What the reviewer sees of a review quorum (docs/protocol.md § Quorum), in words: how many
reviewers the pause needs and who has submitted, what their own submission did, and, on a
reconciliation pause, every reviewer's list side by side. Pure functions of the snapshot and the
intervention's answer; the callbacks put them on the page."""

from __future__ import annotations

from typing import Any

from hitl_review.statecore.models import JobSnapshot

from .panel import Panel, short_snapshot


def quorum_line(snap: JobSnapshot | None) -> str:
    """One line under the stage: '' for a job reviewed by one reviewer."""
    if snap is None or snap.quorum is None:
        return ""
    pause = snap.active_pause
    if pause is not None and pause.reconciliation:
        names = ", ".join(sorted(pause.reconciliation))
        return f"**The reviewers disagreed** ({names}): your submission decides the boxes. Their lists are below."
    q = snap.quorum
    invited = q.invited or q.needed
    if q.policy == "any":
        return f"Any of the **{invited} invited reviewers** decides: the first submission moves the job on."
    done = [v.reviewer for v in q.votes]
    who = f" ({', '.join(done)})" if done else ""
    if q.policy == "majority":
        return (
            f"Needs **{q.needed} of {invited} reviewers** (a majority) whose boxes agree — "
            f"{len(done)} of {invited} submitted{who}."
        )
    return f"Needs **{q.needed} reviewers** whose boxes agree — {len(done)} of {q.needed} submitted{who}."


def vote_banner(answer: dict[str, Any]) -> str | None:
    """The banner after one's own submission to a quorum pause; None for a plain submission."""
    q = answer.get("quorum")
    if not q:
        return None
    if q["outcome"] == "VOTE_RECORDED":
        if q.get("policy") == "majority":
            return (
                f"Your boxes are recorded — {q['received']} of {q.get('invited')} reviewers. The job waits for "
                f"the others; it moves on once {q['needed']} agree."
            )
        return (
            f"Your boxes are recorded — {q['received']} of {q['needed']} reviewers. The job waits for "
            "the others; it moves on once their boxes agree with yours."
        )
    if q["outcome"] == "QUORUM_REACHED":
        return f"{len(q['reviewers'])} reviewers agreed ({', '.join(q['reviewers'])}): the job moves on."
    return (
        f"The {q['received']} reviewers' boxes disagree ({', '.join(q['reviewers'])}): the job is offered again "
        "with every list side by side, for one reviewer to decide."
    )


def _where(s: dict[str, Any]) -> str:
    x1, y1, x2, y2 = (round(float(v)) for v in s["bbox"])
    return f"[{x1}, {y1}, {x2}, {y2}]"


def reconciliation_md(snap: JobSnapshot | None) -> str:
    """Every reviewer's list side by side on a reconciliation pause: a row per box of the panel
    (tag #n, as the canvas shows it) and per box drawn by hand; '' on any other pause."""
    pause = snap.active_pause if snap is not None else None
    if snap is None or pause is None or not pause.reconciliation:
        return ""
    lists = pause.reconciliation
    names = sorted(lists)
    header = "| box | " + " | ".join(names) + " |\n|---|" + "---|" * len(names)
    rows = []
    for tag, b in enumerate(snap.box_list, start=1):
        cells = []
        for r in names:
            mine = next((s for s in lists[r] if (s.get("box_id") or s.get("candidate_id")) == b.box_id), None)
            if mine is None:
                cells.append("deleted")
            elif [round(float(v)) for v in mine["bbox"]] != [round(v) for v in b.bbox]:
                cells.append(f"moved to {_where(mine)}")
            else:
                cells.append("kept")
        rows.append(f"| #{tag} {b.label or ''} | " + " | ".join(cells) + " |")
    for r in names:
        for s in lists[r]:
            if not (s.get("box_id") or s.get("candidate_id")):
                drew = "drew " + _where(s) + (f" “{s['label']}”" if s.get("label") else "")
                cells = [drew if x == r else "" for x in names]
                rows.append("| drawn by hand | " + " | ".join(cells) + " |")
    return "\n".join([header, *rows])


def stage_markdown(panel: Panel | None, snap: JobSnapshot | None) -> str:
    """The stage block over the canvas: what to do, the pause's identity, and, for a quorum job, who
    has submitted and, on a reconciliation pause, the reviewers' lists."""
    if panel is None:
        return ""
    text = (
        f"### {panel.stage_text}\nround {panel.round} · `{panel.stage}` · pause `{panel.pause_token}`"
        f" · snapshot `{short_snapshot(panel.snapshot_id)}`"
    )
    line, lists = quorum_line(snap), reconciliation_md(snap)
    return "\n\n".join(part for part in (text, line, lists) if part)
