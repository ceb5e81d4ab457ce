"""The grammar backends and their lowering: xgrammar (``xgrammar.py``, the default: compiles;
its per-request matcher in ``xgrammar_matcher.py``, whose native threads are
``xgrammar_threads.py``; what its compile workers send back, ``xgrammar_transfer.py``) and
outlines-core (``outlines.py``, which lowers every
constraint to a regex: ``outlines_bounds.py``, ``outlines_patterns.py``, ``number_range.py``,
``any_value.py``, ``schema_unroll.py``, ``ebnf_regex.py``; its shortest completions tabled at
compile time, ``outlines_completion.py``), and where a backend's own compiler failed
(``failure_site.py``).

Owns what each backend compiles and how its matcher fills and accepts; not the schema rewrite
both share (``schema/``), the guards layered over a matcher (``guards/``) or when compiles run
(``compile/``). ``registry.py`` picks a backend by name.
"""
