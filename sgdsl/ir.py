"""IR of sgdsl programs: frozen dataclass nodes produced by the API calls (``gen``, ``select``,
roles, images...) and executed by the interpreter. ``SamplingParams`` is defined here once;
backends import this module, never the interpreter."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

# SGLang's regex constants (``sglang.lang.ir``), same values, for programs that import them.
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""

ConstraintKind = Literal["regex", "json_schema", "ebnf", "choices", "dtype", "tools"]


@dataclass(frozen=True)
class SamplingParams:
    """Language-level sampling parameters. ``None`` means "not set here": program-wide defaults
    given to ``run(...)`` fill the gaps (see ``merged``), then backend defaults."""

    max_tokens: int | None = None
    min_tokens: int | None = None
    n: int | None = None
    stop: tuple[str, ...] | None = None
    stop_token_ids: tuple[int, ...] | None = None
    stop_regex: tuple[str, ...] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    ignore_eos: bool | None = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None
    seed: int | None = None

    DEFAULTS = {  # noqa: RUF012 - class-level constant, not a field
        "max_tokens": 128, "min_tokens": 0, "n": 1, "stop": (), "stop_token_ids": (),
        "stop_regex": (), "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
        "frequency_penalty": 0.0, "presence_penalty": 0.0, "ignore_eos": False,
        "return_logprob": False, "logprob_start_len": None, "top_logprobs_num": 0,
        "return_text_in_logprobs": False, "seed": None,
    }

    @classmethod
    def of(cls, values: dict[str, Any]) -> "SamplingParams":
        """Build from a dict of field values, skipping the frozen dataclass ``__init__``
        (18 ``object.__setattr__`` calls: the largest cost of ``gen()``)."""
        fields = {**_EMPTY_PARAMS, **values}
        if len(fields) != len(_EMPTY_PARAMS):
            unknown = sorted(values.keys() - _EMPTY_PARAMS.keys())
            raise TypeError(f"SamplingParams has no field {unknown[0]!r}")
        new = object.__new__(cls)
        object.__setattr__(new, "__dict__", fields)
        return new

    def merged(self, defaults: "SamplingParams | None") -> "SamplingParams":
        """Fields set here win; unset ones come from ``defaults``."""
        if defaults is None:
            return self
        mine = self.__dict__
        changes = {k: v for k, v in defaults.__dict__.items() if v is not None and mine[k] is None}
        return self.replace(**changes) if changes else self

    def replace(self, **changes: Any) -> "SamplingParams":
        """``dataclasses.replace`` without its per-call field introspection (this runs once or
        twice per gen on the interpreter's hot path)."""
        return SamplingParams.of({**self.__dict__, **changes})

    def resolved(self, name: str) -> Any:
        """The value of a field with the library default applied."""
        value = getattr(self, name)
        return self.DEFAULTS[name] if value is None else value

    def to_dict(self) -> dict[str, Any]:
        """Only the fields that are set."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


_EMPTY_PARAMS = dict(SamplingParams().__dict__)


@dataclass(frozen=True)
class Constraint:
    """A constraint on generated text. ``value`` is a regex string, a JSON schema string, an
    EBNF grammar, a tuple of choices, or a Python type for ``dtype``. ``model`` keeps the pydantic
    class a schema came from, so the interpreter can return a parsed object."""

    kind: ConstraintKind
    value: Any
    model: type | None = field(default=None, compare=False)


# ---- nodes -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Node:
    """Base of IR nodes. ``a + b`` (with nodes or strings) builds a ``Sequence``, as SGLang's
    expressions do, so ``user("Q: " + gen("x"))`` works."""

    def __add__(self, other: "Node | str") -> "Sequence":
        return Sequence(_flatten((self, as_node(other))))

    def __radd__(self, other: "Node | str") -> "Sequence":
        return Sequence(_flatten((as_node(other), self)))


def as_node(value: Any) -> Node:
    """A node from a node or a plain value (strings and numbers become ``Text``)."""
    if isinstance(value, Node):
        return value
    if value is None:
        raise TypeError("cannot append None to a program state")
    return Text(str(value))


def _flatten(nodes: tuple[Node, ...]) -> tuple[Node, ...]:
    out: list[Node] = []
    for node in nodes:
        out.extend(node.items if isinstance(node, Sequence) else (node,))
    return tuple(out)


@dataclass(frozen=True)
class Text(Node):
    value: str


@dataclass(frozen=True)
class Gen(Node):
    name: str | None
    params: SamplingParams = SamplingParams()
    constraint: Constraint | None = None
    # ``separate_reasoning``: the model_type whose think section goes to <name>_reasoning_content
    reasoning: str | None = None

    @property
    def reasoning_name(self) -> str | None:
        return None if self.reasoning is None or self.name is None else \
            f"{self.name}_reasoning_content"


@dataclass(frozen=True)
class Select(Node):
    name: str | None
    choices: tuple[str, ...]
    temperature: float = 0.0
    choices_method: Callable[..., Any] | None = None  # see sgdsl.choices; None = token_length_normalized


@dataclass(frozen=True)
class RoleBegin(Node):
    role: str


@dataclass(frozen=True)
class RoleEnd(Node):
    role: str


@dataclass(frozen=True)
class Image(Node):
    """An image: a path, a URL, raw bytes or a ``data:`` URL."""

    source: Any


@dataclass(frozen=True)
class VarScopeBegin(Node):
    name: str


@dataclass(frozen=True)
class VarScopeEnd(Node):
    name: str


@dataclass(frozen=True)
class CommitLazy(Node):
    """Flush pending text to the backend's prefix cache (``s += sgl.commit_lazy()``)."""


@dataclass(frozen=True)
class Sequence(Node):
    """Several nodes appended at once (``s += a + b``)."""

    items: tuple[Node, ...]
