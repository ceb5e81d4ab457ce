"""Constrained strings stay valid UTF-8 and within their length bounds in every configuration:
jump-forward on/off x forced completion on/off, on both grammar backends.

The model is a random one that favours odd byte tokens: a random logits row picked by a hash
of the sequence (``OddByteRunner``), raised for every token that is not whole characters (lone
lead or continuation bytes, pieces of a multi-byte character), run through the real scheduler
and grammar manager. Before the fix every xgrammar configuration here failed (4-11 invalid
outputs of 32 each). On xgrammar such walks wrote
surrogates and overlong sequences (``ED A0 80``, ``F0 86 83 90``): the grammar counted one
character for each, the decoded text a U+FFFD per byte, past ``maxLength``
(``grammar/guards/utf8_tokens.py`` says why and how the runtime keeps the output valid).
"""
from __future__ import annotations

import codecs
import json
import random

import jsonschema
import pytest
import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.grammar.forcing.completion import CompletionConfig
from sgdsl.runtime.grammar.manager import GrammarManager
from sgdsl.runtime.grammar.guards.utf8_tokens import BOUNDARY, REJECT, Utf8Tokens
from sgdsl.runtime.grammar.vocab import token_bytes
from sgdsl.runtime.ipc import messages as m
from sgdsl.runtime.sampling_params import SamplingParams

from ..helpers import EOS, VOCAB, allowed_mask, run_to_end
from ..forcing.test_jump_logprobs import HashRunner

PERSON = {  # benchmarks/gpu/bench_structured_decode.py's schema
    "type": "object", "additionalProperties": False,
    "required": ["name", "age", "city", "occupation", "is_employed"],
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 20},
        "occupation": {"enum": ["engineer", "teacher", "doctor", "artist", "farmer", "other"]},
        "is_employed": {"type": "boolean"}}}
BOUNDS = {  # a pattern, short bounds in the grammar, a long one left to the runtime's count
    "type": "object", "additionalProperties": False, "required": ["code", "note", "story"],
    "properties": {
        "code": {"type": "string", "pattern": "^[^a-z]{2,8}$"},
        "note": {"type": "string", "minLength": 3, "maxLength": 6},
        "story": {"type": "string", "minLength": 2, "maxLength": 150}}}
SCHEMAS = {"person": PERSON, "bounds": BOUNDS}
CONFIGS = [(jump, forced) for jump in (True, False) for forced in (True, False)]
PER_RUN = 16  # requests per schema and configuration
_BANK = 64  # random logits rows of the stand-in model


@pytest.fixture(scope="module")
def odd_tokens(tokenizer) -> torch.Tensor:
    """Tokens that are not whole characters (their bytes leave a UTF-8 decoder mid-character
    or in error when they start at a character boundary)."""
    utf8 = Utf8Tokens(token_bytes(tokenizer, VOCAB), VOCAB)
    after = torch.frombuffer(bytearray(utf8.next[BOUNDARY]), dtype=torch.uint8)
    return after != BOUNDARY


class OddByteRunner(HashRunner):
    """``HashRunner``'s model (a logits row picked by a hash of the sequence read back from
    the KV pool) over a bank of random rows, the odd byte tokens raised above the rest."""

    def __init__(self, odd: torch.Tensor) -> None:
        super().__init__(num_slots=4096, max_reqs=2 * PER_RUN, context_len=256)
        gen = torch.Generator().manual_seed(0)
        self.bank = torch.randn(_BANK, VOCAB, generator=gen) * 3 + odd.float() * 8

    def forward(self, b) -> torch.Tensor:
        kv = self.token_kv_pool.k_buffer[0]
        kv[b.out_cache_loc, 0, 0] = b.input_ids.double()
        rows = []
        for i in range(b.batch_size):
            row, p = int(b.req_pool_indices[i]), b.extend_prefix_lens_cpu[i]
            for j in range(b.extend_seq_lens_cpu[i]):
                seq = kv[self.req_to_token_pool.req_to_token[row, :p + j + 1], 0, 0]
                rows.append(self.bank[hash(tuple(seq.long().tolist())) % _BANK])
        logits = torch.stack(rows)
        return logits if b.logits_indices is None else logits[b.logits_indices]


def _check(tokenizer, ids: list[int], finish: dict, schema: dict) -> bool:
    """The output's bytes (as the grammar saw them) are valid UTF-8 (a request cut by its
    budget may end inside a character); a finished value parses, validates (jsonschema
    counts lengths in characters) and is the text the tokenizer decodes. True if it has a
    character beyond ASCII."""
    tb = token_bytes(tokenizer, VOCAB)
    data = b"".join(tb[t] or b"" for t in ids if t != EOS)
    ended = finish.get("type") == "stop"
    text = codecs.getincrementaldecoder("utf-8")().decode(data, final=ended)
    if ended:
        jsonschema.validate(json.loads(text), schema)
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    return any(b >= 0x80 for b in data)


def _run(backend, compiler, tokenizer, odd, jump: bool, forced: bool) -> list:
    manager = GrammarManager(backend, tokenizer, VOCAB, [EOS], jump_forward=jump,
                             completion=CompletionConfig(enabled=forced,
                                                         async_estimates=False),
                             compiler=compiler)
    requests = []
    for name, schema in SCHEMAS.items():
        for i in range(PER_RUN):
            prompt = tokenizer.encode(f"{name} {i} {jump} {forced}:", add_special_tokens=False)
            # NOTE: greedy: the model is random already (the sampler's noise over the
            # vocabulary was most of the test's time)
            params = SamplingParams(max_new_tokens=96, temperature=0.0,
                                    json_schema=json.dumps(schema))
            requests.append(m.TokenizedGenerateReq(f"{name}/{i}", prompt, params))
    outs = run_to_end(OddByteRunner(odd), EngineConfig(max_running_requests=2 * PER_RUN),
                      manager, requests)
    return [(rid.split("/")[0], o["ids"], o["finish"]) for rid, o in outs.items()]


@pytest.mark.parametrize("jump,forced", CONFIGS,
                         ids=[f"jump_{j}-forced_{f}" for j, f in CONFIGS])
def test_strings_stay_valid_utf8_within_bounds(backend, compilers, tokenizer, odd_tokens,
                                               jump, forced):
    results = _run(backend, compilers[backend.name], tokenizer, odd_tokens, jump, forced)
    wide = 0
    for name, ids, finish in results:
        assert finish is not None and finish.get("type") != "abort", (ids, finish)
        wide += _check(tokenizer, ids, finish, SCHEMAS[name])
    assert wide >= len(results) // 2  # the model did write multi-byte characters
    if forced:  # every request ends in a complete value
        assert all(f["type"] == "stop" for _, _, f in results), results


def test_matcher_refuses_invalid_utf8(backends, tokenizer):
    """A surrogate (``ED A0 80``) inside a string: refused by the accept and absent from the
    mask on both backends, while a valid character (``ED 9F BF``, U+D7FF) goes through."""
    tb = token_bytes(tokenizer, VOCAB)
    single = {b[0]: i for i, b in enumerate(tb) if b is not None and len(b) == 1}
    key_text = json.dumps({"type": "string"})
    from sgdsl.runtime.grammar import GrammarKey

    for backend in backends.values():
        grammar = backend.new_grammar(backend.compile(
            GrammarKey.from_constraint("json_schema", key_text)))
        assert grammar.accept_token(single[ord('"')]) and grammar.accept_token(single[0xED])
        mask = allowed_mask(grammar)
        assert not mask[single[0xA0]] and mask[single[0x9F]], backend.name
        assert not grammar.accept_token(single[0xA0]), backend.name
        assert grammar.accept_token(single[0x9F]) and grammar.accept_token(single[0xBF])
        assert grammar.accept_token(single[ord('"')]) and grammar.is_completed()


def test_utf8_tables_follow_the_decoder():
    """Every token of 1-3 random bytes: the table's verdict from each state is Python's
    decoder's on the bytes that lead to that state plus the token."""
    rng = random.Random(0)
    leads = {BOUNDARY: b"", 1: b"\xc3", 2: b"\xe1", 3: b"\xf1", 4: b"\xe0", 5: b"\xed",
             6: b"\xf0", 7: b"\xf4"}
    tokens = [bytes(rng.randrange(256) for _ in range(rng.randint(1, 3))) for _ in range(1500)]
    utf8 = Utf8Tokens(tokens + [None], len(tokens) + 1)
    for state, lead in leads.items():
        for t, data in enumerate(tokens):
            valid = any(_decodes(lead + data + bytes([c]) * k) for c in _FILL for k in range(4))
            assert (utf8.after(state, t) != REJECT) == valid, (state, data)
        assert (utf8.after(state, len(tokens)) != REJECT) == (state == BOUNDARY)


_FILL = (0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF)  # continuation bytes that finish any valid start


def _decodes(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False
