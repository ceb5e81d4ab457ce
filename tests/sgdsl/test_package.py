"""Import hygiene and SGLang name compatibility."""
from __future__ import annotations

import subprocess
import sys

SGLANG_NAMES = [
    "function", "gen", "gen_int", "gen_string", "select", "system", "user", "assistant",
    "system_begin", "system_end", "user_begin", "user_end", "assistant_begin", "assistant_end",
    "image", "set_default_backend", "flush_cache", "get_server_info", "token_length_normalized",
    "greedy_token_selection", "unconditional_likelihood_normalized",
]


def test_import_does_not_load_torch_or_api_clients():
    code = ("import sys, sgdsl; import sgdsl as sgl; sgl.gen('x'); "
            "print(sorted(m for m in ('torch', 'openai', 'anthropic') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_sglang_public_names_exist():
    import sgdsl
    missing = [n for n in SGLANG_NAMES if not callable(getattr(sgdsl, n, None))]
    assert missing == []
    assert "RuntimeEndpoint" in sgdsl.__all__ and "Runtime" in sgdsl.__all__


def test_lazy_backend_reexport():
    import sgdsl
    import sgdsl.backends
    assert sgdsl.RuntimeEndpoint is sgdsl.backends.RuntimeEndpoint
