"""Loading the HF tokenizer of a model: from ``config.tokenizer``, the model's directory, or the
tokenizer embedded in a GGUF file. Used by the main process and by the scheduler process.

A folder whose ``tokenizer_config.json`` declares transformers 5's ``TokenizersBackend`` (what
``save_pretrained`` writes for a ``tokenizer.json`` tokenizer, e.g. the embedded SmolLM2) for a
model family ``AutoTokenizer`` keeps that class for is loaded by that class directly:
``AutoTokenizer`` reads the model's config first, and transformers' config machinery imports
``torch.distributed.tensor``, sympy and ``torch._decomp`` (3-4 s of CPU in a process without
torch: a server's main process, every engine's scheduler; benchmarks/RESULTS.md, branch
``suite-fast2``). Anything else goes through ``AutoTokenizer`` as before;
``tests/runtime/tokenizer/test_loader.py`` checks both give the same tokenizer.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError

# Model families (config.json ``model_type``) for which ``AutoTokenizer`` returns a declared
# ``TokenizersBackend`` itself (transformers 5.24: not so for qwen2, which gets Qwen2Tokenizer;
# the test checks each family listed here against AutoTokenizer).
DIRECT_MODEL_TYPES = frozenset({"llama"})
DIRECT_CLASS = "TokenizersBackend"


def load_tokenizer(config: Any, model_dir: str | Path) -> Any:
    source = Path(config.tokenizer) if config.tokenizer else Path(model_dir)
    try:
        if source.is_file() and source.suffix == ".gguf":
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
        direct = _direct_class(source)
        if direct is not None:
            return direct.from_pretrained(str(source))
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(source))
    except Exception as exc:  # noqa: BLE001 - rewrap with the path that failed
        raise ModelLoadError(f"cannot load a tokenizer from {source}: {exc}") from exc


def _direct_class(folder: Path) -> Any:
    """``TokenizersBackend`` where ``AutoTokenizer`` would pick it for ``folder``, else None."""
    try:
        tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
        model_cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if (not isinstance(tok_cfg, dict) or tok_cfg.get("tokenizer_class") != DIRECT_CLASS
            or "auto_map" in tok_cfg or not (folder / "tokenizer.json").is_file()
            or not isinstance(model_cfg, dict) or "auto_map" in model_cfg
            or model_cfg.get("model_type") not in DIRECT_MODEL_TYPES):
        return None
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # transformers 4: no such class; AutoTokenizer decides
        return None
    return TokenizersBackend
