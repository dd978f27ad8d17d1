"""The box list's scripts: what a row click, Tab, the arrow keys, Hide and Lock do to the canvas.

``BOX_LIST_JS`` runs once per page (``demo.load``). ``gradio_image_annotation`` keeps its boxes as
instances of one class inside its canvas and exposes no API to select, hide or lock one, so:

- **Which boxes are on the canvas, in order**: the script wraps the class' ``render`` (found through
  an accessor for ``creatingAnchorX``, a field only that class' constructor sets, installed on
  ``Object.prototype`` the same way ``ui.assets.KEYS_JS`` watches ``isSelected``). The canvas draws
  every box on each redraw, last first, so one redraw gives the current list.
- **Hidden** boxes are not drawn and not hit by the pointer (``render``, ``isPointInsideBox`` and
  ``indexOfPointInsideHandle`` skip them); they stay in the value, so they are submitted as kept.
- **Locked** boxes have no resize handles and ``startDrag``/``startResize`` do nothing for them;
  Delete and the Remove button are refused while one is selected. They can still be selected and
  relabelled.
- **Low-score** boxes are drawn with a dashed outline and a fainter fill (the component draws every
  box with a solid line in its colour; there is no per-box style to set from the server).
- **Selecting** a box (a row click, Tab): the canvas selects on a pointer press in its drag mode, so
  the script presses its "Drag boxes" button and sends a pointer press and release at a point of
  that box no box before it (nor any resize handle) covers. The canvas then selects it exactly as
  for a click, including the index its Delete and Remove act on.
- **Nudging** (arrows, Shift = 10 px): the selected box is shifted in its own units (image pixels
  times its ``scaleFactor``), kept inside the image, and the canvas is made to report its value as
  after a drag (a pointer release). The app reads it like any edit: recorded for undo, the browser's
  draft updated (``ui.editing``), and read back in whole image pixels (``ui.box_geometry``).

Tab and Shift+Tab act while the image has the keyboard focus; past the last (first) box Tab leaves
the image as usual, so the keyboard is never trapped. The arrows act on the image and in the list,
never in a text field.
"""

from __future__ import annotations

import json

BOX_LIST_CSS = """
#box-list .hitl-box-list { font-size: 0.9em; }
#box-list .hbl-summary { margin: 0 0 4px 0; }
#box-list .hbl-rows { list-style: none; margin: 0; padding: 0; max-height: 260px; overflow-y: auto; }
#box-list .hbl-row { display: flex; gap: 4px; align-items: stretch; margin: 2px 0; }
#box-list .hbl-row button { border: 1px solid var(--border-color-primary); border-radius: 4px;
  background: var(--background-fill-primary); color: var(--body-text-color); padding: 2px 6px; }
#box-list .hbl-pick { flex: 1 1 auto; text-align: left; cursor: pointer; }
#box-list .hbl-pick[disabled] { cursor: default; opacity: 0.6; }
#box-list .hbl-tool { flex: 0 0 auto; min-width: 4.5em; cursor: pointer; }
#box-list .hbl-tool[aria-pressed="true"] { font-weight: 600; }
#box-list .hbl-row.hbl-selected .hbl-pick { border: 2px solid var(--hitl-focus, #1d4ed8); font-weight: 600; }
#box-list .hbl-row.hbl-low .hbl-pick { border-style: dashed; border-color: #b45309; }
#box-list .hbl-meta { opacity: 0.8; }
#box-list .hbl-badge { display: inline-block; margin-left: 4px; padding: 0 4px; border-radius: 3px;
  font-size: 0.85em; background: #e5e7eb; color: #111827; }
#box-list .hbl-badge.hbl-low { background: #fde68a; color: #78350f; }
#box-list .hbl-badge.hbl-problem { background: #fecaca; color: #7f1d1d; }
#box-list .hbl-badge.hbl-locked { background: #c7d2fe; color: #1e1b4b; }
#box-list .hbl-status { min-height: 1.2em; margin: 4px 0 0 0; font-weight: 600; color: #b45309; }
.dark #box-list .hbl-status { color: #fbbf24; }
"""

# js_on_load of the list's gr.HTML: a row's button. "pick" selects on the canvas here and now; Hide
# and Lock go to the app (gr.HTML's ``trigger``), which answers with the list redrawn.
LIST_ON_LOAD_JS = """
element.addEventListener("click", (e) => {
  const b = e.target && e.target.closest ? e.target.closest("button[data-act]") : null;
  const row = b && element.contains(b) ? b.closest("[data-row]") : null;
  if (!row || b.disabled) { return; }
  if (b.dataset.act === "pick") {
    if (window.hitlBoxList) { window.hitlBoxList.pick(row); }
    return;
  }
  trigger("click", { act: b.dataset.act, box_id: row.dataset.box || "" });
});
"""

_BOX_LIST_JS = """
() => {
  if (window.hitlBoxList) { return []; }
  const style = document.createElement("style");
  style.textContent = %CSS%;
  document.head.appendChild(style);
  const TAG = /^#(\\d+)(?=\\s|$)/;
  const PID = 31337;  // the pointer id of the presses the script sends
  const ARROWS = { ArrowLeft: [-1, 0], ArrowRight: [1, 0], ArrowUp: [0, -1], ArrowDown: [0, 1] };
  const S = { raw: null, flags: { hidden: [], locked: [], low: [], w: 0, h: 0 }, boxes: [], frame: null };
  const tagOf = (b) => { const m = TAG.exec(String((b && b.label) || "")); return m ? Number(m[1]) : null; };
  const flags = () => {
    const el = document.querySelector("#box-list [data-flags]");
    const raw = el ? el.getAttribute("data-flags") : "";
    if (raw !== S.raw) {
      S.raw = raw;
      try { S.flags = Object.assign({ hidden: [], locked: [], low: [], w: 0, h: 0 }, raw ? JSON.parse(raw) : {}); }
      catch (err) { S.flags = { hidden: [], locked: [], low: [], w: 0, h: 0 }; }
      return true;
    }
    return false;
  };
  const has = (name, b) => { const t = tagOf(b); return t !== null && S.flags[name].includes(t); };
  const hidden = (b) => has("hidden", b);
  const locked = (b) => has("locked", b);
  const newNumber = (b) => {
    const drawn = S.boxes.filter((x) => tagOf(x) === null);
    const i = drawn.indexOf(b);
    return i < 0 ? null : drawn.length - i;
  };
  const keyOf = (b) => (tagOf(b) !== null ? "t" + tagOf(b) : "n" + newNumber(b));
  const nameOf = (b) => (tagOf(b) !== null ? "#" + tagOf(b) : "New box " + newNumber(b));
  const selected = () => S.boxes.find((b) => b.isSelected) || null;
  const say = (text) => {
    const el = document.querySelector("#box-list .hbl-status");
    if (el) { el.textContent = text; }
  };
  const sync = () => {
    const sel = selected();
    const key = sel ? keyOf(sel) : "";
    document.querySelectorAll("#box-list [data-row]").forEach((r) => {
      const k = r.dataset.tag ? "t" + r.dataset.tag : "n" + r.dataset.new;
      const on = key !== "" && k === key;
      if (r.classList.contains("hbl-selected") !== on) { r.classList.toggle("hbl-selected", on); }
      const p = r.querySelector('[data-act="pick"]');
      if (p && p.getAttribute("aria-pressed") !== String(on)) { p.setAttribute("aria-pressed", String(on)); }
    });
  };
  const publish = () => { S.boxes = (S.frame || []).slice().reverse(); S.frame = null; sync(); };
  const redraw = () => {
    const b = S.boxes[0];
    if (b && typeof b.renderCallBack === "function") { b.renderCallBack(); }
  };

  const patch = (proto) => {
    if (!proto || Object.prototype.hasOwnProperty.call(proto, "__hitlBoxList")) { return; }
    Object.defineProperty(proto, "__hitlBoxList", { value: true });
    const o = { render: proto.render, inside: proto.isPointInsideBox, handle: proto.indexOfPointInsideHandle,
      drag: proto.startDrag, resize: proto.startResize, handles: proto.updateHandles };
    proto.render = function (ctx) {
      if (S.frame === null) { S.frame = []; queueMicrotask(publish); }
      else if (S.frame.includes(this)) { S.frame = []; }  // a second redraw in the same task
      S.frame.push(this);
      flags();
      if (hidden(this)) { this.updateOffset(); return; }
      if (!has("low", this)) { return o.render.call(this, ctx); }
      const alpha = this.alpha;
      ctx.save();
      ctx.setLineDash([6, 4]);
      this.alpha = alpha * 0.4;
      try { return o.render.call(this, ctx); } finally { this.alpha = alpha; ctx.restore(); }
    };
    proto.isPointInsideBox = function (x, y) { return hidden(this) ? false : o.inside.call(this, x, y); };
    proto.indexOfPointInsideHandle = function (x, y) {
      return hidden(this) || locked(this) ? -1 : o.handle.call(this, x, y);
    };
    proto.updateHandles = function () { o.handles.call(this); if (locked(this)) { this.resizeHandles = []; } };
    proto.startDrag = function (e) {
      if (locked(this)) { say(nameOf(this) + " is locked: unlock it in the list to move it."); return; }
      return o.drag.call(this, e);
    };
    proto.startResize = function (i, e) { if (locked(this)) { return; } return o.resize.call(this, i, e); };
  };
  if (!Object.getOwnPropertyDescriptor(Object.prototype, "creatingAnchorX")) {
    const store = new WeakMap();
    Object.defineProperty(Object.prototype, "creatingAnchorX", {
      configurable: true,
      enumerable: false,
      get() { return Object(this) === this ? store.get(this) : undefined; },
      set(v) {
        if (Object(this) !== this) { return; }
        store.set(this, v);
        if (typeof this.render === "function" && typeof this.toJSON === "function") {
          patch(Object.getPrototypeOf(this));
        }
      },
    });
  }

  const canvas = () => {
    const c = document.querySelector("#annotator canvas");
    if (c && !c.__hitlGuarded) {  // the script's presses have no real pointer to capture
      c.__hitlGuarded = true;
      for (const name of ["setPointerCapture", "releasePointerCapture"]) {
        const f = c[name];
        c[name] = function (id) { try { return f.call(this, id); } catch (err) { return undefined; } };
      }
    }
    return c;
  };
  const press = (c, type, x, y) => {
    const r = c.getBoundingClientRect();
    const opts = { bubbles: true, cancelable: true, composed: true, pointerId: PID, pointerType: "mouse",
      isPrimary: true, button: 0, buttons: type === "pointerdown" ? 1 : 0,
      clientX: r.left + (x * r.width) / (c.width || 1), clientY: r.top + (y * r.height) / (c.height || 1) };
    c.dispatchEvent(new PointerEvent(type, opts));
  };
  const freePoint = (box) => {
    const i = S.boxes.indexOf(box);
    const fr = [0.5, 0.35, 0.65, 0.2, 0.8, 0.1, 0.9];
    for (const fy of fr) {
      for (const fx of fr) {
        const [x, y] = box.toCanvasCoordinates(
          box.xmin + fx * (box.xmax - box.xmin), box.ymin + fy * (box.ymax - box.ymin));
        if (S.boxes.some((b) => b.indexOfPointInsideHandle(x, y) >= 0)) { continue; }
        if (S.boxes.slice(0, i).some((b) => b.isPointInsideBox(x, y))) { continue; }
        return [x, y];
      }
    }
    return null;
  };
  const select = (box) => {
    const c = canvas();
    if (!c || !box || hidden(box) || S.boxes.indexOf(box) < 0) { return false; }
    const pt = freePoint(box);
    if (!pt) { say(nameOf(box) + " lies under another box: hide that one to reach it."); return false; }
    const mode = document.querySelector('#annotator button[aria-label="Drag boxes"]');
    if (mode) { mode.click(); }
    press(c, "pointerdown", pt[0], pt[1]);
    press(c, "pointerup", pt[0], pt[1]);
    sync();
    return !!box.isSelected;
  };
  const pick = (row) => {
    flags();
    let box = null;
    if (row.dataset.tag) { box = S.boxes.find((b) => tagOf(b) === Number(row.dataset.tag)) || null; }
    else { box = S.boxes.find((b) => tagOf(b) === null && newNumber(b) === Number(row.dataset.new)) || null; }
    if (!box) { say("That box is no longer on the image."); return false; }
    const ok = select(box);
    if (ok) { say(""); }
    return ok;
  };
  const order = () => S.boxes.filter((b) => !hidden(b)).sort((a, b) => {
    const ka = tagOf(a) !== null ? tagOf(a) : 1e6 + newNumber(a);
    const kb = tagOf(b) !== null ? tagOf(b) : 1e6 + newNumber(b);
    return ka - kb;
  });
  const cycle = (dir) => {
    flags();
    const list = order();
    const cur = list.findIndex((b) => b.isSelected);
    let k = cur < 0 ? (dir > 0 ? 0 : list.length - 1) : cur + dir;
    for (; k >= 0 && k < list.length; k += dir) {
      if (select(list[k])) { say(""); return true; }
    }
    return false;  // past the last (first) box: Tab leaves the image
  };
  const nudge = (dx, dy) => {
    flags();
    const b = selected();
    if (!b || hidden(b)) { return false; }
    if (locked(b)) { say(nameOf(b) + " is locked: unlock it in the list to move it."); return true; }
    const s = Number(b.scaleFactor) || 1;
    let mx = dx * s;
    let my = dy * s;
    if (S.flags.w > 0) { mx = Math.min(Math.max(mx, -b._xmin), S.flags.w * s - b._xmax); }
    if (S.flags.h > 0) { my = Math.min(Math.max(my, -b._ymin), S.flags.h * s - b._ymax); }
    if (!mx && !my) { return true; }
    b._xmin += mx; b._xmax += mx; b._ymin += my; b._ymax += my;
    b.applyUserScale();
    redraw();
    const c = canvas();
    if (c) { press(c, "pointerup", 0, 0); }  // the canvas sends its value, as after a drag
    say("");
    return true;
  };
  const refuse = (e) => {
    const b = selected();
    if (!b || !(hidden(b) || locked(b))) { return false; }
    e.preventDefault();
    e.stopImmediatePropagation();
    say(nameOf(b) + (locked(b) ? " is locked: unlock it in the list to delete it."
      : " is hidden: show it to delete it."));
    return true;
  };
  document.addEventListener("keydown", (e) => {
    if (e.key === "Delete" && e.target && e.target.closest && e.target.closest("#annotator")) { flags(); refuse(e); }
  }, true);
  document.addEventListener("click", (e) => {
    const t = e.target && e.target.closest ? e.target.closest('#annotator button[aria-label="Remove box"]') : null;
    if (t) { flags(); refuse(e); }
  }, true);
  document.addEventListener("keydown", (e) => {
    if (e.defaultPrevented || e.altKey || e.ctrlKey || e.metaKey) { return; }
    const t = e.target;
    const onImage = !!(t && t.classList && t.classList.contains("annotator-container") && t.closest("#annotator"));
    const inList = !!(t && t.closest && t.closest("#box-list"));
    if (e.key === "Tab" && onImage) {
      if (cycle(e.shiftKey ? -1 : 1)) { e.preventDefault(); }
      return;
    }
    const d = ARROWS[e.key];
    if (d && (onImage || inList)) {
      const step = e.shiftKey ? 10 : 1;
      if (nudge(d[0] * step, d[1] * step)) { e.preventDefault(); }
    }
  });
  new MutationObserver(() => { if (flags()) { redraw(); } sync(); })
    .observe(document.body, { childList: true, subtree: true, attributes: true, attributeFilter: ["data-flags"] });
  window.hitlBoxList = { pick, select, cycle, nudge, selected, boxes: () => S.boxes.slice(), tagOf, hidden, locked };
  return [];
}
"""

BOX_LIST_JS = _BOX_LIST_JS.replace("%CSS%", json.dumps(BOX_LIST_CSS))
