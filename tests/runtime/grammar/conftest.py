"""Shared fixtures: the embedded model's tokenizer and one backend of each kind per session
(building an outlines vocabulary or xgrammar tokenizer info takes ~0.5 s)."""
from __future__ import annotations

import pytest

VOCAB = 49152
EOS = 2


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    from sgdsl.runtime.model.embedded import embedded_model_path

    return AutoTokenizer.from_pretrained(str(embedded_model_path()))


@pytest.fixture(scope="session")
def backends(tokenizer):
    from sgdsl.runtime.grammar import create_grammar_backend

    return {name: create_grammar_backend(name, tokenizer, VOCAB) for name in
            ("xgrammar", "outlines")}


@pytest.fixture(params=["xgrammar", "outlines"])
def backend(request, backends):
    return backends[request.param]


@pytest.fixture(scope="session")
def compilers(backends):
    """One compiler (and its worker processes, ~2 s to start) per backend for the session."""
    from .helpers import shared_compiler, shutdown_shared_compilers

    yield {name: shared_compiler(b) for name, b in backends.items()}
    shutdown_shared_compilers()


@pytest.fixture()
def compiler(backend, compilers):
    return compilers[backend.name]


@pytest.fixture(scope="session")
def quotes(tokenizer):
    """The vocabulary's quote and length tables for the unique-keys guard (``guarded``)."""
    from sgdsl.runtime.grammar.guards.unique_keys import build_quote_tokens

    return build_quote_tokens(tokenizer, VOCAB)


@pytest.fixture(scope="session", params=["xgrammar", "outlines"])
def json_engine(request):
    """The embedded model behind each grammar backend, as served (jump-forward, forced
    completions and the mask prefetch on), for the end-to-end tests of every module that
    needs one: the suite's shared engines (tests/conftest.py: ``embedded_engine`` is the
    default xgrammar one, ``outlines_engine`` the outlines one), so no module starts its own."""
    name = "embedded_engine" if request.param == "xgrammar" else "outlines_engine"
    return request.getfixturevalue(name)


@pytest.fixture(scope="session")
def token_texts(tokenizer):
    """Each token id decoded alone (only used to pick short/closing tokens in random walks)."""
    return [tokenizer.decode([i]) for i in range(VOCAB)]


@pytest.fixture(scope="session")
def walker(tokenizer, token_texts):
    from .helpers import Walker

    return Walker(tokenizer, token_texts)
