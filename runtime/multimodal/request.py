"""Images of a ``generate`` call, per prompt, into the prompt ids and ``MmData`` (used by the
engine's ``RequestBuilder`` in the caller's thread, so a bad image raises before anything is
sent). ``image_data`` follows SGLang: one image or a list for one prompt; for a batch, one entry
(None, an image or a list) per prompt."""
from __future__ import annotations

from typing import Any, Callable

from ..errors import InvalidRequestError
from .inputs import MmData

FIELD = "image_data"


def per_prompt(image_data: Any, n: int, batched: bool) -> list[list[Any]]:
    """One list of image sources per prompt."""
    if image_data is None:
        return [[] for _ in range(n)]
    if not batched:
        return [_as_list(image_data)]
    if not isinstance(image_data, (list, tuple)) or len(image_data) != n:
        raise InvalidRequestError(f"{FIELD} must have one entry per prompt ({n})", field=FIELD)
    return [_as_list(v) for v in image_data]


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def prompt_ids(processor: Any, item: Any, count: int, is_text: bool,
               encode: Callable[[Any], list[int]]) -> list[int]:
    """The prompt's ids before expansion (a text prompt without placeholders gets them)."""
    if processor is None:
        raise InvalidRequestError(f"{FIELD}: this model is text-only; it takes no images",
                                  field=FIELD)
    return encode(processor.with_placeholders(item, count) if is_text else item)


def process_all(processor: Any, items: list[Any], images: list[list[Any]], is_text: bool,
                encode: Callable[[Any], list[int]]) -> dict[int, tuple[list[int], MmData]]:
    """Expanded ids and ``MmData`` of every prompt that has images. Prompts are encoded here
    (the tokenizer is not shared across threads); images are decoded and processed on the
    processor's thread pool when there are several prompts (decoding and the image processor
    let go of the GIL for most of their time)."""
    todo = [i for i, imgs in enumerate(images) if imgs]
    if not todo:
        return {}
    for i in todo:
        if processor is not None:
            processor.check_count(images[i], FIELD)
    ids = {i: prompt_ids(processor, items[i], len(images[i]), is_text, encode) for i in todo}

    def one(i: int) -> tuple[list[int], MmData]:
        return processor.process(ids[i], images[i], FIELD)

    if len(todo) == 1:
        return {todo[0]: one(todo[0])}
    return dict(zip(todo, processor.pool.map(one, todo)))


def check_logprob_start(mm: MmData | None, start: int) -> None:
    """Prompt logprobs score vocabulary tokens only: they must start after the last image."""
    if mm is not None and 0 <= start <= mm.last_image_token + 1:
        raise InvalidRequestError(
            f"logprob_start_len={start}: prompt logprobs must start after the last image token "
            f"(position {mm.last_image_token})", field="logprob_start_len")
