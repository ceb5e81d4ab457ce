"""``s.system/user/assistant``: the role accessors shared by ProgramState and the tracer's state.
Each class supplies ``_role(role, expr)`` (append a turn, or open one as a context manager)."""
from __future__ import annotations

from typing import Any


class RoleMethods:
    def _role(self, role: str, expr: Any) -> Any:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    def system(self, expr: Any = None) -> Any:
        """``s.system("...")`` appends a system turn; ``with s.system():`` writes one."""
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Any:
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        return self._role("assistant", expr)
