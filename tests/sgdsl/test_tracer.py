"""Tracing programs without running them, and prefix caching."""
from __future__ import annotations

import sgdsl as sgl
from sgdsl import ir
from sgdsl.chat_template import get_chat_template
from sgdsl.testing import ScriptedBackend
from sgdsl.tracer import TraceArgument, flatten, trace_program


@sgl.function
def qa(s, question):
    s += sgl.system("You are terse.")
    s += sgl.user("Question: " + question)
    s += sgl.assistant(sgl.gen("answer"))


def test_trace_records_nodes_with_argument_placeholders():
    result = trace_program(qa)
    assert result.complete
    flat = flatten(result.nodes)
    assert TraceArgument("question") in flat
    assert any(isinstance(n, ir.Gen) and n.name == "answer" for n in flat)


def test_trace_stops_where_the_program_needs_a_value():
    @sgl.function
    def uses_value(s, items):
        s += "Items:"
        for item in items:  # iterating a placeholder stops the trace
            s += item

    result = uses_value.trace()
    assert not result.complete and "items" in result.stopped_because
    assert result.nodes == [ir.Text("Items:")]


def test_cache_sends_the_constant_prefix_to_the_backend():
    backend = ScriptedBackend(template=get_chat_template("chatml"))
    prefix = qa.cache(backend)
    assert prefix == "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nQuestion: "
    assert backend.calls[-1].kind == "cache" and backend.calls[-1].context.text == prefix
