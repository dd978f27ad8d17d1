"""What the browser gets for the mask review (ui.mask_review_view): the keys line, the script that turns
clicks on the picture into points and binds the keys, and the one that reads a kept draft.

Keys act on the mask panel whatever button has focus, except in a text field (the reason keeps its
letters, and Enter there sets the reason): listened for on ``window`` in the capture phase, so they are
handled before the box editor's keys (``ui.assets.KEYS_JS``, which leaves a key another handler
took). N moves to the next subject while a mask review is open (it opens the next job otherwise).
Tab is left to the browser: it moves the focus through every control, as on the box editor.
"""

from __future__ import annotations

from .mask_review import DRAFT_PREFIX

MASK_HELP = (
    "**Keys:** A = accept the mask · R = reject (type why, then Enter) · F = refine: then click the "
    "image — a click marks the subject, Shift-click or right-click marks what is not the subject · "
    "Ctrl+Z = remove the last point · N / Shift+N = next / previous subject · Enter = submit the decisions."
)

MASK_JS = """
() => {
  if (window.__hitlMaskReview) { return []; }
  window.__hitlMaskReview = true;
  window.__hitlMaskClicks = [];
  const button = (id) => {
    const el = document.getElementById(id);
    return el ? (el.tagName === "BUTTON" ? el : el.querySelector("button")) : null;
  };
  const shown = (id) => {
    const b = button(id);
    return b && !b.disabled && b.offsetParent !== null ? b : null;
  };
  const panelShown = () => {
    const p = document.getElementById("mask-review-panel");
    return p !== null && p.offsetParent !== null;
  };
  // The clicked pixel of the picture, as Gradio's own select computes it (object-fit: scale-down).
  const pixel = (e) => {
    const box = e.target && e.target.closest ? e.target.closest("#mask-image") : null;
    const img = box ? box.querySelector("img") : null;
    if (!img || !img.naturalWidth || !e.target.closest("button, img")) { return null; }
    const r = img.getBoundingClientRect();
    const s = Math.min(r.width / img.naturalWidth, r.height / img.naturalHeight, 1);
    const x = (e.clientX - r.left - (r.width - img.naturalWidth * s) / 2) / s;
    const y = (e.clientY - r.top - (r.height - img.naturalHeight * s) / 2) / s;
    if (x < 0 || y < 0 || x >= img.naturalWidth || y >= img.naturalHeight) { return null; }
    let src = img.getAttribute("src") || "";
    try { src = decodeURIComponent(src); } catch (err) { /* keep it as it is */ }
    return { x: x, y: y, src: src };
  };
  const record = (e, positive) => {
    const p = pixel(e);
    if (!p) { return; }
    e.preventDefault();
    e.stopPropagation();
    p.positive = positive;
    window.__hitlMaskClicks.push(p);
    const b = button("mask-point-btn");
    if (b) { b.click(); }
  };
  document.addEventListener("click", (e) => { if (e.button === 0) { record(e, !e.shiftKey); } }, true);
  document.addEventListener("contextmenu", (e) => { record(e, false); }, true);
  window.hitlTakeMaskClicks = () => JSON.stringify(window.__hitlMaskClicks.splice(0));
  const named = () => {
    const img = document.querySelector("#mask-image img");
    const text = "The subject with its mask: in Refine, click to mark the subject, "
      + "Shift-click or right-click to mark what is not";
    if (img && img.getAttribute("alt") !== text) { img.setAttribute("alt", text); }
  };
  new MutationObserver(named).observe(document.body, { childList: true, subtree: true });
  window.addEventListener("keydown", (e) => {
    if (!e.isTrusted || e.defaultPrevented || e.altKey || e.repeat || !panelShown()) { return; }
    const t = e.target;
    const tag = t && t.tagName ? t.tagName.toUpperCase() : "";
    const choice = tag === "INPUT" && ["radio", "checkbox", "button"].includes((t.type || "").toLowerCase());
    if ((["INPUT", "TEXTAREA", "SELECT"].includes(tag) && !choice) || (t && t.isContentEditable)) { return; }
    if (tag === "BUTTON" && t.closest("#confirm-cancel")) { return; }
    let id = null;
    if ((e.ctrlKey || e.metaKey) && (e.key === "z" || e.key === "Z")) { id = "mask-undo-point-btn"; }
    else if (e.ctrlKey || e.metaKey) { return; }
    else if (e.key === "a" || e.key === "A") { id = "mask-accept-btn"; }
    else if (e.key === "r" || e.key === "R") { id = "mask-reject-btn"; }
    else if (e.key === "f" || e.key === "F") { id = "mask-refine-btn"; }
    else if (e.key === "n" || e.key === "N") { id = e.shiftKey ? "mask-prev-btn" : "mask-next-btn"; }
    else if (e.key === "Enter") { id = "mask-submit-btn"; }
    if (!id) { return; }
    e.preventDefault();
    const b = shown(id);
    if (b) { b.click(); }
    if (id === "mask-reject-btn") {
      const field = document.querySelector("#mask-reason input, #mask-reason textarea");
      if (field && !field.value.trim()) { field.focus(); }
    }
  }, true);
  return [];
}
"""

TAKE_CLICKS_JS = "() => window.hitlTakeMaskClicks ? window.hitlTakeMaskClicks() : '[]'"

# ``mask_pause_key`` ("job|pause|n") changed: a mask review was drawn; hand the app its kept draft, if any.
LOAD_MASK_DRAFT_JS = """
(key) => {
  const [job, pause] = (key || "").split("|");
  if (!job || !pause) { return ""; }
  try { return localStorage.getItem("%PREFIX%" + job + ":" + pause) || ""; } catch (err) { return ""; }
}
""".replace("%PREFIX%", DRAFT_PREFIX)
