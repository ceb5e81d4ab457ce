"""Engine configuration: one frozen dataclass shared by the Engine, the server and the scheduler
process. Derived sizes (KV slots, context length) are resolved at load time, not stored here."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from .errors import InvalidRequestError


@dataclass(frozen=True)
class EngineConfig:
    """How to load and run one model. ``model=None`` means the embedded SmolLM2-135M-Instruct."""

    model: str | None = None
    tokenizer: str | None = None  # defaults to the model's own tokenizer files
    load_format: Literal["auto", "safetensors", "gguf", "dummy"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: fp32 CPU, bf16 GPU
    # Weights: "fp8" quantizes a bf16 checkpoint at load (E4M3, per-output-channel scales);
    # an fp8 checkpoint (HF quantization_config) loads as published whatever this says.
    quantization: Literal["fp8"] | None = None
    # KV cache storage: "auto" = the model dtype; "fp8_e4m3" halves KV bytes (per-layer scales).
    kv_cache_dtype: Literal["auto", "fp8_e4m3"] = "auto"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    seed: int = 0
    context_length: int | None = None  # default: the model config's max_position_embeddings
    # KV memory: on CUDA a fraction of free memory after weights; on CPU a byte budget.
    mem_fraction_static: float = 0.85
    kv_cache_bytes: int = 512 * 1024 * 1024
    max_total_tokens: int | None = None  # explicit KV slot count; overrides the budgets
    max_running_requests: int = 256
    chunked_prefill_size: int = 2048  # token budget of one prefill batch
    max_prefill_tokens: int = 8192
    schedule_policy: Literal["lpm", "fcfs"] = "lpm"
    disable_radix_cache: bool = False
    attention_backend: Literal["auto", "torch_native", "triton"] = "auto"
    grammar_backend: Literal["xgrammar", "outlines", "none"] = "xgrammar"
    # A compile's deadline, from when a worker starts it (the wait for a worker is not counted).
    grammar_compile_timeout_s: float = 10.0
    # Compiles run in killable worker processes (runtime/grammar/compile/worker_pool.py): how many at
    # once (None: from the machine's cores), how many may wait, how long a new one may expect
    # to wait for a worker (past either, a retryable 503 with Retry-After), and the memory one
    # compile may use.
    grammar_compile_workers: int | None = None
    grammar_compile_queue: int = 512
    grammar_compile_max_wait_s: float = 60.0
    grammar_compile_memory_bytes: int = 2 << 30
    # Compiled grammars are kept on disk (runtime/grammar/compile/disk_cache.py), so restarts and the
    # replicas on one machine reuse compiles: where (None: $SGDSL_GRAMMAR_CACHE_DIR, else
    # $XDG_CACHE_HOME/sgdsl/grammars, else ~/.cache/sgdsl/grammars), how many bytes at most
    # (least recently used files go first; 0 = off), or off altogether.
    grammar_cache_dir: str | None = None
    grammar_cache_bytes: int = 1 << 30
    disable_grammar_disk_cache: bool = False
    disable_jump_forward: bool = False  # grammar: sample forced text instead of appending it
    # grammar: jump forward only while at most this many requests decode (None: always); above
    # it forced text is sampled under the mask. At large batches a decode step is compute-bound,
    # so forced tokens cost the device as much as sampled ones, while the jump's host work
    # (retokenize, accept, the mixed step's indices) can set the step's pace.
    grammar_jump_max_batch: int | None = None
    # grammar: end every constrained output with a complete value when the budget allows
    # (docs/structured_output.md): force it within this many tokens of the budget; stop
    # runaway repetition (one pattern over this many tokens; 0 = off).
    disable_forced_completion: bool = False
    grammar_completion_slack: int = 4
    grammar_repetition_window: int = 32
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int = 160
    disable_overlap_schedule: bool = False
    num_threads: int | None = None  # torch CPU threads in the scheduler process
    served_model_name: str | None = None
    log_level: str = "warning"
    # NOTE: after startup the engine calls gc.freeze() in its processes, so full collections
    # skip the ~350k objects of torch, transformers and the model (a full pass over them takes
    # ~150 ms, a stall in whatever step or program triggers it).
    disable_gc_freeze: bool = False
    # Single async_generate calls of one caller loop turn (a server's burst of HTTP requests)
    # go to the scheduler in one message (runtime/submitter.py); off: one message per call.
    disable_request_coalescing: bool = False
    # Tensor parallelism (runtime/distributed): tp_size worker processes, one device each, in
    # one torch.distributed group spread evenly over nnodes machines; node 0 serves, every node
    # reaches the group's rendezvous at dist_init_addr ("HOST:PORT"; default: a free local port).
    tp_size: int = 1
    # Expert parallelism (SGLang's --ep-size): the MoE layers' experts split over ep_size of
    # the tp_size ranks (ep_size divides tp_size; attention and dense layers stay TP over all
    # of them), tokens dispatched to their experts' ranks with all-to-all (layers/moe/dispatch.py)
    ep_size: int = 1
    # How tokens reach their experts at ep_size > 1: all_to_all (dispatch and combine between
    # the EP ranks), all_reduce (SGLang's --moe-a2a-backend none: every rank computes its own
    # experts for all tokens, one all-reduce sums them; no dispatch, no host sync), or auto:
    # all_reduce, except eager batches of at least ep_a2a_min_tokens tokens (None: never) take
    # the all-to-all. NOTE: None by measurement: with TP attention the tokens are on every rank
    # and the all-reduce won at every size on 2x H200 (RESULTS.md, "EP decode at 0.23x TP").
    ep_dispatch: Literal["auto", "all_to_all", "all_reduce"] = "auto"
    ep_a2a_min_tokens: int | None = None
    # TP all-reduces of decode-sized messages go one-/two-shot over NVLink peer-to-peer
    # (distributed/custom_all_reduce.py) where every GPU pair has P2P; NCCL otherwise.
    disable_custom_all_reduce: bool = False
    # pp: pipeline parallelism (SGLang's --pp-size): the layers split over pp_size stages, each
    # a TP group of tp_size ranks (pp_size x tp_size processes in all); hidden states go stage
    # to stage, the sampled ids back to every rank (runtime/distributed/pipeline*.py)
    pp_size: int = 1
    # pp: a batch of at least 2 x pp_micro_batch_tokens tokens runs as up to pp_micro_batches
    # micro-batches (None: pp_size) of at least that many tokens each, in flight at once so
    # the stages work concurrently (distributed/pipeline_micro.py); each part re-reads the
    # weights, so small decode batches stay whole
    pp_micro_batches: int | None = None
    pp_micro_batch_tokens: int = 256
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    # A TP rank whose scheduler loop has not moved for this long is taken for hung: requests
    # fail naming it and every rank is stopped (distributed/heartbeat.py).
    rank_hang_timeout_s: float = 300.0
    # spec: speculative decoding (runtime/speculative), SGLang's option names. The algorithm
    # is NGRAM | STANDALONE | EAGLE | EAGLE3, any case (normalised to upper case); None: off.
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None  # STANDALONE / EAGLE: the draft weights
    speculative_num_steps: int | None = None  # draft depth (default: num_draft_tokens - 1)
    speculative_eagle_topk: int | None = None  # branching per draft step (default 1: a chain)
    speculative_num_draft_tokens: int | None = None  # tree nodes verified per step (default 4)
    # spec: NGRAM: match the last min..max tokens of the request against its own prompt and
    # output; up to max_bfs_breadth branches at the first draft position (a tree).
    speculative_ngram_min_match_window_size: int = 1
    speculative_ngram_max_match_window_size: int = 12
    speculative_ngram_max_bfs_breadth: int = 1
    # spec: adaptive speculation: off for a step whose batch has more decoding requests than
    # this (verify then costs more than it wins), and off for a request whose recent accepted
    # tokens per verify step fall below the threshold (tried again after a backoff).
    speculative_max_batch_size: int = 32
    speculative_min_accept_per_step: float = 0.3
    # spec (ours): a step speculates only while its requests' expected accepted tokens give at
    # least this times plain decoding's tokens/s, from the measured cost of a speculative vs a
    # plain step at that batch size (runtime/speculative/cost.py); 0: not measured.
    speculative_min_speedup: float = 1.0
    # spec: CUDA graphs for the tree verify and the draft forwards follow disable_cuda_graph;
    # this turns off only those (ours, not SGLang's: the graph-vs-eager A/B of the benchmark).
    speculative_disable_cuda_graph: bool = False
    # mm: images (vision-language models, runtime/multimodal): http(s) image URLs are fetched
    # only when allowed (else a 400 naming the field); at most this many images per request;
    # the scheduler keeps encoder outputs of recent images (by pixel hash) up to this many bytes,
    # so an image split over prefill chunks, or repeated within a batch, is encoded once.
    allow_image_urls: bool = False
    max_images_per_request: int = 16
    mm_embedding_cache_bytes: int = 512 << 20
    # hicache: hierarchical KV cache (runtime/cache/hicache, SGLang's options): radix nodes
    # evicted from the device pool move to a host pool (hicache_ratio x the device pool's
    # tokens, or hicache_size GB when > 0) and from there to files (hicache_storage_backend
    # "file": hicache_storage_dir, default ~/.cache/sgdsl/hicache, at most hicache_storage_size
    # GB, least recently used first out). write_through copies a node to the host when cached,
    # write_through_selective on its second hit, write_back when it is evicted.
    enable_hierarchical_cache: bool = False
    hicache_ratio: float = 2.0
    hicache_size: float = 0.0
    hicache_write_policy: Literal["write_through", "write_back",
                                  "write_through_selective"] = "write_through"
    hicache_storage_backend: Literal["file"] | None = None
    hicache_storage_dir: str | None = None
    hicache_storage_size: float = 16.0
    # how KV moves between the device and host pools on CUDA: "kernel", a Triton kernel that
    # reads/writes the page-locked host pool over UVA (a launch per layer for a load, one per
    # backup); "direct", copy_ per layer x K/V x contiguous run (cache/hicache/kernel_io.py)
    hicache_io_backend: Literal["kernel", "direct"] = "kernel"
    # pd: prefill/decode disaggregation (runtime/disaggregation; SGLang's option names). A
    # prefill server runs prompts only and ships their KV to the decode server named in each
    # request (bootstrap_host/port/room, set by ``sgdsl router --pd-disaggregation``); a decode
    # server receives the KV and decodes. Requests without bootstrap fields run colocated.
    disaggregation_mode: Literal["null", "prefill", "decode"] = "null"
    disaggregation_bootstrap_port: int = 8998  # the prefill server's control store (TCPStore)
    # how the KV pages travel: torch.distributed send/recv on a two-rank group per (prefill,
    # decode) pair; auto = gloo on CPU, nccl on CUDA
    disaggregation_transfer_backend: Literal["auto", "gloo", "nccl"] = "auto"
    # longest wait for the other side (its registration, its KV, a send), then the request fails
    disaggregation_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        _check_parallel(self)
        from .speculative.options import check_speculative  # spec:

        check_speculative(self)
        from .cache.hicache.options import check_options  # hicache:

        check_options(self)
        if self.pp_size > 1 and self.speculative_algorithm is not None:  # pp:
            raise InvalidRequestError(
                f"pp_size={self.pp_size}: speculative decoding does not run over pipeline "
                "stages yet; use pp_size=1 or no speculative_algorithm", field="pp_size")

    @property
    def world_size(self) -> int:
        """Worker processes of one engine: a TP group per pipeline stage."""
        return self.tp_size * self.pp_size  # pp:

    def replace(self, **changes: Any) -> "EngineConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "EngineConfig":
        """Build from keyword arguments, naming any unknown one."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise InvalidRequestError(f"unknown engine option(s): {', '.join(unknown)}",
                                      field=unknown[0])
        return cls(**kwargs)


def _check_parallel(config: EngineConfig) -> None:
    """The TP layout must make sense before any process starts (the heads are checked when
    the model config is known, in ``layers.linear.check_heads``)."""
    def bad(field: str, message: str) -> InvalidRequestError:
        return InvalidRequestError(f"{field}={getattr(config, field)!r}: {message}", field=field)

    if config.tp_size < 1:
        raise bad("tp_size", "must be >= 1")
    if config.ep_size < 1:
        raise bad("ep_size", "must be >= 1")
    if config.tp_size % config.ep_size:
        raise bad("ep_size", f"must divide tp_size={config.tp_size} (the experts are split over "
                             "ep_size of the tp_size ranks, as in SGLang)")
    if config.ep_a2a_min_tokens is not None and config.ep_a2a_min_tokens < 1:
        raise bad("ep_a2a_min_tokens", "must be >= 1")
    _check_pipeline(config, bad)  # pp:
    if not config.rank_hang_timeout_s > 0:
        raise bad("rank_hang_timeout_s", "must be > 0")
    if not config.disaggregation_timeout_s > 0:  # pd:
        raise bad("disaggregation_timeout_s", "must be > 0")
    if config.nnodes < 1:
        raise bad("nnodes", "must be >= 1")
    if config.world_size % config.nnodes:  # pp: the ranks of every stage
        raise bad("tp_size", f"tp_size x pp_size must be a multiple of nnodes={config.nnodes} "
                             "(ranks are spread evenly over the nodes)")
    if not 0 <= config.node_rank < config.nnodes:
        raise bad("node_rank", f"must be in [0, {config.nnodes - 1}]")
    if config.nnodes > 1 and not config.dist_init_addr:
        raise bad("dist_init_addr", "is required with nnodes > 1 (HOST:PORT of node 0)")
    if config.dist_init_addr is not None:
        host, _, port = config.dist_init_addr.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise bad("dist_init_addr", "must be HOST:PORT")


def _check_pipeline(config: EngineConfig, bad: Any) -> None:
    """pp: the pipeline options (the layer count is checked when the model config is known,
    in ``distributed.pipeline.check_layers``)."""
    if config.pp_size < 1:
        raise bad("pp_size", "must be >= 1")
    if config.pp_size > 1 and config.disaggregation_mode != "null":
        raise bad("pp_size", "does not run with disaggregation_mode yet (the KV of one rank is "
                             "sent)")
    if config.pp_micro_batches is not None and config.pp_micro_batches < 1:
        raise bad("pp_micro_batches", "must be >= 1 (1: no micro-batches) or None (pp_size)")
    if config.pp_micro_batch_tokens < 1:
        raise bad("pp_micro_batch_tokens", "must be >= 1")
