"""Compiling grammars without hurting the server: size limits checked up front
(``limits.py``, ``vacuous_bounds.py``), compiles in killable worker processes with a deadline
and a memory budget (``worker.py``, ``worker_handle.py``, ``worker_pool.py``, its
``pool_limits.py`` and unit of work ``compile_job.py``; forked from one zygote process that
did the imports once, ``zygote.py``), admission control
of their queue (``admission.py``), the in-memory cache with in-flight dedupe
(``compiler.py``), the on-disk cache shared across restarts (``disk_cache.py``,
``disk_loader.py``, ``cache_identity.py``) and warming ahead of requests (``precompile.py``).

Owns the path from a ``GrammarKey`` to a compiled grammar; not what a matcher does per step
(``backends/``) nor how a schema is rewritten (``schema/``).
"""
