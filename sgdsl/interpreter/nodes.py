"""Execution of the non-generating nodes: text, roles, variable scopes, images, commits."""
from __future__ import annotations

from typing import TYPE_CHECKING

from sgdsl import ir
from sgdsl.backends.base import Message
from sgdsl.errors import UnsupportedError
from sgdsl.interpreter.images import load_image

if TYPE_CHECKING:
    from sgdsl.interpreter.executor import StateExecutor


async def run_node(ex: "StateExecutor", node: ir.Node) -> None:
    if isinstance(node, ir.Image):
        await add_image(ex, node)
    elif isinstance(node, ir.CommitLazy):
        await ex.backend.cache_prefix(ex.context())
    else:
        run_local(ex, node)


def run_local(ex: "StateExecutor", node: ir.Node) -> None:
    """The nodes that need no backend (see ``executor.is_local``)."""
    if isinstance(node, ir.Sequence):
        for item in node.items:
            run_local(ex, item)
        return
    ex._current = node
    if isinstance(node, ir.Text):
        fill_text(ex, node.value)
    elif isinstance(node, ir.RoleBegin):
        role_begin(ex, node.role)
    elif isinstance(node, ir.RoleEnd):
        role_end(ex, node.role)
    elif isinstance(node, ir.VarScopeBegin):
        ex.scopes[node.name] = len(ex.text_)
    elif isinstance(node, ir.VarScopeEnd):
        var_scope_end(ex, node.name)
    else:
        raise TypeError(f"cannot append {type(node).__name__} to a program state")


def fill_text(ex: "StateExecutor", value: str) -> None:
    # NOTE: API speculative execution: constant text that the speculated continuation already
    # contains is consumed from it, so the next gen can keep reading ahead.
    if ex.speculated.startswith(value):
        ex.speculated = ex.speculated[len(value):]
    else:
        ex.speculated = ""
    ex.fill(value)


def role_begin(ex: "StateExecutor", role: str) -> None:
    if ex.cur_role is not None:
        raise ValueError(f"nested roles: a {role!r} turn begins inside an open {ex.cur_role!r} turn")
    default_system = ex.template.default_system_prompt
    if not ex.messages_ and role != "system" and default_system:
        role_begin(ex, "system")
        ex.fill(default_system)
        role_end(ex, "system")
    prefix, _ = ex.template.get_prefix_and_suffix(role, ex.messages_)
    ex.cur_role = role
    ex.fill(prefix, kind="begin")
    ex.cur_role_begin = len(ex.text_)
    ex.speculated = ""


def role_end(ex: "StateExecutor", role: str) -> None:
    if ex.cur_role != role:
        raise ValueError(f"{role}_end() without a matching {role}_begin() (open turn: {ex.cur_role!r})")
    content = ex.text_[ex.cur_role_begin:].lstrip()
    _, suffix = ex.template.get_prefix_and_suffix(role, ex.messages_)
    ex.fill(suffix, kind="end")
    ex.messages_.append(Message(role, content, tuple(ex.cur_images)))
    ex.cur_images = []
    ex.cur_role = None
    ex.speculated = ""


def var_scope_end(ex: "StateExecutor", name: str) -> None:
    if name not in ex.scopes:
        raise ValueError(f"var_scope {name!r} ends without having begun")
    ex.variables[name] = ex.text_[ex.scopes.pop(name):]


async def add_image(ex: "StateExecutor", node: ir.Image) -> None:
    caps = ex.backend.capabilities
    name = type(ex.backend).__name__
    if not caps.images:
        raise UnsupportedError(f"{name} does not accept images (its model or API is text-only)")
    if caps.max_images is not None and len(ex.images_) >= caps.max_images:
        raise UnsupportedError(f"{name} accepts at most {caps.max_images} image(s) per program")
    image = await load_image(node.source)
    ex.images_.append(image)
    ex.cur_images.append(image)
    ex.mark("image", len(ex.images_) - 1, "" if caps.chat_only else ex.template.image_token)
