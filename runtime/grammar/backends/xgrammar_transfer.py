"""``XGrammarPayload``: what an xgrammar compile worker sends its parent (and the on-disk cache
keeps), and the rule deciding whether it carries the compiled grammar or only its source.

xgrammar 0.2.8 serializes a compiled grammar one way, ``CompiledGrammar.serialize_json``: its
token-mask tables as JSON text (no pickling: its handle has no reflection), 1.3-28x the
grammar's memory on the real-world schemas. Writing it cost 2.6x the compile at the median
(far more on a few: a 1.4 MB grammar once took 7.4 s, another 18 GB), reading it back about a
compile (less on the slow ones). So a request always gets the source (the worker's compile
fit the deadline; the parent compiles it again), and only the on-disk cache gets, where the
expected serialize + deserialize is cheaper than a compile (``worth_serializing``), the
serialized grammar with its source, made after the request was served (``worker_pool.py``:
under a deadline of its own; past it or out of memory the source is stored): a restart then
loads instead of compiling. Serializing on the request's path once cost admissions 3x where
this rule misjudged the JSON's size (16x the grammar's memory). Measured in
benchmarks/RESULTS.md ("Compile once", "Serialize for the disk only").

The bytes (the first byte: ``j`` for a JSON kind, ``-`` otherwise)::

    kind "[" ...                   the source only: JSON [xgrammar call, its text]
    kind "{" ...                   serialize_json only (no source; written by older trees)
    kind "S" len(8) source digest(32) serialized
                                   both; digest: sha256 of the serialized text

A serialized part that is damaged (its digest), from another xgrammar version or for another
tokenizer is never used: the parent compiles the source instead and logs why, so a bad payload
costs a compile, never a wrong mask.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass

# Expected cost of the transfer per byte of compiled grammar (``memory_size_bytes``): serialize
# plus deserialize took 1-13 us per byte over the real-world suite (the JSON text is 1.3-28x
# the grammar's memory; benchmarks/bench_compile_stages.py, RESULTS.md "Compile once"), where a
# compile took 0.3-5 us per byte. At 3 us only the compile-heavy, table-light grammars ship
# serialized (bounded repetitions: 5.6 s to compile, 2.1 s to transfer); typical ones, whose
# transfer costs ~2.4x their compile, ship their source.
TRANSFER_S_PER_BYTE = 3.0e-6
# "auto" (the rule below), "source" (never serialize) or "compiled" (always, memory allowing):
# read by the worker at each compile, for tests and benchmarks that pin one transfer
SHIP_ENV = "SGDSL_XGRAMMAR_SHIP"
_BOTH = b"S"
_LEN = struct.Struct(">Q")
_DIGEST = 32


@dataclass(frozen=True)
class XGrammarPayload:
    """One compiled grammar in transit: whether it is a JSON kind, its source (xgrammar call,
    text; None in the old serialized-only form) and its ``serialize_json`` text (None: source
    only)."""

    json_kind: bool
    source: tuple[str, str] | None
    serialized: str | None = None
    damaged: bool = False  # a serialized part came and failed its digest (dropped)

    def pack(self) -> bytes:
        kind = b"j" if self.json_kind else b"-"
        if self.serialized is None:
            return kind + json.dumps(self.source).encode("utf-8")
        source = json.dumps(self.source).encode("utf-8")
        text = self.serialized.encode("utf-8")
        return b"".join((kind, _BOTH, _LEN.pack(len(source)), source,
                         hashlib.sha256(text).digest(), text))

    @classmethod
    def unpack(cls, data: bytes) -> "XGrammarPayload":
        """The payload of ``data``; raises ValueError for bytes in none of the formats. A
        serialized part that fails its digest is dropped (``damaged``; the source remains)."""
        json_kind, mark = data[:1] == b"j", data[1:2]
        if mark == b"[":
            call, text = json.loads(data[1:].decode("utf-8"))
            return cls(json_kind, (call, text))
        if mark == b"{":
            return cls(json_kind, None, data[1:].decode("utf-8"))
        if mark != _BOTH or len(data) < 2 + _LEN.size:
            raise ValueError("not an xgrammar payload")
        end = 2 + _LEN.size + _LEN.unpack_from(data, 2)[0]
        call, text = json.loads(data[2 + _LEN.size:end].decode("utf-8"))
        digest, body = data[end:end + _DIGEST], data[end + _DIGEST:]
        if hashlib.sha256(body).digest() != digest:
            return cls(json_kind, (call, text), damaged=True)
        return cls(json_kind, (call, text), body.decode("utf-8"))


def worth_serializing(compile_s: float, grammar_bytes: int) -> bool:
    """Ship the compiled grammar (not only its source) if the expected transfer is cheaper
    than the parent's second compile (``SHIP_ENV`` may pin the answer)."""
    policy = os.environ.get(SHIP_ENV, "auto")
    if policy in ("source", "compiled"):
        return policy == "compiled"
    return TRANSFER_S_PER_BYTE * grammar_bytes < compile_s
