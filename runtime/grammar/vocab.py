"""The raw bytes behind each token id, for backends that match text byte by byte (outlines).

Byte-level BPE vocabularies (GPT-2, Llama-3, SmolLM) spell bytes as printable unicode stand-ins
(``Ġ`` = space); SentencePiece vocabularies use ``▁`` for a space and ``<0xNN>`` for raw bytes.
Special and added tokens get ``None``: a grammar never allows them except as the stop token.
"""
from __future__ import annotations

import functools
import re
import string
from typing import Any

# The characters completions are built of (the shortest-completion search's single-character
# moves, forcing/moves.py, and outlines' completion table), in the order they are tried.
# NOTE: order matters twice: it breaks ties between equally short paths, and it decides which
# characters are tried first when a state allows many (at most ``max_tries``): one digit and
# one letter of each case come before the punctuation, the other digits and letters after it;
# the backslash last (an escape is a state of its own, so a depth-first walk would otherwise
# prefer escaping forever when the closing quote is masked, e.g. a unique item already used).
PRIORITY = ('"}])' + ",:" + "0a" + "A1" + " -._@/+#$%&'*;<=>?[^`{|~!(" + string.digits[2:]
            + string.ascii_lowercase[1:] + string.ascii_uppercase[1:] + "\n\t" + "\\")

_SP_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable stand-in character -> byte."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_KEPT: dict[tuple[int, int], tuple[Any, tuple[bytes | None, ...]]] = {}


def token_bytes(tokenizer: Any, vocab_size: int) -> tuple[bytes | None, ...]:
    """``result[i]`` = the bytes token ``i`` decodes to, or None for special/unused ids.
    Kept for the last few tokenizers: the grammar backend, the manager's quote tokens and the
    completion search each need it (0.2 s of Python at a 128k vocabulary; measured on the
    H100 host, a search that built it lazily stalled a decode step by that much)."""
    key = (id(tokenizer), vocab_size)
    kept = _KEPT.get(key)
    if kept is None or kept[0] is not tokenizer:  # NOTE: the id of a collected one reused
        kept = _KEPT[key] = (tokenizer, tuple(_token_bytes(tokenizer, vocab_size)))
        while len(_KEPT) > 4:
            del _KEPT[next(iter(_KEPT))]
    return kept[1]


def _token_bytes(tokenizer: Any, vocab_size: int) -> list[bytes | None]:
    vocab: dict[str, int] = tokenizer.get_vocab()
    added = {int(i) for i in getattr(tokenizer, "added_tokens_decoder", {})}
    added |= set(getattr(tokenizer, "all_special_ids", []) or [])
    byte_level = any(s.startswith("Ġ") for s in vocab)
    decoder = _byte_decoder()
    out: list[bytes | None] = [None] * vocab_size
    for piece, i in vocab.items():
        if i >= vocab_size or i in added:
            continue
        out[i] = _piece_bytes(piece, byte_level, decoder)
    return out


def _piece_bytes(piece: str, byte_level: bool, decoder: dict[str, int]) -> bytes | None:
    if byte_level:
        try:
            return bytes(decoder[c] for c in piece)
        except KeyError:  # not a byte-level piece: treat as literal text
            return piece.encode("utf-8")
    m = _SP_BYTE.match(piece)
    if m:
        return bytes([int(m.group(1), 16)])
    return piece.replace("▁", " ").encode("utf-8")


def decode_prefix(data: bytes) -> str:
    """The longest prefix of ``data`` that is complete UTF-8, decoded."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", "ignore")


def fast_decoder(tokenizer: Any) -> Any:
    """``tokenizer.decode`` for ids, without the wrapper's per-call work where that gives the
    same text: a fast tokenizer's Rust decoder when no clean-up of spaces follows (3-4x
    cheaper per call; the completion tracker decodes a few tokens per request and step)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return tokenizer.decode
    return lambda ids: backend.decode(list(ids), skip_special_tokens=False)


def fast_encoder(tokenizer: Any) -> Any:
    """``tokenizer.encode(text, add_special_tokens=False)`` as a list of ids, through a fast
    tokenizer's Rust encoder where there is one (~10x cheaper per call than the wrapper's;
    the completion tracker counts the tokens of each new plan)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return lambda text: tokenizer.encode(text, add_special_tokens=False)
    return lambda text: backend.encode(text, add_special_tokens=False).ids
