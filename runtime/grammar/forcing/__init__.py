"""Text the grammar forces instead of sampling: jump-forward (``jump_forward.py``), forced
completions when the budget runs out (``completion.py``, with ``budget.py``, ``plan_ahead.py``,
``continuation.py``, ``plan_follow.py`` and the repetition guard ``runaway.py``), the
shortest-completion search (``shortest.py`` over ``moves.py`` and ``search_walk.py``), its
estimates searched in a worker process (``estimate.py``, ``estimate_process.py``,
``estimate_worker.py``), and the manager's appending and undoing of forced tokens
(``appends.py``).

Owns which tokens are appended without sampling; the bitmask itself is the backend's and the
guards' (``backends/``, ``guards/``).
"""
