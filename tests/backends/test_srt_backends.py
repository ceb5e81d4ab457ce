"""Local and RuntimeEndpoint against the fake runtime: request shapes, select scoring at token
boundaries, streaming, cancellation and errors (one test body, both transports)."""
from __future__ import annotations

import asyncio

import pytest

from sgdsl.backends.base import BackendError, Context, UnsupportedError
from sgdsl.backends.local import Local
from sgdsl.ir import Constraint, SamplingParams
from srt_fakes import EOS, FakeEngine, FakeRuntime, logprob, make_endpoint, tokenize


async def test_generate_maps_sampling_params(srt_backend, runtime):
    params = SamplingParams(max_tokens=4, min_tokens=1, stop=("\n",), temperature=0.0,
                            top_k=5, return_logprob=True, top_logprobs_num=2)
    [result] = await srt_backend.generate(Context(text="hello"), params)
    req = runtime.requests[-1]
    assert req["text"] == "hello"
    assert req["sampling_params"] == {"max_new_tokens": 4, "min_new_tokens": 1, "stop": ["\n"],
                                      "temperature": 0.0, "top_k": 5}
    assert req["return_logprob"] is True and req["top_logprobs_num"] == 2
    assert result.text == "xyxy"
    assert result.meta_info["prompt_tokens"] == 5 and result.meta_info["completion_tokens"] == 4
    assert result.meta_info["finish_reason"] == {"type": "length", "length": 4}


async def test_native_n_returns_n_results(srt_backend, runtime):
    results = await srt_backend.generate(Context(text="q"), SamplingParams(max_tokens=2, n=2))
    assert [r.text for r in results] == ["xy", "yx"]
    assert runtime.requests[-1]["sampling_params"]["n"] == 2


@pytest.mark.parametrize("kind,value,sent", [
    ("regex", "[0-9]+", "[0-9]+"),
    ("json_schema", {"type": "integer"}, '{"type": "integer"}'),
    ("ebnf", 'root ::= "a"', 'root ::= "a"'),
])
async def test_constraints_are_sent_natively(srt_backend, runtime, kind, value, sent):
    assert kind in srt_backend.capabilities.constraints
    await srt_backend.generate(Context(text="q"), SamplingParams(max_tokens=1),
                               Constraint(kind=kind, value=value))
    assert runtime.requests[-1]["sampling_params"][kind] == sent


async def test_unlowered_constraint_is_refused_and_stop_regex_is_native(srt_backend, runtime):
    with pytest.raises(UnsupportedError, match="choices"):
        await srt_backend.generate(Context(text="q"), SamplingParams(),
                                   Constraint(kind="choices", value=("a", "b")))
    assert srt_backend.capabilities.stop_regex
    await srt_backend.generate(Context(text="q"), SamplingParams(stop_regex=("x+",)))
    assert runtime.requests[-1]["sampling_params"]["stop_regex"] == ["x+"]


def test_capabilities_follow_grammar_backend():
    backend = Local(engine=FakeEngine(FakeRuntime(grammar_backend="none")))
    assert backend.capabilities.constraints == frozenset()
    assert backend.capabilities.prompt_logprobs and backend.capabilities.native_n


async def test_score_choices_handles_token_boundary(srt_backend, runtime):
    ctx = "0123456789xa"  # 12 tokens; "a" + "b" merges into one token
    scores = await srt_backend.score_choices(Context(text=ctx), ["b", "cd"])
    prefill, window = runtime.requests[0], runtime.requests[1]
    assert prefill["sampling_params"] == {"max_new_tokens": 0} and prefill["text"] == ctx
    assert window["logprob_start_len"] == 12 - 8
    assert window["text"] == [ctx, ctx + "b", ctx + "cd"]
    # "b": the joined text re-tokenizes "a"+"b" as one token at position 11
    assert scores.token_logprobs[0] == (logprob(11, 1000),)
    assert scores.token_logprobs[1] == (logprob(12, ord("c")), logprob(13, ord("d")))
    assert scores.meta_info["choice_tokens"] == [[1000], [ord("c"), ord("d")]]
    assert scores.unconditional_logprobs is None


async def test_score_choices_unconditional(srt_backend, runtime):
    scores = await srt_backend.score_choices(Context(text="xa"), ["b", "cd"], unconditional=True)
    req = runtime.requests[-1]
    assert req["input_ids"] == [[EOS, 1000], [EOS, ord("c"), ord("d")]]
    assert scores.unconditional_logprobs == ((logprob(1, 1000),),
                                             (logprob(1, ord("c")), logprob(2, ord("d"))))
    assert [len(r) for r in scores.token_logprobs] == [1, 2]


async def test_select_picks_highest_mean_logprob(srt_backend):
    from sgdsl.choices import token_length_normalized

    choices = ["z", "c"]  # fake logprob falls with (id % 7): 'z'=122 -> 3, 'c'=99 -> 1
    scores = await srt_backend.score_choices(Context(text="q "), choices)
    expected = max(range(2), key=lambda i: sum(scores.token_logprobs[i]))
    assert expected == 1
    result = await srt_backend.select(Context(text="q "), choices, 0.0, token_length_normalized)
    assert result.index == expected


async def test_stream_yields_deltas_then_done(srt_backend):
    chunks = [c async for c in srt_backend.stream(Context(text="q"), SamplingParams(max_tokens=5))]
    assert "".join(c.text for c in chunks) == "xyxyx"
    assert [c.done for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].meta_info["finish_reason"]["type"] == "length"
    assert chunks[-1].meta_info["completion_tokens"] == 5


@pytest.mark.parametrize("kind", ["Local", "RuntimeEndpoint"])
async def test_cancelling_a_stream_aborts_the_request(kind):
    runtime = FakeRuntime()
    backend = (Local(engine=FakeEngine(runtime, hang_stream=True)) if kind == "Local"
               else make_endpoint(runtime, hang_stream=True))
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in backend.stream(Context(text="q"), SamplingParams(max_tokens=5)):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert runtime.aborted == [runtime.requests[-1]["rid"]]


async def test_cache_prefix_is_a_prefill_only_request(srt_backend, runtime):
    await srt_backend.cache_prefix(Context(text="system prompt"))
    assert runtime.requests[-1]["sampling_params"] == {"max_new_tokens": 0}


async def test_images_are_refused_before_any_request(srt_backend, runtime):
    from sgdsl.backends.base import ImageData

    with pytest.raises(UnsupportedError, match="images"):
        await srt_backend.generate(Context(text="q", images=(ImageData(b"x", "image/png"),)),
                                   SamplingParams())
    assert runtime.requests == []


async def test_local_wraps_engine_errors():
    from sgdsl.runtime.errors import InvalidRequestError

    engine = FakeEngine(FakeRuntime())
    engine.error = InvalidRequestError("top_p must be in (0.0, 1.0]", field="top_p")
    with pytest.raises(BackendError, match=r"Local backend.*HTTP 400.*top_p") as info:
        await Local(engine=engine).generate(Context(text="q"), SamplingParams(top_p=0.0))
    assert info.value.__cause__ is engine.error and info.value.status == 400


async def test_endpoint_wraps_http_errors():
    error = {"error": {"message": "top_p must be in (0.0, 1.0]", "code": 400}}
    backend = make_endpoint(FakeRuntime(), status=400, error=error)
    with pytest.raises(BackendError, match=r"RuntimeEndpoint backend.*HTTP 400.*top_p") as info:
        await backend.generate(Context(text="q"), SamplingParams(top_p=0.0))
    assert info.value.status == 400 and info.value.__cause__ is not None
    with pytest.raises(BackendError, match="HTTP 400"):
        [c async for c in backend.stream(Context(text="q"), SamplingParams())]


def test_tokenizer_fake_merges():  # guards the premise of the boundary test
    assert tokenize("xab") == [ord("x"), 1000] and tokenize("xa") == [ord("x"), ord("a")]


def test_chat_template_comes_from_the_models_own_jinja():
    runtime = FakeRuntime()
    runtime.model_info = dict(runtime.model_info, chat_template=(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"))
    for backend in (Local(engine=FakeEngine(runtime)), make_endpoint(runtime)):
        template = backend.chat_template()
        assert template.get_prefix_and_suffix("user") == ("<|im_start|>user\n", "<|im_end|>\n")
        assert template is backend.chat_template()  # derived once
