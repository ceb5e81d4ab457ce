"""The Backend interface: where sgdsl programs run.

Backends see the IR (``sgdsl.ir``) and a ``Context`` snapshot of the program so far, never the
interpreter. Each backend declares in ``Capabilities`` what it can enforce natively; the
interpreter lowers every constraint to the strongest mechanism available or raises
``UnsupportedError`` before the first token.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping, Sequence

from sgdsl.errors import BackendError, UnsupportedError
from sgdsl.ir import Constraint, SamplingParams

__all__ = [
    "Backend", "BackendError", "Capabilities", "ChoiceScores", "Context", "GenResult",
    "ImageData", "Message", "SelectResult", "StreamChunk", "UnsupportedError",
]


@dataclass(frozen=True)
class ImageData:
    """An image ready to send: raw bytes plus MIME type (``image/png``...)."""

    data: bytes
    mime_type: str


@dataclass(frozen=True)
class Message:
    role: str  # "system" | "user" | "assistant"
    content: str
    images: tuple[ImageData, ...] = ()


@dataclass(frozen=True)
class Context:
    """The program so far. ``text`` is the completion-style rendering (chat template applied by
    the interpreter with this backend's ``chat_template()``); ``messages`` the chat rendering.
    ``open_role`` is the role whose turn is being written (its partial content is the last
    message), e.g. ``"assistant"`` when ``gen`` runs inside an assistant turn."""

    text: str
    messages: tuple[Message, ...] = ()
    open_role: str | None = None
    images: tuple[ImageData, ...] = ()


@dataclass(frozen=True)
class Capabilities:
    chat_only: bool = False  # consumes messages, not raw text (OpenAI chat, Anthropic)
    constraints: frozenset[str] = frozenset()  # kinds enforced natively: regex, json_schema, ebnf, choices
    prompt_logprobs: bool = False  # can score continuations (select by logprobs)
    output_logprobs: bool = False
    images: bool = False
    max_images: int | None = None
    native_n: bool = False  # n>1 in one request; otherwise the interpreter issues n requests
    partial_assistant: bool = False  # can continue a partly written assistant turn
    stop_regex: bool = False


@dataclass(frozen=True)
class GenResult:
    """One completion. ``meta_info`` always carries at least prompt_tokens, completion_tokens,
    finish_reason; backends add what they have (cached_tokens, logprobs, cost...)."""

    text: str
    meta_info: Mapping[str, Any] = field(default_factory=dict)
    # True when the backend itself validated ``text`` against the request's json_schema (the
    # sgdsl runtime's backstop): the interpreter then parses it without validating it again
    schema_checked: bool = False


@dataclass(frozen=True)
class StreamChunk:
    """A streamed delta; the last chunk has ``done=True`` and the full meta_info."""

    text: str
    done: bool = False
    meta_info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ChoiceScores:
    """Logprobs for scoring ``select`` choices on a prompt-logprob backend, per choice:
    ``token_logprobs[i]`` the logprobs of choice i's tokens given the context, and
    ``unconditional_logprobs[i]`` the same tokens without the context (for
    unconditional_likelihood_normalized; may be None if not requested)."""

    token_logprobs: tuple[tuple[float, ...], ...]
    unconditional_logprobs: tuple[tuple[float, ...], ...] | None = None
    meta_info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SelectResult:
    index: int
    meta_info: Mapping[str, Any] = field(default_factory=dict)


class Backend(ABC):
    """Async interface; the interpreter awaits these. Cancelling a call must abort the
    backend's in-flight request (catch ``asyncio.CancelledError``, abort, re-raise)."""

    capabilities: Capabilities = Capabilities()

    def chat_template(self) -> Any | None:
        """The ``sgdsl.chat_template.ChatTemplate`` used to render roles into ``Context.text``
        (None for chat-only backends that take messages)."""
        return None

    @abstractmethod
    async def generate(self, ctx: Context, params: SamplingParams,
                       constraint: Constraint | None = None) -> list[GenResult]:
        """``params.n`` completions (1 if unset) of ``ctx``."""

    @abstractmethod
    def stream(self, ctx: Context, params: SamplingParams,
               constraint: Constraint | None = None) -> AsyncIterator[StreamChunk]:
        """One streamed completion of ``ctx``."""

    async def score_choices(self, ctx: Context, choices: Sequence[str],
                            unconditional: bool = False) -> ChoiceScores:
        """Token logprobs of each choice continuing ``ctx`` (prompt_logprobs backends)."""
        raise UnsupportedError(f"{type(self).__name__} cannot score choices by logprobs")

    async def select(self, ctx: Context, choices: Sequence[str], temperature: float,
                     choices_method: Any) -> SelectResult:
        """Pick one of ``choices``. Default: score by logprobs and apply ``choices_method``
        (see sgdsl.choices). Chat backends override with enum schemas or forced tools."""
        scores = await self.score_choices(ctx, choices,
                                          unconditional=getattr(choices_method, "needs_unconditional", False))
        index = choices_method(scores)
        return SelectResult(index=index, meta_info=dict(scores.meta_info))

    async def cache_prefix(self, ctx: Context) -> None:
        """Warm the backend's prefix cache with ``ctx`` (no-op where there is none)."""

    async def close(self) -> None:
        """Release clients, connections, engines."""
