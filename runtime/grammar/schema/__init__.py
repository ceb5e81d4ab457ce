"""JSON Schema preparation for the grammar backends, and the check of finished outputs.

- ``normalize_schema`` rewrites a schema (any draft from 04 to 2020-12) into the subset both
  backends enforce exactly: references inlined, ``allOf`` merged, sibling keywords distributed
  into ``anyOf``/``oneOf`` branches, conditionals and dependencies rewritten, formats spelled as
  exact patterns. Every instance of the result is an instance of the original; what cannot be
  rewritten so is rejected, naming the keyword and its JSON path.
- ``OutputValidator`` checks a finished output against the *original* schema (the backstop).

Where each step lives (``normalizer.py`` drives them): harmless repeats dropped
(``lenient.py``), older drafts respelled (``drafts.py``), ``$ref`` (``refs.py``), ``allOf`` and
siblings merged (``merge.py``, ``finalize.py``), conditionals (``conditional.py``), ``not``
(``negation.py``, ``string_complement.py``), ``oneOf`` (``oneof.py``, ``subsume.py``), strings
and formats (``strings.py``, ``lookaround.py``; patterns parsed, intersected, bounded and listed:
``patterns.py``, ``pattern_meet.py``, ``pattern_length.py``, ``pattern_start.py``,
``pattern_values.py``), arrays (``arrays.py``), the last spelling (``emit.py``, ``sharing.py``,
``tuning.py``); lengths the runtime counts (``lengths.py``); which keywords a backend enforces
(``support.py``); how a rejection names keyword and path (``rejection.py``); the backstop's
regex time bound (``timed_keywords.py``, ``validator.py``).
"""
from .normalizer import normalize_schema
from .validator import OutputValidator

__all__ = ["OutputValidator", "normalize_schema"]
