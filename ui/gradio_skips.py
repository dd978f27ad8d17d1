"""Outputs an event leaves alone cost nothing on the server (a fix to Gradio 6's ``postprocess_data``).

A handler here returns a dict naming the few outputs it changes; Gradio fills every other output of the
event with ``gr.skip()`` (``{"__type__": "update"}``) and then treats each of those as a property update:
it builds a new instance of the component from its constructor arguments and computes its config
again, including its API schema (pydantic's JSON-schema generation for a gallery, an image, a file, the
annotator: milliseconds each). A follower's update names the panel's 44 outputs and changes a handful,
so about 40 components were rebuilt per update; in ``benchmarks/reviewer.py`` that was most of the UI
process's CPU, and with four reviewers the process was saturated (docs/benchmarks.md).

:func:`install` wraps ``Blocks.postprocess_data`` so that outputs left as a bare skip are not processed
at all: the named ones go through Gradio's own code (a copy of the event's function naming only
them), and the others come back as Gradio's own answer for a skip — ``{"__type__": "update"}``, or None
for a ``gr.State`` — which the browser reads as "leave it". Rebuilding a skipped component also dropped
its value from the session's config copy; skipping leaves that copy as it was. Anything not of that
shape (a list, a batch, a validator, keys Gradio would match by ``key``) goes to Gradio unchanged.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from gradio.blocks import Block, Blocks

log = logging.getLogger("hitl.ui")

BARE_SKIP: dict[str, str] = {"__type__": "update"}
_INSTALLED = "_hitl_skips_cheap"


def bare_skip(value: Any) -> bool:
    """``gr.skip()`` itself: an update that changes nothing (no value, no property)."""
    return isinstance(value, dict) and value == BARE_SKIP


def named_outputs(block_fn: Any, predictions: Any) -> list[int] | None:
    """The positions of the outputs ``predictions`` changes, when it is a dict of components that all
    are the event's outputs (by identity) and names at least one bare skip or leaves one out; else None
    (Gradio's own path)."""
    outputs = getattr(block_fn, "outputs", None)
    if (
        not isinstance(predictions, dict)
        or not predictions
        or not outputs
        or len(outputs) < 2
        or getattr(block_fn, "batch", False)
        or getattr(block_fn, "is_validator_function", False)
    ):
        return None
    where = {block._id: i for i, block in enumerate(outputs)}
    keep: list[int] = []
    for block, value in predictions.items():
        if not isinstance(block, Block) or block._id not in where:
            return None
        if not bare_skip(value):
            keep.append(where[block._id])
    return sorted(keep) if len(keep) < len(outputs) else None


def install() -> bool:
    """Wrap ``Blocks.postprocess_data`` once; False when Gradio's is not as expected (left alone)."""
    original = getattr(Blocks, "postprocess_data", None)
    if original is None:
        log.warning("gradio.Blocks has no postprocess_data: skipped outputs are processed as Gradio does")
        return False
    if getattr(original, _INSTALLED, False):
        return True

    async def postprocess_data(self: Blocks, block_fn: Any, predictions: Any, state: Any) -> list[Any]:
        keep = named_outputs(block_fn, predictions)
        if keep is None:
            return await original(self, block_fn, predictions, state)
        outputs = list(block_fn.outputs)
        answer: list[Any] = [None if block.stateful else dict(BARE_SKIP) for block in outputs]
        if keep:
            named = copy.copy(block_fn)
            named.outputs = [outputs[i] for i in keep]
            part = await original(self, named, {outputs[i]: predictions[outputs[i]] for i in keep}, state)
            for i, value in zip(keep, part, strict=True):
                answer[i] = value
        return answer

    setattr(postprocess_data, _INSTALLED, True)
    Blocks.postprocess_data = postprocess_data  # type: ignore[method-assign]  # the one patch this module is
    return True
