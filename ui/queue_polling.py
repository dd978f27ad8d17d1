"""An idle reviewer page server that sleeps (a fix to Gradio 6's queue, as ``ui.gradio_skips`` is).

Gradio's queue has two loops on the server's event loop that poll while nothing waits: the one that
starts events sleeps ``Queue.sleep_when_free`` (1 ms off Windows) between looks, the one that sends
progress ``progress_update_sleep_when_free`` (10 ms). With no event at all the UI process spent
~80 ms/s of CPU on them (py-spy: ``Queue.start_processing``), the largest share of an idle ``hitl up``
after Serve's controller. :func:`calm` lets both sleep ``FREE_POLL_S``: an event that arrives on an
idle queue starts at most that much later; one that arrives while others run is not delayed at all
(the loop only sleeps when the queue is empty or every slot is busy).
"""

from __future__ import annotations

import logging

import gradio as gr

log = logging.getLogger("hitl.ui")

FREE_POLL_S = 0.02  # at most 20 ms before an event on an idle queue starts (a click's round trip is ~100 ms)
POLL_ATTRIBUTES = ("sleep_when_free", "progress_update_sleep_when_free")


def calm(demo: gr.Blocks) -> bool:
    """Make ``demo``'s queue (after ``demo.queue()``) poll every ``FREE_POLL_S`` when free; False, and a
    warning, where this Gradio's queue has not got the attributes (nothing is changed then)."""
    queue = getattr(demo, "_queue", None)
    if queue is None or not all(isinstance(getattr(queue, a, None), int | float) for a in POLL_ATTRIBUTES):
        log.warning("Gradio's queue is not as expected: an idle page server keeps polling every millisecond")
        return False
    for attribute in POLL_ATTRIBUTES:
        setattr(queue, attribute, max(getattr(queue, attribute), FREE_POLL_S))
    return True
