"""Where the page keeps each event's loading status: on the banner, not on every output.

Gradio 6's page keeps a loading status for every component that has been an output of any event run so
far (an event's "progress targets": its outputs unless ``show_progress_on`` names others), and at each
change of any event's status (queued, started, each streamed update, done) it hands every one of those
components its status again, which deep-copies the component's props (``update_loading_stati_state``).
Once a job was opened, a follower had run and a submission had been answered, that was the whole review
panel (71 components are outputs of some event), several times per event. A CPU profile of the page
between Enter and the banner (one reviewer, 8 submissions, each right after its panel was drawn) found it
busy 99 % of the time, half of it in that loop: it is what the banner was waiting for.

:func:`narrow` gives every event the banner as its only progress target: the outputs are updated as
before, only their loading status is not tracked. A progress animation, where an event shows one (a
sign-in, a cancel, the queue's filters, the stats), is drawn over the banner, where the page says what it
is doing; most events show none (``show_progress="hidden"``). A small event's outputs would cost little,
but one large one is enough (the queue's table, refreshed by its filters, is copied whole each time), and
once tracked a component stays tracked for the page's life: so no exception.
"""

from __future__ import annotations

from typing import Any

import gradio as gr


def narrow(demo: gr.Blocks, target: Any) -> int:
    """Point the progress of ``demo``'s events at ``target`` (see the module's docstring); returns how many
    events were changed. Call it once every event is wired."""
    changed = 0
    for fn in demo.fns.values():
        if fn.fn is None or fn.show_progress_on is not None:
            continue  # a browser-only step keeps no status; a chosen target stays
        fn.show_progress_on = [target]
        changed += 1
    return changed
