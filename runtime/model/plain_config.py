"""A Llama ``config.json`` that states every field the runtime reads, read as plain JSON.

transformers' ``AutoConfig`` is the general reader (every family's defaults, the old and new
rope field names), but importing its config machinery pulls in ``torch.distributed.tensor``,
sympy and ``torch._decomp`` (transformers 5: ``configuration_utils`` -> ``activations`` ->
``core_model_loading``): 2.3 s of CPU in a scheduler process that has torch already, more in
one that does not, on every engine start and every rank (benchmarks/RESULTS.md, branch
``suite-fast2``). Where the file leaves nothing to a default (the embedded SmolLM2, the tests'
tiny models, a saved Llama checkpoint), ``AutoConfig`` would only copy the file's values, so
they are read here instead; ``plain_llama`` answers None for anything else, and the caller
uses ``AutoConfig`` as before. ``tests/runtime/model/test_plain_config.py`` checks both paths
give the same ``ModelConfig``.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

# Read by ``ModelConfig.from_hf`` for the llama family, with no default of ours that could
# differ from LlamaConfig's (head_dim and attention_bias are defaulted the same way there).
REQUIRED = ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
            "intermediate_size", "vocab_size", "rms_norm_eps", "max_position_embeddings",
            "tie_word_embeddings", "eos_token_id", "hidden_act")
# Keys whose presence means transformers would do more than copy values (rope scaling,
# quantization, a sliding window, remote code, a nested text config): AutoConfig reads those.
DEFER = ("rope_scaling", "quantization_config", "sliding_window", "auto_map", "text_config")
_DTYPES = ("float32", "float16", "bfloat16")
_INT = ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
        "intermediate_size", "vocab_size", "max_position_embeddings")
_TYPES = {**{k: int for k in _INT}, "rms_norm_eps": float, "tie_word_embeddings": bool,
          "eos_token_id": list, "hidden_act": str}


def plain_llama(raw: dict[str, Any]) -> SimpleNamespace | None:
    """``raw`` (a parsed config.json) as the attributes ``from_hf`` reads, or None where
    ``AutoConfig`` must read it."""
    if raw.get("model_type") != "llama" \
            or raw.get("architectures") not in (None, ["LlamaForCausalLM"]):
        return None
    if any(raw.get(k) is None for k in REQUIRED) or any(raw.get(k) is not None for k in DEFER):
        return None
    theta = _theta(raw)
    dtype = raw.get("dtype", raw.get("torch_dtype"))
    if theta is None or (dtype is not None and dtype not in _DTYPES):
        return None
    optional = {k: t for k, t in (("head_dim", int), ("attention_bias", bool)) if k in raw}
    if not all(_typed(raw[k], t) for k, t in {**_TYPES, **optional}.items()):
        return None  # AutoConfig validates and reports it
    fields = {k: raw[k] for k in REQUIRED}
    heads = fields["num_attention_heads"]
    fields.update(model_type="llama", rope_parameters={"rope_type": "default", "rope_theta": theta},
                  head_dim=raw.get("head_dim") or fields["hidden_size"] // heads,
                  attention_bias=bool(raw.get("attention_bias", False)), dtype=dtype)
    return SimpleNamespace(**fields)


def _theta(raw: dict[str, Any]) -> float | None:
    """Rope theta where no scaling is asked for: ``rope_theta`` (older files) or a default-type
    ``rope_parameters`` (transformers 5); None for anything else."""
    params = raw.get("rope_parameters")
    if params is not None and raw.get("rope_theta") is not None:
        return None  # two sources: transformers' precedence decides
    if params is None:
        theta = raw.get("rope_theta")
    elif set(params) <= {"rope_type", "rope_theta"} and params.get("rope_type") == "default":
        theta = params.get("rope_theta")
    else:
        return None
    return float(theta) if isinstance(theta, (int, float)) and not isinstance(theta, bool) else None


def _typed(value: Any, kind: type) -> bool:
    """``value`` is of the JSON kind a LlamaConfig field takes (bools are not numbers here;
    an eos id is an int or a list of ints; a positive size)."""
    if kind is bool or kind is str:
        return isinstance(value, kind)
    if isinstance(value, bool):
        return False
    if kind is int:
        return isinstance(value, int) and value > 0
    if kind is float:
        return isinstance(value, (int, float)) and value > 0
    items = value if isinstance(value, list) else [value]
    return bool(items) and all(isinstance(v, int) and not isinstance(v, bool) for v in items)
