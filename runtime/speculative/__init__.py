"""Speculative decoding: drafters propose token trees, one verifier checks them on the target.

``base.py`` holds the shared shapes (``DraftTree``, ``Drafter``); one file per drafter
(``ngram.py``, ``standalone.py``, ``eagle.py``); ``registry.py`` builds the configured one.
"""
