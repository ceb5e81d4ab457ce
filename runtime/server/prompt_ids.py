"""Text prompts of native ``/generate`` and ``/v1/completions`` as token ids, encoded off the
event loop.

The Engine encodes a text prompt in the caller's step, which for the server is its event loop:
~8 ms of the loop for each 2k-token prompt of the router's workload on the dev box (~95% of the
loop's CPU per request), every other request's parsing, hand-off and answer waiting behind it,
one prompt after another. The chat route already encodes its rendered prompt on a worker
thread (``ServerContext.encode_chat_async``: the same encoder as the Engine's, no special
tokens added, the texts of one loop turn in one batch call that lets go of the GIL); these
routes now do the same for a batch holding a long prompt and hand the Engine ids.
"""
from __future__ import annotations

import asyncio
import dataclasses

from .context import OFFLOAD_ENCODE_CHARS, ServerContext
from .engine_client import GenBatch


async def encoded_off_loop(c: ServerContext, batch: GenBatch) -> GenBatch:
    """A batch holding a long text prompt, with its text prompts as token ids encoded on a
    worker thread (``ServerContext.encode_chat_async``: the Engine's own encoder, no special
    tokens, batched per loop turn); other batches as they are.

    Prompts with images keep their text (the processor expands placeholders)."""
    texts = {it.prompt for it in batch.items if it.prompt is not None and not it.image_data}
    if c.batcher is None or not any(len(t) >= OFFLOAD_ENCODE_CHARS for t in texts):
        return batch
    order = list(texts)
    encoded = dict(zip(order, await asyncio.gather(*map(c.encode_chat_async, order))))
    items = tuple(dataclasses.replace(it, prompt=None, input_ids=encoded[it.prompt])
                  if it.prompt in encoded and encoded[it.prompt] and not it.image_data else it
                  for it in batch.items)  # zero tokens: the Engine's own error for the text
    return dataclasses.replace(batch, items=items)
