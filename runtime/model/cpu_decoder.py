"""CpuDecoder: the decode forward of a Llama-family model (Llama, Qwen2, Qwen3) on CPU in fp32,
as one flat loop of split-layout matmuls into preallocated outputs (the C ``matvec`` for up to
``MATVEC_MAX_ROWS`` rows where it beats MKL, else MKL's batched gemm) and one C kernel call
between each pair of them (``layers/cpu_kernels.py``).

Per layer: add+rmsnorm -> qkv matmul -> [bias, q/k norms, rotary, KV store, attention] ->
o matmul -> add+rmsnorm -> gate_up matmul -> silu*mul -> down matmul: 8 calls, where the module
path runs ~25 torch ops. The result is the same computation as ``LlamaModel.forward`` (same
weights, same KV pool layout, same attention semantics as ``torch_native``) up to float
rounding order. Extend batches keep the module path.

NOTE: weights, KV buffers and the req_to_token table are bound by raw pointer at creation;
the runner creates the decoder after loading and never replaces those tensors.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

import torch

from ..layers.cpu_kernels import MATVEC_MAX_ROWS, CpuKernels, DecodeStep, matvec_preferred
from ..layers.cpu_kernels import load as load_kernels
from .forward_batch import ForwardBatch
from .llama import LlamaForCausalLM

# Distinct decode batch sizes whose buffers are kept (the running batch changes size often).
MAX_CACHED_SIZES = 4
# Attention runs its (request, kv head) pairs on the thread team from this many keys x kv
# heads per layer (~100 us of work); below, a parallel region costs more than it saves.
PARALLEL_MIN_KEYS = 1024


@dataclass(frozen=True)
class SplitWeight:
    """A ``[splits, in, block]`` weight (``layers/linear.cpu_layout``) and its C-side view."""

    t: torch.Tensor
    ptr: int
    splits: int
    in_features: int
    block: int

    @classmethod
    def of(cls, t: torch.Tensor) -> "SplitWeight":
        return cls(t, t.data_ptr(), *t.shape)


@dataclass(frozen=True)
class LayerRefs:
    """One decoder layer's weights and raw pointers for the C side."""

    qkv: SplitWeight
    o: SplitWeight
    gate_up: SplitWeight
    down: SplitWeight
    ln1: int
    ln2: int
    qkv_bias: int | None
    q_norm: int | None
    k_norm: int | None
    k_buf: int
    v_buf: int

    @property
    def splits(self) -> tuple[int, int, int, int]:
        """Column blocks of the qkv, o, gate_up and down weights."""
        return self.qkv.splits, self.o.splits, self.gate_up.splits, self.down.splits


class DecodeBuffers:
    """Preallocated activations for ``n`` rows, with the expanded matmul inputs as views."""

    def __init__(self, dec: "CpuDecoder", n: int) -> None:
        first = dec.layers[0]
        f32 = torch.float32
        self.res = torch.empty(n, dec.hidden, dtype=f32)
        self.xn = torch.empty(n, dec.hidden, dtype=f32)
        self.attn = torch.empty(n, first.o.in_features, dtype=f32)
        self.act = torch.empty(n, first.down.in_features, dtype=f32)
        self.out = torch.empty(n, dec.hidden, dtype=f32)
        self.qkv_rows = torch.empty(n, first.qkv.splits * first.qkv.block, dtype=f32)
        self.qkv = _split_out(first.qkv, n)
        self.o = _split_out(first.o, n)
        self.gate_up = _split_out(first.gate_up, n)
        self.down = _split_out(first.down, n)
        # bmm inputs (n > 1): the activation broadcast over the weight's column blocks
        self.xn_qkv = self.xn.expand(first.qkv.splits, n, dec.hidden)
        self.attn_o = self.attn.expand(first.o.splits, *self.attn.shape)
        self.xn_gate_up = self.xn.expand(first.gate_up.splits, n, dec.hidden)
        self.act_down = self.act.expand(first.down.splits, *self.act.shape)
        self.ptr = {name: t.data_ptr() for name, t in vars(self).items()
                    if isinstance(t, torch.Tensor)}


def _split_out(weight: SplitWeight, n: int) -> torch.Tensor:
    return torch.empty(weight.splits, n, weight.block, dtype=torch.float32)


class CpuDecoder:
    def __init__(self, model: LlamaForCausalLM, kernels: CpuKernels, k_buffers: list[torch.Tensor],
                 v_buffers: list[torch.Tensor], req_to_token: torch.Tensor) -> None:
        cfg, inner = model.config, model.model
        self.kernels = kernels
        self.hidden, self.eps = cfg.hidden_size, float(cfg.rms_norm_eps)
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = cfg.head_dim ** -0.5
        self.embed = inner.embed_tokens.weight.data
        self.final_norm = inner.norm.weight.data.data_ptr()
        self.cos, self.sin = inner.rotary_emb.cos_cache, inner.rotary_emb.sin_cache
        self.req_to_token = req_to_token
        self.layers = [_layer_refs(layer, k, v)
                       for layer, k, v in zip(inner.layers, k_buffers, v_buffers)]
        qkv_cols = (self.heads + 2 * self.kv_heads) * self.head_dim
        group = self.heads // self.kv_heads
        # decode_attention: a [group, context] score block per thread of the team
        self.threads = torch.get_num_threads()
        self.scores = torch.empty(self.threads, group, req_to_token.shape[1], dtype=torch.float32)
        self.parallel_min_keys = PARALLEL_MIN_KEYS
        widest = max(qkv_cols, 2 * cfg.intermediate_size, self.hidden)
        self.tmp = torch.empty(widest, dtype=torch.float32)  # row gathers of split outputs
        self._buffers: dict[int, DecodeBuffers] = {}
        self.use_matvec = matvec_preferred()  # small batches: C matvec, else MKL's gemm

    @classmethod
    def create(cls, runner: Any) -> "CpuDecoder | None":
        """A decoder for ``runner`` when its model, dtype and attention backend fit; else None."""
        model, pool = runner.model, runner.token_kv_pool
        # NOTE: the C loop has no all-reduce between its matmuls: tp_size 1 only (a CPU TP
        # group exists for tests; it runs the module path).
        fits = (runner.device.type == "cpu" and runner.dtype == torch.float32
                and getattr(runner, "tp_size", 1) == 1
                and pool.dtype == torch.float32 and runner.attention_backend_name == "torch_native"
                and isinstance(model, LlamaForCausalLM)
                and not model.config.is_multimodal  # mm: M-RoPE decode positions (model forward)
                and all(_fits(layer) for layer in model.model.layers))
        kernels = load_kernels() if fits else None
        if kernels is None:
            return None
        return cls(model, kernels, pool.k_buffer, pool.v_buffer,
                   runner.req_to_token_pool.req_to_token)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Final hidden states ``[bs, hidden]`` of a DECODE batch (after the last norm).
        NOTE: the result is a reused buffer, valid until the next call."""
        n, k = batch.batch_size, self.kernels
        b = self._buffers_for(n)
        p = b.ptr
        torch.index_select(self.embed, 0, batch.input_ids, out=b.res)
        keep = [t.contiguous() for t in (batch.positions, batch.out_cache_loc,
                                         batch.req_pool_indices, batch.seq_lens)]
        step = ctypes.pointer(self._step(b, *keep))
        x, x_splits = None, 1  # first layer: the residual already holds the input
        tmp, hidden, eps = self.tmp.data_ptr(), self.hidden, self.eps
        if self.use_matvec and n <= MATVEC_MAX_ROWS:  # outputs row-major (1 block)
            mm, (sq, so, sg, sd) = functools.partial(self._matvec, n), (1, 1, 1, 1)
        else:  # outputs in the weights' column blocks
            mm, (sq, so, sg, sd) = _bmm, self.layers[0].splits
        for layer in self.layers:
            k.add_rmsnorm(x, x_splits, p["res"], layer.ln1, p["xn"], n, hidden, eps, tmp)
            mm(b.xn_qkv, p["xn"], layer.qkv, b.qkv, p["qkv"])
            k.decode_attention(step, p["qkv"], sq, layer.qkv_bias, layer.q_norm, layer.k_norm,
                               layer.k_buf, layer.v_buf, p["attn"])
            mm(b.attn_o, p["attn"], layer.o, b.o, p["o"])
            k.add_rmsnorm(p["o"], so, p["res"], layer.ln2, p["xn"], n, hidden, eps, tmp)
            mm(b.xn_gate_up, p["xn"], layer.gate_up, b.gate_up, p["gate_up"])
            k.silu_mul(p["gate_up"], sg, p["act"], n, b.act.shape[1], tmp)
            mm(b.act_down, p["act"], layer.down, b.down, p["down"])
            x, x_splits = p["down"], sd
        k.add_rmsnorm(x, x_splits, p["res"], self.final_norm, p["out"], n, hidden, eps, tmp)
        del keep  # the C side read these through raw pointers until here
        return b.out

    def _matvec(self, n: int, _x: torch.Tensor, x_ptr: int, w: SplitWeight, _out: torch.Tensor,
                out_ptr: int) -> None:
        """A few rows: the C kernel (reads the weight once; faster than MKL's gemm at small m
        on the CPUs where ``matvec_preferred``). Writes ``[n, out]`` row-major."""
        self.kernels.matvec(x_ptr, n, w.ptr, out_ptr, w.splits, w.in_features, w.block)

    def _step(self, b: DecodeBuffers, positions: torch.Tensor, out_loc: torch.Tensor,
              rows: torch.Tensor, seq_lens: torch.Tensor) -> DecodeStep:
        return DecodeStep(
            b.res.shape[0], self.heads, self.kv_heads, self.head_dim, self.req_to_token.shape[1],
            positions.data_ptr(), out_loc.data_ptr(), rows.data_ptr(), seq_lens.data_ptr(),
            self.req_to_token.data_ptr(), self.cos.data_ptr(), self.sin.data_ptr(),
            b.ptr["qkv_rows"], self.scores.data_ptr(), self.threads, self.parallel_min_keys,
            self.scale, self.eps)

    def _buffers_for(self, n: int) -> DecodeBuffers:
        buf = self._buffers.get(n)
        if buf is None:
            if len(self._buffers) >= MAX_CACHED_SIZES:
                self._buffers.pop(next(iter(self._buffers)))  # oldest size first
            buf = self._buffers[n] = DecodeBuffers(self, n)
        return buf


def _bmm(x: torch.Tensor, _x_ptr: int, w: SplitWeight, out: torch.Tensor, _out_ptr: int) -> None:
    """Several rows: MKL's batched gemm over the column blocks (reads the weight once)."""
    torch.bmm(x, w.t, out=out)


def _fits(layer: Any) -> bool:
    """Split-layout (``optimize_for_cpu``) weights, and a bias only on qkv (Qwen2)."""
    attn, mlp = layer.self_attn, layer.mlp
    if not hasattr(mlp, "gate_up_proj"):
        return False  # routed experts (MoE): the module path
    mats = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    return (all(m.weight.dim() == 3 for m in mats)
            and all(m.bias is None for m in mats[1:]))


def _layer_refs(layer: Any, k_buf: torch.Tensor, v_buf: torch.Tensor) -> LayerRefs:
    attn, mlp = layer.self_attn, layer.mlp

    def ptr(t: torch.Tensor | None) -> int | None:
        return None if t is None else t.data.data_ptr()

    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    return LayerRefs(qkv=SplitWeight.of(attn.qkv_proj.weight.data),
                     o=SplitWeight.of(attn.o_proj.weight.data),
                     gate_up=SplitWeight.of(mlp.gate_up_proj.weight.data),
                     down=SplitWeight.of(mlp.down_proj.weight.data),
                     ln1=ptr(layer.input_layernorm.weight), ln2=ptr(layer.post_attention_layernorm.weight),
                     qkv_bias=ptr(attn.qkv_proj.bias), q_norm=None if q_norm is None else ptr(q_norm.weight),
                     k_norm=None if k_norm is None else ptr(k_norm.weight),
                     k_buf=k_buf.data_ptr(), v_buf=v_buf.data_ptr())
