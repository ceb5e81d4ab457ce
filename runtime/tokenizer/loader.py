"""Loading the HF tokenizer of a model: from ``config.tokenizer``, the model's directory, or the
tokenizer embedded in a GGUF file. Used by the main process and by the scheduler process."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ModelLoadError


def load_tokenizer(config: Any, model_dir: str | Path) -> Any:
    from transformers import AutoTokenizer

    source = Path(config.tokenizer) if config.tokenizer else Path(model_dir)
    try:
        if source.is_file() and source.suffix == ".gguf":
            return AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
        return AutoTokenizer.from_pretrained(str(source))
    except Exception as exc:  # noqa: BLE001 - rewrap with the path that failed
        raise ModelLoadError(f"cannot load a tokenizer from {source}: {exc}") from exc
