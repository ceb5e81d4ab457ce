"""Messages between the main process (TokenizerManager) and the scheduler process.

Small dataclasses with one serializer (pickle over ZMQ). Requests flow main -> scheduler; one
``BatchTokenOut`` per scheduler step flows back, carrying only what is new since the last step
(new token ids, new logprob entries), so a step never pickles growing per-request history.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

from ..sampling_params import SamplingParams


@dataclass(frozen=True)
class TokenizedGenerateReq:
    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: no prompt logprobs
    top_logprobs_num: int = 0
    # NOTE: only streamed requests get per-step outputs; others get one output when they finish
    # (or are aborted), so a plain request costs the main process no wake-up per token.
    stream: bool = False
    # mm: images (runtime/multimodal/inputs.MmData: processed pixels, token offsets, M-RoPE);
    # the prompt's image positions hold hash-derived pad ids.
    mm: Any = None
    # pd: where this request's KV comes from or goes to (disaggregation/bootstrap.py), or None
    bootstrap: Any = None


@dataclass(frozen=True)
class AbortReq:
    rid: str
    message: str = "aborted by request"


@dataclass(frozen=True)
class FlushCacheReq:
    call_id: int


@dataclass(frozen=True)
class StatsReq:
    call_id: int


@dataclass(frozen=True)
class CheckIntegrityReq:
    call_id: int


@dataclass(frozen=True)
class PrecompileReq:
    """Compile these constraints ((kind, value) as ``SamplingParams.constraint``) ahead of
    requests; answered with one result dict per constraint (``grammar/compile/precompile.py``)."""

    call_id: int
    constraints: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class RpcResp:
    """Answer to a FlushCacheReq / StatsReq / CheckIntegrityReq / PrecompileReq, matched by
    ``call_id``."""

    call_id: int
    ok: bool
    value: Any = None
    error: str | None = None


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class Ready:
    """Sent once by the scheduler process after the model is loaded."""

    model_dir: str
    context_len: int
    vocab_size: int
    kv_total_slots: int
    max_running_requests: int
    eos_token_ids: tuple[int, ...]


@dataclass(frozen=True)
class StartupError:
    """The scheduler process failed to start (or crashed later): the real message + traceback."""

    message: str
    traceback: str
    kind: str = "model_load_error"  # errors.py kind of the original error, when it is one


@dataclass
class ReqOut:
    """What is new for one request in one step. Logprob entries are (logprob, token_id) pairs;
    top entries are lists of such pairs; the main process adds text."""

    rid: str
    new_ids: list[int]
    finish_reason: dict | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    input_token_logprobs: list | None = None  # full prompt logprobs, sent once
    input_top_logprobs: list | None = None
    output_token_logprobs: list | None = None  # new entries only
    output_top_logprobs: list | None = None
    forced_positions: list[int] | None = None  # grammar: new positions of unsampled tokens
    # spec: decode/verify steps so far and draft tokens accepted (None: no speculation)
    spec_verify_ct: int | None = None
    spec_accepted_tokens: int = 0
    cached_tokens_details: dict | None = None  # hicache: cached prompt tokens per tier


@dataclass
class BatchTokenOut:
    outs: list[ReqOut] = field(default_factory=list)
    sent_at: float | None = None  # hops: when the scheduler sent it ($SGDSL_HOP_TIMES only)


def dumps(msg: Any) -> bytes:
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes) -> Any:
    return pickle.loads(data)
