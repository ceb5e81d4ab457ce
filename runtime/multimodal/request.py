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


def with_images(processor: Any, item: Any, images: list[Any], is_text: bool,
                encode: Callable[[str], list[int]]) -> tuple[list[int], MmData | None]:
    """``item`` (prompt text, or ids when ``is_text`` is False) as ids with its images."""
    if not images:
        return (encode(item) if is_text else list(item)), None
    if processor is None:
        raise InvalidRequestError(f"{FIELD}: this model is text-only; it takes no images",
                                  field=FIELD)
    processor.check_count(images, FIELD)
    ids = encode(processor.with_placeholders(item, len(images))) if is_text else list(item)
    return processor.process(ids, images, FIELD)


def check_logprob_start(mm: MmData | None, start: int) -> None:
    """Prompt logprobs score vocabulary tokens only: they must start after the last image."""
    if mm is not None and 0 <= start <= mm.last_image_token + 1:
        raise InvalidRequestError(
            f"logprob_start_len={start}: prompt logprobs must start after the last image token "
            f"(position {mm.last_image_token})", field="logprob_start_len")
