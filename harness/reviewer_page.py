"""What ``benchmarks/reviewer.py`` reads from the reviewer's page (the Gradio UI) and does to it: the
browser-side probes it waits on, and the job a page shows."""

from __future__ import annotations

import re

JOB_ID = re.compile(r"job_[0-9A-Za-z]+")
MISS_TEXT = re.compile(r"No other job is (waiting|free)")  # N found nothing to open (ui.queue.nothing_to_open_text)

# Counts the banner's DOM changes, so a wait can tell a fresh answer from the one already shown.
# Every text the banner showed, in order, with when (a banner can be replaced before a poll reads it:
# "Submitted …" by "The job ended: SUCCEEDED." when the job ends right after the deciding answer).
WATCH_JS = """() => {
  const el = document.querySelector('#banner [data-testid="markdown"]');
  window.__hitlBannerN = 0;
  window.__hitlBanners = [];
  new MutationObserver(() => {
    window.__hitlBannerN += 1;
    window.__hitlBanners.push({ text: el.innerText.trim(), t: Date.now() });
  }).observe(el, { subtree: true, childList: true, characterData: true });
  // When each job first appeared on the job line: N -> job line is the server's and Gradio's part of an
  // opening, job line -> interactive the browser's (the canvas drawing the image).
  const line = document.querySelector('#job-id [data-testid="markdown"]');
  window.__hitlJobShown = {};
  new MutationObserver(() => {
    const m = line.innerText.match(/job_[0-9A-Za-z]+/);
    if (m && !(m[0] in window.__hitlJobShown)) { window.__hitlJobShown[m[0]] = Date.now(); }
  }).observe(line, { subtree: true, childList: true, characterData: true });
}"""
# After N: the new job's panel interactive (its pause on the stage line, Submit on, the image drawn),
# or the banner's fresh answer that nothing could be opened.
OPENED_JS = """([prev, mark]) => {
  const MD = ' [data-testid="markdown"]';  // the text only: not the progress line Gradio lays over it
  const text = (sel) => { const el = document.querySelector(sel + MD); return el ? el.innerText.trim() : ''; };
  const banner = text('#banner');
  if (window.__hitlBannerN > mark && /No other job is (waiting|free)/.test(banner)) {
    return { kind: 'miss' };
  }
  const job = text('#job-id').match(/job_[0-9A-Za-z]+/);
  const pause = text('#stage-text').match(/pause_[0-9A-Za-z]+/);
  if (!job || job[0] === prev || !pause) { return false; }
  const holder = document.querySelector('#submit-btn');
  const button = holder && (holder.tagName === 'BUTTON' ? holder : holder.querySelector('button'));
  if (!button || button.disabled || button.offsetParent === null) { return false; }
  const canvas = document.querySelector('#annotator canvas');
  if (!canvas || !canvas.width || !canvas.height || canvas.offsetParent === null) { return false; }
  const ctx = canvas.getContext('2d');
  if (ctx && ctx.getImageData(canvas.width >> 1, canvas.height >> 1, 1, 1).data[3] === 0) { return false; }
  const t = Date.now();
  return { kind: 'open', job: job[0], pause: pause[0], t, shown: (window.__hitlJobShown || {})[job[0]] || t };
}"""
# After Enter: the confirmation, a refusal under the panel, or a fresh banner of a conflict (409).
# The banners shown since ``mark`` are read from the watcher's log, so a confirmation replaced at once
# still counts.
ANSWERED_JS = """([mark]) => {
  const MD = ' [data-testid="markdown"]';
  const text = (sel) => { const el = document.querySelector(sel + MD); return el ? el.innerText.trim() : ''; };
  const error = text('#review-error');
  const before = mark > 0 ? window.__hitlBanners[mark - 1].text : null;  // on screen at the press
  const shown = window.__hitlBanners.slice(mark).filter((b) => b.text && b.text !== before);
  const ok = shown.find((b) => b.text.startsWith('Submitted'));
  if (ok) { return { kind: 'ok', t: ok.t, text: ok.text }; }
  if (error) { return { kind: 'refused', t: Date.now(), text: error }; }
  if (shown.length) { return { kind: 'conflict', t: shown[0].t, text: shown[0].text }; }
  return false;
}"""
BLUR_JS = "document.activeElement && document.activeElement.blur()"
# Why Enter may have pressed nothing (for an error message): the submit button as the page's key handler
# sees it (ui.assets: only a shown, enabled button is pressed), the panel's classes, the focus, the last
# banners.
SUBMIT_STATE_JS = """() => {
  const h = document.getElementById('submit-btn');
  const b = h && (h.tagName === 'BUTTON' ? h : h.querySelector('button'));
  const panel = document.getElementById('review-panel');
  const focus = document.activeElement;
  return { button: !!b, disabled: !!(b && b.disabled), shown: !!(b && b.offsetParent !== null),
    panel_classes: panel ? panel.className : null, focus: focus ? (focus.id || focus.tagName) : null,
    banners: (window.__hitlBanners || []).slice(-4) };
}"""
# What the page says where a reviewer looks (for an error message).
SHOWN_JS = """() => Object.fromEntries(['#banner', '#job-id', '#stage-text', '#review-error', '#queue-note'].map(
  (sel) => { const el = document.querySelector(sel); return [sel, el ? el.innerText.trim() : null]; }))"""


def shown_job(shown: dict[str, str | None]) -> str:
    """The job id on the page's job line (which also carries Gradio's progress text while it updates)."""
    found = JOB_ID.search(shown.get("#job-id") or "")
    return found.group(0) if found else ""


def laid_out(shown: dict[str, str | None]) -> str:
    """The job whose review is laid out on the page (its pause on the stage line); "" when none is (no job
    open, or one that has ended)."""
    return shown_job(shown) if "pause_" in (shown.get("#stage-text") or "") else ""
