"""Test helpers: unpack a bitmask row, walk a grammar with random allowed tokens, share warm
compilers, wrap a grammar in the unique-keys guard as served, sample JSON from an engine."""
from __future__ import annotations

import asyncio
import json
import random

import torch

from sgdsl.runtime.grammar import Grammar, GrammarCompiler, GrammarKey, allocate_bitmask
from sgdsl.runtime.layers.bitmask import unpack_bitmask

VOCAB = 49152
EOS = 2
_CLOSERS = ('"', "}", "]", ",", ":")
_SHARED: dict[int, GrammarCompiler] = {}
_COMPILED: dict[tuple[int, str], object] = {}  # (backend, schema text) -> compiled grammar


def shared_compiler(backend) -> GrammarCompiler:
    """One compiler per backend for the whole session: its worker processes take seconds to
    start, so managers built per test share it (``GrammarManager(..., compiler=...)``)."""
    if id(backend) not in _SHARED:
        compiler = GrammarCompiler(backend, timeout_s=30.0)
        compiler.compile(GrammarKey("regex", "[a-z]"))  # warm: tests step schedulers a bounded
        _SHARED[id(backend)] = compiler  # number of times, which a cold start could outlast
    return _SHARED[id(backend)]


def shutdown_shared_compilers() -> None:
    while _SHARED:
        _SHARED.popitem()[1].shutdown()


def run_to_end(runner, config, manager, requests: list, max_steps: int = 2000) -> dict:
    """Step a Scheduler over ``requests`` (TokenizedGenerateReq) until it idles; rid ->
    {"ids", "finish"}. Shuts ``manager`` down and asserts the idle invariant (every request
    done, every slot free or cached)."""
    from sgdsl.runtime.scheduler.scheduler import Scheduler

    outs: dict = {}

    def send(msg) -> None:
        for o in msg.outs:
            rec = outs.setdefault(o.rid, {"ids": [], "finish": None})
            rec["ids"] += o.new_ids
            rec["finish"] = o.finish_reason or rec["finish"]
    sched = Scheduler(runner, config, [EOS], None, send, grammar=manager)
    for req in requests:
        sched.handle(req)
    for _ in range(max_steps):
        if not sched.step():
            break
    manager.shutdown()
    assert sched._integrity_resp(0).ok
    return outs


def guarded(backend, quotes, schema: dict) -> Grammar:
    """``schema``'s grammar on ``backend`` wrapped as the runtime wraps it (``guard_keys``:
    unique keys and items, runtime string lengths); asserts it is wrapped."""
    from sgdsl.runtime.grammar.guards.unique_keys import UniqueKeyGrammar, guard_keys

    key = GrammarKey.from_constraint("json_schema", json.dumps(schema))
    if (id(backend), key.text) not in _COMPILED:  # compiled once: walks take many grammars
        _COMPILED[id(backend), key.text] = backend.compile(key)
    g = guard_keys(backend.new_grammar(_COMPILED[id(backend), key.text]), key, quotes,
                   backend.name)
    assert isinstance(g, UniqueKeyGrammar)
    return g


def spaced(backend, text: str) -> str:
    """``text`` in the backend's separators: outlines writes compact JSON, xgrammar ", "/": "."""
    return text if backend.name == "outlines" else text.replace(",", ", ").replace(":", ": ")


def hot_outputs(engine, prompt: str, schema: dict, seeds: int, max_new_tokens: int) -> list:
    """The engine's outputs for ``prompt`` under ``schema`` at temperature 1.0, one per seed,
    all in flight together."""
    async def one(seed: int) -> dict:
        return await engine.async_generate(prompt, {
            "json_schema": json.dumps(schema), "temperature": 1.0, "seed": seed,
            "max_new_tokens": max_new_tokens})

    async def run() -> list[dict]:
        return await asyncio.gather(*(one(seed) for seed in range(seeds)))

    return asyncio.run(run())


def allowed_mask(grammar: Grammar) -> torch.Tensor:
    row = allocate_bitmask(1, VOCAB)
    grammar.fill_bitmask(row, 0)
    return unpack_bitmask(row, VOCAB)[0]


def allowed_ids(grammar: Grammar) -> list[int]:
    return torch.nonzero(allowed_mask(grammar)).flatten().tolist()


def feed_text(grammar: Grammar, tokenizer, text: str) -> bool:
    return grammar.accept_tokens(tokenizer.encode(text, add_special_tokens=False))


class Walker:
    """Random walks biased toward short and closing tokens, so walks tend to finish."""

    def __init__(self, tokenizer, texts: list[str]) -> None:
        self.tokenizer = tokenizer
        self.short = torch.tensor([len(t) <= 2 for t in texts])
        self.closing = torch.tensor([any(c in t for c in _CLOSERS) for t in texts])

    def walk(self, grammar: Grammar, rng: random.Random, max_steps: int = 400) -> tuple[str, bool]:
        """Returns (text, completed-with-eos)."""
        ids: list[int] = []
        for _ in range(max_steps):
            allowed = allowed_mask(grammar)
            assert bool(allowed.any()), "grammar allows no token before terminating"
            if allowed[EOS] and (int(allowed.sum()) == 1 or rng.random() < 0.7):
                assert grammar.accept_token(EOS)
                return self.tokenizer.decode(ids), True
            allowed[EOS] = False
            pool = allowed & self.short if bool((allowed & self.short).any()) else allowed
            closing = pool & self.closing
            if bool(closing.any()) and rng.random() < 0.6:
                pool = closing
            choices = torch.nonzero(pool).flatten()
            pick = int(choices[rng.randrange(len(choices))])
            assert grammar.accept_token(pick), pick
            ids.append(pick)
        return self.tokenizer.decode(ids), False

    def valid_walks(self, new_grammar, schema: dict, rng: random.Random, walks: int,
                    max_steps: int = 400) -> int:
        """Walk ``walks`` fresh grammars (``new_grammar()``); every finished output must be
        valid under ``schema`` (jsonschema: uniqueItems too). How many finished."""
        import jsonschema

        done = 0
        for _ in range(walks):
            text, complete = self.walk(new_grammar(), rng, max_steps)
            if complete:
                jsonschema.validate(json.loads(text), schema)
                done += 1
        return done
