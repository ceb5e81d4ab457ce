"""Text -> token ids without special tokens, as one function of the text.

For a fast (Rust) Hugging Face tokenizer, ``tokenizer.encode(text, add_special_tokens=False)``
is ``backend_tokenizer.encode_batch([text])`` behind a Python wrapper (input checks, padding and
truncation set-up, a ``BatchEncoding`` built and unpacked) that costs about 0.35 ms per call on
the 2-core dev box: a third of the whole encode of a 280-token Llama-3 chat prompt. The server
encodes every chat prompt on its event loop, which shares the GIL with the Engine's loop thread,
so the backend is called directly where that gives the same ids: its ``encode_batch``, the very
call the wrapper makes, which also lets go of the GIL while it tokenizes (``encode`` holds it),
so the Engine's thread runs meanwhile.
"""
from __future__ import annotations

from typing import Any, Callable


def _direct(tokenizer: Any) -> Any:
    """The Rust backend where calling it directly gives the wrapper's ids, else None: a fast
    tokenizer whose ``split_special_tokens`` is off (the wrapper would otherwise switch the
    backend's ``encode_special_tokens`` per call) and the backend already set that way."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (backend is not None and getattr(tokenizer, "is_fast", False)
            and not getattr(tokenizer, "split_special_tokens", False)
            and not getattr(backend, "encode_special_tokens", True)):
        return backend
    return None


def ids_encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    """``tokenizer.encode(text, add_special_tokens=False)`` as a function of ``text``."""
    backend = _direct(tokenizer)
    if backend is not None:
        return lambda text: backend.encode_batch([text], add_special_tokens=False)[0].ids
    return lambda text: list(tokenizer.encode(text, add_special_tokens=False))


def ids_batch_encoder(tokenizer: Any) -> Callable[[list[str]], list[list[int]]]:
    """``ids_encoder`` over a list of texts in one call (the backend's ``encode_batch`` where
    ``ids_encoder`` takes the backend: it tokenizes them in parallel without the GIL)."""
    backend = _direct(tokenizer)
    if backend is not None:
        return lambda texts: [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    return lambda texts: [list(tokenizer.encode(t, add_special_tokens=False)) for t in texts]
