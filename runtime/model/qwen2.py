"""Qwen2 / Qwen2.5: the Llama decoder with a bias on the q/k/v projections.

``ModelConfig`` sets ``attention_bias=True`` for this family, which gives the packed qkv
projection its bias; everything else is the Llama code.
"""
from __future__ import annotations

from .llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    pass
