"""The Gradio reviewer app: a live queue of waiting jobs and the review panel.

It talks to the control plane only through ``client.HitlClient``. What each
panel shows is decided in ``ui.handlers`` (plain functions); this module wires
those to components. Per-reviewer data lives in one ``gr.State``
(``ReviewerState``), never in module globals. ``launch`` is left to
``ui.server`` and ``python -m ui``.
"""
from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd
from gradio_image_annotation import image_annotator
from PIL import Image

from client import ApiError, HitlClient
from statecore.models import Event, JobSnapshot

from . import handlers as h

QUEUE_REFRESH_S = 2.0
POLL_FALLBACK_S = 2.0
QUEUE_MAX_ROWS = 200

HELP = ("**Keys:** Enter = submit · Delete = remove the selected box · N = next job · "
        "C = draw a new box, D = select/move/resize boxes, Space = reset zoom (click the image first). "
        "A drawn box needs a name: type it under “Label” and press Enter.")

CSS = """
#annotator button[aria-label="Rotate counterclockwise"],
#annotator button[aria-label="Rotate clockwise"] { display: none !important; }
#stage-text h3 { margin: 0; }
#banner p { font-weight: 600; color: #b45309; }
#review-error p { font-weight: 600; color: #dc2626; }
"""

# Binds the keyboard to the buttons by elem_id. The annotator handles Delete/C/D/Space itself when it
# has focus (and stops them there); Delete pressed elsewhere is forwarded to it.
KEYS_JS = """
() => {
  if (window.__hitlReviewKeys) { return []; }
  window.__hitlReviewKeys = true;
  const style = document.createElement("style");
  style.textContent = %CSS%;
  document.head.appendChild(style);
  const shownButton = (id) => {
    const el = document.getElementById(id);
    if (!el) { return null; }
    const b = el.tagName === "BUTTON" ? el : el.querySelector("button");
    return b && !b.disabled && b.offsetParent !== null ? b : null;
  };
  document.addEventListener("keydown", (e) => {
    if (!e.isTrusted || e.defaultPrevented || e.ctrlKey || e.metaKey || e.altKey || e.repeat) { return; }
    const t = e.target;
    const tag = t && t.tagName ? t.tagName.toUpperCase() : "";
    if (["INPUT", "TEXTAREA", "SELECT", "BUTTON"].includes(tag) || (t && t.isContentEditable)) { return; }
    if (e.key === "Delete") {
      const box = document.querySelector("#annotator .annotator-container");
      if (box && t !== box) {
        e.preventDefault();
        box.focus();
        box.dispatchEvent(new KeyboardEvent("keydown", { key: "Delete", bubbles: true, cancelable: true }));
      }
      return;
    }
    let b = null;
    if (e.key === "Enter") { b = shownButton("submit-btn"); }
    else if (e.key === "n" || e.key === "N") { b = shownButton("next-job-btn"); }
    if (b) { e.preventDefault(); b.click(); }
  });
  return [];
}
"""

URL_JS = """
(job) => {
  const u = new URL(window.location.href);
  if (job) { u.searchParams.set("job", job); } else { u.searchParams.delete("job"); }
  window.history.replaceState(null, "", u.toString());
  return [];
}
"""

_EXT = {"PNG": ".png", "JPEG": ".jpg", "WEBP": ".webp"}


class _Clients:
    """One ``HitlClient`` per token: the reviewer's identity is their token."""

    def __init__(self, api_url: str) -> None:
        self.api_url = api_url
        self._by_token: dict[str | None, HitlClient] = {}
        self._lock = threading.Lock()

    def get(self, token: str | None) -> HitlClient:
        with self._lock:
            c = self._by_token.get(token)
            if c is None:
                c = self._by_token[token] = HitlClient(self.api_url, token)
            return c


class _EventPump:
    """Reads a job's SSE stream (the client's blocking iterator) on a daemon thread.

    Events are handed to the follower's event loop, so neither Gradio's worker
    pool nor the loop's executor is held while a panel waits for hours. The
    thread resumes after the last event it saw when the stream breaks; after a
    failure it reports ``BROKEN`` and the follower polls GET until it recovers.
    """

    END, BROKEN, IDLE = object(), object(), object()

    def __init__(self, client: HitlClient, job_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.client, self.job_id, self.loop = client, job_id, loop
        self.items: asyncio.Queue[Any] = asyncio.Queue()
        self.stop_flag = threading.Event()
        self.broken = False
        threading.Thread(target=self._run, name=f"hitl-ui-events-{job_id}", daemon=True).start()

    def _put(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the loop is gone: nobody is listening any more
            self.stop_flag.set()

    def _run(self) -> None:
        last: int | None = None
        failures = 0
        while not self.stop_flag.is_set():
            try:
                for ev in self.client.events(self.job_id, last_event_id=last):
                    if self.stop_flag.is_set():
                        return
                    last, failures, self.broken = ev.id, 0, False
                    self._put(ev)
                    if ev.type == "JOB_FINISHED":
                        self._put(self.END)
                        return
            except Exception:  # noqa: BLE001 - any failure of the stream falls back to polling
                failures += 1
                self.broken = True
                self._put(self.BROKEN)
            self.stop_flag.wait(min(30.0, 2.0 ** min(failures, 5)))

    async def next(self, timeout: float) -> Any:
        try:
            return await asyncio.wait_for(self.items.get(), timeout)
        except asyncio.TimeoutError:
            return self.IDLE

    def stop(self) -> None:
        self.stop_flag.set()


def _error_text(exc: Exception) -> str:
    if isinstance(exc, ApiError):
        if exc.status_code == 401:
            return "The control plane did not accept your token (401)."
        if exc.status_code == 403:
            return "Your token may not do this (403): a reviewer or admin token is needed."
        return f"{exc.message} ({exc.code})"
    return f"Could not reach the control plane: {exc}"


def build_app(api_url: str, token: str | None = None, *, require_login: bool = False) -> gr.Blocks:
    """The reviewer app for the control plane at ``api_url``.

    Without ``require_login`` every browser acts with ``token`` (the local
    token of ``hitl up``); with it, each reviewer signs in with their own API token.
    """
    clients = _Clients(api_url)
    work_dir = Path(tempfile.gettempdir()) / "hitl-ui"
    image_dir = work_dir / "images"
    results_dir = work_dir / "results"
    followers: dict[str, set[threading.Event]] = {}
    followers_lock = threading.Lock()

    def client_for(st: h.ReviewerState) -> HitlClient:
        return clients.get(st.token)

    def ensure_image(st: h.ReviewerState, c: HitlClient) -> str | None:
        """The job's image as a local file (content-addressed, downloaded once)."""
        snap = st.snapshot
        if snap is None:
            return None
        for ext in _EXT.values():
            p = image_dir / f"{snap.image.sha256}{ext}"
            if p.exists():
                st.image_path = str(p)
                return st.image_path
        data = c.download(snap.image.url)
        fmt = Image.open(io.BytesIO(data)).format or "PNG"
        image_dir.mkdir(parents=True, exist_ok=True)
        p = image_dir / f"{snap.image.sha256}{_EXT.get(fmt, '.png')}"
        st.image_path = h.write_atomic(p, data)
        return st.image_path

    def panel_image(st: h.ReviewerState, panel: h.Panel) -> str:
        """The job's image under a name that says which pause the annotator shows (a hard link)."""
        base = Path(st.image_path or "")
        p = image_dir / h.panel_image_name(panel, base.suffix)
        if not p.exists():
            tmp = p.with_name(f".{p.name}.{threading.get_ident()}.part")
            try:
                os.link(base, tmp)
            except OSError:
                shutil.copyfile(base, tmp)
            os.replace(tmp, p)
        return str(p)

    def load_results(st: h.ReviewerState, c: HitlClient) -> h.ResultsView:
        snap = st.snapshot
        assert snap is not None
        res = c.results(snap.job_id)
        image = Path(st.image_path).read_bytes() if st.image_path else None
        return h.results_view(res, c.download, image, results_dir / snap.job_id)

    # Gradio copies every image it serves into its cache; drop copies older than a day, hourly.
    with gr.Blocks(title="hitl-review · reviewer", analytics_enabled=False, delete_cache=(3600, 86400)) as demo:
        session = gr.State(h.ReviewerState(token=token, signed_in=not require_login))

        gr.Markdown("## hitl-review — reviewer")
        backend_md = gr.Markdown("", elem_id="backend-info")
        gr.Markdown(HELP, elem_id="help-line")

        with gr.Column(visible=require_login, elem_id="login-panel") as login_col:
            login_token = gr.Textbox(label="API token", type="password", elem_id="login-token",
                                     placeholder="the reviewer token you were given")
            login_btn = gr.Button("Sign in", variant="primary", elem_id="login-btn")
            login_msg = gr.Markdown("", elem_id="login-message")

        with gr.Row(visible=not require_login, elem_id="main-panel") as main_row:
            with gr.Column(scale=2, min_width=460):
                gr.Markdown("### Waiting for review")
                queue_table = gr.Dataframe(value=pd.DataFrame(columns=h.QUEUE_HEADERS), headers=h.QUEUE_HEADERS,
                                           interactive=False, wrap=True, elem_id="queue-table",
                                           column_widths=["38%", "34%", "18%", "10%"],
                                           label="Oldest first — click a row to open it")
                queue_note = gr.Markdown("", elem_id="queue-note")
                next_btn = gr.Button("Open next job (N)", elem_id="next-job-btn")
            with gr.Column(scale=3):
                job_md = gr.Markdown("No job open — pick one in the queue.", elem_id="job-id")
                status_md = gr.Markdown("", elem_id="job-status")
                stage_md = gr.Markdown("", elem_id="stage-text")
                banner_md = gr.Markdown("", elem_id="banner")
                with gr.Column(visible=False, elem_id="review-panel") as review_col:
                    annotator = image_annotator(
                        value=None, label="Boxes", show_label=False, elem_id="annotator",
                        image_type="filepath", sources=None, disable_edit_boxes=True, show_remove_button=True,
                        show_clear_button=False, show_download_button=False, show_share_button=False,
                        label_list=["new"], label_colors=[h.NEW_BOX_COLOR_HEX], box_min_size=8,
                        enable_keyboard_shortcuts=True)
                    with gr.Row(equal_height=True):
                        label_target = gr.Dropdown(choices=[], value=None, label="Box to label",
                                                   elem_id="label-target", scale=2)
                        label_text = gr.Textbox(label="Label", placeholder="e.g. sneaker — press Enter",
                                                elem_id="new-box-label", scale=3)
                        label_btn = gr.Button("Set label", elem_id="apply-label-btn", scale=1)
                    review_error = gr.Markdown("", elem_id="review-error")
                    notes_md = gr.Markdown("", elem_id="box-notes")
                    with gr.Row():
                        submit_btn = gr.Button("Submit (Enter)", variant="primary", elem_id="submit-btn")
                        cut_btn = gr.Button("Cut nothing", elem_id="cut-nothing-btn")
                    reapply_btn = gr.Button("Re-apply my edits", visible=False, elem_id="reapply-btn")
                    with gr.Row(visible=False, elem_id="confirm-cut-nothing") as cut_confirm:
                        gr.Markdown("**Cut nothing?** The job ends as EMPTY_SELECTION and no subject is cut out.")
                        cut_yes = gr.Button("Yes, cut nothing", variant="stop", elem_id="confirm-cut-nothing-btn")
                        cut_no = gr.Button("Back", elem_id="cut-nothing-back-btn")
                cancel_btn = gr.Button("Cancel job", variant="stop", visible=False, elem_id="cancel-job-btn")
                with gr.Row(visible=False, elem_id="confirm-cancel") as cancel_confirm:
                    gr.Markdown("**Cancel this job?** It stops for good; nothing more is cut out.")
                    cancel_yes = gr.Button("Yes, cancel the job", variant="stop", elem_id="confirm-cancel-btn")
                    cancel_no = gr.Button("Back", elem_id="cancel-back-btn")
                with gr.Column(visible=False, elem_id="results-panel") as results_col:
                    gr.Markdown("### Results")
                    results_md = gr.Markdown("", elem_id="results-summary")
                    results_gallery = gr.Gallery(label="Cut-outs (on a checkerboard)", elem_id="results-gallery",
                                                 columns=4, object_fit="contain", format="png", height="auto")
                    mask_gallery = gr.Gallery(label="Masks over the image", elem_id="mask-gallery",
                                              columns=4, object_fit="contain", format="png", height="auto")
                    results_files = gr.File(label="Downloads (cut-outs and masks, PNG)", file_count="multiple",
                                            interactive=False, elem_id="results-files")
        current_job = gr.Textbox(value="", visible="hidden", elem_id="current-job")
        timer = gr.Timer(QUEUE_REFRESH_S)

        panel_outputs = [job_md, status_md, stage_md, banner_md, review_col, annotator, notes_md, label_target,
                         label_text, review_error, reapply_btn, cut_confirm, cancel_btn, cancel_confirm,
                         results_col, results_md, results_gallery, mask_gallery, results_files, current_job]

        # ------------------------------------------------------------------ rendering

        def view(st: h.ReviewerState, *, redraw: bool = False, banner: str | None = None,
                 error: str | None = None, results: h.ResultsView | None = None) -> dict[Any, Any]:
            """Component updates for the reviewer's current state."""
            snap, panel = st.snapshot, st.panel
            terminal = h.is_terminal(snap)
            out: dict[Any, Any] = {
                job_md: f"**Job** `{st.job_id}`" if st.job_id else "No job open — pick one in the queue.",
                status_md: h.status_text(snap) if snap else "",
                stage_md: (f"### {panel.stage_text}\n"
                           f"round {panel.round} · `{panel.stage}` · pause `{panel.pause_token}`" if panel else ""),
                review_col: gr.update(visible=panel is not None),
                reapply_btn: gr.update(visible=st.offer is not None and panel is not None),
                cancel_btn: gr.update(visible=snap is not None and not terminal),
                current_job: st.job_id or "",
            }
            if redraw or panel is None:  # an open confirmation belongs to the view being replaced
                out[cut_confirm] = gr.update(visible=False)
            if redraw or terminal:
                out[cancel_confirm] = gr.update(visible=False)
            if banner is not None:
                out[banner_md] = banner
            if error is not None:
                out[review_error] = error
            if redraw and panel is not None and st.image_path:
                value = h.annotator_value(panel, panel_image(st, panel), relabels=st.relabels)
                out[annotator] = value
                out[notes_md] = h.box_notes(panel)
                out[label_target] = gr.update(choices=h.label_choices(panel, h.read_annotator(panel, value)),
                                              value=h.AUTO_TARGET)
                out[label_text] = ""
            if results is not None:
                out.update({results_col: gr.update(visible=True), results_md: results.summary,
                            results_gallery: results.cutouts, mask_gallery: results.overlays,
                            results_files: results.files or None})
            elif not terminal:
                out[results_col] = gr.update(visible=False)
            return out

        def refresh_view(st: h.ReviewerState, c: HitlClient, *, redraw: bool, banner: str | None = None,
                         error: str | None = None) -> dict[Any, Any]:
            """``view`` after fetching what it needs: the image for a panel, the results of an ended job."""
            results = None
            try:
                if st.panel is not None or h.is_terminal(st.snapshot):
                    ensure_image(st, c)
                if h.is_terminal(st.snapshot):
                    results = load_results(st, c)
            except Exception as exc:  # noqa: BLE001 - shown to the reviewer, the panel stays usable
                banner = ((banner + " ") if banner else "") + _error_text(exc)
            return view(st, redraw=redraw, banner=banner, error=error, results=results)

        # ------------------------------------------------------------------ queue

        def fetch_queue(st: h.ReviewerState) -> list:
            c = client_for(st)
            jobs, cursor = [], None
            while len(jobs) < QUEUE_MAX_ROWS:
                page = c.list_jobs(status="WAITING", limit=50, cursor=cursor)
                jobs.extend(page.jobs)
                cursor = page.next_cursor
                if not cursor:
                    break
            return jobs

        def queue_update(st: h.ReviewerState) -> dict[Any, Any]:
            try:
                jobs = fetch_queue(st)
            except Exception as exc:  # noqa: BLE001
                return {queue_note: "Queue unavailable — " + _error_text(exc)}
            rows = h.queue_rows(jobs)
            n = len(rows)
            note = f"{n} job{'s' if n != 1 else ''} waiting · updated {time.strftime('%H:%M:%S')}"
            return {queue_table: pd.DataFrame(rows, columns=h.QUEUE_HEADERS), queue_note: note}

        def on_tick(st: h.ReviewerState) -> dict[Any, Any]:
            if not st.signed_in:
                return {queue_note: gr.skip()}
            return queue_update(st)

        # ------------------------------------------------------------------ opening jobs

        def open_job(st: h.ReviewerState, job_id: str | None) -> dict[Any, Any]:
            job_id = (job_id or "").strip()
            if not job_id:
                return {banner_md: "No job id."}
            c = client_for(st)
            try:
                snap = c.get_job(job_id)
            except Exception as exc:  # noqa: BLE001
                return {banner_md: f"Could not open {job_id}: " + _error_text(exc)}
            st.open(snap)
            return refresh_view(st, c, redraw=True, banner="", error="")

        def on_queue_select(st: h.ReviewerState, evt: gr.SelectData) -> dict[Any, Any]:
            row = evt.row_value or []
            job_id = row[0] if row else (evt.value if isinstance(evt.index, (list, tuple)) and evt.index[1] == 0
                                         else None)
            if not job_id:
                return {banner_md: gr.skip()}
            return open_job(st, str(job_id))

        def on_next(st: h.ReviewerState) -> dict[Any, Any]:
            if not st.signed_in:
                return {banner_md: gr.skip()}
            try:
                jobs = fetch_queue(st)
            except Exception as exc:  # noqa: BLE001
                return {banner_md: _error_text(exc)}
            job_id = h.next_job_id(jobs, exclude=[st.job_id])
            if job_id is None:
                return {banner_md: "No other job is waiting for review."}
            return open_job(st, job_id)

        def on_load(st: h.ReviewerState, request: gr.Request) -> dict[Any, Any]:
            out: dict[Any, Any] = {}
            try:
                out[backend_md] = h.backends_text(clients.get(st.token).readyz())
            except Exception:  # noqa: BLE001 - readiness details are optional
                out[backend_md] = ""
            job = request.query_params.get("job") if request is not None else None
            if st.signed_in:
                out.update(queue_update(st))
                if job:
                    out.update(open_job(st, job))
            elif job:
                st.job_id = job  # opened after sign-in
            return out

        def on_login(st: h.ReviewerState, tok: str) -> dict[Any, Any]:
            tok = (tok or "").strip()
            if not tok:
                return {login_msg: "Paste your API token."}
            try:
                with HitlClient(api_url, tok) as probe:
                    probe.list_jobs(status="WAITING", limit=1)
            except Exception as exc:  # noqa: BLE001
                return {login_msg: _error_text(exc)}
            pending = st.job_id
            st.token, st.signed_in, st.job_id = tok, True, None
            out = {login_col: gr.update(visible=False), main_row: gr.update(visible=True), login_msg: "",
                   login_token: ""}
            out.update(queue_update(st))
            if pending:
                out.update(open_job(st, pending))
            return out

        # ------------------------------------------------------------------ following the open job

        async def follow(st: h.ReviewerState, request: gr.Request):
            """Live updates of the open job from its event stream (GET polling while the stream is down)."""
            with st.lock:
                job_id, gen = st.job_id, st.follow_gen
                if not job_id or st.snapshot is None or h.is_terminal(st.snapshot) or st.followed_gen == gen:
                    return
                st.followed_gen = gen
            c = client_for(st)
            pump = _EventPump(c, job_id, asyncio.get_running_loop())
            key = request.session_hash if request is not None else None
            if key:
                with followers_lock:
                    followers.setdefault(key, set()).add(pump.stop_flag)
            last_poll = time.monotonic()
            told = None  # (banner, re-apply offer) as this follower's last output showed them
            try:
                while st.job_id == job_id and st.follow_gen == gen and not pump.stop_flag.is_set():
                    item = await pump.next(timeout=1.0)
                    if isinstance(item, Event):
                        if item.version <= st.version:
                            continue  # history the snapshot already shows
                    elif item is _EventPump.END:
                        pump.broken = True  # the stream is over: poll until GET shows the end too
                    elif item is _EventPump.IDLE:
                        # The browser applies the outputs of concurrent events in no fixed order: a submit's
                        # answer (a 409 and its re-apply offer) can land before this follower's older output
                        # and be overwritten by it. Say the newest once more (no redraw of the canvas).
                        if told is not None and (st.notice, id(st.offer)) != told:
                            told = (st.notice, id(st.offer))
                            yield view(st, banner=st.notice)
                            continue
                        if not pump.broken or time.monotonic() - last_poll < POLL_FALLBACK_S:
                            continue
                    last_poll = time.monotonic()
                    try:
                        snap: JobSnapshot = await asyncio.to_thread(c.get_job, job_id)
                    except Exception:  # noqa: BLE001 - try again on the next event or tick
                        continue
                    if st.job_id != job_id or st.follow_gen != gen:
                        break
                    with st.lock:
                        change = st.apply_snapshot(snap)
                        telling = (st.notice, id(st.offer))
                    if not change.applied:
                        continue
                    told = telling
                    yield await asyncio.to_thread(refresh_view, st, c, redraw=change.redraw,
                                                  banner=change.banner, error="" if change.redraw else None)
                    if h.is_terminal(snap):
                        break
            finally:
                pump.stop()
                if key:
                    with followers_lock:
                        followers.get(key, set()).discard(pump.stop_flag)

        def on_unload(request: gr.Request) -> None:
            with followers_lock:
                for flag in followers.pop(request.session_hash, set()):
                    flag.set()

        # ------------------------------------------------------------------ editing

        def on_annotator_change(st: h.ReviewerState, value: Any, target: str | None) -> dict[Any, Any]:
            panel = st.panel_for(value)
            if panel is None or not value:
                return {notes_md: gr.skip()}
            drawn = h.read_annotator(panel, value)
            choices = h.label_choices(panel, drawn, st.relabels)
            keep = target if target in {v for _, v in choices} else h.AUTO_TARGET
            return {notes_md: h.box_notes(panel, drawn, st.relabels),
                    label_target: gr.update(choices=choices, value=keep)}

        def on_apply_label(st: h.ReviewerState, value: Any, target: str | None, text: str) -> dict[Any, Any]:
            with st.lock:
                panel = st.panel_for(value)
                image = panel_image(st, panel) if panel is not None and st.image_path else None
                new_value, relabels, err = h.apply_label(panel, value, st.relabels, target, text, image)
                if err:
                    return {review_error: err}
                st.relabels = relabels
            return {annotator: new_value, label_text: "", review_error: "",
                    label_target: gr.update(value=h.AUTO_TARGET)}

        def on_reapply(st: h.ReviewerState) -> dict[Any, Any]:
            with st.lock:
                if st.offer is None or st.panel is None or not st.image_path:
                    return {reapply_btn: gr.update(visible=False)}
                value, st.relabels = h.reapplied_value(st.panel, st.offer, panel_image(st, st.panel))
                st.offer = None
                st.notice = "Your edits were re-applied — check them, then submit."
            return {annotator: value, reapply_btn: gr.update(visible=False), review_error: "",
                    banner_md: st.notice}

        # ------------------------------------------------------------------ submitting

        def send(st: h.ReviewerState, value: Any, *, empty: bool) -> dict[Any, Any]:
            with st.lock:
                panel = st.panel_for(value)
                if panel is None or panel.pause_token in st.results:
                    # e.g. a second click after the first one's answer closed the panel: one result
                    return {review_error: "", banner_md: st.notice or "Nothing is waiting for review on this job."}
                if empty:
                    subjects, err, edits = [], None, None
                else:
                    subjects, err = h.subjects_from_annotator(panel, value, st.relabels)
                    edits = h.edits_between(panel, h.read_annotator(panel, value), st.relabels)
                if err:
                    return {review_error: err}
                iv = st.submission_id()
            c = client_for(st)
            try:
                res = c.intervene(panel.job_id, intervention_id=iv, pause_token=panel.pause_token,
                                  base_version=panel.base_version, subjects=subjects)
            except ApiError as exc:
                if exc.status_code == 409:
                    outcome = st.record_conflict(exc.code, exc.snapshot, edits, exc.message, submitted=panel)
                    return refresh_view(st, c, redraw=outcome.redraw, banner=outcome.banner, error="")
                return {review_error: f"The server refused the submission: {exc.message} ({exc.code})."}
            except Exception as exc:  # noqa: BLE001 - the same intervention id is kept for the retry
                return {review_error: _error_text(exc) + " Press Submit again: it resends the same submission "
                                                         "(same id), so it cannot count twice."}
            msg = st.record_success(panel.pause_token, res.status, res.version, res.next_node_type,
                                    len(res.diff.kept), len(res.diff.added), len(res.diff.deleted))
            return view(st, banner=msg + " Press N for the next job.", error="")

        def on_submit(st: h.ReviewerState, value: Any) -> dict[Any, Any]:
            return send(st, value, empty=False)

        def on_cut_nothing(st: h.ReviewerState, value: Any) -> dict[Any, Any]:
            return send(st, value, empty=True)

        def on_cancel(st: h.ReviewerState) -> dict[Any, Any]:
            if not st.job_id:
                return {banner_md: gr.skip()}  # a dict must name a component
            c = client_for(st)
            try:
                snap = c.cancel(st.job_id)
            except ApiError as exc:
                if exc.status_code == 409 and exc.snapshot:
                    st.apply_snapshot(JobSnapshot.model_validate(exc.snapshot))
                    return refresh_view(st, c, redraw=True, banner=h.conflict_banner(exc.code, message=exc.message))
                return {banner_md: _error_text(exc)}
            except Exception as exc:  # noqa: BLE001
                return {banner_md: _error_text(exc)}
            st.apply_snapshot(snap)
            return refresh_view(st, c, redraw=True, banner="The job was cancelled.")

        # ------------------------------------------------------------------ wiring

        def show(*comps: Any) -> Any:
            return lambda: {comp: gr.update(visible=v) for comp, v in comps}

        hidden = dict(show_progress="hidden")
        follow_args = dict(fn=follow, inputs=[session], outputs=panel_outputs, **hidden)

        demo.load(None, js=KEYS_JS.replace("%CSS%", json.dumps(CSS)))
        demo.load(on_load, inputs=[session],
                  outputs=panel_outputs + [queue_table, queue_note, backend_md], **hidden).then(**follow_args)
        demo.unload(on_unload)
        timer.tick(on_tick, inputs=[session], outputs=[queue_table, queue_note], **hidden)
        current_job.change(None, inputs=[current_job], js=URL_JS)

        queue_table.select(on_queue_select, inputs=[session], outputs=panel_outputs).then(**follow_args)
        next_btn.click(on_next, inputs=[session], outputs=panel_outputs).then(**follow_args)
        login_event = dict(fn=on_login, inputs=[session, login_token],
                           outputs=panel_outputs + [login_col, main_row, login_msg, login_token, queue_table,
                                                    queue_note])
        login_btn.click(**login_event).then(**follow_args)
        login_token.submit(**login_event).then(**follow_args)

        annotator.change(on_annotator_change, inputs=[session, annotator, label_target],
                         outputs=[notes_md, label_target], preprocess=False, **hidden)
        label_args = dict(fn=on_apply_label, inputs=[session, annotator, label_target, label_text],
                          outputs=[annotator, label_text, review_error, label_target], preprocess=False)
        label_btn.click(**label_args)
        label_text.submit(**label_args)
        reapply_btn.click(on_reapply, inputs=[session],
                          outputs=[annotator, reapply_btn, review_error, banner_md])

        # preprocess=False: the annotator's raw value (boxes in canvas units with their scale) is read by
        # ui.handlers without decoding the image on every click.
        submit_btn.click(on_submit, inputs=[session, annotator], outputs=panel_outputs, preprocess=False)
        cut_btn.click(show((cut_confirm, True)), outputs=[cut_confirm], queue=False)
        cut_no.click(show((cut_confirm, False)), outputs=[cut_confirm], queue=False)
        cut_yes.click(on_cut_nothing, inputs=[session, annotator], outputs=panel_outputs, preprocess=False)
        cancel_btn.click(show((cancel_confirm, True)), outputs=[cancel_confirm], queue=False)
        cancel_no.click(show((cancel_confirm, False)), outputs=[cancel_confirm], queue=False)
        cancel_yes.click(on_cancel, inputs=[session], outputs=panel_outputs)

    demo.queue(default_concurrency_limit=None)
    return demo
