"""The public functions of the language (SGLang-compatible names and signatures)."""
from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Callable, Sequence

from sgdsl import ir
from sgdsl.choices import (greedy_token_selection, token_length_normalized,  # noqa: F401
                           unconditional_likelihood_normalized)
from sgdsl.function import SglFunction

_TUPLE_FIELDS = ("stop", "stop_token_ids", "stop_regex")


def function(func: Callable[..., Any] | None = None, *,
             num_api_spec_tokens: int | None = None) -> Any:
    """Mark a program: ``@function`` or ``@function(num_api_spec_tokens=N)``."""
    if func is None:
        return lambda f: SglFunction(f, num_api_spec_tokens=num_api_spec_tokens)
    return SglFunction(func, num_api_spec_tokens=num_api_spec_tokens)


def entrypoint(func: Any) -> Any:
    """Mark the program(s) ``sgdsl run file.py`` runs (see ``sgdsl run --help``)."""
    target = func if isinstance(func, SglFunction) else function(func)
    target.__sgdsl_entrypoint__ = True
    return target


def gen(name: str | None = None, max_tokens: int | None = None, min_tokens: int | None = None,
        n: int | None = None, stop: str | Sequence[str] | None = None,
        stop_token_ids: Sequence[int] | None = None, stop_regex: str | Sequence[str] | None = None,
        temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
        min_p: float | None = None, frequency_penalty: float | None = None,
        presence_penalty: float | None = None, ignore_eos: bool | None = None,
        return_logprob: bool | None = None, logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None, return_text_in_logprobs: bool | None = None,
        dtype: type | str | None = None, choices: Sequence[str] | None = None,
        choices_method: Callable[..., Any] | None = None, regex: str | None = None,
        json_schema: Any = None, ebnf: str | None = None, seed: int | None = None,
        tools: Sequence[Any] | None = None, tool_choice: Any = None) -> ir.Node:
    """Generate text into variable ``name``. At most one constraint (regex, json_schema — a
    string, dict or pydantic model —, ebnf, dtype); ``choices`` makes it a ``select``;
    ``tools`` (functions or JSON schemas, see ``sgdsl.tools``) lets the model call them
    (``tool_choice``: "auto", "required", "none" or a tool's name), the calls in
    ``state.tool_calls(name)``."""
    if choices is not None:
        return select(name, choices, temperature=temperature or 0.0, choices_method=choices_method)
    params = _params(max_tokens=max_tokens, min_tokens=min_tokens, n=n, stop=stop,
                     stop_token_ids=stop_token_ids, stop_regex=stop_regex, temperature=temperature,
                     top_p=top_p, top_k=top_k, min_p=min_p, frequency_penalty=frequency_penalty,
                     presence_penalty=presence_penalty, ignore_eos=ignore_eos,
                     return_logprob=return_logprob, logprob_start_len=logprob_start_len,
                     top_logprobs_num=top_logprobs_num,
                     return_text_in_logprobs=return_text_in_logprobs, seed=seed)
    constraint = _constraint(regex=regex, json_schema=json_schema, ebnf=ebnf, dtype=dtype)
    if tools is not None:
        if constraint is not None:
            raise ValueError("gen() takes tools or one constraint, not both")
        from sgdsl.tools import tool_set

        constraint = ir.Constraint("tools", tool_set(tools, tool_choice))
    return ir.Gen(name, params, constraint)


def gen_int(name: str | None = None, **kwargs: Any) -> ir.Node:
    return gen(name, dtype=int, **kwargs)


def gen_string(name: str | None = None, **kwargs: Any) -> ir.Node:
    return gen(name, dtype=str, **kwargs)


def select(name: str | None = None, choices: Sequence[str] | None = None, temperature: float = 0.0,
           choices_method: Callable[..., Any] = token_length_normalized) -> ir.Select:
    """Pick one of ``choices`` into variable ``name``."""
    if not choices:
        raise ValueError("select() needs a non-empty list of choices")
    return ir.Select(name, tuple(str(c) for c in choices), temperature, choices_method)


def _params(**values: Any) -> ir.SamplingParams:
    for key in _TUPLE_FIELDS:
        value = values[key]
        if value is not None:
            values[key] = (value,) if isinstance(value, (str, int)) else tuple(value)
    return ir.SamplingParams.of(values)


_DTYPES = {"int": int, "float": float, "bool": bool, "str": str}


def _constraint(*, regex: str | None, json_schema: Any, ebnf: str | None, dtype: Any) -> ir.Constraint | None:
    if regex is None and json_schema is None and ebnf is None and dtype is None:
        return None
    given = [k for k, v in (("regex", regex), ("json_schema", json_schema), ("ebnf", ebnf),
                            ("dtype", dtype)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"gen() takes one constraint, got {', '.join(given)}")
    if regex is not None:
        return ir.Constraint("regex", regex)
    if ebnf is not None:
        return ir.Constraint("ebnf", ebnf)
    if dtype is not None:
        resolved = _DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype
        if resolved not in (int, float, bool, str):
            raise ValueError(f"dtype must be int, float, bool or str, not {dtype!r}")
        return ir.Constraint("dtype", resolved)
    if json_schema is not None:
        return _schema_constraint(json_schema)
    return None


@functools.lru_cache(maxsize=256)
def _parse_schema_text(schema: str) -> None:
    """Raises on a malformed schema text. NOTE: remembered per text: every program of a
    ``run_batch`` gives the same one (a 5-field schema parsed 256 times: ~8 ms)."""
    json.loads(schema)


def _schema_constraint(schema: Any) -> ir.Constraint:
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):  # pydantic model
        return ir.Constraint("json_schema", json.dumps(schema.model_json_schema()), model=schema)
    if isinstance(schema, dict):
        return ir.Constraint("json_schema", json.dumps(schema))
    if isinstance(schema, str):
        _parse_schema_text(schema)  # fail here, at the program line, on a malformed schema
        return ir.Constraint("json_schema", schema)
    raise TypeError(f"json_schema must be a str, dict or pydantic model, not {type(schema).__name__}")


def separate_reasoning(expr: Any = None, model_type: str | None = None) -> ir.Node:
    """SGLang's ``separate_reasoning``: each ``gen("x")`` in ``expr`` puts its answer in
    ``x`` (and in the text) and its think section in ``x_reasoning_content``, also while
    streaming. ``model_type``: the reasoning format (default ``deepseek-r1``, as in SGLang)."""
    from sgdsl.reasoning import check_model_type

    kind = check_model_type(model_type)
    if expr is None:
        return ir.Sequence(())
    node = ir.as_node(expr)
    items = node.items if isinstance(node, ir.Sequence) else (node,)
    out = tuple(dataclasses.replace(n, reasoning=kind) if isinstance(n, ir.Gen) else n
                for n in items)
    return ir.Sequence(out)


def _role(role: str, expr: Any = None) -> ir.Node:
    if expr is None:
        return ir.Sequence((ir.RoleBegin(role), ir.RoleEnd(role)))
    return ir.Sequence((ir.RoleBegin(role), ir.as_node(expr), ir.RoleEnd(role)))


def system(expr: Any = None) -> ir.Node:
    return _role("system", expr)


def user(expr: Any = None) -> ir.Node:
    return _role("user", expr)


def assistant(expr: Any = None) -> ir.Node:
    return _role("assistant", expr)


def system_begin() -> ir.Node:
    return ir.RoleBegin("system")


def system_end() -> ir.Node:
    return ir.RoleEnd("system")


def user_begin() -> ir.Node:
    return ir.RoleBegin("user")


def user_end() -> ir.Node:
    return ir.RoleEnd("user")


def assistant_begin() -> ir.Node:
    return ir.RoleBegin("assistant")


def assistant_end() -> ir.Node:
    return ir.RoleEnd("assistant")


def image(source: Any) -> ir.Image:
    """An image: a path, a URL, bytes, a ``data:`` URL or a PIL image."""
    return ir.Image(source)


def commit_lazy() -> ir.CommitLazy:
    return ir.CommitLazy()


def set_default_backend(backend: Any) -> None:
    """The backend programs use when ``run`` gets none (a Backend or a spec string such as
    ``"openai:gpt-4o-mini"``)."""
    from sgdsl.config import set_default_backend as _set  # noqa: PLC0415

    _set(backend)


def flush_cache(backend: Any = None) -> bool:
    """Flush the backend's prefix cache (runtime backends)."""
    from sgdsl.config import resolve_backend  # noqa: PLC0415
    from sgdsl.interpreter.loop import run_sync  # noqa: PLC0415

    target = resolve_backend(backend)
    method = getattr(target, "flush_cache", None)
    if method is None:
        return False
    result = method()
    if hasattr(result, "__await__"):
        result = run_sync(_await(result))
    return bool(result if result is not None else True)


def get_server_info(backend: Any = None) -> dict[str, Any]:
    """The backend's server/model info (runtime backends), else its description."""
    from sgdsl.config import resolve_backend  # noqa: PLC0415
    from sgdsl.interpreter.loop import run_sync  # noqa: PLC0415

    target = resolve_backend(backend)
    method = getattr(target, "get_server_info", None)
    if method is None:
        return {"backend": type(target).__name__, "capabilities": repr(target.capabilities)}
    result = method()
    return run_sync(_await(result)) if hasattr(result, "__await__") else result


async def _await(awaitable: Any) -> Any:
    return await awaitable
