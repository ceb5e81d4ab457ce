"""Output guards layered over a backend's matcher, for facts the backend does not enforce:
unique object keys and unique array items (``unique_keys.py``, ``unique_items.py``,
``item_domain.py``), string lengths beside patterns (``string_chars.py``,
``pattern_reach.py``), all read off ``json_track.py``'s byte-by-byte view of the JSON output;
valid UTF-8 across tokens (``utf8_tokens.py``); and the bitmask row operations they share
(``token_rows.py``).

Owns narrowing a filled bitmask row; never samples or appends text (``forcing/``) and never
compiles (``compile/``).
"""
