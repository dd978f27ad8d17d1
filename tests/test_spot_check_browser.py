"""A spot check is indistinguishable on the reviewer page (SPEC §14, docs/learning.md): headless Chromium
driven by Playwright against the shared "box-stages" `hitl up` (tests/browser_stack.py), which runs a box
auto-approve policy in ``on`` with ``--spot-check 1.0``. The policy would approve any detection on a
640 x 480 image and none on a 320 x 240 one, so the first job is a spot check (it waits for a person only
because it was drawn) and the second an ordinary review. The test shows that:
- the API gives the page the same shape for both (snapshot keys, pause fields, event types) and nothing
  in either names the policy or the spot check;
- the page renders the same panel for both: the same elements with an id, the same texts once numbers
  and ids are set aside, and no word of a policy or spot check in any text or attribute;
- the reviewer's decision on the spot check is recorded against the policy (``POLICY_SPOT_CHECKED``,
  ``hitl_auto_approve_decisions{kind="spot"}``), and on the ordinary job it is not.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from hitl_review.serve_app.ops.samples import product_composite
from hitl_review.ui.panel import ROUND1_TEXT

from .browser_stack import page_maker, shared_ui_up
from .browser_util import Api

pytestmark = [pytest.mark.browser, pytest.mark.ray, pytest.mark.slow]
SHARED_UI = "box-stages"

MARKER = re.compile(r"spot[ _-]?check|auto_review|would_approve|policy:|auto[ _-]?approv|POLICY_", re.I)
PAGE_JS = """() => {
  const ids = [], attrs = [];
  for (const el of document.querySelectorAll('*')) {
    if (el.id && el.offsetParent !== null) ids.push(el.id);
    for (const a of el.attributes) if (a.name !== 'style') attrs.push(a.name + '=' + a.value);
  }
  const stage = document.querySelector('#stage-text');
  const buttons = [...document.querySelectorAll('#review-panel button')]
    .filter((b) => b.offsetParent !== null).map((b) => b.innerText.trim());
  return {ids, attrs, buttons, text: document.body.innerText, stage: stage ? stage.innerText : ''};
}"""


def _keys(value: Any, path: str = "") -> set[str]:
    """Every key path of a JSON value (list items share one path)."""
    if isinstance(value, dict):
        return {f"{path}.{k}" for k in value} | {p for k, v in value.items() for p in _keys(v, f"{path}.{k}")}
    if isinstance(value, list):
        return {p for v in value for p in _keys(v, path + "[]")}
    return set()


def _lines(text: str, labels: set[str]) -> set[str]:
    """The page's text lines with numbers, ids and the detections' labels (data, not page) set aside."""
    text = re.sub(r"\b(job|box|pause|snap|iv)_[0-9a-zA-Z]+", "<id>", text)
    for label in sorted(labels, key=len, reverse=True):
        text = text.replace(label, "<label>")
    return {re.sub(r"\d+(\.\d+)?", "#", line).strip() for line in text.splitlines() if line.strip()}


def _ids(ids: list[str]) -> set[str]:
    """The ids of the page's shown elements, those a component numbers at random by kind: Gradio's
    ``html-`` ids are random base-36 (html-42losp3te, and one in twenty has no digit: html-lkyfmkhoh)."""
    return {re.sub(r"^html-[0-9a-z]+$", "html-<n>", re.sub(r"-[0-9a-z]*\d[0-9a-z]*$", "-<n>", i)) for i in ids}


def _sample(api_url: str, name: str, **labels: str) -> float | None:
    """The value of the /metrics sample ``name`` with ``labels`` (any policy), or None."""
    from prometheus_client.parser import text_string_to_metric_families

    with httpx.Client(base_url=api_url, timeout=10) as c:
        text = c.get("/metrics").text
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name == name and all(smp.labels.get(k) == v for k, v in labels.items()):
                return float(smp.value)
    return None


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with shared_ui_up(request, tmp_path_factory, SHARED_UI) as up:
        yield up


def test_a_spot_check_renders_as_any_review_and_its_decision_counts_against_the_policy(stack, browser) -> None:
    api = Api(stack.api_url, stack.token)
    try:
        spot = api.submit(product_composite(4101, 640, 480, n=2)[0])
        plain = api.submit(product_composite(4101, 320, 240, n=2)[0])
        snaps = {job: api.wait_round(job, 1) for job in (spot, plain)}
        assert all(s["box_list"] for s in snaps.values()), "the detector found no box: no policy decision"
        assert _sample(stack.api_url, "hitl_auto_approve_mode", mode="on") == 1.0
        # What the API gives the page: the same shape, and nothing that names the policy.
        a, b = snaps[spot], snaps[plain]
        assert _keys(a) == _keys(b) and a["decided_by"] is None and b["decided_by"] is None
        assert a["status"] == b["status"] == "WAITING_USER_SELECTION"
        assert a["active_pause"]["stage"] == b["active_pause"]["stage"] and a["pending_actions"] == b["pending_actions"]
        types = {job: [e["type"] for e in api.events(job, until="PAUSE_OPENED")] for job in (spot, plain)}
        assert types[spot] == types[plain]
        for job in (spot, plain):
            raw = api.c.get(f"/api/v1/jobs/{job}").text + str(api.events(job, until="PAUSE_OPENED"))
            assert not MARKER.search(raw), (job, MARKER.search(raw))
        # The page: the same panel for both.
        seen: dict[str, dict[str, Any]] = {}
        with page_maker(browser, stack.ui_url or "") as new_page:
            pages = {}
            for job in (spot, plain):
                pages[job] = rv = new_page()
                rv.open_url(job)
                rv.wait_panel(ROUND1_TEXT)
            for rv in pages.values():  # settled: the notes and flag row draw after the canvas
                rv.page.locator("#flag-btn").wait_for(state="visible")
                rv.page.locator("#notes-panel").wait_for(state="visible")
            pages[plain].page.wait_for_timeout(1500)
            for job, rv in pages.items():
                seen[job] = rv.page.evaluate(PAGE_JS)
                found = [x for x in [seen[job]["text"], *seen[job]["attrs"]] if MARKER.search(x)]
                assert found == [], (job, found[:5])
            assert _ids(seen[spot]["ids"]) == _ids(seen[plain]["ids"])
            labels = {str(b.get("label")) for s in snaps.values() for b in s["box_list"] if b.get("label")}
            assert _lines(seen[spot]["stage"], labels) == _lines(seen[plain]["stage"], labels)
            assert _lines("\n".join(seen[spot]["buttons"]), labels) == _lines("\n".join(seen[plain]["buttons"]), labels)
            # The reviewer approves both lists as they are: the spot check counts for the policy.
            for job in (spot, plain):
                rv = new_page()
                rv.open_url(job)
                rv.wait_panel(ROUND1_TEXT)
                rv.page.click("#submit-btn")
                api.wait(job, lambda s: s["status"] != "WAITING_USER_SELECTION", "a submitted review")
        checked = [e["data"] for e in api.events(spot, until="JOB_FINISHED") if e["type"] == "POLICY_SPOT_CHECKED"]
        assert len(checked) == 1 and checked[0]["false_accept"] is False and checked[0]["unchanged"] is True
        assert checked[0]["policy"].startswith("policy:box-test@")
        compared = [e["type"] for e in api.events(plain, until="JOB_FINISHED") if e["type"].startswith("POLICY_")]
        assert compared == ["POLICY_REVIEW_COMPARED"]  # sent to a person by the policy itself, not a spot check
        assert (_sample(stack.api_url, "hitl_auto_approve_decisions", kind="spot") or 0) >= 1
    finally:
        api.close()
