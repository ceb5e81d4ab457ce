"""The tokenizer loaded while the scheduler process starts (``TokenizerManager.start``): the
main process has nothing else to do then, and its tokenizer (importing transformers and
reading the tokenizer files: 19 s on one core of the loaded dev box, measured) used to be
loaded only once the scheduler had answered ``Ready``, after the model's load.

``guess_source`` names the folder ``load_tokenizer`` will read where that is known without the
scheduler's answer: an explicit tokenizer, the embedded model once converted, a model folder
with its config. The early tokenizer is used only when ``Ready.model_dir`` names that same
folder; otherwise (a Hub id, a GGUF file, the first conversion of the embedded model) only
transformers' import is done early and the tokenizer is loaded as before.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .loader import load_tokenizer


def guess_source(config: Any) -> Path | None:
    """The tokenizer's folder, if known before the model is resolved; never converts."""
    if config.tokenizer:
        return Path(config.tokenizer)
    if config.model is None:
        from ..model.embedded import converted_embedded_path

        return converted_embedded_path()
    path = Path(config.model).expanduser()
    return path if (path / "config.json").is_file() else None


def source_of(config: Any, model_dir: str | Path) -> Path:
    """The folder ``load_tokenizer(config, model_dir)`` reads."""
    return Path(config.tokenizer) if config.tokenizer else Path(model_dir)


def load_early(config: Any) -> tuple[Path | None, Any]:
    """(folder, tokenizer) for ``guess_source``'s folder, or (None, None) with transformers
    imported. Never raises: the load after ``Ready`` reports any error as before."""
    try:
        source = guess_source(config)
        if source is None:
            import transformers  # noqa: F401 - most of a tokenizer's load time

            return None, None
        return source, load_tokenizer(config, source)
    except Exception:  # noqa: BLE001 - see the docstring
        return None, None


def same_folder(a: Path | None, b: Path) -> bool:
    try:
        return a is not None and a.resolve() == b.resolve()
    except OSError:
        return False
