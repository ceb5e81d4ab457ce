"""On the GPU: a batch-1 decoder layer with its RMSNorms and residual adds folded into the
matrix-vector products (layers/gemv_fusion.py, ``SGDSL_GEMV_FUSION=1``, the norms' tiles from
a ``SGDSL_DECODE_GEMM_TABLE``) against the same layer with the separate kernels, bf16 and fp8
weights; and a small bf16 Llama's decode logits (triton + CUDA graphs) with and without the
fusion (and the products' epilogues), on the same tokens, against the fp32 model's."""
from __future__ import annotations

import json

import pytest
import torch

from .conftest import graph_decode, rel_err

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ON = "SGDSL_GEMV_FUSION"
TILES = ["gemv:1,2048,4", "gemv:2,2048,1"]  # per norm-folding shape (qkv, gate_up)


@pytest.fixture()
def fusion_on(tmp_path, monkeypatch):
    """Fusion on, with a table folding the norms of the tiny model's qkv and gate_up (bf16 and
    fp8 weights); the tables' rows are keyed ``norm:N,K,element bytes``."""
    table = {f"norm:{n},512,{e}": tile for e in (1, 2)
             for n, tile in zip((768, 2752), TILES)}
    (tmp_path / "tiles.json").write_text(json.dumps(table))
    monkeypatch.setenv("SGDSL_DECODE_GEMM_TABLE", str(tmp_path / "tiles.json"))
    monkeypatch.setenv(ON, "1")


def _layer(path, quant):
    from sgdsl.runtime.layers.linear import LinearBase
    from sgdsl.runtime.layers.quantization.base import QuantConfig
    from sgdsl.runtime.model.llama import LlamaDecoderLayer
    from sgdsl.runtime.model.model_config import ModelConfig

    cfg = ModelConfig.from_dir(str(path))
    layer = LlamaDecoderLayer(cfg, 0, torch.bfloat16, "cuda",
                              QuantConfig("fp8") if quant else None)
    gen = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5, generator=gen)
            else:
                p.normal_(0, 0.03, generator=gen)
    for m in layer.modules():
        if isinstance(m, LinearBase):
            m.process_weights_after_loading()
    # attention replaced by a fixed function of q|k|v (the layer's other parts are under test)
    q_size = layer.self_attn.q_size
    layer.self_attn.attend = lambda qkv, *_: torch.tanh(qkv[:, :q_size] * 0.5)
    return layer


class _NoStore:
    """An attention backend stand-in that stores k/v itself: qkv keeps no rotary epilogue."""

    def kv_store_target(self, *_):
        return None


@pytest.mark.parametrize("quant", [False, True], ids=["bf16", "fp8"])
def test_fused_layer_matches_separate_kernels(tiny_llama_dir, quant, fusion_on, monkeypatch):
    layer = _layer(tiny_llama_dir, quant)
    hidden = layer.input_layernorm.hidden_size
    h = torch.randn(1, hidden, device="cuda").bfloat16()
    res = torch.randn(1, hidden, device="cuda").bfloat16()
    with torch.no_grad():
        args = layer.gemv_fusion(h)
        assert args is not None and None not in args, "both norms must be folded here"
        fused = [layer(h, r, None, None, _NoStore()) for r in (res, None)]
        monkeypatch.delenv(ON)
        assert layer.gemv_fusion(h) is None
        plain = [layer(h, r, None, None, _NoStore()) for r in (res, None)]
    for (out, none), (ref_out, ref_res) in zip(fused, plain):
        assert none is None  # the fused layer hands on the whole residual stream
        assert rel_err(out, ref_out.float() + ref_res.float()) < 1e-2
    # more than one row: the separate kernels, fusion or not
    monkeypatch.setenv(ON, "1")
    assert layer.gemv_fusion(torch.cat([h, h])) is None


def _decode_logits(path, forced: list[int] | None, dtype: str = "bfloat16"
                   ) -> tuple[list[int], list[torch.Tensor]]:
    out, logits = graph_decode(path, forced, dtype)
    return out[1:], logits[1:]


def test_model_decode_fused_vs_separate(tiny_llama_dir, fusion_on, monkeypatch):
    """Teacher-forced on the fused run's tokens: the fused bf16 logits are as close to the
    fp32 model's (no fusion: fp32 weights keep cuBLAS) as the separate kernels' are."""
    tokens, fused = _decode_logits(tiny_llama_dir, None)
    _, ref = _decode_logits(tiny_llama_dir, tokens, "float32")
    monkeypatch.delenv(ON)
    _, plain = _decode_logits(tiny_llama_dir, tokens)
    assert len(fused) == len(plain) == len(ref) == 16
    fused_err = max(rel_err(a, r) for a, r in zip(fused, ref))
    plain_err = max(rel_err(b, r) for b, r in zip(plain, ref))
    assert plain_err < 0.1 and fused_err < 1.5 * plain_err + 5e-3, (fused_err, plain_err)


def test_model_decode_epilogues_vs_separate(tiny_llama_dir, monkeypatch):
    """The products' epilogues (layers/gemv_epilogue.py: SiLU after gate_up, rotary + KV store
    after qkv; on by default) against the separate kernels (``SGDSL_GEMV_EPILOGUE=0``), as
    above: teacher-forced, each against the fp32 model's logits."""
    tokens, fused = _decode_logits(tiny_llama_dir, None)
    _, ref = _decode_logits(tiny_llama_dir, tokens, "float32")
    monkeypatch.setenv("SGDSL_GEMV_EPILOGUE", "0")
    _, plain = _decode_logits(tiny_llama_dir, tokens)
    fused_err = max(rel_err(a, r) for a, r in zip(fused, ref))
    plain_err = max(rel_err(b, r) for b, r in zip(plain, ref))
    assert plain_err < 0.1 and fused_err < 1.5 * plain_err + 5e-3, (fused_err, plain_err)
