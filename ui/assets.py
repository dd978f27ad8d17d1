"""What the browser gets besides the components: the help line, the stylesheet and two scripts.

``KEYS_JS`` runs once per page (``demo.load``): it adds ``CSS`` to the page
and binds the keyboard to the buttons by elem_id. ``URL_JS`` keeps ``?job=``
in the address bar in step with the open job, so a reload reopens it.
"""

from __future__ import annotations

import json

HELP = (
    "**Keys:** Enter = submit · Delete = remove the selected box · N = next job · "
    "C = draw a new box, D = select/move/resize boxes, Space = reset zoom (click the image first). "
    "A drawn box needs a name: type it under “Label” and press Enter."
)

CSS = """
#annotator button[aria-label="Rotate counterclockwise"],
#annotator button[aria-label="Rotate clockwise"] { display: none !important; }
#stage-text h3 { margin: 0; }
#banner p { font-weight: 600; color: #b45309; }
#review-error p { font-weight: 600; color: #dc2626; }
"""

# Binds the keyboard to the buttons by elem_id. The annotator handles Delete/C/D/Space itself when it
# has focus (and stops them there); Delete pressed elsewhere is forwarded to it.
_KEYS_JS = """
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

KEYS_JS = _KEYS_JS.replace("%CSS%", json.dumps(CSS))

URL_JS = """
(job) => {
  const u = new URL(window.location.href);
  if (job) { u.searchParams.set("job", job); } else { u.searchParams.delete("job"); }
  window.history.replaceState(null, "", u.toString());
  return [];
}
"""
