"""Tiny EAGLE and EAGLE3 draft heads written as safetensors in the published layouts (names as in
yuhuili/EAGLE-LLaMA3.1-Instruct-8B and yuhuili/EAGLE3-LLaMA3.1-Instruct-8B), for a tiny Llama
target of hidden size 64 (tests/conftest.py TINY_CONFIG)."""
from __future__ import annotations

import json
from pathlib import Path

HIDDEN, INTER, VOCAB, DRAFT_VOCAB = 64, 128, 49152, 1000
D2T_STEP = 3  # draft id i is target id i + 3 * i


def write_head(folder: Path, base_config: dict, eagle3: bool, seed: int = 1) -> Path:
    """A head directory (config.json + model.safetensors) with random weights."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int):
        return torch.randn(*shape, generator=gen) * 0.05

    pre = "midlayer." if eagle3 else "layers.0."
    qin = 2 * HIDDEN if eagle3 else HIDDEN
    t = {pre + "self_attn.q_proj.weight": rand(64, qin), pre + "self_attn.k_proj.weight": rand(32, qin),
         pre + "self_attn.v_proj.weight": rand(32, qin), pre + "self_attn.o_proj.weight": rand(64, 64),
         pre + "mlp.gate_proj.weight": rand(INTER, HIDDEN), pre + "mlp.up_proj.weight": rand(INTER, HIDDEN),
         pre + "mlp.down_proj.weight": rand(HIDDEN, INTER),
         pre + "post_attention_layernorm.weight": torch.ones(HIDDEN)}
    config = dict(base_config, num_hidden_layers=1)
    if eagle3:
        config.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=DRAFT_VOCAB,
                      tie_word_embeddings=False)
        t.update({"fc.weight": rand(HIDDEN, 3 * HIDDEN), pre + "input_layernorm.weight": torch.ones(HIDDEN),
                  pre + "hidden_norm.weight": torch.ones(HIDDEN), "norm.weight": torch.ones(HIDDEN),
                  "lm_head.weight": rand(DRAFT_VOCAB, HIDDEN),
                  "d2t": torch.arange(DRAFT_VOCAB) * D2T_STEP,
                  "t2d": torch.zeros(VOCAB, dtype=torch.bool)})
    else:  # EAGLE: fc with bias; the embedding is carried but the target's is used
        t.update({"fc.weight": rand(HIDDEN, 2 * HIDDEN), "fc.bias": rand(HIDDEN),
                  "embed_tokens.weight": rand(VOCAB, HIDDEN)})
    (folder / "config.json").write_text(json.dumps(config))
    save_file(t, str(folder / "model.safetensors"))
    return folder
