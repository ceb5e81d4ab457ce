"""Chat templates: how roles render into completion-style text.

A ``ChatTemplate`` is a prefix and a suffix per role, plus the default system prompt some
models inject and the stop strings that end an assistant turn. Templates are *derived* from a
Jinja2 chat template (one shipped in ``sgdsl.templates`` or a model's own, read from its
``tokenizer_config.json``) by rendering sentinel conversations and cutting the output around
the sentinels, so the interpreter can write a turn incrementally (``gen`` inside a partly
written assistant turn) and still produce exactly what the model was trained on.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Sequence

from sgdsl.errors import TemplateNotFoundError

_S, _U, _A, _U2 = "@@SGDSL_SYS@@", "@@SGDSL_USER@@", "@@SGDSL_ASSISTANT@@", "@@SGDSL_USER2@@"
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    roles: Mapping[str, tuple[str, str]]  # role -> (prefix, suffix)
    default_system_prompt: str | None = None
    stop_str: tuple[str, ...] = ()
    image_token: str = "<image>"
    source: str | None = field(default=None, compare=False, repr=False)

    def get_prefix_and_suffix(self, role: str, history: Sequence[Any] = ()) -> tuple[str, str]:
        """The text written before and after a turn of ``role``. ``history`` (messages so far)
        is accepted for SGLang compatibility; derived templates do not depend on it."""
        if role not in self.roles:
            raise ValueError(f"chat template {self.name!r} has no role {role!r}")
        return self.roles[role]

    def render(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False) -> str:
        """Messages rendered turn by turn (with the default system prompt where due)."""
        out = []
        if self.default_system_prompt and (not messages or messages[0]["role"] != "system"):
            messages = [{"role": "system", "content": self.default_system_prompt}, *messages]
        for m in messages:
            prefix, suffix = self.get_prefix_and_suffix(m["role"])
            out.append(prefix + m["content"] + suffix)
        if add_generation_prompt:
            out.append(self.roles["assistant"][0])
        return "".join(out)

    @classmethod
    def from_jinja(cls, source: str, *, name: str = "custom", bos_token: str = "",
                   eos_token: str = "") -> "ChatTemplate":
        """Derive role prefixes/suffixes from a Jinja2 chat template (HF conventions)."""
        return _derive(_Renderer(source, bos_token, eos_token), name, source)

    @classmethod
    def from_model_dir(cls, path: str | Path) -> "ChatTemplate | None":
        """The template in a HF model directory (``chat_template.jinja`` or the
        ``chat_template`` of ``tokenizer_config.json``); None if it has none."""
        path = Path(path)
        config = _read_json(path / "tokenizer_config.json")
        source = config.get("chat_template")
        if isinstance(source, list):  # named variants: take "default"
            source = next((t["template"] for t in source if t.get("name") == "default"), None)
        if (path / "chat_template.jinja").exists():
            source = (path / "chat_template.jinja").read_text()
        if not source:
            return None
        return cls.from_jinja(source, name=path.name, bos_token=_token(config.get("bos_token")),
                              eos_token=_token(config.get("eos_token")))


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def _token(value: Any) -> str:
    if isinstance(value, dict):  # AddedToken serialized as a dict
        return value.get("content", "")
    return value or ""


class _Renderer:
    def __init__(self, source: str, bos_token: str, eos_token: str) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.template = env.from_string(source)
        self.eos = eos_token

    def __call__(self, messages: list[tuple[str, str]], gen: bool = False) -> str:
        # NOTE: BOS renders as "": the tokenizer adds it itself, and some models' BOS is also a
        # turn marker (SmolLM2's is "<|im_start|>"), so it cannot be stripped after rendering.
        return self.template.render(
            messages=[{"role": r, "content": c} for r, c in messages],
            add_generation_prompt=gen, bos_token="", eos_token=self.eos, tools=None, documents=None)


def _raise(message: str) -> None:
    raise ValueError(message)


def _between(text: str, start: str, end: str) -> str:
    i = text.index(start) + len(start)
    return text[i:text.index(end, i)]


def _derive(render: _Renderer, name: str, source: str) -> ChatTemplate:
    two = render([("system", _S), ("user", _U)])
    user_suffix = two[two.index(_U) + len(_U):]
    with_gen = render([("system", _S), ("user", _U)], gen=True)
    full = render([("system", _S), ("user", _U), ("assistant", _A), ("user", _U2)])
    gap_ua, gap_au = _between(full, _U, _A), _between(full, _A, _U2)
    asst_prefix = with_gen[len(two):] if with_gen.startswith(two) else ""
    if not asst_prefix and gap_ua.startswith(user_suffix):
        asst_prefix = gap_ua[len(user_suffix):]
    alone = render([("user", _U)])
    alone_prefix = alone[:alone.index(_U)]
    if user_suffix and gap_au.startswith(user_suffix):
        asst_suffix, user_prefix = user_suffix, gap_au[len(user_suffix):]
    else:  # e.g. mistral: the user turn closes with " [/INST]", the assistant's with "</s>"
        user_prefix = _common_suffix(gap_au, alone_prefix)
        asst_suffix = gap_au[:len(gap_au) - len(user_prefix)]
    if full.index(_S) < full.index(_U):
        sys_prefix = full[:full.index(_S)]
        gap_su = _between(full, _S, _U)
        sys_suffix = gap_su[:len(gap_su) - len(user_prefix)] if gap_su.endswith(user_prefix) else gap_su
    else:  # the template folds the system prompt into a user turn: write it as plain text
        sys_prefix, sys_suffix = "", "\n\n"
    default_system = None
    if alone_prefix != user_prefix and alone_prefix.endswith(user_prefix):
        block = alone_prefix[:len(alone_prefix) - len(user_prefix)]
        if block.startswith(sys_prefix) and block.endswith(sys_suffix) and sys_suffix:
            default_system = block[len(sys_prefix):len(block) - len(sys_suffix)]
    roles = {"system": (sys_prefix, sys_suffix), "user": (user_prefix, user_suffix),
             "assistant": (asst_prefix, asst_suffix)}
    stop = (asst_suffix.strip(),) if asst_suffix.strip() else ()
    return ChatTemplate(name, roles, default_system, stop, source=source)


def _common_suffix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
        n += 1
    return a[len(a) - n:] if n else ""


_NAMED: dict[str, ChatTemplate] = {}
_ALIASES = {"llama3": "llama-3", "llama-3-instruct": "llama-3", "qwen2": "qwen", "qwen2.5": "qwen",
            "smollm": "chatml", "smollm2": "chatml"}
_SPECIAL_TOKENS = {"llama-3": ("<|begin_of_text|>", "<|eot_id|>"), "mistral": ("<s>", "</s>")}


def list_chat_templates() -> list[str]:
    """Names of the templates shipped in ``sgdsl.templates``."""
    files = resources.files("sgdsl.templates").iterdir()
    return sorted(f.name[:-len(".jinja")] for f in files if f.name.endswith(".jinja"))


def get_chat_template(name: str) -> ChatTemplate:
    """A shipped template by name (``chatml``, ``llama-3``, ``mistral``, ``qwen``, ``default``)."""
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in _NAMED:
        path = resources.files("sgdsl.templates") / f"{key}.jinja"
        if not path.is_file():
            raise TemplateNotFoundError(
                f"no chat template named {name!r}; available: {', '.join(list_chat_templates())}")
        bos, eos = _SPECIAL_TOKENS.get(key, ("", ""))
        _NAMED[key] = ChatTemplate.from_jinja(path.read_text(), name=key, bos_token=bos, eos_token=eos)
    return _NAMED[key]


def guess_chat_template(model: str) -> ChatTemplate:
    """A shipped template matching a model name or path, ``default`` if none does."""
    lowered = model.lower()
    for needle, name in (("llama-3", "llama-3"), ("llama3", "llama-3"), ("qwen", "qwen"),
                         ("mistral", "mistral"), ("mixtral", "mistral"), ("smollm", "chatml"),
                         ("chatml", "chatml")):
        if needle in lowered:
            return get_chat_template(name)
    return get_chat_template("default")
