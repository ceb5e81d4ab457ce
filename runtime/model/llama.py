"""Llama-family decoder (Llama 2/3.x, SmolLM2, Mistral) on the runtime's own layers.

Module and parameter names follow the HF checkpoints, except the fused projections:
``qkv_proj`` packs q/k/v and ``gate_up_proj`` packs gate/up (filled shard by shard at load).
Qwen2 and Qwen3 subclass these pieces (see qwen2.py, qwen3.py).

Tensor parallel (``runtime/distributed``): qkv and gate/up are column-parallel, o and down
row-parallel (all-reduced), the embedding and lm_head vocab-parallel; each rank's attention
sees only its heads. At tp_size 1 all of it is the plain single-device computation.
"""
from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed import pipeline, pipeline_model
from ..distributed.pipeline import current_stage
from ..errors import ModelLoadError
from ..kernels.dispatch import use_triton
from ..layers import cpu_kernels
from ..layers import gemv_epilogue, gemv_fusion
from ..layers.activation import SiluAndMul
from ..layers.attention.base import AttentionBackend
from ..layers.linear import (LinearBase, MergedColumnParallelLinear, QKVParallelLinear,
                             RowParallelLinear, cpu_layout, reduce_add_rmsnorm, split_matmul,
                             split_matvec)
from ..layers.quantization.base import DECODE_ROWS, QuantConfig, UnquantizedLinearMethod
from ..layers.vocab_parallel import ParallelLMHead, VocabParallelEmbedding, gather_logits
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryEmbedding
from .forward_batch import ForwardBatch
from .llama_weights import LlamaWeights
from .model_config import ModelConfig

Rope = tuple[torch.Tensor, torch.Tensor]


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype, device: str,
                 quant: QuantConfig | None = None) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.head_dim = cfg.head_dim
        self.scaling = cfg.head_dim ** -0.5
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, cfg.head_dim, cfg.num_heads,
                                          cfg.num_kv_heads, bias=cfg.attention_bias, quant=quant,
                                          dtype=dtype, device=device)
        # this rank's heads (all of them at tp_size 1)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(cfg.q_size, cfg.hidden_size, quant=quant, dtype=dtype,
                                        device=device)

    def rotate_qk(self, qk: torch.Tensor, rope: Rope) -> torch.Tensor:
        """The torch path: rotary on q and k together (``[tokens, heads + kv_heads,
        head_dim]``): one set of ops instead of two per layer."""
        return RotaryEmbedding.apply(qk, *rope)

    def qk_norms(self) -> tuple[RMSNorm, RMSNorm] | None:
        """Per-head q and k RMSNorms applied before the rotary (Qwen3); None: no norms."""
        return None

    def qk_and_store(self, heads: torch.Tensor, rope: Rope, batch: ForwardBatch,
                     attn: AttentionBackend) -> tuple[torch.Tensor, bool]:
        """``heads [tokens, heads + 2 * kv_heads, head_dim]`` (q, k, v) -> q and k ready for
        attention, and whether the new k/v are already in the KV cache: on the GPU one kernel
        applies the q/k norms (if any) and the rotary and stores k/v where the backend offers
        a ``kv_store_target`` (one launch instead of two to five per layer)."""
        if use_triton(heads):
            from ..kernels.qk_norm_rope import qk_norm_rope

            store = attn.kv_store_target(self.layer_id, batch)
            norms = self.qk_norms()
            weights = (None, None) if norms is None else (norms[0].weight, norms[1].weight)
            eps = 0.0 if norms is None else norms[0].eps
            qk = qk_norm_rope(heads, *weights, self.num_heads, eps, *rope, store=store)
            return qk, store is not None
        return self.rotate_qk(heads[:, : self.num_heads + self.num_kv_heads], rope), False

    def forward(self, h: torch.Tensor, rope: Rope, batch: ForwardBatch,
                attn: AttentionBackend) -> torch.Tensor:
        return self.o_proj(self.project_attend(h, rope, batch, attn))

    def project_attend(self, h: torch.Tensor, rope: Rope, batch: ForwardBatch,
                       attn: AttentionBackend, norm: RMSNorm | None = None,
                       norm_args: gemv_fusion.Gemv | None = None) -> torch.Tensor:
        """The layer input ``h`` (``norm``: an RMSNorm to apply first, folded into the product
        where ``norm_args`` names a tile) -> attention's output (before o_proj). One token
        without q/k norms: the rotary and the KV store as the qkv product's epilogue."""
        store = (attn.kv_store_target(self.layer_id, batch)
                 if self.qk_norms() is None and gemv_epilogue.enabled(h) else None)
        if store is not None:
            qkv = gemv_epilogue.qkv_rope(h, self.qkv_proj, (self.num_heads, self.num_kv_heads),
                                         rope, store, norm, norm_args)
            if qkv is not None:
                return self.attend(qkv, rope, batch, attn, rotated=True)
        qkv = (self.qkv_proj(h) if norm is None
               else gemv_fusion.norm_linear(h, norm, self.qkv_proj, norm_args))
        return self.attend(qkv, rope, batch, attn)

    def attend(self, qkv: torch.Tensor, rope: Rope, batch: ForwardBatch,
               attn: AttentionBackend, rotated: bool = False) -> torch.Tensor:
        """The projected ``qkv [tokens, (heads + 2 * kv_heads) * head_dim]`` -> attention's
        output ``[tokens, heads * head_dim]`` (before o_proj). ``rotated``: q and k are
        rotated and k/v stored already (the product's epilogue)."""
        n = qkv.shape[0]
        heads = qkv.view(n, -1, self.head_dim)  # q heads, then k, then v
        if rotated:
            qk, kv_stored = heads[:, : self.num_heads + self.num_kv_heads], True
        else:
            qk, kv_stored = self.qk_and_store(heads, rope, batch, attn)
        v = heads[:, self.num_heads + self.num_kv_heads:]
        out = attn.forward(qk[:, : self.num_heads], qk[:, self.num_heads:], v, self.layer_id,
                           batch, self.scaling, kv_stored=kv_stored)
        return out.reshape(n, self.q_size)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: str,
                 quant: QuantConfig | None = None) -> None:
        super().__init__()
        if cfg.hidden_act != "silu":
            raise ModelLoadError(f"unsupported activation {cfg.hidden_act!r}; supported: silu")
        self.gate_up_proj = MergedColumnParallelLinear(
            cfg.hidden_size, {"gate": cfg.intermediate_size, "up": cfg.intermediate_size},
            quant=quant, dtype=dtype, device=device)
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, quant=quant,
                                           dtype=dtype, device=device)
        self.act = SiluAndMul()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activated(h))

    def activated(self, h: torch.Tensor, norm: RMSNorm | None = None,
                  norm_args: gemv_fusion.Gemv | None = None) -> torch.Tensor:
        """``act(gate_up(norm(h)))``; at one row the activation is the product's epilogue
        (and the norm folded in where ``norm_args`` names a tile)."""
        act = gemv_epilogue.gate_up_act(h, self.gate_up_proj, norm, norm_args)
        if act is not None:
            return act
        up = (self.gate_up_proj(h) if norm is None
              else gemv_fusion.norm_linear(h, norm, self.gate_up_proj, norm_args))
        return self.act(up)


class LlamaDecoderLayer(nn.Module):
    attention_cls: type[LlamaAttention] = LlamaAttention

    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype, device: str,
                 quant: QuantConfig | None = None) -> None:
        super().__init__()
        self.self_attn = self.attention_cls(cfg, layer_id, dtype, device, quant)
        self.mlp = self.make_mlp(cfg, layer_id, dtype, device, quant)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, device=device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype,
                                                device=device)

    def forward(self, h: torch.Tensor, residual: torch.Tensor | None, rope: Rope,
                batch: ForwardBatch, attn: AttentionBackend,
                chained: tuple[bool, bool] = (False, False)
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(out, residual)``: the next layer's input is ``out + residual``; residual None:
        ``out`` is the whole residual stream (the first layer's input, a fused layer's output).
        ``chained`` (TP, ``LlamaModel.chains``): (``h`` is the last layer's down product not yet
        summed over the ranks, ``out`` is to be left so): the sum runs in this layer's (the next
        layer's) input norm, as one kernel with the residual add."""
        partial_in, partial_out = chained
        fused = None if partial_in or partial_out else self.gemv_fusion(h)
        if fused is not None:
            return self.forward_fused(h, residual, rope, batch, attn, fused), None
        if residual is None:
            residual, h = h, self.input_layernorm(h)
        elif partial_in:
            h, residual = reduce_add_rmsnorm(h, residual, self.input_layernorm)
        else:
            h, residual = self.input_layernorm(h, residual)
        out = self.self_attn.project_attend(h, rope, batch, attn)
        # o_proj's all-reduce, the residual add and the norm: one kernel under TP on NVLink
        h, residual = self.self_attn.o_proj.forward_add_rmsnorm(
            out, residual, self.post_attention_layernorm)
        if partial_out:
            return self.mlp.down_proj.partial(self.mlp.activated(h)), residual
        return self.mlp(h), residual

    def make_mlp(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype, device: str,
                 quant: QuantConfig | None) -> nn.Module:
        """The layer's feed-forward block (MoE models override this)."""
        return LlamaMLP(cfg, dtype, device, quant)

    def gemv_fusion(self, h: torch.Tensor) -> list[gemv_fusion.Gemv | None] | None:
        """The matrix-vector arguments of qkv, o, gate_up and down where this step can fold
        the residual adds into o and down (and the norms into qkv and gate_up, where their
        entries are not None): batch-1 decode, dense MLP; else None."""
        if not gemv_fusion.enabled(h) or not isinstance(self.mlp, LlamaMLP):
            return None
        attn, mlp = self.self_attn, self.mlp
        o, down = gemv_fusion.gemv_args(attn.o_proj), gemv_fusion.gemv_args(mlp.down_proj)
        if o is None or down is None:
            return None
        return [gemv_fusion.gemv_args(attn.qkv_proj, norm=True), o,
                gemv_fusion.gemv_args(mlp.gate_up_proj, norm=True), down]

    def forward_fused(self, h: torch.Tensor, residual: torch.Tensor | None, rope: Rope,
                      batch: ForwardBatch, attn: AttentionBackend,
                      args: list[gemv_fusion.Gemv]) -> torch.Tensor:
        """``forward`` with each residual add in the product before it and each RMSNorm in
        the product after it (gemv_fusion.py): four launches besides attention and the
        activation, or a norm kernel more for each norm ``args`` leaves out."""
        if residual is not None:  # a pending add (the layer before ran unfused)
            h = h + residual
        attn_layer, mlp = self.self_attn, self.mlp
        out = attn_layer.project_attend(h, rope, batch, attn, self.input_layernorm, args[0])
        h = gemv_fusion.linear_add(out, attn_layer.o_proj, h, args[1])
        act = mlp.activated(h, self.post_attention_layernorm, args[2])
        return gemv_fusion.linear_add(act, mlp.down_proj, h, args[3])


class LlamaModel(nn.Module):
    layer_cls: type[LlamaDecoderLayer] = LlamaDecoderLayer

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: str,
                 quant: QuantConfig | None = None) -> None:
        super().__init__()
        # pp: this rank's pipeline stage; other stages' modules are built on meta and then
        # dropped (distributed/pipeline_model.py)
        self.stage = stage = current_stage(cfg.num_layers)
        at = functools.partial(pipeline_model.device_of, stage, device=device)
        self.embed_tokens = VocabParallelEmbedding(
            cfg.vocab_size, cfg.hidden_size, dtype=dtype,
            device=at(stage.needs_embedding(cfg.tie_word_embeddings)))
        self.layers = nn.ModuleList(self.layer_cls(cfg, i, dtype, at(stage.owns_layer(i)), quant)
                                    for i in range(cfg.num_layers))
        # pp: the layers this stage runs (set by pipeline_model.drop_other_stages; None: all)
        self.stage_layers: tuple[nn.Module, ...] | None = None
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype,
                            device=at(stage.is_last))
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.max_context_len, cfg.rope_theta,
                                          cfg.rope_scaling, dtype=dtype, device=device)

    # spec: an EAGLE drafter's capture of hidden states (speculative/hidden_capture.py); None: off.
    # NOTE: HiddenCapture.forward runs this same loop with captures: change both together.
    spec_capture: Any = None

    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        """The final hidden states; pp: a stage before the last returns its output for the
        next (``pipeline.pack``), a stage after the first starts from ``batch.pp_proxy``."""
        if self.spec_capture is not None:  # spec:
            return self.spec_capture.forward(self, batch, attn)
        rope = self.rotary_emb.lookup(batch.positions)  # once per forward, shared by all layers
        if batch.pp_proxy is None:
            h, residual = self.embed_tokens(batch.input_ids), None
        else:  # pp:
            h, residual = pipeline.unpack(batch.pp_proxy)
        layers = self.stage_layers or self.layers
        if not self.chains(h, layers):
            for layer in layers:
                h, residual = layer(h, residual, rope, batch, attn)
        else:  # TP: each down product's sum runs in the next norm (one kernel with the add)
            last = len(layers) - 1
            for i, layer in enumerate(layers):
                chained = (i > 0, i < last or self.stage.is_last)
                h, residual = layer(h, residual, rope, batch, attn, chained)
            if self.stage.is_last:
                return reduce_add_rmsnorm(h, residual, self.norm)[0]
        if not self.stage.is_last:  # pp:
            return pipeline.pack(h, residual)
        return self.norm(h) if residual is None else self.norm(h, residual)[0]

    def chains(self, h: torch.Tensor, layers: Any) -> bool:
        """Whether this forward leaves each dense layer's down product unsummed for the next
        norm to sum (TP, every layer a plain ``LlamaDecoderLayer`` forward with a dense MLP;
        on the CPU the sum then runs before the norm as it would unchained); memoized."""
        if "_chains" not in self.__dict__:
            self._chains = all(
                type(layer).forward is LlamaDecoderLayer.forward
                and type(layer.mlp) is LlamaMLP and layer.mlp.down_proj.tp_size > 1
                and layer.mlp.down_proj.reduce_results and layer.mlp.down_proj.bias is None
                for layer in layers) and len(layers) > 0
        return self._chains


class LlamaForCausalLM(LlamaWeights, nn.Module):
    model_cls: type[LlamaModel] = LlamaModel

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", quant: QuantConfig | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.quant = quant
        self.model = self.model_cls(cfg, dtype, str(device), quant)
        # NOTE: the embedding and the head stay in the model dtype (fp8 checkpoints keep them).
        head_at = pipeline_model.device_of(self.model.stage, self.model.stage.is_last, device)
        self.lm_head = (None if cfg.tie_word_embeddings else
                        ParallelLMHead(cfg.vocab_size, cfg.hidden_size, dtype=dtype, device=head_at))
        self.attn_backend: AttentionBackend | None = None  # set by the runner
        # layer -> (k_scale, v_scale) of an fp8 KV cache, when the checkpoint carries them
        self.kv_cache_scales: dict[int, tuple[float, float]] = {}
        # The logits matrix in the CPU matmul layout, and the C kernels for single rows (fp32,
        # where ``matvec_preferred``; None: MKL), both set by optimize_for_cpu.
        self._logits_weight: torch.Tensor | None = None
        self._cpu_kernels: cpu_kernels.CpuKernels | None = None

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Final hidden states ``[num_tokens, hidden]`` (after the last norm)."""
        if self.attn_backend is None:
            raise RuntimeError("attention backend not set: the ModelRunner binds it")
        return self.model(batch, self.attn_backend)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[rows, vocab]`` for the given hidden rows (every rank gets all of
        them: each computes its vocab block, then they are all-gathered)."""
        return gather_logits(self._local_logits(hidden), self.config.vocab_size)

    def _local_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._logits_weight is not None:
            if self._cpu_kernels is not None and hidden.shape[0] <= cpu_kernels.MATVEC_MAX_ROWS:
                return split_matvec(hidden, self._logits_weight, self._cpu_kernels)
            return split_matmul(hidden, self._logits_weight).float()
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        if hidden.is_cuda and hidden.shape[0] <= DECODE_ROWS:
            from ..kernels.decode_gemm import decode_linear

            return decode_linear(hidden, weight, None).float()  # decode: as the projections
        return F.linear(hidden, weight).float()

    def optimize_for_cpu(self, splits: int) -> None:
        """After loading: every projection and the logits matrix in the CPU matmul layout
        (see ``Linear.use_cpu_layout``). A tied embedding keeps its row-major copy for the
        token lookup, so tied models hold the vocab matrix twice on CPU."""
        for module in self.modules():
            if isinstance(module, LinearBase) and _unquantized(module):  # incl. an untied lm_head
                module.use_cpu_layout(splits)
        if not self.model.stage.is_last:
            return  # pp: no logits on this stage
        if self.lm_head is None:
            self._logits_weight = cpu_layout(self.model.embed_tokens.weight.data, splits)
        else:
            self._logits_weight = self.lm_head.weight.data
        if self._logits_weight.dtype == torch.float32 and cpu_kernels.matvec_preferred():
            self._cpu_kernels = cpu_kernels.load()


def _unquantized(module: nn.Module) -> bool:
    return isinstance(module.quant_method, UnquantizedLinearMethod)
