"""ModelRunner: owns the model, the KV pools and the attention backend of one scheduler
process, and runs one forward per batch.

Startup order: resolve device and dtype, load weights, size the KV pool from what memory is
left (or ``max_total_tokens``), then build the pools and the attention backend. ``forward``
returns fp32 logits for the rows that need them (by default each request's last new token).
"""
from __future__ import annotations

import logging

import torch

from ..cache.pool import ReqToTokenPool, TokenKVPool
from ..config import EngineConfig
from ..distributed import custom_all_reduce
from ..distributed.collectives import all_reduce, min_over_ranks
from ..distributed.pipeline import current_stage
from ..distributed.pipeline_runner import StageForward
from ..distributed.state import get_ep_group, get_moe_tp_group, get_tp_group
from ..errors import ModelLoadError
from ..layers.linear import local_heads
from ..layers.moe.dispatch import set_ep_dispatch
from ..layers.attention.registry import create_attention_backend, resolve_backend_name
from .cpu_decoder import CpuDecoder
from .forward_batch import ForwardBatch
from .loader import load_model_from_dir, resolve_model_dir
from .step_graphs import StepGraphs, step_mode

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Fewer KV slots than this cannot serve anything useful; fail at startup instead.
MIN_KV_TOKENS = 16
# Extra request rows beyond max_running_requests: room for requests being admitted while
# finished ones are still being released.
EXTRA_REQ_ROWS = 8


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device='cuda' requested but CUDA is not available")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


def resolve_kv_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """KV cache storage: the model dtype, or fp8 E4M3 (``fp8_e4m3``)."""
    if name == "auto":
        return dtype
    if name == "fp8_e4m3":
        return torch.float8_e4m3fn
    raise ModelLoadError(f"kv_cache_dtype={name!r} is not supported; supported: auto, fp8_e4m3")


class ModelRunner:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        tp = get_tp_group()
        # a TP rank runs on the device its worker process was given (runtime/distributed)
        self.device = tp.device if tp.size > 1 else resolve_device(config.device)
        self.tp_rank, self.tp_size = tp.rank, tp.size
        self.dtype = resolve_dtype(config.dtype, self.device)
        torch.manual_seed(config.seed)
        self.model_dir = resolve_model_dir(config)
        # read by the MoE layers as they are built
        set_ep_dispatch(config.ep_dispatch, config.ep_a2a_min_tokens)
        self.model, self.model_config = load_model_from_dir(
            self.model_dir, self.device, self.dtype, config.load_format, config.seed,
            config.quantization)
        if hasattr(self.model, "encoder_cache"):  # mm: encoder outputs kept by image hash
            self.model.encoder_cache.max_bytes = config.mm_embedding_cache_bytes
        # pp: this rank's pipeline stage (its layers' KV only); None without pipeline parallelism
        self.pp_stage = current_stage(self.model_config.num_layers)
        self.pipeline = StageForward(self, self.pp_stage) if self.pp_stage.size > 1 else None
        self.num_local_heads, self.num_local_kv_heads = local_heads(
            self.model_config.num_heads, self.model_config.num_kv_heads, self.tp_size)
        self.kv_dtype = resolve_kv_dtype(config.kv_cache_dtype, self.dtype)
        self.context_len = self._context_len()
        self.max_total_tokens = self._kv_capacity()
        self.req_to_token_pool = ReqToTokenPool(config.max_running_requests + EXTRA_REQ_ROWS,
                                                self.context_len, self.device)
        mc = self.model_config
        # each rank's KV pool holds only its kv heads
        self.token_kv_pool = TokenKVPool(self.max_total_tokens, self.pp_stage.num_stage_layers,
                                         self.num_local_kv_heads, mc.head_dim, self.kv_dtype,
                                         self.device)
        if self.token_kv_pool.quantized:
            self.token_kv_pool.set_scales(getattr(self.model, "kv_cache_scales", {}))
        self.attention_backend_name = resolve_backend_name(config.attention_backend, self.device)
        self.attn_backend = create_attention_backend(self.attention_backend_name, self)
        self.model.attn_backend = self.attn_backend
        # CPU path: decode batches run as flat matmuls + C kernels (cpu_decoder.py); None when
        # the kernels cannot be built or the model/dtype/backend does not fit.
        self.cpu_decoder = (CpuDecoder.create(self) if self.device.type == "cpu"
                            and self.pipeline is None else None)  # pp: the module path
        # TP on GPUs: small all-reduces over NVLink P2P; its buffer must predate graph capture
        self.custom_all_reduce = (self.tp_size > 1 and self.device.type == "cuda"
                                  and not config.disable_custom_all_reduce
                                  and custom_all_reduce.install(tp, self.dtype))
        # tp-step: the last sampled token of each request row (the next decode's input; the
        # last entry a sink for padded graph rows), here so that captured graphs can use it
        self.last_token = torch.zeros(self.req_to_token_pool.size + 1, dtype=torch.int64,
                                      device=self.device)
        # GPU path (issue 6): decode CUDA graphs, captured after the KV pool exists.
        self.cuda_graph_runner = self._init_cuda_graphs()
        self._eager_steps = self._init_eager_steps()  # tp-step: a step without graphs
        logger.info("model %s on %s/%s: context %d, %d KV slots, attention %s", self.model_dir,
                    self.device, self.dtype, self.context_len, self.max_total_tokens,
                    self.attention_backend_name)

    def _context_len(self) -> int:
        limit = self.model_config.max_context_len
        wanted = self.config.context_length
        if wanted is None:
            return limit
        if wanted <= 0 or wanted > limit:
            raise ModelLoadError(f"context_length={wanted} must be in [1, {limit}] "
                                 f"(the model's max_position_embeddings)")
        return wanted

    def _kv_capacity(self) -> int:
        """KV slots: explicit, or from the memory budget; never more than the running
        requests could fill with full contexts."""
        mc = self.model_config
        per_token = TokenKVPool.bytes_per_token(self.pp_stage.num_stage_layers,  # pp:
                                                self.num_local_kv_heads,
                                                mc.head_dim, self.kv_dtype)
        if self.config.max_total_tokens is not None:
            slots = self.config.max_total_tokens
        elif self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            from ..speculative.draft_memory import DraftMemory  # spec: room for a draft model

            draft = DraftMemory.of(self.config, self.dtype)
            slots = (int(free * self.config.mem_fraction_static) - draft.reserve) // (
                per_token + draft.per_slot)
        else:
            slots = self.config.kv_cache_bytes // per_token
        slots = min(slots, self.context_len * self.config.max_running_requests)
        # every TP rank (pp: of every stage) schedules the same batches over the same slots
        slots = min_over_ranks(slots)
        if slots < MIN_KV_TOKENS:
            raise ModelLoadError(f"KV cache too small: {slots} token slots ({per_token} bytes "
                                 f"each); raise kv_cache_bytes / mem_fraction_static / max_total_tokens")
        return slots

    def _init_cuda_graphs(self):  # GPU path (issue 6)
        """Capture decode graphs when on CUDA with a sync-free attention backend (triton)."""
        if (self.device.type != "cuda" or self.config.disable_cuda_graph
                or self.attention_backend_name != "triton"):
            return None
        from .cuda_graph_runner import CudaGraphRunner

        max_bs = min(self.config.cuda_graph_max_bs, self.config.max_running_requests)
        if self.config.speculative_algorithm:  # spec: a chain verify feeds k + 1 decode rows
            c = self.config  # per request (speculative/verify_batch.py), within the graph cap
            rows = min(c.max_running_requests, c.speculative_max_batch_size)
            max_bs = max(max_bs, min(c.cuda_graph_max_bs,
                                     rows * (c.speculative_num_draft_tokens + 1)))
        if self.config.grammar_backend != "none" and not self.config.disable_jump_forward:
            # grammar: a decode step also feeds jump-forward tokens, one row each (scheduler:
            # RunningBatch.mixed_batch); graphs for as many rows again as requests let a
            # full batch feed them in few steps.
            # NOTE: lockstep requests jump together (256 requests forcing `"name": "`, 3
            # tokens each, want 768 extra rows at once): a quarter more rows fed that wave
            # over 12 steps in which the batch sampled almost nothing. An eager step feeding
            # all of it cost more than those steps (H100: 57 ms per step on average).
            max_bs += max(8, max_bs)
        if self.tp_size > 1:
            # NOTE: NCCL creates its communicator on the first collective, which cannot happen
            # inside a graph capture: do one before capturing (the graphs then hold the
            # all-reduces and the logits all-gather).
            all_reduce(torch.zeros(1, device=self.device))
            # and those of the expert-parallel subgroups (their all-to-alls are captured too)
            all_reduce(torch.zeros(1, device=self.device), get_ep_group())
            all_reduce(torch.zeros(1, device=self.device), get_moe_tp_group())
            torch.cuda.synchronize(self.device)
        steps = self._capture_step_graphs(max_bs)  # tp-step:
        if steps is not None:
            return steps
        graphs = CudaGraphRunner(self, max_bs)
        graphs.capture()
        return graphs

    def _capture_step_graphs(self, max_bs: int) -> "StepGraphs | None":  # tp-step:
        """Decode graphs that also hold the greedy pick and the next step's inputs, where
        allowed; None if not, or if their capture failed (logged: the plain graphs serve)."""
        if not self._steps_allowed():
            return None
        try:
            graphs = StepGraphs(self, max_bs)
            graphs.capture()
            return graphs
        except Exception:  # noqa: BLE001 - any failure: the plain decode graphs instead
            logger.exception("step graphs failed to capture; plain decode graphs instead "
                             "(SGDSL_DECODE_STEP=off skips them)")
            torch.cuda.synchronize(self.device)
            return None

    def _steps_allowed(self) -> bool:  # tp-step:
        """Whether decode steps may run as a whole (``step_graphs.py``): not under pipeline
        parallelism (a stage's graph outputs hidden states, not logits)."""
        return self.pipeline is None and step_mode() != "off"

    def _init_eager_steps(self) -> "StepGraphs | None":  # tp-step:
        """``$SGDSL_DECODE_STEP=eager`` without decode graphs: the step path run eagerly."""
        if (self.cuda_graph_runner is not None or step_mode() != "eager"
                or not self._steps_allowed()):
            return None
        return StepGraphs(self, self.req_to_token_pool.size)

    @property
    def step_graphs(self) -> "StepGraphs | None":  # tp-step:
        """What runs a whole plain decode step (``StepGraphs.step``), None: the batch path."""
        graphs = self.cuda_graph_runner
        if isinstance(graphs, StepGraphs):
            return graphs
        return getattr(self, "_eager_steps", None) if graphs is None else None

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """fp32 logits ``[rows, vocab]`` for ``batch.logits_indices`` (default: the last new
        token of each request). Decode batches replay a CUDA graph when one is captured."""
        if self.pipeline is not None:  # pp: receive, run this stage, send on
            return self.pipeline.forward(batch)
        if self.cuda_graph_runner is not None and self.cuda_graph_runner.can_run(batch):
            return self.cuda_graph_runner.replay(batch)
        return self.forward_eager(batch)

    @torch.inference_mode()
    def forward_eager(self, batch: ForwardBatch) -> torch.Tensor:
        """``forward`` without CUDA graphs (also what the graphs capture)."""
        if self.cpu_decoder is not None and batch.mode.is_decode:
            hidden = self.cpu_decoder.forward(batch)
        else:
            self.attn_backend.init_forward_metadata(batch)
            hidden = self.model(batch)
            if not self.pp_stage.is_last:
                return hidden  # pp: every token's hidden states go to the next stage
        if batch.logits_indices is not None:
            hidden = hidden[batch.logits_indices]
        elif not (batch.mode.is_decode or batch.num_tokens == batch.batch_size):
            hidden = hidden[batch.last_token_indices()]
        return self.model.compute_logits(hidden)
