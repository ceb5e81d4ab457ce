"""Pure unit tests of the server's pieces: chat templates, tools, protocol translation, CLI."""
from __future__ import annotations

import json

import pytest

from sgdsl.runtime.server.chat import ChatTemplate
from sgdsl.runtime.server.cli import parse_args, uvicorn_config
from sgdsl.runtime.server.engine_client import GenBatch
from sgdsl.runtime.server.errors import APIError
from sgdsl.runtime.server.openai_format import LogprobCursor, completion_logprobs, usage
from sgdsl.runtime.server.openai_protocol import ChatCompletionRequest
from sgdsl.runtime.function_call import get_format
from sgdsl.runtime.server.tools import Tool, plan_tools

TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")


def test_chat_template_renders_and_continues() -> None:
    t = ChatTemplate(TEMPLATE)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]
    assert t.render(msgs[:1]) == "[user]hi[assistant]"
    assert t.render_continuation(msgs) == "[user]hi[assistant]Hel"


def test_chat_template_errors_are_400() -> None:
    t = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(APIError) as info:
        t.render([{"role": "user", "content": "x"}])
    assert info.value.status == 400 and "alternate" in info.value.message


def test_default_template_is_chatml() -> None:
    text = ChatTemplate(None).render([{"role": "user", "content": "x"}])
    assert text == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"


def test_tool_plans() -> None:
    tools = [Tool("add", {"type": "object", "properties": {"a": {"type": "integer"}}}),
             Tool("neg", {"type": "object"})]
    fmt = get_format("hermes")
    forced = plan_tools(tools, "named", fmt, "add")
    assert forced.mode == "required" and forced.allowed == ("add",)
    assert json.loads(forced.call_schema())["properties"] == {
        "name": {"const": "add"}, "arguments": tools[0].parameters}
    anyof = plan_tools(tools, "required", fmt)
    assert len(json.loads(anyof.call_schema())["anyOf"]) == 2
    assert plan_tools(tools, "none", fmt).active is False
    assert plan_tools([], "auto", fmt) is None
    with pytest.raises(APIError, match="unknown tool"):
        plan_tools(tools, "named", fmt, "missing")
    with pytest.raises(APIError, match="requires tools"):
        plan_tools([], "required", fmt)


def test_response_format_becomes_json_schema() -> None:
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], response_format={
        "type": "json_schema", "json_schema": {"name": "o", "schema": {"type": "integer"}}})
    assert json.loads(req.sampling(5)["json_schema"]) == {"type": "integer"}
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}],
                                response_format={"type": "json_object"})
    assert json.loads(req.sampling(5)["json_schema"]) == {"type": "object"}


def test_fan_out_seeds_and_rids() -> None:
    batch = GenBatch.fan_out(["a", [1, 2]], {"seed": 10, "max_new_tokens": 1}, n=2,
                             rids=["r0", "r1", "r2", "r3"])
    assert [it.sampling["seed"] for it in batch.items] == [10, 11, 10, 11]
    assert [it.rid for it in batch.items] == ["r0", "r1", "r2", "r3"]
    assert batch.items[0].prompt == "a" and batch.items[2].input_ids == [1, 2]


def test_usage_counts_prompt_once_per_prompt() -> None:
    outs = [{"meta_info": {"prompt_tokens": 5, "completion_tokens": c, "cached_tokens": 2}}
            for c in (1, 2, 3, 4)]
    u = usage(outs, n=2)
    assert u["prompt_tokens"] == 10 and u["completion_tokens"] == 10
    assert u["total_tokens"] == 20 and u["prompt_tokens_details"]["cached_tokens"] == 4


def test_logprob_cursor_and_offsets() -> None:
    cursor = LogprobCursor(1)  # cumulative chunks (no length field)
    meta = {"output_token_logprobs": [[-1.0, 5, "a"]], "output_top_logprobs": [[[-1.0, 5, "a"]]]}
    assert cursor.take(0, meta)[0] == [[-1.0, 5, "a"]]
    meta["output_token_logprobs"].append([-2.0, 6, "bc"])
    meta["output_top_logprobs"].append([])
    assert cursor.take(0, meta) == ([[-2.0, 6, "bc"]], [[]])
    cursor = LogprobCursor(2)  # the engine's chunks: their own entries and the count so far
    cursor.feed(1, {"output_token_logprobs": [[-1.0, 5, "a"]], "output_token_logprobs_length": 1,
                    "output_top_logprobs": [[]]})  # a chunk not sent
    sent = cursor.take(1, {"output_token_logprobs": [[-2.0, 6, "b"]],
                           "output_token_logprobs_length": 2, "output_top_logprobs": [[]]})
    assert sent == ([[-1.0, 5, "a"], [-2.0, 6, "b"]], [[], []])
    assert cursor.take(0, {"output_token_logprobs": [[-3.0, 7, "c"]],
                           "output_token_logprobs_length": 1}) == ([[-3.0, 7, "c"]], None)
    assert cursor.take(1, {"output_token_logprobs": [], "output_token_logprobs_length": 2,
                           "output_top_logprobs": []}) == ([], [])
    lp = completion_logprobs(meta["output_token_logprobs"], None, offset=3)
    assert lp["text_offset"] == [3, 4] and lp["tokens"] == ["a", "bc"]


def test_cli_maps_flags_to_configs() -> None:
    engine, server = parse_args(["--port", "0", "--api-key", "k", "--cors-origin", "http://a",
                                 "--max-total-tokens", "4096", "--disable-radix-cache",
                                 "--schedule-policy", "fcfs", "--model-path", "/m"])
    assert server.port == 0 and server.api_key == "k" and server.cors_origins == ("http://a",)
    assert engine.max_total_tokens == 4096 and engine.disable_radix_cache is True
    assert engine.schedule_policy == "fcfs" and engine.model == "/m"
    with pytest.raises(SystemExit):
        parse_args(["--schedule-policy", "nope"])


def test_idle_connections_outlive_a_client_pool_expiry() -> None:
    # uvicorn's own 5 s equals httpx's pool expiry: a client then reuses a connection the server
    # is closing and meets a reset (the router's dp=4 ReadError); ours keeps them 75 s
    _, server = parse_args([])
    assert uvicorn_config(None, server).timeout_keep_alive == 75.0 > 5.0
    _, server = parse_args(["--keep-alive-timeout-s", "9"])
    assert uvicorn_config(None, server).timeout_keep_alive == 9.0


def test_metrics_export_engine_stats() -> None:
    from sgdsl.runtime.server.metrics import ServerMetrics

    m = ServerMetrics(lambda: {"num_running_reqs": 2, "requests_total": 5,
                               "grammar_compiles": 3, "flag": True, "name": "x"})
    text = m.render().decode()
    assert "sgdsl_engine_num_running_reqs 2.0" in text
    assert "sgdsl_engine_requests_total 5.0" in text
    assert "sgdsl_engine_grammar_compiles 3.0" in text
    assert "flag" not in text and "sgdsl_engine_name" not in text


def test_metrics_noted_on_the_path_are_exported_at_scrape(monkeypatch) -> None:
    """The request path notes its metrics in plain Python; a scrape folds them into the
    Prometheus series with the same counts and sums as direct updates (and a server nobody
    scrapes folds every FOLD_AT observations, so nothing grows without a bound)."""
    from sgdsl.runtime.server import metrics as metrics_mod

    m = metrics_mod.ServerMetrics()
    for status in (200, 200, 400):
        m.observe_request("/generate", status)
    m.observe_output({"prompt_tokens": 7, "completion_tokens": 3, "cached_tokens": 2}, 0.25)
    m.observe_output({"prompt_tokens": 5, "completion_tokens": 4}, 0.75)
    m.observe_first_token(0.02)
    m.observe_tokens(0.3, 3)
    text = m.render().decode()
    for line in ('sgdsl_http_requests_total{route="/generate",status="200"} 2.0',
                 'sgdsl_http_requests_total{route="/generate",status="400"} 1.0',
                 "sgdsl_prompt_tokens_total 12.0", "sgdsl_generation_tokens_total 7.0",
                 "sgdsl_cached_prompt_tokens_total 2.0",
                 "sgdsl_e2e_request_latency_seconds_count 2.0",
                 "sgdsl_e2e_request_latency_seconds_sum 1.0",
                 "sgdsl_time_to_first_token_seconds_count 1.0",
                 "sgdsl_inter_token_latency_seconds_count 3.0"):
        assert line in text, line
    assert "sgdsl_prompt_tokens_total 12.0" in m.render().decode()  # folded once, not twice
    monkeypatch.setattr(metrics_mod, "FOLD_AT", 4)
    for _ in range(4):
        m.observe_first_token(0.01)
    assert m.ttft._sum.get() > 0.02 and not m._ttft  # folded without a scrape


TOOL_TEMPLATE = (  # the shape of Qwen2.5's template: tools listed in the system turn
    "{% if tools %}<sys>{% for t in tools %}{{ t.function.name }};{% endfor %}</sys>{% endif %}"
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<call>{{ c.function.name }}:{{ c.function.arguments | tojson }}"
    "</call>{% endfor %}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")


def test_prompt_with_tools_uses_the_template_or_the_fallback() -> None:
    from sgdsl.runtime.function_call import ToolCall
    from sgdsl.runtime.server.tools import render_prompt

    plan = plan_tools([Tool("add", {"type": "object"})], "auto", get_format("hermes"))
    history = [{"role": "user", "content": "1+2?"},
               {"role": "assistant", "content": "", "tool_calls": [ToolCall("add", '{"a": 1}')]},
               {"role": "tool", "content": "3", "tool_call_id": "c1"}]
    text = render_prompt(ChatTemplate(TOOL_TEMPLATE), history, plan)
    assert text == ('<sys>add;</sys>[user]1+2?[assistant]<call>add:{"a": 1}</call>[tool]3'
                    "[assistant]")
    fallback = render_prompt(ChatTemplate(TEMPLATE), history, plan)
    assert fallback.startswith("[system]You may call one or more functions")
    assert '"name": "add"' in fallback and "<tools>" in fallback
    assert '[assistant]<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>' in fallback
    assert fallback.endswith("[user]<tool_response>\n3\n</tool_response>[assistant]")
    none = plan_tools([Tool("add", {"type": "object"})], "none", get_format("hermes"))
    assert "<tools>" not in render_prompt(ChatTemplate(TEMPLATE), history[:1], none)


def test_chat_encode_short_on_the_loop_long_on_a_thread_same_ids() -> None:
    """A chat prompt's ids are the tokenizer's, whether it is encoded on the event loop (short)
    or on a worker thread (OFFLOAD_ENCODE_CHARS and longer)."""
    import asyncio
    import dataclasses
    import threading
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from sgdsl.runtime.model.embedded import embedded_model_path
    from sgdsl.runtime.server import context
    from sgdsl.runtime.server.encode_batcher import EncodeBatcher

    tok = AutoTokenizer.from_pretrained(str(embedded_model_path()))
    engine = SimpleNamespace(tokenizer=tok, model_info={"model_path": "/m"}, stats=lambda: {})
    c = context.ServerContext.build(engine, parse_args(["--port", "0"])[1])
    threads = []
    real = c.encode

    real_many = c.batcher.encode_many  # long prompts: a batch encode per loop turn

    def spy(text: str) -> list[int]:
        threads.append(threading.current_thread() is threading.main_thread())
        return real(text)

    def spy_many(texts: list[str]) -> list[list[int]]:
        threads.append(threading.current_thread() is threading.main_thread())
        return real_many(texts)
    c = dataclasses.replace(c, encode=spy, batcher=EncodeBatcher(spy_many))
    short = "<|im_start|>user\nhello there<|im_end|>\n"
    long = short + "héllo wörld 🙂 " * (context.OFFLOAD_ENCODE_CHARS // 10)
    for text in (short, long):
        assert asyncio.run(c.encode_chat_async(text)) == tok.encode(text, add_special_tokens=False)
    assert threads == [True, False]  # short: on the loop's thread; long: on a worker


def test_refused_native_fields_only_when_they_ask_for_something() -> None:
    """A feature this runtime lacks is a 400 naming its field when the body asks for it
    (checked only among the fields the body gave); null, false, [] or per-prompt nulls pass."""
    from sgdsl.runtime.server.errors import APIError
    from sgdsl.runtime.server.native_protocol import GenerateRequest

    for ok in ({}, {"lora_path": None}, {"return_bytes": False}, {"video_data": []},
               {"return_entropy": [None, False]}):
        GenerateRequest(text="a", **ok).check_refused()
    for field, value in (("lora_path", "adapter"), ("return_bytes", True),
                         ("video_data", ["v"]), ("return_entropy", [None, True])):
        with pytest.raises(APIError) as info:
            GenerateRequest(text="a", **{field: value}).check_refused()
        assert info.value.status == 400 and field in str(info.value)
