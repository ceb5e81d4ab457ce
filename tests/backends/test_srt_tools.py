"""The tool listing the runtime backends add to a tool-calling gen's prompt: in the system
turn (added when there is none), and only where the prompt can be rebuilt exactly."""
from __future__ import annotations

from sgdsl.backends.base import Context, Message
from sgdsl.backends.srt_tools import _render, with_tool_listing
from sgdsl.chat_template import get_chat_template
from sgdsl.tools import tool_set


def lookup(q: str) -> str:
    """Search the notes."""
    return q


TEMPLATE = get_chat_template("chatml")
TOOLS = tool_set([lookup])


def _ctx(*messages: Message, open_role: str | None = "assistant") -> Context:
    text = _render(TEMPLATE, [(m.role, m.content) for m in messages], open_role)
    return Context(text=text, messages=messages, open_role=open_role)


def test_listing_goes_into_the_system_turn() -> None:
    ctx = _ctx(Message("system", "Be brief."), Message("user", "hi"), Message("assistant", ""))
    out = with_tool_listing(ctx, TEMPLATE, TOOLS).text
    assert out.startswith("<|im_start|>system\nBe brief.\n\nYou may call one or more functions")
    assert '"name": "lookup"' in out and '"description": "Search the notes."' in out
    assert out.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    bare = with_tool_listing(_ctx(Message("user", "hi"), Message("assistant", "")), TEMPLATE, TOOLS)
    assert bare.text.startswith("<|im_start|>system\nYou may call") and bare.messages[0].role == "user"


def test_prompts_that_cannot_be_rebuilt_are_left_alone() -> None:
    ctx = _ctx(Message("user", "hi"), Message("assistant", ""))
    odd = Context(text="Preamble outside turns. " + ctx.text, messages=ctx.messages,
                  open_role="assistant")
    assert with_tool_listing(odd, TEMPLATE, TOOLS) is odd
    plain = Context(text="Q: hi\nA:")
    assert with_tool_listing(plain, TEMPLATE, TOOLS) is plain
