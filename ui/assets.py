"""What the browser gets besides the components: the help line, the stylesheet and two scripts.

``KEYS_JS`` runs once per page (``demo.load``): it adds ``CSS`` to the page
and binds the keyboard to the buttons by elem_id. ``URL_JS`` keeps ``?job=``
in the address bar in step with the open job, so a reload reopens it.
"""

from __future__ import annotations

import json

from .editor import DRAFT_PREFIX

HELP = (
    "**Keys:** Enter = submit · Delete = remove the selected box · N = next job · "
    "C = draw a new box, D = select/move/resize boxes, Space = reset zoom (click the image first) · "
    "1–9 = give the selected box that label · Ctrl+Z = undo, Ctrl+Shift+Z = redo · "
    "Tab / Shift+Tab on the image = next / previous box · arrows = nudge the selected box 1 px, "
    "Shift+arrows 10 px (on the image or the box list; click a row of the list to select its box). "
    "A drawn box needs a name: press its label's number, or type it under “Label” and press Enter. "
    "“Full size” (under the image) = the original at its own pixels with the boxes as drawn; Esc closes it. "
    "**Skip, flag, comment:** S = skip the job (it goes back to the queue; N passes it over for you for 10 min) · "
    "⚑ Flag asks a lead to look, with why (the job stays waiting; “Flagged only” lists them) · "
    "comments are shown to the next reviewer above the panel."
)

# Accessible names of the controls, by elem_id (label buttons get theirs from their text).
ARIA = {
    "next-job-btn": "Open the next waiting job (N)",
    "submit-btn": "Submit the boxes (Enter)",
    "cut-nothing-btn": "Cut nothing: end this job without cut-outs",
    "cancel-job-btn": "Cancel this job",
    "undo-btn": "Undo the last box edit (Ctrl+Z)",
    "redo-btn": "Redo the box edit (Ctrl+Shift+Z)",
    "reset-btn": "Reset to the model's boxes",
    "apply-label-btn": "Set the typed label on the chosen box",
    "reapply-btn": "Re-apply my edits",
    "confirm-cut-nothing-btn": "Yes, cut nothing",
    "cut-nothing-back-btn": "Back, keep reviewing",
    "confirm-cancel-btn": "Yes, cancel the job",
    "cancel-back-btn": "Back, keep the job",
    "login-btn": "Sign in",
    "takeover-btn": "Take this job over from the reviewer who has it",
    "skip-btn": "Skip this job: hand it back and open the next one (S)",
    "flag-btn": "Flag this job for a lead, with the reason typed",
    "unflag-btn": "Take the flag off this job",
    "comment-btn": "Add the comment typed, for the next reviewer",
    "zoom-btn": "Show the image at full size with the boxes as drawn",
    "zoom-close-btn": "Close the full-size image",
}

CSS = """
/* The full-size view (ui.zoom): the image at its natural size in a frame that scrolls. */
#zoom-image { overflow: auto; max-height: 80vh; }
#zoom-image .image-container, #zoom-image .image-frame, #zoom-image button { overflow: visible; height: auto;
  width: max-content; max-width: none; }
#zoom-image img { max-width: none !important; max-height: none !important; width: auto !important;
  height: auto !important; object-fit: none !important; }
#annotator button[aria-label="Rotate counterclockwise"],
#annotator button[aria-label="Rotate clockwise"] { display: none !important; }
#stage-text h3 { margin: 0; }
#banner p { font-weight: 600; color: #b45309; }
#review-error p { font-weight: 600; color: #dc2626; }
.dark #banner p { color: #fbbf24; }
.dark #review-error p { color: #f87171; }
:root { --hitl-focus: #1d4ed8; }
.dark { --hitl-focus: #93c5fd; }
button:focus-visible, input:focus-visible, textarea:focus-visible, select:focus-visible,
[tabindex]:focus-visible, a:focus-visible, #annotator .annotator-container:focus {
  outline: 3px solid var(--hitl-focus) !important; outline-offset: 2px !important;
  transition: none !important; /* Gradio fades buttons over 0.2 s: the ring must show at once */
}
#label-set button { min-width: 6em; flex: 0 0 auto; }
#queue-table img { max-height: 56px; }
.hitl-style { display: none !important; }  /* the blocks of the containers' style elements (ui.shown) */
"""

# Binds the keyboard to the buttons by elem_id. The annotator handles Delete/C/D/Space itself when it
# has focus (and stops them there); Delete pressed elsewhere is forwarded to it. Digits and Ctrl+Z
# work everywhere but in a text field (whose own undo they would steal).
#
# Which box is selected: gradio_image_annotation keeps it inside its canvas (each box object's
# ``isSelected``, set through ``setSelected``) and sends only coordinates and captions. An accessor
# for ``isSelected`` on Object.prototype, installed before any box exists, sees every such
# assignment and remembers the selected box; it stores the flag per object, so the canvas reads back
# exactly what it wrote. ``hitlPick(n)`` hands that box (its JSON: caption and corners) with label n
# to the app, which finds the box in the value it receives (ui.editing.selected_index).
_KEYS_JS = """
() => {
  if (window.__hitlReviewKeys) { return []; }
  window.__hitlReviewKeys = true;
  if (!Object.getOwnPropertyDescriptor(Object.prototype, "isSelected")) {
    const flags = new WeakMap();
    Object.defineProperty(Object.prototype, "isSelected", {
      configurable: true,
      enumerable: false,
      get() { return Object(this) === this ? flags.get(this) : undefined; },
      set(v) {
        if (Object(this) !== this) { return; }
        flags.set(this, v);
        if (typeof this.toJSON !== "function") { return; }
        if (v) { window.__hitlSelected = this; }
        else if (window.__hitlSelected === this) { window.__hitlSelected = null; }
      },
    });
  }
  window.hitlPick = (n) => {
    const box = window.__hitlSelected;
    window.__hitlPickN = (window.__hitlPickN || 0) + 1;
    return JSON.stringify({ label: n, box: box ? box.toJSON() : null, n: window.__hitlPickN });
  };
  const style = document.createElement("style");
  style.textContent = %CSS%;
  document.head.appendChild(style);
  const aria = %ARIA%;
  const name = () => {
    for (const [id, text] of Object.entries(aria)) {
      const el = document.getElementById(id);
      const b = el && (el.tagName === "BUTTON" ? el : el.querySelector("button"));
      if (b && b.getAttribute("aria-label") !== text) { b.setAttribute("aria-label", text); }
    }
    document.querySelectorAll(".label-btn").forEach((el) => {
      const b = el.tagName === "BUTTON" ? el : el.querySelector("button");
      const m = b && b.textContent.trim().match(/^(\\d) · (.+)$/);
      const what = m ? `${m[2]} (key ${m[1]})` : (b ? b.textContent.trim() : "");
      const text = `Give the selected box the label ${what}`;
      if (b && b.getAttribute("aria-label") !== text) { b.setAttribute("aria-label", text); }
    });
    const canvas = document.querySelector("#annotator .annotator-container");
    const cname = "Image with boxes: C draws a box, D selects and moves, Delete removes, "
      + "1 to 9 label the selected box, Tab selects the next box, arrows nudge it";
    if (canvas && canvas.getAttribute("aria-label") !== cname) {
      canvas.setAttribute("aria-label", cname);
      canvas.setAttribute("role", "application");
    }
  };
  name();
  new MutationObserver(name).observe(document.body, { childList: true, subtree: true });
  const shownButton = (id) => {
    const el = document.getElementById(id);
    if (!el) { return null; }
    const b = el.tagName === "BUTTON" ? el : el.querySelector("button");
    return b && !b.disabled && b.offsetParent !== null ? b : null;
  };
  document.addEventListener("keydown", (e) => {
    if (!e.isTrusted || e.defaultPrevented || e.altKey || e.repeat) { return; }
    const t = e.target;
    const tag = t && t.tagName ? t.tagName.toUpperCase() : "";
    const choice = tag === "INPUT" && ["checkbox", "radio"].includes((t.type || "").toLowerCase());
    const typing = (["INPUT", "TEXTAREA", "SELECT"].includes(tag) && !choice) || (t && t.isContentEditable);
    if ((e.ctrlKey || e.metaKey) && !typing && (e.key === "z" || e.key === "Z" || e.key === "y")) {
      const b = shownButton(e.shiftKey || e.key === "y" ? "redo-btn" : "undo-btn");
      e.preventDefault();
      if (b) { b.click(); }
      return;
    }
    if (e.ctrlKey || e.metaKey) { return; }
    if (!typing && /^[1-9]$/.test(e.key)) {
      const b = shownButton("label-btn-" + e.key);
      if (b) { e.preventDefault(); b.click(); }
      return;
    }
    if (typing) { return; }
    // The documented keys act on the review panel whatever button has focus (a clicked "Open next job"
    // keeps it, and Enter would press it again), except on a confirmation's own buttons, where Enter
    // confirms what is asked. Space still presses the focused button.
    if (tag === "BUTTON" && t.closest("#confirm-cut-nothing, #confirm-cancel")) { return; }
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
    else if (e.key === "s" || e.key === "S") { b = shownButton("skip-btn"); }
    else if (e.key === "Escape") { b = shownButton("zoom-close-btn"); }  // the full-size view (ui.zoom)
    if (b) { e.preventDefault(); b.click(); }
  });
  return [];
}
"""

KEYS_JS = _KEYS_JS.replace("%CSS%", json.dumps(CSS)).replace("%ARIA%", json.dumps(ARIA))

# ``draft_out`` changed: keep the review's unsent edits in localStorage, or forget them (ui.editor.draft_message).
# Drafts older than a week are dropped, so abandoned reviews do not pile up.
SAVE_DRAFT_JS = """
(msg) => {
  try {
    const m = msg ? JSON.parse(msg) : null;
    if (!m || !m.key) { return []; }
    if (m.draft) {
      const kept = { job_id: m.job_id, pause_token: m.pause_token, draft: m.draft, saved_at: Date.now() };
      localStorage.setItem(m.key, JSON.stringify(kept));
    } else {
      localStorage.removeItem(m.key);
    }
    const week = 7 * 86400 * 1000;
    for (let i = localStorage.length - 1; i >= 0; i--) {
      const k = localStorage.key(i);
      if (!k || !k.startsWith("%PREFIX%")) { continue; }
      const v = JSON.parse(localStorage.getItem(k) || "{}");
      if (!v.saved_at || Date.now() - v.saved_at > week) { localStorage.removeItem(k); }
    }
  } catch (err) { console.warn("hitl: could not keep the draft", err); }
  return [];
}
"""

# ``pause_key`` ("job|pause|n") changed: a review was drawn; hand the app its kept draft, if any, marked
# with the drawing's key (a draft found again after a redraw is a new value, so the app hears of it).
LOAD_DRAFT_JS = """
(key) => {
  const [job, pause] = (key || "").split("|");
  if (!job || !pause) { return ""; }
  try {
    const kept = localStorage.getItem("%PREFIX%" + job + ":" + pause);
    if (!kept) { return ""; }
    const body = JSON.parse(kept);
    body.drawn_as = key;
    return JSON.stringify(body);
  } catch (err) { return ""; }
}
"""


def pick_js(n: int) -> str:
    """A label button's click: the selected box and label ``n`` (1-based) for ``pick_in``."""
    return f"() => window.hitlPick ? window.hitlPick({int(n)}) : JSON.stringify({{label: {int(n)}, box: null}})"


URL_JS = """
(job) => {
  const u = new URL(window.location.href);
  if (job) { u.searchParams.set("job", job); } else { u.searchParams.delete("job"); }
  window.history.replaceState(null, "", u.toString());
  return [];
}
"""


SAVE_DRAFT_JS = SAVE_DRAFT_JS.replace("%PREFIX%", DRAFT_PREFIX)
LOAD_DRAFT_JS = LOAD_DRAFT_JS.replace("%PREFIX%", DRAFT_PREFIX)
