"""Which of the page's containers (the review panel, the canvas, the confirmations, the results, the
mask review, the notes, the sign-in form…) are shown: said by a ``<style>`` element the server updates
beside each container, never by an update of the container itself.

Why: once a component has been an event's output, Gradio 6's page refreshes its loading status at
every event the page sends or receives, and for a container that refresh takes a deep snapshot of
everything inside it (``get_data`` of each descendant). With the main row (105 components) among the
sign-in's outputs and seven panels among every opening's, a CPU profile of one reviewer's N and Enter
spent most of the page's main thread there (~150 snapshots of every component per job). A ``<style>``
element is one small HTML value. A container is never made invisible either (``visible=False``
unmounts what it holds, and the annotator mounted a second time stayed empty): it is always mounted,
and hidden by ``display: none`` while its style says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

STYLE_CLASS = "hitl-style"  # the style elements' own blocks take no room (ui.assets.CSS)


@dataclass(frozen=True)
class Shown:
    """A container (by its ``elem_id``) shown or hidden by ``style``, a ``gr.HTML`` holding a ``<style>``."""

    elem_id: str
    style: gr.HTML

    def set(self, on: bool) -> str:
        """The value of ``style`` that shows (``on``) or hides the container."""
        return style_for(self.elem_id, on)

    def update(self, on: bool) -> dict[gr.HTML, str]:
        """The one output that shows or hides the container."""
        return {self.style: self.set(on)}


def style_for(elem_id: str, on: bool) -> str:
    return "" if on else f"<style>#{elem_id} {{ display: none !important; }}</style>"


def is_shown(style: str) -> bool:
    """Whether a value of a ``Shown.style`` shows its container."""
    return "display: none" not in (style or "")


def shown_style(elem_id: str, on: bool) -> Shown:
    """The style element of the container ``elem_id``, laid out here (beside the container), with the
    container shown (``on``) or hidden at first."""
    html = gr.HTML(style_for(elem_id, on), container=False, padding=False, elem_classes=[STYLE_CLASS])
    return Shown(elem_id, html)
