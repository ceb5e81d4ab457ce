"""What a compiled grammar on disk depends on besides its constraint (``disk_cache.py``): the
backend and its package version, the tokenizer, and the code that compiles.

Two engines may share a file only if a fresh compile would give them the same bytes, so the
identity hashes everything that changes the result:

- the backend's name and its package's version (xgrammar, outlines-core);
- the tokenizer: its full serialized form where it has one (a fast tokenizer's JSON: vocab,
  merges, normalizer, decoder, added tokens), else its vocabulary, plus the vocabulary size and
  the stop tokens the backend was built with;
- the compile pipeline's own code: a hash of every ``.py`` under ``runtime/grammar/`` (the
  schema normalizer, the regex rewrites, the completion tables, the backends' options such as
  xgrammar's ``any_whitespace=False``) and our package's version. A hash of the source rather
  than a version number, so a development tree never reads files an older normalizer wrote.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
from pathlib import Path
from typing import Any

# The distribution that ships each backend (its version goes into the identity).
_PACKAGES = {"xgrammar": "xgrammar", "outlines": "outlines_core"}


def cache_identity(spec: Any) -> str:
    """A hex digest naming one (backend, tokenizer, compile code) combination. ``spec``: the
    backend's ``registry.BackendSpec`` (name, tokenizer, vocab_size, eos_token_ids)."""
    h = hashlib.sha256()
    for part in (spec.name, package_version(_PACKAGES.get(spec.name, spec.name)),
                 package_version("sgdsl"), code_digest(), tokenizer_digest(spec.tokenizer),
                 str(spec.vocab_size), ",".join(map(str, spec.eos_token_ids))):
        h.update(part.encode("utf-8") + b"\0")
    return h.hexdigest()


def package_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 over the compile pipeline's sources: the whole grammar package, subpackages
    included, wherever in it this module lives."""
    h = hashlib.sha256()
    package = __name__[:__name__.rindex(".grammar") + len(".grammar")]
    root = Path(importlib.import_module(package).__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode("utf-8") + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def tokenizer_digest(tokenizer: Any) -> str:
    """sha256 of the tokenizer's full serialized form (a fast tokenizer's JSON: ~80 ms at a
    49k vocabulary), else of its vocabulary and added tokens."""
    h = hashlib.sha256(type(tokenizer).__name__.encode("utf-8") + b"\0")
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        h.update(backend.to_str().encode("utf-8"))
    else:
        vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
        h.update(repr(vocab).encode("utf-8"))
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    h.update(repr(sorted((int(i), str(t)) for i, t in added.items())).encode("utf-8"))
    return h.hexdigest()
