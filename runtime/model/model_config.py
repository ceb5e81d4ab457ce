"""ModelConfig: the architecture facts the runtime needs, read once from an HF ``config.json``.

transformers' ``AutoConfig`` parses the file (it knows every model family's defaults and the
old/new rope field names); this module flattens the result into one frozen dataclass so the
model code never touches transformers objects.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError

# Architecture name (config.json "architectures"[0]) -> model family. The registry maps the
# same names to classes; this table only decides how to read family-specific fields.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral",
    # mm: vision-language models (runtime/multimodal); the fields below are the language model's
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
    "LlavaForConditionalGeneration": "llava",
}
_MODEL_TYPE_TO_ARCH = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                       "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                       "qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM"}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
MM_FAMILIES = ("qwen2_5_vl", "llava")  # mm:


@dataclass(frozen=True)
class RopeScaling:
    """Rotary scaling parameters; ``rope_type="default"`` means none."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling
    tie_word_embeddings: bool
    attention_bias: bool  # bias on q/k/v projections (Qwen2)
    qk_norm: bool  # per-head RMSNorm on q and k before rotary (Qwen3)
    eos_token_ids: tuple[int, ...]
    max_context_len: int
    hidden_act: str = "silu"
    torch_dtype: str | None = None  # dtype the checkpoint was saved in, informational
    # Mixture of experts (0 experts: dense). moe_layers: indices of the layers whose MLP is
    # the routed experts; the others use a dense MLP of intermediate_size.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True  # renormalize the top-k routing weights to sum to 1
    moe_layers: tuple[int, ...] = ()
    # The checkpoint's HF quantization_config (e.g. quant_method fp8), None: not quantized.
    quantization_config: dict[str, Any] | None = field(default=None, compare=False)
    # mm: a vision-language model's whole transformers config (vision tower, image token ids);
    # None for text-only models.
    mm_config: Any = field(default=None, compare=False, repr=False)

    @property
    def is_multimodal(self) -> bool:  # mm:
        return self.mm_config is not None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":
        """Read ``model_dir/config.json``; raise ModelLoadError for a missing file or an
        unsupported architecture."""
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ModelLoadError(f"no config.json in model directory {Path(model_dir)}")
        raw = json.loads(path.read_text())
        arch = _architecture(raw, path)
        from .plain_config import plain_llama

        plain = plain_llama(raw)  # no transformers import where the file states everything
        if plain is not None:
            return cls.from_hf(plain, arch)
        from transformers import AutoConfig

        try:
            hf = AutoConfig.from_pretrained(str(model_dir))
        except Exception as e:  # transformers raises many types for bad configs
            raise ModelLoadError(f"cannot parse {path}: {e}") from e
        return cls.from_hf(hf, arch)

    @classmethod
    def from_hf(cls, hf: Any, architecture: str | None = None) -> "ModelConfig":
        """Flatten a transformers ``PretrainedConfig``."""
        arch = architecture or _architecture(hf.to_dict(), "config")
        family = SUPPORTED_ARCHITECTURES[arch]
        mm_config = hf if family in MM_FAMILIES else None  # mm: the language model's fields
        if mm_config is not None:
            hf = hf.text_config
        heads = hf.num_attention_heads
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
        theta, scaling = _rope(hf)
        if family in ("qwen2", "qwen2_5_vl") or getattr(hf, "model_type", "") == "qwen2":
            bias = True  # Qwen2 always has q/k/v bias; its config has no flag for it
        else:
            bias = bool(getattr(hf, "attention_bias", False))
        dtype = getattr(hf, "dtype", None) or getattr(hf, "torch_dtype", None)
        return cls(
            architecture=arch, model_type=family, num_layers=hf.num_hidden_layers,
            hidden_size=hf.hidden_size, num_heads=heads,
            num_kv_heads=getattr(hf, "num_key_value_heads", None) or heads, head_dim=head_dim,
            intermediate_size=hf.intermediate_size, vocab_size=hf.vocab_size,
            rms_norm_eps=float(hf.rms_norm_eps), rope_theta=theta, rope_scaling=scaling,
            tie_word_embeddings=bool(getattr(mm_config or hf, "tie_word_embeddings", False)),
            attention_bias=bias, qk_norm=family in ("qwen3", "qwen3_moe"),
            eos_token_ids=_eos_ids(getattr(hf, "eos_token_id", None)
                                   or getattr(mm_config, "eos_token_id", None)),
            max_context_len=_context_len(hf),
            hidden_act=getattr(hf, "hidden_act", "silu"),
            torch_dtype=str(dtype).replace("torch.", "") if dtype is not None else None,
            quantization_config=_quant_config(hf), mm_config=mm_config,
            **_moe_fields(hf, family),
        )


def _moe_fields(hf: Any, family: str) -> dict[str, Any]:
    """Expert counts and which layers are sparse (Qwen3-MoE: every ``decoder_sparse_step``-th
    layer not in ``mlp_only_layers``; Mixtral: all, always renormalized)."""
    if family not in ("qwen3_moe", "mixtral"):
        return {}
    experts = int(getattr(hf, "num_experts", None) or getattr(hf, "num_local_experts", 0) or 0)
    layers = range(hf.num_hidden_layers)
    if family == "mixtral":
        return dict(num_experts=experts, num_experts_per_tok=int(hf.num_experts_per_tok),
                    moe_intermediate_size=int(hf.intermediate_size), norm_topk_prob=True,
                    moe_layers=tuple(layers))
    step = int(getattr(hf, "decoder_sparse_step", 1) or 1)
    dense = set(getattr(hf, "mlp_only_layers", None) or ())
    sparse = tuple(i for i in layers if experts > 0 and i not in dense and (i + 1) % step == 0)
    return dict(num_experts=experts, num_experts_per_tok=int(hf.num_experts_per_tok),
                moe_intermediate_size=int(hf.moe_intermediate_size),
                norm_topk_prob=bool(getattr(hf, "norm_topk_prob", False)), moe_layers=sparse)


def _quant_config(hf: Any) -> dict[str, Any] | None:
    q = getattr(hf, "quantization_config", None)
    if q is None:
        return None
    return dict(q) if isinstance(q, dict) else q.to_dict()


def _architecture(raw: dict[str, Any], where: object) -> str:
    archs = raw.get("architectures") or []
    if not archs and raw.get("model_type") in _MODEL_TYPE_TO_ARCH:
        archs = [_MODEL_TYPE_TO_ARCH[raw["model_type"]]]
    for arch in archs:
        if arch in SUPPORTED_ARCHITECTURES:
            return arch
    raise ModelLoadError(
        f"unsupported architecture {archs or raw.get('model_type')!r} in {where}; "
        f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")


def _rope(hf: Any) -> tuple[float, RopeScaling]:
    # NOTE: transformers 5 puts theta and scaling in ``rope_parameters``; older configs (and
    # older transformers) use ``rope_theta`` + ``rope_scaling``. Accept both.
    params = dict(getattr(hf, "rope_parameters", None) or {})
    legacy = getattr(hf, "rope_scaling", None)
    if not params and isinstance(legacy, dict):
        params = dict(legacy)
    theta = float(params.get("rope_theta") or getattr(hf, "rope_theta", None) or 10000.0)
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "mrope":  # mm: Qwen2.5-VL's 3-D rotary (model/qwen2_5_vl.py reads the sections)
        rope_type = "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(f"unsupported rope scaling type {rope_type!r}; "
                             f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    orig = params.get("original_max_position_embeddings")
    scaling = RopeScaling(
        rope_type=rope_type, factor=float(params.get("factor") or 1.0),
        low_freq_factor=float(params.get("low_freq_factor") or 1.0),
        high_freq_factor=float(params.get("high_freq_factor") or 4.0),
        original_max_position_embeddings=int(orig) if orig else None)
    return theta, scaling


def _context_len(hf: Any) -> int:
    n = int(getattr(hf, "max_position_embeddings", 2048))
    window = getattr(hf, "sliding_window", None)
    # NOTE: attention here is always full; a sliding-window model (Mistral v0.1) is exact only
    # while the sequence fits in its window, so the window caps the context length.
    if window and getattr(hf, "use_sliding_window", True):
        n = min(n, int(window))
    return n


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)
