"""Architecture name (config.json ``architectures``) -> model class."""
from __future__ import annotations

from torch import nn

from ..errors import ModelLoadError
from .llama import LlamaForCausalLM
from .mixtral import MixtralForCausalLM
from .llava import LlavaForConditionalGeneration
from .qwen2 import Qwen2ForCausalLM
from .qwen2_5_vl import Qwen2_5_VLForConditionalGeneration
from .qwen3 import Qwen3ForCausalLM
from .qwen3_moe import Qwen3MoeForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,  # same layout; no sliding window support yet
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "Qwen2_5_VLForConditionalGeneration": Qwen2_5_VLForConditionalGeneration,  # mm:
    "LlavaForConditionalGeneration": LlavaForConditionalGeneration,  # mm:
}


def get_model_class(architecture: str) -> type[nn.Module]:
    try:
        return MODEL_REGISTRY[architecture]
    except KeyError:
        raise ModelLoadError(f"unsupported architecture {architecture!r}; "
                             f"supported: {', '.join(MODEL_REGISTRY)}") from None
