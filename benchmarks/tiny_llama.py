"""A tiny random Llama for the CPU runs of the benchmarks (``--tiny`` or no ``--model``): 2
layers, hidden 64, the embedded SmolLM2's vocabulary and tokenizer files, loaded with
``load_format="dummy"`` (the tests' ``tiny_model_dir`` in tests/conftest.py is the same shape)."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 49152,
        "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def tiny_llama_dir(max_positions: int = 1024) -> str:
    """A new temporary folder with the tiny config (``max_positions`` long) and a copy of the
    embedded model's tokenizer files."""
    from sgdsl.runtime.model.embedded import embedded_model_path

    src, folder = embedded_model_path(), Path(tempfile.mkdtemp(prefix="sgdsl-tiny-"))
    (folder / "config.json").write_text(json.dumps({**TINY,
                                                    "max_position_embeddings": max_positions}))
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy(src / name, folder / name)
    return str(folder)
