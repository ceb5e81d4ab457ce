"""Engine facade on a tiny random-weight Llama (only shapes matter here): output shapes, streams,
async use, n > 1, stop strings, prefill-only logprobs, aborts, bad input. The ``engine`` fixture
asserts the scheduler's idle invariant after every test."""
from __future__ import annotations

import asyncio
import threading

import pytest

from sgdsl.runtime.errors import ContextLengthError, InvalidRequestError

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


def test_single_batch_and_input_ids(engine):
    one = engine.generate("Hello there", GREEDY)
    assert set(one) == {"text", "output_ids", "meta_info"}
    meta = one["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 8}
    assert meta["completion_tokens"] == len(one["output_ids"]) == 8
    assert meta["prompt_tokens"] == len(engine.tokenizer.encode("Hello there"))
    assert one["text"] == engine.tokenizer.decode(one["output_ids"])
    many = engine.generate(["Hello there", "A much longer prompt with more tokens in it"], GREEDY)
    assert isinstance(many, list) and len(many) == 2
    assert many[0]["output_ids"] == one["output_ids"]  # greedy is deterministic across batches
    assert many[0]["meta_info"]["cached_tokens"] > 0  # the first call cached the prompt
    ids = engine.tokenizer.encode("Hello there")
    by_ids = engine.generate(input_ids=ids, sampling_params=GREEDY)
    assert by_ids["output_ids"] == one["output_ids"]


def test_stream_is_cumulative_and_ends_with_finish(engine):
    full = engine.generate("Stream me", GREEDY)
    chunks = list(engine.generate("Stream me", GREEDY, stream=True))
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert "".join(c["delta"] for c in chunks) == full["text"] == chunks[-1]["text"]
    for prev, cur in zip(chunks, chunks[1:]):
        assert cur["text"].startswith(prev["text"])


async def test_async_generate_and_stream_from_another_loop(engine):
    res = await engine.async_generate("Async hello", GREEDY)
    assert res["meta_info"]["completion_tokens"] == 8
    texts = [c["delta"] async for c in await engine.async_generate("Async hello", GREEDY,
                                                                   stream=True)]
    assert "".join(texts) == res["text"]
    both = await asyncio.gather(engine.async_generate("a b c", GREEDY),
                                engine.async_generate("d e f", GREEDY))
    assert [b["meta_info"]["completion_tokens"] for b in both] == [8, 8]


def test_generate_from_many_threads(engine):
    results: dict[int, dict] = {}

    def work(i: int) -> None:
        results[i] = engine.generate(f"thread {i} says", GREEDY)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == [0, 1, 2, 3]
    assert all(r["meta_info"]["completion_tokens"] == 8 for r in results.values())


def test_n_samples_share_prefix(engine):
    params = {"temperature": 1.0, "max_new_tokens": 6, "n": 3, "seed": 7, "ignore_eos": True}
    outs = engine.generate("Pick a number", params, rid="nreq")
    assert len(outs) == 3
    assert [o["meta_info"]["id"] for o in outs] == ["nreq-0", "nreq-1", "nreq-2"]
    assert all(o["meta_info"]["cached_tokens"] > 0 for o in outs)
    assert len({tuple(o["output_ids"]) for o in outs}) > 1  # different seeds, different samples
    again = engine.generate("Pick a number", params)
    assert [o["output_ids"] for o in again] == [o["output_ids"] for o in outs]  # seeded


def test_stop_string_is_trimmed_and_never_streamed(engine):
    params = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    full = engine.generate("Tell me something", params)
    text = full["text"]
    stop = engine.tokenizer.decode(full["output_ids"][4:6])
    assert stop and stop in text
    res = engine.generate("Tell me something", {**params, "stop": [stop]})
    assert res["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert res["text"] == text[: text.find(stop)]
    chunks = list(engine.generate("Tell me something", {**params, "stop": stop}, stream=True))
    assert "".join(c["delta"] for c in chunks) == res["text"]
    kept = engine.generate("Tell me something", {**params, "stop": [stop], "no_stop_trim": True})
    assert kept["text"].endswith(stop)


def test_stop_token_and_max_tokens(engine):
    params = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}
    full = engine.generate("Numbers:", params)["output_ids"]
    res = engine.generate("Numbers:", {**params, "stop_token_ids": [full[3]]})
    assert res["output_ids"] == full[: full.index(full[3]) + 1]
    assert res["meta_info"]["finish_reason"] == {"type": "stop", "matched": full[3]}
    short = engine.generate("Numbers:", {**params, "max_new_tokens": 2})
    assert short["output_ids"] == full[:2]


def test_prefill_only_prompt_logprobs(engine):
    res = engine.generate("Score this prompt please", {"max_new_tokens": 0}, return_logprob=True,
                          logprob_start_len=0, top_logprobs_num=3, return_text_in_logprobs=True)
    meta = res["meta_info"]
    n = meta["prompt_tokens"]
    assert res["output_ids"] == [] and meta["finish_reason"] == {"type": "length", "length": 0}
    assert len(meta["input_token_logprobs"]) == n
    assert meta["input_token_logprobs"][0][0] is None
    assert all(lp <= 0 for lp, _, _ in meta["input_token_logprobs"][1:])
    assert meta["input_top_logprobs"][0] is None
    assert all(len(t) == 3 for t in meta["input_top_logprobs"][1:])
    ids = engine.tokenizer.encode("Score this prompt please")
    assert [t for _, t, _ in meta["input_token_logprobs"]] == ids
    tail = engine.generate("Score this prompt please", {"max_new_tokens": 0},
                           return_logprob=True, logprob_start_len=2)["meta_info"]
    assert tail["input_token_logprobs"] == [e[:2] + [None] for e in meta["input_token_logprobs"][2:]]


def test_output_logprobs(engine):
    res = engine.generate("Logprobs out", GREEDY, return_logprob=True, top_logprobs_num=2)
    meta = res["meta_info"]
    assert [t for _, t, _ in meta["output_token_logprobs"]] == res["output_ids"]
    for (lp, tok, _), tops in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
        assert tops[0][1] == tok and abs(tops[0][0] - lp) < 1e-5  # greedy picks the top token


def test_abort_running_request(engine):
    params = {"temperature": 0, "max_new_tokens": 400, "ignore_eos": True}
    result: dict = {}

    def run() -> None:
        result["r"] = engine.generate("Never ending", params, rid="to-abort")

    t = threading.Thread(target=run)
    t.start()
    stream = engine.generate("Warm", GREEDY, stream=True)  # let the scheduler start it
    list(stream)
    engine.abort("to-abort")
    t.join(timeout=120)
    meta = result["r"]["meta_info"]
    assert meta["finish_reason"]["type"] == "abort"
    assert meta["completion_tokens"] < 400


def test_stream_closed_early_aborts(engine):
    params = {"temperature": 0, "max_new_tokens": 300, "ignore_eos": True}
    gen = engine.generate("Long stream", params, stream=True)
    first = next(gen)
    assert first["meta_info"]["finish_reason"] is None
    gen.close()  # the engine aborts the request; the fixture then checks nothing leaked


@pytest.mark.parametrize("params, field", [
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"max_new_tokens": -3}, "max_new_tokens"),
    ({"bogus": 1}, "bogus"),
    ({"stop_token_ids": [10**9]}, "stop_token_ids"),
])
def test_bad_sampling_params_name_the_field(engine, params, field):
    with pytest.raises(InvalidRequestError) as info:
        engine.generate("hi", params)
    assert info.value.field == field


def test_bad_prompts_and_context_length(engine):
    with pytest.raises(InvalidRequestError) as info:
        engine.generate("", GREEDY)
    assert info.value.field == "prompt"
    with pytest.raises(InvalidRequestError) as info:
        engine.generate(input_ids=[1, 2, 49152], sampling_params=GREEDY)
    assert info.value.field == "input_ids"
    with pytest.raises(ContextLengthError) as info:
        engine.generate("hi there", {"max_new_tokens": 600})
    assert "600" in str(info.value) and "512" in str(info.value)
    with pytest.raises(InvalidRequestError) as info:
        engine.generate("hi", GREEDY, logprob_start_len=99)
    assert info.value.field == "logprob_start_len"
    # The engine keeps serving.
    assert engine.generate("still alive", GREEDY)["meta_info"]["completion_tokens"] == 8


def test_stats_flush_and_info(engine):
    engine.generate("fill the cache", GREEDY)
    stats = engine.stats()
    assert stats["kv_total_slots"] == 4096 and stats["num_running_reqs"] == 0
    assert stats["kv_evictable_slots"] > 0
    assert stats["kv_free_slots"] + stats["kv_evictable_slots"] == 4096
    assert engine.flush_cache() is True
    assert engine.stats()["kv_evictable_slots"] == 0
    info = engine.model_info
    assert info["context_length"] == 512 and info["vocab_size"] == 49152
    assert info["eos_token_ids"] == [2]
    assert engine.server_info()["max_total_tokens"] == 4096


async def test_cancelled_async_generate_aborts(engine):
    params = {"temperature": 0, "max_new_tokens": 500, "ignore_eos": True}
    before = (await asyncio.to_thread(engine.stats))["generated_tokens_total"]
    task = asyncio.ensure_future(engine.async_generate("Cancel me", params, rid="cancel-me"))
    # NOTE: cancel as soon as the request runs (a fixed sleep can outlast 500 fast tokens).
    for _ in range(600):
        if (await asyncio.to_thread(engine.stats))["num_running_reqs"]:
            break
        await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(600):
        stats = await asyncio.to_thread(engine.stats)
        if stats["num_running_reqs"] == 0 and stats["num_waiting_reqs"] == 0:
            break
        await asyncio.sleep(0.1)
    # An aborted request never counts as generated; one left running would add 500 tokens.
    assert stats["generated_tokens_total"] == before


def test_constrained_meta_reports_unsampled_positions(engine):
    """A grammar request's meta_info lists the output positions the grammar filled without
    sampling (the notebook view marks them); an unconstrained one has no such key."""
    regex = "Answer: (yes|no)\\. That is all I can say about it, thank you"
    out = engine.generate("Q?", {"temperature": 0, "max_new_tokens": 40, "regex": regex})
    forced = out["meta_info"]["forced_token_positions"]
    assert forced == sorted(set(forced)) and all(0 <= p < len(out["output_ids"]) for p in forced)
    assert len(forced) >= len(out["output_ids"]) - 4, (forced, out["output_ids"])
    assert "forced_token_positions" not in engine.generate("Q?", GREEDY)["meta_info"]


def test_list_answers_are_built_as_each_request_finishes(engine, monkeypatch):
    """A list call builds each request's answer (text, dict) when that request finishes, once,
    not all of them after the last one finished (issue 29: the answers were built on the path
    the caller waits for)."""
    from sgdsl.runtime.tokenizer.req_state import ReqState

    events: list[tuple[str, str]] = []
    apply, result = ReqState.apply, ReqState.result

    def logged_apply(self, out):
        apply(self, out)
        if out.finish_reason is not None:
            events.append(("finished", self.rid))

    def logged_result(self):
        events.append(("built", self.rid))
        return result(self)
    monkeypatch.setattr(ReqState, "apply", logged_apply)
    monkeypatch.setattr(ReqState, "result", logged_result)
    outs = engine.generate(input_ids=[[5, 6, 7], [8, 9, 10]], rid=["short", "long"],
                           sampling_params=[{"max_new_tokens": 1, "ignore_eos": True},
                                            {"max_new_tokens": 12, "ignore_eos": True}])
    assert [len(o["output_ids"]) for o in outs] == [1, 12]
    assert [o["meta_info"]["id"] for o in outs] == ["short", "long"]
    assert events.index(("built", "short")) < events.index(("finished", "long"))
    assert [e for e in events if e[0] == "built"] == [("built", "short"), ("built", "long")]
