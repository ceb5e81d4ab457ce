"""JSON Schema preparation for the grammar backends, and the check of finished outputs.

- ``normalize_schema`` rewrites a schema (any draft from 04 to 2020-12) into the subset both
  backends enforce exactly: references inlined, ``allOf`` merged, sibling keywords distributed
  into ``anyOf``/``oneOf`` branches, conditionals and dependencies rewritten, formats spelled as
  exact patterns. Every instance of the result is an instance of the original; what cannot be
  rewritten so is rejected, naming the keyword and its JSON path.
- ``OutputValidator`` checks a finished output against the *original* schema (the backstop).
"""
from .normalizer import normalize_schema
from .validator import OutputValidator

__all__ = ["OutputValidator", "normalize_schema"]
