"""What an xgrammar compile worker ships to the scheduler process (``XGrammarBackend.ship``,
``ship_again`` / ``receive``, ``xgrammar_transfer.py``): the source for the request, then, for
the on-disk cache and where that loads faster, the compiled grammar (serialized) with its
source. Either way the grammar gives the masks of an in-process compile, in this process and
through a real worker and its disk file; a serialized part that is damaged, of another xgrammar
version or another tokenizer is never used (the source is compiled instead, with a log line);
the older formats still load."""
from __future__ import annotations

import dataclasses
import json
import logging
import random
import time

import numpy as np
import torch

from sgdsl.runtime.grammar import GrammarCompiler, GrammarKey, allocate_bitmask
from sgdsl.runtime.grammar.backends.xgrammar_transfer import (SHIP_ENV, XGrammarPayload,
                                                              worth_serializing)
from sgdsl.runtime.grammar.compile.pool_limits import PoolLimits

from ..helpers import VOCAB

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
          "required": ["name", "tags"]}
REFS = {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"},
                                                             "y": {"type": "number"}},
                            "required": ["x", "y"]}},
        "type": "object", "properties": {"a": {"$ref": "#/$defs/point"},
                                         "kind": {"anyOf": [{"const": "line"},
                                                            {"type": "null"}]}},
        "required": ["a", "kind"]}
KEYS = [GrammarKey("json_schema", json.dumps(SCHEMA)), GrammarKey("json_schema", json.dumps(REFS)),
        GrammarKey("json_object", ""), GrammarKey("regex", r"[0-9]{2}-(ab|cd)+x"),
        GrammarKey("ebnf", 'root ::= "(" item ("," item)* ")"\nitem ::= [a-z]+ | "n" [0-9]'),
        GrammarKey.choices(["yes", "no", "maybe"])]


def _same_masks(a, b, seed: int = 0, steps: int = 40) -> None:
    """Walk ``a`` and ``b`` in lockstep on random allowed tokens: equal rows at every step."""
    rng = random.Random(seed)
    rows = allocate_bitmask(2, VOCAB)
    for _ in range(steps):
        assert a.is_terminated() == b.is_terminated()
        if a.is_terminated():
            return
        a.fill_bitmask(rows, 0)
        b.fill_bitmask(rows, 1)
        assert torch.equal(rows[0], rows[1])
        assert a.jump_forward_string() == b.jump_forward_string()
        bits = np.unpackbits(rows[0].numpy().view(np.uint8), bitorder="little")[:VOCAB]
        token = int(rng.choice(bits.nonzero()[0].tolist()))
        assert a.accept_token(token) and b.accept_token(token)


def _payload(compiled, serialized: str | None) -> bytes:
    return XGrammarPayload(compiled.json, compiled.source, serialized).pack()


def test_serialized_transfer_gives_the_masks_of_a_compile(backends, monkeypatch):
    backend = backends["xgrammar"]
    monkeypatch.setenv(SHIP_ENV, "compiled")
    for i, key in enumerate(KEYS):
        compiled = backend.compile(key)
        assert XGrammarPayload.unpack(backend.ship(compiled)).serialized is None
        shipped = backend.ship_again(compiled)
        assert XGrammarPayload.unpack(shipped).serialized is not None
        received = backend.receive(shipped)
        assert received.compile_s == 0 and received.source == compiled.source  # not compiled
        assert received.json == compiled.json
        _same_masks(backend.new_grammar(compiled), backend.new_grammar(received), seed=i)


def test_source_transfer_compiles_again(backends, monkeypatch):
    backend = backends["xgrammar"]
    monkeypatch.setenv(SHIP_ENV, "source")
    compiled = backend.compile(KEYS[0])
    assert backend.ship_again(compiled) is None
    shipped = backend.ship(compiled)
    assert shipped[1:2] == b"[" and len(shipped) < 1000
    received = backend.receive(shipped)
    assert received.compile_s > 0
    _same_masks(backend.new_grammar(compiled), backend.new_grammar(received))


def test_worker_grammars_give_the_masks_of_in_process_compiles(backends, monkeypatch, tmp_path):
    """Through a real worker process, the serialized transfer pinned (the worker reads the
    variable at each compile; it inherits the environment at start): the request's grammar is
    compiled here from the source; the disk file, written after, holds the serialized grammar,
    which loads without a compile."""
    import functools

    from sgdsl.runtime.grammar.compile.cache_identity import cache_identity
    from sgdsl.runtime.grammar.compile.disk_cache import GrammarDiskCache

    backend = backends["xgrammar"]
    monkeypatch.setenv(SHIP_ENV, "compiled")
    disk = GrammarDiskCache(tmp_path, backend.name,
                            functools.partial(cache_identity, backend.spec), 1 << 30)
    c = GrammarCompiler(backend, timeout_s=120, pool=PoolLimits(workers=1), disk=disk)
    try:
        for i, key in enumerate(KEYS):
            from_worker = c.compile(key)
            assert c._cache[key].future.result()[0].compile_s > 0  # its source, compiled here
            _same_masks(from_worker, backend.new_grammar(backend.compile(key)), seed=i)
        deadline = time.monotonic() + 120  # written after the request: shutdown would cut it
        while disk.stats.writes < len(KEYS) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        c.shutdown()
    for i, key in enumerate(KEYS):
        payload = disk.load(key)
        assert XGrammarPayload.unpack(payload).serialized is not None, key
        loaded = backend.receive(payload)
        assert loaded.compile_s == 0  # deserialized, not compiled
        _same_masks(backend.new_grammar(loaded), backend.new_grammar(backend.compile(key)),
                    seed=i)


def test_damaged_or_foreign_serialized_part_compiles_the_source(backends, caplog):
    backend = backends["xgrammar"]
    compiled = backend.compile(KEYS[1])
    text = compiled.grammar.serialize_json()
    good = _payload(compiled, text)
    flipped = bytearray(good)
    flipped[-50] ^= 0x01  # inside the serialized JSON, past the digest
    doc = json.loads(text)
    other_version = json.dumps({**doc, "__VERSION__": "v0"})
    other_tokenizer = json.dumps({**doc, "tokenizer_metadata": {
        **doc["tokenizer_metadata"], "vocab_size": VOCAB + 64}})
    for data, log in [(bytes(flipped), "damaged"),
                      (_payload(compiled, other_version), "does not load"),
                      (_payload(compiled, other_tokenizer), "does not load"),
                      (_payload(compiled, "{not json"), "does not load")]:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            received = backend.receive(data)
        assert received.compile_s > 0, log  # compiled from the source, not loaded
        assert any(log in r.getMessage() for r in caplog.records), log
        _same_masks(backend.new_grammar(compiled), backend.new_grammar(received))


def test_older_formats_still_load(backends):
    """Source only (the previous transfer) and serialized only (``serialize``; an older
    disk-cache file) both load; a grammar loaded without a source ships as it came."""
    backend = backends["xgrammar"]
    compiled = backend.compile(KEYS[0])
    from_source = backend.receive(_payload(compiled, None))
    loaded = backend.receive(backend.serialize(compiled))
    assert loaded.source is None and loaded.json and from_source.compile_s > 0
    for other in (from_source, loaded):
        _same_masks(backend.new_grammar(compiled), backend.new_grammar(other))
    assert backend.receive(backend.ship(loaded)).json


def test_serialize_out_of_memory_leaves_the_source(backends, monkeypatch):
    """A serialize past the worker's memory budget must not fail a compile that fit it: the
    worker's answer then carries nothing and the source stands (on disk)."""
    from sgdsl.runtime.grammar.compile.worker import _again

    backend = backends["xgrammar"]
    monkeypatch.setenv(SHIP_ENV, "compiled")
    compiled = backend.compile(KEYS[0])

    class Huge:
        memory_size_bytes = compiled.grammar.memory_size_bytes

        def serialize_json(self):
            raise MemoryError

    huge = dataclasses.replace(compiled, grammar=Huge())
    assert backend.may_ship_again(huge) and _again(backend, huge) is None


def test_rule_serializes_where_the_transfer_is_cheaper(monkeypatch):
    monkeypatch.delenv(SHIP_ENV, raising=False)
    assert not worth_serializing(0.05, 1 << 20)  # a fast compile of a big grammar
    assert worth_serializing(4.0, 1 << 20)  # a slow compile of a small one
    monkeypatch.setenv(SHIP_ENV, "source")
    assert not worth_serializing(4.0, 1 << 20)
